"""Staging written back into a tile loop whose 2-D tiles a removal turned into bounds-checked
global reads: the forward rule of :mod:`klineage.mechanisms._staging_helper_2d` (and of
:mod:`klineage.mechanisms._staging_reader_2d` for rows a reader helper got).

The form it takes: a top-level loop over the tiles along K, ``t`` counting from 0 by 1, whose
body reads each operand ``P`` (a pointer parameter of the kernel) through a bounds-checked
2-D index, in the kernel or in a ``__device__`` helper called once there with ``P``::

    for (size_t t{0U}; t < tiles; ++t) {
      for (size_t kk{0U}; kk < BK; ++kk) {
        reader<T, BM>(kk, a_vals, .., A, BK, k, lda, m, t);  // reads, for the row index kk:
        ...                     // (R < m && C < k ? A[R * lda + C] : zero), R = blockIdx.y *
      }                         // BM + (e), C = t * BK + kk
    }

Of the two coordinates ``G * E + I`` of each read, one moves with the tile counter (``G = t``:
the K side, ``E_k`` slots, in-tile index ``I_k``), the other with a block index (``G =
blockIdx``: the block's side, ``E_b``, ``I_b``); both extents are compile-time values. What it
writes: a shared tile ``S[E_k][E_b]`` per operand, filled at the top of the loop by a
generated loader that gets the tiles as 2-D parameters, each thread of the block taking its
share of the slots and storing into slot ``[s_k][s_b]`` the read's bounds-checked load with
``I_k := s_k`` and ``I_b := s_b`` (the zero outside the matrix), the coordinate that is
contiguous in global memory on the slot's fast part; a barrier after the fill and one at the
end of the turn. A read in the kernel becomes ``S[I_k][I_b]``; a reader helper whose ``I_k``
is one of its parameters gets the row ``S[I_k]`` there instead and reads it as
``row[I_b]`` (:mod:`klineage.mechanisms._staging_reader_2d_forward`).

Slot ``[s_k][s_b]`` holds what the read gave for ``I_k = s_k`` and ``I_b = s_b``, so each
read gets its value back when ``0 <= I_k < E_k`` and ``0 <= I_b < E_b``: that every read
stays inside the tile is what the tiling is for and is not proved here (the removal assumes
it the same way; the gate's check catches a read past the tile). The rest holds by checks:
the names the reads use besides the in-tile indices are the same for every thread and not
written in the loop (each thread's loader fills slots with the values the reads expect), the
operands are never written, every thread reaches both barriers (the loop is at the top of
the kernel with a block-uniform trip count, no return before it and no jump out of it), and
the kernel has no shared memory or barriers yet. The removal reads the generated loader back
as the tiles it stages, so removing the staging again gives the loop of global reads back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.indices import MEMORY
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    binary_operands,
    builtin_of,
    call_arguments,
    declared_names,
    statements,
    strip_parens,
    template_arguments,
    walk,
)
from klineage.mechanisms._local_util import leaving_jumps
from klineage.mechanisms._staging_helper import defined_callee
from klineage.mechanisms._staging_reader_2d_forward import check_reader
from klineage.mechanisms._tiles_util import (
    BLOCK_INDEX,
    Locals,
    substitute,
)

__all__ = [
    "BoundedRead",
    "Operand2d",
    "TileLoop2d",
    "has_bounded_reads",
    "read_names",
    "template_types",
    "tile_loop_2d",
]

NEEDED = (
    "a top-level loop `for (t = 0; t < n; ++t)` of a kernel without shared memory whose body "
    "reads pointer parameters only as `(R < M && C < N ? P[R * L + C] : zero)` (in the kernel, "
    "or in a helper called once there with P), one coordinate `t * E_k + I_k` and the other "
    "`blockIdx * E_b + I_b`, E_k and E_b compile-time, the other names block-uniform and not "
    "written in the loop"
)

Kind = Literal["type", "template", "value"]


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _flat(source: ParsedSource, node: Node) -> str:
    return "".join(source.text_of(strip_parens(node)).split())


@dataclass(frozen=True)
class _Side:
    """One coordinate ``G * E + I`` of a read."""

    extent: Node
    index: Node
    """``I`` in the load's index."""
    copies: tuple[Node, ...] = ()
    """``I`` wherever the read writes it: the load's index and the bounds check."""


