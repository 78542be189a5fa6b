"""Applying online softmax to the two-pass form its pair removal writes.

The removal of a (max, sum) pair (:func:`klineage.mechanisms.online_softmax._pair_rewrite`)
writes::

    float row_max;
    {  // first pass: the maximum (the sums stay 0)
      <the accumulating statements, each push chain as acc.m = fmaxf(fmaxf(acc.m, a), b)>
      <the combine statements>
      row_max = acc.m;
    }
    [__syncthreads();  // the combine's shared memory is used again]
    acc = MaxSum{row_max, 0.0f};  // second pass: the sum of exponentials
    <the same statements, each as acc.s = acc.s + expf(a - row_max) + expf(b - row_max)>
    <the combine statements>

Applying reads the pushed elements back from the second pass (in order) and writes the
single pass: ``acc = push(push(acc, a), b)`` in place of the sums, then the combine, with the
first pass, the barrier and the reset gone. Only this form is recognized: it is the one
klineage writes, so a round trip can restore the expert.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import statement_after
from klineage.mechanisms._reductions_util import (
    call_name,
    inside,
    local_splice,
    named_statements,
    strip_parens,
)

FIRST_PASS = "// first pass: the maximum"
_DECLARATION = re.compile(r"float\s+(\w+)\s*;")


def _normal(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class TwoPassPair:
    """The two-pass form of a (max, sum) pair, as the removal writes it."""

    declaration: Node
    """``float row_max;``: where the form starts."""
    row_max: str
    name: str
    push: str
    sums: list[Node]
    """The second pass's statements (before the combine's copy)."""
    end: int
    """Where the form ends: after the combine's second copy, or after the sums."""


def two_pass_pair(
    source: ParsedSource, declaration: Node, pushes: dict[str, tuple[str, str, str]]
) -> TwoPassPair | None:
    """The form starting at ``declaration``; ``pushes`` maps a pair struct to its (push
    function, max field, sum field)."""
    found = _DECLARATION.fullmatch(_normal(source.text_of(declaration)))
    block = statement_after(declaration)
    if found is None or block is None or block.type != "compound_statement":
        return None
    if not any(c.type == "comment" and FIRST_PASS in source.text_of(c) for c in block.children):
        return None
    row_max = found.group(1)
    inner = named_statements(block)
    last = re.fullmatch(rf"{row_max} = (\w+)\.(\w+);", _normal(source.text_of(inner[-1])))
    if last is None:
        return None
    name, max_field = last.groups()
    statement = statement_after(block)
    if statement is not None and _normal(source.text_of(statement)) == "__syncthreads();":
        statement = statement_after(statement)
    if statement is None:
        return None
    reset = re.fullmatch(rf"{name} = (\w+)\{{.*\}};", _normal(source.text_of(statement)))
    if reset is None or reset.group(1) not in pushes:
        return None
    push, pair_max, sum_field = pushes[reset.group(1)]
    if pair_max != max_field:
        return None
    maxes = 0
    while maxes < len(inner) - 1 and f"{name}.{max_field} = " in source.text_of(inner[maxes]):
        maxes += 1
    combine = inner[maxes:-1]
    following: list[Node] = []
    node = statement_after(statement)
    while node is not None and len(following) < maxes + len(combine):
        following.append(node)
        node = statement_after(node)
    sums, copy = following[:maxes], following[maxes:]
    if not maxes or len(sums) != maxes:
        return None
    if [_normal(source.text_of(s)) for s in copy] != [_normal(source.text_of(s)) for s in combine]:
        return None
    if not all(f"{name}.{sum_field} = {name}.{sum_field} + " in source.text_of(s) for s in sums):
        return None
    end = (copy or sums)[-1].end_byte
    return TwoPassPair(declaration, row_max, name, push, sums, end)


def single_pass(source: ParsedSource, form: TwoPassPair) -> list[Edit]:
    """The edit that writes ``form`` back as one pass of push chains."""
    edits = []
    for statement in form.sums:
        for assignment in inside(source, statement, "assignment_expression"):
            left = assignment.child_by_field_name("left")
            right = assignment.child_by_field_name("right")
            if left is None or right is None or not source.text_of(left).startswith(form.name):
                continue
            elements = []
            for call in inside(source, right, "call_expression"):
                arguments = call.child_by_field_name("arguments")
                inner = arguments.named_children if arguments is not None else []
                if len(inner) != 1 or inner[0].type != "binary_expression":
                    continue
                difference = inner[0]
                subtracted = difference.child_by_field_name("right")
                element = difference.child_by_field_name("left")
                if subtracted is None or element is None or call_name(source, call) is None:
                    continue
                if source.text_of(subtracted) == form.row_max:
                    elements.append(source.text_of(strip_parens(element)))
            chain = form.name
            for element in elements:
                chain = f"{form.push}({chain}, {element})"
            edits.append(Edit.replace(assignment, f"{form.name} = {chain}"))
    text = local_splice(source, form.sums[0].start_byte, form.end, edits)
    return [Edit(form.declaration.start_byte, form.end, text)]
