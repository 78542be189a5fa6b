"""Where builds and gate runs happen: this machine's GPUs (`local`, the default) or a Dask
cluster (`dask`). See :mod:`klineage.executors.base` for the interface."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from klineage.executors.base import (
    Executor,
    ExecutorError,
    TaskTally,
    WorkerTally,
    require_distributed,
)
from klineage.executors.local import LocalExecutor

__all__ = [
    "Executor",
    "ExecutorError",
    "ExecutorKind",
    "LocalExecutor",
    "TaskTally",
    "WorkerTally",
    "open_executor",
]


class ExecutorKind(str, Enum):
    """The `--executor` values."""

    LOCAL = "local"
    DASK = "dask"


def open_executor(
    kind: ExecutorKind | str = ExecutorKind.LOCAL,
    scheduler: str | None = None,
    devices: Sequence[int] | None = None,
) -> Executor:
    """The executor the command line asks for. `scheduler` (a Dask address) only with `dask`;
    `dask` without one starts a one-worker-per-GPU cluster on this host's `devices`.
    ExecutorError with one line on a bad combination, a missing extra or no scheduler."""
    chosen = ExecutorKind(kind)
    if chosen is ExecutorKind.LOCAL:
        if scheduler is not None:
            raise ExecutorError(
                "--scheduler is for --executor dask; the local executor uses this machine's GPUs"
            )
        return LocalExecutor(devices)
    require_distributed()  # before the backend's modules, which import it at their top
    from klineage.executors.dask_cluster import DaskExecutor

    if scheduler is not None and devices is not None:
        raise ExecutorError(
            "--devices picks GPUs of this host; with --scheduler the cluster's workers own theirs"
        )
    return DaskExecutor(scheduler, devices=devices)
