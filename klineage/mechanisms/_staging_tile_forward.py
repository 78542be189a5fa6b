"""The shared-memory transpose written into a tiled kernel that reads its input transposed:
the forward rule of the removal in :mod:`klineage.mechanisms._staging_tile`.

The form it takes: blocks of ``T x R`` threads, each walking its column of a ``T x T`` tile in
``T / R`` turns, and reading the input with ``threadIdx.x`` scaled (a warp's reads far apart)
while ``threadIdx.y`` and the turn move along the input's rows::

    for (int i = 0; i < T; i += R)
        out[...] = EXPR(in[INDEX]);     // INDEX: threadIdx.x times a stride, threadIdx.y + i
                                        // contiguous; every launch's block is dim3(T, R)

What it writes: the tile the block reads, loaded with the thread indices' roles swapped, so
``threadIdx.x`` walks the input's contiguous dimension, then read back transposed::

    __shared__ float S[T][T + 1];
    for (int i = 0; i < T; i += R)
        S[threadIdx.y + i][threadIdx.x] = in[INDEX for threadIdx.x := threadIdx.y + i,
                                                  threadIdx.y + i := threadIdx.x];
    __syncthreads();
    for (int i = 0; i < T; i += R)
        out[...] = EXPR(S[threadIdx.x][threadIdx.y + i]);

Slot ``[a][b]`` holds what the thread with ``threadIdx.x = a`` and ``threadIdx.y + i = b``
read, so each thread reads back exactly the element it read before. That holds when INDEX
depends on ``threadIdx.y`` and the turn only through their sum and on no other thread index,
reads memory the kernel never writes, and every thread of the block reaches the barrier (no
return or thread-dependent branch around it). Locals that differ between threads are replaced
by their definitions; block-uniform ones keep their names. The padding column keeps a warp's
column reads in 32 banks (written ``T + 1`` so that smem_padding reads it as padding).
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, analysis
from klineage.cuda.analysis.indices import Access, LoopVariable
from klineage.cuda.cexpr import BINARY_PRECEDENCE, PRIMARY, fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, fresh_name, statements
from klineage.mechanisms._local_util import names_in_function
from klineage.mechanisms._staging_tile import (
    Slot,
    SlotRewriter,
    TileStore,
    check_index,
)
from klineage.mechanisms._tiles_util import launch_block_dims

__all__ = ["TiledTranspose", "tiled_transpose", "tiled_transpose_edits", "transposed_read"]

_NEEDED = (
    "a top-level loop `for (i = 0; i < T; i += R)` in a kernel launched with dim3(T, R) "
    "blocks and no shared memory, holding one read of global memory whose index scales "
    "threadIdx.x and moves by 1 with threadIdx.y + i, not under a condition, with no return "
    "before the loop"
)
_X, _Y = "threadIdx.x", "threadIdx.y"


@dataclass(frozen=True)
class TiledTranspose:
    """A kernel in the form above."""

    function: Function
    loop: Node
    variable: LoopVariable
    read: Access
    """The transposed read of the input."""


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def transposed_read(indices: FunctionIndices, loop: Node) -> Access | None:
    """The first global load in ``loop`` whose index scales ``threadIdx.x`` (by anything but
    1) while ``threadIdx.y`` and the loop's variable move it by 1: the read the staging turns.
    None when the loop reads nothing that way (it is then no candidate)."""
    variable = indices.loop_of(loop)
    if variable is None:
        return None
    for access in indices.accesses():
        if access.direction != "load" or access.buffer.space != "global":
            continue
        if not loop.start_byte <= access.node.start_byte < loop.end_byte:
            continue
        offset = access.offset
        across = offset.coefficient(_X)
        if not across.terms or across.value in (1, -1):
            continue
        if offset.coefficient(_Y).value == 1 and offset.coefficient(variable.atom).value == 1:
            return access
    return None


def tiled_transpose(source: ParsedSource, function: Function, loop: Node) -> TiledTranspose:
    """The form of a candidate loop (one :func:`transposed_read` finds a read in); NotInForm
    says what differs."""
    indices = analysis(source).indices(function)
    read = transposed_read(indices, loop)
    variable = indices.loop_of(loop)
    if read is None or variable is None:
        raise _refuse("a loop without a read of global memory transposed across threadIdx.x")
    if function.body is None or loop.parent != function.body:
        raise _refuse("a loop inside a branch or another loop")
    if variable.init.value != 0 or variable.step is None or variable.step.value is None:
        raise _refuse(f"a loop over {variable.name} that does not start at 0 with a constant step")
    if variable.bound is None:
        raise _refuse(f"a loop over {variable.name} without a bound `{variable.name} < T`")
    side = fold_int(source, variable.bound)
    rows = variable.step.value
    if side is None or rows <= 0 or side % rows:
        raise _refuse(
            f"a loop to `{source.text_of(variable.bound)}` in steps of {rows}, not a constant "
            "tile side walked in equal turns"
        )
    launches = source.launches_of(function)
    if not launches:
        raise _refuse(f"{function.name} is never launched in this file")
    for launch in launches:
        if launch_block_dims(source, launch) != (side, rows, 1):
            block = source.text_of(launch.block) if launch.block is not None else "?"
            raise _refuse(
                f"a launch with blocks of `{block}` (line {source.line_of(launch.node.start_byte)})"
                f", not {side} x {rows} threads walking a {side} x {side} tile"
            )
    _check_block_reaches_barrier(source, function, loop, read.node)
    if any(within(d.node, function.body) for d in source.shared_declarations):
        raise _refuse(f"{function.name}, which already uses shared memory")
    if analysis(source).shared(function).barriers:
        raise _refuse(f"{function.name}, which already has block barriers")
    written = {
        a.buffer.name
        for a in indices.accesses()
        if a.direction != "load" and a.buffer.space == "global"
    }
    if read.buffer.name in written:
        raise _refuse(f"a transposed read of {read.buffer.name}, which the kernel also writes")
    # the read seen as the store filling slot [threadIdx.x][threadIdx.y + i]: its index must
    # be the same for every thread and turn that fills one slot, as the removal requires
    store = TileStore(read.node, "", (), read.node)
    check_index(source, indices, store, _slots(), variable.atom, read.offset)
    return TiledTranspose(function, loop, variable, read)


def _slots() -> list[Slot]:
    # the original read seen as filling slot [threadIdx.x][threadIdx.y + i]
    return [Slot(_X), Slot(_Y, plus_loop=True)]


def _check_block_reaches_barrier(
    source: ParsedSource, function: Function, loop: Node, read: Node
) -> None:
    """Every thread must reach the barrier placed before ``loop``, and run the staging turn
    for every slot: no return before the loop, the read not under a condition in it."""
    assert function.body is not None
    for node in source.iter_nodes("return_statement", within=function.body):
        if node.start_byte < loop.start_byte:
            line = source.line_of(node.start_byte)
            raise _refuse(f"a return before the loop (line {line}), which threads may take")
    current = read.parent
    while current is not None and current != loop:
        if current.type in ("if_statement", "conditional_expression", "for_statement"):
            line = source.line_of(current.start_byte)
            raise _refuse(f"the transposed read under a condition or loop (line {line})")
        current = current.parent


class _SwappedReader(SlotRewriter):
    """The original read's value for the thread whose ``threadIdx.x`` is this thread's
    ``threadIdx.y + i`` and whose ``threadIdx.y + i`` is this thread's ``threadIdx.x``."""

    def __init__(self, source: ParsedSource, transpose: TiledTranspose) -> None:
        super().__init__(
            source, transpose.function, transpose.loop, transpose.variable.name, _slots()
        )

    def _read_index(self, slot: Slot) -> tuple[str, int]:
        if slot.thread == _X:
            return f"{_Y} + {self.variable}", BINARY_PRECEDENCE["+"]
        return _X, PRIMARY


