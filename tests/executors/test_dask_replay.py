"""Replay through the Dask executor on a real CPU cluster (real nvcc builds, the labelled
stand-in gate of `stand_in.py` at the GPU boundary): the same report as in this process,
each problem's verdicts made on one GPU worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="needs the dask extra: pip install 'klineage[dask]'")

from klineage.executors.dask_cluster import DaskExecutor
from klineage.replay.results import ReplayBudget
from klineage.replay.run import ReplayReport, replay
from tests.conftest import FIXTURES
from tests.executors.conftest import (
    Cluster,
    StandIn,
    local_cluster,
    stand_in_executor_for_commands,
)
from tests.executors.stand_in import STAND_IN_GATE, gate_runs, stand_in_gate
from tests.mining.conftest import Mined

pytestmark = pytest.mark.nvcc

PROBLEMS = [FIXTURES / "mining" / "exp_target", FIXTURES / "mining" / "exp_scale"]
PROBLEM_NAMES = ("exp_target_f32", "exp_scale_f32")


def _replay(skills: Path, out: Path, **where: object) -> ReplayReport:
    return replay(
        PROBLEMS,
        skills,
        out,
        methods=["skills", "blind"],
        budget=ReplayBudget(gate_runs=3),
        **where,  # type: ignore[arg-type]
    )


def _timeless(report: ReplayReport) -> dict[str, object]:
    """The report without its wall times (`seconds` per problem and method)."""
    return report.model_dump(exclude={"results": {"__all__": {"seconds"}}})


def test_replay_on_a_cluster_gives_the_local_report_one_worker_per_problem(
    cpu_cluster: Cluster, stand_in: StandIn, mined: Mined, tmp_path: Path
) -> None:
    here_gate = stand_in_gate(str(stand_in.worker_cache), str(tmp_path / "here_runs.jsonl"))
    here = _replay(mined.out, tmp_path / "here", gate=here_gate)
    with DaskExecutor(
        client=cpu_cluster.client, gate_factory=STAND_IN_GATE, gate_options=stand_in.options()
    ) as executor:
        there = _replay(mined.out, tmp_path / "there", executor=executor)
    assert _timeless(there) == _timeless(here)
    made = gate_runs(stand_in.runs_file)
    assert len(made) == len(gate_runs(tmp_path / "here_runs.jsonl")) > 0
    # as with one gate per local GPU: each problem's verdicts were all made on one worker,
    # and the two problems were under way at once, on the two workers
    workers = {p: {r["worker"] for r in made if r["problem"] == p} for p in PROBLEM_NAMES}
    assert all(len(ran_on) == 1 for ran_on in workers.values())
    assert workers["exp_target_f32"] != workers["exp_scale_f32"]


def test_replay_command_on_a_cluster_by_its_address(
    stand_in: StandIn, mined: Mined, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    stand_in_executor_for_commands(stand_in, monkeypatch)
    with local_cluster(tcp=True) as cluster:
        address = cluster.scheduler_address
        args = ["replay", *map(str, PROBLEMS), "--skills", str(mined.out), "--budget", "2"]
        args += ["--out", str(tmp_path / "out"), "--baselines", "blind"]
        result = CliRunner().invoke(app, [*args, "--executor", "dask", "--scheduler", address])
    assert result.exit_code == 0, result.output
    assert f"tasks per worker (dask: {address}, 2 GPU of 2 workers)" in result.output
    report = ReplayReport.load(tmp_path / "out" / "replay.json")
    assert {(r.problem, r.method) for r in report.results} == {
        (p, m) for p in PROBLEM_NAMES for m in ("skills", "blind")
    }
    # every gate run the workers made was logged here once (a line shared by machine code
    # is not a run)
    lines = [
        json.loads(line)
        for log in (tmp_path / "out" / "gatelog").glob("*.jsonl")
        for line in log.read_text().splitlines()
    ]
    keys = [line["key"] for line in lines]
    assert len(keys) == len(set(keys))
    made = gate_runs(stand_in.runs_file)
    assert len(made) == sum("shared_from" not in line for line in lines) > len(PROBLEM_NAMES)
