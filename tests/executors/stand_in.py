"""STAND-IN gate for Dask workers (a labelled test double at the GPU boundary).

A worker makes it through :class:`klineage.executors.on_worker.GateSpec`, as it would make the
real gate: real nvcc builds into the worker's own cache, the check and time stages synthesized
by the mining tests' stand-in (:mod:`tests.mining.stand_in_gate`, exp_scale's costs). Every
verdict it makes is appended to `runs_file` (one JSON line: problem, kernel, baseline,
workloads, the worker), so a test counts gate runs across all workers and across the runs of
a resumed job.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

from distributed import get_worker

from klineage.gate.build import Builder
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem, Workload
from tests.mining.stand_in_gate import StandInGate
from tests.mining.test_mine import COST, EXPERT

STAND_IN_GATE = "tests.executors.stand_in:stand_in_gate"


_written = threading.Lock()


class CountingStandInGate(StandInGate):
    """The mining tests' stand-in, logging each verdict it makes to a file."""

    def __init__(self, builder: Builder, runs_file: Path) -> None:
        super().__init__(builder, cost=COST, expert_mechanisms=EXPERT)
        self.runs_file = runs_file

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        verdict = super().run(
            problem, kernel, workloads=workloads, time_it=time_it, against=against
        )
        line = {
            "problem": problem.name,
            "kernel": kernel.fingerprint,
            "against": against.fingerprint if against is not None else None,
            "workloads": [w.uuid for w in (problem.workloads if workloads is None else workloads)],
            "time_it": time_it,
            "worker": _worker_address(),
        }
        with _written, self.runs_file.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
        return verdict


def _worker_address() -> str:
    """The Dask worker running this gate run, or `here` outside a task (the local path)."""
    try:
        return str(get_worker().address)
    except ValueError:
        return "here"


def stand_in_gate(cache_dir: str, runs_file: str, **_gate_options: object) -> CountingStandInGate:
    """What a worker calls for a gate (the GateSpec factory); the real gate's options, such
    as mining's `time_reference`, mean nothing to the stand-in."""
    return CountingStandInGate(Builder(cache_dir=Path(cache_dir)), Path(runs_file))


def gate_runs(runs_file: Path) -> list[dict[str, object]]:
    """Every verdict the stand-in gates made, in order."""
    if not runs_file.is_file():
        return []
    return [json.loads(line) for line in runs_file.read_text().splitlines()]
