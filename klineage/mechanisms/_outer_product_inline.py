"""Removing an outer product spread over helpers, through its inlined form.

When one helper fills the register arrays and another accumulates their products, both
called from the caller's reduction loop (``_outer_product_helpers`` finds the form), the loop
is read with the helpers' bodies written in place of the calls
(:func:`klineage.cuda.inline.inline_call`): that is the form ``_outer_product`` reads. The
removal is made there; the helpers no call reaches any more are deleted, and the helpers'
``static_assert`` checks go before the caller's statement holding the loop, so none is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.edit import apply_edits
from klineage.cuda.inline import callee_of, caller_names, inline_call
from klineage.cuda.source import Node, ParsedSource, within
from klineage.cuda.tree import (
    NotInForm,
    callee_name,
    declared_names,
    identifier_names,
)
from klineage.kernel import KernelSource
from klineage.mechanisms._outer_product import OuterProduct, read_caches, shape
from klineage.mechanisms._outer_product_helpers import HelperProduct
from klineage.mechanisms._outer_product_removal import removal
from klineage.mechanisms._tiles_util import column

NEEDED = (
    "one call of the helper, a statement in its caller's loop, whose turn holds only calls "
    "of helpers that fill registers from one expression each and this one"
)


def _loop_around(source: ParsedSource, statement: Node) -> Node:
    body = statement.parent
    loop = body.parent if body is not None else None
    if body is None or body.type != "compound_statement" or loop is None:
        raise NotInForm("a helper call that is not a statement of a loop's body", NEEDED)
    if loop.type != "for_statement":
        raise NotInForm(f"a helper call in a {loop.type.replace('_', ' ')}", NEEDED)
    return loop


def _top_statement(body: Node, node: Node) -> Node:
    """The statement of ``body`` (a function's) that holds ``node``."""
    current = node
    while current.parent is not None and current.parent != body:
        current = current.parent
    return current


def inlined(source: ParsedSource, helper: HelperProduct) -> tuple[str, int, set[str]]:
    """The source with the helper calls of the caller's loop written out, where that loop
    starts in it, and the helpers written out."""
    calls = [c for c in source.calls if callee_name(c.name) == helper.function.name]
    if len(calls) != 1:
        raise NotInForm(f"a helper {helper.function.name} called {len(calls)} times", NEEDED)
    statement = calls[0].node.parent
    caller = source.enclosing_function(calls[0].node)
    if statement is None or caller is None or caller.body is None:
        raise NotInForm("a helper call that is not a statement", NEEDED)
    loop = _loop_around(source, statement)
    body = loop.child_by_field_name("body")
    assert body is not None
    taken = caller_names(source, caller)
    indent = " " * (column(source, loop.start_byte) + 4)
    lines: list[str] = []
    asserts: list[str] = []
    helpers: set[str] = set()
    for item in body.named_children:
        if item.type == "expression_statement" and callee_of(source, item) is not None:
            written = inline_call(source, item, taken)
            lines += written.statements
            asserts += written.asserts
            helpers.add(written.helper.name)
        else:
            lines.append(source.text_of(item))
    top = _top_statement(caller.body, loop)
    inside = identifier_names(source, top) & declared_names(source, top)
    for check in asserts:
        late = {n for n in inside if n in _names(check)}
        if late:
            raise NotInForm(
                f"a helper check `{check}` on {', '.join(sorted(late))}, declared in the loop",
                NEEDED,
            )
    top_indent = " " * column(source, top.start_byte)
    hoisted = "".join(f"{a}\n{top_indent}" for a in asserts)
    turn = "".join(f"\n{indent}{_indented(line, indent)}" for line in lines)
    text = (
        source.text_of((0, top.start_byte))
        + hoisted
        + source.text_of((top.start_byte, body.start_byte))
        + "{"
        + turn
        + f"\n{indent[:-4]}}}"
        + source.text_of((body.end_byte, len(source.data)))
    )
    return text, loop.start_byte + len(hoisted.encode()), helpers


def _names(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_]\w*", text))


def _indented(text: str, indent: str) -> str:
    return text.replace("\n", "\n" + indent)


@dataclass(frozen=True)
class Inlining:
    """An outer product read in the file with its caller's loop inlined."""

    source: ParsedSource
    """The file with the loop's helper calls written out."""
    product: OuterProduct
    """The product there, its turn read (:func:`read_caches`)."""
    helpers: frozenset[str]
    """The helpers written out."""


def inlined_product(source: ParsedSource, helper: HelperProduct) -> Inlining:
    """The outer product a helper computes, read in its caller's inlined loop; NotInForm
    where the calls cannot be written out or their bodies are not the form read."""
    text, start, helpers = inlined(source, helper)
    written = KernelSource(text, name=source.kernel.name).parsed
    for statement in written.iter_nodes("expression_statement"):
        function = written.enclosing_function(statement)
        if function is None or function.body is None:
            continue
        found = shape(written, function, statement)
        if found is not None and found.reductions[-1].start_byte == start:
            read_caches(written, found)
            return Inlining(written, found, frozenset(helpers))
    raise NotInForm(
        f"helpers whose bodies, written in the loop at line {source.line_of(start)}, hold no "
        "outer-product accumulation",
        NEEDED,
    )


def removed_through_inlining(source: ParsedSource, helper: HelperProduct) -> str:
    """The file with the outer product interchanged in the caller's inlined loop and the
    helpers it no longer calls deleted."""
    inlining = inlined_product(source, helper)
    result = apply_edits(inlining.source, removal(inlining.source, inlining.product)).parsed
    return _without_uncalled(result, inlining.helpers)


def _without_uncalled(source: ParsedSource, names: frozenset[str]) -> str:
    """The text with the definitions of ``names`` that nothing names any more deleted."""
    edits = []
    for name in sorted(names):
        function = source.function(name)
        if function is None:
            continue
        named = [
            n
            for n in source.iter_nodes("identifier")
            if source.text_of(n) == name and not within(n, function.outer)
        ]
        if not named:
            edits.append(source.deletion(function.outer, whole_line=True))
    return apply_edits(source, edits).text
