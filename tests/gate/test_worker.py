"""The worker process machinery, driven through a CPU stand-in runner (no GPU needed)."""

from __future__ import annotations

import time

import pytest

from klineage.gate.worker import DebugRequest, GpuWorker, WorkerCrashed, WorkerTimeout

STAND_IN = "tests.gate.cpu_stand_in:CpuStandInRunner"


@pytest.fixture
def worker():
    handle = GpuWorker(runner=STAND_IN)
    yield handle
    handle.close()


def test_worker_starts_and_answers(worker: GpuWorker) -> None:
    hello = worker.start()
    assert hello.hardware == "cpu stand-in"
    assert worker.request(DebugRequest("echo", {"x": 1}), timeout_s=10) == {"x": 1}
    assert worker.starts == 1


def test_crash_is_reported_and_the_next_request_restarts(worker: GpuWorker) -> None:
    first_pid = worker.start().libs["pid"]
    with pytest.raises(WorkerCrashed, match="SIGSEGV"):
        worker.request(DebugRequest("crash"), timeout_s=10)
    assert not worker.alive
    assert worker.request(DebugRequest("echo", 7), timeout_s=10) == 7
    assert worker.starts == 2
    assert worker.hello is not None and worker.hello.libs["pid"] != first_pid


def test_hang_is_killed_within_the_timeout(worker: GpuWorker) -> None:
    worker.start()
    started = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"within 1\.5 s"):
        worker.request(DebugRequest("hang"), timeout_s=1.5)
    assert time.monotonic() - started < 5
    assert not worker.alive
    assert worker.request(DebugRequest("echo", "again"), timeout_s=10) == "again"


def test_a_worker_that_cannot_start_says_why_in_one_line() -> None:
    broken = GpuWorker(runner="klineage.no_such_module:Runner", start_timeout_s=30)
    with pytest.raises(WorkerCrashed) as info:
        broken.start()
    message = str(info.value)
    assert "could not start" in message and "No module named 'klineage.no_such_module'" in message
    assert "Traceback" not in message
    assert not broken.alive
    broken.close()


@pytest.mark.nvcc
def test_gate_without_a_gpu_says_what_to_do(shared_builder) -> None:
    from klineage.gate.gate import Gate, GateSetupError
    from klineage.kernel import KernelSource
    from klineage.problem import load_problem
    from tests.conftest import FIXTURES

    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernel = KernelSource.from_file(FIXTURES / "kernels" / "scale_rows" / "correct.cu")
    # the stand-in refuses to start, as the real runner does on a machine without a GPU
    runner = "tests.gate.cpu_stand_in:NoGpuRunner"
    with (
        Gate(shared_builder, worker_runner=runner) as gate,
        pytest.raises(GateSetupError, match="pass --build-only"),
    ):
        gate.run(problem, kernel)


@pytest.mark.nvcc
def test_an_unpaired_only_gate_times_the_reference_only_without_a_baseline(
    shared_builder,
) -> None:
    from klineage.gate.gate import Gate
    from klineage.kernel import KernelSource
    from klineage.problem import load_problem
    from tests.conftest import FIXTURES

    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernel = KernelSource.from_file(FIXTURES / "kernels" / "scale_rows" / "correct.cu")
    runner = "tests.gate.cpu_stand_in:TimingStandInRunner"
    builder = shared_builder
    with Gate(builder, worker_runner=runner, time_reference="unpaired") as gate:
        paired = gate.run(problem, kernel, against=kernel)
        alone = gate.run(problem, kernel)
    for w in paired.workloads:  # mining's walk: the baseline is what the ratio is against
        assert w.reference_timing is None and w.comparison is not None
        assert w.comparison.ratio == pytest.approx(1.0)
    for w in alone.workloads:  # the expert's own verdict still gets its reference time
        assert w.reference_timing is not None and w.reference_latency_ms == pytest.approx(3.0)
    with Gate(builder, worker_runner=runner) as gate:  # the default: always
        always = gate.run(problem, kernel, against=kernel)
    assert all(w.reference_latency_ms == pytest.approx(3.0) for w in always.workloads)
