"""Verdicts as FlashInfer-Trace traces, and the verdict roll-ups, on the CPU.

The verdicts here are built from data (a real build of the correct kernel, hand-written
per-workload results), not from a GPU run: only the GPU stages are left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.gate.result import (
    Comparison,
    Correctness,
    GateVerdict,
    Status,
    Timing,
    WorkloadVerdict,
)
from klineage.gate.trace import append_traces, verdict_to_traces
from klineage.problem import load_problem
from tests.conftest import FIXTURES

pytestmark = pytest.mark.nvcc

KERNELS = FIXTURES / "kernels" / "scale_rows"


@pytest.fixture
def problem():
    return load_problem(FIXTURES / "problems" / "scale_rows")


def _verdict(builder: Builder, source: str, workloads: list[WorkloadVerdict]) -> GateVerdict:
    build = builder.build(source, "k.cu")
    return GateVerdict(
        problem="scale_rows_f32",
        kernel="k.cu",
        fingerprint="f" * 16,
        build=build,
        workloads=workloads,
        hardware="NVIDIA H200",
        libs={"torch": "2.x"},
        timestamp="2026-11-30T00:00:00+00:00",
    )


def _timing(ms: float) -> Timing:
    return Timing(samples_ms=[[ms] * 5, [ms * 1.01] * 5, [ms * 0.99] * 5])


def test_trace_fields_follow_the_status_rules(problem, shared_builder: Builder) -> None:
    w0, w1, w2 = problem.workloads
    results = [
        WorkloadVerdict(
            workload_uuid=w0.uuid,
            label=w0.label,
            status=Status.PASSED,
            correctness=Correctness(max_absolute_error=1e-7, trials=3),
            timing=_timing(0.010),
            reference_timing=_timing(0.020),
        ),
        WorkloadVerdict(
            workload_uuid=w1.uuid,
            label=w1.label,
            status=Status.INCORRECT_NUMERICAL,
            message="y: 3 of 9 elements wrong",
            correctness=Correctness(max_absolute_error=0.5, bad_elements=3),
        ),
        WorkloadVerdict(
            workload_uuid=w2.uuid, label=w2.label, status=Status.TIMEOUT, message="killed"
        ),
    ]
    verdict = _verdict(shared_builder, (KERNELS / "correct.cu").read_text(), results)
    assert verdict.status is Status.INCORRECT_NUMERICAL and not verdict.passed
    traces = verdict_to_traces(verdict, problem, solution="mine")
    assert [t["workload"]["uuid"] for t in traces] == [w0.uuid, w1.uuid, w2.uuid]
    passed, wrong, timeout = (t["evaluation"] for t in traces)
    assert passed["status"] == "PASSED"
    assert passed["performance"]["speedup_factor"] == pytest.approx(2.0)
    assert passed["environment"]["hardware"] == "NVIDIA H200"
    assert wrong["correctness"]["max_absolute_error"] == 0.5 and "performance" not in wrong
    assert "correctness" not in timeout and "performance" not in timeout
    assert timeout["log"] == "killed"
    assert traces[0]["solution"] == "mine" and traces[0]["definition"] == "scale_rows_f32"


def test_compile_error_gives_one_trace_per_workload(problem, shared_builder: Builder) -> None:
    verdict = _verdict(shared_builder, "this is not cuda\n", [])
    assert verdict.status is Status.COMPILE_ERROR
    traces = verdict_to_traces(verdict, problem)
    assert len(traces) == len(problem.workloads)
    assert all(t["evaluation"]["status"] == "COMPILE_ERROR" for t in traces)
    assert "k.cu:1" in traces[0]["evaluation"]["log"]


def test_traces_append_as_jsonl(problem, shared_builder: Builder, tmp_path: Path) -> None:
    verdict = _verdict(shared_builder, "broken\n", [])
    out = tmp_path / "deep" / "traces.jsonl"
    append_traces(out, verdict_to_traces(verdict, problem))
    append_traces(out, verdict_to_traces(verdict, problem))
    lines = out.read_text().splitlines()
    assert len(lines) == 2 * len(problem.workloads)
    assert json.loads(lines[0])["evaluation"]["status"] == "COMPILE_ERROR"


def test_not_slower_needs_every_trial() -> None:
    candidate = Timing(samples_ms=[[1.0], [1.0], [1.0]])
    assert Comparison.of(candidate, Timing(samples_ms=[[1.0], [1.0], [1.0]])).not_slower
    one_bad_trial = Timing(samples_ms=[[1.2], [1.2], [0.95]])
    comparison = Comparison.of(candidate, one_bad_trial)
    assert comparison.ratio == pytest.approx(1.2) and not comparison.not_slower
    assert not Comparison.of(candidate, Timing(samples_ms=[[0.9], [0.9], [0.9]])).not_slower


def test_timing_is_the_median_of_trial_medians() -> None:
    timing = Timing(samples_ms=[[1.0, 2.0, 9.0], [3.0, 3.0, 3.0], [0.5, 0.6, 0.7]])
    assert timing.trial_medians_ms == [2.0, 3.0, 0.6]
    assert timing.latency_ms == 2.0


def test_an_impossible_latency_is_written_as_a_runtime_error_that_says_so(
    problem, shared_builder: Builder
) -> None:
    w0 = problem.workloads[0]
    result = WorkloadVerdict(
        workload_uuid=w0.uuid,
        label=w0.label,
        status=Status.IMPOSSIBLE,
        message="measured 0.1 us, below the physical floor of 3 us",
    )
    source = (KERNELS / "correct.cu").read_text()
    [trace] = verdict_to_traces(_verdict(shared_builder, source, [result]), problem)[:1]
    evaluation = trace["evaluation"]
    assert evaluation["status"] == "RUNTIME_ERROR"
    assert evaluation["log"].startswith("IMPOSSIBLE: measured 0.1 us")
    assert "performance" not in evaluation
