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

The forward rule reads the thread's form the same way (:func:`thread_unrolled_loop`): a loop
from 0 by a constant ``U`` whose every use of ``i`` is ``i + u`` with ``u`` an inner loop over
``0 .. U - 1``, under the same condition past the row's end (``i + u < n`` guards); each
``u`` there becomes ``u * B`` and the step ``B * U``. Stores may clamp their element, ``p[min(n
- 1, i + u)]``: the guard makes the clamp a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm
from klineage.cuda.analysis.indices import is_loop_atom
from klineage.cuda.source import Loop, Node, ParsedSource
from klineage.cuda.tree import declared_names
from klineage.mechanisms._reductions_util import call_name, inside, strip_parens, within

__all__ = [
    "STORE_INTRINSICS",
    "UnrolledFormError",
    "UnrolledLoop",
    "clamped_element",
    "thread_unrolled_loop",
    "unrolled_loop",
]

Test = Callable[[Node], bool]
_THREAD_RANK = IndexForm.atom("threadIdx.x")
STORE_INTRINSICS = frozenset({"__stcs", "__stcg", "__stwt", "__stwb"})
"""Stores through a cache hint: ``__stcs(p + i, v)`` is ``p[i] = v``."""
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
    """Each ``u * B`` offset with the ``u`` it becomes (the thread's form: each ``u``)."""
    elements: list[Node]
    """The ``i + u * B`` (``i + u``) element expressions."""
    inner: list[Node]
    """The inner loops over ``u``."""


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
    rank: IndexForm | None = _THREAD_RANK,
) -> UnrolledLoop | None:
    """The rewrite of ``loop`` (which starts at the thread's rank, ``start``) when it steps by
    a constant number of block sizes; None when its step has no block size factor;
    :class:`UnrolledFormError` when it does but the loop is not the unrolled form. For a
    warp, ``is_block_size`` tests the warp size and ``rank`` is None: the caller knows the
    start is the lane."""
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
    if (rank is not None and variable.init != rank) or variable.step != (
        indices.form(size) * unroll
    ):
        raise UnrolledFormError(
            f"the loop at line {line} does not start at threadIdx.x and step by {unroll} block "
            f"sizes (it starts at {variable.init} and steps by {variable.step})"
        )

    def slot(offset: Node) -> Node | None:
        found = _product(offset, is_block_size)
        return found[1] if found is not None else None

    elements, slots, inner = _slots(source, loop, indices, slot, unroll, "u * blockDim.x")
    _check_past_end(source, loop, elements, "i + u * blockDim.x")
    return UnrolledLoop(loop.node, start, update, source.text_of(factor), slots, elements, inner)


def thread_unrolled_loop(
    source: ParsedSource, loop: Loop, start: Node, indices: FunctionIndices
) -> UnrolledLoop | None:
    """The thread's form of the unrolled loop: ``for (i = 0; i < n; i += U)`` (``loop``,
    starting at ``start``) with ``i + u`` inside; None when its step is not a constant above
    1; :class:`UnrolledFormError` when it is but the body is not the unrolled form."""
    update = strip_parens(loop.update) if loop.update is not None else None
    if update is None or update.type != "assignment_expression" or _op(update) != "+=":
        return None
    step = update.child_by_field_name("right")
    unroll = indices.form(step).value if step is not None else None
    if step is None or unroll is None or unroll < 2 or loop.body is None:
        return None
    variable = indices.loop_of(loop.node)
    if variable is None or variable.init.value != 0:
        raise UnrolledFormError(
            f"the loop at line {source.line_of(loop.node.start_byte)} steps by "
            f"{source.text_of(step)} but does not start at 0"
        )
    elements, slots, inner = _slots(
        source, loop, indices, lambda offset: strip_parens(offset), unroll, "u"
    )
    _check_past_end(source, loop, elements, "i + u")
    return UnrolledLoop(loop.node, start, update, source.text_of(step), slots, elements, inner)


def clamped_element(source: ParsedSource, index: Node, unrolled: UnrolledLoop) -> bool:
    """Whether ``index`` is ``min(n - 1, i + u)`` (either order) with ``i + u`` an element of
    the unrolled loop: a store there is guarded (:func:`_check_past_end`), so the clamp is a
    no-op and each element is still written by one thread."""
    index = strip_parens(index)
    if index.type != "call_expression" or call_name(source, index) != "min":
        return False
    arguments = index.child_by_field_name("arguments")
    spans = {(e.start_byte, e.end_byte) for e in unrolled.elements}
    named = [strip_parens(a) for a in (arguments.named_children if arguments else [])]
    return len(named) == 2 and any((a.start_byte, a.end_byte) in spans for a in named)


