"""The canonical vector loops and kernels (what :mod:`._vector_loops` writes), recognized by
writing their scalar form again and comparing, so a removal is the exact inverse."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    Refused,
    binary,
    element_kernels,
    form_text,
    global_index,
    index_declaration,
    leaving_jumps,
    splice,
    statements,
    strip_parens,
    unshift,
)
from klineage.mechanisms._vector_loops import (
    checked_loop_text,
    element_plan,
    kernel_text,
    loop_nodes,
    loop_text,
    peeled_loop_text,
    scalar_loop,
)
from klineage.mechanisms._vector_plans import CHECK_ALIGNED, CHECK_PEELED, plan_vectorization
from klineage.mechanisms._vector_rows import RowsForm, rows_forms


def _regenerates(
    source: ParsedSource,
    region: tuple[int, int],
    scalar: str,
    write: Callable[[ParsedSource, int], str],
    expected: str | None = None,
) -> bool:
    """Whether putting ``scalar`` in ``region`` and vectorizing it again (``write`` on the
    new source, at the region's start) gives the region's text back (or ``expected``)."""
    start, end = region
    data = source.data
    text = (data[:start] + scalar.encode("utf-8") + data[end:]).decode("utf-8")
    temp = KernelSource(text, name=source.kernel.name).parsed
    if temp.errors and len(temp.errors) > len(source.errors):
        return False
    try:
        again = write(temp, start)
    except (Refused, AssertionError, StopIteration):
        return False
    return form_text(again) == form_text(source.text_of(region) if expected is None else expected)


@dataclass(frozen=True)
class VectorLoop:
    """A canonical vectorized loop: the vector loop, its tail, the width, the scalar loop."""

    vector: Node
    tail: Node
    width: int
    scalar: str
    guard: Node | None = None
    """The ``if`` testing alignment at run time around them, the scalar loop in its else (or,
    peeled, the statement holding the peel, its head loop, them)."""
    check: str = CHECK_ALIGNED
    """How `guard` handles alignment (:data:`CHECKS`)."""

    @property
    def region(self) -> tuple[int, int]:
        """What the removal replaces by the scalar loop."""
        if self.guard is not None:
            return self.guard.start_byte, self.guard.end_byte
        return self.vector.start_byte, self.tail.end_byte


def _width_of(source: ParsedSource, node: Node) -> int | None:
    sides = binary(strip_parens(node), "/")
    if sides is None or sides[1].type != "number_literal":
        return None
    text = source.text_of(sides[1])
    return int(text) if text.isdigit() else None


def _write_loop(width: int, check: str = "") -> Callable[[ParsedSource, int], str]:
    def write(temp: ParsedSource, start: int) -> str:
        node = next(n for n in temp.nodes("for_statement") if n.start_byte == start)
        loop = scalar_loop(temp, node)
        function = temp.enclosing_function(node)
        if loop is None or function is None:
            raise Refused("no loop")
        plan = plan_vectorization(temp, function, loop.var, loop_nodes(loop))
        if check == CHECK_ALIGNED:
            return checked_loop_text(temp, loop, plan, width)
        if check == CHECK_PEELED:
            return peeled_loop_text(temp, loop, plan, width)
        return loop_text(temp, loop, plan, width)

    return write


def _peel(source: ParsedSource, vector: Node, tail: Node, scalar: str, width: int) -> Node | None:
    """The statement holding a peeled loop (:func:`peeled_loop_text`): the block of the peel,
    the head loop, the vector loop and its tail, or the ``if`` whose first branch that block
    is and whose other branch is the scalar loop; and which writing it again gives back."""
    block = vector.parent
    if block is None or block.type != "compound_statement":
        return None
    held = statements(block)
    if len(held) != 5 or held[3:] != [vector, tail]:
        return None
    holder = block.parent
    statement = block
    if holder is not None and holder.type == "if_statement":
        if holder.child_by_field_name("consequence") != block:
            return None
        statement = holder
    region = (statement.start_byte, statement.end_byte)
    if not _regenerates(source, region, scalar, _write_loop(width, CHECK_PEELED)):
        return None
    return statement


def _alignment_guard(
    source: ParsedSource, vector: Node, tail: Node, scalar: str, width: int
) -> Node | None:
    """The ``if`` around a vector loop and its tail, alone in its first branch, whose other
    branch is the scalar loop, and which writing the checked form again gives back."""
    block = vector.parent
    guard = block.parent if block is not None else None
    if (
        block is None
        or guard is None
        or block.type != "compound_statement"
        or guard.type != "if_statement"
        or guard.child_by_field_name("consequence") != block
        or statements(block) != [vector, tail]
    ):
        return None
    region = (guard.start_byte, guard.end_byte)
    if not _regenerates(source, region, scalar, _write_loop(width, CHECK_ALIGNED)):
        return None
    return guard


def vector_loops(source: ParsedSource) -> list[VectorLoop]:
    """The canonical vectorized loops of a kernel."""
    found = []
    for node in source.nodes("for_statement"):
        vector = scalar_loop(source, node)
        if vector is None or not vector.var.endswith("_vec"):
            continue
        tail_node = node.next_named_sibling
        tail = scalar_loop(source, tail_node) if tail_node is not None else None
        width = _width_of(source, vector.bound)
        if tail is None or tail_node is None or width is None or tail.var != vector.var[:-4]:
            continue
        scalar = splice(
            source,
            tail_node.start_byte,
            tail_node.end_byte,
            [(tail.start, source.text_of(vector.start))],
        )
        region = (node.start_byte, tail_node.end_byte)
        if _regenerates(source, region, scalar, _write_loop(width)):
            guard = _alignment_guard(source, node, tail_node, scalar, width)
            found.append(VectorLoop(node, tail_node, width, scalar, guard))
            continue
        peel = _peel(source, node, tail_node, scalar, width)
        if peel is not None:
            found.append(VectorLoop(node, tail_node, width, scalar, peel, CHECK_PEELED))
    return found


@dataclass(frozen=True)
class VectorKernel:
    """A canonical vectorized one-thread-per-element kernel."""

    function: Function
    decl: Node
    end: Node
    width: int
    bound: Node
    scalar: str


def _write_kernel(width: int) -> Callable[[ParsedSource, int], str]:
    def write(temp: ParsedSource, start: int) -> str:
        element = next(e for e in element_kernels(temp) if e.start_byte == start)
        return kernel_text(temp, element, element_plan(temp, element), width)

    return write


def _vector_guard(source: ParsedSource, node: Node, vec: str) -> tuple[int, Node] | None:
    """(W, N) of ``if (i_vec * W >= N) return;``."""
    if node.type != "if_statement":
        return None
    clause = node.child_by_field_name("condition")
    values = statements(clause) if clause is not None else []
    sides = binary(strip_parens(values[0]), ">=") if len(values) == 1 else None
    product = binary(strip_parens(sides[0]), "*") if sides is not None else None
    if sides is None or product is None or source.text_of(product[0]) != vec:
        return None
    width = source.text_of(product[1])
    return (int(width), sides[1]) if width.isdigit() else None


def _rows_undone(source: ParsedSource, region: tuple[int, int], rows: list[RowsForm]) -> str:
    """The text of ``region`` with its rows forms written back as the lane loops they were."""
    inside = [r for r in rows if region[0] <= r.node.start_byte < region[1]]
    return splice(source, region[0], region[1], [(r.node, r.original) for r in inside])


def vector_kernels(source: ParsedSource) -> list[VectorKernel]:
    """The canonical vectorized one-thread-per-element kernels (their lane loops in the rows
    form or not)."""
    rows = rows_forms(source)
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        body = statements(function.body)
        for position, decl in enumerate(body[:-3]):
            parsed = index_declaration(source, decl)
            if parsed is None or not parsed[0].endswith("_vec"):
                continue
            name, specifiers, value = parsed
            guard = _vector_guard(source, body[position + 1], name)
            tail = scalar_loop(source, body[-1])
            if guard is None or tail is None or position + 3 != len(body) - 1:
                continue
            if global_index(source, value) is None or tail.var != name[:-4]:
                continue
            inner = tail.body.named_children if tail.body.type == "compound_statement" else []
            if not inner:
                continue
            # the tail's continues leave an element: in the scalar kernel they were returns
            exits = [(j, "return;") for j in leaving_jumps(inner, "continue_statement")]
            rest = unshift(splice(source, tail.body.start_byte + 1, inner[-1].end_byte, exits), 2)
            if rest is None:
                continue
            width, bound = guard
            indent = source.indent_of(decl.start_byte)
            base = name[:-4]
            scalar = (
                f"{specifiers} {base} = {source.text_of(value)};\n"
                f"{indent}if ({base} >= {source.text_of(bound)}) return;{rest}"
            )
            region = (decl.start_byte, body[-1].end_byte)
            expected = _rows_undone(source, region, rows)
            if _regenerates(source, region, scalar, _write_kernel(width), expected):
                found.append(VectorKernel(function, decl, body[-1], width, bound, scalar))
    return found
