"""Warp reductions by register shuffles (``__shfl_xor_sync`` butterflies, ``__shfl_down_sync``
trees) instead of a shared-memory tree.

A shuffle moves a value between the lanes of a warp in one instruction, with no shared memory,
no bank conflicts and no barrier. Without it, each halving step goes through shared memory:
every lane stores its value, the warp synchronizes, every lane loads its partner's.

- remove: each shuffle step (a loop such as ``for (offset = 16; offset > 0; offset >>= 1)
  v += __shfl_xor_sync(mask, v, offset)``, or one unrolled statement) becomes the same step
  through a ``__shared__`` row per warp, ``__syncwarp()``-separated, declared once at the top
  of the function. Every lane gets exactly what the shuffle gave it (the full result for a
  butterfly; lane 0's for a tree). A step may shuffle a pair of values in its leading
  statements (an online max and sum), and shuffles may have a width (``__shfl_down_sync(m, v,
  1, 4)``, quads of lanes). See :mod:`klineage.mechanisms._reductions_exchange` for the
  exactness argument and for what is refused (partial masks, unknown offsets or widths,
  values that are not plain variables, shuffles after the leading statements of the step or
  reading a value an earlier one assigns, host code).
- apply: the reverse, on a step in that shared-memory form.

A naive block reduction, a shared-memory halving loop (``if (tid < s) buf[tid] +=
buf[tid + s]; __syncthreads();``), is a candidate too: ``apply`` stops its halving at 32 and
does the last five steps in warp 0 with ``__shfl_down_sync``
(:mod:`klineage.mechanisms._reductions_tree` says when that is exact and what is refused).

The cooperative-groups spelling, ``cg::reduce(warp, v, op)`` over a 32-thread tile, is a site
too; its removal calls a helper that reduces through shared memory in the same exchange form
(:mod:`klineage.mechanisms._cg_reduce`), whose loop ``apply`` turns into shuffles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._cg_reduce import cg_reductions, removal_edits
from klineage.mechanisms._reductions_exchange import DEFAULT_MASK, ExchangeMechanism
from klineage.mechanisms._reductions_tree import TreeReduction, finish_by_shuffles, tree_reductions
from klineage.mechanisms.base import Carrier, Site, register

TREE = "block_tree"


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

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        yield from super().find_sites(source)
        for reduction in cg_reductions(source):
            yield self.site(
                source,
                reduction.call.node,
                detail={"kind": "cg_reduce", "function": reduction.call.function.name},
                refusal=reduction.refusal,
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        yield from super().find_candidates(source)
        for tree in tree_reductions(source):
            yield self.site(
                source,
                tree.loop,
                detail={"kind": TREE, "function": tree.function.name},
                refusal=tree.refusal,
            )

    def _tree(self, source: ParsedSource, site: Site) -> TreeReduction:
        for tree in tree_reductions(source):
            if (tree.loop.start_byte, tree.loop.end_byte) == (site.start_byte, site.end_byte):
                return tree
        raise self.refuse(f"no block tree reduction at line {site.start_line}", site, "apply")

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("kind") != TREE:
            return super().application(source, site, carrier)
        mask = carrier.get_str("mask") or DEFAULT_MASK
        if not mask.replace(":", "").replace("_", "").isalnum():
            raise self.refuse(f"mask={mask!r} is not a constant name or literal", site, "apply")
        return finish_by_shuffles(source, self._tree(source, site), mask)

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        # cg::reduce names no lane mask: its tile is the whole warp, the default apply writes
        if site.detail.get("kind") == "cg_reduce":
            return Carrier()
        return super().carrier_of(kernel, site)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("kind") != "cg_reduce":
            return super().removal(source, site)
        for reduction in cg_reductions(source):
            node = reduction.call.node
            if (node.start_byte, node.end_byte) == (site.start_byte, site.end_byte):
                return removal_edits(source, reduction)
        raise self.refuse(f"no cg::reduce at line {site.start_line}", site)
