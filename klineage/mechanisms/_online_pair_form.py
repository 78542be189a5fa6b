"""What a thread folds its row into, read from what its statements compute, not how they are
spelled: a running (max, sum of exponentials) pair, or a plain sum, maximum or minimum.

A running pair keeps ``m`` and ``s = sum(exp(x - m))`` over the elements seen so far: each
element takes (m, s) to (m', s * exp(m - m') + exp(x - m')), whether written with the old
maximum in a local (``float o = m; m = fmaxf(m, x); s *= expf(o - m); s += expf(x -
m);``) or as ``float n = fmaxf(m, x); s = s * expf(m - n) + expf(x - n); m = n;``. The
statements of one block are evaluated symbolically from the values (M0, S0) they start
with, and the result is matched against that update. Threads' pairs then combine as (M, sum
over t of s_t exp(m_t - M)) with M the largest m_t, whatever each m' was chosen to be (the
identity holds for any m').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import declaration_names, fresh_name, identifier_names
from klineage.mechanisms._reductions_util import (
    call_name,
    inside,
    named_statements,
    strip_parens,
)

Sym = tuple
"""A symbolic value: ``("start", name)`` (a tracked name's value on entry), ``("leaf",
text)`` (an expression that reads no tracked name), ``("call", function, args)`` or
``("bin", operator, left, right)``."""

EXPONENTIALS = frozenset({"expf", "__expf", "exp"})
_MAX = {"fmaxf": "max", "fmax": "max", "max": "max", "fminf": "min", "fmin": "min", "min": "min"}


class FoldFormError(ValueError):
    """The statements fold a tracked name in a way this reading does not take; the message
    says which statement and why."""


@dataclass(frozen=True)
class Fold:
    """What one block of statements does to the names it writes."""

    kind: Literal["pair", "sum", "max", "min"]
    names: tuple[str, ...]
    """``(m, s)`` for a pair, ``(a,)`` for a plain accumulator."""
    exponential: str = "expf"
    """The exponential a pair's rescale calls (kept in the combine)."""


_LOOPS = ("for_statement", "while_statement", "do_statement")


def fold_blocks(source: ParsedSource, nodes: list[Node], tracked: set[str]) -> dict[int, Node]:
    """The innermost blocks under ``nodes`` whose statements write a ``tracked`` name, by
    start byte; :class:`FoldFormError` for a write that is no statement of a block (in a
    loop's header, say)."""
    blocks: dict[int, Node] = {}
    for node in nodes:
        for write in inside(source, node, "assignment_expression", "update_expression"):
            target = write.child_by_field_name("left") or write.child_by_field_name("argument")
            if target is None or source.text_of(target) not in tracked:
                continue
            block = write.parent
            while block is not None and block.type != "compound_statement":
                if block.type in _LOOPS:
                    raise FoldFormError(
                        f"{source.text_of(target)} is folded in a loop header (line "
                        f"{source.line_of(write.start_byte)})"
                    )
                block = block.parent
            if block is None:
                raise FoldFormError(f"{source.text_of(target)} is folded outside a block")
            blocks[block.start_byte] = block
    return blocks


def combine_text(fold: Fold, group: str, indent: str, taken: set[str]) -> str:
    """The statement that combines a fold over a group whose ``{group}_reduce_{op}`` give
    every thread the group's value (``taken``: names the new local must avoid; updated)."""
    if fold.kind != "pair":
        return f"{fold.names[0]} = {group}_reduce_{fold.kind}({fold.names[0]});"
    m, s = fold.names
    top = fresh_name(taken, f"{group}_max")
    taken.add(top)
    # a thread that saw no element keeps (-inf, 0): its share is 0, not 0 * exp(nan)
    return (
        f"{{  // the {group}'s ({m}, {s}) from its threads' pairs\n"
        f"{indent}  const float {top} = {group}_reduce_max({m});\n"
        f"{indent}  {s} = {group}_reduce_sum({m} == {top} ? {s} : {s} * "
        f"{fold.exponential}({m} - {top}));\n"
        f"{indent}  {m} = {top};\n"
        f"{indent}}}"
    )


def block_folds(source: ParsedSource, block: Node, tracked: set[str]) -> list[Fold]:
    """The folds of the ``tracked`` names the statements of ``block`` write, each read from
    its final symbolic value; :class:`FoldFormError` when one is not a pair's update or a
    plain accumulation."""
    values = _evaluate(source, named_statements(block), tracked)
    written = [n for n in values if n in tracked and values[n] != ("start", n)]
    folds: list[Fold] = []
    paired: set[str] = set()
    for m in written:
        for s in written:
            exponential = _pair_update(values, m, s) if m != s else None
            if exponential is not None:
                folds.append(Fold("pair", (m, s), exponential))
                paired |= {m, s}
    for name in written:
        if name in paired:
            continue
        kind = _plain_update(values[name], name)
        if kind is None:
            raise FoldFormError(
                f"the block at line {source.line_of(block.start_byte)} folds {name} into "
                "neither a sum, a maximum, a minimum nor a running (max, sum of exp) pair"
            )
        folds.append(Fold(kind, (name,)))
    return folds


