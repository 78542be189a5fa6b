"""Row loops of a thread-per-row kernel that move a packed vector a step, and walks back down
the row: the forward twins of the lane-strided forms a group-per-row removal rewrites
(``_GroupWalker.split_strided_loops``).

- packed step: ``for (c = 0; c < n; c += V)`` where every use of ``c`` in the body is the
  address ``p + c`` of a vector load or store moving ``V`` elements of ``*p``, through a
  helper (``load128(x + c)``, ``store128(y + c, v)``) or a cast (``*reinterpret_cast<const
  float4*>(x + c)``): each iteration owns its ``V`` elements, so
  the loop spreads over a group as ``c = rank * V; c += size * V``;
- split start: the start declared right before the loop, ``T c = 0; for (; c < n; c += s)``;
- walk back: after a split loop, ``c -= s; for (; c >= 0; c -= s)`` visits the positions the
  loop visited, in reverse. Spread over a group each becomes ``size * s``; a lane's walk stops
  elsewhere than a thread's, so nothing else may use ``c`` after the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.vectors import dereferenced_cast
from klineage.cuda.source import Function, Loop, Node, ParsedSource, strip_parens
from klineage.cuda.tree import operator_of, statement_after, statement_before, walk
from klineage.mechanisms._reductions_util import arguments_of, call_name, fold, inside

__all__ = [
    "PointerOffset",
    "StepFormError",
    "VectorAccess",
    "constant_value",
    "packed_deref",
    "packed_step",
    "pointer_offset",
    "split_start",
    "steps_down",
    "sum_terms",
    "vector_access",
    "walk_back",
]


class StepFormError(Exception):
    """A row loop looks packed or walked back but is in none of these forms (the message
    says where it differs)."""


@dataclass(frozen=True)
class PointerOffset:
    """An address ``p + index``: the pointer's name and the index's terms as written (one for
    ``p + i``, several for ``p + row * n + i``, which C adds up in the same order)."""

    pointer: str
    terms: tuple[Node, ...]

    def text(self, source: ParsedSource) -> str:
        """The index as one sum, each term's spacing normalized."""
        return " + ".join(" ".join(source.text_of(t).split()) for t in self.terms)


@dataclass(frozen=True)
class VectorAccess:
    """A call to a packed vector load or store helper at ``pointer + index``."""

    kind: Literal["load", "store"]
    address: Node
    offset: PointerOffset
    elements: int | None
    """How many elements of ``*pointer`` it moves, when the pointer's type is known."""
    value: Node | None
    """The stored value (a store with one other argument)."""

    @property
    def pointer(self) -> str:
        return self.offset.pointer


def pointer_offset(source: ParsedSource, node: Node) -> PointerOffset | None:
    """The address ``p + index`` (or ``index + p``, or ``p + a + b``: any sum with one term
    ``p``) with ``p`` a name its function declares a pointer, which the index does not read;
    None for anything else."""
    function = source.enclosing_function(node)
    if node.type != "binary_expression" or operator_of(node) != "+" or function is None:
        return None
    types = source.local_types(function)
    terms = sum_terms(node)
    bases = [t for t in terms if t.type == "identifier" and "*" in types.get(source.text_of(t), "")]
    if len(bases) != 1:
        return None
    name = source.text_of(bases[0])
    index = tuple(t for t in terms if t is not bases[0])
    if any(name == source.text_of(n) for t in index for n in inside(source, t, "identifier")):
        return None
    return PointerOffset(name, index)


def sum_terms(node: Node) -> list[Node]:
    """The terms of a sum, through parentheses, left to right."""
    node = strip_parens(node)
    if node.type == "binary_expression" and operator_of(node) == "+":
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is not None and right is not None:
            return sum_terms(left) + sum_terms(right)
    return [node]


def vector_access(source: ParsedSource, call: Node) -> VectorAccess | None:
    """The vector load or store a call is (a helper of the file that casts its pointer
    parameter to a wide type), at an address ``p + index``; None for any other call."""
    if call.type != "call_expression":
        return None
    helper = analysis(source).vectors.helpers.get(call_name(source, call) or "")
    arguments = arguments_of(call)
    if helper is None or helper.pointer_param >= len(arguments):
        return None
    address = strip_parens(arguments[helper.pointer_param])
    offset = pointer_offset(source, address)
    function = source.enclosing_function(call)
    if offset is None or function is None:
        return None
    pointee = source.local_types(function).get(offset.pointer, "")
    size = analysis(source).vectors.element_bytes(pointee)
    elements = helper.bytes // size if size else None
    others = [a for i, a in enumerate(arguments) if i != helper.pointer_param]
    value = others[0] if helper.kind == "store" and len(others) == 1 else None
    return VectorAccess(helper.kind, address, offset, elements, value)


def packed_deref(source: ParsedSource, node: Node) -> VectorAccess | None:
    """The access ``*reinterpret_cast<V*>(p + index)`` (or ``*(V*)(p + index)``, or ``[0]``
    of the cast) with ``V`` a packed vector type, as a load (a store when assigned to)."""
    node = strip_parens(node)
    cast = dereferenced_cast(source, node)
    if cast is None:
        return None
    target, operand = cast
    vectors = analysis(source).vectors
    packed = vectors.packed(target.rstrip("*").strip())
    offset = pointer_offset(source, operand)
    function = source.enclosing_function(node)
    if packed is None or offset is None or function is None:
        return None
    size = vectors.element_bytes(source.local_types(function).get(offset.pointer, ""))
    parent = node.parent
    stored = (
        parent is not None
        and parent.type == "assignment_expression"
        and parent.child_by_field_name("left") == node
    )
    kind: Literal["load", "store"] = "store" if stored else "load"
    value = parent.child_by_field_name("right") if stored and parent is not None else None
    elements = packed.bytes // size if size else None
    return VectorAccess(kind, operand, offset, elements, value)