@dataclass(frozen=True)
class BoundedRead:
    """One read ``(cond ? P[off] : zero)`` and its two coordinates."""

    node: Node
    """The read with the parentheses around it."""
    cond: Node
    load: Node
    zero: Node
    k: _Side
    b: _Side
    k_contiguous: bool
    """Whether the K coordinate is the unscaled one (``A``'s columns), else the block's."""


@dataclass(frozen=True)
class _Name:
    """A name of a scope the loader needs: how it is declared and what the kernel passes."""

    kind: Kind
    type: str
    """The declared type in the scope's terms (empty for a type parameter)."""
    argument: str
    """The kernel's text for it."""


@dataclass
class Operand2d:
    """One operand the loop reads through bounds-checked indices."""

    pointer: str
    """The kernel's pointer parameter."""
    local: str
    """The scope's name for it."""
    scope: Function
    """Where the reads are: the kernel, or the reader helper."""
    reads: list[BoundedRead] = field(default_factory=list)
    reader: Node | None = None
    """The reader helper's call, when the reads are in one."""
    names: dict[str, _Name] = field(default_factory=dict)
    """The scope's names the reads use (outside the in-tile indices), with the pointer."""


@dataclass(frozen=True)
class TileLoop2d:
    """A loop in the form above."""

    function: Function
    loop: Node
    operands: tuple[Operand2d, ...]


# ---------------------------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------------------------


def _conditional_loads(source: ParsedSource, within_node: Node, pointers: set[str]) -> list[Node]:
    """The conditional expressions under ``within_node`` whose value when true is a subscript
    of one of ``pointers``."""
    found = []
    for node in walk(within_node):
        if node.type != "conditional_expression":
            continue
        load = node.child_by_field_name("consequence")
        argument = strip_parens(load).child_by_field_name("argument") if load else None
        if argument is not None and source.text_of(argument) in pointers:
            found.append(node)
    return found


def _coordinates(source: ParsedSource, node: Node) -> list[tuple[Node, Node]] | None:
    """The (row, column) readings of a conditional load's index ``R * L + C`` whose bounds
    check compares both, ``R < M && C < N``; None when it is not a 2-D bounded read."""
    cond, load = node.child_by_field_name("condition"), node.child_by_field_name("consequence")
    both = binary_operands(strip_parens(cond), "&&") if cond is not None else None
    checks = [binary_operands(strip_parens(c), "<") for c in both] if both else []
    indices = strip_parens(load).child_by_field_name("indices") if load is not None else None
    if len(checks) != 2 or indices is None or len(indices.named_children) != 1:
        return None
    bounded = {_flat(source, c[0]) for c in checks if c is not None}
    pair = binary_operands(strip_parens(indices.named_children[0]), "+")
    found = []
    for scaled, column in (pair, pair[::-1]) if pair is not None else ():
        product = binary_operands(strip_parens(scaled), "*")
        for row, _ in (product, product[::-1]) if product is not None else ():
            if len(bounded) == 2 and {_flat(source, row), _flat(source, column)} == bounded:
                found.append((row, column))
    return found or None


def _scopes(
    source: ParsedSource, function: Function, body: Node
) -> list[tuple[Function, Node | None, dict[str, str]]]:
    """(scope, its call or None, its pointer parameters -> the kernel's) for the kernel and
    for each helper defined here that the loop body hands a pointer parameter of the kernel."""
    pointers = [p.name for p in function.params if p.is_pointer and p.name]  # in order
    found: list[tuple[Function, Node | None, dict[str, str]]] = [
        (function, None, {p: p for p in pointers})
    ]
    for call in walk(body):
        helper = defined_callee(source, call) if call.type == "call_expression" else None
        if helper is None or helper.body is None or helper == function:
            continue
        given = {
            param.name: source.text_of(arg)
            for param, arg in zip(helper.params, call_arguments(call), strict=False)
            if param.name and source.text_of(strip_parens(arg)) in pointers
        }
        if given:
            found.append((helper, call, given))
    return found


def has_bounded_reads(source: ParsedSource, function: Function, loop: Node) -> bool:
    """Whether the loop reads a pointer parameter under a condition, in the kernel or in a
    helper it calls: the cheap test of a candidate."""
    body = loop.child_by_field_name("body")
    if body is None:
        return False
    for scope, call, given in _scopes(source, function, body):
        root = body if call is None else scope.body
        loads = _conditional_loads(source, root, set(given)) if root is not None else []
        if any(_coordinates(source, load) for load in loads):
            return True
    return False


