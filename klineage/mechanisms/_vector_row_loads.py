"""Reads every lane of a vector makes at ``P[X + h]``, loaded once by the first lane.

In the rows form (:mod:`klineage.mechanisms._vector_rows`) a vector's W lanes share one row
and their columns ``h`` are consecutive. A read ``P[X + h]`` (``P`` a pointer to const data,
``X`` the same in every lane: the row, or a value the lanes computed alike from it, such as
``id * hidden`` after ``id = ids[t]``) then covers W consecutive elements: the first lane
loads them as one vector (an element at a time where the address is not aligned, checked on
the device) and each lane takes its own from it. Only reads every lane makes are taken: not
under ``?:``, ``&&`` or ``||``, and not after a branch or loop the lanes may take apart (an
``if`` on lane-invariant values with no branch inside keeps them together).
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    assigned_names,
    binary_operands,
    declared_names,
    evaluated_whenever,
    fresh_name,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    ELEMENT_SIZES,
    index_declaration,
    is_side_effect_free,
    names_in_function,
    normalize_type,
    splice,
    vector_for,
    walk,
)
from klineage.mechanisms._vector_lanes import SplitLanes

__all__ = ["RowLoad", "row_loads", "with_row_loads"]


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
    called = [c.child_by_field_name("function") for c in walk(node) if c.type == "call_expression"]
    callees = {(c.start_byte, c.end_byte) for c in called if c is not None}  # names, not values
    for part in walk(node):
        if part.type == "identifier" and (part.start_byte, part.end_byte) not in callees:
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
    return evaluated_whenever(node, statement, ("conditional_expression", "lambda_expression"))


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


def with_row_loads(
    source: ParsedSource, function: Function, lanes: SplitLanes, first: str
) -> tuple[list[str], str]:
    """(the registers to declare before the lanes, the lane's code after the split with its
    row reads taken from them); no registers and the code as written when there is none.
    ``first`` names the vector's first column."""
    loads = row_loads(source, function, lanes)
    registers = _registers(source, function, loads, lanes.width)
    if not registers:
        return [], lanes.rest
    declared = [f"{vector} {name};" for name, vector in registers.values()]
    return declared, _rest_with_loads(source, function, lanes, loads, registers, first)
