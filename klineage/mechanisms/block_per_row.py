"""One block per row, its threads striding over the row and combining partial results through
a warp-shuffle + shared-memory block reduction, against one thread per row.

A thread walking a whole row serially reads it with one load in flight and, for rows longer
than a few hundred elements, leaves most of the GPU idle when there are few rows. A block per
row reads the row with coalesced, block-strided loads and reduces in log time.

- remove (block -> thread per row): the block-strided loops ``for (c = threadIdx.x; c < n;
  c += kThreads)`` become full loops, block reductions (a helper such as ``block_sum(v,
  scratch)``, or the inline warp-reduce / publish / ``__syncthreads()`` / reload sequence)
  become the value itself, ``if (threadIdx.x == 0)`` guards go, the row index becomes
  ``blockIdx.x * blockDim.x + threadIdx.x`` with a bound check (a row-count parameter is added
  and passed when the kernel had none), and each launch gets ``ceil(rows / block)`` blocks of
  the same size. Public spellings taken too: loops unrolled by hand (``i += blockDim.x * U``
  with ``i + u * blockDim.x`` inside become ``i += U`` with ``i + u``; see
  :mod:`klineage.mechanisms._block_unrolled`), block reductions finished by thread 0 walking
  per-warp scratch, with an early exit for threads past the row's end (see
  :mod:`klineage.mechanisms._reductions_serial`; the launch then passes no dynamic shared
  memory), and a row count the kernel never checks but the launch passes as the grid size;
  and the cooperative-groups spelling of llm.c's attention backward (rows counted down from
  the grid's end, loops by a template block size, per-warp sums reloaded from zeroed slots;
  see :mod:`klineage.mechanisms._block_rows_cg`); and a row handed to helpers that walk it by
  the block and block-reduce it (``stats = row_stats(idx, ...)`` calling
  ``block_reduce<warp_max>(m)``), each thread running the row code as a one-thread block (see
  :mod:`klineage.mechanisms._block_rows_helper`).
  Refused when anything else ties the kernel to the block (a row held in registers across
  block-strided slots, shared memory beyond the reductions, barriers, helpers that use
  ``threadIdx``), with the line.
- apply (thread -> block per row) on a canonical thread-per-row kernel (a row's sum,
  maximum, normalization or dot product, one thread per row): loops stride by the block,
  each accumulator of a loop (sum, max or min of a float) is block-reduced after it, stores
  outside loops are done by thread 0, and the launch gets one block of ``block_size``
  threads per row. The public spellings its removal leaves are taken too: compile-time
  constants before the row index, and row loops unrolled by hand (``i += U`` with ``i + u``
  inside, reads clamped ``min(n - 1, i + u)``, writes guarded ``if (i + u < n)``) become
  ``i += blockDim.x * U`` with ``i + u * blockDim.x``. See
  :mod:`klineage.mechanisms._rows_forms` for the exact canonical forms. On a naive row
  scan (a thread writing its row's running sum, ``form=scan``), a block that scans the row
  ``blockDim.x * K`` elements a turn: each thread ``K`` consecutive elements serially
  (carrier ``items_per_thread``, default 1; replay races 8 beside it), warp shuffles over the
  threads' totals, then the warps' totals through shared memory
  (:mod:`klineage.mechanisms._scan_blocks`; forward only). On a thread per row whose rows
  are counted down from the grid's end (``r = N - 1 - (blockIdx.x * blockDim.x +
  threadIdx.x)``, left by ``if (r < 0) return;``, ``form=cg_rows``), the cooperative-groups
  block rows its removal took: rows ``N - 1 - blockIdx.x``, loops from the block's rank by
  its size, one sum through ``cg::reduce`` and 32 zeroed per-warp slots; the launch keeps
  its block size (:mod:`klineage.mechanisms._block_rows_cg_forward`). On a thread per row
  whose kernel loops fold nothing but hand the row to a ``__device__`` helper that does
  (``stats = row_helper(idx, ...)`` walking the row down, a partial pack first, with a
  running max-and-sum-of-exp pair), the helper is spread in
  place: its row loops start at the thread's rank and step by the block, and after its last
  row loop each fold is combined over the block, the pair as ``M = block_reduce_max(m); s =
  block_reduce_sum(s * exp(m - M)); m = M`` (:mod:`klineage.mechanisms._rows_helper_forward`,
  the fold read from what the statements compute by :mod:`._online_pair_form`). The same
  pair folded in one pass of the kernel's own row loop is combined after that loop.

Conditions: the block size a multiple of 32 (full-mask shuffles) and at most 1024; the row
count at most 2^31 - 1 (one block each).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._block_rows_cg_forward import (
    CG_ROWS,
    counted_down_rows,
    write_cg_block_rows,
)
from klineage.mechanisms._reductions_exchange import DEFAULT_MASK
from klineage.mechanisms._reductions_layout import DEFAULT_BLOCK, RowLayoutMechanism
from klineage.mechanisms._rows_forms import Group, NotCanonical
from klineage.mechanisms._rows_index import is_block_per_row
from klineage.mechanisms._rows_thread import thread_rows_shape
from klineage.mechanisms._scan_blocks import ITEMS_PER_THREAD, RUN_ITEMS, block_scan_edits
from klineage.mechanisms._scan_rows import row_scan
from klineage.mechanisms.base import Carrier, Site, register

SCAN = "scan"


@register
class BlockPerRow(RowLayoutMechanism):
    name = "block_per_row"
    category = "parallelism"
    family = "block-per-row vs thread-per-row reductions"
    intent = (
        "Give each row a whole block: coalesced block-strided reads and a tree reduction "
        "instead of one thread walking the row alone."
    )
    group: ClassVar[Group] = "block"
    carrier_keys: ClassVar[dict[str, str]] = {
        **RowLayoutMechanism.carrier_keys,
        "items_per_thread": "consecutive elements a thread scans serially each turn, on a "
        f"row scan (form=scan; 1..32, default {ITEMS_PER_THREAD})",
    }

    def detected(self, source: ParsedSource, kernel: Function) -> bool:
        return is_block_per_row(source, kernel)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """The row reductions, the row scans their rule refuses (a running value), and the
        rows counted down that the cooperative-groups form writes back."""
        for site in super().find_candidates(source):
            kernel = source.function(site.function) if site.refusal else None
            if kernel is not None and _scans(source, kernel):
                site = self._site(source, kernel, None)
                site.detail["form"] = SCAN
            yield site
        for kernel in source.kernels:
            if thread_rows_shape(source, kernel) is None and counted_down_rows(source, kernel):
                refusal = None
                try:
                    write_cg_block_rows(source, kernel)
                except NotCanonical as why:
                    refusal = str(why)
                site = self._site(source, kernel, refusal)
                site.detail["form"] = CG_ROWS
                yield site

    def alternative_carriers(self, kernel: KernelSource) -> list[Carrier]:
        """On a row scan, runs of 8 elements a thread beside the default single element: 8
        times fewer turns and barriers on a long row, and scalar loads a lane 32 bytes apart
        where the single-element form can take vectors later; only a gate run weighs them."""
        scans = [c for c in self.candidates(kernel) if c.detail.get("form") == SCAN]
        return [Carrier(items_per_thread=RUN_ITEMS)] if any(c.supported for c in scans) else []

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == CG_ROWS:
            try:  # the launch keeps its block size, which the loops stride by
                return write_cg_block_rows(source, self._kernel(source, site))
            except NotCanonical as why:
                raise self.refuse(str(why), site, "apply") from None
        if site.detail.get("form") != SCAN:
            return super().application(source, site, carrier)
        block = carrier.get_int("block_size", DEFAULT_BLOCK) or DEFAULT_BLOCK
        try:
            scan = row_scan(source, self._kernel(source, site))
            items = carrier.get_int("items_per_thread", ITEMS_PER_THREAD) or ITEMS_PER_THREAD
            return block_scan_edits(source, scan, block, DEFAULT_MASK, items)
        except NotCanonical as why:
            raise self.refuse(str(why), site, "apply") from None


def _scans(source: ParsedSource, kernel: Function) -> bool:
    try:
        row_scan(source, kernel)
    except NotCanonical:
        return False
    return True
