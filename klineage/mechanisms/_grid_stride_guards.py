"""Writing the grid-stride loop over an index guarded along any grid dimension.

The removal of :mod:`klineage.mechanisms._grid_stride_index` leaves one index per thread under
its bound, in either of two spellings::

    int row = blockIdx.x * blockDim.z + threadIdx.z;
    if (row < rows) { ... }

    if (int r = blockIdx.y * rows_per_turn + first; r < rows) { ... }

and every launch a grid that covers the bound along that dimension. The forward rule reads the
index by what it is (the index analysis): ``blockIdx.d * S + L``, the block's share ``S`` the
same in every thread of the grid, the thread's offset ``L`` read from its thread index, or
none where the whole block shares the index (``int z = blockIdx.z; if (z < batch)``: one item
per block, left by a loop over a batch by ``gridDim.z``). It writes the loop back, stepping
by the block's term with ``gridDim.d`` for ``blockIdx.d``::

    for (int row = blockIdx.x * blockDim.z + threadIdx.z; row < rows; row += gridDim.x * blockDim.z)

With the carrier ``max_blocks`` every launch's grid along ``d`` is capped at that many blocks
(where the kernel picks its slot of a partial buffer by ``blockIdx.d``, the host's count of
slots is, so the buffer and the pass adding it follow), the removal's grid written with
``min``; without it the grid stays (the loop runs once). Block barriers in the guarded code
stay, as the removal keeps them: the threads of a block part only in the loop's last turn,
where the guard parted them. A ``return`` of the guarded code becomes ``continue`` when the
guard ends a kernel without barriers or warp collectives (the removal's ``continue`` ->
``return``, undone).

Refused, with the form, when the index is written or read after the guard, the bound is
written, the guarded code leaves an enclosing loop (its ``break`` would leave the new one) or
returns with code after it or beside a collective (a thread going on to its next item would
meet the others at another barrier), the kernel reads ``gridDim.d`` or reads ``blockIdx.d``
other than as a store's slot, the block's term is not written as one product, or (with a cap)
a launch cannot take the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, builtin_of, descendants, strip_casts, walk
from klineage.mechanisms._grid_stride_index import (
    Stride,
    axis_grid_edits,
    axis_slot_reads,
    stride_of,
)
from klineage.mechanisms._local_util import (
    Refused,
    assigned_names,
    binary,
    collective_in,
    identifiers,
    index_bound,
    index_declaration,
    inside_nested_loop,
    loop_bound_jumps,
    normalize_type,
    splice,
    statements,
)

__all__ = ["Guarded", "guarded_edits", "guarded_indexes", "guarded_refusal", "loop_header"]

_NEEDED = (
    "`T i = blockIdx.d * S + L; if (i < n) ...` (or `if (T i = ...; i < n)`), S the same in "
    "every thread and L a thread's offset, the index written nowhere else and read nowhere "
    "after, in a kernel that reads gridDim.d nowhere and blockIdx.d only as a store's slot"
)


@dataclass(frozen=True)
class Guarded:
    """An index along ``stride.axis`` and the ``if`` that guards it by its bound."""

    guard: Node
    decl: Node | None
    """The index's declaration right before the guard; None when the ``if`` declares it."""
    function: Function
    name: str
    specifiers: str
    value: Node
    bound: Node
    stride: Stride
    per_block: bool = False
    """Whether every thread of a block has the same index (its offset reads no thread index)."""
    earlier: Node | None = None
    """The index's declaration where it stays, earlier in the kernel than the statement right
    before the guard (the loop is then ``for (; i < n; i += step)``)."""

    @property
    def start_byte(self) -> int:
        return (self.decl or self.guard).start_byte

    @property
    def clause(self) -> Node:
        clause = self.guard.child_by_field_name("condition")
        assert clause is not None
        return clause

    @property
    def form(self) -> str:
        return (
            f"an index {self.name} = {self.value_form} guarded by `{self.name} < ...` (one "
            f"item per {'block' if self.per_block else 'thread'} along gridDim.{self.stride.axis})"
        )

    @property
    def value_form(self) -> IndexForm:
        return self.stride.share * IndexForm.atom(f"blockIdx.{self.stride.axis}") + (
            self.stride.offset
        )


def guarded_indexes(source: ParsedSource) -> list[Guarded]:
    """Every guarded index of a kernel along one grid dimension."""
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        for guard in descendants(function.body, "if_statement"):
            guarded = _guarded(source, function, guard)
            if guarded is not None:
                found.append(guarded)
    return found


