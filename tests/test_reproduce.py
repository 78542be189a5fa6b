"""The committed results, re-derived from the committed gate logs with no gate run: RMSNorm's
walk attempt for attempt against its lineage and mine.json, and gelu's three replay methods run
for run against replay.json (bench/reproduce_offline.py does all of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_scripts import load_bench_script

bench = load_bench_script("reproduce_offline")


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reproduce")


def test_the_rmsnorm_walk_is_the_one_the_h200_recorded(state: Path) -> None:
    [row] = bench.reproduce_mining(state / "mine", ["fused_add_rmsnorm_bf16"])
    assert row["gate_runs"] == 0 and "missing" not in row
    assert row["attempts"] == 55  # every edge compared with the committed lineage
    assert row["differences"] == [] and row["reproduced"]


def test_gelu_replays_run_for_run(state: Path) -> None:
    rows = bench.reproduce_replay(state / "replay", ["gelu_tanh_f32"])
    assert [r["method"] for r in rows] == ["skills", "blind", "memory"]
    for row in rows:
        assert row["gate_runs"] == 0 and row["runs"] == row["committed_runs"] > 0, row
        assert row["differences"] == [] and row["reproduced"], row
