"""Inlining a call of a ``__device__`` helper: its body, written at the call's place.

A pattern spread over helpers (one fills registers, another computes with them, the caller's
loop calls both) is one pattern once the helpers' bodies stand where they are called. This
module writes that text; a rule reads the inlined form, rewrites it, and keeps the result.

The helper must be a ``void`` function defined in the file, with no ``return`` but a last
``return;``, called as a statement (namespace-qualified or not) with every template argument
written out and one argument per parameter. In its body, template parameters become the
call's template arguments and parameters the call's arguments:

- an argument that only computes on names and constants (``k_i``, ``warp * 64 + 8``,
  ``threadIdx.x``) stands in for its parameter, parenthesized unless it is a name, a constant,
  a member or an element (``tile[k]``);
- an array or reference parameter needs a name or an element of one (``tile[k]``);
- any other argument, or a parameter the helper writes, becomes a local copy declared with
  the parameter's type.

Locals of the helper whose names the caller also uses are renamed, so nothing the caller
passes is shadowed. Refused (:class:`~klineage.cuda.tree.NotInForm`) where a name the helper
reads from the file is also a local of the caller, or names something of the helper's own
namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    callee_name,
    declared_names,
    fresh_name,
    identifier_names,
    statements,
    strip_parens,
    walk,
)

__all__ = ["Inlined", "callee_of", "caller_names", "inline_call"]

NEEDED = (
    "a statement calling a `void` device helper defined in the file, with its template "
    "arguments written out, one argument per parameter and no `return` in its body"
)
_PURE_KINDS = frozenset(
    {
        "identifier",
        "number_literal",
        "true",
        "false",
        "field_expression",
        "binary_expression",
        "unary_expression",
        "parenthesized_expression",
        "cast_expression",
        "type_descriptor",
        "primitive_type",
        "type_identifier",
        "sized_type_specifier",
        "type_qualifier",
        "field_identifier",
        "abstract_pointer_declarator",
    }
)
"""What an argument may be made of to stand in for its parameter: names, constants and
arithmetic (no memory reads, calls or writes, which could see the helper's own writes)."""
# primary and postfix expressions: written in place of a parameter they bind as tightly as it
# did (`tile[k]` for `row` in `row[i]` gives `tile[k][i]`), so they need no parentheses
_UNPARENTHESIZED = frozenset(
    {"identifier", "number_literal", "field_expression", "subscript_expression", "true", "false"}
)


@dataclass(frozen=True)
class Inlined:
    """A helper's body as the call's place would run it."""

    statements: list[str]
    """The body's statements, in order (copies of parameters first)."""
    asserts: list[str]
    """Its ``static_assert`` statements, kept apart: they check the template arguments and
    may go anywhere those are in scope."""
    helper: Function
    """The helper inlined."""


def callee_of(source: ParsedSource, statement: Node) -> Function | None:
    """The helper a statement ``f<...>(...);`` calls, when the file defines one function of
    that name that runs on the device and is not a kernel."""
    call = _call_of(statement)
    if call is None:
        return None
    function = call.child_by_field_name("function")
    if function is None:
        return None
    name = callee_name(source.text_of(function))
    found = [f for f in source.functions if f.name == name]
    if len(found) != 1 or not found[0].runs_on_device or found[0].is_kernel:
        return None
    return found[0]


def _callee_node(call: Node) -> Node | None:
    """What a call names, namespaces taken off: ``f``, or ``f<...>`` of ``ns::f<...>(..)``."""
    function = call.child_by_field_name("function")
    while function is not None and function.type == "qualified_identifier":
        function = function.child_by_field_name("name")
    return function


def _call_of(statement: Node) -> Node | None:
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    call = statement.named_children[0]
    return call if call.type == "call_expression" else None


def caller_names(source: ParsedSource, caller: Function) -> set[str]:
    """The names a function declares: its parameters, locals and loop variables."""
    assert caller.body is not None
    names = {p.name for p in caller.params if p.name}
    return names | declared_names(source, caller.body)


def inline_call(source: ParsedSource, statement: Node, taken: set[str]) -> Inlined:
    """The body of the helper ``statement`` calls, as the call's place would run it.
    ``taken`` holds the names declared where the text will stand (:func:`caller_names`, and
    what earlier inlined text declares there); the names this text declares are added."""
    helper = callee_of(source, statement)
    call = _call_of(statement)
    if helper is None or call is None or helper.body is None:
        raise NotInForm(f"`{_short(source, statement)}`, not a call of a device helper", NEEDED)
    _check_helper(source, helper)
    caller = source.enclosing_function(statement)
    if caller is not None and caller.name == helper.name:
        raise NotInForm(f"a recursive call of {helper.name}", NEEDED)
    mapping = _template_mapping(source, helper, call)
    arguments = _arguments(source, call)
    if len(arguments) != len(helper.params):
        raise NotInForm(
            f"a call of {helper.name} with {len(arguments)} arguments for "
            f"{len(helper.params)} parameters",
            NEEDED,
        )
    body = helper.body
    locals_ = declared_names(source, body)
    own = locals_ | {p.name for p in helper.params if p.name} | set(helper.template_params)
    free = _free_names(source, body) - own
    shadowed = free & taken
    if shadowed:
        raise NotInForm(
            f"a helper {helper.name} that reads {', '.join(sorted(shadowed))}, which the "
            "caller declares too",
            NEEDED,
        )
    used = taken | (identifier_names(source, caller.node) if caller is not None else set())
    for name in sorted(locals_):
        if name in used or name in mapping:
            mapping[name] = fresh_name(used | set(mapping.values()), name)
        used.add(mapping.get(name, name))
        taken.add(mapping.get(name, name))
    before = set(used)
    copies = _bind_parameters(source, helper, arguments, mapping, used)
    taken |= used - before  # the copies of parameters
    kept: list[str] = []
    asserts: list[str] = []
    for item in statements(body):
        if item.type == "return_statement":
            continue  # the trailing `return;` (_check_helper)
        text = _dedented(source, item, _substituted(source, item, mapping))
        (asserts if source.text_of(item).startswith("static_assert") else kept).append(text)
    return Inlined(statements=copies + kept, asserts=asserts, helper=helper)


def _dedented(source: ParsedSource, node: Node, text: str) -> str:
    """``text`` (a statement's) with its lines after the first moved left by the column the
    statement starts at, so it reads right wherever it is written."""
    line_start = source.data.rfind(b"\n", 0, node.start_byte) + 1
    column = node.start_byte - line_start
    lines = text.split("\n")
    moved = [line[column:] if line[:column].isspace() else line.lstrip() for line in lines[1:]]
    return "\n".join([lines[0], *moved])


def _short(source: ParsedSource, node: Node) -> str:
    return " ".join(source.text_of(node).split())[:60]


def _check_helper(source: ParsedSource, helper: Function) -> None:
    returned = helper.node.child_by_field_name("type")
    if returned is None or source.text_of(returned) != "void":
        raise NotInForm(f"a helper {helper.name} that returns a value", NEEDED)
    assert helper.body is not None
    items = statements(helper.body)
    last = items[-1] if items else None
    returns = [n for n in walk(helper.body) if n.type == "return_statement"]
    if any(r != last or r.named_children for r in returns):
        raise NotInForm(f"a helper {helper.name} with a `return` in its body", NEEDED)
    scope = _namespace_names(source, helper)
    used = _free_names(source, helper.body) | _called_names(source, helper.body)
    if used & scope:
        raise NotInForm(
            f"a helper {helper.name} that names {', '.join(sorted(used & scope))} of its "
            "namespace, which the caller's place would not find",
            NEEDED,
        )


def _template_mapping(source: ParsedSource, helper: Function, call: Node) -> dict[str, str]:
    function = _callee_node(call)
    written = (
        function.child_by_field_name("arguments")
        if function is not None and function.type == "template_function"
        else None
    )
    values = [] if written is None else [c for c in written.named_children if c.type != "comment"]
    if len(values) != len(helper.template_params):
        raise NotInForm(
            f"a call of {helper.name} with {len(values)} template arguments for "
            f"{len(helper.template_params)} parameters (deduced or defaulted ones are not read)",
            NEEDED,
        )
    return {
        name: _as_operand(source, value)
        for name, value in zip(helper.template_params, values, strict=True)
    }


def _arguments(source: ParsedSource, call: Node) -> list[Node]:
    arguments = call.child_by_field_name("arguments")
    if arguments is None:
        return []
    return [c for c in arguments.named_children if c.type != "comment"]


def _as_operand(source: ParsedSource, node: Node) -> str:
    text = " ".join(source.text_of(node).split())
    inner = strip_parens(node)
    if (
        inner.type in _UNPARENTHESIZED
        or inner.type.endswith("type")
        or node.type == "type_descriptor"
    ):
        return text
    return f"({text})"


def _is_pure(node: Node) -> bool:
    return all(n.type in _PURE_KINDS or not n.is_named for n in walk(node))


def _bind_parameters(
    source: ParsedSource,
    helper: Function,
    arguments: list[Node],
    mapping: dict[str, str],
    taken: set[str],
) -> list[str]:
    """Each parameter's stand-in in ``mapping``; the copies to declare first, in order."""
    assert helper.body is not None
    written = assigned_names(source, helper.body) | _address_taken(source, helper.body)
    copies: list[str] = []
    for param, argument in zip(helper.params, arguments, strict=True):
        if param.name is None:
            continue
        declarator = param.node.child_by_field_name("declarator")
        by_name = declarator is not None and declarator.type in (
            "array_declarator",
            "reference_declarator",
        )
        passed = strip_parens(argument)
        if by_name:
            if not _names_memory(passed) or param.name in assigned_names(source, helper.body):
                raise NotInForm(
                    f"an array or reference parameter {param.name} of {helper.name} passed "
                    f"`{_short(source, argument)}`, not a name or an element of one",
                    NEEDED,
                )
            mapping[param.name] = _as_operand(source, passed)
        elif param.name not in written and _is_pure(argument):
            mapping[param.name] = _as_operand(source, argument)
        else:
            copy = fresh_name(taken | set(mapping.values()), param.name)
            taken.add(copy)
            declared = _substituted(source, param.node, {**mapping, param.name: copy})
            copies.append(f"{declared} = {' '.join(source.text_of(argument).split())};")
            mapping[param.name] = copy
    return copies


def _names_memory(node: Node) -> bool:
    """A name, or an element of one at indices that only compute (``tile[k]``, ``a[i][j]``):
    what an array or reference parameter may stand for."""
    while node.type == "subscript_expression":
        indices = node.child_by_field_name("indices")
        if indices is None or not all(_is_pure(i) for i in indices.named_children):
            return False
        argument = node.child_by_field_name("argument")
        if argument is None:
            return False
        node = strip_parens(argument)
    return node.type == "identifier"


def _address_taken(source: ParsedSource, body: Node) -> set[str]:
    found = set()
    for node in walk(body):
        if node.type == "pointer_expression" and source.text_of(node).startswith("&"):
            target = node.child_by_field_name("argument")
            if target is not None and strip_parens(target).type == "identifier":
                found.add(source.text_of(strip_parens(target)))
    return found


def _free_names(source: ParsedSource, body: Node) -> set[str]:
    """Names the body reads as plain identifiers (not fields, not qualified, not called)."""
    found = set()
    for node in walk(body):
        if node.type != "identifier":
            continue
        parent = node.parent
        if parent is not None and parent.type in ("qualified_identifier", "template_function"):
            continue
        if parent is not None and parent.child_by_field_name("function") == node:
            continue  # a call's callee (or a template function's name)
        found.add(source.text_of(node))
    return found


def _namespace_names(source: ParsedSource, helper: Function) -> set[str]:
    """The names declared in the namespace around a helper (none outside a namespace)."""
    around = helper.outer.parent
    while around is not None and around.type != "namespace_definition":
        around = around.parent
    if around is None:
        return set()
    names = {
        f.name for f in source.functions if around.start_byte <= f.node.start_byte < around.end_byte
    }
    return names | {
        name
        for d in source.declarations
        if around.start_byte <= d.node.start_byte < around.end_byte
        and source.enclosing_function(d.node) is None
        for name in d.names
    }


def _called_names(source: ParsedSource, body: Node) -> set[str]:
    return {callee_name(c.name) for c in source.calls if within(c.node, body)}


def _substituted(source: ParsedSource, node: Node, mapping: dict[str, str]) -> str:
    """The text of ``node`` with each identifier and type name in ``mapping`` replaced."""
    pieces: list[str] = []
    cursor = node.start_byte
    for current in walk(node):
        if current.type not in ("identifier", "type_identifier"):
            continue
        name = source.text_of(current)
        if name not in mapping or current.start_byte < cursor:
            continue
        parent = current.parent
        if parent is not None and parent.type == "qualified_identifier":
            continue
        pieces.append(source.text_of((cursor, current.start_byte)))
        pieces.append(mapping[name])
        cursor = current.end_byte
    pieces.append(source.text_of((cursor, node.end_byte)))
    return "".join(pieces)