def _side(source: ParsedSource, node: Node, counters: set[str]) -> tuple[str, _Side] | None:
    """``G * E + I`` (in either order): ("tile" for G a tile counter, "block" for G a block
    index, the side), else None."""
    pair = binary_operands(strip_parens(node), "+")
    for scaled, index in (pair, pair[::-1]) if pair is not None else ():
        product = binary_operands(strip_parens(scaled), "*")
        for counter, extent in (product, product[::-1]) if product is not None else ():
            if builtin_of(source, counter) in BLOCK_INDEX:
                return "block", _Side(extent, index)
            if strip_parens(counter).type == "identifier" and source.text_of(counter) in counters:
                return "tile", _Side(extent, index)
    return None


def _bounded(source: ParsedSource, node: Node, counters: set[str]) -> BoundedRead:
    """The coordinates of a read ``(R < M && C < N ? P[R * L + C] : zero)``."""
    cond, load = node.child_by_field_name("condition"), node.child_by_field_name("consequence")
    zero = node.child_by_field_name("alternative")
    assert cond is not None and load is not None and zero is not None
    shown = source.snippet(node, 70)
    readings = _coordinates(source, node)
    if readings is None:
        raise _refuse(
            f"a read `{shown}` that is not `(R < M && C < N ? P[R * L + C] : zero)` over the "
            "two coordinates its bounds check compares"
        )
    checked = [
        c.children[0]
        for c in walk(cond)
        if c.type == "binary_expression" and c.children[1].type == "<"
    ]
    for row, column in readings:
        sides = [_side(source, n, counters) for n in (row, column)]
        kinds = [s[0] if s is not None else "" for s in sides]
        if sorted(kinds) != ["block", "tile"]:
            continue
        k, b = (sides[0], sides[1]) if kinds[0] == "tile" else (sides[1], sides[0])
        assert k is not None and b is not None
        found = [_with_copies(source, s[1], checked, counters) for s in (k, b)]
        return BoundedRead(_outer(node), cond, load, zero, *found, kinds[1] == "tile")
    raise _refuse(
        f"a read `{shown}` whose coordinates are not `t * E + I` and `blockIdx * E + I` (the "
        "tile counter and a block index)"
    )


def _with_copies(
    source: ParsedSource, side: _Side, checked: list[Node], counters: set[str]
) -> _Side:
    """The side with its in-tile index where the bounds check writes it too."""
    copies = [side.index]
    coordinate = side.index.parent
    for node in checked:
        other = _side(source, node, counters)
        if (
            coordinate is not None
            and other is not None
            and _flat(source, node) == _flat(source, coordinate)
        ):
            copies.append(other[1].index)
    return _Side(side.extent, side.index, tuple(copies))


def _outer(node: Node) -> Node:
    while node.parent is not None and node.parent.type == "parenthesized_expression":
        node = node.parent
    return node


# ---------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------


def template_types(source: ParsedSource, function: Function) -> dict[str, str]:
    """Each template parameter's declared type (empty for a type parameter)."""
    found: dict[str, str] = {}
    for declaration in function.template.named_children if function.template else []:
        declarator = declaration.child_by_field_name("declarator")
        kind = declaration.child_by_field_name("type")
        if declarator is not None and kind is not None:
            found[source.text_of(declarator)] = source.text_of(kind)
        else:
            name = next(
                (c for c in declaration.named_children if c.type == "type_identifier"), None
            )
            if name is not None:
                found[source.text_of(name)] = ""
    return found


def _compile_time(source: ParsedSource, function: Function, node: Node) -> bool:
    """Whether a kernel expression is known when compiling: literals, template parameters,
    file constants and ``constexpr`` locals."""
    locals_ = Locals(source, function)
    constants = analysis(source).constants
    for current in walk(node):
        if current.type == "field_expression":
            return False
        name = source.text_of(current)
        if current.type != "identifier" or name in function.template_params or name in constants:
            continue
        declared = locals_.declared.get(name, [])
        statement = declared[0][0].parent if len(declared) == 1 else None
        if statement is None or "constexpr" not in source.text_of(statement).split():
            return False
    return True


def _is_name(source: ParsedSource, scope: Function, node: Node) -> bool:
    """Whether a node names a value or type of the scope: an identifier that is not a field,
    a called function or a cast, or one of the scope's template types."""
    if node.type == "type_identifier":
        return source.text_of(node) in scope.template_params
    parent = node.parent
    return node.type == "identifier" and not (
        parent is not None
        and (
            parent.type == "field_expression"
            or (
                parent.type in ("call_expression", "template_function")
                and parent.children[0] == node
            )
        )
    )


