"""A block-strided row loop unrolled by hand::

    for (int i = threadIdx.x; i < n; i += blockDim.x * U) {
        for (int u = 0; u < U; u++) {
            m = fmaxf(m, x[min(n - 1, i + u * blockDim.x)]);     // clamped read
            if (i + u * blockDim.x < n) y[i + u * blockDim.x] = ...;  // guarded write
        }
    }

Thread ``t`` of a block of ``B`` visits the elements ``t + k·B·U + u·B``: together the block
visits every element of the row once, plus some past its end that the clamps and guards
neutralize. One thread per row visits ``k·U + u``, every element once, with the same
unrolling: the loop starts at 0, steps by ``U``, and each ``i + u·B`` becomes ``i + u``.

The two walks differ in the elements past the end (how many, and which thread meets them),
so the rewrite is sound only where those do nothing: a value accumulated into a variable of
the enclosing code is a max or a min of itself (repeating the clamped last element changes
nothing) or is guarded by ``if (i + u·B < n)``, and so is every store to memory that is not
local to the loop. The index analysis checks the rest: the loop starts at ``threadIdx.x`` and
steps by ``U`` block sizes, and every use of ``i`` is ``i + u·B`` with ``u`` an inner loop's
variable running over ``0 .. U - 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm
from klineage.cuda.analysis.indices import is_loop_atom
from klineage.cuda.source import Loop, Node, ParsedSource
from klineage.cuda.tree import declared_names
from klineage.mechanisms._reductions_util import call_name, inside, strip_parens, within

__all__ = ["UnrolledFormError", "UnrolledLoop", "unrolled_loop"]

Test = Callable[[Node], bool]
_IDEMPOTENT = frozenset({"fmaxf", "fmax", "max", "fminf", "fmin", "min"})


class UnrolledFormError(Exception):
    """A loop strides by a multiple of the block but is not the unrolled form; says how."""


@dataclass
class UnrolledLoop:
    """A recognized unrolled block-strided loop and its thread-per-row rewrite."""

    node: Node
    start: Node
    """The rank the loop starts at (to become 0)."""
    update: Node
    factor: str
    """The unroll factor as written, the new step."""
    slots: list[tuple[Node, str]]
    """Each ``u * B`` offset with the ``u`` it becomes."""


def _op(node: Node) -> str:
    operator = node.child_by_field_name("operator")
    return operator.type if operator is not None else ""


def _product(node: Node, is_block_size: Test) -> tuple[Node, Node] | None:
    """``B * k`` or ``k * B`` with ``B`` the block size -> (B, k)."""
    node = strip_parens(node)
    if node.type != "binary_expression" or _op(node) != "*":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    for size, other in ((left, right), (right, left)):
        if size is not None and other is not None and is_block_size(size):
            return size, other
    return None


def unrolled_loop(
    source: ParsedSource,
    loop: Loop,
    start: Node,
    indices: FunctionIndices,
    is_block_size: Test,
) -> UnrolledLoop | None:
    """The rewrite of ``loop`` (which starts at the thread's rank, ``start``) when it steps by
    a constant number of block sizes; None when its step has no block size factor;
    :class:`UnrolledFormError` when it does but the loop is not the unrolled form."""
    update = strip_parens(loop.update) if loop.update is not None else None
    if update is None or update.type != "assignment_expression" or _op(update) != "+=":
        return None
    step = update.child_by_field_name("right")
    found = _product(step, is_block_size) if step is not None else None
    if found is None or loop.variable is None or loop.body is None:
        return None
    size, factor = found
    line = source.line_of(loop.node.start_byte)
    unroll = indices.form(factor).value
    variable = indices.loop_of(loop.node)
    if unroll is None or unroll < 1 or variable is None:
        raise UnrolledFormError(
            f"the loop at line {line} steps by {source.text_of(step)}: a multiple of the block "
            "size by a factor that is not a constant"
        )
    if variable.init != IndexForm.atom("threadIdx.x") or variable.step != (
        indices.form(size) * unroll
    ):
        raise UnrolledFormError(
            f"the loop at line {line} does not start at threadIdx.x and step by {unroll} block "
            f"sizes (it starts at {variable.init} and steps by {variable.step})"
        )
    elements, slots = _slots(source, loop, indices, is_block_size, unroll)
    _check_past_end(source, loop, elements)
    return UnrolledLoop(loop.node, start, update, source.text_of(factor), slots)


def _slots(
    source: ParsedSource,
    loop: Loop,
    indices: FunctionIndices,
    is_block_size: Test,
    unroll: int,
) -> tuple[list[Node], list[tuple[Node, str]]]:
    """The ``i + u * B`` element expressions of the body and their ``u * B`` offsets."""
    assert loop.body is not None and loop.variable is not None
    line = source.line_of(loop.node.start_byte)
    elements, slots = [], []
    for use in inside(source, loop.body, "identifier"):
        if source.text_of(use) != loop.variable:
            continue
        element = use.parent
        while element is not None and element.type == "parenthesized_expression":
            element = element.parent
        if element is None or element.type != "binary_expression" or _op(element) != "+":
            raise UnrolledFormError(
                f"{loop.variable} is used at line {source.line_of(use.start_byte)} other than "
                f"as {loop.variable} + u * blockDim.x, so the threads' elements are not the "
                f"row's (loop at line {line})"
            )
        sides = [element.child_by_field_name("left"), element.child_by_field_name("right")]
        offset = next((s for s in sides if s is not None and not within(use, s)), None)
        found = _product(offset, is_block_size) if offset is not None else None
        if offset is None or found is None or not _full_slot(indices, found[1], loop, unroll):
            raise UnrolledFormError(
                f"the offset of {source.text_of(element)} (line {source.line_of(use.start_byte)}) "
                f"is not u * blockDim.x with u an inner loop over 0 .. {unroll - 1}"
            )
        elements.append(element)
        slots.append((strip_parens(offset), source.text_of(found[1])))
    return elements, slots


def _full_slot(indices: FunctionIndices, slot: Node, loop: Loop, unroll: int) -> bool:
    """Whether ``slot`` is the variable of a loop in ``loop``'s body that runs 0, 1, ...,
    ``unroll - 1``."""
    form = indices.form(slot)
    atoms = list(form.atoms())
    if len(atoms) != 1 or not is_loop_atom(atoms[0]) or form != IndexForm.atom(atoms[0]):
        return False
    inner = indices.loop(atoms[0])
    return (
        inner is not None
        and loop.body is not None
        and within(inner.loop, loop.body)
        and inner.init.value == 0
        and inner.step is not None
        and inner.step.value == 1
        and inner.trip == unroll
    )


def _root(node: Node) -> Node:
    """``p[i]`` -> ``p``; ``*p`` -> ``p``; ``v`` -> ``v``."""
    node = strip_parens(node)
    while node.type in ("subscript_expression", "pointer_expression", "field_expression"):
        inner = node.child_by_field_name("argument")
        if inner is None:
            break
        node = strip_parens(inner)
    return node


def _check_past_end(source: ParsedSource, loop: Loop, elements: list[Node]) -> None:
    """Writes that leave the loop must do nothing past the row's end (see the module)."""
    assert loop.body is not None
    local = declared_names(source, loop.body)
    spans = {(e.start_byte, e.end_byte) for e in elements}
    condition = strip_parens(loop.condition) if loop.condition is not None else None
    bound = condition.child_by_field_name("right") if condition is not None else None
    bound_text = " ".join(source.text_of(bound).split()) if bound is not None else None
    for write in inside(source, loop.body, "assignment_expression", "update_expression"):
        target = write.child_by_field_name("left") or write.child_by_field_name("argument")
        if target is None or source.text_of(_root(target)) in local:
            continue
        if _idempotent(source, write, target) or _guarded(source, write, loop, spans, bound_text):
            continue
        raise UnrolledFormError(
            f"the write at line {source.line_of(write.start_byte)} is not guarded by "
            f"`i + u * blockDim.x < {bound_text}`: a thread per row meets other elements past "
            "the row's end than the block did"
        )


def _idempotent(source: ParsedSource, write: Node, target: Node) -> bool:
    """``m = fmaxf(m, e)`` (or a min): repeating an element changes nothing."""
    value = write.child_by_field_name("right")
    if write.type != "assignment_expression" or _op(write) != "=" or value is None:
        return False
    value = strip_parens(value)
    if target.type != "identifier" or value.type != "call_expression":
        return False
    if call_name(source, value) not in _IDEMPOTENT:
        return False
    arguments = value.child_by_field_name("arguments")
    names = [
        source.text_of(strip_parens(a)) for a in (arguments.named_children if arguments else [])
    ]
    return source.text_of(target) in names


def _guarded(
    source: ParsedSource,
    write: Node,
    loop: Loop,
    elements: set[tuple[int, int]],
    bound: str | None,
) -> bool:
    """Whether an enclosing ``if`` in the loop tests ``i + u * B < bound``."""
    node = write.parent
    while node is not None and node != loop.node:
        if node.type == "if_statement" and node.child_by_field_name("alternative") is None:
            condition = node.child_by_field_name("condition")
            test = condition.child_by_field_name("value") if condition is not None else None
            test = strip_parens(test) if test is not None else None
            if test is not None and test.type == "binary_expression" and _op(test) == "<":
                left, right = test.child_by_field_name("left"), test.child_by_field_name("right")
                if (
                    left is not None
                    and right is not None
                    and (strip_parens(left).start_byte, strip_parens(left).end_byte) in elements
                    and " ".join(source.text_of(right).split()) == bound
                ):
                    return True
        node = node.parent
    return False
