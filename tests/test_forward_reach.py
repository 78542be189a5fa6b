"""bench/forward_reach.py on the real held-out kernels and catalog: what it says reaches, and
why not elsewhere. No nvcc, no GPU: candidates and rewrites are parsing."""

from __future__ import annotations

import json

from klineage.kernel import KernelSource
from klineage.mechanisms import get, mechanism_names
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

reach = load_bench_script("forward_reach")
HELDOUT = REPO / "heldout"


def _kernel(problem: str) -> KernelSource:
    return KernelSource.from_file(HELDOUT / problem / "kernel.cu")


def test_every_mechanism_has_a_forward_form_to_name() -> None:
    assert set(reach.FORWARD_FORMS) == set(mechanism_names())


def test_a_mechanism_that_applies_counts_the_sites_it_wrote() -> None:
    row = reach.reach_of(get("launch_bounds"), "gelu", _kernel("gelu"))
    assert row.outcome == "applies" and row.applied == row.sites >= 1 and not row.why_not


def test_a_kernel_without_the_form_is_named_with_the_form_it_lacks() -> None:
    row = reach.reach_of(get("online_softmax"), "gelu", _kernel("gelu"))
    assert row.outcome == "no site" and row.sites == 0
    assert row.why_not == "no site of the form " + reach.FORWARD_FORMS["online_softmax"]


def test_a_refused_candidate_gives_the_refusal() -> None:
    row = reach.reach_of(get("split_k"), "layernorm", _kernel("layernorm"))
    assert row.outcome == "refused" and "workspace" in row.why_not


def test_a_detect_only_mechanism_says_it_has_no_forward_rule() -> None:
    row = reach.reach_of(get("register_fragment_streaming"), "sgemm", _kernel("sgemm"))
    assert row.outcome == "no site" and row.why_not.startswith("no forward rule: ")


def test_the_kept_table_lists_every_mechanism_and_kernel() -> None:
    kept = json.loads((REPO / "bench" / "results" / "forward_reach.json").read_text())
    assert kept["heldout_kernels"] == 22
    assert {row["mechanism"] for row in kept["table"]} == set(mechanism_names())
    for row in kept["table"]:
        assert len(row["kernels"]) == 22
        applied = [k["problem"] for k in row["kernels"] if k["outcome"] == "applies"]
        assert applied == row["reaches"]
        assert all(k["why_not"] for k in row["kernels"] if k["outcome"] != "applies")


def test_depth_two_records_a_rule_that_applies_only_on_a_parents_child() -> None:
    table = {row.mechanism: row for row in reach.forward_reach()}
    padding = table["smem_padding"]
    assert "sgemm" not in padding.reaches
    assert {(c.problem, c.parent) for c in padding.reaches_after} >= {
        ("sgemm", "smem_staging"),
        ("batched_hgemm", "smem_staging"),
    }
    # A mechanism another rewrite writes outright is told apart from one whose rule applies.
    shuffles = table["warp_shuffle_reduction"]
    assert not shuffles.reaches and not shuffles.reaches_after
    assert ("row_sum", "block_per_row") in {(c.problem, c.parent) for c in shuffles.written_by}
    # Depth 2 never repeats a kernel reached at depth 1.
    for row in table.values():
        chained = {c.problem for c in row.reaches_after + row.written_by}
        assert not chained & set(row.reaches)


def test_the_child_of_a_rule_is_the_kernel_it_writes_at_its_first_site() -> None:
    naive = _kernel("sgemm")
    child = reach.first_child(get("smem_staging"), naive)
    assert child is not None and "__shared__" in child.text and "__shared__" not in naive.text
    assert reach.first_child(get("online_softmax"), naive) is None


def test_the_kept_table_has_the_depth_two_counts() -> None:
    kept = json.loads((REPO / "bench" / "results" / "forward_reach.json").read_text())
    by_depth_2 = sum(bool(r["reaches"] or r["reaches_after"]) for r in kept["table"])
    assert kept["mechanisms_reaching_a_kernel_by_depth_2"] == by_depth_2
    assert by_depth_2 > kept["mechanisms_reaching_a_kernel"]


def test_depth_two_records_a_form_only_a_parents_child_offers() -> None:
    table = {row.mechanism: row for row in reach.forward_reach()}
    coarsening = table["thread_coarsening"]
    assert "sgemm" in coarsening.reaches
    assert {(c.problem, c.parent, c.form) for c in coarsening.forms_after} >= {
        ("sgemm", "smem_staging", "register_tile"),
        ("batched_hgemm", "smem_staging", "register_tile"),
    }
    for row in table.values():
        assert {c.problem for c in row.forms_after} <= set(row.reaches)
