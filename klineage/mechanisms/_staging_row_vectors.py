"""Staging a block's row-invariant vectors once in shared memory: the forward rule of the
removal of a tile staged once (:mod:`klineage.mechanisms._staging_once`).

The form it takes: a kernel whose rows (a block's warps, threads or a persistent loop's turns)
each walk a loop over ``c`` and read a global vector at ``c`` alone, the same for every row::

    for (int c = LANE * V; c < C; c += STEP * V) {
      const T w = LOAD(weight + c);        // or weight[c] (T its element, V = 1)
      ...
    }

What it writes: every such vector copied once per block, by all the block's threads, into
the dynamic shared buffer, a barrier, and the reads taken from the copy::

    extern __shared__ __align__(16) char staged[];
    T* s_weight = reinterpret_cast<T*>(staged);
    T* s_bias = reinterpret_cast<T*>(staged) + 1 * ((C + V - 1) / V);
    for (int i = FLAT_THREAD * V; i < C; i += THREADS * V) {
      s_weight[i / V] = LOAD(weight + i);
      s_bias[i / V] = LOAD(bias + i);
    }
    __syncthreads();
    ...
      const T w = s_weight[c / V];

Slot ``c / V`` holds what the read loaded, because the index is ``c`` alone (no row in it),
``c`` and the copy's index are multiples of V, both stay below C, and the vector is memory
the kernel never writes. The copy goes first in the kernel, before any return or branch, so
every thread reaches the barrier. A kernel that already has a dynamic buffer keeps it: its
own uses move past the staged vectors (``buf`` becomes ``(buf + BYTES)``). Every launch asks
for BYTES more dynamic shared memory, and sets the opt-in attribute past 48 KiB; the removal
leaves the host as it is while the kernel keeps other shared memory, and otherwise asks for
none (:func:`klineage.mechanisms._dynamic_shared.idle_requests`).

V comes from the load: 1 when it reads the vector's element type, else the elements a load
reads (16-byte packs of floats: 4), written as the pack's ``T::size`` when the loop is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.analysis.indices import (
    BLOCK_ATOMS,
    GRID_ATOMS,
    Access,
    LoopVariable,
    is_loop_atom,
)
from klineage.cuda.cexpr import SIZEOF, fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Declaration, Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    fresh_name,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._dynamic_shared import kernel_byte_buffer, own_launches, request_edits
from klineage.mechanisms._local_util import names_in_function
from klineage.mechanisms._staging_once import multiple_of
from klineage.mechanisms._tiles_util import rename

if TYPE_CHECKING:
    from klineage.mechanisms.base import Mechanism, Site

__all__ = ["ROW_VECTORS", "RowVectors", "row_vector_application", "row_vector_candidates"]

ROW_VECTORS = "row_vectors"
NEEDED = (
    "loops over c (`c < C`, C a parameter or a constant, c from the thread index in steps "
    "that keep it a multiple of the load's width) that read `g[c]` or `T v = LOAD(g + c)` "
    "from a global vector g the kernel never writes or moves, one element type and width "
    "for all of them, in a kernel whose other accesses differ between blocks, launched in "
    "this file as a statement of its own"
)
_STATIC_LIMIT = 48 * 1024


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


@dataclass(frozen=True)
class _Read:
    access: Access
    loop: LoopVariable


@dataclass(frozen=True)
class RowVectors:
    """A kernel in the form above."""

    function: Function
    reads: list[_Read]
    vectors: list[str]
    """The staged vectors' names, in the order of their first read."""
    element: str
    """The type a read yields (the slot's type)."""
    width: IndexForm
    width_text: str | None
    """``V`` as written in the slots (``T::size``, ``4``); None for V = 1."""
    bound: Node
    buffer: Declaration | None
    """The kernel's own dynamic shared buffer, when it has one."""
    launches: list[Launch]