def _guarded(source: ParsedSource, function: Function, guard: Node) -> Guarded | None:
    clause = guard.child_by_field_name("condition")
    if clause is None or guard.child_by_field_name("alternative") is not None:
        return None
    values = [c for c in clause.named_children if c.type not in ("comment", "init_statement")]
    init = clause.child_by_field_name("initializer")
    decl = None if init is not None else guard.prev_named_sibling
    declared = init.named_children[0] if init is not None and init.named_children else decl
    parsed = index_declaration(source, declared) if declared is not None else None
    earlier = None
    if init is None and len(values) == 1 and not _declares_index(source, parsed, values[0]):
        earlier = _earlier_declaration(source, function, guard, values[0])
        decl, parsed = None, index_declaration(source, earlier) if earlier is not None else None
    if parsed is None or len(values) != 1:
        return None
    name, specifiers, value = parsed
    bound = index_bound(source, values[0], name, exits=False)
    stride = _stride(source, function, value)
    if bound is None or stride is None:
        return None
    per_block = not analysis(source).indices(function).thread_atoms(stride.offset)
    return Guarded(
        guard, decl, function, name, specifiers, value, bound, stride, per_block, earlier
    )


def _declares_index(
    source: ParsedSource, parsed: tuple[str, str, Node] | None, condition: Node
) -> bool:
    """Whether ``parsed`` declares the name the guard's condition bounds."""
    return parsed is not None and index_bound(source, condition, parsed[0], exits=False) is not None


def _earlier_declaration(
    source: ParsedSource, function: Function, guard: Node, condition: Node
) -> Node | None:
    """The top-level declaration, before a top-level ``guard`` but not right before it, of
    the index its condition bounds (``size_t tid = ...; curand_init(seed, tid, 0, &s); if
    (tid < n)``, what the removal of ``for (; tid < n; tid += stride)`` leaves). An index
    read after the guard is no such loop's (there it would hold its last value): a bound
    check, not a candidate."""
    body = function.body
    if body is None or guard.parent != body:
        return None
    for statement in statements(body):
        if statement.start_byte >= guard.start_byte:
            return None
        parsed = index_declaration(source, statement)
        if parsed is not None and index_bound(source, condition, parsed[0], exits=False):
            read_after = any(
                source.text_of(n) == parsed[0]
                for n in identifiers(source, body)
                if n.start_byte >= guard.end_byte
            )
            return None if read_after else statement
    return None


def _stride(source: ParsedSource, function: Function, value: Node) -> Stride | None:
    """The index's grid dimension, block share and thread offset: one item per thread, or
    one per block when the offset reads no thread index (``int z = blockIdx.z; if (z <
    batch)``, what the removal of a loop over a batch by ``gridDim.z`` leaves; the whole block
    then takes every turn together, so its barriers stay safe)."""
    indices = analysis(source).indices(function)
    form = indices.form(value)
    for axis in "xyz":
        share = form.coefficient(f"blockIdx.{axis}")
        if not share.terms:
            continue
        stride = stride_of(form, share * IndexForm.atom(f"gridDim.{axis}"))
        if stride is not None:
            return stride
    return None


def _block_term(source: ParsedSource, found: Guarded) -> tuple[Node, Node] | None:
    """The term of the index's value that is ``blockIdx.d * S`` (casts kept) and its read of
    ``blockIdx.d``."""
    indices = analysis(source).indices(found.function)
    axis = found.stride.axis
    term_form = found.stride.share * IndexForm.atom(f"blockIdx.{axis}")
    for term in _terms(found.value) + _held_terms(source, found):
        reads = [
            n
            for n in walk(term)
            if n.type == "field_expression" and builtin_of(source, n) == f"blockIdx.{axis}"
        ]
        if len(reads) == 1 and indices.form(term) == term_form:
            return term, reads[0]
    return None


def _held_terms(source: ParsedSource, found: Guarded) -> list[Node]:
    """The terms of the value a local index holds (see :func:`_held_declaration`)."""
    held = _held_declaration(source, found)
    parsed = index_declaration(source, held) if held is not None else None
    return _terms(parsed[2]) if parsed is not None else []


def _held_declaration(source: ParsedSource, found: Guarded) -> Node | None:
    """The declaration of the local an index is (``int i = gid;`` after ``size_t gid =
    blockDim.x * blockIdx.x + threadIdx.x;`` at the kernel's top level), when nothing writes
    it or the names it reads and nothing but the index reads it: part of the index, so the
    loop's step may read its names where the guard stands and its read of ``blockIdx.d`` is
    the index's own. None otherwise."""
    value = strip_casts(found.value)
    body = found.function.body
    if value.type != "identifier" or body is None:
        return None
    name = source.text_of(value)
    written = assigned_names(source, body)
    if name in written:
        return None
    for statement in statements(body):
        if statement.start_byte >= found.start_byte:
            break
        parsed = index_declaration(source, statement)
        if parsed is None or parsed[0] != name:
            continue
        names = {source.text_of(n) for n in identifiers(source, parsed[2])}
        uses = [n for n in identifiers(source, body) if source.text_of(n) == name]
        if names & written or not all(within(n, statement) or within(n, value) for n in uses):
            return None
        return statement
    return None


