"""Warp prefix sums by register shuffles (``__shfl_up_sync`` Hillis-Steele scans) instead of a
scan through shared memory.

An inclusive scan over a warp takes log2(32) = 5 steps; in each, lane ``i`` adds the value of
lane ``i - offset``. With ``__shfl_up_sync`` the value moves in a register; without it, every
lane writes its running value to a ``__shared__`` row, the warp synchronizes, and each lane
reads lane ``i - offset``'s slot (the Hillis-Steele scan in shared memory).

- remove: each ``__shfl_up_sync`` step becomes that shared-memory step (the lanes below the
  offset read their own slot, as the shuffle returns their own value), with a row per warp
  declared once at the top of the function;
- apply: the reverse, on a step in that form; and, on a naive thread-per-row running sum
  (``acc += v; out[c] = acc;`` along the row, a cumulative sum), one warp per row scanning
  the row 32 elements at a time (``form=rows``, :mod:`klineage.mechanisms._scan_rows`; the
  launch gives ``block_size / 32`` rows a block, carrier ``block_size``, default 256).

Refusals are those of the exchange rewrite (:mod:`klineage.mechanisms._reductions_exchange`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.mechanisms._reductions_exchange import DEFAULT_MASK, ExchangeMechanism
from klineage.mechanisms._rows_forms import NotCanonical
from klineage.mechanisms._scan_rows import row_scan, scan_edits
from klineage.mechanisms.base import Carrier, Site, register

ROWS = "rows"
DEFAULT_BLOCK = 256


@register
class WarpShuffleScan(ExchangeMechanism):
    name = "warp_shuffle_scan"
    category = "synchronization"
    signature = ("SHFL", "BAR")
    family = "warp-level ballots and prefix sums"
    intent = (
        "Scan across a warp with __shfl_up_sync, so the partial sums move in registers "
        "instead of through shared memory and barriers."
    )
    kinds: ClassVar[frozenset[str]] = frozenset({"up"})
    carrier_keys: ClassVar[dict[str, str]] = {
        **ExchangeMechanism.carrier_keys,
        "block_size": "threads per block of the warp-per-row scan (form=rows), a multiple of 32",
    }

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        yield from super().find_candidates(source)
        for kernel in source.kernels:
            try:
                scan = row_scan(source, kernel)
            except NotCanonical:
                continue
            yield self.site(
                source, scan.loop, snippet=source.header(scan.loop),
                detail={"form": ROWS, "kernel": kernel.name},
            )  # fmt: skip

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") != ROWS:
            return super().application(source, site, carrier)
        kernel = next((k for k in source.kernels if k.name == site.detail.get("kernel")), None)
        if kernel is None:
            raise self.refuse(f"no kernel at line {site.start_line}", site, "apply")
        try:
            return scan_edits(
                source,
                row_scan(source, kernel),
                carrier.get_int("block_size", DEFAULT_BLOCK) or DEFAULT_BLOCK,
                carrier.get_str("mask") or DEFAULT_MASK,
            )
        except NotCanonical as why:
            raise self.refuse(str(why), site, "apply") from None