def _varies_by_block(indices: FunctionIndices, form: IndexForm, depth: int = 0) -> bool:
    for atom in form.base_atoms():
        if atom in BLOCK_ATOMS:
            return True
        variable = indices.loop(atom) if is_loop_atom(atom) else None
        if (
            variable is not None
            and depth < 4
            and _varies_by_block(indices, variable.init, depth + 1)
        ):
            return True
    return False


def invariant_loads(source: ParsedSource, function: Function) -> list[_Read]:
    """The global loads at exactly a loop's index, in loops that every block walks the same
    way (their start and step name no block), of a kernel whose other accesses differ
    between blocks: the reads this rule stages (no candidate without them)."""
    if function.body is None or not function.is_kernel:
        return []
    indices = analysis(source).indices(function)
    found, rows = [], False
    copied = {
        load.node.start_byte for c in analysis(source).shared(function).copies for load in c.loads
    }
    for access in indices.accesses():
        if access.buffer.space != "global" or access.node.start_byte in copied:
            continue  # a load copied into shared memory is staged already
        variable = next(
            (
                indices.loop(a)
                for a in access.offset.base_atoms()
                if is_loop_atom(a) and access.offset == IndexForm.atom(a)
            ),
            None,
        )
        walked = (
            variable is not None
            and variable.step is not None
            and not (variable.init.base_atoms() | variable.step.base_atoms())
            & (BLOCK_ATOMS | GRID_ATOMS)
        )
        if access.direction == "load" and walked and variable is not None:
            found.append(_Read(access, variable))
        elif _varies_by_block(indices, access.offset):
            rows = True
    return found if rows else []


def _value_type(source: ParsedSource, access: Access) -> str:
    """The type a read yields: the element of ``g[c]``, else the declared type of the local
    the read initializes."""
    node = access.node
    if node.type == "subscript_expression":
        return access.buffer.element_type.replace("const", "").strip()
    parent = node.parent
    if parent is not None and parent.type == "initializer_list" and len(parent.named_children) == 1:
        parent = parent.parent
    declaration = parent.parent if parent is not None else None
    if (
        parent is not None
        and parent.type == "init_declarator"
        and parent.child_by_field_name("value") in (node, node.parent)
        and declaration is not None
        and declaration.type == "declaration"
    ):
        kind = declaration.child_by_field_name("type")
        text = source.text_of(kind) if kind is not None else "auto"
        if text != "auto":
            return text
    raise _refuse(f"a read `{source.snippet(node, 50)}` whose value's type is not declared")


