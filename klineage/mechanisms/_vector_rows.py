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
read once. A read the lanes make at ``P[X + h]`` (``P`` a pointer to const data, ``X`` the same
in every lane: the row, or a value the lanes computed alike from it, such as ``id * hidden``
after ``id = ids[t]``) covers W consecutive elements: the first lane loads them as one vector
(an element at a time where the address is not aligned, checked on the device) and each lane
takes its own from it. Only reads every lane makes, after code whose branches every lane
takes alike, are taken. Forward and back: apply writes this from a lane loop of the canonical vector
form whose body starts with the split; remove writes the lane loop back (the ``else``
branch), and a form it would not write again is not taken for this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import MULTIPLICATIVE, operand
from klineage.cuda.facts import INTEGER_TYPES
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    binary_operands,
    declared_names,
    fresh_name,
    identifier_names,
    integer_literal,
    statements,
    strip_parens,
)
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    ELEMENT_SIZES,
    form_text,
    index_declaration,
    is_side_effect_free,
    names_in_function,
    normalize_type,
    shift,
    splice,
    unshift,
    vector_for,
    walk,
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
        after=tuple(after),
    )


def _is_pragma(source: ParsedSource, node: Node) -> bool:
    return node.type == "preproc_call" and source.text_of(node).strip() == PRAGMA


@dataclass(frozen=True)
class RowLoad:
    """A read ``P[X + h]`` every lane makes, ``X`` the same in every lane."""

    node: Node
    """The subscript."""
    statement: Node
    """The lane's top-level statement that holds it."""
    pointer: str
    element: str
    offset: str | None
    """``X`` as written; None for ``P[h]``."""


def _const_pointers(source: ParsedSource, function: Function) -> dict[str, str]:
    """Pointer parameters to const data the kernel never reassigns: name -> element type."""
    assert function.body is not None
    written = assigned_names(source, function.body)
    return {
        param.name: param.base_type
        for param in function.params
        if param.name and param.pointer_depth == 1 and param.is_const and param.name not in written
    }


def _lane_invariant(
    source: ParsedSource, node: Node, invariant: set[str], pointers: dict[str, str]
) -> bool:
    """Whether ``node`` gives the same value in every lane: free of side effects, reading only
    lane-invariant names and const data."""
    if not is_side_effect_free(source, node):
        return False
    callees = {
        c.child_by_field_name("function").id  # type: ignore[union-attr]
        for c in walk(node)
        if c.type == "call_expression" and c.child_by_field_name("function") is not None
    }
    for part in walk(node):
        if part.type == "identifier" and part.id not in callees:
            if source.text_of(part) not in invariant and source.text_of(part) not in pointers:
                return False
        elif part.type == "pointer_expression":
            return False  # a dereference or an address: not followed here
        elif part.type == "subscript_expression":
            target = part.child_by_field_name("argument")
            if target is None or source.text_of(target) not in pointers:
                return False
    return True


def _unconditional(node: Node, statement: Node) -> bool:
    """Whether ``node`` is evaluated whenever ``statement`` is (no ``?:``, ``&&`` or ``||``
    between them)."""
    current = node.parent
    while current is not None and current != statement:
        if current.type in ("conditional_expression", "lambda_expression"):
            return False
        if current.type == "binary_expression":
            operator = current.child_by_field_name("operator")
            if operator is not None and operator.type in ("&&", "||"):
                return False
        current = current.parent
    return current == statement


def _flat(node: Node) -> bool:
    """An ``if`` whose branches hold no further branch or loop: its jumps follow its condition."""
    nested = (
        "if_statement",
        "for_statement",
        "while_statement",
        "do_statement",
        "switch_statement",
    )
    return not any(n.type in nested for n in walk(node) if n != node)


def row_loads(source: ParsedSource, function: Function, lanes: SplitLanes) -> list[RowLoad]:
    """The reads at ``P[X + h]`` that every lane makes with the same ``X`` (h the column)."""
    assert lanes.column is not None and function.body is not None
    body = lanes.loop.child_by_field_name("body")
    assert body is not None
    pointers = _const_pointers(source, function)
    inside = declared_names(source, body) | {lanes.lane}
    moving = assigned_names(source, lanes.loop) | inside
    addressed = {
        source.text_of(n.child_by_field_name("argument") or n)
        for n in walk(lanes.loop)
        if n.type == "pointer_expression" and source.text_of(n).startswith("&")
    }
    invariant = {
        source.text_of(n)
        for n in walk(function.node)
        if n.type == "identifier" and source.text_of(n) not in moving | addressed
    }
    if lanes.row is not None:
        invariant.add(lanes.row[1])  # split once, before the lanes
    column = lanes.column[1]
    found: list[RowLoad] = []
    for statement in lanes.after:
        if statement.type in ("declaration", "expression_statement"):
            found += _loads_in(source, statement, column, invariant, pointers)
        if statement.type == "declaration":
            declared = index_declaration(source, statement)
            if (
                declared is not None
                and declared[0] not in assigned_names(source, lanes.loop)
                and _lane_invariant(source, declared[2], invariant, pointers)
            ):
                invariant.add(declared[0])
        elif statement.type == "if_statement":
            condition = statement.child_by_field_name("condition")
            if condition is None or not _flat(statement):
                break
            if not _lane_invariant(source, condition, invariant, pointers):
                break
        elif statement.type != "expression_statement":
            break  # a loop or a jump: the lanes may part here
    return found


