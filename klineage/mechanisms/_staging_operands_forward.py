"""Staging written into a tile loop whose threads read their operands straight from global
memory, each thread a register micro-tile of them: the forward rule for what the loader
removal (:mod:`klineage.mechanisms._staging_loader`) leaves of tiles that fed such micro-tiles.

The form it takes: a top-level counted loop of a kernel without shared memory whose turn
reads pointer parameters, inside loops of compile-time trip counts, as ``P[U + a·X + Y]``::

    for (int t = 0; t < tiles; ++t)
      for (int k = 0; k < BK; ++k)
        for (int m = 0; m < TM; ++m)
          for (int n = 0; n < TN; ++n)
            acc[m][n] += A[t * BK + by * BM * K + K * (ty * TM + m) + k] * B[...];

``U`` is the same for every thread of the block in a turn (block indices, the turn's counter,
parameters), ``a`` is a parameter (the row stride), and ``X`` and ``Y`` are sums of thread
indices and inner loop counters with compile-time coefficients, over disjoint sets of them,
each taking every value of ``[0, R)`` and ``[0, C)`` (checked as a mixed radix from the
launch's block and the loops' trip counts). What it writes: a ``__shared__`` tile ``S[R][C]``
per operand, filled at the top of the turn by the whole block (``S[e / C][e % C] = P[U + a
* (e / C) + e % C]`` for ``e`` over the slots, consecutive threads on consecutive addresses),
a barrier after the fill and one at the end of the turn, and each read ``S[X][Y]``.

Slot ``[x][y]`` holds ``P[U + a·x + y]``, the value a read with ``X = x`` and ``Y = y`` gets,
so every read gets its value back. The fill reads only elements the kernel read: every slot
is some thread's read in the same turn, because the reads sit under no condition, ``X`` and
``Y`` cover their ranges and vary with different indices. The rest holds by checks: ``P`` is
never written, ``U`` and ``a`` name nothing the loop writes, and every thread reaches both
barriers (the loop is at the top of the kernel with a block-uniform trip count, nothing
returns before it but whole blocks, and nothing jumps out of its turn).

The loop may also be in a ``__device__`` body that one kernel calls at its top level (directly
or through a function-pointer template parameter, ``k<body><<<...>>>``), whose launches then
give the block. The offsets are read by :mod:`klineage.mechanisms._staging_operand_reads`,
which also takes a column walked rotated, ``(s + threadIdx.x) % C``.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.indices import Access, is_loop_atom
from klineage.cuda.cexpr import SIZEOF
from klineage.cuda.edit import Edit
from klineage.cuda.facts import compile_time_bindings
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, assigned_names, fresh_name, walk
from klineage.mechanisms._staging_operand_reads import (
    NEEDED,
    OperandReader,
    TileRead,
    fixed_names,
)
from klineage.mechanisms._tiles_util import (
    STATIC_SHARED_LIMIT,
    function_names,
    kernel_block_dims,
)

__all__ = ["OperandTile", "OperandTiles", "operand_tile_edits", "operand_tiles", "reads_tiles"]

_JUMPS = ("return_statement", "break_statement", "continue_statement", "goto_statement")
_CONDITIONAL = (
    "if_statement",
    "conditional_expression",
    "while_statement",
    "do_statement",
    "switch_statement",
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


@dataclass(frozen=True)
class OperandTile:
    """One operand the turn reads as a register micro-tile, and the tile that stages it."""

    pointer: str
    element: str
    """The element type the tile holds (the pointer's, unqualified)."""
    base: str
    """``U`` less the pointer's own offset, as C text (64-bit)."""
    stride: str
    """``a``, as C text."""
    rows: int
    columns: int
    reads: tuple[tuple[Node, str, str], ...]
    """(the read, X's text, Y's text) for each read of the tile."""


@dataclass(frozen=True)
class OperandTiles:
    """A loop in the form above."""

    function: Function
    loop: Node
    threads: tuple[int, int, int]
    tiles: tuple[OperandTile, ...]


# ---------------------------------------------------------------------------------------------
# The form
# ---------------------------------------------------------------------------------------------


def _turn_reads(source: ParsedSource, function: Function, loop: Node) -> list[Access]:
    """The global loads of pointer parameters in the turn that move with an inner loop."""
    indices = analysis(source).indices(function)
    body = loop.child_by_field_name("body")
    if body is None:
        return []
    pointers = {p.name for p in function.params if p.is_pointer and p.name}
    turn = indices.loop_of(loop)
    found = []
    for access in indices.accesses():
        if access.direction != "load" or access.buffer.name not in pointers:
            continue
        if not within(access.node, body) or access.helper is not None:
            continue
        inner = [
            a
            for a in access.offset.base_atoms()
            if is_loop_atom(a) and (turn is None or a != turn.atom)
        ]
        if inner:
            found.append(access)
    return found


def reads_tiles(source: ParsedSource, function: Function, loop: Node) -> bool:
    """Whether a top-level loop reads a pointer parameter inside a loop nested in its turn,
    in a kernel or ``__device__`` function without shared memory: the cheap test of a
    candidate."""
    if function.body is None or not function.runs_on_device or _has_shared(source, function):
        return False
    return bool(_turn_reads(source, function, loop))


def _has_shared(source: ParsedSource, function: Function) -> bool:
    """Whether the function declares shared memory (static or dynamic)."""
    buffers = analysis(source).indices(function).buffers.values()
    return any(buffer.space == "shared" for buffer in buffers)


def _synchronizes(source: ParsedSource, function: Function) -> bool:
    """Whether the function, or what it calls, holds a block barrier."""
    return analysis(source).call_graph.summary(function.name).block_barrier


def _block_uniform(source: ParsedSource, function: Function, condition: Node) -> bool:
    """Whether a condition reads only block indices, grid and block sizes, and parameters
    and template parameters the function never writes."""
    fixed = fixed_names(source, function)
    for node in walk(condition):
        if node.type == "field_expression":
            base = node.child_by_field_name("argument")
            if base is None or source.text_of(base) not in ("blockIdx", "gridDim", "blockDim"):
                return False
        elif node.type == "identifier":
            parent = node.parent
            in_field = parent is not None and parent.type == "field_expression"
            if not in_field and source.text_of(node) not in fixed:
                return False
        elif node.type in ("call_expression", "subscript_expression", "pointer_expression"):
            return False
    return True


def _uniform_returns(source: ParsedSource, function: Function, before: int, what: str) -> None:
    """Refuse a return before byte ``before`` of ``function`` unless it is the whole block's:
    ``if (block-uniform condition) return;`` at the top of the function."""
    assert function.body is not None
    for node in walk(function.body):
        if node.type != "return_statement" or node.end_byte > before:
            continue
        guard = node.parent
        if guard is not None and guard.type == "compound_statement":
            guard = guard.parent if len(guard.named_children) == 1 else None
        condition = guard.child_by_field_name("condition") if guard is not None else None
        if (
            guard is None
            or guard.type != "if_statement"
            or guard.parent != function.body
            or condition is None
            or not _block_uniform(source, function, condition)
        ):
            raise _refuse(
                f"a {what} that may return before the loop for some threads only "
                f"(line {source.line_of(node.start_byte)})"
            )


def _entry(source: ParsedSource, function: Function, loop: Node) -> Function:
    """The kernel whose launches give the block: ``function`` itself, or the one kernel that
    calls this ``__device__`` function, at its top level and with every thread."""
    if function.is_kernel:
        return function
    sites = analysis(source).call_graph.call_sites(function.name)
    if len(sites) != 1:
        raise _refuse(f"a `__device__` function called from {len(sites)} places, not one kernel")
    caller, call = sites[0]
    kernel = source.function(caller)
    statement = call.parent
    if kernel is None or not kernel.is_kernel or kernel.body is None:
        raise _refuse(f"a `__device__` function that `{caller}`, not a kernel, calls")
    if statement is None or statement.parent != kernel.body:
        raise _refuse(f"a `__device__` function that `{caller}` calls under a condition or loop")
    if _has_shared(source, kernel) or _synchronizes(source, kernel):
        raise _refuse(f"a `__device__` function whose kernel `{caller}` already shares memory")
    _uniform_returns(source, kernel, call.start_byte, "kernel")
    return kernel


def _guards(source: ParsedSource, node: Node, body: Node) -> list[Node]:
    """The loops between a read and the turn's body; refuse a read a condition guards."""
    loops, at = [], node
    while at.parent is not None and at != body:
        parent = at.parent
        guarded = parent.type in _CONDITIONAL and at != parent.child_by_field_name("condition")
        logical = parent.type == "binary_expression" and parent.children[1].type in ("&&", "||")
        if guarded or (logical and at == parent.children[-1]):
            raise _refuse(f"a read `{source.snippet(node, 60)}` under a condition")
        if parent.type == "for_statement" and at == parent.child_by_field_name("body"):
            loops.append(parent)
        at = parent
    return loops


def operand_tiles(source: ParsedSource, function: Function, loop: Node) -> OperandTiles:
    """The loop's operand tiles; raises NotInForm with the form found otherwise."""
    body = loop.child_by_field_name("body")
    if function.body is None or loop.parent != function.body:
        raise _refuse("a loop that is not at the top of the kernel")
    if body is None or body.type != "compound_statement":
        raise _refuse("a loop whose turn is not a block `{ ... }`")
    indices = analysis(source).indices(function)
    turn = indices.loop_of(loop)
    if turn is None or not turn.bound_uniform:
        raise _refuse("a loop whose trip count is not the same for every thread")
    jumps = [n for n in walk(body) if n.type in _JUMPS]
    if jumps:
        raise _refuse(f"a turn that jumps (`{source.snippet(jumps[0], 30)}`)")
    if _has_shared(source, function):
        raise _refuse("a function that already stages in shared memory")
    _uniform_returns(source, function, loop.start_byte, "function")
    if _synchronizes(source, function):
        raise _refuse("a kernel that already synchronizes its block")
    kernel = _entry(source, function, loop)
    threads = kernel_block_dims(source, kernel)
    if threads is None:
        raise _refuse(f"a kernel `{kernel.name}` whose launches do not all give one constant block")
    bindings = compile_time_bindings(source, function)
    if not bindings:
        raise _refuse("a kernel whose template arguments do not fold to integers")
    reads = _turn_reads(source, function, loop)
    if not reads:
        raise _refuse("a turn that reads no pointer parameter inside an inner loop")
    written = {a.buffer.name for a in indices.accesses() if a.direction in ("store", "both")}
    written |= assigned_names(source, body)
    found: dict[tuple[str, str, str], list[tuple[Node, TileRead]]] = {}
    for access in reads:
        loops = _guards(source, access.node, body)
        if access.buffer.name in written:
            raise _refuse(f"a kernel that writes or moves `{access.buffer.name}`, which it reads")
        readings = {
            OperandReader(source, function, loop, threads, binding).read(access, loops)
            for binding in bindings
        }
        if len(readings) != 1:
            raise _refuse(
                f"a read `{source.snippet(access.node, 60)}` whose tile differs between "
                "instantiations"
            )
        read = readings.pop()
        found.setdefault((read.pointer, read.base, read.stride), []).append((access.node, read))
    tiles = []
    for (pointer, base, stride), entries in found.items():
        if len({(r.rows, r.columns) for _, r in entries}) != 1:
            raise _refuse(f"reads of `{pointer}` that cover tiles of different sizes")
        first = entries[0][1]
        slots = tuple((node, r.row, r.column) for node, r in entries)
        tiles.append(
            OperandTile(pointer, first.element, base, stride, first.rows, first.columns, slots)
        )
    size = sum(t.rows * t.columns * SIZEOF.get(t.element, 4) for t in tiles)
    if size > STATIC_SHARED_LIMIT:
        raise _refuse(
            f"tiles of {size} bytes, more than the {STATIC_SHARED_LIMIT} of static shared memory"
        )
    return OperandTiles(function, loop, threads, tuple(tiles))


# ---------------------------------------------------------------------------------------------
# Edits
# ---------------------------------------------------------------------------------------------


def _thread_text(threads: tuple[int, int, int]) -> str:
    x, y, z = threads
    if z > 1:
        return f"(threadIdx.z * {y} + threadIdx.y) * {x} + threadIdx.x"
    if y > 1:
        return f"threadIdx.y * {x} + threadIdx.x"
    return "threadIdx.x"


def operand_tile_edits(source: ParsedSource, form: OperandTiles) -> list[Edit]:
    """The tiles declared before the loop, filled at the top of its turn between barriers,
    and the reads turned into tile reads."""
    loop, body = form.loop, form.loop.child_by_field_name("body")
    assert body is not None
    taken = function_names(source, form.function)
    indent = source.indent_of(loop.start_byte)
    inner = indent + "  "
    x, y, z = form.threads
    count = x * y * z
    slot, turn = fresh_name(taken, "slot"), fresh_name(taken, "fill")
    taken |= {slot, turn}
    thread = _thread_text(form.threads)
    declarations, fills, edits = [], [], []
    for tile in form.tiles:
        name = fresh_name(taken, f"tile_{tile.pointer}")
        taken.add(name)
        declarations.append(
            f"__shared__ {tile.element} {name}[{tile.rows}][{tile.columns}];\n{indent}"
        )
        slots = tile.rows * tile.columns
        if slots % count == 0:
            # every thread fills as many slots: a constant trip count nvcc unrolls by itself
            header = (
                f"for (int {turn} = 0; {turn} < {slots // count}; "
                f"++{turn}) {{\n{inner}  const int {slot} = {turn} * {count} + {thread};"
            )
        else:
            header = f"for (int {slot} = {thread}; {slot} < {slots}; {slot} += {count}) {{"
        fills.append(
            f"\n{inner}{header}\n"
            f"{inner}  {name}[{slot} / {tile.columns}][{slot} % {tile.columns}] = "
            f"{tile.pointer}[{tile.base} + (long long)({tile.stride}) * ({slot} / {tile.columns}) "
            f"+ {slot} % {tile.columns}];\n"
            f"{inner}}}"
        )
        for node, row, column in tile.reads:
            edits.append(Edit.replace(node, f"{name}[{row}][{column}]"))
    edits.append(Edit.insert(loop.start_byte, "".join(declarations)))
    edits.append(Edit.insert(body.start_byte + 1, "".join(fills) + f"\n{inner}__syncthreads();"))
    closing = body.end_byte - 1
    edits.append(Edit.insert(closing, f"  __syncthreads();\n{indent}"))
    return edits
