"""bench/dask_equivalence.py's comparisons, on the kept H200 lineages (no GPU)."""

from __future__ import annotations

from klineage.lineage import AttemptStatus, LineageGraph
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

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
