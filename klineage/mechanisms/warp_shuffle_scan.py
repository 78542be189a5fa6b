"""Warp prefix sums by register shuffles (``__shfl_up_sync`` Hillis-Steele scans) instead of a
scan through shared memory.

An inclusive scan over a warp takes log2(32) = 5 steps; in each, lane ``i`` adds the value of
lane ``i - offset``. With ``__shfl_up_sync`` the value moves in a register; without it, every
lane writes its running value to a ``__shared__`` row, the warp synchronizes, and each lane
reads lane ``i - offset``'s slot (the Hillis-Steele scan in shared memory).

- remove: each ``__shfl_up_sync`` step becomes that shared-memory step (the lanes below the
  offset read their own slot, as the shuffle returns their own value), with a row per warp
  declared once at the top of the function;
- apply: the reverse, on a step in that form.

Refusals are those of the exchange rewrite (:mod:`klineage.mechanisms._reductions_exchange`).
"""

from __future__ import annotations

from typing import ClassVar

from klineage.mechanisms._reductions_exchange import ExchangeMechanism
from klineage.mechanisms.base import register


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
