"""The profile stage and energy per call on a real GPU (the H200): ncu profiles the softmax
expert's largest workload, the counters and the bottleneck make sense for a kernel that
streams 1 GB, a second verdict is served from the profile cache, and NVML's counter gives a
plausible energy per call, measured after the samples."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.gate.bottleneck import Bottleneck
from klineage.gate.build import Builder
from klineage.gate.energy import EnergyConfig
from klineage.gate.gate import Gate
from klineage.gate.ncu import find_ncu
from klineage.gate.profiler import ProfileConfig
from klineage.gate.result import GateVerdict
from klineage.gate.trace import verdict_to_traces
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

SOFTMAX = REPO / "expert_kernels" / "softmax"
NAIVE_GELU = REPO / "heldout" / "gelu"


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory):
    if find_ncu() is None:
        pytest.skip("needs Nsight Compute (ncu) on PATH")
    folder: Path = tmp_path_factory.mktemp("profile")
    builder = Builder(cache_dir=folder / "builds")
    with Gate(
        builder,
        profile=ProfileConfig(cache_dir=folder / "profiles"),
        energy=EnergyConfig(),
    ) as judge:
        yield judge


def test_the_softmax_expert_is_profiled_memory_bound(gate: Gate) -> None:
    problem = load_problem(SOFTMAX)
    verdict = gate.run(problem, problem.kernel_source())
    assert verdict.passed
    profile = verdict.profile
    assert profile is not None and profile.profiled, profile.skipped if profile else None
    assert profile.label == "rows=4096,cols=32768"  # the largest: 512 MB each way
    launch = profile.launches[0]
    assert launch.duration_ns > 0 and launch.dram_pct is not None and launch.sm_pct is not None
    assert launch.achieved_occupancy_pct and launch.theoretical_occupancy_pct
    assert launch.blocks_per_sm_limits and launch.registers_per_thread
    assert launch.top_stalls and launch.shared_bank_conflicts is not None
    # one pass over 1 GB: read once, written once
    ratio = profile.bytes_over_minimum
    assert ratio is not None and 0.9 < ratio < 1.5, ratio
    assert profile.bottleneck is not None
    assert profile.bottleneck.kind is Bottleneck.MEMORY, profile.bottleneck.evidence
    assert profile.bottleneck.roofline_side == "memory"
    assert profile.seconds > 0 and not profile.cached
    print(f"profile stage: {profile.seconds:.1f} s of ncu; {profile.bottleneck.evidence}")
    traces = verdict_to_traces(verdict, problem)
    profiled = [t for t in traces if "extra" in t["evaluation"]]
    assert len(profiled) == 1 and profiled[0]["workload"]["uuid"] == profile.workload_uuid


def test_a_second_verdict_is_served_from_the_profile_cache(gate: Gate) -> None:
    problem = load_problem(SOFTMAX)
    verdict = gate.run(problem, problem.kernel_source(), time_it=False)
    assert verdict.profile is not None and verdict.profile.cached
    assert verdict.profile.bottleneck is not None


def test_energy_per_call_sits_next_to_latency(gate: Gate) -> None:
    problem = load_problem(NAIVE_GELU)
    verdict = gate.run(problem, KernelSource.from_file(NAIVE_GELU / "kernel.cu"))
    assert verdict.passed
    if importlib.util.find_spec("pynvml") is None:
        assert "nvidia-ml-py" in verdict.energy_unavailable
        pytest.skip("NVML's bindings are not installed: energy absent, as it should be")
    assert not verdict.energy_unavailable
    for workload in verdict.workloads:
        energy, reference = workload.energy, workload.reference_energy
        assert energy is not None and reference is not None
        assert energy.seconds >= EnergyConfig().min_seconds
        assert 30.0 < energy.mean_watts < 1200.0, energy  # an H200 board draws up to 700 W
        assert energy.joules_per_call > 0
        print(
            f"{workload.label}: {workload.latency_ms:.4f} ms, "
            f"{energy.joules_per_call * 1e3:.4g} mJ/call ({energy.mean_watts:.0f} W); "
            f"reference {reference.joules_per_call * 1e3:.4g} mJ/call"
        )


def test_a_gate_that_profiles_on_request_profiles_the_kernel_it_is_given(gate: Gate) -> None:
    problem = load_problem(NAIVE_GELU)
    kernel = KernelSource.from_file(NAIVE_GELU / "kernel.cu")
    profile = gate.profile_kernel(problem, kernel)
    assert profile is not None and profile.profiled and profile.bottleneck is not None
    print(f"naive gelu: {profile.bottleneck.kind.value}: {profile.bottleneck.evidence}")


def test_the_gate_command_prints_the_profile_and_the_energy(tmp_path: Path) -> None:
    if find_ncu() is None:
        pytest.skip("needs Nsight Compute (ncu) on PATH")
    out = tmp_path / "verdict.json"
    traces = tmp_path / "traces.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "gate",
            str(SOFTMAX),
            "--profile",
            "--energy",
            "--json",
            str(out),
            "--traces",
            str(traces),
        ],
    )
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "bottleneck: memory-bound" in result.output
    verdict = GateVerdict.model_validate_json(out.read_text())
    assert verdict.profile is not None and verdict.profile.profiled
    assert any("profile" in line for line in traces.read_text().splitlines())
    if importlib.util.find_spec("pynvml") is not None:
        assert "energy (mJ)" in result.output
