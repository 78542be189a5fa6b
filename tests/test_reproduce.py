"""The committed results, re-derived from the committed gate logs with no gate run: top-k's
walk attempt for attempt against its lineage and mine.json, and gelu's five replay methods run
for run against replay.json (bench/reproduce_offline.py does all of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_scripts import load_bench_script

bench = load_bench_script("reproduce_offline")


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reproduce")


@pytest.mark.nvcc
def test_the_topk_walk_is_the_one_the_h200_recorded(state: Path) -> None:
    # mined under the audited gate with the machine-code check: nvcc builds every state here
    # (about 40 s on two cores) to refuse the same no-ops, every verdict comes from the log
    [row] = bench.reproduce_mining(state / "mine", ["topk_f32"])
    assert row["gate_runs"] == 0 and "missing" not in row, row
    assert row["attempts"] == 35  # every edge compared with the committed lineage
    assert row["differences"] == [] and row["reproduced"], row


@pytest.mark.nvcc
def test_gelu_replays_run_for_run(state: Path) -> None:
    # the audited replay's five methods, as its chunks ran them: nvcc builds every candidate
    # to refuse the same no-ops, every verdict and profile comes from the log
    rows = bench.reproduce_replay(state / "replay", ["gelu_tanh_f32"])
    assert [r["method"] for r in rows] == ["skills", "blind", "memory", "tree", "profiled"]
    for row in rows:
        assert row["gate_runs"] == 0 and row["runs"] == row["committed_runs"] > 0, row
        assert row["differences"] == [] and row["reproduced"], row
