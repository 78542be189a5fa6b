"""The row index forms of the group layouts: ``blockIdx.x`` for a block per row, the warp
number (linear or 2-D) for a warp per row, and the predicates that say a kernel is in one."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._reductions_util import (
    builtin_uses,
    call_name,
    inside,
    is_builtin,
    named_statements,
    strip_casts,
    strip_parens,
)
from klineage.mechanisms._rows_forms import (
    NotCanonical,
    global_thread_index,
    operator_of,
    single_init,
)
from klineage.mechanisms._rows_group_reductions import (
    InlineReductions,
    group_scratch_runs,
    group_serial_runs,
)
from klineage.mechanisms._rows_group_walker import GroupWalker
from klineage.mechanisms._rows_helpers import block_reduce_functions, warp_reduce_functions
from klineage.mechanisms._warp_rows_2d import (
    THREAD_ROW_2D,
    is_row_of_2d_warps,
    lane_is_thread_x,
)
from klineage.mechanisms._warp_rows_cg import is_warp_query, warp_reduces


@dataclass
class RowIndex:
    statement: Node | None
    """The declaration of the row index; None when blockIdx.x is used in expressions."""
    name: str
    value: Node | None
    replacement: str | None
    """The thread-per-row initial value to write."""
    bound: Node | None
    """The bound of an existing check, if any."""


def block_row_uses(source: ParsedSource, kernel: Function) -> list[Node] | None:
    """The ``blockIdx.x`` uses of a block-per-row kernel (each in a statement without
    ``threadIdx``); None when the kernel does not index rows by block."""
    if kernel.body is None:
        return None
    uses = builtin_uses(source, kernel.body, "blockIdx")
    if not uses or any(source.text_of(u).replace(" ", "") != "blockIdx.x" for u in uses):
        return None
    for use in uses:
        statement = use
        while statement.parent is not None and not (
            statement.type.endswith("statement") or statement.type == "declaration"
        ):
            statement = statement.parent
        inner = statement
        if statement.type in ("for_statement", "if_statement"):
            inner = use.parent or use
        if builtin_uses(source, inner, "threadIdx", "blockDim"):
            return None
    return uses


def warp_row_index(
    source: ParsedSource, kernel: Function, walker: GroupWalker | None = None
) -> tuple[Node, Node, str] | None:
    """(declaration, value, thread-per-row value) of a warp-per-row index: ``(tid) >> 5``,
    ``(tid) / 32``, ``blockIdx.x * warps + (threadIdx.x >> 5)``, or ``blockIdx.x * blockDim.y
    + threadIdx.y`` in a 32 x y block."""
    if kernel.body is None:
        return None
    for statement in named_statements(kernel.body):
        declared = single_init(source, statement)
        if declared is None:
            continue
        value = strip_casts(declared[1])
        replacement = _warp_index_replacement(source, value, walker)
        if replacement is None and is_row_of_2d_warps(source, value):
            replacement = THREAD_ROW_2D if lane_is_thread_x(source, kernel) else None
        if replacement is not None:
            return statement, declared[1], replacement
    return None


def _warp_index_replacement(
    source: ParsedSource, value: Node, walker: GroupWalker | None
) -> str | None:
    if value.type != "binary_expression":
        return None
    left, right = value.child_by_field_name("left"), value.child_by_field_name("right")
    if left is None or right is None:
        return None
    right_text = source.text_of(strip_parens(right))
    if (operator_of(value), right_text) in ((">>", "5"), ("/", "32")):
        inner = strip_parens(left)
        if global_thread_index(source, inner) is not None:
            return source.text_of(inner)
        return None
    if operator_of(value) != "+":
        return None
    for product, warp in ((left, right), (right, left)):
        warp = strip_casts(warp)
        # the warp's index in the block: `threadIdx.x >> 5`, or the group API's
        tile = is_warp_query(source, warp, "warp_in_block")
        if not tile:
            if warp.type != "binary_expression" or not is_builtin(
                source, warp.child_by_field_name("left"), "threadIdx"
            ):
                continue
            shift = source.text_of(strip_parens(warp.child_by_field_name("right") or warp))
            if (operator_of(warp), shift) not in ((">>", "5"), ("/", "32")):
                continue
        product = strip_parens(product)
        if product.type != "binary_expression" or operator_of(product) != "*":
            continue
        a, b = product.child_by_field_name("left"), product.child_by_field_name("right")
        for block, count in ((a, b), (b, a)):
            if is_builtin(source, block, "blockIdx") and count is not None:
                counted = tile and is_warp_query(source, count, "warps_per_block")
                if walker is not None and not counted and not walker.is_warp_count(count):
                    return None
                return "(int64_t)blockIdx.x * blockDim.x + threadIdx.x"
    return None


def _warp_reduction_calls(source: ParsedSource, kernel: Function) -> bool:
    reducers = warp_reduce_functions(source)
    assert kernel.body is not None
    return bool(warp_reduces(source, kernel)) or any(
        call_name(source, n) in reducers for n in inside(source, kernel.body, "call_expression")
    )


def _block_reduction(source: ParsedSource, kernel: Function) -> bool:
    """Whether a kernel reduces over its block: a call to a block-reduction helper, or the
    inline warp-reduce / publish / barrier / reload sequence."""
    assert kernel.body is not None
    reducers = block_reduce_functions(source)
    if any(
        call_name(source, n) in reducers for n in inside(source, kernel.body, "call_expression")
    ):
        return True
    if helper_block_reductions(source, kernel):
        return True  # removed as a one-thread block, or refused naming the helper
    inline = InlineReductions(source, kernel.body)
    if inline.any_run() or group_scratch_runs(source, kernel, inline):
        return True
    try:
        return bool(group_serial_runs(source, kernel))
    except NotCanonical:
        return True  # the form's start: refused by the removal with what differs


def helper_block_reductions(source: ParsedSource, kernel: Function) -> list[str]:
    """The device helpers a kernel calls (directly or not) that make block-reduction calls
    themselves: a row handed to a helper that reduces it over the block (``stats =
    row_stats(row, ...)`` whose body calls ``block_reduce<warp_max>(m)``)."""
    reducers = block_reduce_functions(source)
    graph = analysis(source).call_graph
    found = []
    for name in sorted(graph.reachable(kernel.name) - reducers):
        helper = graph.definition(name)
        if helper is None or helper.body is None:
            continue
        if any(
            call_name(source, n) in reducers for n in inside(source, helper.body, "call_expression")
        ):
            found.append(name)
    return found


def is_block_per_row(source: ParsedSource, kernel: Function) -> bool:
    """Detection: rows indexed by ``blockIdx.x`` alone, reduced over the block."""
    return block_row_uses(source, kernel) is not None and _block_reduction(source, kernel)


def is_warp_per_row(source: ParsedSource, kernel: Function) -> bool:
    """Detection: rows indexed by the warp number, reduced over the warp."""
    return warp_row_index(source, kernel) is not None and _warp_reduction_calls(source, kernel)
