"""The profile stage on the CPU: the command it gives ncu, reading back a recorded report,
the cache by build, the skip path (no ncu, counters not readable), and the verdict and its
traces. ncu itself is the stand-in of tests/gate/ncu_stand_in.py (it answers with reports
recorded on the H200); the GPU worker is the CPU stand-in runner."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from klineage.gate.bottleneck import Bottleneck
from klineage.gate.build import Builder, BuildResult, BuildStatus
from klineage.gate.gate import Gate
from klineage.gate.log import GateLog
from klineage.gate.ncu import NCU_ENV, PROFILE_METRICS
from klineage.gate.profile import ProfileRequest
from klineage.gate.profile_main import main as profile_main
from klineage.gate.profiler import ProfileConfig, Profiler, minimum_traffic, profiled_workload
from klineage.gate.result import GateVerdict
from klineage.gate.trace import verdict_to_traces
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES, REPO

STAND_IN = Path(__file__).with_name("ncu_stand_in.py")
SCALE_ROWS = FIXTURES / "problems" / "scale_rows"


@pytest.fixture
def stand_in_ncu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ncu is the stand-in, answering with the naive gelu's recorded report; returns the file
    that counts its profiling runs."""
    report = tmp_path / "gelu_naive.raw.csv"
    with gzip.open(FIXTURES / "ncu" / "gelu_naive.raw.csv.gz", "rt") as handle:
        report.write_text(handle.read())
    calls = tmp_path / "ncu_calls.txt"
    monkeypatch.setenv(NCU_ENV, str(STAND_IN))
    monkeypatch.setenv("NCU_STAND_IN_REPORT", str(report))
    monkeypatch.setenv("NCU_STAND_IN_CALLS", str(calls))
    return calls


def _built(key: str) -> BuildResult:
    """A build result as the build stage reports one (the stand-in never loads the library)."""
    return BuildResult(status=BuildStatus.OK, key=key, library=Path("kernel.so"))


def test_the_workload_profiled_is_the_one_that_moves_the_most() -> None:
    problem = load_problem(SCALE_ROWS)
    chosen = profiled_workload(problem.definition, problem.workloads)
    assert chosen.label == "rows=4096,cols=512"
    # x in, y out, float32: 2 x 4096 x 512 x 4 bytes, no FLOPs declared
    assert minimum_traffic(problem.definition, chosen) == (2 * 4096 * 512 * 4, 0.0)
    with pytest.raises(ValueError, match="no workload"):
        profiled_workload(problem.definition, [])


def test_a_profile_is_read_back_and_then_served_from_the_cache(
    stand_in_ncu: Path, tmp_path: Path
) -> None:
    problem = load_problem(SCALE_ROWS)
    profiler = Profiler(ProfileConfig(cache_dir=tmp_path / "profiles"))
    first = profiler.profile(
        _built("k1"), problem.definition, problem.workloads, hardware="NVIDIA H200"
    )
    assert first.profiled and not first.cached and first.seconds > 0
    assert first.tool == "Version stand-in"
    (launch,) = first.launches
    assert launch.kernel.startswith("gelu_tanh") and launch.dram_bytes == pytest.approx(47104)
    assert first.minimum_bytes == 2 * 4096 * 512 * 4
    assert first.bottleneck is not None and first.bottleneck.kind is Bottleneck.LAUNCH
    # the explicit metric list went to ncu, not a section set
    assert stand_in_ncu.read_text().splitlines() == [",".join(PROFILE_METRICS)]
    again = profiler.profile(_built("k1"), problem.definition, problem.workloads)
    assert again.cached and again.seconds == 0 and again.launches == first.launches
    assert len(stand_in_ncu.read_text().splitlines()) == 1  # no second ncu run
    profiler.profile(_built("k2"), problem.definition, problem.workloads)  # another build
    assert len(stand_in_ncu.read_text().splitlines()) == 2


