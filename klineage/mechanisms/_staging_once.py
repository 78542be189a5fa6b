"""Removing a tile staged once: a loop of stores ``S[i / V] = load(g + i)`` before a barrier.

Public kernels often stage a block's shared operands (a row's weights and biases, a filter)
once, before any row is processed, through pointers cast from the dynamic shared buffer::

    extern __shared__ char buf[];
    Vec* s_w = reinterpret_cast<Vec*>(buf);
    for (int i = first; i < n; i += step) s_w[i / Vec::size] = load(w + i);
    __syncthreads();
    ...
    const Vec wv = s_w[c / Vec::size];     // every row reads the staged copy

Removing the staging reads global memory again where the copy was read: each read
``S[e]`` becomes the stored value of the iteration that filled slot ``e`` (``i = e * V``,
written ``c`` when ``e`` is ``c / V`` and ``c`` is a multiple of ``V``), the staging loop
goes, and so do the declarations nothing uses any more, the barrier too when the kernel has
no shared memory left. Valid when the loop only stores, every index it stores is a multiple
of ``V`` (so slot ``e`` was filled by ``i = e * V``), the stored value depends on nothing but
the loop index and arguments the kernel never writes, and the staged buffer is only read
elsewhere, as ``S[e]``. Other pointers into the same dynamic buffer are taken to address
their own regions, as their author laid them out (not proved here; the gate's check on the
GPU catches a kernel that overlaps them).
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.analysis.indices import is_loop_atom
from klineage.cuda.cexpr import PRIMARY, precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import (
    BUILTINS,
    NotInForm,
    assigned_names,
    binary_operands,
    statement_after,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._dynamic_shared import idle_requests
from klineage.mechanisms._tiles_util import orphaned_declarations

__all__ = [
    "is_written",
    "loop_store",
    "multiple_of",
    "no_shared_left",
    "once_removal",
    "orphan_deletions",
]

_NEEDED = (
    "a loop that only stores `S[i]` or `S[i / V]` (i a multiple of V) values computed from i "
    "and arguments the kernel never writes, S read elsewhere only as `S[e]`"
)


@dataclass(frozen=True)
class _Store:
    """``S[index] = value;`` in the staging loop."""

    statement: Node
    buffer: str
    divisor: Node | None
    """``V`` of ``S[i / V]``; None for ``S[i]``."""
    value: Node


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def loop_store(source: ParsedSource, statement: Node, variable: str) -> _Store:
    pair = plain_assignment(statement)
    target = strip_parens(pair[0]) if pair is not None else None
    if pair is None or target is None or target.type != "subscript_expression":
        raise _refuse(f"a staging loop holding `{source.snippet(statement, 60)}`")
    base = target.child_by_field_name("argument")
    indices = target.child_by_field_name("indices")
    index = indices.named_children[0] if indices is not None and indices.named_children else None
    if base is not None and base.type == "subscript_expression":
        raise _refuse(f"a tile of several dimensions stored as `{source.snippet(target, 60)}`")
    if base is None or base.type != "identifier" or index is None:
        raise _refuse(f"a store `{source.snippet(target, 60)}` into no named buffer")
    index = strip_parens(index)
    divisor = None
    if index.type != "identifier":
        operands = binary_operands(index, "/")
        if operands is None:
            raise _refuse(f"a store at `{source.text_of(index)}`, not at the loop index")
        index, divisor = strip_parens(operands[0]), operands[1]
    if index.type != "identifier" or source.text_of(index) != variable:
        raise _refuse(f"a store at `{source.snippet(target, 60)}`, not at the loop index")
    return _Store(statement, source.text_of(base), divisor, pair[1])


def multiple_of(
    indices: FunctionIndices, form: IndexForm, divisor: IndexForm, depth: int = 0
) -> bool:
    """Whether every term of ``form`` is a multiple of ``divisor`` (an integer or one atom); a
    loop variable is one when its start and its step are."""
    value = divisor.value
    atom = None
    if value is None:
        if len(divisor.terms) != 1 or divisor.terms[0][1] != 1 or len(divisor.terms[0][0]) != 1:
            return False
        atom = divisor.terms[0][0][0]
    for monomial, coefficient in form.terms:
        if atom in monomial or (value is not None and value > 0 and coefficient % value == 0):
            continue
        loops = [indices.loop(a) for a in monomial if is_loop_atom(a)]
        if depth > 3 or not any(
            v is not None
            and v.step is not None
            and multiple_of(indices, v.init, divisor, depth + 1)
            and multiple_of(indices, v.step, divisor, depth + 1)
            for v in loops
        ):
            return False
    return True


def _check_value(
    source: ParsedSource, function: Function, indices: FunctionIndices, store: _Store, var: str
) -> None:
    """The stored value must be the same wherever it is evaluated: built from the loop index
    and from arguments the kernel never writes, reading memory the kernel never stores to."""
    assert function.body is not None
    params = {p.name for p in function.params if p.name}
    written = assigned_names(source, function.body)
    locals_ = set(source.local_types(function)) - params
    for node in walk(store.value):
        if node.type != "identifier":
            continue
        name = source.text_of(node)
        if name == var:
            continue
        if name in BUILTINS or name in locals_:
            raise _refuse(f"a staged value `{source.snippet(store.value, 60)}` that uses {name}")
        if name in params and name in written:
            raise _refuse(f"a staged value read through {name}, which the kernel moves")
    stored = {
        a.buffer.name
        for a in indices.accesses()
        if a.direction != "load" and a.buffer.space == "global"
    }
    for node in walk(store.value):
        if node.type == "identifier" and source.text_of(node) in stored:
            raise _refuse(
                f"a staged value read from {source.text_of(node)}, which the kernel writes"
            )


def _reads(source: ParsedSource, function: Function, store: _Store, loop: Node) -> list[Node]:
    """The reads ``S[e]`` of the staged buffer outside the loop; NotInForm for any other use."""
    assert function.body is not None
    reads = []
    for node in walk(function.body):
        if node.type != "identifier" or source.text_of(node) != store.buffer:
            continue
        if loop.start_byte <= node.start_byte < loop.end_byte:
            continue
        parent = node.parent
        if parent is not None and parent.type in ("init_declarator", "pointer_declarator"):
            continue  # its declaration
        line = source.line_of(node.start_byte)
        if parent is None or parent.type != "subscript_expression" or parent.children[0] != node:
            raise _refuse(
                f"{store.buffer} used as `{source.snippet(parent or node, 50)}` (line {line})"
            )
        if node.start_byte < loop.start_byte:
            raise _refuse(f"{store.buffer} read before it is staged (line {line})")
        if is_written(parent):
            raise _refuse(f"{store.buffer} written again at line {line}")
        reads.append(parent)
    if not reads:
        raise _refuse(f"{store.buffer} staged but never read")
    return reads


def is_written(subscript: Node) -> bool:
    """Whether a subscript expression (or a member or element of it) is assigned, updated or
    has its address taken."""
    node = subscript
    while node.parent is not None and (
        node.parent.type == "parenthesized_expression"
        or (
            node.parent.type in ("field_expression", "subscript_expression")
            and node.parent.children[0] == node
        )
    ):
        node = node.parent
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "assignment_expression":
        return parent.child_by_field_name("left") == node
    if parent.type == "update_expression":
        return True
    return parent.type == "pointer_expression" and parent.children[0].type == "&"


def _slot_value(
    source: ParsedSource, indices: FunctionIndices, store: _Store, read: Node, var: str
) -> str:
    """The stored value of the iteration that filled the slot ``read`` reads."""
    index_list = read.child_by_field_name("indices")
    assert index_list is not None and index_list.named_children
    slot = strip_parens(index_list.named_children[0])
    if store.divisor is None:
        iteration = (
            source.text_of(slot) if precedence(slot) == PRIMARY else f"({source.text_of(slot)})"
        )
    else:
        divisor = source.text_of(store.divisor)
        operands = binary_operands(slot, "/")
        iteration = f"({source.text_of(slot)}) * {divisor}"
        if operands is not None and source.text_of(operands[1]) == divisor:
            whole = strip_parens(operands[0])
            if multiple_of(indices, indices.form(whole), indices.form(store.divisor)):
                text = source.text_of(whole)
                iteration = text if precedence(whole) == PRIMARY else f"({text})"
    pieces = []
    cursor = store.value.start_byte
    for node in walk(store.value):
        if node.type == "identifier" and source.text_of(node) == var:
            pieces.append(source.text_of((cursor, node.start_byte)))
            pieces.append(iteration)
            cursor = node.end_byte
    pieces.append(source.text_of((cursor, store.value.end_byte)))
    return wrap_at(read, "".join(pieces), precedence(store.value))


def _barrier_after(source: ParsedSource, function: Function, loop: Node) -> Node | None:
    """The ``__syncthreads();`` statement right after the loop, if it is one."""
    following = statement_after(loop)
    if following is None or following.type != "expression_statement":
        return None
    barriers = analysis(source).shared(function).barriers
    inside = following.named_children[0] if following.named_children else None
    return following if inside is not None and inside in barriers else None


def once_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """The edits that remove the tile staged once by ``loop``; NotInForm when it is not in
    the form this rule reads (see the module docstring)."""
    indices = analysis(source).indices(function)
    variable = indices.loop_of(loop) if loop.type == "for_statement" else None
    if variable is None or variable.step is None or function.body is None:
        raise _refuse(
            f"a tile staged once by `{source.snippet(loop, 60)}`, not by a counted for loop"
        )
    body = loop.child_by_field_name("body")
    stores = [loop_store(source, s, variable.name) for s in statements(body)]
    if variable.name in assigned_names(source, [s.value for s in stores]):
        raise _refuse(f"a staging loop that writes its index {variable.name}")
    edits: list[Edit] = []
    removed: list[Node] = [loop]
    buffers = {s.buffer for s in stores}
    for store in stores:
        if store.divisor is not None:
            divisor = indices.form(store.divisor)
            if not (
                multiple_of(indices, variable.init, divisor)
                and multiple_of(indices, variable.step, divisor)
            ):
                raise _refuse(
                    f"a staging loop whose index {variable.name} (from {variable.init}, step "
                    f"{variable.step}) is not always a multiple of {source.text_of(store.divisor)}"
                )
        _check_value(source, function, indices, store, variable.name)
        if sum(1 for s in stores if s.buffer == store.buffer) > 1:
            raise _refuse(f"a staging loop storing {store.buffer} twice")
        for read in _reads(source, function, store, loop):
            edits.append(
                Edit.replace(read, _slot_value(source, indices, store, read, variable.name))
            )
            removed.append(read)
    edits.append(source.deletion(loop, whole_line=True))
    deletions = orphan_deletions(source, function, removed)
    deleted = [(e.start_byte, e.end_byte) for e in deletions]
    edits += deletions
    if no_shared_left(source, function, buffers, removed, deleted):
        barrier = _barrier_after(source, function, loop)
        if barrier is not None:
            edits.append(source.deletion(barrier, whole_line=True))
        edits += idle_requests(source, function)
    return edits


def orphan_deletions(source: ParsedSource, function: Function, removed: list[Node]) -> list[Edit]:
    """Deletions of the declarations left unused, repeated until none is (a pointer cast
    from the dynamic buffer goes, then the buffer it was cast from)."""
    assert function.body is not None
    gone = list(removed)
    deletions: dict[int, Edit] = {}
    while True:
        found = [e for e in orphaned_declarations(source, gone) if e.start_byte not in deletions]
        if not found:
            return sorted(deletions.values())
        for edit in found:
            deletions[edit.start_byte] = edit
            gone += [
                s
                for s in statements(function.body)
                if edit.start_byte <= s.start_byte < edit.end_byte
            ]


def no_shared_left(
    source: ParsedSource,
    function: Function,
    buffers: set[str],
    removed: list[Node],
    deleted: list[tuple[int, int]],
) -> bool:
    """Whether no shared memory is declared or accessed once the edits are made."""
    body = function.body
    assert body is not None
    gone = [(n.start_byte, n.end_byte) for n in removed] + deleted

    def kept(node: Node) -> bool:
        return not any(start <= node.start_byte < end for start, end in gone)

    for declaration in source.shared_declarations:
        inside = function.node.start_byte <= declaration.node.start_byte < function.node.end_byte
        if inside and kept(declaration.node):
            return False
    return all(
        not kept(access.node) for access in analysis(source).shared(function).accesses
    ) and not buffers & {
        source.text_of(n) for n in walk(body) if n.type == "identifier" and kept(n)
    }
