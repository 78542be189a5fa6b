"""Removing a grid-stride ``for`` loop read by the index analysis, along any grid dimension.

Public kernels stride over rows (or tokens) with whatever block dimension holds them::

    for (int row = blockIdx.x * blockDim.z + threadIdx.z; row < N; row += gridDim.x * blockDim.z)

that is, from ``blockIdx.d * S + L`` by ``gridDim.d * S``: the block's share ``S`` of a turn
is uniform over the grid (a block dimension, ``4 * blockDim.z``, a template parameter), the
thread's offset ``L`` reads no ``blockIdx.d``. A thread visits ``L + j * S`` for every ``j``
its block's turns reach, and the blocks along ``d`` together reach every ``j`` once; with one
turn each, a grid of ``(N + S - 1) / S`` blocks along ``d`` reaches every ``j`` that stays
below ``N`` once too, so each thread handles the same indices. Removing the loop gives each
thread one index, ``if (row < N)``, and every launch that grid, with ``S`` written from the
launch's block (``dim3(32, y, z)`` -> ``z``) and template arguments. Barriers inside the loop
stay where they were: a thread past ``N`` skipped them in the loop's last turn as it skips them
now.

A kernel that also reads ``blockIdx.d`` to pick its own slot of a partial-results buffer
(``partial[blockIdx.y * cols + col] = total``, added up by a second kernel) keeps its result
only if the host's count of those slots follows the new grid. The rule then writes the new
grid into the declaration of the host variable the launch's grid reads along ``d``, so the
buffer's size and the second pass, which read that variable, follow it; refused where the grid
along ``d`` is not such a variable, or the new value would read a name declared after it.

Sample code often names the first index and the stride once, before the loop::

    int step = gridDim.x * blockDim.x;
    int first = blockDim.x * blockIdx.x + threadIdx.x;
    for (int i = first; i < n; i += step) { ... }

or declares the index before a loop with no initializer, ``for (; idx < n; idx += step)``. A
local whose every read is in the loop's header (directly or through another such local) and
that nothing writes is part of the header: its reads of ``blockIdx.d`` and ``gridDim.d`` are the
loop's own, and a local the removal leaves unread (the stride) is deleted with it. An index
declared before the loop becomes ``if (idx < n)``, when nothing but the loop's update writes it
and nothing after the loop reads it (there it would hold its last value past ``n``).

Refused (with the form) when the index is written in the body, the body returns or leaves
the loop with code after it, the kernel reads ``gridDim.d`` elsewhere or ``blockIdx.d`` other
than as a store's slot, the bound is not expressible at a launch, or a launch's grid or block
is not written out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.analysis.indices import ATOMICS
from klineage.cuda.cexpr import PRIMARY, fold_int, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource, call_name
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    call_arguments,
    callee_name,
    declaration_names,
    declared_names,
    dim3_extents,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import (
    Refused,
    builtin_of,
    cap_of,
    index_bound,
    index_declaration,
    launches,
    local_types,
    loop_bound_jumps,
    size_at_launch,
    statements,
)
from klineage.mechanisms._multipass import declaration_of, partial_destination, reassignments
from klineage.mechanisms._reductions_util import line_deletion

__all__ = [
    "Stride",
    "axis_grid_cap",
    "axis_grid_edits",
    "axis_slot_reads",
    "index_loop_removal",
    "stride_of",
]

_NEEDED = (
    "a `for` loop from `blockIdx.d * blockDim.e + threadIdx.e` by `gridDim.d * blockDim.e` "
    "over `i < n`, whose index only the header writes, in a kernel that reads blockIdx.d and "
    "gridDim.d nowhere else, launched with its grid and block written out"
)
_AXES = "xyz"
_VARYING = ("threadIdx", "blockIdx", "lane", "warp")
"""Atoms that differ between the threads of a grid (a block share may read none of them)."""


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class Stride:
    """A grid-stride loop read by its index: from ``blockIdx.axis * share + offset`` by
    ``gridDim.axis * share``."""

    axis: str
    share: IndexForm
    offset: IndexForm


def stride_of(init: IndexForm, step: IndexForm) -> Stride | None:
    """The loop's stride, when ``step = gridDim.d * S`` and ``init = blockIdx.d * S + L`` with
    ``S`` the same in every thread of the grid and ``L`` reading neither ``blockIdx.d`` nor
    ``gridDim.d``, its terms added (a thread's offset in its block's turn)."""
    for d in _AXES:
        share = step.coefficient(f"gridDim.{d}")
        if not share.terms or step != share * IndexForm.atom(f"gridDim.{d}"):
            continue
        if any(a.split(".")[0] in _VARYING for a in share.base_atoms()):
            return None
        offset = init - IndexForm.atom(f"blockIdx.{d}") * share
        if offset.depends_on(f"blockIdx.{d}") or offset.depends_on(f"gridDim.{d}"):
            return None
        if any(coefficient < 0 for _, coefficient in offset.terms):
            return None  # a turn reaching below the block's share: its grid would not cover n
        return Stride(d, share, offset)
    return None


def _share_at_launch(
    source: ParsedSource, kernel: Function, launch: Launch, share: IndexForm
) -> str:
    """The block's share ``S`` of a turn written at a launch: block dimensions from the
    launch's block, template parameters by their arguments, file constants by name."""
    if len(share.terms) != 1:
        raise _refuse(f"a grid-stride loop whose block share {share} has several terms")
    ((monomial, coefficient),) = share.terms
    factors = [] if coefficient == 1 else [str(coefficient)]
    for atom in monomial:
        if atom.startswith("blockDim."):
            factors.append(_block_extent(source, launch, atom[-1]))
        elif atom in kernel.template_params:
            index = kernel.template_params.index(atom)
            if index >= len(launch.template_args):
                raise _refuse(f"a launch giving no template argument for {atom}")
            factors.append(_operand(source, launch.template_args[index]))
        elif atom in source.integer_constants:
            factors.append(atom)
        else:
            raise _refuse(f"a grid-stride loop whose block share {share} reads {atom}")
    return " * ".join(factors) or "1"


