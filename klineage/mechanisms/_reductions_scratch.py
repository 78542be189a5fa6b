"""A block reduction through per-warp scratch, written value by value::

    float warp_sum = cg::reduce(warp, thread_sum, cg::plus<float>{});   // reduce each warp
    shared_sum[warp_id] = warp_sum;                                     // publish (maybe
    __syncthreads();                                                    //   lane 0 only)
    warp_sum = (lane_id < num_warps) ? shared_sum[lane_id] : 0.0f;      // reload
    float block_sum = cg::reduce(warp, warp_sum, cg::plus<float>{});    // reduce the warps

Public kernels write it so, several reductions interleaved (a sum and a sum of squares), the
reloaded value in the published variable or a new one. With one thread per row the block
reduction is the thread's own partial: the first reduction becomes its value, the publishes,
the barrier and the reloads go, and the second reduction becomes the published variable.
This module finds such runs in a list of statements (:func:`scratch_runs`); the rewrite is
the group walker's (:mod:`klineage.mechanisms._rows_group_walker`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from klineage.cuda.source import Node, ParsedSource, plain_assignment
from klineage.mechanisms._local_util import index_declaration
from klineage.mechanisms._reductions_util import strip_parens

__all__ = ["ScratchRun", "assigned_value", "scratch_runs"]

Reduction = Callable[[Node], Node | None]
"""The reduced value of a warp-reduction call node, or None when the node is not one."""


@dataclass
class ScratchRun:
    """One barrier's worth of warp-scratch block reductions."""

    first: dict[str, Node] = field(default_factory=dict)
    """Published variable -> the warp-reduction call that made it."""
    published: dict[str, str] = field(default_factory=dict)
    """Scratch array -> the variable published into it."""
    deleted: list[Node] = field(default_factory=list)
    """The publishes, the barrier(s) and the reloads."""
    second: list[tuple[Node, str]] = field(default_factory=list)
    """(the reduction call over a reloaded value, the published variable it stands for)."""


def assigned_value(source: ParsedSource, statement: Node) -> tuple[str, Node] | None:
    """``T v = e;`` or ``v = e;`` -> (v, e)."""
    declared = index_declaration(source, statement)
    if declared is not None:
        return declared[0], declared[2]
    found = plain_assignment(statement)
    if found is None or found[0].type != "identifier":
        return None
    return source.text_of(found[0]), found[1]


def _publish(source: ParsedSource, statement: Node, shared: set[str]) -> tuple[str, str] | None:
    """``S[i] = v;`` or ``if (c) S[i] = v;`` with ``S`` shared -> (S, v)."""
    target = statement
    if statement.type == "if_statement":
        if statement.child_by_field_name("alternative") is not None:
            return None
        target = statement.child_by_field_name("consequence") or statement
    found = plain_assignment(target)
    if found is None:
        return None
    left, right = found
    base = left.child_by_field_name("argument") if left.type == "subscript_expression" else None
    if base is None or source.text_of(base) not in shared or right.type != "identifier":
        return None
    return source.text_of(base), source.text_of(right)


def _reload(source: ParsedSource, value: Node, published: dict[str, str]) -> str | None:
    """``c ? S[lane] : identity`` (or ``S[lane]``) with ``S`` published -> S."""
    value = strip_parens(value)
    if value.type == "conditional_expression":
        value = strip_parens(value.child_by_field_name("consequence") or value)
    if value.type != "subscript_expression":
        return None
    base = value.child_by_field_name("argument")
    name = source.text_of(base) if base is not None else ""
    return name if name in published else None


def scratch_runs(
    source: ParsedSource,
    statements: list[Node],
    shared: set[str],
    reduction: Reduction,
    is_barrier: Callable[[Node], bool],
) -> list[ScratchRun]:
    """The runs in ``statements`` (one block's): publishes of warp-reduced variables into
    ``shared`` arrays before a barrier, reloads of those arrays after it, and the reductions
    of the reloaded values."""
    runs = []
    for index, statement in enumerate(statements):
        if not is_barrier(statement):
            continue
        run = _run_at(source, statements, index, shared, reduction, is_barrier)
        if run is not None:
            runs.append(run)
    return runs


def _run_at(
    source: ParsedSource,
    statements: list[Node],
    barrier: int,
    shared: set[str],
    reduction: Reduction,
    is_barrier: Callable[[Node], bool],
) -> ScratchRun | None:
    run = ScratchRun(deleted=[statements[barrier]])
    start = barrier
    while start > 0 and (found := _publish(source, statements[start - 1], shared)) is not None:
        run.published[found[0]] = found[1]
        run.deleted.append(statements[start - 1])
        start -= 1
    if not run.published:
        return None
    for variable in run.published.values():
        call = _last_reduction(source, statements[:start], variable, reduction)
        if call is None:
            return None
        run.first[variable] = call
    reloaded: dict[str, str] = {}  # reloaded variable -> the published variable it stands for
    position = barrier + 1
    while position < len(statements):
        assigned = assigned_value(source, statements[position])
        scratch = _reload(source, assigned[1], run.published) if assigned else None
        if assigned is None or scratch is None:
            break
        reloaded[assigned[0]] = run.published[scratch]
        run.deleted.append(statements[position])
        position += 1
    while position < len(statements):
        assigned = assigned_value(source, statements[position])
        value = reduction(strip_parens(assigned[1])) if assigned else None
        if value is None or source.text_of(value) not in reloaded:
            break
        assert assigned is not None
        run.second.append((strip_parens(assigned[1]), reloaded[source.text_of(value)]))
        position += 1
    if len(run.second) != len(run.published) or len(reloaded) != len(run.published):
        return None
    if position < len(statements) and is_barrier(statements[position]):
        run.deleted.append(statements[position])  # the scratch's reuse guard
    return run


def _last_reduction(
    source: ParsedSource, before: list[Node], variable: str, reduction: Reduction
) -> Node | None:
    """The warp-reduction call of the last assignment to ``variable`` in ``before``."""
    for statement in reversed(before):
        assigned = assigned_value(source, statement)
        if assigned is None or assigned[0] != variable:
            continue
        call = strip_parens(assigned[1])
        return call if reduction(call) is not None else None
    return None
