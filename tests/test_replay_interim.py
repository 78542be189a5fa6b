"""bench/replay_interim.py: the final kernel's speeds read from a lineage, and the gate runs
to blind search's speed read from served runs (lineages and rows written here)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.bench_scripts import load_bench_script

interim = load_bench_script("replay_interim")


def _lineage(
    start: dict[str, float], final: dict[str, float], reference: dict[str, float]
) -> dict[str, Any]:
    return {
        "graph": {"root": "a", "final": "b"},
        "nodes": [
            {"id": "a", "latency_ms": start, "reference_ms": reference},
            {"id": "b", "latency_ms": final, "reference_ms": reference},
        ],
    }


def test_speeds_are_geomeans_over_the_workloads_of_the_final_verdict() -> None:
    lineage = _lineage({"w1": 8.0, "w2": 2.0}, {"w1": 1.0, "w2": 1.0}, {"w1": 4.0, "w2": 0.25})
    speeds = interim.final_speeds(lineage, {"w1": 1.0})  # w1's reference ran slow beside it
    assert speeds["vs_naive"] == pytest.approx(4.0)  # sqrt(8 * 2)
    assert speeds["vs_pytorch_own"] == pytest.approx(1.0)  # sqrt(4 * 0.25)
    assert speeds["vs_pytorch"] == pytest.approx(0.5)  # sqrt(1 * 0.25): the shared w1


def test_a_workload_the_start_lacks_is_left_out() -> None:
    lineage = _lineage({"w1": 3.0}, {"w1": 1.0, "w2": 1.0}, {"w1": 2.0, "w2": 100.0})
    assert interim.final_speeds(lineage, {}) == pytest.approx(
        {"vs_naive": 3.0, "vs_pytorch": 2.0, "vs_pytorch_own": 2.0}
    )


def test_runs_to_blind_speed_count_from_one_and_skip_problems_without_a_gain() -> None:
    served = [
        {"problem": "p", "method": "skills", "best": 3.0, "speedups": [1.0, 3.0, 3.0]},
        {"problem": "p", "method": "blind", "best": 2.0, "speedups": [1.0, 1.0, 1.5, 2.0]},
        {"problem": "q", "method": "skills", "best": 1.0, "speedups": [1.0]},
        {"problem": "q", "method": "blind", "best": 1.5, "speedups": [1.5]},
    ]
    result = interim.versus_blind(served)
    assert [p["problem"] for p in result["problems"]] == ["p"]
    assert (result["skills_runs"], result["blind_runs"]) == (2, 4)
    assert math.isclose(result["fewer"], 2.0)
