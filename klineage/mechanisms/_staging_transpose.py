"""A naive transpose staged through a shared-memory tile: the forward rule of smem_staging on
one-thread-per-element kernels that write ``y[i]`` from ``x`` read transposed.

The form it takes (one thread per output element, the output's index split into digits, the
input read with its fastest digit ``i % D`` scaled, so a warp's reads are far apart)::

    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D * Q) return;              // the bound a product with D among its factors
    const int64_t f = i % D;             // or i - (i / D) * D, or through a copy of i
    ...index arithmetic: locals of i, no memory read, no call...
    y[i] = EXPR(x[INDEX]);               // one read of x; INDEX scales f (it is not ... + f)

as a 2-D transpose (``f = i % rows``, ``x[f * cols + i / rows]``) or NCHW -> NHWC (``ci = i %
c``, ``x[((n * c + ci) * h + hi) * w + wi]``) write it. ``Q`` is the bound's other factors.
Consecutive threads write consecutive ``y`` but read ``x`` far apart. What it writes: 32 x 32
tiles of ``y`` seen as ``Q`` rows of ``D`` (``i = row * D + col``), blocks of 32 x 8 threads on
a 2-D grid (``blockIdx.x`` over the rows, ``blockIdx.y`` over the columns). Each block reads
its tile with ``threadIdx.x`` along the rows, where ``x`` is contiguous when the read is a
transpose, into a ``[32][32 + 1]`` shared array (the padding column keeps a warp's column
reads in 32 banks; written ``32 + 1`` so that smem_padding reads it as padding), waits at a
barrier, then writes each row of the tile with ``threadIdx.x`` along ``y``'s columns, running
the index arithmetic again for each element, with the read of ``x`` taken from the tile. The
element's code is kept as it was, so the result is the naive kernel's whatever ``x``'s layout;
the layout decides only whether it is faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import UNARY, operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource, plain_assignment
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
    walk,
)
from klineage.mechanisms._rows_forms import NotCanonical, primary_text, row_count
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import orphaned_declarations

TILE = 32
ROWS_PER_TURN = 8


@dataclass(frozen=True)
class TransposeKernel:
    """A naive transpose in the form above."""

    element: ElementKernel
    steps: tuple[Node, ...]
    """The index arithmetic before the store, run again for each element of a tile."""
    divisor: Node
    """``D``: the output's fastest extent, its index ``i % D``."""
    others: tuple[Node, ...]
    """The bound's other factors: their product ``Q`` counts the output's rows."""
    load: Node
    """The one read of ``x``."""
    store: Node
    """The statement ``y[i] = EXPR;``."""
    element_type: str
    """The type of ``x``'s elements, for the tile."""


def _one_index(node: Node) -> tuple[Node, Node] | None:
    """(array, index) of ``p[index]`` with ``p`` a name; None for anything else."""
    chain = subscript_chain(node)
    return (chain[0], chain[1][0]) if chain is not None and len(chain[1]) == 1 else None


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


def _factors(node: Node) -> list[Node]:
    """The factors of a product ``a * b * c`` (a single node for anything else)."""
    sides = binary(strip_parens(node), "*")
    if sides is None:
        return [strip_parens(node)]
    return _factors(sides[0]) + _factors(sides[1])


def _fast_digit(source: ParsedSource, steps: tuple[Node, ...], i: str) -> tuple[str, Node] | None:
    """(name, D) of the output's fastest index: a local set to ``i % D`` (``i`` or a copy of
    it not yet changed), or to ``i - q * D`` after ``q = i / D``."""
    copies, quotients = {i}, {}
    for statement in steps:
        declared = index_declaration(source, statement)
        if declared is None:
            copies.clear()  # an assignment (``rest /= c``) may change a copy: stop at it
            copies.add(i)
            continue
        name, _, value = declared
        if _text(source, value) in copies:
            copies.add(name)
            continue
        for op in ("%", "/"):
            sides = binary(strip_parens(value), op)
            if sides is None or _text(source, sides[0]) not in copies:
                continue
            if op == "%":
                return name, sides[1]
            quotients[name] = sides[1]
        for quotient, divisor in quotients.items():
            if _remainder(source, value, i, quotient, _text(source, divisor)):
                return name, divisor
    return None


def _last_addend(node: Node) -> Node:
    sides = binary(strip_parens(node), "+")
    return _last_addend(sides[1]) if sides is not None else strip_parens(node)


