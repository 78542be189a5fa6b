"""``if constexpr`` branches that no instantiation of their template takes.

A kernel template ``k<kLoads>`` that the file launches only as ``k<0>`` (once a size dispatch
is removed, say) still holds ``if constexpr (kLoads == 0) {...} else {...}``. The ``else``
branch compiles to nothing, yet a rule reading the kernel's text sees it and refuses the form
it is in. A rule can instead empty such a branch in the same edit: the machine code it leaves
is the same, and the form it rewrites is the one that runs.
"""

from __future__ import annotations

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import template_values
from klineage.cuda.source import Function, Node, ParsedSource, within

__all__ = ["emptied_branches", "untaken_branches"]


def untaken_branches(source: ParsedSource, function: Function) -> list[Node]:
    """The branches (the statement after ``if constexpr (...)`` or after its ``else``) that
    no binding of `function`'s template parameters takes. None where a binding is unknown
    (a type argument, a runtime value) or a condition does not fold for every binding."""
    if function.body is None or not function.template_params:
        return []
    bindings = template_values(source, function.name)
    if not bindings:
        return []
    found: list[Node] = []
    for node in source.iter_nodes("if_statement", within=function.body):
        if not any(child.type == "constexpr" for child in node.children):
            continue
        if any(within(node, dead) for dead in found):
            continue  # inside a branch already left out
        taken = _always(source, node, bindings)
        if taken is None:
            continue
        dead = node.child_by_field_name("consequence") if not taken else _else_branch(node)
        if dead is not None:
            found.append(dead)
    return found


def emptied_branches(source: ParsedSource, function: Function) -> tuple[list[Edit], list[Node]]:
    """Edits that empty every untaken branch of `function` (each becomes ``{}``), and the
    branches themselves (code a rule may leave out of what it reads)."""
    dead = untaken_branches(source, function)
    return [Edit.replace(node, "{}") for node in dead], dead


def _always(source: ParsedSource, statement: Node, bindings: list[dict[str, int]]) -> bool | None:
    """The value the condition has under every binding, or None when it differs or is
    unknown."""
    clause = statement.child_by_field_name("condition")
    named = [c for c in clause.named_children if c.type != "comment"] if clause else []
    condition = named[0] if named else None
    if condition is None:
        return None
    values: set[bool] = set()
    for binding in bindings:
        value = fold_int(source, condition, {**source.integer_constants, **binding})
        if value is None:
            return None
        values.add(bool(value))
    return values.pop() if len(values) == 1 else None


def _else_branch(statement: Node) -> Node | None:
    clause = statement.child_by_field_name("alternative")
    if clause is None:
        return None
    return next((c for c in clause.named_children if c.type != "comment"), None)
