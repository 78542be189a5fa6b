"""Warp reductions by register shuffles (``__shfl_xor_sync`` butterflies, ``__shfl_down_sync``
trees) instead of a shared-memory tree.

A shuffle moves a value between the lanes of a warp in one instruction, with no shared memory,
no bank conflicts and no barrier. Without it, each halving step goes through shared memory:
every lane stores its value, the warp synchronizes, every lane loads its partner's.

- remove: each shuffle step (a loop such as ``for (offset = 16; offset > 0; offset >>= 1)
  v += __shfl_xor_sync(mask, v, offset)``, or one unrolled statement) becomes the same step
  through a ``__shared__`` row per warp, ``__syncwarp()``-separated, declared once at the top
  of the function. Every lane gets exactly what the shuffle gave it (the full result for a
  butterfly; lane 0's for a tree). See :mod:`klineage.mechanisms._reductions_exchange` for
  the exactness argument and for what is refused (partial masks, unknown offsets, values that
  are not plain variables, shuffles beyond the first statement of the step, host code).
- apply: the reverse, on a step in that shared-memory form.
"""

from __future__ import annotations

from typing import ClassVar

from klineage.mechanisms._reductions_exchange import ExchangeMechanism
from klineage.mechanisms.base import register


@register
class WarpShuffleReduction(ExchangeMechanism):
    name = "warp_shuffle_reduction"
    category = "synchronization"
    signature = ("SHFL", "BAR")
    family = "warp-shuffle vs shared-memory reductions"
    intent = (
        "Reduce across a warp with register shuffles, so no shared memory, bank conflicts or "
        "barriers are involved."
    )
    kinds: ClassVar[frozenset[str]] = frozenset({"xor", "down"})
