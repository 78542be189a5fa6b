"""What replay reports: the budget of a method, each gate run it made, what it reached."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from klineage.gate.result import GateVerdict, geomean
from klineage.kernel import KernelSource
from klineage.lineage import LlmRejection
from klineage.problem import Problem


class ReplayBudget(BaseModel):
    """How much each method may spend on one problem."""

    gate_runs: int = Field(default=30, ge=1, description="gate runs (the start excluded)")
    wall_seconds: float = Field(default=1800.0, gt=0, description="wall time per method")


class GateRunRecord(BaseModel):
    """One gate run of a method."""

    index: int = Field(description="1-based position in the method's budget")
    action: str = Field(description="the mechanism applied")
    origin: str = Field(
        description="'skill:<id>', 'llm:<kind>:<model>:skill:<id>' (the LLM applied the "
        "skill), 'memory:<id>' or 'blind'"
    )
    carrier: dict[str, Any] = Field(default_factory=dict, description="instance choices")
    outcome: str = Field(
        description="kept, slower (correct, not faster), rejected, or outranked (kept-worthy, "
        "but another carrier of the same skill was faster from the same state, or, in the tree "
        "method, the beam held faster states)"
    )
    gate_status: str = Field(description="the gate's status")
    ratio: float | None = Field(default=None, description="current / new latency (pooled)")
    speedup: float = Field(
        description="speedup over the start after this run (the tree method: of the state this "
        "run reached if kept, else of the state it was gated from)"
    )
    message: str = Field(default="", description="the gate's message when rejected")
    intent: str = Field(
        default="",
        description="what the move wrote beside its rule's rewrite, in words: a launch-size "
        "dispatch's split, a launch bound's register cap lifted, or what an LLM says it changed "
        "('' for a plain rule application; older reports: '')",
    )
    gate_seconds: float = Field(
        default=0.0,
        description="what the verdict cost when it was made: nvcc plus check and time "
        "(the same whether this run made it or the log served it)",
    )


def verdict_seconds(verdict: GateVerdict) -> float:
    """The build's compile time plus every workload's check and time stages."""
    return verdict.build.compile_seconds + sum(w.seconds for w in verdict.workloads)


class SkillUse(BaseModel):
    """A skill a method kept, the expert it was mined from and the folder it was read from."""

    skill: str = Field(description="the skill's id")
    source: str = Field(description="the problem it was mined from")
    folder: str = Field(
        default="",
        description="the skills folder it was read from, as given to replay (older reports: '')",
    )
    origin: str = Field(
        default="", description="'skill:<id>', or the LLM that applied it (older reports: '')"
    )


class MethodResult(BaseModel):
    """What one method reached on one problem."""

    method: str = Field(description="skills, blind, memory or tree")
    problem: str = Field(description="definition name")
    runs: list[GateRunRecord] = Field(default_factory=list, description="every gate run")
    refusals: list[str] = Field(default_factory=list, description="rewrites the rules refused")
    llm_rejections: list[LlmRejection] = Field(
        default_factory=list,
        description="LLM answers that were never gated: state, skill, stage, reason",
    )
    start_ms: dict[str, float] = Field(description="naive kernel latency per workload")
    best_ms: dict[str, float] = Field(description="best state's latency per workload")
    reference_ms: dict[str, float] = Field(
        description="PyTorch reference per workload: since 2026-12-05 the median over every "
        "verdict of the problem's replay (each times it in its own run); before, the best "
        "state's own"
    )
    reference_ms_own: dict[str, float] = Field(
        default_factory=dict,
        description="the reference as the best state's own verdict timed it (older reports: {})",
    )
    start_joules: dict[str, float] = Field(
        default_factory=dict,
        description="naive kernel's energy per call (J) per workload, when the gate measured it",
    )
    best_joules: dict[str, float] = Field(
        default_factory=dict, description="best state's energy per call (J) per workload"
    )
    reference_joules: dict[str, float] = Field(
        default_factory=dict, description="PyTorch reference's energy per call (J) per workload"
    )
    start_bottleneck: str | None = Field(
        default=None, description="the naive kernel's bottleneck class, when profiled"
    )
    best_bottleneck: str | None = Field(
        default=None, description="the best state's bottleneck class, when profiled"
    )
    speedup: float = Field(description="geometric-mean speedup over the naive kernel")
    speedup_vs_reference: float = Field(description="geometric mean of reference / best")
    speedup_vs_reference_own: float | None = Field(
        default=None,
        description="the same against the best state's own reference timing (older: None)",
    )
    runs_to_90: int = Field(description="gate runs to reach 90% of the final speedup")
    runs_to_best: int = Field(
        default=0, description="gate runs to reach the final speedup (0: no gain; older reports)"
    )
    wasted: int = Field(description="gate runs rejected or not faster")
    skills_used: list[SkillUse] = Field(
        default_factory=list, description="kept skills and the expert each came from"
    )
    final: str = Field(description="fingerprint of the best state")
    seconds: float = Field(description="wall time of this call (short when the log served it)")
    gate_seconds: float = Field(
        default=0.0, description="what the method's verdicts cost to make, the start's included"
    )


def against_reference(result: MethodResult, reference_ms: dict[str, float]) -> MethodResult:
    """`result` measured against `reference_ms` (a figure per workload shared by every method,
    :meth:`klineage.gate.log.GateLog.reference_medians`), its own reference kept beside."""
    best = result.best_ms
    shared = {k: reference_ms[k] for k in best if k in reference_ms}
    if not shared:
        return result
    return result.model_copy(
        update={
            "reference_ms": shared,
            "reference_ms_own": result.reference_ms,
            "speedup_vs_reference": geomean([shared[k] / best[k] for k in shared]),
            "speedup_vs_reference_own": result.speedup_vs_reference,
        }
    )


def joules_per_call(verdict: GateVerdict) -> dict[str, float]:
    """The kernel's energy per call by workload label, where it was measured."""
    return {w.label: w.joules_per_call for w in verdict.workloads if w.joules_per_call}


