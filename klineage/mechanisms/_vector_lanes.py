"""A vector's lane loop whose lanes split their flat index by a row length.

The canonical vector form of an element kernel (vectorized_access, ``form=kernel``) runs the
element code once per lane::

    for (int i_lane = 0; i_lane < 8; ++i_lane) {
      const int64_t i = i_vec * 8 + i_lane;
      const int64_t t = i / hidden;      // the row
      const int64_t h = i - t * hidden;  // the column (or i % hidden; either may come first)
      ...
    }

:func:`split_lanes` reads such a loop (what :mod:`klineage.mechanisms._vector_rows` rewrites):
the lane, the width, the row and the column it declares and the row length ``D``; NotInForm,
with the form it found, for any other loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import MULTIPLICATIVE, operand
from klineage.cuda.facts import INTEGER_TYPES
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    binary_operands,
    identifier_names,
    integer_literal,
    statements,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    form_text,
    index_declaration,
    is_side_effect_free,
    normalize_type,
)

__all__ = ["PRAGMA", "SplitLanes", "is_pragma", "split_lanes"]

_NEEDED = (
    "a lane loop `for (int i_lane = 0; i_lane < W; ++i_lane)` of the canonical vector form "
    "whose body starts `const T i = i_vec * W + i_lane; T t = i / D; T h = i - t * D;` (or `i % "
    "D`), with D free of side effects and written nowhere in the kernel, and t, h and i not "
    "written in the lane"
)
PRAGMA = "#pragma unroll"


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class SplitLanes:
    """A lane loop whose lanes split their index into a row, a column or both."""

    start: int
    """Where the loop's text starts: its ``#pragma unroll``, or the loop when it has none."""
    loop: Node
    width: int
    lane: str
    vec: str
    index_line: str | None
    """The lane's index declaration as written (``const int64_t i = i_vec * 8 + i_lane;``);
    None when the lane's code after the split does not read the index."""
    row: tuple[str, str] | None
    """(what declares it, name) of the row ``i / D``, when the lane splits one off."""
    column: tuple[str, str] | None
    """(what declares it, name) of the column ``i % D`` or ``i - t * D``."""
    length: str
    """The row length ``D`` as an operand of ``/`` and ``%`` (parenthesized when needed)."""
    rest: str
    """The lane's code after the split, as written."""
    after: tuple[Node, ...]
    """Its statements."""


def _single_declaration(source: ParsedSource, node: Node) -> tuple[str, str, Node] | None:
    """(what declares it, name, value) of ``T name = value;``."""
    declared = index_declaration(source, node)
    return (declared[1], declared[0], declared[2]) if declared is not None else None


def _lane_header(source: ParsedSource, loop: Node) -> tuple[str, int]:
    """(lane, W) of ``for (int lane = 0; lane < W; ++lane)``."""
    init = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    declared = _single_declaration(source, init) if init is not None else None
    if declared is None or source.text_of(declared[2]) != "0" or condition is None:
        raise _refuse(f"`{source.snippet(loop, 50)}`, not a lane loop")
    lane = declared[1]
    compared = binary_operands(strip_parens(condition), "<")
    width = integer_literal(source.text_of(compared[1])) if compared is not None else None
    steps = {f"++{lane}", f"{lane}++"}
    if (
        compared is None
        or source.text_of(compared[0]) != lane
        or width is None
        or update is None
        or "".join(source.text_of(update).split()) not in steps
    ):
        raise _refuse(f"`{source.snippet(loop, 50)}`, not a lane loop over a literal width")
    return lane, width


def _lane_index(source: ParsedSource, node: Node, lane: str, width: int) -> tuple[str, str]:
    """(index, vec) of the lane's ``const T i = vec * W + lane;``."""
    declared = _single_declaration(source, node)
    sides = binary_operands(strip_parens(declared[2]), "+") if declared is not None else None
    product = binary_operands(strip_parens(sides[0]), "*") if sides is not None else None
    if (
        declared is None
        or sides is None
        or product is None
        or source.text_of(sides[1]) != lane
        or source.text_of(product[1]) != str(width)
        or strip_parens(product[0]).type != "identifier"
    ):
        raise _refuse(f"a lane index `{source.snippet(node, 50)}`, not `i_vec * W + lane`")
    return declared[1], source.text_of(strip_parens(product[0]))