def transpose_kernel(source: ParsedSource, element: ElementKernel) -> TransposeKernel:
    """The transpose form of ``element``; :class:`NotCanonical` says what differs."""
    kernel = element.function.name
    i = element.name
    if element.form != "return" or len(element.body) < 2:
        raise NotCanonical(f"{kernel}'s element code is not index arithmetic and a store")
    *steps, store = element.body
    for step in steps:
        if any(n.type in ("subscript_expression", "call_expression") for n in walk(step)):
            raise NotCanonical(f"line {source.line_of(step.start_byte)} reads memory or calls")
    fast = _fast_digit(source, tuple(steps), i)
    if fast is None:
        raise NotCanonical(f"{kernel} does not split {i} into a fastest index i % D")
    digit, divisor = fast
    d = _text(source, divisor)
    factors = _factors(element.bound)
    texts = [_text(source, f) for f in factors]
    if d not in texts:
        raise NotCanonical(f"{kernel}'s bound is not {d} times a count")
    position = texts.index(d)
    others = factors[:position] + factors[position + 1 :]
    if not others:
        raise NotCanonical(f"{kernel}'s bound has nothing beside {d}")
    assignment = plain_assignment(store)
    if assignment is None:
        raise NotCanonical(f"{kernel}'s last statement is not a store")
    target, value = assignment
    stored = _one_index(target)
    if stored is None or _text(source, stored[1]) != i:
        raise NotCanonical(f"{kernel} does not store to y[{i}]")
    reads = [n for n in walk(value) if n.type == "subscript_expression"]
    if len(reads) != 1:
        raise NotCanonical(f"{kernel}'s stored value does not read exactly one array")
    load = reads[0]
    read = _one_index(load)
    if read is None:
        raise NotCanonical(f"{kernel}'s read is not of a parameter array")
    array, read_index = read
    read_names = {source.text_of(n) for n in identifiers(source, read_index)}
    if digit not in read_names or _text(source, _last_addend(read_index)) == digit:
        raise NotCanonical(f"{kernel} reads {source.text_of(array)} along {digit}: no transpose")
    param = element.function.param(source.text_of(array))
    if param is None or param.pointer_depth != 1:
        raise NotCanonical(f"{source.text_of(array)} is not a pointer parameter of {kernel}")
    declared = [index_declaration(source, s) for s in steps]
    locals_ = {i} | {names[0] for names in declared if names is not None}
    outside = [n for n in identifiers(source, value) if not _inside(n, load)]
    if any(source.text_of(n) in locals_ for n in outside):
        raise NotCanonical(f"{kernel}'s stored value uses the index outside its read")
    params = {p.name for p in element.function.params}
    for bound in (divisor, *others):
        if {source.text_of(n) for n in identifiers(source, bound)} - params:
            raise NotCanonical(f"{source.text_of(bound)} is not written with parameters")
    return TransposeKernel(
        element, tuple(steps), divisor, tuple(others), load, store, param.base_type
    )


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
    array = kernel.load.child_by_field_name("argument")
    assert array is not None  # a name: transpose_kernel checked the read
    tile = fresh_name(taken, f"{source.text_of(array)}_tile")
    i = element.name
    row, col, k = (fresh_name(taken, n) for n in (f"{i}_row", f"{i}_col", "k"))
    row_tile, col_tile = fresh_name(taken, f"{row}0"), fresh_name(taken, f"{col}0")
    index_type = element.index_type
    d = source.text_of(kernel.divisor)
    q = " * ".join(operand(source, f, UNARY) for f in kernel.others)
    indent = source.indent_of(element.decl.start_byte)
    inner = indent + "    "
    steps = [inner + line.strip() for s in kernel.steps for line in source.text_of(s).split("\n")]
    store, load = source.text_of(kernel.store), source.text_of(kernel.load)
    offset = kernel.load.start_byte - kernel.store.start_byte
    written = store[:offset] + f"{tile}[threadIdx.x][{k}]" + store[offset + len(load) :]
    turn = f"for (int {k} = threadIdx.y; {k} < {TILE}; {k} += {ROWS_PER_TURN}) {{"
    lines = [
        f"__shared__ {kernel.element_type} {tile}[{TILE}][{TILE} + 1];",
        f"{indent}const {index_type} {row_tile} = ({index_type})blockIdx.x * {TILE};",
        f"{indent}const {index_type} {col_tile} = ({index_type})blockIdx.y * {TILE};",
        f"{indent}{turn}",  # read along the rows of x: threadIdx.x walks y's rows
        f"{indent}  const {index_type} {row} = {row_tile} + threadIdx.x;",
        f"{indent}  const {index_type} {col} = {col_tile} + {k};",
        f"{indent}  if ({row} < {q} && {col} < {d}) {{",
        f"{inner}const {index_type} {i} = {row} * {d} + {col};",
        *steps,
        f"{inner}{tile}[{k}][threadIdx.x] = {load};",
        f"{indent}  }}",
        f"{indent}}}",
        f"{indent}__syncthreads();",
        f"{indent}{turn}",  # write along the rows of y: threadIdx.x walks its columns
        f"{indent}  const {index_type} {row} = {row_tile} + {k};",
        f"{indent}  const {index_type} {col} = {col_tile} + threadIdx.x;",
        f"{indent}  if ({row} < {q} && {col} < {d}) {{",
        f"{inner}const {index_type} {i} = {row} * {d} + {col};",
        *steps,
        f"{inner}{written}",
        f"{indent}  }}",
        f"{indent}}}",
    ]
    edits = [Edit(element.start_byte, kernel.store.end_byte, "\n".join(lines))]
    launches = source.launches_of(function)
    if not launches:
        raise NotCanonical(f"no launch of {function.name} in this file to give a 2-D grid")
    for launch in launches:
        if launch.grid is None or launch.block is None:
            raise NotCanonical(f"the launch at line {source.line_of(launch.node.start_byte)}")
        rows = " * ".join(_at_launch(source, function, launch, f) for f in kernel.others)
        cols = _at_launch(source, function, launch, kernel.divisor)
        grid = (
            f"dim3((unsigned)(({rows} + {TILE - 1}) / {TILE}), "
            f"(unsigned)(({cols} + {TILE - 1}) / {TILE}))"
        )
        edits += [
            Edit.replace(launch.grid, grid),
            Edit.replace(launch.block, f"dim3({TILE}, {ROWS_PER_TURN})"),
        ]
    grids = [launch.grid for launch in launches if launch.grid]
    return edits + orphaned_declarations(source, grids)


def _at_launch(source: ParsedSource, function: Function, launch: Launch, node: Node) -> str:
    """A factor written at the launch (parameters replaced by the launch's arguments), ready to
    be multiplied."""
    text = row_count(source, function, launch, node)
    return text if primary_text(text) else f"({text})"