def test_without_ncu_the_stage_is_skipped_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(NCU_ENV, str(tmp_path / "no-such-ncu"))
    problem = load_problem(SCALE_ROWS)
    profile = Profiler(ProfileConfig(cache_dir=tmp_path)).profile(
        _built("k"), problem.definition, problem.workloads
    )
    assert not profile.profiled and profile.bottleneck is None
    assert profile.skipped is not None and "ncu was not found" in profile.skipped
    assert profile.label == "rows=4096,cols=512"


def test_counters_ncu_may_not_read_skip_the_stage(
    stand_in_ncu: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    message = tmp_path / "denied.txt"
    message.write_text(  # as ncu prints it where counters are restricted to admins
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0.\n"
    )
    monkeypatch.setenv("NCU_STAND_IN_MESSAGE", str(message))
    problem = load_problem(SCALE_ROWS)
    profiler = Profiler(ProfileConfig(cache_dir=tmp_path / "profiles"))
    profile = profiler.profile(_built("k"), problem.definition, problem.workloads)
    assert profile.skipped is not None and "ERR_NVGPUCTRPERM" in profile.skipped
    assert not (tmp_path / "profiles").exists()  # a skip is not cached: it is the machine's


def _stand_in_gate(
    builder: Builder,
    tmp_path: Path | None,
    *,
    runner: str = "TimingStandInRunner",
    every_verdict: bool = True,
) -> Gate:
    """A gate whose GPU worker is the CPU stand-in `runner`; it profiles (with its cache in
    `tmp_path`) unless `tmp_path` is None."""
    profile = (
        ProfileConfig(cache_dir=tmp_path / "profiles", every_verdict=every_verdict)
        if tmp_path is not None
        else None
    )
    return Gate(builder, worker_runner=f"tests.gate.cpu_stand_in:{runner}", profile=profile)


CORRECT = FIXTURES / "kernels" / "scale_rows" / "correct.cu"


@pytest.mark.nvcc
def test_a_profiled_verdict_carries_the_profile_into_its_traces(
    stand_in_ncu: Path, shared_builder: Builder, tmp_path: Path
) -> None:
    problem = load_problem(SCALE_ROWS)
    with _stand_in_gate(shared_builder, tmp_path) as gate:
        verdict = gate.run(problem, KernelSource.from_file(CORRECT))
    profile = verdict.profile
    assert profile is not None and profile.profiled
    # the stand-in timed every call at 1 ms: 2.4 us of kernel in it is a launch-bound call
    assert profile.bottleneck is not None and profile.bottleneck.kind is Bottleneck.LAUNCH
    assert "against 1e+03 us timed" in profile.bottleneck.evidence[0]
    assert GateVerdict.model_validate_json(verdict.model_dump_json()).profile == profile
    traces = verdict_to_traces(verdict, problem)
    with_profile = [t for t in traces if "extra" in t["evaluation"]]
    assert [t["workload"]["uuid"] for t in with_profile] == [profile.workload_uuid]
    extra = json.loads(json.dumps(with_profile[0]["evaluation"]["extra"]))
    assert extra["profile"]["bottleneck"]["kind"] == "launch-bound"
    assert extra["profile"]["launches"][0]["top_stalls"][0]["reason"] == "long_scoreboard"
    # what bench/profile_kernels.py keeps of it
    record = profile_kernels_script().summary(verdict, 1.5)
    assert record["bottleneck"] == "launch-bound" and record["profile_seconds"] > 0
    assert record["evidence"] == profile.bottleneck.evidence
    assert [w["label"] for w in record["workloads"]] == [w.label for w in verdict.workloads]
    assert json.loads(json.dumps(record)) == record


def profile_kernels_script() -> ModuleType:
    """bench/profile_kernels.py, loaded with its folder importable (as it runs)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return load_bench_script("profile_kernels")
    finally:
        sys.path.remove(str(REPO / "bench"))


@pytest.mark.nvcc
def test_a_kernel_that_fails_is_not_profiled(
    stand_in_ncu: Path, shared_builder: Builder, tmp_path: Path
) -> None:
    problem = load_problem(SCALE_ROWS)
    with _stand_in_gate(shared_builder, tmp_path, runner="CheatingTimerStandInRunner") as gate:
        verdict = gate.run(problem, KernelSource.from_file(CORRECT))
    assert not verdict.passed and verdict.profile is not None
    assert verdict.profile.skipped == "not profiled: the kernel did not pass every workload"
    assert not stand_in_ncu.exists()  # ncu never ran


@pytest.mark.nvcc
def test_a_logged_verdict_made_without_profiling_gets_its_profile_when_served(
    stand_in_ncu: Path, shared_builder: Builder, tmp_path: Path
) -> None:
    problem = load_problem(SCALE_ROWS)
    kernel = KernelSource.from_file(CORRECT)
    path = tmp_path / "gatelog.jsonl"
    with _stand_in_gate(shared_builder, None) as plain:
        made = GateLog(path, plain).run(problem, kernel)
    assert made.profile is None and not stand_in_ncu.exists()
    with _stand_in_gate(shared_builder, tmp_path) as gate:
        log = GateLog(path, gate)
        served = log.run(problem, kernel)
        assert log.runs == 0 and log.hits == 1  # the verdict stands: no check, no timing
    assert served.profile is not None and served.profile.profiled
    assert served.workloads == made.workloads
    assert len(stand_in_ncu.read_text().splitlines()) == 1
    # logged again with its profile: read back without a gate, it has it
    again = GateLog(path, None).run(problem, kernel)
    assert again.profile == served.profile


@pytest.mark.nvcc
def test_a_gate_that_profiles_on_request_profiles_only_what_it_is_asked(
    stand_in_ncu: Path, shared_builder: Builder, tmp_path: Path
) -> None:
    problem = load_problem(SCALE_ROWS)
    kernel = KernelSource.from_file(CORRECT)
    with _stand_in_gate(shared_builder, tmp_path, every_verdict=False) as gate:
        assert not gate.profiles_every_verdict
        verdict = gate.run(problem, kernel)
        assert verdict.passed and verdict.profile is None and not stand_in_ncu.exists()
        latency = {w.label: w.latency_ms for w in verdict.workloads if w.latency_ms}
        profile = gate.profile_kernel(problem, kernel, latency)
    assert profile is not None and profile.profiled and profile.bottleneck is not None
    assert len(stand_in_ncu.read_text().splitlines()) == 1
    with _stand_in_gate(shared_builder, None) as plain:
        assert plain.profile_kernel(problem, kernel) is None  # a gate that does not profile


def test_the_profiled_process_reports_a_failed_call_and_a_bad_request(tmp_path: Path) -> None:
    problem = load_problem(SCALE_ROWS)
    request = tmp_path / "request.pkl"
    with request.open("wb") as handle:  # no GPU here, no library there: the call fails
        pickle.dump(
            ProfileRequest(
                str(tmp_path / "missing.so"), problem.definition, problem.workloads[0], 0
            ),
            handle,
        )
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "klineage.gate.profile_main", str(request)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 3 and "the profiled call failed" in done.stderr
    wrong = tmp_path / "wrong.pkl"
    wrong.write_bytes(pickle.dumps({"not": "a request"}))
    assert profile_main(["profile_main", str(wrong)]) == 2
    assert profile_main(["profile_main"]) == 2


def test_a_profiled_call_that_fails_skips_the_stage_with_its_message(
    stand_in_ncu: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the stand-in runs the profiled process as ncu would; without a GPU its call fails
    monkeypatch.setenv("NCU_STAND_IN_RUN", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    problem = load_problem(SCALE_ROWS)
    profiler = Profiler(ProfileConfig(cache_dir=tmp_path / "profiles"))
    profile = profiler.profile(_built("k"), problem.definition, problem.workloads)
    assert profile.skipped is not None
    assert profile.skipped.startswith("the profiled call failed: "), profile.skipped
    assert not (tmp_path / "profiles").exists()
