"""One warp per row, its lanes striding over the row and combining with warp shuffles (no
shared memory, no block barrier), against one thread per row.

For rows of up to a few thousand elements a warp per row keeps the loads coalesced and
reduces in five shuffle steps without ``__syncthreads``; several rows share a block.

- remove (warp -> thread per row): the row index ``blockIdx.x * kWarps + (threadIdx.x >> 5)``
  (or ``(global thread) >> 5``) becomes the global thread index, lane-strided loops ``for (c =
  lane; c < n; c += 32)`` full loops, warp reductions (``warp_sum(v)``) the value itself,
  ``if (lane == 0)`` guards go, the lane variable goes, and each launch gets ``ceil(rows /
  block)`` blocks of the same size. Refused when something else ties the kernel to the warp
  (a row held in registers across lane-strided slots, shuffles left over...), with the line.
- apply (thread -> warp per row) on a canonical thread-per-row kernel: the row index becomes
  ``(global thread index) >> 5``, loops start at ``threadIdx.x & 31`` and stride by 32, each
  accumulator of a loop (sum, max or min of a float) is reduced over the warp after it, stores
  outside loops are done by lane 0, and the launch gets ``block_size / 32`` rows per block.
  Loops unrolled by hand (``i += U`` with ``i + u`` inside) become ``i += 32 * U`` with ``i +
  u * 32``, and back; one that reads back a clamped element another lane wrote is refused
  (shuffles order no memory). A thread's linear index in a constant 32 x y block (what the
  removal of a ``dim3(32, rows)`` warp per row leaves) becomes its warp's row ``blockIdx.x *
  blockDim.y + threadIdx.y`` again: the lanes are ``threadIdx.x``, the block keeps its shape
  (``block_size`` does not apply) and the grid gives each of its y warps a row. Packed steps
  (``c += V``, every use of ``c`` the address of a ``V``-element packed load or store) become
  ``c = lane * V; c += 32 * V``, and a walk back down the row after a loop whose start is
  declared before it (``c -= V; for (; c >= 0; c -= V)``) steps by ``32 * V``
  (:mod:`klineage.mechanisms._thread_row_steps`). A row whose reduction a ``__device__``
  helper holds (the kernel's own loops folding nothing) is spread inside that helper: its row
  loops by the warp, its folds (sums, maxima, a running max-and-sum-of-exp pair) combined over
  the warp after its last row loop (:mod:`klineage.mechanisms._rows_helper_forward`).

Conditions: the block size a multiple of 32 (a warp never straddles two rows) and at most 1024.
"""

from __future__ import annotations

from typing import ClassVar

from klineage.cuda.source import Function, ParsedSource
from klineage.mechanisms._reductions_layout import RowLayoutMechanism
from klineage.mechanisms._rows_forms import Group
from klineage.mechanisms._rows_index import is_warp_per_row
from klineage.mechanisms.base import register


@register
class WarpPerRow(RowLayoutMechanism):
    name = "warp_per_row"
    category = "parallelism"
    family = "block-per-row vs thread-per-row reductions"
    intent = (
        "Give each row a warp: coalesced lane-strided reads and a shuffle reduction with no "
        "shared memory or block barrier."
    )
    group: ClassVar[Group] = "warp"

    def detected(self, source: ParsedSource, kernel: Function) -> bool:
        return is_warp_per_row(source, kernel)
