"""The gate on a real GPU: a correct kernel passes, each adversarial kernel gets the right
verdict, and the worker goes on with the next kernel afterwards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.gate.gate import Gate
from klineage.gate.result import Status
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import FIXTURES, REPO

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

KERNELS = FIXTURES / "kernels" / "scale_rows"
HANG_TIMEOUT_S = 8.0

# (kernel file, expected status, a phrase the message must contain)
ADVERSARIAL = [
    ("wrong_answer.cu", Status.INCORRECT_NUMERICAL, "elements wrong"),
    ("partial_write.cu", Status.INCORRECT_NUMERICAL, "never written"),
    ("illegal_address.cu", Status.RUNTIME_ERROR, "illegal memory access"),
    ("endless_loop.cu", Status.TIMEOUT, "killed"),
    ("writes_input.cu", Status.RUNTIME_ERROR, "wrote to its input x"),
    ("cached_output.cu", Status.INCORRECT_NUMERICAL, "cached result"),
    ("other_stream.cu", Status.RUNTIME_ERROR, "another stream"),
    ("bad_launch.cu", Status.RUNTIME_ERROR, "run() returned cudaError"),
    ("host_crash.cu", Status.RUNTIME_ERROR, "SIGSEGV"),
    ("poison_detect.cu", Status.INCORRECT_NUMERICAL, "did not look poisoned"),
    ("freed_reference.cu", Status.INCORRECT_NUMERICAL, "never written"),
    ("wrong_precision.cu", Status.INCORRECT_NUMERICAL, "elements wrong"),
]

# Kernels that pass the check and cheat only when timed: (file, audits that may catch it
# first, since verified and profiled calls fall at random positions)
TIMED_CHEATS = [
    ("skip_after_warmup.cu", {"timed_output", "no_launch"}),
    ("pointer_cache.cu", {"timed_output", "launches"}),
    ("content_cache.cu", {"timed_output", "launches"}),
    ("batch_and_skip.cu", {"timed_output", "no_launch"}),
    ("side_stream_timed.cu", {"other_stream", "timed_output"}),
    ("background_thread.cu", {"other_stream", "timed_output", "no_launch"}),
    ("no_launch.cu", {"no_launch", "timed_output"}),
    ("persisting_l2.cu", {"persisting_l2"}),
    ("input_mutation_timed.cu", {"input_mutation"}),
]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory):
    builder = Builder(cache_dir=tmp_path_factory.mktemp("cache"))
    with Gate(builder, check_timeout_s=HANG_TIMEOUT_S) as judge:
        yield judge


def _kernel(name: str) -> KernelSource:
    return KernelSource.from_file(KERNELS / name)


def test_correct_kernel_passes_with_timing(gate: Gate) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    verdict = gate.run(problem, _kernel("correct.cu"))
    assert verdict.passed, [w.message for w in verdict.workloads]
    for w in verdict.workloads:
        assert w.correctness is not None and w.correctness.trials == 3
        assert w.timing is not None and len(w.timing.samples_ms) == 3
        assert all(len(trial) == 50 for trial in w.timing.samples_ms)
        assert w.speedup_factor is not None and w.speedup_factor > 0


@pytest.mark.parametrize(("name", "status", "phrase"), ADVERSARIAL)
def test_adversarial_kernel_verdict_then_worker_goes_on(
    gate: Gate, name: str, status: Status, phrase: str
) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    started = time.monotonic()
    verdict = gate.run(problem, _kernel(name), workloads=problem.workloads[:1], time_it=False)
    elapsed = time.monotonic() - started
    [result] = verdict.workloads
    assert result.status is status, result.message
    assert phrase in result.message
    if status is Status.TIMEOUT:
        assert elapsed < HANG_TIMEOUT_S + 5
    # the same gate judges the next kernel correctly: nothing was left broken
    after = gate.run(problem, _kernel("correct.cu"), workloads=problem.workloads[:1], time_it=False)
    assert after.passed, [w.message for w in after.workloads]


@pytest.mark.parametrize(("name", "audits"), TIMED_CHEATS)
def test_a_kernel_that_cheats_only_when_timed_is_caught(
    gate: Gate, name: str, audits: set[str]
) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    verdict = gate.run(problem, _kernel(name), workloads=problem.workloads[:1])
    [result] = verdict.workloads
    assert result.status is not Status.PASSED, "the cheat got past the audited timer"
    assert result.audit is not None and result.audit.failed in audits, (
        result.status,
        result.audit,
        result.message,
    )
    assert result.timing is None  # no latency is reported for a cheat
    after = gate.run(problem, _kernel("correct.cu"), workloads=problem.workloads[:1])
    assert after.passed, [w.message for w in after.workloads]
    assert after.workloads[0].latency_ms is not None


def test_honest_timing_is_audited(gate: Gate) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    verdict = gate.run(problem, _kernel("correct.cu"), workloads=problem.workloads[-1:])
    [result] = verdict.workloads
    assert result.passed, result.message
    audit = result.audit
    assert audit is not None and audit.failed is None and not audit.unavailable
    assert audit.input_sets >= 2
    # three verified calls a trial over three trials, and the profiled call
    assert audit.verified_calls == 3 * 3 + 1
    assert audit.checked_launches == audit.timed_launches
    assert audit.checked_launches and "scale" in audit.checked_launches[0]
    assert audit.floor_ms is not None and 0 < audit.floor_ms < result.latency_ms


def test_a_latency_below_the_declared_floor_is_impossible(gate: Gate) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows_floor")
    verdict = gate.run(problem, _kernel("correct.cu"), workloads=problem.workloads[:1])
    [result] = verdict.workloads
    assert result.status is Status.IMPOSSIBLE, result.message
    assert result.audit is not None and result.audit.failed == "floor"
    assert "below the physical floor" in result.message


def test_paired_comparison_against_itself_is_about_one(gate: Gate) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernel = _kernel("correct.cu")
    twin = KernelSource(kernel.text + "\n// twin\n", name="twin.cu")
    verdict = gate.run(problem, kernel, workloads=problem.workloads[-1:], against=twin)
    comparison = verdict.comparison
    assert comparison is not None and len(comparison.trial_ratios) == 3
    assert 0.8 < comparison.ratio < 1.25


def test_an_unpaired_gate_compares_without_timing_the_reference(tmp_path: Path) -> None:
    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernel = _kernel("correct.cu")
    twin = KernelSource(kernel.text + "\n// twin\n", name="twin.cu")
    builder = Builder(cache_dir=tmp_path)
    with Gate(builder, time_reference="unpaired") as unpaired:
        paired = unpaired.run(problem, kernel, workloads=problem.workloads[-1:], against=twin)
        alone = unpaired.run(problem, kernel, workloads=problem.workloads[-1:])
    (w,) = paired.workloads
    assert w.reference_timing is None and w.comparison is not None
    assert 0.8 < w.comparison.ratio < 1.25
    assert alone.workloads[0].reference_latency_ms is not None


def test_softmax_kernel_passes(gate: Gate) -> None:
    problem = load_problem(REPO / "expert_kernels" / "softmax")
    verdict = gate.run(problem, KernelSource.from_file(problem.root / "kernel.cu"))
    assert verdict.passed, [w.message for w in verdict.workloads]


def test_cli_gate_end_to_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    out = tmp_path / "verdict.json"
    traces = tmp_path / "traces.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "gate",
            str(FIXTURES / "problems" / "scale_rows"),
            "--kernel",
            str(KERNELS / "correct.cu"),
            "--json",
            str(out),
            "--traces",
            str(traces),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output
    assert out.is_file() and traces.read_text().count("\n") >= 1


def test_pool_gates_many_kernels_in_order(tmp_path: Path) -> None:
    from klineage.gate.pool import GatePool

    problem = load_problem(FIXTURES / "problems" / "scale_rows")
    kernels = [_kernel("correct.cu"), _kernel("wrong_answer.cu"), _kernel("partial_write.cu")]
    with GatePool(builder=Builder(cache_dir=tmp_path / "cache")) as pool:
        verdicts = pool.run_many(problem, kernels, workloads=problem.workloads[:1], time_it=False)
    assert [v.kernel for v in verdicts] == ["correct.cu", "wrong_answer.cu", "partial_write.cu"]
    assert [v.status for v in verdicts] == [
        Status.PASSED,
        Status.INCORRECT_NUMERICAL,
        Status.INCORRECT_NUMERICAL,
    ]