def constant_value(source: ParsedSource, kernel: Function, node: Node) -> int | None:
    """A compile-time integer: folded, or a member constant (``x128::size``) the analysis
    knows; None otherwise."""
    value = fold(source, node)
    if value is None:  # a member constant (`x128::size`) the analysis knows
        value = analysis(source).indices(kernel).form(node).value
    return value


def _step(source: ParsedSource, update: Node | None, variable: str, op: str) -> Node | None:
    """``s`` of ``variable op s``."""
    update = strip_parens(update) if update is not None else None
    if update is None or update.type != "assignment_expression" or operator_of(update) != op:
        return None
    left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
    if left is None or right is None or source.text_of(left) != variable:
        return None
    return right


def packed_step(
    source: ParsedSource, kernel: Function, loop: Loop, variable: str, op: str = "+="
) -> Node | None:
    """The ``V`` of a row loop stepping ``c += V`` (``op`` ``-=``: a walk back) by a positive
    compile-time integer, whose body uses ``c`` only as the address ``p + c`` of packed loads
    and stores of ``V`` elements (so iterations own disjoint elements); None when no packed
    access is at ``c`` (another form, if any, applies). :class:`StepFormError` when one is,
    and ``c`` is used some other way too."""
    unit = _step(source, loop.update, variable, op)
    value = constant_value(source, kernel, unit) if unit is not None else None
    if unit is None or value is None or value < 2 or loop.body is None:
        return None
    addresses = []
    for call in inside(
        source, loop.body, "call_expression", "pointer_expression", "subscript_expression"
    ):
        access = vector_access(source, call) or packed_deref(source, call)
        if access is not None and access.offset.text(source) == variable:
            if access.elements != value:
                raise StepFormError(
                    f"{source.text_of(call)} at line {source.line_of(call.start_byte)} moves "
                    f"{access.elements or 'an unknown number of'} elements a call, not the "
                    f"loop's step {source.text_of(unit)}"
                )
            addresses.extend(access.offset.terms)
    if not addresses:
        return None
    for node in inside(source, loop.body, "identifier"):
        if source.text_of(node) == variable and node not in addresses:
            raise StepFormError(
                f"{variable} at line {source.line_of(node.start_byte)} is not the address of a "
                f"packed load or store, so the loop's step {source.text_of(unit)} is not one "
                "packed vector an iteration"
            )
    return unit


def _names(source: ParsedSource, node: Node, name: str) -> bool:
    return any(n.type == "identifier" and source.text_of(n) == name for n in walk(node))


def steps_down(source: ParsedSource, node: Node | None, name: str, step: str) -> bool:
    """``name -= step`` (``--name``, ``name--`` for a step of 1)."""
    node = strip_parens(node) if node is not None else None
    if node is None:
        return False
    if step == "1" and "".join(source.text_of(node).split()) in (f"--{name}", f"{name}--"):
        return True
    down = _step(source, node, name, "-=")
    return down is not None and " ".join(source.text_of(down).split()) == step


def walk_back(
    source: ParsedSource,
    up: Node,
    name: str,
    moves_down: Callable[[Node | None], bool],
    step: str,
) -> tuple[Node, Node] | None:
    """After a row loop ``up`` whose ``name`` outlives it: (the ``name -= step`` expression,
    the loop ``for (; name >= 0; name -= step)`` right after it, each move down accepted by
    ``moves_down``) when that is the only later use of ``name``; None when nothing uses it
    later. :class:`StepFormError` otherwise (``step`` as the message writes it)."""
    later = []
    node = statement_after(up)
    while node is not None:
        later.append(node)
        node = statement_after(node)
    uses = [i for i, statement in enumerate(later) if _names(source, statement, name)]
    if not uses:
        return None
    adjust = later[uses[0]]
    back = later[uses[0] + 1] if uses[0] + 1 < len(later) else None
    move = adjust.named_children[0] if adjust.type == "expression_statement" else None
    test = back.child_by_field_name("condition") if back is not None else None
    test = strip_parens(test) if test is not None else None
    left = test.child_by_field_name("left") if test is not None else None
    if (
        back is None
        or back.type != "for_statement"
        or back.child_by_field_name("initializer") is not None
        or test is None
        or left is None
        or operator_of(test) != ">="
        or source.text_of(left) != name
        or fold(source, test.child_by_field_name("right")) != 0
        or not moves_down(move)
        or not moves_down(back.child_by_field_name("update"))
        or any(_names(source, statement, name) for statement in later[uses[0] + 2 :])
    ):
        raise StepFormError(
            f"{name} at line {source.line_of(adjust.start_byte)} is used after the loop at line "
            f"{source.line_of(up.start_byte)}, where a lane's walk stops elsewhere than a "
            f"thread's; this rule needs only `{name} -= {step}; for (; {name} >= 0; {name} -= "
            f"{step})` there"
        )
    assert move is not None
    return move, back


def split_start(source: ParsedSource, loop: Node, name: str) -> Node | None:
    """The ``T name = start;`` declaration right before a loop with no initializer."""
    before = statement_before(loop)
    if before is None or before.type != "declaration":
        return None
    declarators = before.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    declared = declarators[0].child_by_field_name("declarator")
    if declared is None or source.text_of(declared) != name:
        return None
    return declarators[0].child_by_field_name("value")
