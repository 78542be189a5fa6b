"""The `--executor`, `--scheduler` and `--devices` options of `klineage mine` and `klineage
replay`, and the live table of tasks per worker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from klineage.executors import Executor, ExecutorError, ExecutorKind, TaskTally, open_executor
from klineage.gate.gate import GateSetupError
from klineage.gate.pool import parse_devices
from klineage.problem import load_problem

ExecutorOption = Annotated[
    ExecutorKind,
    typer.Option(
        "--executor",
        case_sensitive=False,
        help="Where builds and gate runs happen: local (this machine's GPUs) or dask (a Dask "
        "cluster: the one at --scheduler, or one worker per GPU of this host, started here; "
        "pip install 'klineage[dask]'). The search and the gate log stay in this process "
        "either way.",
    ),
]
SchedulerOption = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="tcp://HOST:8786",
        help="A running Dask scheduler, for --executor dask; its workers gate with the "
        "resource GPU=1, one worker per GPU (pip install 'klineage[dask]').",
    ),
]


def open_cli_executor(
    kind: ExecutorKind, scheduler: str | None, devices: str | None, errors: Console
) -> Executor:
    """The executor asked for, or a one-line error and exit 2 (before any gate run)."""
    try:
        return open_executor(kind, scheduler, parse_devices(devices))
    except (ValueError, ExecutorError) as err:
        errors.print(Text(str(err), "red"))
        raise typer.Exit(2) from None
    except GateSetupError as err:  # a cluster of this host's GPUs, on a host without one
        errors.print(Text(f"gate error: {err}", "red"))
        raise typer.Exit(2) from None


def check_problem_folders(folders: list[Path], what: str, errors: Console) -> None:
    """Every problem folder loads and holds its kernel.cu (`what` it is for), or a one-line
    error naming the first that does not and exit 2: before the GPU is looked for, so a
    folder being prepared on a machine without one is checked all the same."""
    for folder in folders:
        try:
            problem = load_problem(folder)
        except (FileNotFoundError, ValueError) as err:
            errors.print(Text(str(err), "red"))
            raise typer.Exit(2) from None
        if problem.kernel_path is None or not problem.kernel_path.is_file():
            errors.print(
                Text(f"{folder}: no kernel.cu ({what}); add it beside definition.json", "red")
            )
            raise typer.Exit(2)


def refuse_profile_on_a_cluster(kind: ExecutorKind, profile: bool, errors: Console) -> None:
    """`--profile` with `--executor dask`: a one-line error and exit 2, before any gate run.
    A cluster's gates run on its workers, and the profile stage mining and replay ask for
    (`profile_kernel`) has no task there yet: the run would end with no counters at all."""
    if profile and kind == ExecutorKind.DASK:
        errors.print(
            Text(
                "--profile needs --executor local: Nsight Compute profiles run on this "
                "host's GPUs, and a Dask cluster's workers do not profile yet",
                "red",
            )
        )
        raise typer.Exit(2)


class WorkerProgress:
    """A bar per worker: the gate runs it made (against the busiest), its builds, and the
    time its gate runs spent outside the task (scheduling, transfers). Re-read on every
    refresh of a live display."""

    def __init__(self, tally: TaskTally, title: str) -> None:
        self.tally = tally
        self.title = title

    def __rich__(self) -> Table:
        table = Table(title=self.title, title_justify="left")
        workers = self.tally.workers()
        names = [w.worker.split("://", 1)[-1] for w in workers]  # the scheme says nothing here
        table.add_column("worker", no_wrap=True, min_width=max(map(len, names), default=6))
        for header in ("gate runs", "", "builds", "busy s", "overhead"):
            table.add_column(header, justify="left" if not header else "right", no_wrap=True)
        most = max((w.gate_runs for w in workers), default=0)
        for name, worker in zip(names, workers, strict=True):
            table.add_row(
                name,
                str(worker.gate_runs),
                ProgressBar(total=max(most, 1), completed=worker.gate_runs, width=12),
                str(worker.builds),
                f"{worker.busy_seconds:.1f}",
                f"{worker.overhead_share:.1%}",
            )
        return table
