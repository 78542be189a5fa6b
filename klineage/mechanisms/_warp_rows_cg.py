"""A warp per row through cooperative groups: a 32-thread tile of the block per row.

Public kernels write the warp-per-row layout with the group API instead of the thread index::

    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(cg::this_thread_block());
    int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
    for (int c = warp.thread_rank(); c < cols; c += warp.size()) ...
    sum = cg::reduce(warp, sum, cg::plus<float>{});
    if (warp.thread_rank() == 0 && mean != nullptr) mean[row] = m;

Each query means what its ``threadIdx`` spelling means (the row is the warp's index in the
grid, the rank the lane, the size 32, the reduction a warp reduction), so the thread-per-row
rewrite treats them alike. This module answers those questions from the analysis layer's
reading of the group API (:mod:`klineage.cuda.analysis.cooperative_groups`).
"""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.cooperative_groups import CgReduce, RankKind
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._reductions_util import strip_casts, strip_parens

__all__ = ["is_warp_query", "tile_calls_left", "warp_reduces"]


def is_warp_query(source: ParsedSource, node: Node | None, kind: RankKind) -> bool:
    """Whether ``node`` is a query of a 32-thread tile: ``lane`` (``thread_rank()``),
    ``warp_in_block`` (``meta_group_rank()``), ``warps_per_block`` (``meta_group_size()``) or
    ``group_size`` (``size()``)."""
    if node is None:
        return False
    node = strip_parens(strip_casts(node))
    if node.type != "call_expression":
        return False
    query = analysis(source).cooperative_groups.rank_of(node)
    return (
        query is not None and query.kind == kind and query.group is not None and query.group.is_warp
    )


def warp_reduces(source: ParsedSource, kernel: Function) -> list[CgReduce]:
    """The ``cg::reduce`` calls over a 32-thread tile in ``kernel``."""
    reduces, _ = analysis(source).cooperative_groups.in_function(kernel)
    return [r for r in reduces if r.group is not None and r.group.is_warp]


def tile_calls_left(source: ParsedSource, kernel: Function) -> list[Node]:
    """Every call on a 32-thread tile in ``kernel`` that ties code to the warp: its rank and
    size queries, shuffles and reductions (the rewrite must have handled each; barriers, of
    any group, are the walker's own check)."""
    groups = analysis(source).cooperative_groups

    def mine(node: Node) -> bool:
        return kernel.node.start_byte <= node.start_byte < kernel.node.end_byte

    found = [r.node for r in warp_reduces(source, kernel)]
    found += [
        s.node for s in groups.shuffles if mine(s.node) and s.group is not None and s.group.is_warp
    ]
    found += [
        q.node
        for q in groups.ranks.values()
        if mine(q.node) and q.group is not None and q.group.is_warp
    ]
    return sorted(found, key=lambda n: n.start_byte)
