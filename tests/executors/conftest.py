"""Dask clusters on the CPU for the executor tests: real schedulers and workers (threads in
this process, or worker processes), gating with the labelled stand-in of `stand_in.py`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from klineage.gate.build import Builder
from tests.mining import conftest as mining_fixtures


@dataclass(frozen=True)
class Cluster:
    """A running CPU cluster whose workers offer GPU=1 (each stands for one GPU)."""

    client: Any
    """A `distributed.Client` connected to it."""
    cluster: Any
    """The `distributed.LocalCluster` (to close it mid-run, or kill a worker)."""


def local_cluster(workers: int = 2, *, processes: bool = False, tcp: bool = False) -> Any:
    """A LocalCluster of `workers` GPU=1 workers, two threads each (a build beside a gate);
    with `tcp`, reachable by its address (`--scheduler`) even when its workers are threads."""
    from distributed import LocalCluster

    return LocalCluster(
        n_workers=workers,
        threads_per_worker=2,
        processes=processes,
        protocol="tcp" if tcp or processes else None,
        resources={"GPU": 1},
        dashboard_address=":0",  # any free port: runs side by side never collide
        scheduler_port=0,
    )


@pytest.fixture
def cpu_cluster() -> Iterator[Cluster]:
    """Two thread workers in this process, GPU=1 each."""
    from distributed import Client

    with local_cluster() as cluster, Client(cluster, set_as_default=False) as client:
        yield Cluster(client, cluster)


@dataclass(frozen=True)
class StandIn:
    """Where the workers' stand-in gates build and what they record."""

    worker_cache: Path
    """The workers' build cache."""
    runs_file: Path
    """One line per verdict a stand-in gate made, on any worker."""

    def options(self) -> dict[str, str]:
        """The GateSpec options of `tests.executors.stand_in:stand_in_gate`."""
        return {"cache_dir": str(self.worker_cache), "runs_file": str(self.runs_file)}


@pytest.fixture
def stand_in(tmp_path: Path, shared_cache_dir: Path) -> StandIn:
    """Workers and this process build into the run's shared cache (`KLINEAGE_CACHE_DIR`, so
    the walk's states compile once per test run; `test_cluster_builds.py` covers entries
    travelling between caches), and a fresh record of gate runs."""
    return StandIn(shared_cache_dir, tmp_path / "gate_runs.jsonl")


@pytest.fixture(scope="session")
def builder(shared_builder: Builder) -> Builder:
    """The session's nvcc builder (as the mining tests': their `mined` fixture needs it)."""
    return shared_builder


mined = mining_fixtures.mined
"""exp_scale mined once per session with the stand-in gate (the mining tests' fixture)."""


def stand_in_executor_for_commands(stand_in: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `--executor dask` of `klineage mine` and `replay` gates with the labelled stand-in
    (GPU boundary); the rest is the command's own: the address, the connection, the table."""
    import functools

    import klineage.executors.dask_cluster
    from klineage.executors.dask_cluster import DaskExecutor
    from tests.executors.stand_in import STAND_IN_GATE

    executor = functools.partial(
        DaskExecutor, gate_factory=STAND_IN_GATE, gate_options=stand_in.options()
    )
    monkeypatch.setattr(klineage.executors.dask_cluster, "DaskExecutor", executor)