def _evaluate(source: ParsedSource, statements: list[Node], tracked: set[str]) -> dict[str, Sym]:
    values: dict[str, Sym] = {name: ("start", name) for name in tracked}
    for statement in statements:
        line = source.line_of(statement.start_byte)
        if statement.type == "declaration":
            names = declaration_names(source, statement)
            reads = identifier_names(source, statement) - set(names)
            if not reads & set(values):
                continue
            declarators = statement.children_by_field_name("declarator")
            value = declarators[0].child_by_field_name("value") if len(declarators) == 1 else None
            if value is None or len(names) != 1:
                raise FoldFormError(f"the declaration at line {line} reads a running value")
            values[names[0]] = _symbol(source, value, values, line)
        elif statement.type == "expression_statement" and statement.named_children:
            _assign(source, statement.named_children[0], values, line)
        elif statement.type != "comment" and identifier_names(source, statement) & set(values):
            raise FoldFormError(
                f"the {statement.type.replace('_', ' ')} at line {line} reads a running value"
            )
    return values


def _assign(source: ParsedSource, expression: Node, values: dict[str, Sym], line: int) -> None:
    if expression.type == "update_expression":
        target = expression.child_by_field_name("argument")
        name = source.text_of(target) if target is not None else ""
        if name in values:
            op = "+" if "++" in source.text_of(expression) else "-"
            values[name] = ("bin", op, values[name], ("leaf", "1"))
        return
    if expression.type != "assignment_expression":
        if identifier_names(source, expression) & set(values):
            raise FoldFormError(f"the statement at line {line} reads a running value")
        return
    left, right = expression.child_by_field_name("left"), expression.child_by_field_name("right")
    operator = expression.child_by_field_name("operator")
    assert left is not None and right is not None and operator is not None
    name = source.text_of(left)
    if left.type != "identifier" or name not in values:
        if identifier_names(source, expression) & set(values):
            raise FoldFormError(f"the statement at line {line} stores a running value")
        return
    value = _symbol(source, right, values, line)
    op = source.text_of(operator)
    values[name] = value if op == "=" else ("bin", op[:-1], values[name], value)


def _symbol(source: ParsedSource, node: Node, values: dict[str, Sym], line: int) -> Sym:
    node = strip_parens(node)
    if not identifier_names(source, node) & set(values):
        return ("leaf", " ".join(source.text_of(node).split()))
    if node.type == "identifier":
        return values[source.text_of(node)]
    if node.type == "binary_expression":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        operator = node.child_by_field_name("operator")
        assert left is not None and right is not None and operator is not None
        return (
            "bin",
            operator.type,
            _symbol(source, left, values, line),
            _symbol(source, right, values, line),
        )
    if node.type == "call_expression":
        arguments = node.child_by_field_name("arguments")
        args = [a for a in arguments.named_children if a.type != "comment"] if arguments else []
        name = call_name(source, node) or ""
        return ("call", name, tuple(_symbol(source, a, values, line) for a in args))
    raise FoldFormError(
        f"{source.text_of(node)} at line {line} reads a running value in a form this reading "
        "does not follow (names, arithmetic and calls)"
    )


def _free(value: Sym) -> bool:
    """Whether a symbolic value reads no tracked name's start."""
    if value[0] == "start":
        return False
    if value[0] == "leaf":
        return True
    if value[0] == "call":
        return all(_free(a) for a in value[2])
    return _free(value[2]) and _free(value[3])


def _pair_update(values: dict[str, Sym], m: str, s: str) -> str | None:
    """The exponential of ``s' = s * exp(m - m') + exp(x - m')`` (either order of the sum and
    of the product), where ``m'`` is what ``m`` ends as and reads no ``s``; None otherwise."""
    new_max, new_sum = values[m], values[s]
    if _reads(new_max, s) or new_sum[0] != "bin" or new_sum[1] != "+":
        return None
    for rescaled, added in ((new_sum[2], new_sum[3]), (new_sum[3], new_sum[2])):
        if added[0] != "call" or added[1] not in EXPONENTIALS or len(added[2]) != 1:
            continue
        exponent = added[2][0]
        if not (exponent[0] == "bin" and exponent[1] == "-" and exponent[3] == new_max):
            continue
        if not _free(exponent[2]) or rescaled[0] != "bin" or rescaled[1] != "*":
            continue
        for start, factor in ((rescaled[2], rescaled[3]), (rescaled[3], rescaled[2])):
            if start != ("start", s) or factor[0] != "call" or factor[1] != added[1]:
                continue
            if factor[2] == (("bin", "-", ("start", m), new_max),):
                return str(added[1])
    return None


def _reads(value: Sym, name: str) -> bool:
    if value[0] == "start":
        return value[1] == name
    if value[0] == "leaf":
        return False
    if value[0] == "call":
        return any(_reads(a, name) for a in value[2])
    return _reads(value[2], name) or _reads(value[3], name)


def _plain_update(value: Sym, name: str) -> Literal["sum", "max", "min"] | None:
    """``a + e``, ``e + a`` or ``a - e`` (a sum), ``fmaxf(a, e)`` or ``fminf(a, e)`` (either
    order), ``e`` reading no tracked name."""
    start = ("start", name)
    if value[0] == "bin" and value[1] in ("+", "-"):
        if value[2] == start and _free(value[3]):
            return "sum"
        if value[1] == "+" and value[3] == start and _free(value[2]):
            return "sum"
    if value[0] == "call" and value[1] in _MAX and len(value[2]) == 2:
        first, second = value[2]
        if (first == start and _free(second)) or (second == start and _free(first)):
            return "max" if _MAX[value[1]] == "max" else "min"
    return None
