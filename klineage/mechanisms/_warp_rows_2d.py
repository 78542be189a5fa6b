"""A warp per row in a 32 x y block: the row ``blockIdx.x * blockDim.y + threadIdx.y``, the
lane ``threadIdx.x``.

Public kernels often give each row a warp this way (a ``dim3(32, rows_per_block)`` block,
often with ``assert(blockDim.x == 32)``) instead of splitting a 1-D block into warps. Spread
back to a thread per row, the block keeps its shape and every thread takes its own row: the
row becomes the thread's linear index in the grid, ``(blockIdx.x * blockDim.y + threadIdx.y)
* blockDim.x + threadIdx.x``, and the grid shrinks by the 32 lanes each row had. Written
forward, that linear index becomes the row of the thread's warp again
(:func:`row_of_thread_2d`) and the block still has its 32 x y shape.
"""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import WARP_SIZE
from klineage.mechanisms._reductions_util import (
    call_name,
    fold,
    inside,
    strip_casts,
    strip_parens,
)
from klineage.mechanisms._tiles_util import launch_block_dims

__all__ = [
    "THREAD_ROW_2D",
    "block_threads_2d",
    "block_width_asserts",
    "is_row_of_2d_warps",
    "is_thread_x",
    "lane_is_thread_x",
    "row_of_thread_2d",
]

THREAD_ROW_2D = "((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x"
"""The thread-per-row index that replaces the row of a 32 x y block's warp."""


def _is(source: ParsedSource, node: Node | None, builtin: str) -> bool:
    return node is not None and "".join(source.text_of(strip_casts(node)).split()) == builtin


def is_thread_x(source: ParsedSource, node: Node) -> bool:
    """``threadIdx.x``, through casts and parentheses."""
    return _is(source, node, "threadIdx.x")


def _operands(node: Node, operator: str) -> tuple[Node, Node] | None:
    node = strip_parens(node)
    if node.type != "binary_expression":
        return None
    op = node.child_by_field_name("operator")
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if op is None or op.type != operator or left is None or right is None:
        return None
    return left, right


def is_row_of_2d_warps(source: ParsedSource, value: Node) -> bool:
    """``blockIdx.x * blockDim.y + threadIdx.y``, in either order of the terms and factors."""
    terms = _operands(strip_casts(value), "+")
    if terms is None:
        return False
    for product, rank in (terms, terms[::-1]):
        factors = _operands(strip_casts(product), "*")
        if factors is None or not _is(source, rank, "threadIdx.y"):
            continue
        if any(
            _is(source, block, "blockIdx.x") and _is(source, count, "blockDim.y")
            for block, count in (factors, factors[::-1])
        ):
            return True
    return False


def row_of_thread_2d(source: ParsedSource, value: Node) -> Node | None:
    """For the thread's linear index in a 2-D block, ``(blockIdx.x * blockDim.y + threadIdx.y)
    * blockDim.x + threadIdx.x`` (:data:`THREAD_ROW_2D`, casts and either order allowed), its
    row-of-warps part ``blockIdx.x * blockDim.y + threadIdx.y``; None for anything else."""
    terms = _operands(strip_casts(value), "+")
    if terms is None:
        return None
    for product, lane in (terms, terms[::-1]):
        factors = _operands(strip_casts(product), "*")
        if factors is None or not is_thread_x(source, lane):
            continue
        for row, width in (factors, factors[::-1]):
            if _is(source, width, "blockDim.x") and is_row_of_2d_warps(source, row):
                return strip_parens(row)
    return None


def block_threads_2d(source: ParsedSource, launch: Launch) -> int | None:
    """The threads of a launch's block when it is a constant 32 x y block."""
    dims = launch_block_dims(source, launch)
    if dims is None or dims[0] != WARP_SIZE or dims[2] != 1:
        return None
    return dims[0] * dims[1]


def lane_is_thread_x(source: ParsedSource, kernel: Function) -> bool:
    """Whether ``threadIdx.x`` is the lane: the kernel asserts ``blockDim.x == 32``, or every
    launch of it in the file has a constant 32 x y block."""
    if analysis(source).indices(kernel).lane_is_thread_x():
        return True
    launches = source.launches_of(kernel)
    return bool(launches) and all(block_threads_2d(source, la) is not None for la in launches)


def block_width_asserts(source: ParsedSource, body: Node) -> list[Node]:
    """``assert(blockDim.x == 32)`` calls: the width written as 32, ``warpSize`` or a constant
    of the file that folds to 32 (``WARP_SIZE``), on either side."""
    found = []
    for call in inside(source, body, "call_expression"):
        arguments = call.child_by_field_name("arguments")
        if call_name(source, call) != "assert" or arguments is None:
            continue
        if len(arguments.named_children) != 1:
            continue
        sides = _operands(arguments.named_children[0], "==")
        if sides is not None and any(
            _is(source, width, "blockDim.x") and _is_warp_width(source, other)
            for width, other in (sides, sides[::-1])
        ):
            found.append(call)
    return found


def _is_warp_width(source: ParsedSource, node: Node) -> bool:
    if _is(source, node, "warpSize") or fold(source, strip_casts(node)) == WARP_SIZE:
        return True
    # a local constant of the kernel (`constexpr const int WarpSize = 32;`)
    function = source.enclosing_function(node)
    return (
        function is not None
        and analysis(source).indices(function).form(strip_casts(node)).value == WARP_SIZE
    )
