"""Mining and replay through the Dask executor on a real CPU cluster: real schedulers and
workers, real nvcc builds, the labelled stand-in gate (`stand_in.py`) at the GPU boundary."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install 'klineage[dask]'")

from klineage.executors import ExecutorError
from klineage.executors.dask_cluster import DaskExecutor
from klineage.gate.build import Builder
from klineage.lineage import LineageGraph
from klineage.mining.mine import MineReport, mine
from klineage.mining.walk import WalkEvent
from tests.conftest import FIXTURES
from tests.executors.conftest import (
    Cluster,
    StandIn,
    local_cluster,
    stand_in_executor_for_commands,
)
from tests.executors.stand_in import STAND_IN_GATE, gate_runs, stand_in_gate

pytestmark = pytest.mark.nvcc

PROBLEM = FIXTURES / "mining" / "exp_scale"
LINEAGE = "lineages/exp_scale_f32.json"
VOLATILE = {"wall_seconds", "folder"}


def _executor(cluster: Cluster, stand_in: StandIn) -> DaskExecutor:
    return DaskExecutor(
        client=cluster.client, gate_factory=STAND_IN_GATE, gate_options=stand_in.options()
    )


@dataclass(frozen=True)
class MinedHere:
    """exp_scale mined with the stand-in gate in this process (the local executor's path)."""

    out: Path
    report: MineReport

    @property
    def gate_runs(self) -> int:
        """Every gate run it made: walk, probes, round trips."""
        r = self.report
        return r.walk_gate_runs + r.probe_gate_runs + r.round_trip_gate_runs


@pytest.fixture(scope="module")
def here(shared_builder: Builder, tmp_path_factory: pytest.TempPathFactory) -> MinedHere:
    out = tmp_path_factory.mktemp("here")
    gate = stand_in_gate(str(shared_builder.cache_dir), str(out / "local_runs.jsonl"))
    return MinedHere(out, mine(PROBLEM, out, gate=gate))


def _verdicts(out: Path) -> list[tuple[str, str, str, str, float | None, bool]]:
    lineage = LineageGraph.load(out / LINEAGE)
    return sorted(
        (a.parent, a.child, a.mechanism, a.status.value, a.ratio, a.chosen)
        for a in lineage.attempts()
    )


def _verdict_keys(out: Path) -> list[str]:
    log = out / "gatelog" / "exp_scale_f32.jsonl"
    return [json.loads(line)["key"] for line in log.read_text().splitlines()]


def test_mining_on_a_cluster_gives_the_local_lineage_verdict_for_verdict(
    cpu_cluster: Cluster, stand_in: StandIn, here: MinedHere, tmp_path: Path
) -> None:
    with _executor(cpu_cluster, stand_in) as executor:
        there = mine(PROBLEM, tmp_path / "there", executor=executor)
        workers = executor.tally.workers()
    assert there.termination == "complete"
    assert there.model_dump(exclude=VOLATILE) == here.report.model_dump(exclude=VOLATILE)
    assert _verdicts(tmp_path / "there") == _verdicts(here.out)
    assert (tmp_path / "there" / "skills.jsonl").read_text() == (
        here.out / "skills.jsonl"
    ).read_text()
    # each state's attempts went to both GPU workers; every run the client counted was made
    # by a worker's gate, and written to the log once, by the client
    made = gate_runs(stand_in.runs_file)
    assert {w.worker for w in workers} == set(cpu_cluster.client.scheduler_info()["workers"])
    assert all(w.gate_runs > 0 for w in workers)
    assert sum(w.gate_runs for w in workers) == len(made)
    assert len(made) == there.walk_gate_runs + there.probe_gate_runs + there.round_trip_gate_runs
    assert Counter(line["worker"] for line in made) == {w.worker: w.gate_runs for w in workers}
    keys = _verdict_keys(tmp_path / "there")
    assert len(keys) == len(set(keys)) == len(made) + there.shared_verdicts


def test_a_cluster_lost_mid_run_resumes_with_no_gate_run_repeated(
    stand_in: StandIn, here: MinedHere, tmp_path: Path
) -> None:
    from distributed import Client

    out = tmp_path / "out"
    total = here.gate_runs

    with local_cluster() as first, Client(first, set_as_default=False) as client:

        def lose_the_cluster(event: WalkEvent) -> None:
            if event.gate_runs >= 3:  # the whole cluster goes, gate runs in flight with it
                first.close()

        with (
            pytest.raises(ExecutorError, match="run the same command again to resume"),
            _executor(Cluster(client, first), stand_in) as executor,
        ):
            mine(PROBLEM, out, executor=executor, on_event=lose_the_cluster)
    before = gate_runs(stand_in.runs_file)
    logged = _verdict_keys(out)
    assert 3 <= len(before) < total and len(logged) >= 3

    with (
        local_cluster() as second,
        Client(second, set_as_default=False) as client,
        _executor(Cluster(client, second), stand_in) as executor,
    ):
        resumed = mine(PROBLEM, out, executor=executor)
    assert resumed.termination == "complete"
    assert resumed.cached_verdicts >= len(logged)
    made = gate_runs(stand_in.runs_file)
    asked = [(r["kernel"], r["against"], tuple(r["workloads"]), r["time_it"]) for r in made]
    # every verdict logged before the loss was served from the log; a gate run lost in flight
    # (never logged) is the only one made twice
    lost_in_flight = len(before) - len(logged)
    assert len(asked) - len(set(asked)) == lost_in_flight <= 2
    assert len(set(asked)) == total
    assert _verdicts(out) == _verdicts(here.out)
    keys = _verdict_keys(out)
    assert len(keys) == len(set(keys))


def test_mine_command_on_a_cluster_by_its_address_shows_tasks_per_worker(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    stand_in_executor_for_commands(stand_in, monkeypatch)
    with local_cluster(tcp=True) as cluster:
        address = cluster.scheduler_address
        workers = list(cluster.scheduler_info["workers"])
        args = ["mine", str(PROBLEM), "--out", str(tmp_path / "out"), "--budget", "4"]
        result = CliRunner().invoke(app, [*args, "--executor", "dask", "--scheduler", address])
    assert result.exit_code == 0, result.output
    assert f"tasks per worker (dask: {address}, 2 GPU of 2 workers)" in result.output
    assert "exp_scale_f32: budget" in result.output
    rows = [line for line in result.output.splitlines() if "127.0.0.1:" in line]
    shown = {w for w in workers if any(w.removeprefix("tcp://") in row for row in rows)}
    assert shown == {r["worker"] for r in gate_runs(stand_in.runs_file)}, result.output
    spent = re.search(r"(\d+) walk \+ (\d+) probe \+ (\d+) round-trip gate runs", result.output)
    assert spent is not None and spent[1] == "4"
    assert len(gate_runs(stand_in.runs_file)) == sum(int(n) for n in spent.groups())


def test_a_worker_killed_mid_run_leaves_its_gate_runs_to_the_others(
    stand_in: StandIn, here: MinedHere, tmp_path: Path
) -> None:
    import os
    import signal

    from distributed import Client

    out = tmp_path / "there"
    killed: list[str] = []
    with (
        local_cluster(processes=True) as cluster,
        Client(cluster, set_as_default=False) as client,
        _executor(Cluster(client, cluster), stand_in) as executor,
    ):
        pids = client.run(os.getpid)

        def kill_a_worker(event: WalkEvent) -> None:
            if event.gate_runs >= 3 and not killed:  # SIGKILL: no goodbye to the scheduler
                victim = min(pids)
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(victim)

        there = mine(PROBLEM, out, executor=executor, on_event=kill_a_worker)
    assert killed and there.termination == "complete"
    assert there.model_dump(exclude=VOLATILE) == here.report.model_dump(exclude=VOLATILE)
    assert _verdicts(out) == _verdicts(here.out)
    made = gate_runs(stand_in.runs_file)
    assert any(r["worker"] != killed[0] for r in made)
    keys = _verdict_keys(out)
    assert len(keys) == len(set(keys))
