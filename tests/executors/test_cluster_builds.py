"""Builds on any worker, their cache entries carried back to this process and on to the GPU
worker with each gate run: real nvcc, real caches in separate folders, a real CPU cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install 'klineage[dask]'")

from klineage.executors.dask_cluster import DaskExecutor
from klineage.gate.build import RESULT_FILE, Builder, BuildStatus
from klineage.problem import load_problem
from tests.conftest import FIXTURES
from tests.executors.conftest import Cluster
from tests.executors.stand_in import STAND_IN_GATE

pytestmark = pytest.mark.nvcc

TARGET = FIXTURES / "mining" / "exp_target"
BROKEN = '__global__ void k(float* y) { y[0] = undeclared; }\nextern "C" int run() { return 0; }\n'


def _entries(cache: Path) -> set[str]:
    return {entry.parent.name for entry in cache.glob(f"*/*/{RESULT_FILE}")}


def test_builds_run_on_workers_and_their_entries_come_back(
    cpu_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "client"))
    kernel = (TARGET / "kernel.cu").read_text()
    with DaskExecutor(client=cpu_cluster.client, worker_cache_dir=tmp_path / "workers") as ex:
        with ex.gates() as gates:
            builder = gates[0].builder
            results = builder.build_many([(kernel, "kernel.cu"), (BROKEN, "broken.cu")])
            again = builder.build_many([kernel, BROKEN])
        tally = ex.tally.workers()
    # both built once, on workers; this process only read the entries they sent back
    assert sum(w.builds for w in tally) == 2
    assert {w.worker for w in tally} <= set(cpu_cluster.client.scheduler_info()["workers"])
    assert (
        _entries(tmp_path / "client") == _entries(tmp_path / "workers")
        and len(_entries(tmp_path / "client")) == 2
    )
    ok, broken = results
    assert ok.status is BuildStatus.OK and ok.cached and ok.library is not None
    assert ok.library.is_file() and ok.library.is_relative_to(tmp_path / "client")
    assert ok.report.kernels  # the ptxas report travelled with the entry
    assert broken.status is BuildStatus.COMPILE_ERROR and "undeclared" in broken.message
    assert "broken.cu" in broken.message  # re-rendered here under the name asked for
    assert [r.key for r in again] == [r.key for r in results] and all(r.cached for r in again)


def test_a_gate_run_carries_its_kernels_builds_to_the_gpu_workers_cache(
    cpu_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "client"))
    problem = load_problem(TARGET)
    kernel = problem.kernel_source()
    Builder().build(kernel.text, kernel.name)  # built here only
    options = {"cache_dir": str(tmp_path / "gpu"), "runs_file": str(tmp_path / "runs.jsonl")}
    with (
        DaskExecutor(
            client=cpu_cluster.client, gate_factory=STAND_IN_GATE, gate_options=options
        ) as ex,
        ex.gates() as gates,
    ):
        verdict = gates[0].run(problem, kernel)
        assert verdict.build.ok and verdict.build.cached  # the GPU worker compiled nothing
        assert _entries(tmp_path / "gpu") == _entries(tmp_path / "client")
        # carried once to a worker: with its copy gone, the next run there builds anew
        shutil.rmtree(tmp_path / "gpu")
        again = gates[0].run(problem, kernel)
    assert again.build.ok and not again.build.cached
    assert all(w.busy_seconds >= 0 and w.overhead_seconds > 0 for w in ex.tally.workers())


def test_an_entry_with_a_path_in_a_file_name_is_refused(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path)
    with pytest.raises(ValueError, match="a file name with a path in it"):
        builder.import_entry("ab" * 32, {"../escape.so": b"", RESULT_FILE: b"{}"})
    with pytest.raises(ValueError, match=r"no result\.json"):
        builder.import_entry("ab" * 32, {"kernel.so": b""})
    assert not any(tmp_path.rglob("*.so"))


def test_without_dask_cuda_each_gpu_gets_a_worker_process_that_sees_only_it() -> None:
    import os

    from distributed import Client

    from klineage.executors.dask_cluster import _per_gpu_cluster

    # what `--executor dask` starts on this host without dask-cuda; nothing here touches a
    # GPU, so it starts on a CPU machine too
    with _per_gpu_cluster(["0", "3"]) as cluster, Client(cluster, set_as_default=False) as client:
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        workers = client.scheduler_info()["workers"]
    assert sorted(seen.values()) == ["0", "3"]
    assert sorted(info["name"] for info in workers.values()) == ["gpu0", "gpu3"]
    assert all(info["resources"] == {"GPU": 1} for info in workers.values())
    assert all(info["nthreads"] == 2 for info in workers.values())


def test_devices_are_numbered_as_this_process_sees_them() -> None:
    from klineage.executors import ExecutorError
    from klineage.executors.dask_cluster import visible_device_ids

    assert visible_device_ids([0, 1], None) == ["0", "1"]
    # a process limited to GPUs 5 and 7 calls them 0 and 1; its workers must be told 5 and 7
    assert visible_device_ids([1, 0], "5,7") == ["7", "5"]
    assert visible_device_ids([0], "GPU-8f1c, GPU-aa02") == ["GPU-8f1c"]
    with pytest.raises(ExecutorError, match=r"--devices 2: this process sees 2 GPU\(s\)"):
        visible_device_ids([2], "5,7")