Slot = Callable[[Node], Node | None]


def _slots(
    source: ParsedSource,
    loop: Loop,
    indices: FunctionIndices,
    slot_of: Slot,
    unroll: int,
    spelling: str,
) -> tuple[list[Node], list[tuple[Node, str]], list[Node]]:
    """The ``i + <offset>`` element expressions of the body, each offset (``u * B``, or
    ``u``) with the ``u`` that ``slot_of`` finds in it, and the inner loops over those."""
    assert loop.body is not None and loop.variable is not None
    line = source.line_of(loop.node.start_byte)
    elements, slots, inner = [], [], []
    for use in inside(source, loop.body, "identifier"):
        if source.text_of(use) != loop.variable:
            continue
        element = use.parent
        while element is not None and element.type == "parenthesized_expression":
            element = element.parent
        if element is None or element.type != "binary_expression" or _op(element) != "+":
            raise UnrolledFormError(
                f"{loop.variable} is used at line {source.line_of(use.start_byte)} other than "
                f"as {loop.variable} + {spelling}, so the threads' elements are not the "
                f"row's (loop at line {line})"
            )
        sides = [element.child_by_field_name("left"), element.child_by_field_name("right")]
        offset = next((s for s in sides if s is not None and not within(use, s)), None)
        found = slot_of(offset) if offset is not None else None
        full = _full_slot(indices, found, loop, unroll) if found is not None else None
        if offset is None or found is None or full is None:
            raise UnrolledFormError(
                f"the offset of {source.text_of(element)} (line {source.line_of(use.start_byte)}) "
                f"is not {spelling} with u an inner loop over 0 .. {unroll - 1}"
            )
        elements.append(element)
        slots.append((strip_parens(offset), source.text_of(found)))
        inner += [full] if full not in inner else []
    return elements, slots, inner


def _full_slot(indices: FunctionIndices, slot: Node, loop: Loop, unroll: int) -> Node | None:
    """The loop in ``loop``'s body whose variable ``slot`` is, when it runs 0, 1, ...,
    ``unroll - 1``; None otherwise."""
    form = indices.form(slot)
    atoms = list(form.atoms())
    if len(atoms) != 1 or not is_loop_atom(atoms[0]) or form != IndexForm.atom(atoms[0]):
        return None
    inner = indices.loop(atoms[0])
    full = (
        inner is not None
        and loop.body is not None
        and within(inner.loop, loop.body)
        and inner.init.value == 0
        and inner.step is not None
        and inner.step.value == 1
        and inner.trip == unroll
    )
    return inner.loop if full and inner is not None else None


def _root(node: Node) -> Node:
    """``p[i]`` -> ``p``; ``*p`` -> ``p``; ``v`` -> ``v``."""
    node = strip_parens(node)
    while node.type in ("subscript_expression", "pointer_expression", "field_expression"):
        inner = node.child_by_field_name("argument")
        if inner is None:
            break
        node = strip_parens(inner)
    return node


def _check_past_end(source: ParsedSource, loop: Loop, elements: list[Node], spelling: str) -> None:
    """Writes that leave the loop must do nothing past the row's end (see the module)."""
    assert loop.body is not None
    local = declared_names(source, loop.body)
    spans = {(e.start_byte, e.end_byte) for e in elements}
    condition = strip_parens(loop.condition) if loop.condition is not None else None
    bound = condition.child_by_field_name("right") if condition is not None else None
    bound_text = " ".join(source.text_of(bound).split()) if bound is not None else None
    for write in inside(
        source, loop.body, "assignment_expression", "update_expression", "call_expression"
    ):
        target = write.child_by_field_name("left") or write.child_by_field_name("argument")
        if write.type == "call_expression":  # __stcs(p + i + u, v)
            arguments = write.child_by_field_name("arguments")
            if call_name(source, write) not in STORE_INTRINSICS or arguments is None:
                continue
            target = arguments.named_children[0] if arguments.named_children else None
        if target is None or source.text_of(_root(target)) in local:
            continue
        if _idempotent(source, write, target) or _guarded(source, write, loop, spans, bound_text):
            continue
        raise UnrolledFormError(
            f"the write at line {source.line_of(write.start_byte)} is not guarded by "
            f"`{spelling} < {bound_text}`: a thread per row meets other elements past "
            "the row's end than the block does"
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
