"""Gate verdicts as FlashInfer-Trace traces (one JSON object per workload, JSONL).

Follows the trace schema's rules: a PASSED evaluation carries correctness and performance,
INCORRECT_NUMERICAL carries correctness only, every other status carries neither. One
deviation: a verdict that was checked but not timed (`--no-time`) writes PASSED with
correctness and no performance, since inventing a latency would be worse. Our IMPOSSIBLE (a
latency below the physical floor) is written as RUNTIME_ERROR, the log saying IMPOSSIBLE.
Our additions sit in `extra` objects, as the schema's correctness does: energy per call in
`performance.extra`, the profile stage's counters and bottleneck in `evaluation.extra.profile`
(on the profiled workload's trace; a skipped profile, with its reason, on every trace).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from klineage.gate.result import GateVerdict, Status, WorkloadVerdict
from klineage.problem import Problem, Workload


def _workload_json(workload: Workload) -> dict[str, Any]:
    return workload.model_dump(mode="json")


def _evaluation(verdict: GateVerdict, result: WorkloadVerdict | None) -> dict[str, Any]:
    status = result.status if result else Status.COMPILE_ERROR
    log = result.message if result else verdict.build.message
    written = status
    if status is Status.IMPOSSIBLE:
        # not a FlashInfer-Trace status: readers get RUNTIME_ERROR and the reason in the log
        written, log = Status.RUNTIME_ERROR, f"IMPOSSIBLE: {log}"
    evaluation: dict[str, Any] = {
        "status": written.value,
        "environment": {"hardware": verdict.hardware or "unknown", "libs": verdict.libs},
        "timestamp": verdict.timestamp,
        "log": log,
    }
    if result is None:
        return evaluation
    if status in (Status.PASSED, Status.INCORRECT_NUMERICAL) and result.correctness:
        c = result.correctness
        evaluation["correctness"] = {
            "max_relative_error": c.max_relative_error,
            "max_absolute_error": c.max_absolute_error,
            "extra": {
                "bad_elements": c.bad_elements,
                "total_elements": c.total_elements,
                "trials": c.trials,
            },
        }
    if status is Status.PASSED and result.timing and result.reference_timing:
        evaluation["performance"] = {
            "latency_ms": result.latency_ms,
            "reference_latency_ms": result.reference_latency_ms,
            "speedup_factor": result.speedup_factor,
        }
        energy = {
            key: value.joules_per_call
            for key, value in (
                ("joules_per_call", result.energy),
                ("reference_joules_per_call", result.reference_energy),
            )
            if value is not None
        }
        if energy:
            evaluation["performance"]["extra"] = energy
    profile = verdict.profile
    if profile is not None and profile.workload_uuid in ("", result.workload_uuid):
        # the profile stage profiles one workload; a skip (no workload) goes with every trace
        evaluation["extra"] = {"profile": profile.model_dump(mode="json")}
    return evaluation


def verdict_to_traces(
    verdict: GateVerdict, problem: Problem, solution: str | None = None
) -> list[dict[str, Any]]:
    """One trace per workload. A build failure yields a COMPILE_ERROR trace for each."""
    name = solution or f"{verdict.kernel}@{verdict.fingerprint}"
    by_uuid = {w.workload_uuid: w for w in verdict.workloads}
    workloads = [w for w in problem.all_workloads() if w.uuid in by_uuid] or problem.workloads
    return [
        {
            "definition": problem.definition.name,
            "workload": _workload_json(workload),
            "solution": name,
            "evaluation": _evaluation(verdict, by_uuid.get(workload.uuid)),
        }
        for workload in workloads
    ]


def append_traces(path: str | Path, traces: list[dict[str, Any]]) -> None:
    """Append traces to a JSONL file (created with its folder if missing)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as handle:
        for trace in traces:
            handle.write(json.dumps(trace, allow_nan=True) + "\n")