def _width(source: ParsedSource, reads: list[_Read], element: str) -> tuple[IndexForm, str | None]:
    """V and how to write it: the pack's ``T::size`` where the kernel names it, else the
    bytes a read takes over the element's size."""
    first = reads[0].access
    plain = first.buffer.element_type.replace("const", "").strip()
    if element == plain:
        return IndexForm.constant(1), None
    indices = analysis(source).indices(first.function)
    for node in indices.nodes("qualified_identifier"):
        if source.text_of(node).replace(" ", "") == f"{element}::size":
            return indices.form(node), source.text_of(node)
    size = SIZEOF.get(plain)
    if first.bytes is None or size is None or first.bytes % size:
        raise _refuse(
            f"a read of {element} from {first.buffer.name} whose width in elements is unknown"
        )
    return IndexForm.constant(first.bytes // size), str(first.bytes // size)


def _walks_multiples(indices: FunctionIndices, loop: LoopVariable, width: IndexForm) -> bool:
    """Whether the loop's index starts at a multiple of ``width`` and grows by multiples."""
    step = loop.step
    return (
        step is not None
        and all(c >= 0 for _, c in loop.init.terms)
        and all(c >= 0 for _, c in step.terms)
        and any(c > 0 for _, c in step.terms)
        and multiple_of(indices, loop.init, width)
        and multiple_of(indices, step, width)
    )


def row_vectors(source: ParsedSource, function: Function) -> RowVectors:
    """The form of a candidate kernel (:func:`invariant_loads` finds reads in it); NotInForm
    says what differs."""
    reads = invariant_loads(source, function)
    if not reads or function.body is None:
        raise _refuse(f"{function.name}, which reads no vector at a loop's index alone")
    indices = analysis(source).indices(function)
    body = function.body
    written = assigned_names(source, body)
    stored = {a.buffer.name for a in indices.accesses() if a.direction != "load"}
    params = {p.name for p in function.params if p.name}
    vectors: list[str] = []
    for read in reads:
        name = read.access.buffer.name
        if name not in params or name in written or name in stored:
            raise _refuse(
                f"a read of {name}, which the kernel writes or moves (or is no parameter)"
            )
        if name not in vectors:
            vectors.append(name)
    bound = reads[0].loop.bound
    if bound is None:
        raise _refuse(f"a loop over {reads[0].loop.name} without a bound `< C`")
    bound = strip_parens(bound)
    constant = fold_int(source, bound) is not None
    if not constant and (
        bound.type != "identifier"
        or source.text_of(bound) not in params
        or source.text_of(bound) in written
    ):
        raise _refuse(f"a loop to `{source.text_of(bound)}`, not a parameter the kernel keeps")
    element = _value_type(source, reads[0].access)
    for read in reads:
        loop = read.loop
        condition = loop.loop.child_by_field_name("condition")
        operator = condition.child_by_field_name("operator") if condition is not None else None
        if loop.bound is None or source.text_of(strip_parens(loop.bound)) != source.text_of(bound):
            raise _refuse(f"loops to different bounds (`{source.snippet(loop.loop, 50)}`)")
        if operator is None or operator.type != "<":
            raise _refuse(f"a loop `{source.header(loop.loop)}` whose condition is not `c < C`")
        if _value_type(source, read.access) != element:
            raise _refuse(f"vectors read as different types ({element} and another)")
    width, width_text = _width(source, reads, element)
    for read in reads:
        loop = read.loop
        if not _walks_multiples(indices, loop, width):
            raise _refuse(
                f"a loop over {loop.name} from {loop.init} in steps of {loop.step}, not "
                f"multiples of the {width} elements a read takes"
            )
    buffer = kernel_byte_buffer(source, function, NEEDED)
    if buffer is not None:
        for node in source.iter_nodes("return_statement", within=body):
            if node.start_byte < buffer.node.start_byte:
                line = source.line_of(node.start_byte)
                raise _refuse(f"a return before the dynamic buffer's declaration (line {line})")
    launches = own_launches(source, function, NEEDED)
    rows = RowVectors(function, reads, vectors, element, width, width_text, bound, buffer, launches)
    _host_edits(source, rows)  # refuses an opt-in it cannot keep in step with the launch
    return rows


def _slots(count: str, width_text: str | None) -> str:
    return count if width_text is None else f"(({count} + {width_text} - 1) / {width_text})"


def _bytes(count: int, slots: str, element: str) -> str:
    return f"{count} * {slots} * sizeof({element})" if count > 1 else f"{slots} * sizeof({element})"


def _host_bytes(source: ParsedSource, rows: RowVectors, launch: Launch) -> str:
    """The bytes the staged vectors take, in the launching function's terms."""
    bound = source.text_of(rows.bound)
    names = [p.name for p in rows.function.params]
    if bound in names:
        arg = strip_parens(launch.args[names.index(bound)])
        bound = source.text_of(arg) if arg.type == "identifier" else f"({source.text_of(arg)})"
    slots = _slots(bound, rows.width_text)
    return _bytes(len(rows.vectors), slots, rows.element)


def _host_edits(source: ParsedSource, rows: RowVectors) -> list[Edit]:
    return request_edits(
        source, rows.launches, lambda launch: _host_bytes(source, rows, launch), NEEDED
    )


def row_vector_edits(source: ParsedSource, rows: RowVectors) -> list[Edit]:
    """The edits that stage the vectors and read them from shared memory."""
    function = rows.function
    body = function.body
    assert body is not None
    taken = names_in_function(source, function)
    buffer = rows.buffer.names[0] if rows.buffer is not None else fresh_name(taken, "staged")
    pointers = {v: fresh_name(taken, f"s_{v}") for v in rows.vectors}
    index = fresh_name(taken, "i")
    bound = source.text_of(rows.bound)
    slots = _slots(bound, rows.width_text)
    width = f" * {rows.width_text}" if rows.width_text else ""
    lines = [] if rows.buffer is not None else [f"extern __shared__ __align__(16) char {buffer}[];"]
    for k, vector in enumerate(rows.vectors):
        offset = "" if not k else f" + {slots}" if k == 1 else f" + {k} * {slots}"
        cast = f"reinterpret_cast<{rows.element}*>({buffer})"
        lines.append(f"{rows.element}* {pointers[vector]} = {cast}{offset};")
    flat = "threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)"
    threads = "blockDim.x * blockDim.y * blockDim.z"
    start = f"({flat}){width}"
    lines.append(f"for (int {index} = {start}; {index} < {bound}; {index} += {threads}{width}) {{")
    firsts = {}
    for read in rows.reads:
        firsts.setdefault(read.access.buffer.name, read)
    for vector in rows.vectors:
        read = firsts[vector]
        value = rename(source, read.access.node, {read.loop.name: index})
        slot = f"{index} / {rows.width_text}" if rows.width_text else index
        lines.append(f"  {pointers[vector]}[{slot}] = {value};")
    lines += ["}", "__syncthreads();"]
    edits: list[Edit] = []
    shift = _bytes(len(rows.vectors), slots, rows.element)
    if rows.buffer is not None:
        for node in walk(body):
            if (
                node.type == "identifier"
                and source.text_of(node) == buffer
                and not rows.buffer.node.start_byte <= node.start_byte < rows.buffer.node.end_byte
            ):
                edits.append(Edit.replace(node, f"({buffer} + {shift})"))
        anchor = rows.buffer.node
        indent = source.indent_of(anchor.start_byte)
        text = "".join(f"\n{indent}{line}" for line in lines)
        edits.append(Edit.insert(anchor.end_byte, text))
    else:
        first = statements(body)[0] if statements(body) else None
        indent = source.indent_of(first.start_byte) if first is not None else "  "
        text = "".join(f"\n{indent}{line}" for line in lines)
        edits.append(Edit.insert(body.start_byte + 1, text))
    for read in rows.reads:
        name = read.access.buffer.name
        slot = f"{read.loop.name} / {rows.width_text}" if rows.width_text else read.loop.name
        edits.append(Edit.replace(read.access.node, f"{pointers[name]}[{slot}]"))
    return edits + _host_edits(source, rows)


def row_vector_candidates(mechanism: Mechanism, source: ParsedSource) -> Iterator[Site]:
    """A candidate per kernel that reads vectors at a loop's index alone, refused with the
    reason when the kernel is not in the form."""
    for function in source.kernels:
        reads = invariant_loads(source, function)
        if not reads:
            continue
        names = list(dict.fromkeys(r.access.buffer.name for r in reads))
        refusal = None
        try:
            row_vectors(source, function)
        except NotInForm as why:
            refusal = str(why)
        yield mechanism.site(
            source,
            function.node,
            snippet=f"{function.name}: reads {', '.join(names)} at a loop's index alone",
            detail={"form": ROW_VECTORS, "kernel": function.name},
            refusal=refusal,
        )


def row_vector_application(mechanism: Mechanism, source: ParsedSource, site: Site) -> list[Edit]:
    function = source.enclosing_function(site.start_byte)
    if function is None or function.node.start_byte != site.start_byte:
        raise mechanism.refuse(f"no kernel at line {site.start_line}", site, "apply")
    try:
        return row_vector_edits(source, row_vectors(source, function))
    except NotInForm as why:
        raise mechanism.refuse(str(why), site, "apply") from None