def _block_extent(source: ParsedSource, launch: Launch, axis: str) -> str:
    """The launch's block size along ``axis``, as text."""
    block = launch.block
    if block is None:
        raise _refuse("a grid-stride loop launched without a block")
    stripped = strip_parens(block)
    index = _AXES.index(axis)
    if stripped.type == "call_expression" and source.text_of(
        stripped.child_by_field_name("function") or stripped
    ) in ("dim3", "::dim3"):
        args = call_arguments(stripped)
        if index < len(args):
            return _operand(source, args[index])
        return "1"
    function = source.enclosing_function(launch.node)
    declared = local_types(source, function) if function is not None else {}
    if stripped.type == "identifier" and "dim3" in declared.get(source.text_of(stripped), ""):
        return f"{source.text_of(stripped)}.{axis}"
    if axis == "x":
        return _operand(source, block)
    raise _refuse(
        f"a grid-stride loop launched with a block `{source.snippet(block, 40)}` of no {axis} size"
    )


def _operand(source: ParsedSource, node: Node) -> str:
    text = " ".join(source.text_of(node).split())
    return text if precedence(node) >= PRIMARY else f"({text})"


def _grid_edit(source: ParsedSource, launch: Launch, axis: str, blocks: str) -> Edit:
    """The launch's grid with ``blocks`` along ``axis``."""
    grid = launch.grid
    if grid is None:
        raise _refuse("a grid-stride loop launched without a grid")
    stripped = strip_parens(grid)
    if stripped.type == "call_expression" and source.text_of(
        stripped.child_by_field_name("function") or stripped
    ) in ("dim3", "::dim3"):
        args = call_arguments(stripped)
        index = _AXES.index(axis)
        if index < len(args):
            return Edit.replace(args[index], blocks)
        raise _refuse(
            f"a grid-stride loop launched with a grid `{source.snippet(grid, 40)}` of no {axis} "
            "size"
        )
    function = source.enclosing_function(launch.node)
    declared = local_types(source, function) if function is not None else {}
    if stripped.type == "identifier" and "dim3" in declared.get(source.text_of(stripped), ""):
        assert function is not None
        return _dim3_grid_edit(source, function, launch, stripped, axis, blocks)
    if axis != "x":
        raise _refuse(
            f"a grid-stride loop launched with a grid `{source.snippet(grid, 40)}` of no {axis} "
            "size"
        )
    return Edit.replace(grid, blocks)


