"""The tree method (the skills under a beam search) beside the greedy skills method, through
the real build stage with the labelled stand-in for the GPU stages."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from klineage.gate.build import Builder
from klineage.replay.results import MethodResult
from klineage.replay.run import ReplayBudget, ReplayReport, load_replay
from tests.conftest import FIXTURES
from tests.mining.conftest import Mined
from tests.mining.stand_in_gate import StandInGate, replay_gated
from tests.mining.test_mine import EXPERT

pytestmark = pytest.mark.nvcc

TARGET = FIXTURES / "mining" / "exp_target"
OTHERS = {"readonly_ldg", "restrict_pointers", "launch_bounds"}
COST = {"fast_math": 1.5, "readonly_ldg": 1.3, "restrict_pointers": 1.3, "launch_bounds": 1.2}


class _ClashGate(StandInGate):
    """The stand-in, where fast_math beside any of the other mechanisms is 3x slower: the best
    first move (fast_math, the skill with the largest mined gain) is a dead end, while
    the others together go further."""

    def latency(self, present: set[str]) -> float:
        clash = "fast_math" in present and bool(present & OTHERS)
        return super().latency(present) * (3.0 if clash else 1.0)


def _clash_gate(builder: Builder) -> _ClashGate:
    return _ClashGate(builder, cost=COST, expert_mechanisms=EXPERT)


def _by_method(report: ReplayReport) -> dict[str, MethodResult]:
    return {r.method: r for r in report.results}


def _edges(out: Path, method: str) -> list[dict[str, Any]]:
    data = json.loads((out / "lineages" / f"exp_target_f32.{method}.json").read_text())
    return list(data["edges"])


def test_the_tree_goes_past_greedys_dead_end_on_the_same_budget(
    builder: Builder, mined: Mined, tmp_path: Path
) -> None:
    budget = 20
    report = replay_gated(
        [TARGET],
        mined.out,
        tmp_path,
        gate=_clash_gate(builder),
        methods=["skills", "tree"],
        budget=ReplayBudget(gate_runs=budget),
        beam_width=2,
    )
    greedy, tree = _by_method(report)["skills"], _by_method(report)["tree"]
    # greedy keeps fast_math at once, then everything clashes with it
    assert [r.action for r in greedy.runs if r.outcome == "kept"] == ["fast_math"]
    assert greedy.speedup == pytest.approx(1.5, rel=0.01)
    # the beam also held the second kept skill's state and went on from it, without fast_math
    assert tree.speedup == pytest.approx(1.3 * 1.3 * 1.2, rel=0.01)
    assert tree.speedup > greedy.speedup * 1.3
    assert sum(tree.best_ms.values()) < sum(greedy.best_ms.values())
    assert {u.skill.split("--")[0] for u in tree.skills_used} == OTHERS
    for result in (greedy, tree):
        assert len(result.runs) <= budget
        assert [r.index for r in result.runs] == list(range(1, len(result.runs) + 1))
    # the gate runs to its final speed: the first run that reached it
    reached = [r.index for r in tree.runs if r.speedup == pytest.approx(tree.speedup)]
    assert tree.runs_to_best == reached[0] > greedy.runs_to_best == 1
    # every gated child is in the lineage (two carriers that write one kernel share an edge:
    # the later one)
    edges = _edges(tmp_path, "tree")
    unshown = set(range(len(tree.runs))) - {e["step"] for e in edges}
    assert len(unshown) <= 1
    assert all(tree.runs[i].action == tree.runs[i + 1].action for i in unshown)
    # the search went on from both kept children of the start
    root = next(e["parent"] for e in edges if e["step"] == 0)
    first = [e["mechanism"] for e in edges if e["parent"] == root and e["chosen"]]
    assert len(first) == 2 and "fast_math" in first
    saved = load_replay(tmp_path / "replay.json")
    assert saved.beam_width == 2
    assert [s.method for s in saved.summary] == ["skills", "tree"]
    assert saved.summary[1].mean_runs_to_best == tree.runs_to_best
    assert saved.misses == []  # the tree replays the same skills: no baseline's miss


def test_a_tree_of_width_one_makes_the_skills_methods_runs(
    builder: Builder, mined: Mined, tmp_path: Path
) -> None:
    gate = StandInGate(builder, cost=COST, expert_mechanisms=EXPERT)
    report = replay_gated(
        [TARGET],
        mined.out,
        tmp_path,
        gate=gate,
        methods=["skills", "tree"],
        budget=ReplayBudget(gate_runs=8),
        beam_width=1,
    )
    greedy, tree = _by_method(report)["skills"], _by_method(report)["tree"]
    assert len(greedy.runs) > 3 and greedy.speedup > 2.0  # a walk of several kept skills
    assert tree.runs == greedy.runs
    assert (tree.final, tree.speedup, tree.skills_used) == (
        greedy.final,
        greedy.speedup,
        greedy.skills_used,
    )
    assert _edges(tmp_path, "tree") == _edges(tmp_path, "skills")


@pytest.mark.parametrize("budget", [3, 7])
def test_the_tree_spends_no_more_than_the_budget(
    builder: Builder, mined: Mined, tmp_path: Path, budget: int
) -> None:
    report = replay_gated(
        [TARGET],
        mined.out,
        tmp_path,
        gate=_clash_gate(builder),
        methods=["tree"],
        budget=ReplayBudget(gate_runs=budget),
        beam_width=3,
    )
    [tree] = report.results
    # the beam has more to try than the budget: it spends all of it, and no more
    assert [r.index for r in tree.runs] == list(range(1, budget + 1))


def test_replay_command_runs_the_tree_beside_skills(
    builder: Builder, mined: Mined, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    import klineage.gate.pool
    from klineage.cli import app

    @contextlib.contextmanager
    def stand_in_gates(devices: list[int] | None, **options: object) -> Iterator[list[Any]]:
        yield [_clash_gate(builder)]  # STAND-IN at the GPU boundary, real builds

    monkeypatch.setattr(klineage.gate.pool, "open_gates", stand_in_gates)
    out = tmp_path / "out"
    args = ["replay", str(TARGET), "--skills", str(mined.out), "--budget", "12"]
    args += ["--baselines", "tree", "--beam-width", "2", "--out", str(out)]
    args += ["--carriers-first", "0"]  # each skill's carriers in a row, as before
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # each gate run is shown as it is made, by method, and the table has a row for each
    runs = [line.split() for line in result.output.splitlines() if line.startswith("exp_target")]
    assert {row[1] for row in runs if len(row) > 2 and row[2].startswith("#")} == {
        "skills",
        "tree",
    }
    table = [line.split("│")[2].strip() for line in result.output.splitlines() if "│ exp" in line]
    assert table == ["skills", "tree"]
    report = ReplayReport.load(out / "replay.json")
    assert report.beam_width == 2
    assert report.carriers_first is None
    tree = _by_method(report)["tree"]
    assert 0 < len(tree.runs) <= 12 and tree.speedup > 1.0
    assert (out / "lineages" / "exp_target_f32.tree.json").is_file()


def test_replay_command_refuses_a_beam_of_no_width(mined: Mined) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    args = ["replay", str(TARGET), "--skills", str(mined.out), "--baselines", "tree"]
    result = CliRunner().invoke(app, [*args, "--beam-width", "0"])
    assert result.exit_code == 2 and "beam-width" in result.output
    result = CliRunner().invoke(app, [*args, "--carriers-first", "-1"])
    assert result.exit_code == 2 and "carriers-first" in result.output
