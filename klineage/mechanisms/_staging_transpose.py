"""A naive transpose staged through a shared-memory tile: the forward rule of smem_staging on
one-thread-per-element kernels that write ``y[i]`` from ``x`` read transposed.

The form it takes (one thread per output element, the output's index split into its row and
column, the input read with the two swapped)::

    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D * Q) return;              // or Q * D
    const int64_t s = i / D;             // the output's row, 0..Q-1
    const int64_t f = i - s * D;         // its column, 0..D-1 (or i % D)
    y[i] = EXPR(x[f * Q + s]);           // one read of x; the rest reads no index

Consecutive threads write consecutive ``y`` but read ``x`` a row (``Q`` elements) apart. What
it writes: 32 x 32 tiles, blocks of 32 x 8 threads on a 2-D grid (``blockIdx.x`` over ``s``,
``blockIdx.y`` over ``f``); each block reads its tile of ``x`` along rows into a padded
``[32][32 + 1]`` shared array (the padding column keeps a warp's column reads in 32 banks;
written as ``32 + 1`` so that smem_padding reads it as padding), waits at a barrier, then
writes ``y`` along its rows from the tile's columns, each element's code as it was with the
read of ``x`` taken from the tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import fresh_name
from klineage.mechanisms._local_util import (
    ElementKernel,
    binary,
    element_kernels,
    identifiers,
    index_declaration,
    names_in_function,
    strip_casts,
    strip_parens,
)
from klineage.mechanisms._reductions_rows import NotCanonical, _row_count
from klineage.mechanisms._tiles_util import orphaned_declarations

TILE = 32
ROWS_PER_TURN = 8


@dataclass(frozen=True)
class TransposeKernel:
    """A naive transpose in the form above."""

    element: ElementKernel
    slow: str
    fast: str
    divisor: Node
    """``D``: the output's row length, the input's row count."""
    other: Node
    """``Q``: the bound's other factor, the input's row length."""
    load: Node
    """``x[f * Q + s]``."""
    store: Node
    """The statement ``y[i] = EXPR;``."""
    element_type: str
    """The type of ``x``'s elements, for the tile."""


def _index_of(node: Node) -> Node | None:
    """The one index of ``p[index]``; None for anything else."""
    if node.type != "subscript_expression":
        return None
    indices = node.child_by_field_name("indices")
    inner = [c for c in indices.named_children if c.type != "comment"] if indices else []
    return inner[0] if len(inner) == 1 else None


def _text(source: ParsedSource, node: Node) -> str:
    return "".join(source.text_of(strip_casts(strip_parens(node))).split())


def _product(source: ParsedSource, node: Node, a: str, b: str) -> bool:
    """Whether ``node`` is ``a * b`` or ``b * a`` (casts and spacing aside)."""
    sides = binary(strip_parens(node), "*")
    if sides is None:
        return False
    pair = {_text(source, sides[0]), _text(source, sides[1])}
    return pair == {a, b}


def _remainder(source: ParsedSource, value: Node, i: str, slow: str, divisor: str) -> bool:
    """``i - slow * divisor`` or ``i % divisor``."""
    modulo = binary(strip_parens(value), "%")
    if modulo is not None:
        return _text(source, modulo[0]) == i and _text(source, modulo[1]) == divisor
    minus = binary(strip_parens(value), "-")
    return (
        minus is not None
        and _text(source, minus[0]) == i
        and _product(source, minus[1], slow, divisor)
    )


def _transposed_read(source: ParsedSource, index: Node, fast: str, slow: str, other: str) -> bool:
    """``fast * other + slow`` (either order of the sum and of the product)."""
    total = binary(strip_parens(index), "+")
    if total is None:
        return False
    for scaled, offset in (total, total[::-1]):
        if _text(source, offset) == slow and _product(source, scaled, fast, other):
            return True
    return False


def transpose_kernel(source: ParsedSource, element: ElementKernel) -> TransposeKernel:
    """The transpose form of ``element``; :class:`NotCanonical` says what differs."""
    kernel = element.function.name
    if element.form != "return" or len(element.body) != 3:
        raise NotCanonical(f"{kernel}'s element code is not two index declarations and a store")
    i = element.name
    first, second, store = element.body
    split = index_declaration(source, first)
    rest = index_declaration(source, second)
    if split is None or rest is None:
        raise NotCanonical(f"{kernel} does not split its index into a row and a column")
    quotient = binary(strip_parens(split[2]), "/")
    if quotient is None or _text(source, quotient[0]) != i:
        raise NotCanonical(f"{kernel}'s row is not {i} / D")
    slow, fast, divisor = split[0], rest[0], quotient[1]
    d = _text(source, divisor)
    if not _remainder(source, rest[2], i, slow, d):
        raise NotCanonical(f"{kernel}'s column is not {i} - {slow} * {d} or {i} % {d}")
    factors = binary(strip_parens(element.bound), "*")
    if factors is None or d not in {_text(source, f) for f in factors}:
        raise NotCanonical(f"{kernel}'s bound is not {d} times the row count")
    other = factors[1] if _text(source, factors[0]) == d else factors[0]
    q = _text(source, other)
    assignment = store.named_children[0] if store.type == "expression_statement" else None
    if assignment is None or assignment.type != "assignment_expression":
        raise NotCanonical(f"{kernel}'s last statement is not a store")
    target, value = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
    operator = assignment.child_by_field_name("operator")
    if target is None or value is None or operator is None or source.text_of(operator) != "=":
        raise NotCanonical(f"{kernel}'s last statement is not a store")
    index = _index_of(target)
    if index is None or _text(source, index) != i:
        raise NotCanonical(f"{kernel} does not store to y[{i}]")
    reads = _subscripts(value)
    if len(reads) != 1:
        raise NotCanonical(f"{kernel}'s stored value does not read exactly one array")
    load = reads[0]
    read_index = _index_of(load)
    array = load.child_by_field_name("argument")
    if read_index is None or array is None or array.type != "identifier":
        raise NotCanonical(f"{kernel}'s read is not of a parameter array")
    if not _transposed_read(source, read_index, fast, slow, q):
        raise NotCanonical(f"{kernel} does not read {source.text_of(array)}[{fast} * {q} + {slow}]")
    param = element.function.param(source.text_of(array))
    if param is None or param.pointer_depth != 1:
        raise NotCanonical(f"{source.text_of(array)} is not a pointer parameter of {kernel}")
    outside = [n for n in identifiers(source, value) if not _inside(n, load)]
    if any(source.text_of(n) in (i, slow, fast) for n in outside):
        raise NotCanonical(f"{kernel}'s stored value uses the index outside its read")
    for bound in (divisor, other):
        names = {source.text_of(n) for n in identifiers(source, bound)}
        if names - {p.name for p in element.function.params}:
            raise NotCanonical(f"{source.text_of(bound)} is not written with parameters")
    return TransposeKernel(element, slow, fast, divisor, other, load, store, param.base_type)