def _dim3_grid_edit(
    source: ParsedSource, host: Function, launch: Launch, grid: Node, axis: str, blocks: str
) -> Edit:
    """The edit that writes ``blocks`` along ``axis`` into the declaration of the ``dim3``
    variable a launch takes as its grid (``dim3 grid(a, b, c);``, ``dim3 grid = dim3(a, b);``
    or ``dim3 grid{a, b}``), when nothing writes the variable after it and only launches of
    the same kernel read it (another kernel's grid must not change with this one's)."""
    name = source.text_of(grid)
    try:
        declaration, value = _dim3_declaration(source, host, name)
    except NotInForm as why:
        raise _refuse(
            f"a grid-stride loop launched with the dim3 {name}, declared without its sizes"
        ) from why
    if reassignments(source, host, name) or _fields_written(source, host, name):
        raise _refuse(
            f"a grid-stride loop launched with the dim3 {name}, written after its declaration"
        )
    for use in walk(host.body) if host.body is not None else []:
        if use.type != "identifier" or source.text_of(use) != name:
            continue
        if declaration.start_byte <= use.start_byte < declaration.end_byte:
            continue
        reader = next(
            (o for o in source.launches if o.node.start_byte <= use.start_byte < o.node.end_byte),
            None,
        )
        if reader is None:
            raise _refuse(
                f"a grid-stride loop launched with the dim3 {name}, which "
                f"`{source.snippet(use.parent or use, 40)}` reads too"
            )
        if (
            reader.kernel != launch.kernel
            or reader.grid is None
            or strip_parens(reader.grid) != use
        ):
            raise _refuse(
                f"a grid-stride loop launched with the dim3 {name}, which the launch of "
                f"{reader.kernel} reads too"
            )
    args = dim3_extents(value)
    index = _AXES.index(axis)
    if index >= len(args):
        raise _refuse(f"a grid-stride loop launched with the dim3 {name} of no {axis} size")
    _read_before_declared(
        source, host, declaration, blocks, f"a grid-stride loop launched with the dim3 {name}"
    )
    return Edit.replace(args[index], blocks)


def _dim3_declaration(source: ParsedSource, host: Function, name: str) -> tuple[Node, Node]:
    """The declaration of the dim3 ``name`` in ``host`` and what holds its sizes. ``dim3
    grid(blocks);`` with one name between the parentheses parses as a function declarator
    (C++'s vexing parse); in a function body it declares the variable, and its parameter
    list holds the sizes, each a bare name."""
    assert host.body is not None
    for decl in source.iter_nodes("declaration", within=host.body):
        for declarator in decl.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            parameters = declarator.child_by_field_name("parameters")
            if (
                declarator.type == "function_declarator"
                and inner is not None
                and source.text_of(inner) == name
                and parameters is not None
                and all(
                    p.type == "parameter_declaration"
                    and p.child_by_field_name("declarator") is None
                    and (p.child_by_field_name("type") or p).type == "type_identifier"
                    for p in parameters.named_children
                )
            ):
                return decl, parameters
    return declaration_of(source, host, name)


def _fields_written(source: ParsedSource, host: Function, name: str) -> list[Node]:
    """Assignments to a field of ``name`` (``grid.x = ...``) in ``host``."""
    assert host.body is not None
    found = []
    for node in walk(host.body):
        left = node.child_by_field_name("left") if node.type == "assignment_expression" else None
        target = strip_parens(left) if left is not None else None
        if target is not None and target.type == "field_expression":
            base = strip_parens(target.child_by_field_name("argument") or target)
            if base.type == "identifier" and source.text_of(base) == name:
                found.append(node)
    return found


def axis_slot_reads(
    source: ParsedSource, function: Function, axis: str, own: list[tuple[int, int]]
) -> frozenset[str]:
    """The parameters the kernel writes a slot of by ``blockIdx.axis`` read outside the byte
    ranges ``own`` (the index's own code), each such read picking the slot a store writes
    (empty: no such read); Refused for any other read of ``blockIdx.axis`` or
    ``gridDim.axis`` there (the new grid would change what it reads)."""
    assert function.body is not None
    slots: set[str] = set()
    for node in walk(function.body):
        builtin = builtin_of(source, node) if node.type == "field_expression" else None
        if builtin not in (f"blockIdx.{axis}", f"gridDim.{axis}"):
            continue
        if any(start <= node.start_byte < end for start, end in own):
            continue
        slot = None if builtin.startswith("gridDim") else _slot_of(source, function, node)
        if slot is None:
            raise Refused(
                f"in a kernel that also reads {builtin} in "
                f"`{source.snippet(node.parent or node, 40)}`"
            )
        slots.add(slot)
    return frozenset(slots)


