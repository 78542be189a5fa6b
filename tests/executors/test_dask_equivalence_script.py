"""bench/dask_equivalence.py's comparisons, on the kept H200 lineages (no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.lineage import AttemptStatus, LineageGraph
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES, REPO
from tests.executors.conftest import StandIn
from tests.executors.stand_in import stand_in_gate
from tests.mining.conftest import Mined

PROBLEM = FIXTURES / "mining" / "exp_target"
SOFTMAX = REPO / "skills_out" / "lineages" / "softmax_rows_f32.json"


def test_the_same_lineage_compares_identical_and_one_changed_verdict_is_named() -> None:
    script = load_bench_script("dask_equivalence")
    local, dask = LineageGraph.load(SOFTMAX), LineageGraph.load(SOFTMAX)
    same = script.compare_lineages(local, dask)
    assert same["identical"] and same["same_verdict"] == same["attempts_local"] > 5
    assert same["main_path_local"] == same["main_path_dask"] != []
    edge = next(
        (u, v)
        for u, v, data in dask.graph.edges(data=True)
        if data["status"] == AttemptStatus.ACCEPTED.value
    )
    dask.graph.edges[edge]["status"] = AttemptStatus.REJECTED.value
    changed = script.compare_lineages(local, dask)
    assert not changed["identical"]
    assert changed["same_verdict"] == same["same_verdict"] - 1
    assert [a[:2] for a in changed["only_local"]] == [edge]
    assert [a[3] for a in changed["only_dask"]] == ["rejected"]


@pytest.mark.nvcc
def test_keep_decisions_recorded_in_one_replay_are_held_in_the_next(
    stand_in: StandIn, mined: Mined, tmp_path: Path
) -> None:
    """The second run takes the first run's keep decisions for the kernels both gated: one
    flipped decision (kept in the first run, held as not kept) changes that run's outcome."""
    from klineage.replay.results import ReplayBudget
    from klineage.replay.run import ReplayReport, replay

    script = load_bench_script("dask_equivalence")

    def run(
        name: str, decisions: dict[tuple[str, ...], tuple[bool, float | None]], hold: bool
    ) -> ReplayReport:
        gate = stand_in_gate(str(stand_in.worker_cache), str(tmp_path / f"{name}.jsonl"))
        with script.keep_decisions(decisions, hold=hold):
            return replay(
                [PROBLEM],
                mined.out,
                tmp_path / name,
                gate=gate,
                methods=["skills"],
                budget=ReplayBudget(gate_runs=3),
            )

    decisions: dict[tuple[str, ...], tuple[bool, float | None]] = {}
    first = run("first", decisions, hold=False)
    outcomes = [r.outcome for r in first.results[0].runs]
    assert "kept" in outcomes and decisions
    assert run("same", dict(decisions), hold=True).results[0].runs == first.results[0].runs
    kept = next(key for key, (keep, _) in decisions.items() if keep)
    flipped = {**decisions, kept: (False, decisions[kept][1])}
    held = [r.outcome for r in run("flipped", flipped, hold=True).results[0].runs]
    assert held[: outcomes.index("kept") + 1] != outcomes[: outcomes.index("kept") + 1]