def _subscripts(node: Node) -> list[Node]:
    found = [node] if node.type == "subscript_expression" else []
    for child in node.named_children:
        found += _subscripts(child)
    return found


def _inside(node: Node, region: Node) -> bool:
    return region.start_byte <= node.start_byte and node.end_byte <= region.end_byte


def transpose_kernels(source: ParsedSource) -> list[TransposeKernel]:
    """Every naive transpose kernel in the form above."""
    found = []
    for element in element_kernels(source):
        try:
            found.append(transpose_kernel(source, element))
        except NotCanonical:
            continue
    return found


def transpose_edits(source: ParsedSource, kernel: TransposeKernel) -> list[Edit]:
    """The edits that stage each 32 x 32 tile of the input in shared memory."""
    element = kernel.element
    function = element.function
    taken = names_in_function(source, function)
    tile = fresh_name(taken, f"{source.text_of(kernel.load.child_by_field_name('argument'))}_tile")
    s, f, i = kernel.slow, kernel.fast, element.name
    slow_tile, fast_tile, k = (fresh_name(taken, n) for n in (f"{s}_tile", f"{f}_tile", "k"))
    index_type = element.index_type
    d, q = source.text_of(kernel.divisor), source.text_of(kernel.other)
    indent = source.indent_of(element.decl.start_byte)
    step = indent + "  "
    value = kernel.store.named_children[0].child_by_field_name("right")
    assert value is not None
    store = source.text_of(kernel.store)
    load = source.text_of(kernel.load)
    offset = kernel.load.start_byte - kernel.store.start_byte
    written = store[:offset] + f"{tile}[threadIdx.x][{k}]" + store[offset + len(load) :]
    lines = [
        f"__shared__ {kernel.element_type} {tile}[{TILE}][{TILE} + 1];",
        f"{indent}const {index_type} {slow_tile} = ({index_type})blockIdx.x * {TILE};",
        f"{indent}const {index_type} {fast_tile} = ({index_type})blockIdx.y * {TILE};",
        f"{indent}for (int {k} = threadIdx.y; {k} < {TILE}; {k} += {ROWS_PER_TURN}) {{",
        f"{step}const {index_type} {f} = {fast_tile} + {k};",
        f"{step}const {index_type} {s} = {slow_tile} + threadIdx.x;",
        f"{step}if ({f} < {d} && {s} < {q}) {tile}[{k}][threadIdx.x] = {load};",
        f"{indent}}}",
        f"{indent}__syncthreads();",
        f"{indent}for (int {k} = threadIdx.y; {k} < {TILE}; {k} += {ROWS_PER_TURN}) {{",
        f"{step}const {index_type} {s} = {slow_tile} + {k};",
        f"{step}const {index_type} {f} = {fast_tile} + threadIdx.x;",
        f"{step}if ({s} >= {q} || {f} >= {d}) continue;",
        f"{step}const {index_type} {i} = {s} * {d} + {f};",
        f"{step}{written}",
        f"{indent}}}",
    ]
    edits = [Edit(element.start_byte, kernel.store.end_byte, "\n".join(lines))]
    launches = source.launches_of(function.name)
    if not launches:
        raise NotCanonical(f"no launch of {function.name} in this file to give a 2-D grid")
    for launch in launches:
        if launch.grid is None or launch.block is None:
            raise NotCanonical(f"the launch at line {source.line_of(launch.node.start_byte)}")
        rows = _row_count(source, function, launch, kernel.divisor)
        cols = _row_count(source, function, launch, kernel.other)
        grid = (
            f"dim3((unsigned)(({cols} + {TILE - 1}) / {TILE}), "
            f"(unsigned)(({rows} + {TILE - 1}) / {TILE}))"
        )
        edits += [
            Edit.replace(launch.grid, grid),
            Edit.replace(launch.block, f"dim3({TILE}, {ROWS_PER_TURN})"),
        ]
    grids = [launch.grid for launch in launches if launch.grid]
    return edits + orphaned_declarations(source, grids)