def _loads_in(
    source: ParsedSource,
    statement: Node,
    column: str,
    invariant: set[str],
    pointers: dict[str, str],
) -> list[RowLoad]:
    found = []
    for node in walk(statement):
        target = (
            node.child_by_field_name("argument") if node.type == "subscript_expression" else None
        )
        indices = node.child_by_field_name("indices") if target is not None else None
        values = [c for c in indices.named_children if c.type != "comment"] if indices else []
        if target is None or len(values) != 1 or source.text_of(target) not in pointers:
            continue
        index = values[0]
        if not _unconditional(node, statement):
            continue
        index = strip_parens(index)
        offset: Node | None = None
        if source.text_of(index) != column:
            sides = binary_operands(index, "+")
            if sides is None:
                continue
            named = [side for side in sides if source.text_of(strip_parens(side)) == column]
            if len(named) != 1:
                continue
            offset = sides[1] if named[0] == sides[0] else sides[0]
            if not _lane_invariant(source, offset, invariant, pointers):
                continue
        pointer = source.text_of(target)
        element = normalize_type(pointers[pointer])
        offset_text = source.text_of(offset) if offset is not None else None
        found.append(RowLoad(node, statement, pointer, element, offset_text))
    return found


def _registers(
    source: ParsedSource, function: Function, loads: list[RowLoad], width: int
) -> dict[tuple[str, str | None], tuple[str, str]]:
    """A register per distinct read that a vector type holds: (pointer, offset) -> (name,
    vector type)."""
    taken = names_in_function(source, function)
    registers: dict[tuple[str, str | None], tuple[str, str]] = {}
    for load in loads:
        key = (load.pointer, load.offset)
        vector = vector_for(load.element, width)
        if vector is None or key in registers:
            continue
        name = fresh_name(taken, f"{load.pointer}_row")
        taken.add(name)
        registers[key] = (name, vector)
    return registers


def _first_lane_load(
    load: RowLoad, register: tuple[str, str], lanes: SplitLanes, first: str, taken: set[str]
) -> list[str]:
    """The lines that fill ``register`` in the first lane (relative indentation)."""
    name, vector = register
    at = fresh_name(taken, f"{name}_at")
    k = fresh_name(taken | {at}, "k")
    taken |= {at, k}
    width, element = lanes.width, load.element
    where = f"{load.offset} + {first}" if load.offset is not None else first
    return [
        f"if ({lanes.lane} == 0) {{  // the {width} elements of {load.pointer} the lanes read, "
        "loaded once",
        f"  const {element}* {at} = &{load.pointer}[{where}];",
        f"  if (reinterpret_cast<size_t>({at}) % {ELEMENT_SIZES[element] * width} == 0) {{",
        f"    {name} = *reinterpret_cast<const {vector}*>({at});",
        "  } else {",
        f"    for (int {k} = 0; {k} < {width}; ++{k}) reinterpret_cast<{element}*>(&{name})[{k}] "
        f"= {at}[{k}];",
        "  }",
        "}",
    ]


def _rest_with_loads(
    source: ParsedSource,
    function: Function,
    lanes: SplitLanes,
    loads: list[RowLoad],
    registers: dict[tuple[str, str | None], tuple[str, str]],
    first: str,
) -> str:
    """The lane's code after the split with each row read taken from its register, the
    register filled by the first lane before the statement that first reads it."""
    taken = names_in_function(source, function) | {n for n, _ in registers.values()}
    filled: set[tuple[str, str | None]] = set()
    edits: list[tuple[Node, str]] = []
    for statement in lanes.after:
        mine = [
            load
            for load in loads
            if load.statement == statement and (load.pointer, load.offset) in registers
        ]
        if not mine:
            continue
        indent = source.indent_of(statement.start_byte)
        lines: list[str] = []
        for load in mine:
            key = (load.pointer, load.offset)
            if key not in filled:
                filled.add(key)
                lines += _first_lane_load(load, registers[key], lanes, first, taken)
        taken_from = []
        for load in mine:
            register = registers[(load.pointer, load.offset)][0]
            element = f"reinterpret_cast<const {load.element}*>(&{register})[{lanes.lane}]"
            taken_from.append((load.node, element))
        text = splice(source, statement.start_byte, statement.end_byte, taken_from)
        edits.append(
            (
                statement,
                "\n".join(lines[:1] + [indent + line for line in lines[1:]] + [indent + text]),
            )
        )
    return splice(source, lanes.after[0].start_byte, lanes.after[-1].end_byte, edits)


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
        loads = row_loads(source, function, lanes)
        registers = _registers(source, function, loads, width)
        once += [f"{vector} {name};" for name, vector in registers.values()]
        if registers:
            rest = _rest_with_loads(source, function, lanes, loads, registers, start)
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