def read_names(source: ParsedSource, scope: Function, read: BoundedRead) -> list[Node]:
    """The names a read uses outside its in-tile indices, in order."""
    skip = read.k.copies + read.b.copies
    return [
        node
        for part in (read.cond, read.load, read.zero)
        for node in walk(part)
        if _is_name(source, scope, node) and not any(within(node, s) for s in skip)
    ]


def _varies(source: ParsedSource, function: Function, node: Node) -> bool:
    """Whether a kernel expression may differ between the threads of a block (or is read
    from memory)."""
    indices = analysis(source).indices(function)
    form = indices.form(node)
    return bool(indices.thread_atoms(form)) or MEMORY in form.base_atoms()


def _resolve(
    source: ParsedSource, function: Function, operand: Operand2d, node: Node
) -> _Name | None:
    """How the loader gets the scope's name at ``node`` (None for a file constant it sees as
    it is)."""
    scope, call, name = operand.scope, operand.reader, source.text_of(node)
    if name in analysis(source).constants and name not in scope.template_params:
        return None
    types = template_types(source, scope)
    if call is None:
        if name in types:
            return _Name("template" if types[name] else "type", types[name], name)
        param = function.param(name)
        kind = param.type if param is not None else source.local_types(function).get(name)
        if kind is None:
            raise _refuse(f"a read over {name}, which {function.name} neither gets nor declares")
        argument = node
    else:
        bound = dict(zip(scope.template_params, template_arguments(call), strict=False))
        bound |= {
            p.name: a for p, a in zip(scope.params, call_arguments(call), strict=False) if p.name
        }
        if name not in bound:
            raise _refuse(f"a read over {name}, which the call of {scope.name} does not pass")
        argument = bound[name]
        if name in types and not types[name]:
            return _Name("type", "", source.text_of(argument))
        param = scope.param(name)
        kind = types.get(name, "") if param is None else param.type
    if _varies(source, function, argument):
        raise _refuse(
            f"a read over {name}, given `{source.snippet(argument, 40)}`, which differs "
            "between threads"
        )
    if _compile_time(source, function, argument):
        # a template parameter of the loader: a plain type (`constexpr int N` gives `int`)
        plain = " ".join(w for w in kind.split() if w not in ("const", "constexpr", "static"))
        return _Name("template", plain, source.text_of(argument))
    kind = " ".join(w for w in kind.split() if w not in ("constexpr", "static"))
    return _Name("value", kind, source.text_of(argument))


# ---------------------------------------------------------------------------------------------
# The form
# ---------------------------------------------------------------------------------------------


def _counters(source: ParsedSource, scope: Function, call: Node | None, variable: str) -> set[str]:
    """The names the tile counter has in a scope: itself, or the helper's parameters the
    call hands it."""
    if call is None:
        return {variable}
    return {
        p.name
        for p, a in zip(scope.params, call_arguments(call), strict=False)
        if p.name and source.text_of(strip_parens(a)) == variable
    }


def _check_loop(source: ParsedSource, function: Function, loop: Node) -> str:
    """The tile counter of a loop every thread of the block runs whole; NotInForm if not."""
    body = loop.child_by_field_name("body")
    if function.body is None or loop.parent != function.body or body is None:
        raise _refuse("a loop not at the top level of the kernel")
    variable = analysis(source).indices(function).loop_of(loop)
    if (
        variable is None
        or variable.init.value != 0
        or variable.step is None
        or variable.step.value != 1
    ):
        raise _refuse("a loop that does not count its tiles from 0 by 1")
    if not variable.bound_uniform:
        raise _refuse("a loop whose trip count depends on the thread, so a barrier is unsafe")
    for node in source.iter_nodes("return_statement", within=function.body):
        if node.start_byte < loop.end_byte:
            raise _refuse(
                f"a return before or in the loop (line {source.line_of(node.start_byte)})"
            )
    jumps = leaving_jumps(statements(body), "break_statement") + leaving_jumps(
        statements(body), "continue_statement"
    )
    if jumps:
        raise _refuse(f"a jump out of a turn (line {source.line_of(jumps[0].start_byte)})")
    if (
        any(within(d.node, function.node) for d in source.shared_declarations)
        or analysis(source).shared(function).barriers
    ):
        raise _refuse(f"{function.name}, which already uses shared memory or barriers")
    return variable.name