def tiled_transpose_edits(source: ParsedSource, transpose: TiledTranspose) -> list[Edit]:
    """The edits that stage the tile the block reads and read it back transposed."""
    function, loop, turn = transpose.function, transpose.loop, transpose.variable.name
    assert function.body is not None
    value, _ = _SwappedReader(source, transpose).value_at(transpose.read.node, [])
    tile = fresh_name(names_in_function(source, function), "tile")
    element = transpose.read.buffer.element_type.replace("const", "").strip()
    assert transpose.variable.bound is not None  # tiled_transpose folded it to the tile side
    side = source.text_of(transpose.variable.bound)
    body = loop.child_by_field_name("body")
    assert body is not None
    header = source.text_of((loop.start_byte, body.start_byte)).rstrip()
    indent = source.indent_of(loop.start_byte)
    step_in = source.indent_of(statements(body)[0].start_byte) if statements(body) else ""
    if not step_in.startswith(indent) or len(step_in) <= len(indent):
        step_in = indent + "  "
    staging = (
        f"{header} {{\n{step_in}{tile}[{_Y} + {turn}][{_X}] = {value};\n{indent}}}\n"
        f"{indent}__syncthreads();\n{indent}"
    )
    first = source.indent_of(statements(function.body)[0].start_byte)
    declaration = f"__shared__ {element} {tile}[{side}][{side} + 1];"
    return [
        Edit.insert(function.body.start_byte + 1, f"\n{first}{declaration}"),
        Edit.insert(loop.start_byte, staging),
        Edit.replace(transpose.read.node, f"{tile}[{_X}][{_Y} + {turn}]"),
    ]
