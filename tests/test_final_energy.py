"""bench/final_energy.py on the CPU: the final kernels it reads from the kept replay, and its
records and summary from verdicts a stand-in gate makes (the GPU boundary: no NVML here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.gate.energy import Energy
from klineage.gate.result import GateVerdict, Status, Timing, WorkloadVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

energy = load_bench_script("final_energy")
REPORT = REPO / "bench" / "results" / "replay.json"
LINEAGES = REPO / "bench" / "results" / "replay_lineages"
METHODS = {"naive", "skills", "blind", "memory", "tree", "profiled"}


def test_each_problem_s_final_kernels_are_read_once_with_every_method_that_ended_there() -> None:
    finals = energy.final_kernels(REPORT, LINEAGES)
    report = json.loads(REPORT.read_text(encoding="utf-8"))
    problems = {r["problem"] for r in report["results"]}
    assert {f.problem for f in finals} == problems
    for problem in problems:
        mine = [f for f in finals if f.problem == problem]
        labels = [m for f in mine for m in f.methods]
        assert sorted(labels) == sorted(METHODS)  # each method once, with the naive kernel
        assert len({f.kernel.fingerprint for f in mine}) == len(mine)
    for result in report["results"]:
        [final] = [
            f for f in finals if f.problem == result["problem"] and result["method"] in f.methods
        ]
        assert final.kernel.fingerprint.startswith(result["final"])
    # nothing was kept on histogram by any method: one kernel, the naive one, for all six
    [histogram] = [f for f in finals if f.problem == "histogram_i32"]
    assert set(histogram.methods) == METHODS


class _StandInEnergyGate:
    """The GPU boundary: a verdict per kernel with latencies and joules per call made up from
    the kernel's length (a longer kernel here is a faster, thriftier one)."""

    def __init__(self) -> None:
        self.kernels: list[str] = []

    def run(self, problem: Problem, kernel: KernelSource) -> GateVerdict:
        self.kernels.append(kernel.fingerprint)
        scale = 1000.0 / len(kernel.text)
        workloads = [
            WorkloadVerdict(
                workload_uuid=w.uuid,
                label=w.label,
                status=Status.PASSED,
                timing=Timing(samples_ms=[[0.1 * scale]]),
                reference_timing=Timing(samples_ms=[[0.1]]),
                energy=Energy(joules_per_call=0.002 * scale, calls=100, seconds=0.4),
                reference_energy=Energy(joules_per_call=0.002, calls=100, seconds=0.4),
            )
            for w in problem.workloads
        ]
        return GateVerdict.model_validate(
            {
                "problem": problem.name,
                "kernel": kernel.name,
                "fingerprint": kernel.fingerprint,
                "build": {"status": "OK", "key": "stand-in", "library": None},
                "hardware": "stand-in (no GPU)",
                "workloads": [w.model_dump() for w in workloads],
            }
        )


def test_a_cut_run_goes_on_and_the_summary_ranks_by_energy(tmp_path: Path) -> None:
    out = tmp_path / "final_energy.jsonl"
    first = _StandInEnergyGate()
    energy.main(["--out", str(out), "--problems", "gelu_tanh_f32"], gate=first)
    gelu = [f for f in energy.final_kernels(REPORT, LINEAGES) if f.problem == "gelu_tanh_f32"]
    assert len(first.kernels) == len(gelu)
    again = _StandInEnergyGate()
    energy.main(
        ["--out", str(out), "--skip-done", "--problems", "gelu_tanh_f32", "rotary_neox_bf16"],
        gate=again,
    )
    rotary = [f for f in energy.final_kernels(REPORT, LINEAGES) if f.problem == "rotary_neox_bf16"]
    assert len(again.kernels) == len(rotary)  # gelu's were done
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(
        w["joules_per_call"] and w["reference_joules_per_call"]
        for r in rows
        for w in r["workloads"]
    )
    summary_file = tmp_path / "summary.json"
    energy.main(["--summarize", str(out), "--json", str(summary_file)])
    kept = json.loads(summary_file.read_text(encoding="utf-8"))
    # what the figures came from: the command, the cards and how many kernels passed
    assert kept["command"].startswith("python bench/final_energy.py --summarize")
    assert kept["hardware"] == ["stand-in (no GPU)"]
    assert kept["kernels"] == kept["passed"] == len(rows)
    summary = kept["methods"]
    assert set(summary) == METHODS
    assert all(s["problems"] == 2 for s in summary.values())
    # the stand-in makes energy follow the kernel's length: the naive kernel is the shortest
    # of each problem, so it uses the most energy and is never the least
    assert summary["naive"]["least_energy"] == 0
    assert summary["naive"]["energy_vs_pytorch"] < summary["skills"]["energy_vs_pytorch"]
    assert sum(s["least_energy"] for s in summary.values()) >= 2


def test_without_nvml_bindings_nothing_is_gated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every verdict would say "energy unavailable": stop before the first gate run instead
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pynvml" else real(name, *a)
    )
    out = tmp_path / "final_energy.jsonl"
    with pytest.raises(SystemExit, match="nvidia-ml-py"):
        energy.main(["--out", str(out), "--problems", "gelu_tanh_f32"])
    assert not out.exists()