def _split_part(
    source: ParsedSource, node: Node, index: str, row: str | None
) -> tuple[str, str, str, Node] | None:
    """("row" or "column", what declares it, name, D) of a declaration splitting ``index``:
    ``i / D``, ``i % D`` or ``i - row * D`` (``row`` declared before it)."""
    declared = _single_declaration(source, node)
    if declared is None or normalize_type(declared[0]) not in INTEGER_TYPES:
        return None  # a float "row" is no row: its lanes need not share it
    kind, name, value = declared
    for operator, part in (("/", "row"), ("%", "column")):
        sides = binary_operands(strip_parens(value), operator)
        if sides is not None and source.text_of(strip_parens(sides[0])) == index:
            return part, kind, name, sides[1]
    difference = binary_operands(strip_parens(value), "-")
    if row is None or difference is None or source.text_of(strip_parens(difference[0])) != index:
        return None
    product = binary_operands(strip_parens(difference[1]), "*")
    if product is None:
        return None
    for own, other in (product, product[::-1]):
        if source.text_of(strip_parens(own)) == row:
            return "column", kind, name, other
    return None


def split_lanes(source: ParsedSource, loop: Node) -> SplitLanes:
    """The lane loop ``loop`` read as :class:`SplitLanes`; NotInForm when it is not one."""
    lane, width = _lane_header(source, loop)
    body = loop.child_by_field_name("body")
    parts = statements(body) if body is not None else []
    if body is None or len(parts) < 3:
        raise _refuse(f"`{source.snippet(loop, 50)}`, a lane loop without a row split")
    index, vec = _lane_index(source, parts[0], lane, width)
    found: dict[str, tuple[str, str]] = {}
    lengths: list[Node] = []
    for part in parts[1:3]:
        row = found["row"][1] if "row" in found else None
        split = _split_part(source, part, index, row)
        if split is None or split[0] in found:
            break
        found[split[0]] = (split[1], split[2])
        lengths.append(split[3])
    if not lengths:
        raise _refuse(f"a lane `{source.snippet(parts[1], 50)}`, not `t = {index} / D`")
    if len({form_text(source.text_of(strip_parens(n))) for n in lengths}) != 1:
        raise _refuse("a lane splitting its index by two different lengths")
    length = lengths[0]
    after = parts[1 + len(lengths) :]
    if not after:
        raise _refuse("a lane with nothing after its split")
    function = source.enclosing_function(loop)
    if function is None or function.body is None or not is_side_effect_free(source, length):
        raise _refuse("a row length with side effects")
    written = identifier_names(source, length) & assigned_names(source, function.body)
    if written:
        raise _refuse(f"a row length that reads {', '.join(sorted(written))}, written")
    names = {index} | {name for _, name in found.values()}
    taken = names & assigned_names(source, after)
    if taken:
        raise _refuse(f"a lane that writes {', '.join(sorted(taken))}")
    before = loop.prev_sibling
    start = before.start_byte if before is not None and is_pragma(source, before) else None
    used = any(index in identifier_names(source, part) for part in after)
    return SplitLanes(
        start=loop.start_byte if start is None else start,
        loop=loop,
        width=width,
        lane=lane,
        vec=vec,
        index_line=source.text_of(parts[0]) if used else None,
        row=found.get("row"),
        column=found.get("column"),
        length=operand(source, length, MULTIPLICATIVE + 1),
        rest=source.text_of((after[0].start_byte, after[-1].end_byte)),
        after=tuple(after),
    )


def is_pragma(source: ParsedSource, node: Node) -> bool:
    return node.type == "preproc_call" and source.text_of(node).strip() == PRAGMA
