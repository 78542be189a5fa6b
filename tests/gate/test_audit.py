"""The timing audits' logic on the CPU: which calls are verified, what a profiled call
launched and whether it was ordered with the caller's stream, the physical floor, and how a
failure travels from the worker to the verdict (through the real worker process, with a CPU
stand-in runner at the GPU boundary)."""

from __future__ import annotations

import pickle
import random

import pytest

from klineage.gate.audit import (
    MARKER_KERNEL,
    AuditConfig,
    AuditFailure,
    GpuActivity,
    floor_audit,
    input_set_count,
    latency_floor,
    launch_audit,
    launches_between_markers,
    middle_block,
    profiled_positions,
    tensor_peak_flops,
    verified_positions,
)
from klineage.gate.build import Builder
from klineage.gate.gate import Gate
from klineage.gate.result import Status
from klineage.gate.worker import CheckReply, ErrorReply, TimeReply, ends_worker
from klineage.kernel import KernelSource
from tests.conftest import FIXTURES

OURS = 13  # the profiler's id of the worker's stream
SIDE = 21


def _marker(start: int, end: int) -> GpuActivity:
    return GpuActivity(f"void at::cuda::{MARKER_KERNEL}_kernel(long)", OURS, start, end)


def _window(*work: GpuActivity) -> list[GpuActivity]:
    """An opening marker 0-1000 ns, the call's work, a closing marker from 5000 ns."""
    return [_marker(0, 1000), *work, _marker(5000, 5100)]


# ---- which calls are verified ---------------------------------------------------------------


def test_verified_positions_are_several_random_and_change_every_trial() -> None:
    rng = random.Random(7)
    trials = [verified_positions(rng, 50, 3) for _ in range(20)]
    assert all(len(t) == 3 and all(0 <= s < 50 for s in t) for t in trials)
    assert len({frozenset(t) for t in trials}) > 15  # no fixed position
    assert verified_positions(rng, 2, 3) == {0, 1}  # all of them when there are fewer


def test_profiled_positions_fall_anywhere_in_the_run() -> None:
    rng = random.Random(3)
    seen = {slot for _ in range(200) for slot in profiled_positions(rng, 3, 50, 1)}
    assert {t for t, _ in seen} == {0, 1, 2}
    assert len(seen) > 100


def test_middle_block_leaves_head_and_tail_alone() -> None:
    rng = random.Random(1)
    for numel in (16, 100, 4096, 1 << 20):
        for _ in range(200):
            low, high = middle_block(rng, numel)
            assert numel // 8 <= low < high <= numel - numel // 8


def test_input_sets_shrink_with_memory_but_never_below_two() -> None:
    config = AuditConfig(input_sets=3, max_set_bytes=10 * 1024**3)
    assert input_set_count(1024, 3, config) == 3
    assert input_set_count(2 * 1024**3, 3, config) == 2  # 3 sets x 3 targets would not fit
    assert input_set_count(100 * 1024**3, 3, config) == 2


# ---- what a profiled call launched ----------------------------------------------------------


def test_work_between_the_markers_on_the_callers_stream_is_the_calls() -> None:
    seen = launches_between_markers(_window(GpuActivity("scale(float const*)", OURS, 1200, 3000)))
    assert seen.names == ["scale(float const*)"] and not seen.outside
    assert launch_audit(seen, ["scale(float const*)"], "here") is None


def test_fork_join_work_on_another_stream_passes() -> None:
    # waits for the caller's stream (starts after the opening marker), joins before the close
    seen = launches_between_markers(_window(GpuActivity("partial", SIDE, 1500, 4000)))
    assert not seen.outside


def test_work_not_ordered_with_the_callers_stream_is_outside() -> None:
    # started while the opening marker still ran: it never waited for the caller's stream
    early = launches_between_markers(_window(GpuActivity("scale", SIDE, 400, 900)))
    # ended after the closing marker started: the caller's stream never waited for it
    late = launches_between_markers(_window(GpuActivity("scale", SIDE, 1500, 6000)))
    for seen in (early, late):
        failure = launch_audit(seen, ["scale"], "a profiled call")
        assert failure is not None and failure.audit == "other_stream"
        assert failure.status is Status.RUNTIME_ERROR and "another stream" in failure.message


def test_a_call_that_launches_nothing_or_other_work_fails() -> None:
    empty = launch_audit(launches_between_markers(_window()), ["scale"], "call 3")
    assert empty is not None and empty.audit == "no_launch"
    copy = GpuActivity("Memcpy DtoD (Device -> Device)", OURS, 1200, 2000)
    swapped = launch_audit(launches_between_markers(_window(copy)), ["scale"], "call 3")
    assert swapped is not None and swapped.audit == "launches"
    assert "Memcpy DtoD" in swapped.message and "scale" in swapped.message


def test_a_profile_without_its_markers_is_an_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="marker"):
        launches_between_markers([GpuActivity("scale", OURS, 0, 10)])


