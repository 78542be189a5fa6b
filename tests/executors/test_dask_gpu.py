"""On a GPU: mining through the Dask executor with the real gate, against the local executor.

Run on a machine with a GPU, nvcc, a CUDA build of torch and the `dask` extra (with the
`dask-cuda` extra too, `this-host` runs on dask-cuda's LocalCUDACluster):

    python -m pytest -q tests/executors/test_dask_gpu.py
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install 'klineage[dask]'")

from klineage.executors import Executor, LocalExecutor
from klineage.executors.dask_cluster import DaskExecutor
from klineage.lineage import LineageGraph
from klineage.mining.mine import MineReport, mine
from klineage.mining.walk import MiningBudget
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

PROBLEM = FIXTURES / "mining" / "exp_scale"
BUDGET = MiningBudget(gate_runs=6)


@pytest.fixture(params=["this-host", "scheduler"])
def dask_executor(request: pytest.FixtureRequest) -> Iterator[DaskExecutor]:
    """`this-host`: what `--executor dask` starts here on GPU 0 (dask-cuda's cluster where
    installed, else one worker process per GPU from distributed); `scheduler`: a plain
    distributed cluster of one GPU=1 worker process, reached by its address as a cluster's
    would be (`--scheduler`)."""
    if request.param == "this-host":
        with DaskExecutor(devices=[0]) as executor:
            yield executor
        return
    from distributed import LocalCluster

    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=2,
            resources={"GPU": 1},
            dashboard_address=":0",
            env={"CUDA_VISIBLE_DEVICES": "0"},
        ) as cluster,
        DaskExecutor(cluster.scheduler_address) as executor,
    ):
        yield executor


def _mine(out: Path, executor: Executor) -> tuple[MineReport, LineageGraph]:
    report = mine(PROBLEM, out, executor=executor, budget=BUDGET, resume=False)
    return report, LineageGraph.load(out / "lineages" / "exp_scale_f32.json")


def _first_step(lineage: LineageGraph) -> list[tuple[str, str, str, str]]:
    """The expert's attempts: what was removed, the kernel it gave, the verdict's status
    (later steps depend on which accepted removal measured fastest: timing noise)."""
    return sorted(
        (a.mechanism, a.child, a.status.value, a.gate_status)
        for a in lineage.attempts_from(lineage.root)
    )


def test_mining_on_one_gpu_through_dask_gives_the_local_verdicts(
    dask_executor: DaskExecutor, tmp_path: Path
) -> None:
    here, here_lineage = _mine(tmp_path / "local", LocalExecutor([0]))
    there, there_lineage = _mine(tmp_path / "dask", dask_executor)
    assert there.walk_gate_runs == here.walk_gate_runs > 0
    assert _first_step(there_lineage) == _first_step(here_lineage)
    assert there_lineage.state(there_lineage.root).status == "PASSED"
    # every gate run went through the one GPU worker, its gate kept warm between tasks
    (worker,) = dask_executor.tally.workers()
    runs = there.walk_gate_runs + there.probe_gate_runs + there.round_trip_gate_runs
    assert worker.gate_runs == runs
    print(
        f"\n{dask_executor.describe()}: {worker.gate_runs} gate runs, "
        f"{worker.busy_seconds / worker.gate_runs:.3f} s each on the worker, "
        f"{worker.overhead_seconds / worker.gate_runs * 1e3:.1f} ms scheduling and transfer "
        f"each ({worker.overhead_share:.1%})"
    )
    assert worker.overhead_seconds / worker.gate_runs < 0.5  # seconds; the bench measures it