def bottleneck_of(verdict: GateVerdict) -> str | None:
    """The verdict's bottleneck class, when its kernel was profiled."""
    profile = verdict.profile
    call = profile.bottleneck if profile is not None else None
    return call.kind.value if call is not None else None


def method_result(
    method: str,
    problem: Problem,
    start: GateVerdict,
    best: GateVerdict,
    records: list[GateRunRecord],
    refusals: list[str],
    used: list[SkillUse],
    final: KernelSource,
    seconds: float,
) -> MethodResult:
    """What a method reached: latencies of the start and the best state, the speedup over the
    start and the reference, the runs to 90% of the gain, the runs wasted."""
    start_ms = {w.label: w.latency_ms for w in start.workloads if w.latency_ms}
    best_ms = {w.label: w.latency_ms for w in best.workloads if w.latency_ms}
    reference_ms = {
        w.label: w.reference_latency_ms for w in best.workloads if w.reference_latency_ms
    }
    speedup = records[-1].speedup if records else 1.0
    if records:
        speedup = max(r.speedup for r in records)
    reference_joules = {
        w.label: w.reference_energy.joules_per_call for w in best.workloads if w.reference_energy
    }
    vs_reference = geomean([reference_ms[k] / best_ms[k] for k in best_ms if k in reference_ms])
    target = 1.0 + 0.9 * (speedup - 1.0)
    runs_to_90 = next((r.index for r in records if r.speedup >= target), 0)
    runs_to_best = next((r.index for r in records if r.speedup >= speedup), 0)
    return MethodResult(
        method=method,
        problem=problem.name,
        runs=records,
        refusals=refusals,
        start_ms=start_ms,
        best_ms=best_ms,
        reference_ms=reference_ms,
        start_joules=joules_per_call(start),
        best_joules=joules_per_call(best),
        reference_joules=reference_joules,
        start_bottleneck=bottleneck_of(start),
        best_bottleneck=bottleneck_of(best),
        speedup=speedup,
        speedup_vs_reference=vs_reference,
        runs_to_90=runs_to_90 if speedup > 1.0 else 0,
        runs_to_best=runs_to_best if speedup > 1.0 else 0,
        wasted=sum(r.outcome != "kept" for r in records),
        skills_used=used,
        final=final.fingerprint,
        seconds=seconds,
        gate_seconds=verdict_seconds(start) + sum(r.gate_seconds for r in records),
    )
