"""Where builds and gate runs happen: the executor interface.

Mining and replay keep their search loop and their gate log (its one writer) in the calling
process. What travels is narrow: an executor hands out gates, one per GPU it can use at once,
that mining and replay use exactly as they use a local :class:`~klineage.gate.gate.Gate`
(`build` and `run`), and a builder whose `build_many` may compile elsewhere. A backend (the
local pool, Dask; Ray later) only decides where those calls run.

Every task an executor runs is counted per worker in its :class:`TaskTally`, for progress
displays and for the scheduling overhead (a round trip's time outside the task).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Literal

from klineage.gate.build import Builder, BuildResult
from klineage.gate.log import GateLike
from klineage.gate.profile import Profile
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem, Workload

TaskKind = Literal["gate", "build"]


class ExecutorError(RuntimeError):
    """An executor cannot start or reach its workers (a missing extra, a bad scheduler
    address, a cluster without a GPU worker). The message is one line saying what to do."""


def require_distributed() -> Any:
    """The `distributed` module, or an ExecutorError naming the extra to install (called
    before anything that imports it at its top, such as the Dask backend's modules)."""
    try:
        import distributed
    except ImportError:
        raise ExecutorError(
            "--executor dask needs the `distributed` package: pip install 'klineage[dask]'"
        ) from None
    return distributed


@dataclass(frozen=True)
class WorkerTally:
    """What one worker (a local GPU, or a Dask worker) has done so far."""

    worker: str
    """The worker's name: `gpu0` locally, the worker's address on a Dask cluster."""
    gate_runs: int = 0
    """Gate runs it made."""
    builds: int = 0
    """Builds it made for another process's cache (cluster builds)."""
    busy_seconds: float = 0.0
    """Seconds inside its tasks."""
    overhead_seconds: float = 0.0
    """Seconds its gate runs' round trips spent outside the task (scheduling, transfers)."""

    @property
    def overhead_share(self) -> float:
        """Scheduling overhead per gate run, as a share of the gate runs' own time."""
        return self.overhead_seconds / self.busy_seconds if self.busy_seconds else 0.0


class TaskTally:
    """Tasks per worker, updated from many threads at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: dict[str, WorkerTally] = {}

    def record(self, worker: str, kind: TaskKind, seconds: float, overhead: float = 0.0) -> None:
        """One finished task: `seconds` inside it, `overhead` around it (gate runs only)."""
        with self._lock:
            now = self._workers.get(worker, WorkerTally(worker))
            if kind == "gate":
                now = replace(
                    now,
                    gate_runs=now.gate_runs + 1,
                    busy_seconds=now.busy_seconds + seconds,
                    overhead_seconds=now.overhead_seconds + max(0.0, overhead),
                )
            else:
                now = replace(now, builds=now.builds + 1)
            self._workers[worker] = now

    def workers(self) -> list[WorkerTally]:
        """Every worker that ran a task, by name."""
        with self._lock:
            return [self._workers[name] for name in sorted(self._workers)]


class TalliedGate:
    """A gate whose runs are counted under a worker's name; everything else is the gate's."""

    def __init__(self, gate: GateLike, worker: str, tally: TaskTally) -> None:
        self.gate = gate
        self.worker = worker
        self.tally = tally
        self.builder: Builder | None = getattr(gate, "builder", None)
        """The gate's builder (the gate log and the walk build through it)."""

    def build(self, kernel: KernelSource) -> BuildResult:
        """The gate's build."""
        return self.gate.build(kernel)

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        """The gate's verdict, counted."""
        started = time.perf_counter()
        verdict = self.gate.run(
            problem, kernel, workloads=workloads, time_it=time_it, against=against
        )
        self.tally.record(self.worker, "gate", time.perf_counter() - started)
        return verdict

    def profile_kernel(
        self,
        problem: Problem,
        kernel: KernelSource,
        latency_ms: dict[str, float] | None = None,
        *,
        workloads: Sequence[Workload] | None = None,
    ) -> Profile | None:
        """The gate's profile stage alone (None where the gate does not profile). Mining and
        replay find it by name: without it here, `--profile` profiled nothing."""
        profile_kernel = getattr(self.gate, "profile_kernel", None)
        if profile_kernel is None:
            return None
        if workloads is None:  # as mining and replay ask: the problem's own workloads
            profile: Profile | None = profile_kernel(problem, kernel, latency_ms)
        else:
            profile = profile_kernel(problem, kernel, latency_ms, workloads=workloads)
        return profile

    def add_profile(
        self, problem: Problem, kernel: KernelSource, verdict: GateVerdict
    ) -> GateVerdict:
        """`verdict` with the gate's profile of `kernel` (unchanged where it does not profile)."""
        add_profile = getattr(self.gate, "add_profile", None)
        if add_profile is None:
            return verdict
        profiled: GateVerdict = add_profile(problem, kernel, verdict)
        return profiled


class Executor(ABC):
    """Runs builds and gate runs, here or on a cluster."""

    name: str
    """`local` or `dask` (the `--executor` value)."""

    def __init__(self) -> None:
        self.tally = TaskTally()
        """Tasks per worker so far."""

    @abstractmethod
    def gates(self, **gate_options: Any) -> AbstractContextManager[list[GateLike]]:
        """One gate per GPU this executor can use at once, each with a `builder`; closed (or
        left warm for the next call, on a cluster) when the context ends. `gate_options` are
        :class:`~klineage.gate.gate.Gate`'s keyword options (`time_reference`, ...). Raises
        :class:`~klineage.gate.gate.GateSetupError` or :class:`ExecutorError` at once when
        there is no GPU to gate on."""

    @abstractmethod
    def describe(self) -> str:
        """One line: the backend and its workers."""

    def close(self) -> None:  # noqa: B027 (the local pool holds nothing between calls)
        """Release what the executor holds (a cluster connection, warm gates)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
