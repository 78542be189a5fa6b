"""Choosing an executor: `--executor`, `--scheduler` and `--devices` on `klineage mine` and
`klineage replay`, their one-line errors, the missing extra, and the per-worker tally."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import klineage.gate.pool
from klineage.cli import app
from klineage.cli.executor import WorkerProgress
from klineage.executors import ExecutorError, LocalExecutor, TaskTally, open_executor
from tests.conftest import FIXTURES

runner = CliRunner()
PROBLEM = str(FIXTURES / "mining" / "exp_scale")


def _has_dask() -> bool:
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


DASK = pytest.mark.skipif(
    not _has_dask(), reason="needs the dask extra: pip install 'klineage[dask]'"
)


def _one_line_error(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_a_scheduler_needs_the_dask_executor(command: str) -> None:
    result = runner.invoke(app, [command, PROBLEM, "--scheduler", "tcp://127.0.0.1:8786"])
    assert "--scheduler is for --executor dask" in _one_line_error(result)


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_an_unknown_executor_is_refused_with_the_choices(command: str) -> None:
    result = runner.invoke(app, [command, PROBLEM, "--executor", "ray"])
    assert result.exit_code == 2 and "'local', 'dask'" in result.output


@DASK
@pytest.mark.parametrize("command", ["mine", "replay"])
@pytest.mark.parametrize("address", ["8786", "tcp://", "tcp://host", "http://host:8786", "h:0"])
def test_a_malformed_scheduler_address_is_one_line(command: str, address: str) -> None:
    result = runner.invoke(app, [command, PROBLEM, "--executor", "dask", "--scheduler", address])
    assert _one_line_error(result) == (
        f"--scheduler {address!r}: expected a Dask scheduler address such as tcp://HOST:8786"
    )


@DASK
def test_a_scheduler_nobody_answers_at_is_one_line() -> None:
    # port 9 (discard) on this host: nothing listens, the connection is refused until the
    # timeout
    args = ["mine", PROBLEM, "--executor", "dask", "--scheduler", "127.0.0.1:9"]
    line = _one_line_error(runner.invoke(app, args))
    assert line.startswith("--scheduler tcp://127.0.0.1:9: no Dask scheduler answered within")
    assert "is `dask scheduler` running there" in line


@DASK
def test_devices_and_a_scheduler_do_not_go_together() -> None:
    args = ["replay", PROBLEM, "--executor", "dask", "--scheduler", "h:8786", "--devices", "0"]
    assert "--devices picks GPUs of this host" in _one_line_error(runner.invoke(app, args))


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_without_the_extra_the_dask_executor_names_it(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    result = runner.invoke(app, [command, PROBLEM, "--executor", "dask"])
    assert _one_line_error(result) == (
        "--executor dask needs the `distributed` package: pip install 'klineage[dask]'"
    )


def test_dask_without_a_scheduler_on_a_machine_without_gpus_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("distributed", reason="needs the dask extra: pip install 'klineage[dask]'")
    monkeypatch.setattr(klineage.gate.pool, "visible_gpus", lambda: 0)
    result = runner.invoke(app, ["replay", PROBLEM, "--executor", "dask"])
    assert result.exit_code == 2 and "no CUDA GPU is visible" in result.output


def test_the_local_executor_is_the_default_and_counts_runs_per_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class CountingGate:  # STAND-IN at the GPU boundary: a gate that answers nothing
        builder = None

        def run(self, *args: object, **kwargs: object) -> str:
            return "verdict"

    @contextlib.contextmanager
    def stand_in_gates(devices: list[int] | None, **options: object) -> Iterator[list[Any]]:
        assert devices == [2, 5] and options == {"time_reference": "unpaired"}
        yield [CountingGate(), CountingGate()]

    monkeypatch.setattr(klineage.gate.pool, "open_gates", stand_in_gates)
    executor = open_executor(devices=[2, 5])
    assert isinstance(executor, LocalExecutor)
    with executor.gates(time_reference="unpaired") as gates:
        gates[1].run(None, None)
        gates[1].run(None, None)
        gates[0].run(None, None)
    assert [(w.worker, w.gate_runs) for w in executor.tally.workers()] == [
        ("gpu2", 1),
        ("gpu5", 2),
    ]


def test_the_progress_table_has_a_bar_per_worker() -> None:
    tally = TaskTally()
    for _ in range(4):
        tally.record("tcp://10.0.0.1:40001", "gate", seconds=2.0, overhead=0.02)
    tally.record("tcp://10.0.0.2:40002", "gate", seconds=2.0, overhead=0.1)
    tally.record("tcp://10.0.0.2:40002", "build", seconds=1.3)
    console = Console(record=True, width=80)
    console.print(WorkerProgress(tally, "tasks per worker"))
    shown = console.export_text()
    first = next(line for line in shown.splitlines() if "10.0.0.1" in line)
    second = next(line for line in shown.splitlines() if "10.0.0.2" in line)
    assert first.split("│")[2].strip() == "4" and second.split("│")[2].strip() == "1"
    assert "1.0%" in first and "5.0%" in second  # overhead per gate run's own time
    assert second.split("│")[4].strip() == "1"  # one build


def test_open_executor_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="'ray' is not a valid ExecutorKind"):
        open_executor("ray")


def test_executor_error_is_a_runtime_error() -> None:
    assert issubclass(ExecutorError, RuntimeError)
