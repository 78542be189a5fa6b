"""`explain_misses` on a real held-out kernel, real catalog rewrites and the committed skills."""

from __future__ import annotations

from pathlib import Path

from klineage.kernel import KernelSource
from klineage.lineage import LineageGraph, StateInfo
from klineage.mechanisms import Carrier, get
from klineage.mining.removal import apply_everywhere
from klineage.problem import load_problem
from klineage.replay.methods import GateRunRecord, MethodResult
from klineage.replay.misses import explain_misses
from klineage.skills import SkillLibrary

ROOT = Path(__file__).resolve().parents[2]


def _run(index: int, action: str, ratio: float, carrier: dict[str, int] | None = None):
    return GateRunRecord(
        index=index,
        action=action,
        origin="test",
        carrier=carrier or {},
        outcome="kept",
        gate_status="PASSED",
        ratio=ratio,
        speedup=ratio,
    )


def _result(method: str, problem: str, runs: list[GateRunRecord], final: str) -> MethodResult:
    speedup = 1.0
    for run in runs:
        speedup *= run.ratio or 1.0
    return MethodResult(
        method=method,
        problem=problem,
        runs=runs,
        start_ms={"w": 1.0},
        best_ms={"w": 1.0 / speedup},
        reference_ms={"w": 0.1},
        speedup=speedup,
        speedup_vs_reference=0.1 * speedup,
        runs_to_90=1,
        wasted=0,
        final=final,
        seconds=1.0,
    )


def test_a_site_rewritten_away_and_a_weaker_carrier_are_told_apart(tmp_path: Path) -> None:
    problem = load_problem(ROOT / "heldout" / "l2_normalize")
    naive = KernelSource.from_file(problem.kernel_path)
    vectorized = apply_everywhere(naive, get("vectorized_access"), Carrier(vector_width=4))
    # block_per_row can rewrite the naive kernel, not the vectorized one
    assert [s for s in get("block_per_row").candidates(naive) if s.supported]
    assert not [s for s in get("block_per_row").candidates(vectorized) if s.supported]
    lineage = LineageGraph(problem.name)
    lineage.add_state(
        StateInfo(
            fingerprint=vectorized.fingerprint, source=vectorized.text, depth=1, status="PASSED"
        )
    )
    lineage.save(tmp_path / f"{problem.name}.skills.json")
    skilled = _result(
        "skills",
        problem.name,
        [_run(1, "vectorized_access", 1.15, {"vector_width": 4})],
        vectorized.fingerprint,
    )
    blind = _result(
        "blind",
        problem.name,
        [_run(1, "block_per_row", 13.3), _run(2, "vectorized_access", 1.4, {"vector_width": 8})],
        "elsewhere",
    )
    library = list(SkillLibrary.load(ROOT / "skills_out"))
    misses = {
        m.mechanism: m for m in explain_misses([skilled, blind], [problem], library, tmp_path)
    }
    assert misses["block_per_row"].reason == "no_site"
    assert "after vectorized_access" in misses["block_per_row"].detail
    assert misses["vectorized_access"].reason == "carrier"
    assert "'vector_width': 8" in misses["vectorized_access"].detail


def test_no_miss_when_the_skills_method_is_not_behind(tmp_path: Path) -> None:
    problem = load_problem(ROOT / "heldout" / "l2_normalize")
    skilled = _result("skills", problem.name, [_run(1, "block_per_row", 13.0)], "a")
    blind = _result("blind", problem.name, [_run(1, "block_per_row", 13.3)], "b")
    library = list(SkillLibrary.load(ROOT / "skills_out"))
    assert explain_misses([skilled, blind], [problem], library, tmp_path) == []


def test_runs_to_the_same_speed_as_blind() -> None:
    from klineage.replay.run import matched_runs, runs_to_reach

    skilled = _result("skills", "p", [_run(1, "block_per_row", 10.0)], "a")
    blind = _result(
        "blind",
        "p",
        [_run(1, "fast_math", 1.1), _run(2, "launch_bounds", 1.0), _run(3, "block_per_row", 12.0)],
        "b",
    )
    # speedups are cumulative in real records: make blind's so
    blind.runs[1].speedup = 1.1
    blind.runs[2].speedup = 13.2
    assert runs_to_reach(blind, 10.0) == 3
    assert runs_to_reach(skilled, 10.0) == 1
    [skills_row] = matched_runs([skilled, blind])
    assert (skills_row.problems, skills_row.runs, skills_row.blind_runs) == (1, 1, 3)
