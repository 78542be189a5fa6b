"""bench/replay_served.py: a replay served from its gate log alone, on the CPU, until the
first verdict the log lacks. The log is written here by a replay on the stand-in gate (the
GPU boundary's labelled double; builds are real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.problem import load_problem
from klineage.replay.run import ReplayBudget
from tests.bench_scripts import load_bench_script
from tests.mining.conftest import Mined
from tests.mining.stand_in_gate import StandInGate, replay_gated
from tests.mining.test_mine import EXPERT
from tests.mining.test_replay import TARGET

bench = load_bench_script("replay_served")


@pytest.mark.nvcc
def test_a_logged_replay_is_served_run_for_run_and_a_cut_log_says_where_it_stops(
    builder: Builder, mined: Mined, tmp_path: Path
) -> None:
    mined_skills = mined.out
    gate = StandInGate(
        builder, cost={"fast_math": 1.5, "readonly_ldg": 1.1}, expert_mechanisms=EXPERT
    )
    report = replay_gated(
        [TARGET],
        mined_skills,
        tmp_path / "out",
        gate=gate,
        methods=["skills"],
        budget=ReplayBudget(gate_runs=4),
    )
    [done] = report.results
    gatelog = tmp_path / "out" / "gatelog"
    options = {"skills": mined_skills, "budget": 4, "skip_no_ops": False, "builder": builder}
    row = bench.served(TARGET, "skills", gatelog, **options)
    assert "finished" in row, row
    assert row["finished"] == pytest.approx(done.speedup, rel=1e-3)
    assert row["served"] == len(done.runs) == 4
    assert "missing" not in row
    # without the log's last verdict, the replay stops there and names the kernel it needs
    name = load_problem(TARGET).name
    path = gatelog / f"{name}.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    cut = bench.served(TARGET, "skills", gatelog, **options)
    assert "finished" not in cut
    assert cut["served"] == 3
    assert "no logged verdict" in cut["missing"] and "needs the GPU" in cut["missing"]
    assert cut["missing_dispatch"] == ""  # a plain rule's kernel, no dispatch


def test_methods_the_log_cannot_serve_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--methods", "skills,guessed"])
    assert "cannot serve guessed from the log" in capsys.readouterr().err


@pytest.mark.nvcc
def test_the_profiled_method_is_served_with_the_profiles_its_run_logged(
    builder: Builder, mined: Mined, tmp_path: Path
) -> None:
    """The profiled method ranks by each state's bottleneck: served with the profiles its
    run logged, it makes the same runs; without them it stops where it first ranks."""
    import shutil

    from klineage.skills import SkillLibrary
    from tests.mining.test_replay import (
        _launch_bound,
        _skills_and_profiled,
        relieving_launch_bounds,
    )

    relieving = relieving_launch_bounds(list(SkillLibrary.load(mined.out)))
    report, _ = _skills_and_profiled(builder, relieving, tmp_path, _launch_bound)
    [profiled] = [r for r in report.results if r.method == "profiled"]
    gatelog = tmp_path / "out" / "gatelog"
    name = load_problem(TARGET).name
    assert (gatelog / "profiles" / f"{name}.jsonl").is_file()
    options = {"skills": tmp_path / "skills", "budget": 4, "skip_no_ops": False, "builder": builder}
    row = bench.served(TARGET, "profiled", gatelog, **options)
    assert "finished" in row, row
    assert row["finished"] == pytest.approx(profiled.speedup, rel=1e-3)
    assert row["speedups"] == [pytest.approx(r.speedup, rel=1e-3) for r in profiled.runs]
    shutil.rmtree(gatelog / "profiles")
    cut = bench.served(TARGET, "profiled", gatelog, **options)
    assert "no logged profile" in cut["missing"] and cut["served"] == 0


def test_a_served_file_says_the_runs_each_method_spent_to_the_speed_both_reached() -> None:
    rows = [
        {"problem": "a", "method": "skills", "finished": 3.0, "speedups": [1.0, 2.0, 3.0, 3.0]},
        {"problem": "a", "method": "blind", "finished": 2.0, "speedups": [1.0, 1.0, 1.0, 2.0]},
        # blind ahead: both are counted to skills' speed
        {"problem": "b", "method": "skills", "finished": 1.5, "speedups": [1.5, 1.5]},
        {"problem": "b", "method": "blind", "finished": 1.8, "speedups": [1.0, 1.6, 1.8]},
        # a problem the log did not finish for skills, and one neither gained on, are left out
        {"problem": "c", "method": "skills", "missing": "no logged verdict", "speedups": [1.2]},
        {"problem": "c", "method": "blind", "finished": 1.3, "speedups": [1.3]},
        {"problem": "d", "method": "skills", "finished": 1.0, "speedups": [1.0]},
        {"problem": "d", "method": "blind", "finished": 1.0, "speedups": [1.0]},
    ]
    summary = bench.matched(rows)
    assert [(p["problem"], p["runs"], p["blind_runs"]) for p in summary["problems"]] == [
        ("a", 2, 4),
        ("b", 1, 2),
    ]
    assert (summary["runs"], summary["blind_runs"], summary["fewer"]) == (3, 6, 2.0)
    assert bench.runs_to([1.0, 1.2], 1.5) is None  # never reached


def test_a_finished_report_stands_in_where_the_log_does_not_finish() -> None:
    rows = [
        {"problem": "a", "method": "skills", "missing": "no logged verdict", "speedups": [1.2]},
        {"problem": "a", "method": "blind", "finished": 2.0, "speedups": [1.0, 2.0]},
    ]
    report = {
        "results": [
            {"problem": "a", "method": "skills", "speedup": 3.0,
             "runs": [{"speedup": 1.0}, {"speedup": 3.0}, {"speedup": None}]},
            {"problem": "a", "method": "blind", "speedup": 9.0, "runs": [{"speedup": 9.0}]},
            # a problem the served file does not hold stays out
            {"problem": "z", "method": "skills", "speedup": 2.0, "runs": [{"speedup": 2.0}]},
            {"problem": "z", "method": "blind", "speedup": 2.0, "runs": [{"speedup": 2.0}]},
        ]
    }  # fmt: skip
    assert bench.matched(rows)["problems"] == []
    summary = bench.matched(rows, report=report)
    # skills from the report (3.0 at run 2), blind as served (2.0 at run 2), not the report's
    assert [
        (p["problem"], p["speed"], p["runs"], p["blind_runs"]) for p in summary["problems"]
    ] == [("a", 2.0, 2, 2)]


def test_a_method_stopped_after_passing_blinds_final_speed_counts_its_runs_to_it() -> None:
    rows = [
        # stopped at a missing verdict, but 4.2x at run 3 is past blind's final 3.5x
        {"problem": "a", "method": "skills", "missing": "no logged verdict",
         "speedups": [1.7, 1.7, 4.2, 4.2]},
        {"problem": "a", "method": "blind", "finished": 3.5, "speedups": [1.0, 1.7, 3.5]},
        # stopped below blind's final speed: unknown, left out (or taken from a report)
        {"problem": "b", "method": "skills", "missing": "no logged verdict", "speedups": [1.2]},
        {"problem": "b", "method": "blind", "finished": 1.3, "speedups": [1.3]},
    ]  # fmt: skip
    summary = bench.matched(rows)
    assert [
        (p["problem"], p["speed"], p["runs"], p["blind_runs"]) for p in summary["problems"]
    ] == [("a", 3.5, 3, 3)]