def _terms(node: Node) -> list[Node]:
    sides = binary(strip_casts(node), "+")
    return [node] if sides is None else _terms(sides[0]) + _terms(sides[1])


def guarded_refusal(source: ParsedSource, found: Guarded) -> str | None:
    """Why the loop cannot be written over ``found``, or None."""
    try:
        _check(source, found)
    except NotInForm as why:
        return str(why)
    return None


def _check(source: ParsedSource, found: Guarded) -> None:
    body = found.function.body
    assert body is not None
    axis = found.stride.axis
    if _block_term(source, found) is None:
        raise _refuse(found, f"whose block offset is not written as one term `blockIdx.{axis} * S`")
    if found.name in assigned_names(source, body):
        raise _refuse(found, f"whose index {found.name} is written")
    written = {source.text_of(n) for n in identifiers(source, found.bound)}
    written &= assigned_names(source, body)
    if written:
        raise _refuse(found, f"whose bound reads {', '.join(sorted(written))}, written")
    after = [
        n
        for n in identifiers(source, body)
        if source.text_of(n) == found.name and n.start_byte >= found.guard.end_byte
    ]
    if found.decl is not None and after:  # an earlier declaration is never read after
        raise _refuse(found, f"whose index {found.name} is read after the guard")
    jumps = loop_bound_jumps(found.guard, ("break_statement", "continue_statement"))
    if jumps:
        raise _refuse(
            found, f"whose guarded code leaves a loop around it (`{source.snippet(jumps[0])}`)"
        )
    returns = loop_bound_jumps(found.guard, ("return_statement",))
    barrier = collective_in(source, [body])
    if returns and barrier is not None:  # its continue would meet the block at another barrier
        raise _refuse(found, f"whose guarded code returns in a kernel holding {barrier}")
    if returns and (
        not _ends_kernel(found) or any(inside_nested_loop(r, found.guard) for r in returns)
    ):
        raise _refuse(found, "whose guarded code returns (it would end the thread's other items)")
    _slots(source, found)


def _slots(source: ParsedSource, found: Guarded) -> frozenset[str]:
    """The parameters whose slot the kernel picks by ``blockIdx.d`` read outside the index
    (each such read a store's slot)."""
    own = [(found.start_byte, found.clause.end_byte)]
    for part in (_held_declaration(source, found), found.earlier):
        if part is not None:
            own.append((part.start_byte, part.end_byte))
    try:
        return axis_slot_reads(source, found.function, found.stride.axis, own)
    except Refused as why:
        raise _refuse(found, str(why)) from why


def _ends_kernel(found: Guarded) -> bool:
    body = found.function.body
    return body is not None and found.guard.parent == body and statements(body)[-1] == found.guard


def _refuse(found: Guarded, what: str) -> NotInForm:
    return NotInForm(f"{found.form} {what}", _NEEDED)


def loop_header(var: str, index_type: str, first: str, bound: str, step: str, indent: str) -> str:
    """``for (T i = first; i < n; i += step)``, wrapped after the condition when the line
    would pass 100 columns."""
    start = f"for ({index_type} {var} = {first}; {var} < {bound};"
    update = f"{var} += {step})"
    if len(indent) + len(start) + 1 + len(update) <= 100:
        return f"{start} {update}"
    return f"{start}\n{indent}     {update}"


def guarded_edits(source: ParsedSource, found: Guarded, cap: int | None) -> list[Edit]:
    """The loop over ``found``'s index, and with ``cap`` every launch's grid along its
    dimension capped; NotInForm when the site is not in the form above."""
    _check(source, found)
    term = _block_term(source, found)
    assert term is not None
    step = splice(
        source, term[0].start_byte, term[0].end_byte, [(term[1], f"gridDim.{found.stride.axis}")]
    )
    step = " ".join(step.split())
    if found.earlier is not None:  # declared where it stays: the loop has no initializer
        header = f"for (; {found.name} < {source.text_of(found.bound)}; {found.name} += {step})"
    else:
        header = loop_header(
            found.name,
            normalize_type(found.specifiers),
            source.text_of(found.value),
            source.text_of(found.bound),
            step,
            source.indent_of(found.start_byte),
        )
    edits = [Edit(found.start_byte, found.clause.end_byte, header)]
    edits += [
        Edit.replace(r, "continue;") for r in loop_bound_jumps(found.guard, ("return_statement",))
    ]
    if cap is None:
        return edits
    slots = _slots(source, found)
    try:
        grids = axis_grid_edits(source, found.function, found.stride, found.bound, slots, cap)
    except NotInForm as why:
        raise _refuse(found, f"whose launch cannot take a capped grid ({why.form})") from why
    return edits + grids
