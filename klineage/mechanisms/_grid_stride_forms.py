"""Grid-stride loops recognized by what their index does, not how it is written.

A loop is grid-stride when its induction variable starts at the block's offset along one grid
dimension and advances by the whole grid along it: the step is ``gridDim.d * S`` and the
start holds ``blockIdx.d * S`` for the same ``S``. The index analysis reads that through any
spelling: a ``while`` with the stride in a variable (``i += gridSize`` with ``gridSize =
blockSize * gridDim.x``, then doubled), the y or z dimension (``idx += gridDim.y *
bt_per_block``), a stride scaled by another block dimension (``gridDim.x * blockDim.z``).

A persistent kernel may instead take its work items from a scheduler object,
``while (schedule.next(tile_m, tile_n))``: a loop whose condition is a member call of a local
object that hands out coordinates through reference parameters. That is the same mechanism
(a fixed grid walking any number of tiles), in a form no rule rewrites.

The canonical ``for`` form is rewritten by :mod:`klineage.mechanisms.grid_stride_loop`; a
``for`` loop among these forms is marked (``kind="index_for"``) for the removal of
:mod:`klineage.mechanisms._grid_stride_index`; the rest are refused with the form they are in.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.forms import IndexForm
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import call_arguments, descendants, strip_parens
from klineage.mechanisms._forms import FoundForm

__all__ = ["SchedulerLoop", "grid_stride_forms", "scheduler_loops"]

_CANONICAL = (
    "the canonical `for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * "
    "blockDim.x)` over one element per iteration in a kernel without barriers"
)


def _dimension(step: IndexForm, start: IndexForm) -> str | None:
    """``y`` when ``step = gridDim.y * S`` and ``start`` holds ``blockIdx.y * S``."""
    for dimension in "xyz":
        stride = step.coefficient(f"gridDim.{dimension}")
        if not stride.terms or step != stride * IndexForm.atom(f"gridDim.{dimension}"):
            continue
        if start.coefficient(f"blockIdx.{dimension}") == stride:
            return dimension
    return None


def _index_loops(source: ParsedSource, function: Function) -> list[FoundForm]:
    indices = analysis(source).indices(function)
    found = []
    for variable in indices.loops:
        if variable.step is None:
            continue
        dimension = _dimension(variable.step, variable.init)
        if dimension is None:
            continue
        keyword = variable.loop.type.split("_")[0]
        barriers = analysis(source).shared(function).barriers
        barrier = " in a kernel with block barriers" if barriers else ""
        form = (
            f"a grid-stride `{keyword}` loop over gridDim.{dimension} (step {variable.step}, "
            f"from {variable.init}){barrier}"
        )
        kind = "index_for" if keyword == "for" else "partials"
        found.append(FoundForm(variable.loop, function, form, _CANONICAL, kind))
    return found


@dataclass(frozen=True)
class SchedulerLoop:
    """``while (sched.next(a, b))``: a persistent loop fed by a scheduler object."""

    loop: Node
    call: Node
    method: Function
    """The member function that hands out the work (``next``)."""


def scheduler_loops(source: ParsedSource, function: Function) -> list[SchedulerLoop]:
    """``while (sched.next(a, b))`` where ``next`` is a device member function that returns
    whether there is work and writes the coordinates through reference parameters."""
    assert function.body is not None
    groups = analysis(source).cooperative_groups
    found = []
    for loop in descendants(function.body, "while_statement"):
        condition = loop.child_by_field_name("condition")
        values = [c for c in (condition.named_children if condition else []) if c.type != "comment"]
        call = strip_parens(values[-1]) if values else None
        if call is None or call.type != "call_expression":
            continue
        callee = call.child_by_field_name("function")
        if callee is None or callee.type != "field_expression":
            continue
        receiver = callee.child_by_field_name("argument")
        member = callee.child_by_field_name("field")
        if receiver is None or member is None or receiver.type != "identifier":
            continue
        if groups.group(function, source.text_of(receiver)) is not None:
            continue
        method = source.function(source.text_of(member))
        out = [p for p in method.params if "&" in source.text_of(p.node)] if method else []
        if method is None or not method.runs_on_device or not out or not call_arguments(call):
            continue
        found.append(SchedulerLoop(loop, call, method))
    return found


def _scheduler_forms(source: ParsedSource, function: Function) -> list[FoundForm]:
    found = []
    for scheduled in scheduler_loops(source, function):
        form = (
            f"a persistent loop taking work from a scheduler "
            f"(`{source.snippet(scheduled.call, 60)}` hands out the coordinates)"
        )
        found.append(FoundForm(scheduled.loop, function, form, _CANONICAL))
    return found


def grid_stride_forms(source: ParsedSource, skip: set[int]) -> list[FoundForm]:
    """Every grid-stride loop of the kernels whose loop node does not start at a byte in
    ``skip`` (the canonical ones, already reported)."""
    found: list[FoundForm] = []
    for function in source.kernels:
        if function.body is None:
            continue
        for form in _index_loops(source, function) + _scheduler_forms(source, function):
            if form.node.start_byte not in skip:
                skip.add(form.node.start_byte)
                found.append(form)
    return found