def test_an_audit_failure_survives_the_trip_from_the_worker() -> None:
    failure = AuditFailure(Status.INCORRECT_NUMERICAL, "timed_output", "timed call 9 of trial 2")
    back = pickle.loads(pickle.dumps(failure))
    assert (back.status, back.audit, back.message) == (
        failure.status,
        failure.audit,
        failure.message,
    )


def test_a_worker_that_saw_a_cheat_is_replaced() -> None:
    failure = AuditFailure(Status.RUNTIME_ERROR, "other_stream", "x")
    assert ends_worker(TimeReply([], failure=failure))
    assert not ends_worker(TimeReply([]))
    assert ends_worker(CheckReply(Status.RUNTIME_ERROR, "x", None, "other_stream"))
    assert not ends_worker(CheckReply(Status.INCORRECT_NUMERICAL, "x", None))
    assert ends_worker(ErrorReply("kernel", "x", poisoned=True))


# ---- the physical floor -----------------------------------------------------------------


def _floor(**changes: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "input_bytes": 64 * 10**6,
        "output_bytes": 64 * 10**6,
        "declared_bytes": None,
        "declared_flops": None,
        "operand_dtypes": ["float32"],
        "copy_bytes_per_s": 4.0e12,
        "l2_bytes": 50 * 10**6,
        "hardware": "NVIDIA H200",
    }
    args.update(changes)
    return latency_floor(**args)  # type: ignore[arg-type]


def test_the_floor_counts_inputs_and_outputs_that_do_not_fit_in_the_l2() -> None:
    floor = _floor()
    assert floor is not None
    assert floor.bytes == 64 * 10**6 + 14 * 10**6
    assert floor.ms == pytest.approx(floor.bytes / (4.0e12 * 1.25) * 1e3)
    small = _floor(output_bytes=10**6)
    assert small is not None and small.bytes == 64 * 10**6


def test_declared_bytes_and_flops_set_the_floor() -> None:
    gather = _floor(declared_bytes=10**6)
    assert gather is not None and gather.bytes == 10**6
    gemm = _floor(declared_flops=2 * 8192**3, operand_dtypes=["bfloat16"])
    assert gemm is not None and gemm.flops_per_s == pytest.approx(989e12 * 1.1)
    assert gemm.ms == pytest.approx(2 * 8192**3 / (989e12 * 1.1) * 1e3)


def test_no_floor_without_a_measured_bandwidth_and_no_flop_peak_for_unknown_devices() -> None:
    assert _floor(copy_bytes_per_s=0.0) is None
    assert tensor_peak_flops("NVIDIA A100-SXM4-80GB", ["bfloat16"]) is None
    assert tensor_peak_flops("NVIDIA H100 80GB HBM3", ["float8_e4m3fn", "bfloat16"]) == 1979e12


def test_a_latency_below_the_floor_is_impossible() -> None:
    floor = _floor()
    assert floor is not None
    assert floor_audit(floor.ms * 1.01, floor) is None
    failure = floor_audit(floor.ms * 0.5, floor)
    assert failure is not None and failure.status is Status.IMPOSSIBLE and failure.audit == "floor"
    assert "below the physical floor" in failure.message
    # the default floor counts every input byte: the message says how to declare fewer
    assert "declare the bytes it must move as floor.bytes in definition.json" in failure.message
    declared = _floor(declared_bytes=32 * 10**6)
    assert declared is not None and declared.declared
    below = floor_audit(declared.ms * 0.5, declared)
    assert below is not None and "floor.bytes" not in below.message
    assert floor_audit(1e-9, None) is None


# ---- through the real worker process --------------------------------------------------------


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("runner", "status", "audit"),
    [
        (
            "tests.gate.cpu_stand_in:CheatingTimerStandInRunner",
            Status.INCORRECT_NUMERICAL,
            "timed_output",
        ),
        ("tests.gate.cpu_stand_in:FastTimerStandInRunner", Status.IMPOSSIBLE, "floor"),
    ],
)
def test_an_audit_failure_becomes_the_workloads_verdict(
    shared_builder: Builder, runner: str, status: Status, audit: str
) -> None:
    from klineage.problem import load_problem

    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernel = KernelSource.from_file(FIXTURES / "kernels" / "scale_rows" / "correct.cu")
    with Gate(shared_builder, worker_runner=runner) as gate:
        verdict = gate.run(problem, kernel, workloads=problem.workloads[:1])
        [result] = verdict.workloads
        assert result.status is status, result.message
        assert result.audit is not None and result.audit.failed == audit
        assert result.timing is None or status is Status.IMPOSSIBLE
        starts = gate.worker.starts
        gate.run(problem, kernel, workloads=problem.workloads[:1])
        # a worker that saw a cheat exits; an impossible latency is the parent's finding
        assert gate.worker.starts == starts + (1 if audit == "timed_output" else 0)