def _header_locals(
    source: ParsedSource, function: Function, loop: Node, index: Node | None
) -> dict[str, Node]:
    """The declarations, before ``loop`` at the kernel's top level, of locals (``int step =
    gridDim.x * blockDim.x;``) read only in the loop's header or in the declaration ``index``
    of its index, directly or through one another, and written nowhere: by name."""
    assert function.body is not None
    body = loop.child_by_field_name("body")
    end = body.start_byte if body is not None else loop.end_byte
    declared: dict[str, Node] = {}
    for statement in statements(function.body):
        if statement.start_byte >= loop.start_byte:
            break
        parsed = index_declaration(source, statement)
        if parsed is not None and statement != index:
            declared[parsed[0]] = statement
    written = assigned_names(source, function.body)
    reads: dict[str, list[int]] = {name: [] for name in declared}
    for node in walk(function.body):
        name = source.text_of(node) if node.type == "identifier" else ""
        if (
            name in reads
            and not declared[name].start_byte <= node.start_byte < declared[name].end_byte
        ):
            reads[name].append(node.start_byte)
    found = {name: decl for name, decl in declared.items() if name not in written}
    allowed = [(loop.start_byte, end)] + ([(index.start_byte, index.end_byte)] if index else [])
    while True:
        spans = allowed + [(d.start_byte, d.end_byte) for d in found.values()]
        kept = {
            name: decl
            for name, decl in found.items()
            if all(any(a <= at < b for a, b in spans) for at in reads[name])
        }
        if kept.keys() == found.keys():
            return kept
        found = kept


def _unread_after(source: ParsedSource, header: dict[str, Node], text: str) -> list[Edit]:
    """Deletions of the header locals that neither ``text`` (the loop's new header) nor a
    kept local reads any more."""
    live = {name for name in _identifiers(text) if name in header}
    grown = True
    while grown:
        reached = {
            name
            for kept in live
            for name in _identifiers(source.text_of(header[kept]))
            if name in header
        }
        grown = not reached <= live
        live |= reached
    return [line_deletion(source, decl) for name, decl in header.items() if name not in live]


def _declared_before(
    source: ParsedSource, function: Function, loop: Node, name: str
) -> tuple[Node, str, Node]:
    """``T name = value;`` in the block of ``loop``, before it, for a loop with no
    initializer: (declaration, specifiers, value), when only the loop's update writes the
    index and nothing after the loop reads it."""
    assert function.body is not None
    block = loop.parent
    found = None
    for statement in statements(block):
        if statement.start_byte >= loop.start_byte:
            break
        parsed = index_declaration(source, statement)
        if parsed is not None and parsed[0] == name:
            found = (statement, parsed[1], parsed[2])
    if found is None:
        raise _refuse(f"a grid-stride loop over {name}, declared other than `T {name} = value;`")
    if reassignments(source, function, name):
        raise _refuse(f"a grid-stride loop over {name}, which statements other than its own write")
    after = [
        n
        for n in walk(function.body)
        if n.type == "identifier" and source.text_of(n) == name and n.start_byte >= loop.end_byte
    ]
    if after:
        raise _refuse(f"a grid-stride loop over {name}, which code after the loop reads")
    return found


def _slot_of(source: ParsedSource, function: Function, node: Node) -> str | None:
    """The parameter ``P`` when ``node`` is read only to pick the element a store writes: it
    sits in the index of ``P[...] = ...`` (or ``+=``), ``P`` a parameter of the kernel; else
    None."""
    current = node
    while current.parent is not None and current.parent.type != "subscript_expression":
        if current.parent.type in ("expression_statement", "declaration", "compound_statement"):
            return None
        current = current.parent
    subscript = current.parent
    if subscript is None or subscript.child_by_field_name("indices") != current:
        return None
    base = strip_parens(subscript.child_by_field_name("argument") or subscript)
    store = subscript.parent
    name = source.text_of(base)
    stored = (
        base.type == "identifier"
        and function.param(name) is not None
        and store is not None
        and store.type == "assignment_expression"
        and store.child_by_field_name("left") == subscript
    )
    return name if stored else None


