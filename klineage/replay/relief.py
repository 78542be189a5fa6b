"""Whether a profiled target still has what a skill relieves.

A skill gains by relieving something its simpler kernel suffered from. Where the target's
profile shows that thing is already absent, the skill has nothing to work on, and replay tries
it last rather than first (the audited replay spent 11 of sgemm's 30 gate runs padding its
shared tiles, none of them faster, and its first 4 on block- and warp-per-row rewrites of a
GEMM that already ran at 98% achieved occupancy, 0.06-0.11x). Two readings, both from the
profile stage's figures (:data:`klineage.gate.counters.CALL_FIGURES`):

- what the mechanism exists to lower (:attr:`Mechanism.relieves`): padding and swizzling
  lower shared-memory bank conflicts; a target with none has none to lower;
- what the skill relieved on its expert: a gaining step that moved a figure of want at least
  twofold the right way (achieved occupancy up: one block per row on a kernel with a thread
  per row filled an idle GPU; sectors per global load request down: one warp per row
  coalesced a thread's strided walk). Where the target is already nearer, in ratio, to what
  the step reached than to where it started, for every such figure, it is not short of what
  the step supplied.

Only a method that profiles its states asks (the `profiled` method; `skills` when told to
rank by profile). A skill tried last is still tried: the profile says it is unlikely to pay,
not that it cannot.

One want needs no profile: threads. A block or a warp per row, or a sum split over blocks
(:attr:`Mechanism.fills_threads`), fills a GPU that one thread per row (or per output) leaves
idle; where the target's thread-per-row launch
already gives every workload more threads than the GPU holds at once, there is no idle GPU to
fill (:func:`enough_threads`; the naive GEMMs: m x n threads, one per output, where a block
per output measured 0.03-0.07x and a warp per output 0.08-0.11x in the audited replay).
"""

from __future__ import annotations

import ast
import math
import re

from klineage.gate.counters import CALL_FIGURES, CounterChange
from klineage.gate.profile import Profile
from klineage.kernel import KernelSource
from klineage.mechanisms import Mechanism
from klineage.mechanisms._rows_forms import NotCanonical, row_count
from klineage.mechanisms._rows_thread import thread_rows_shape
from klineage.problem import Problem
from klineage.skills import Measured, Skill

RESIDENT_THREADS = 132 * 2048
"""Threads an H200 holds at once: 132 SMs of 2,048 resident threads."""
_CASTS = re.compile(r"\((?:unsigned|int|long|int64_t|uint64_t|int32_t|uint32_t|size_t)\)")

WANTS: dict[str, int] = {"achieved occupancy (%)": 1, "sectors per global load request": -1}
"""Figures that tell a kernel short of something, and the way they move when it is relieved
(+1: up is better, -1: down is better)."""
RELIEVED_BY = 2.0
"""A step relieved a want when it moved its figure this many times the right way."""


def _figure(profile: Profile, figure: str) -> float | None:
    value_of = CALL_FIGURES.get(figure)
    return value_of(profile) if value_of is not None else None


def relieved_wants(skill: Skill) -> list[CounterChange]:
    """The wants a gaining step relieved on its expert, as its card recorded them."""
    if skill.profile is None or skill.effect.measured is not Measured.GAIN:
        return []
    relieved = []
    for change in skill.profile.changes:
        way = WANTS.get(change.figure)
        if way is None or change.simplified <= 0 or change.optimized <= 0:
            continue
        if (change.optimized / change.simplified) ** way >= RELIEVED_BY:
            relieved.append(change)
    return relieved


def _nearer_reached(change: CounterChange, now: float) -> bool:
    """`now` is nearer, in ratio, to what the step reached than to where it started."""
    middle = math.sqrt(change.simplified * change.optimized)
    return now >= middle if change.optimized > change.simplified else now <= middle


def nothing_to_relieve(
    skill: Skill, mechanism: Mechanism | None, target: Profile | None
) -> str | None:
    """Why the profiled `target` leaves `skill` nothing to relieve, or None when it may (or
    when there is no profile to tell)."""
    if target is None or not target.profiled:
        return None
    if mechanism is not None:
        for figure in mechanism.relieves:
            if _figure(target, figure) == 0:
                return f"the target's profile shows no {figure}, all that {mechanism.name} lowers"
    relieved = relieved_wants(skill)
    if not relieved:
        return None
    seen = []
    for change in relieved:
        now = _figure(target, change.figure)
        if now is None or not _nearer_reached(change, now):
            return None
        seen.append(
            f"{change.figure} {now:.3g} here, {change.simplified:.3g} -> "
            f"{change.optimized:.3g} on its expert"
        )
    return "the target is already nearer what the step reached: " + "; ".join(seen)


def _value(text: str, axes: dict[str, int]) -> int | None:
    """An integer expression over the axes (``batch * m * n``, casts dropped), or None when it
    is anything else."""

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return axes.get(node.id)
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, (ast.Div, ast.FloorDiv)) and right > 0:
                return left // right
        return None

    try:
        tree = ast.parse(_CASTS.sub("", text), mode="eval")
    except SyntaxError:
        return None
    return value(tree.body)


def launched_rows(kernel: KernelSource, problem: Problem) -> tuple[str, list[int]] | None:
    """The rows (threads) of the target's thread-per-row kernel, as its launch counts them,
    per workload; None when it has none, or a count this cannot evaluate."""
    source = kernel.parsed
    for function in source.kernels:
        shape = thread_rows_shape(source, function)
        launches = source.launches_of(function)
        if shape is None or not launches:
            continue
        try:
            text = row_count(source, function, launches[0], shape[3])
        except NotCanonical:
            return None
        counts = [_value(text, dict(w.axes)) for w in problem.workloads]
        if any(c is None for c in counts):
            return None
        return text, [c for c in counts if c is not None]
    return None


def enough_threads(
    mechanism: Mechanism | None, kernel: KernelSource, problem: Problem
) -> str | None:
    """Why a mechanism that spreads a row over more threads has no idle GPU to fill on the
    target, or None when it may (or cannot be told)."""
    if mechanism is None or not mechanism.fills_threads or not problem.workloads:
        return None
    rows = launched_rows(kernel, problem)
    if rows is None or min(rows[1]) < RESIDENT_THREADS:
        return None
    return (
        f"the target already launches {rows[0]} = {min(rows[1]):,} or more threads on every "
        f"workload, more than the {RESIDENT_THREADS:,} a GPU holds at once: no idle GPU for "
        f"{mechanism.name} to fill"
    )
