"""A vector's lanes in one row: the row split of their index done once per vector.

Element kernels over a matrix split their flat index into a row and a column::

    const int64_t t = i / hidden;
    const int64_t h = i - t * hidden;    // or i % hidden

In the canonical vector form of such a kernel (vectorized_access, ``form=kernel``) every lane
of a vector repeats that split: W integer divisions a thread, and a 64-bit division is a
few dozen instructions, enough to make a copy kernel bound by its arithmetic. When the row
length is a multiple of W, the W consecutive elements of a vector lie in one row, so the
vector path splits the vector's first index once and steps the column by the lane (``form=
rows``); rows of other lengths keep the per-lane split, behind the same check::

    if (hidden % 8 == 0) {  // a vector's lanes share one row: split its first index once
      const int64_t t = i_vec * 8 / hidden;
      const int64_t h_first = i_vec * 8 - t * hidden;
      for (int i_lane = 0; i_lane < 8; ++i_lane) {
        const int64_t i = i_vec * 8 + i_lane;
        const int64_t h = h_first + i_lane;
        ...the lane's code...
      }
    } else {
      ...the lane loop as it was...
    }

The row is then the same in every lane, so what the lanes read through it (``ids[t]``) is
read once. Forward and back: apply writes this from a lane loop of the canonical vector
form whose body starts with the split; remove writes the lane loop back (the ``else``
branch), and a form it would not write again is not taken for this one.
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
    fresh_name,
    identifier_names,
    integer_literal,
    statements,
    strip_parens,
)
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    form_text,
    index_declaration,
    is_side_effect_free,
    names_in_function,
    normalize_type,
    shift,
    unshift,
)

__all__ = ["RowsForm", "SplitLanes", "rows_forms", "rows_text", "split_lanes"]

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
    start = before.start_byte if before is not None and _is_pragma(source, before) else None
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
    )


def _is_pragma(source: ParsedSource, node: Node) -> bool:
    return node.type == "preproc_call" and source.text_of(node).strip() == PRAGMA


def rows_text(source: ParsedSource, lanes: SplitLanes) -> str:
    """What replaces the lane loop (from its pragma): the loop split by row once under ``D %
    W == 0``, the loop as it was otherwise."""
    function = source.enclosing_function(lanes.loop)
    assert function is not None
    indent = source.indent_of(lanes.loop.start_byte)
    width, lane, vec, length = lanes.width, lanes.lane, lanes.vec, lanes.length
    first = f"{vec} * {width}"
    once = []  # the vector's split, before its lanes
    each = [lanes.index_line] if lanes.index_line else []  # a lane's, after its index
    if lanes.row is not None:
        once.append(f"{lanes.row[0]} {lanes.row[1]} = {first} / {length};")
    if lanes.column is not None:
        kind, column = lanes.column
        start = fresh_name(names_in_function(source, function), f"{column}_first")
        if lanes.row is not None:
            once.append(f"{kind} {start} = {first} - {lanes.row[1]} * {length};")
        else:
            once.append(f"{kind} {start} = {first} % {length};")
        each.append(f"{kind} {column} = {start} + {lane};")
    original = source.text_of((lanes.start, lanes.loop.end_byte))
    inner = indent + "    "
    return "\n".join(
        [
            f"if ({length} % {width} == 0) {{  // a vector's lanes share one row: split its "
            "first index once",
            *[f"{indent}  {line}" for line in once],
            f"{indent}  {PRAGMA}",
            f"{indent}  for (int {lane} = 0; {lane} < {width}; ++{lane}) {{",
            *[f"{inner}{line}" for line in each],
            f"{inner}{shift(lanes.rest, 2)}",
            f"{indent}  }}",
            f"{indent}}} else {{",
            f"{indent}  {shift(original, 2)}",
            f"{indent}}}",
        ]
    )


@dataclass(frozen=True)
class RowsForm:
    """A lane loop in the form :func:`rows_text` writes."""

    node: Node
    """The ``if`` statement."""
    width: int
    original: str
    """The lane loop it stands for (what removal writes in its place)."""


def rows_forms(source: ParsedSource) -> list[RowsForm]:
    """The lane loops of a file in the rows form, each recognized by writing it again from
    its ``else`` branch."""
    found = []
    for node in source.nodes("if_statement"):
        alternative = node.child_by_field_name("alternative")
        block = alternative.named_children[-1] if alternative is not None else None
        if block is None or block.type != "compound_statement":
            continue
        inner = [c for c in block.named_children if c.type != "comment"]
        if not inner or inner[-1].type != "for_statement":
            continue
        if len(inner) > 2 or (len(inner) == 2 and not _is_pragma(source, inner[0])):
            continue
        original = unshift(source.text_of((inner[0].start_byte, inner[-1].end_byte)), 2)
        if original is None:
            continue
        again = _written_again(source, node, original)
        if again is not None and form_text(again[0]) == form_text(source.text_of(node)):
            found.append(RowsForm(node, again[1], original))
    return found


def _written_again(source: ParsedSource, node: Node, original: str) -> tuple[str, int] | None:
    """(the rows form written from ``original`` put where ``node`` is, its width)."""
    start = node.start_byte
    data = source.data
    text = (data[:start] + original.encode("utf-8") + data[node.end_byte :]).decode("utf-8")
    temp = KernelSource(text, name=source.kernel.name).parsed
    loops = [
        n
        for n in temp.nodes("for_statement")
        if start <= n.start_byte < start + len(original.encode("utf-8"))
    ]
    if not loops:
        return None
    try:
        lanes = split_lanes(temp, loops[0])
    except NotInForm:
        return None
    if lanes.start != start:
        return None
    return rows_text(temp, lanes), lanes.width