def _slot_count_edit(
    source: ParsedSource,
    function: Function,
    launch: Launch,
    axis: str,
    blocks: str,
    slots: frozenset[str],
) -> Edit:
    """The edit that writes ``blocks`` into the declaration of the host variable the launch's
    grid reads along ``axis``, so whatever the host sizes by it (the partial buffer, the second
    pass's count) follows the new grid; refused where a buffer the launch passes for the
    kernel's slot parameters ``slots`` is not allocated there by that variable (a buffer made
    once at a fixed size would be written past its end)."""
    grid = strip_parens(launch.grid) if launch.grid is not None else None
    host = source.enclosing_function(launch.node)
    if grid is None or host is None or host.body is None:
        raise _refuse("a grid-stride loop writing block slots, launched without a grid")
    args = call_arguments(grid) if grid.type == "call_expression" else [grid]
    index = _AXES.index(axis)
    count = strip_parens(args[index]) if index < len(args) else None
    name = source.text_of(count) if count is not None else ""
    if (
        count is None
        or count.type != "identifier"
        or "dim3" in local_types(source, host).get(name, "dim3")
    ):
        raise _refuse(
            f"a kernel writing one slot per block along {axis} (blockIdx.{axis}) launched with "
            f"the grid `{source.snippet(grid, 40)}`, whose count along {axis} is not a local the "
            "host sizes its buffers by"
        )
    try:
        declaration, value = declaration_of(source, host, name)
    except NotInForm as why:
        raise _refuse(f"a grid count {name} not declared with a value in {host.name}") from why
    if value.type == "initializer_list" or reassignments(source, host, name):
        raise _refuse(f"a grid count {name} written elsewhere than in `= value` at its declaration")
    _read_before_declared(source, host, declaration, blocks, f"a grid count {name}")
    _slot_buffers_follow(source, function, launch, host, slots, name)
    return Edit(value.start_byte, value.end_byte, blocks)


def _slot_buffers_follow(
    source: ParsedSource,
    function: Function,
    launch: Launch,
    host: Function,
    slots: frozenset[str],
    count: str,
) -> None:
    """Refuse unless every buffer the launch passes for a slot parameter is allocated in
    ``host`` at a size that reads the grid count ``count``."""
    names = [p.name for p in function.params]
    for slot in sorted(slots):
        index = names.index(slot)
        if index >= len(launch.args):
            raise _refuse(f"a launch passing no argument for the slot buffer {slot}")
        try:
            _, capacity = partial_destination(source, host, launch.args[index], count)
        except NotInForm as why:
            raise _refuse(f"one slot per block along the grid count {count}: {why.form}") from why
        if capacity is not None:
            raise _refuse(
                f"one slot per block along the grid count {count}, written into a fixed array "
                f"of {capacity}"
            )


def _read_before_declared(
    source: ParsedSource, host: Function, declaration: Node, value: str, what: str
) -> None:
    """Refuse writing ``value`` into ``declaration`` where it reads a name declared later."""
    later = _declared_after(source, host, declaration.start_byte)
    used = {n for n in _identifiers(value) if n in later}
    if used:
        raise _refuse(
            f"{what}, declared before {', '.join(sorted(used))}, which its new size reads"
        )


def _declared_after(source: ParsedSource, host: Function, position: int) -> set[str]:
    assert host.body is not None
    return {
        name
        for decl in source.iter_nodes("declaration", within=host.body)
        if decl.start_byte >= position
        for name in declaration_names(source, decl)
    }


