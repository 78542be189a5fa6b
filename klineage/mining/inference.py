"""Validity conditions learned from probes.

For an accepted removal, both states are checked on the problem's probes (odd, tiny and
unaligned sizes that need not pass). Where the optimized state fails a probe and the simplified
one passes it, the optimization is what breaks there: we look for the simplest predicate over
one axis that is false on every such probe and true on everything the optimized state handled
(its workloads and passing probes): divisibility first, then a lower bound, then an upper
bound. The probes that support it are kept with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from klineage.conditions import AxisAtLeast, AxisAtMost, AxisDivisible, Condition, Prose
from klineage.gate.result import GateVerdict
from klineage.problem import Problem, Workload

DIVISORS = (2, 4, 8, 16, 32, 64, 128, 256)


class ProbeEvidence(BaseModel):
    """A probe the optimized state failed and the simplified state passed."""

    workload: str = Field(description="the probe's axis values")
    status: str = Field(description="the optimized state's gate status on it")
    message: str = Field(description="the gate's message for it")


class InferredCondition(BaseModel):
    """A predicate separating the probes an optimization breaks from the sizes it handles."""

    condition: dict = Field(description="the condition in JSON form (klineage.conditions)")
    prose: str = Field(description="the condition in words")
    supporting: list[ProbeEvidence] = Field(description="the probes it explains")


def _failing_probes(
    optimized: GateVerdict, simplified: GateVerdict
) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    opt = {w.workload_uuid: w for w in optimized.workloads}
    simple = {w.workload_uuid: w for w in simplified.workloads}
    broken = [u for u, w in opt.items() if not w.passed and u in simple and simple[u].passed]
    handled = [u for u, w in opt.items() if w.passed]
    statuses = {u: opt[u].status.value for u in broken}
    messages = {u: opt[u].message for u in broken}
    return broken, handled, statuses, messages


def _separates(
    condition: Condition, problem: Problem, good: Sequence[Workload], bad: Sequence[Workload]
) -> bool:
    return all(condition.evaluate(problem, w) is True for w in good) and all(
        condition.evaluate(problem, w) is False for w in bad
    )


def infer_condition(
    problem: Problem, optimized: GateVerdict, simplified: GateVerdict
) -> InferredCondition | None:
    """The condition the probes teach about an optimization, or None when it broke nothing.

    `optimized` and `simplified` are both states' verdicts on the probes.
    """
    broken, handled, statuses, messages = _failing_probes(optimized, simplified)
    if not broken:
        return None
    by_uuid = {w.uuid: w for w in problem.all_workloads()}
    bad = [by_uuid[u] for u in broken]
    # the optimized state passes every required workload (it was accepted as a state)
    good = list(problem.workloads) + [by_uuid[u] for u in handled if u in by_uuid]
    evidence = [
        ProbeEvidence(workload=by_uuid[u].label, status=statuses[u], message=messages[u][:500])
        for u in broken
    ]
    why = "the optimized kernel failed probes the simpler one passed"
    for condition in _candidates(problem, good, why):
        if _separates(condition, problem, good, bad):
            return InferredCondition(
                condition=condition.model_dump(mode="json"),
                prose=condition.prose,
                supporting=evidence,
            )
    labels = ", ".join(e.workload for e in evidence)
    fallback = Prose(text=f"fails on sizes like {labels}; no single-axis rule explains it")
    return InferredCondition(
        condition=fallback.model_dump(mode="json"), prose=fallback.prose, supporting=evidence
    )


def _candidates(problem: Problem, good: Sequence[Workload], why: str) -> list[Condition]:
    candidates: list[Condition] = []
    axes = problem.definition.var_axes()
    for axis in axes:
        for k in DIVISORS:
            candidates.append(AxisDivisible(axis=axis, k=k, why=why))
    for axis in axes:
        values = [w.axes[axis] for w in good if axis in w.axes]
        if values:
            candidates.append(AxisAtLeast(axis=axis, n=min(values), why=why))
            candidates.append(AxisAtMost(axis=axis, n=max(values), why=why))
    return candidates


def why_no_condition(
    probes: Sequence[Workload],
    optimized: GateVerdict | None,
    simplified: GateVerdict | None,
    stated_by: str = "the mechanism states none",
) -> str:
    """Why a skill has no condition, in words: what the mechanism says, which probes were
    tried, and how each state did on them (nothing separated the two)."""
    if not probes:
        return f"{stated_by}, and the problem has no probes to learn one from"
    if optimized is None or simplified is None:
        return f"{stated_by}, and its {len(probes)} probes were not gated"
    opt = {w.workload_uuid: w.passed for w in optimized.workloads}
    simple = {w.workload_uuid: w.passed for w in simplified.workloads}
    both = [p.label for p in probes if opt.get(p.uuid) and simple.get(p.uuid)]
    neither = [p.label for p in probes if not opt.get(p.uuid) and not simple.get(p.uuid)]
    only = [p.label for p in probes if opt.get(p.uuid) and not simple.get(p.uuid)]
    parts = [f"{len(both)} passed with and without it"]
    if neither:
        parts.append(f"{len(neither)} failed with and without it: {'; '.join(neither[:4])}")
    if only:
        parts.append(f"{len(only)} failed only without it: {'; '.join(only[:4])}")
    return f"{stated_by}; of the {len(probes)} probes tried, " + ", ".join(parts)
