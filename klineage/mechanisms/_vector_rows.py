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
read once, and what they read at ``P[X + h]`` the first lane loads as one vector
(:mod:`klineage.mechanisms._vector_row_loads`). Forward and back: apply writes this from a
lane loop of the canonical vector form whose body starts with the split
(:mod:`klineage.mechanisms._vector_lanes`); remove writes the lane loop back (the ``else``
branch), and a form it would not write again is not taken for this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm, fresh_name
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import form_text, names_in_function, shift, unshift
from klineage.mechanisms._vector_lanes import PRAGMA, SplitLanes, is_pragma, split_lanes
from klineage.mechanisms._vector_row_loads import with_row_loads

__all__ = ["RowsForm", "rows_forms", "rows_text"]


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
    rest = lanes.rest
    if lanes.column is not None:
        registers, rest = with_row_loads(source, function, lanes, start)
        once += registers
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
            f"{inner}{shift(rest, 2)}",
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
        if len(inner) > 2 or (len(inner) == 2 and not is_pragma(source, inner[0])):
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