def _identifiers(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def index_loop_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """One index per thread instead of the grid-stride loop ``loop``, and launches whose grid
    covers the bound; NotInForm when the loop is not in the form above."""
    variable = analysis(source).indices(function).loop_of(loop)
    init = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    body = loop.child_by_field_name("body")
    header = source.snippet((loop.start_byte, body.start_byte if body else loop.end_byte), 60)
    declared = index_declaration(source, init) if init is not None else None
    before: Node | None = None  # the index's declaration, when the loop has no initializer
    if init is None and variable is not None and function.body is not None:
        before, specifiers, value = _declared_before(source, function, loop, variable.name)
        declared = (variable.name, specifiers, value)
    if variable is None or variable.step is None or declared is None or body is None:
        raise _refuse(f"a grid-stride loop `{header}` without a declared index")
    stride = stride_of(variable.init, variable.step)
    if stride is None:
        raise _refuse(
            f"a grid-stride loop from {variable.init} by {variable.step}, not from blockIdx.d·S "
            "+ an offset by gridDim.d·S with S the same in every block"
        )
    name, specifiers, value = declared
    bound = index_bound(source, condition, name, exits=False) if condition is not None else None
    if bound is None:
        raise _refuse(f"a grid-stride loop `{header}` whose condition is not `{name} < n`")
    if not function.is_kernel or function.body is None:
        raise _refuse("a grid-stride loop in a device helper")
    if name in assigned_names(source, body):
        raise _refuse(f"a grid-stride loop whose body writes its index {name}")
    written = {source.text_of(n) for n in walk(bound) if n.type == "identifier"}
    written &= assigned_names(source, function.body)
    if written:
        raise _refuse(f"a grid-stride loop whose bound uses {', '.join(sorted(written))}, written")
    if loop_bound_jumps(body, ("return_statement",)):
        raise _refuse("a grid-stride loop whose body returns")
    last = loop.parent == function.body and statements(function.body)[-1] == loop
    jumps = loop_bound_jumps(body, ("break_statement", "continue_statement"))
    if jumps and not last:
        raise _refuse(f"a grid-stride loop left by `{source.snippet(jumps[0])}` with code after it")
    locals_ = _header_locals(source, function, loop, before)
    part = list(locals_.values()) + ([before] if before is not None else [])
    own = [(loop.start_byte, body.start_byte)] + [(d.start_byte, d.end_byte) for d in part]
    try:
        slots = axis_slot_reads(source, function, stride.axis, own)
    except Refused as why:
        raise _refuse(f"a grid-stride loop {why}") from why
    carried = _carried_out(source, function, loop, body, name) if not slots else None
    if carried is not None:
        raise _refuse(carried)
    close = [c for c in loop.children if c.type == ")" and c.end_byte <= body.start_byte]
    gid = _first_index_text(source, value, specifiers, locals_)
    if before is not None:  # declared already: only the bound is left to test
        text = f"if ({name} < {source.text_of(bound)})"
    elif last:
        indent = source.indent_of(loop.start_byte)
        text = f"{specifiers} {name} = {gid};\n{indent}if ({name} < {source.text_of(bound)})"
    else:
        text = f"if ({specifiers} {name} = {gid}; {name} < {source.text_of(bound)})"
    loop_edits = [Edit(loop.start_byte, close[-1].end_byte, text)]
    loop_edits += [Edit.replace(jump, "return;") for jump in jumps]
    reading = text + (source.text_of(before) if before is not None else "")
    loop_edits += _unread_after(source, locals_, reading)
    return loop_edits + axis_grid_edits(source, function, stride, bound, slots)


def _carried_out(
    source: ParsedSource, function: Function, loop: Node, body: Node, index: str
) -> str | None:
    """Why one index per thread would change what the kernel stores after ``loop``: its
    turns carry a local out of the loop (a sum over the thread's indices) and a plain store
    after it writes a place no block picks by its index (``result[0] = total``). A grid that
    grows then has more blocks writing that place, each with a part of what one wrote. None
    when nothing is carried out or every store after the loop is an atomic."""
    assert function.body is not None
    after = [n for n in walk(function.body) if n.start_byte >= loop.end_byte]
    read_after = {source.text_of(n) for n in after if n.type == "identifier"}
    carried = assigned_names(source, body) - declared_names(source, body) - {index}
    carried &= read_after
    if not carried:
        return None
    for access in analysis(source).indices(function).accesses():
        if access.node.start_byte < loop.end_byte or access.direction in ("load", "address"):
            continue
        called = callee_name(call_name(source, access.node) or "")
        if access.buffer.space != "global" or ATOMICS.match(called):
            continue
        line = source.line_of(access.node.start_byte)
        return (
            f"a grid-stride loop whose turns carry {', '.join(sorted(carried))} out of it, "
            f"with a plain store after it, `{source.snippet(access.node, 40)}` (line {line}), "
            "that no block picks by its index: one index per thread and a grid that covers "
            "the bound would have every block write it with a part of what one wrote"
        )
    return None


def _first_index_text(
    source: ParsedSource, value: Node, specifiers: str, header: dict[str, Node]
) -> str:
    """The index's first value as the one-element form writes it: a header local that only
    names it (``for (int i = id; ...)``, ``int id = blockIdx.x * blockDim.x + threadIdx.x``)
    is replaced by its own value where both have one type, so the kernel reads
    ``int i = <global index>; if (i < n)``, the form the forward rule takes (the local,
    unread then, goes)."""
    value = strip_parens(value)
    name = source.text_of(value)
    declared = index_declaration(source, header[name]) if name in header else None
    if value.type != "identifier" or declared is None:
        return source.text_of(value)

    def plain(text: str) -> str:
        return " ".join(w for w in text.split() if w not in ("const", "constexpr"))

    if plain(declared[1]) != plain(specifiers):
        return source.text_of(value)  # a conversion on the way: keep it
    return source.text_of(declared[2])


def _launches(source: ParsedSource, function: Function) -> list[Launch]:
    try:
        return launches(source, function)
    except Refused as why:
        raise _refuse(f"a grid-stride loop whose kernel is not launched here ({why})") from why


def axis_grid_edits(
    source: ParsedSource,
    function: Function,
    stride: Stride,
    bound: Node,
    slots: frozenset[str],
    cap: int | None = None,
) -> list[Edit]:
    """Every launch's grid along the stride's axis: ``(n + S - 1) / S`` blocks for the bound
    ``n`` and the block share ``S`` written at the launch, at most ``cap`` when given (as
    :func:`klineage.mechanisms._local_util.cover_grid` caps); with ``slots`` (the kernel
    picks its slot of a partial buffer by ``blockIdx.axis``), written into the host's count
    of those slots."""
    edits: dict[tuple[int, int], Edit] = {}
    for launch in _launches(source, function):
        try:
            size = size_at_launch(source, function, launch, bound)
        except Refused as why:
            raise _refuse(
                f"a grid-stride loop whose bound cannot be written at a launch ({why})"
            ) from why
        share = _share_at_launch(source, function, launch, stride.share)
        divisor = share if " " not in share else f"({share})"
        size = size if precedence(bound) >= PRIMARY and " " not in size else f"({size})"
        blocks = f"(({size} + {share} - 1) / {divisor})"
        if cap is None:
            blocks = f"(unsigned){blocks}"
        else:
            blocks = f"(unsigned)min((int64_t){blocks}, (int64_t){cap})"
        if slots:  # block slots: the host's count of them follows the grid
            edit = _slot_count_edit(source, function, launch, stride.axis, blocks, slots)
        else:
            edit = _grid_edit(source, launch, stride.axis, blocks)
        previous = edits.get((edit.start_byte, edit.end_byte))
        if previous is not None and previous.replacement != edit.replacement:
            raise _refuse("launches sharing a grid count that need different grids")
        edits[(edit.start_byte, edit.end_byte)] = edit
    return list(edits.values())


def axis_grid_cap(source: ParsedSource, function: Function, axis: str) -> int | None:
    """The number of blocks every launch of ``function`` caps its grid at along ``axis``: a
    count written as the forward rule caps it, or a constant (``const int turns = 1;``), read
    where the grid holds it (the grid, a ``dim3`` argument, the declaration of the ``dim3`` or
    of the count it names); None when the launches do not agree or are not written out."""
    caps = set()
    for launch in source.launches_of(function):
        count = _axis_count(source, launch, axis)
        if count is None:
            return None
        caps.add(cap_of(source.text_of(count)) or fold_int(source, count))
    return caps.pop() if len(caps) == 1 else None


def _axis_count(source: ParsedSource, launch: Launch, axis: str) -> Node | None:
    """The expression that holds the launch's block count along ``axis``: the grid's size
    there, through the declaration of the ``dim3`` or of the count local it names."""
    host = source.enclosing_function(launch.node)
    if launch.grid is None or host is None or host.body is None:
        return None
    grid = strip_parens(launch.grid)
    index = _AXES.index(axis)
    name = source.text_of(grid) if grid.type == "identifier" else ""
    if name and "dim3" in local_types(source, host).get(name, ""):
        try:
            sizes = dim3_extents(_dim3_declaration(source, host, name)[1])
        except NotInForm:
            return None
    elif grid.type == "call_expression" and source.text_of(
        grid.child_by_field_name("function") or grid
    ) in ("dim3", "::dim3"):
        sizes = call_arguments(grid)
    else:
        sizes = [grid] if axis == "x" else []
    count = strip_parens(sizes[index]) if index < len(sizes) else None
    if count is not None and count.type == "identifier":
        try:  # a count local: its value
            return declaration_of(source, host, source.text_of(count))[1]
        except NotInForm:
            return count
    return count