def _operand(
    source: ParsedSource,
    function: Function,
    scope: Function,
    call: Node | None,
    pointer: str,
    kernel_pointer: str,
    variable: str,
    body: Node,
) -> Operand2d | None:
    """The bounded reads of one pointer in one scope (None when it has none)."""
    root = body if call is None else scope.body
    assert root is not None
    loads = _conditional_loads(source, root, {pointer})
    if not loads:
        return None
    calls = analysis(source).call_graph.call_sites(scope.name)
    if call is not None and len(calls) != 1:
        raise _refuse(f"a read in {scope.name}, called {len(calls)} times")
    counters = _counters(source, scope, call, variable)
    operand = Operand2d(kernel_pointer, pointer, scope, reader=call)
    operand.reads = [_bounded(source, node, counters) for node in loads]
    inside = [r.load for r in operand.reads]
    for node in walk(root):
        if node.type != "identifier" or source.text_of(node) != pointer:
            continue
        if node.parent is not None and node.parent.type in ("parameter_declaration",):
            continue
        if call is None and node.parent is not None and node.parent.type == "argument_list":
            continue  # handed to a reader helper: that scope's reads
        if not any(within(node, load) for load in inside):
            raise _refuse(
                f"{pointer} used as `{source.snippet(node.parent or node, 60)}` in "
                f"{scope.name}, not only read through a bounds-checked index"
            )
    return operand


def _layout(source: ParsedSource, operand: Operand2d, read: BoundedRead) -> str:
    """A read's texts with its in-tile indices blanked, whitespace dropped: reads of one
    operand must agree on it."""

    def blank(node: Node) -> str | None:
        return "\x00" if node in read.k.copies + read.b.copies else None

    parts = [substitute(source, n, blank) for n in (read.cond, read.load, read.zero)]
    parts += [source.text_of(read.k.extent), source.text_of(read.b.extent), str(read.k_contiguous)]
    return "\x01".join("".join(p.split()) for p in parts)


def tile_loop_2d(source: ParsedSource, function: Function, loop: Node) -> TileLoop2d:
    """The form of a candidate loop (one :func:`has_bounded_reads` finds reads in);
    NotInForm says what differs."""
    variable = _check_loop(source, function, loop)
    body = loop.child_by_field_name("body")
    assert body is not None
    operands: list[Operand2d] = []
    for scope, call, given in _scopes(source, function, body):
        for pointer, kernel_pointer in given.items():
            found = _operand(source, function, scope, call, pointer, kernel_pointer, variable, body)
            if found is not None:
                operands.append(found)
    if not operands:
        raise _refuse("a loop without bounds-checked reads of a pointer parameter")
    pointers = [o.pointer for o in operands]
    twice = [p for i, p in enumerate(pointers) if p in pointers[:i]]
    if twice:
        raise _refuse(f"reads of {twice[0]} in the kernel and in a helper, or in two helpers")
    readers = [o.reader for o in operands if o.reader is not None]
    if len({r.start_byte for r in readers}) != len(readers):
        raise _refuse("a reader helper that reads several operands")
    written = assigned_names(source, statements(body))
    declared = declared_names(source, statements(body))
    stores = {
        a.buffer.name
        for a in analysis(source).indices(function).accesses()
        if a.direction != "load"
    }
    for operand in operands:
        if operand.pointer in stores:
            raise _refuse(f"a tile of {operand.pointer}, which the kernel also writes")
        if len({_layout(source, operand, r) for r in operand.reads}) != 1:
            raise _refuse(f"reads of {operand.pointer} in two layouts")
        read = operand.reads[0]
        for node in read_names(source, operand.scope, read):
            name = source.text_of(node)
            if name in operand.names:
                continue
            resolved = _resolve(source, function, operand, node)
            if resolved is None:
                continue
            used = set(re.findall(r"\w+", resolved.argument))
            if used & declared:
                raise _refuse(
                    f"a read over {name}, given `{resolved.argument}`, which the loop declares "
                    "after the point the tiles are loaded at"
                )
            moved = sorted(used & written)
            if moved and resolved.kind == "value":
                raise _refuse(f"a read over {name}, which the loop writes ({', '.join(moved)})")
            operand.names[name] = resolved
        for extent in (read.k.extent, read.b.extent):
            known = operand.names.get(source.text_of(extent))
            if extent.type not in ("identifier", "number_literal") or (
                known is not None and known.kind != "template"
            ):
                raise _refuse(
                    f"a tile of {operand.pointer} `{source.text_of(extent)}` slots wide, not "
                    "one compile-time name or number"
                )
        if operand.reader is not None:
            check_reader(source, operand)
    return TileLoop2d(function, loop, tuple(operands))
