"""bench/public_lineages.py on a fixture lineage written for these tests, and the committed
problem files of bench/public (our own: definitions, workloads, recorded steps; the kernels made
from public code stay untracked)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from klineage.mechanisms import all_mechanisms
from klineage.problem import load_problem
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES, REPO

TOY = FIXTURES / "public_lineage" / "toy_row_sum"
PUBLIC = REPO / "bench" / "public"


bench = load_bench_script("public_lineages")
CATALOG = {m.name for m in all_mechanisms()}


def toy_steps() -> dict:
    return json.loads((TOY / "steps.json").read_text(encoding="utf-8"))


def test_the_path_to_a_version_follows_its_steps_and_skips_side_branches() -> None:
    steps = toy_steps()
    path = bench.path_to(steps, "v3")
    assert [(s["from"], s["to"]) for s in path] == [("v0", "v1"), ("v1", "v2"), ("v2", "v3")]
    assert [(s["from"], s["to"]) for s in bench.path_to(steps, "v1b")] == [
        ("v0", "v1"),
        ("v1", "v1b"),
    ]
    assert bench.path_to(steps, "v0") == []


def test_a_version_nothing_leads_to_or_two_steps_lead_to_is_an_error() -> None:
    steps = toy_steps()
    with pytest.raises(ValueError, match="no step leading to version 'v9'"):
        bench.path_to(steps, "v9")
    steps["steps"].append({"from": "v0", "to": "v2", "mechanisms": []})
    with pytest.raises(ValueError, match="2 steps leading to version 'v2'"):
        bench.path_to(steps, "v3")


def test_removed_mechanisms_are_not_counted_as_present() -> None:
    path = bench.path_to(toy_steps(), "v3")
    present = bench.present_after(path)
    assert present == ["warp_per_row", "warp_shuffle_reduction", "launch_bounds", "smem_staging"]
    # v0 -> v1 maps to restrict_pointers, which v2 -> v3 removes: that step no longer counts
    still = bench.steps_still_present(path, present)
    assert [(s["from"], s["to"]) for s in still] == [("v1", "v2"), ("v2", "v3")]
    assert bench.mechanism_name("restrict_pointers (plain pointers again)") == "restrict_pointers"


def test_check_steps_names_unknown_mechanisms_and_unreachable_versions() -> None:
    assert bench.check_steps(toy_steps(), CATALOG) == []
    steps = toy_steps()
    steps["steps"][0]["mechanisms"] = ["restrict_pointer"]
    steps["steps"][2]["removes"] = ["smem_stage (typo)"]
    steps["expert"]["version"] = "v4"
    problems = bench.check_steps(steps, CATALOG)
    assert any("'restrict_pointer', not a catalog mechanism" in p for p in problems)
    assert any("removes names 'smem_stage'" in p for p in problems)
    assert any("no step leading to version 'v4'" in p for p in problems)


def test_measure_counts_what_detect_finds_against_the_mapped_mechanisms() -> None:
    m = bench.measure(TOY / "kernel.cu", bench.path_to(toy_steps(), "v3"), repeats=1)
    assert m["detected"] == ["warp_per_row", "warp_shuffle_reduction", "launch_bounds"]
    assert m["missed"] == ["smem_staging"]
    assert m["recall"] == 0.75
    assert (m["steps_present"], m["steps_detected"]) == (2, 1)
    assert m["steps_missed"] == ["v2 -> v3"]
    assert m["unmapped_sites"] == {}
    assert m["file"]["lines"] == len((TOY / "kernel.cu").read_text().splitlines())
    assert m["file"]["parse_detect_cpu_s"] >= m["file"]["parse_cpu_s"] >= 0
    assert m["remove_first"]["launch_bounds"]["status"] == "removed"


def _run(tmp_path: Path, *extra: str) -> tuple[dict, str]:
    public = tmp_path / "public"
    shutil.copytree(TOY, public / "toy_row_sum")
    shutil.copytree(TOY, public / "without_kernel")
    (public / "without_kernel" / "kernel.cu").unlink()
    out = tmp_path / "results.json"
    bench.main(["--public", str(public), "--out", str(out), "--repeats", "1", *extra])
    return json.loads(out.read_text(encoding="utf-8")), out.read_text(encoding="utf-8")


def test_the_report_covers_expert_alternate_and_naive_and_carries_no_machine_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, text = _run(tmp_path)
    assert result["skipped_without_kernel"] == ["without_kernel"]
    toy = result["lineages"]["toy_row_sum"]
    assert (toy["recorded_steps"], toy["recorded_steps_with_mapping"]) == (5, 4)
    assert toy["repository"] == "example/toy-lineage"
    assert toy["mined"] is None and "H200" in result["mined_note"]
    (alt,) = toy["alternates"]
    assert alt["mapped_present"] == ["restrict_pointers", "fast_math"]
    assert alt["detected"] == ["restrict_pointers", "fast_math"]
    assert toy["naive"]["sites"] == {}
    assert result["totals"]["experts"]["recall"] == 0.75
    assert result["totals"]["experts_and_alternates"]["detected"] == 5
    assert str(tmp_path) not in text and str(REPO) not in text
    assert "| `toy_row_sum` (v3) | 5 (4) |" in capsys.readouterr().out


def test_build_verdicts_and_mined_skills_are_read_when_given(tmp_path: Path) -> None:
    builds, mined = tmp_path / "builds", tmp_path / "mined"
    builds.mkdir()
    mined.mkdir()
    verdict = {
        "status": "OK",
        "arch": "sm_90",
        "message": "",
        "library": "/somewhere/kernel.so",
        "report": {"kernels": [{"name": "row_sums", "registers": 16, "shared_bytes": 0}]},
    }
    (builds / "toy_row_sum.expert.json").write_text(json.dumps(verdict), encoding="utf-8")
    evidence = {"problem": "toy_row_sum_f32"}
    gain = {"measured": "gain", "geomean_speedup": 1.2, "workloads": [{"before_ms": 1.0}]}
    skills = [
        {
            "mechanism": "launch_bounds",
            "verified": True,
            "round_trip_reproduced": True,
            "evidence": evidence,
            "effect": gain,
        },
        {"mechanism": "fast_math", "verified": False, "evidence": evidence},
        {"mechanism": "fast_math", "verified": True, "evidence": {"problem": "other"}},
    ]
    (mined / "skills.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in skills), encoding="utf-8"
    )
    walk = {"termination": "stuck", "walk_gate_runs": 4, "steps": 1, "remaining": ["fast_math"]}
    report = {"problems": [{**walk, "problem": "toy_row_sum_f32", "refusal_list": ["x"]}]}
    (mined / "report_toy_row_sum.json").write_text(json.dumps(report), encoding="utf-8")
    result, text = _run(tmp_path, "--builds", str(builds), "--mined", str(mined))
    toy = result["lineages"]["toy_row_sum"]
    assert toy["build"]["expert"]["status"] == "OK"
    assert toy["build"]["expert"]["kernels"][0]["registers"] == 16
    assert toy["build"]["naive"] == {"status": "not built"}
    assert toy["mined"] == {
        "skills": 2,
        "verified": 1,
        "verified_mechanisms": ["launch_bounds"],
        "verified_mapped": ["launch_bounds"],
        # figures only: no workload timings, no code (the cards quote the public kernel)
        "skill_figures": [
            {
                "id": None,
                "mechanism": "launch_bounds",
                "measured": "gain",
                "geomean_speedup": 1.2,
                "verified": True,
                "transferable": None,
                "round_trip_ratio": None,
                "round_trip_reproduced": True,
            },
            {
                "id": None,
                "mechanism": "fast_math",
                "measured": None,
                "geomean_speedup": None,
                "verified": False,
                "transferable": None,
                "round_trip_ratio": None,
                "round_trip_reproduced": None,
            },
        ],
        "walk": walk,
    }
    present = len(toy["expert"]["mapped_present"])
    assert result["totals"]["mined_verified_mapped"] == {
        "recovered": 1,
        "mapped_present": present,
        "share": round(1 / present, 4),
        "round_trip_reproduced": 1,
        "round_trip_share": round(1 / present, 4),
        "experts_mined": 1,
    }
    assert f"| **1/{present} (" in bench.table(result["lineages"], result["totals"])
    assert "/somewhere" not in text


def test_the_readme_table_is_rewritten_between_its_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- table -->\nold\n<!-- /table -->\nafter\n", encoding="utf-8")
    _run(tmp_path, "--readme", str(readme))
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("before\n<!-- table -->\n| lineage |")
    assert "old" not in text and text.endswith("<!-- /table -->\nafter\n")
    assert "**3/4 (75%)**" in text


def test_the_reference_runs_on_the_cpu_for_the_smallest_workload() -> None:
    assert bench.reference_on_cpu(TOY)["workload"] == "toy-row-sum-8x32"


COMMITTED = sorted(p for p in PUBLIC.iterdir() if (p / "steps.json").is_file())


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_each_committed_lineage_loads_and_its_steps_reach_the_expert(folder: Path) -> None:
    problem = load_problem(folder)
    assert len(problem.workloads) >= 3
    steps = json.loads((folder / "steps.json").read_text(encoding="utf-8"))
    assert bench.check_steps(steps, CATALOG) == []
    assert len(steps["commit"]) == 40
    assert bench.present_after(bench.path_to(steps, steps["expert"]["version"]))


def test_no_kernel_made_from_public_code_is_tracked() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "bench/public"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed, "bench/public holds no tracked file"
    assert not [f for f in listed if f.endswith((".cu", ".cuh", ".so"))], listed
    assert len(COMMITTED) >= 10


def test_mined_figures_of_an_earlier_run_are_kept_where_this_one_has_none(tmp_path: Path) -> None:
    # detection reruns on the CPU; mining ran on the H200 before: its figures stay, with a note
    mined = {"verified": 2, "verified_mapped": ["split_k"]}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(
        json.dumps(
            {
                "command": "python bench/public_lineages.py --mined build/public_mine",
                "mined_note": "from build/public_mine",
                "lineages": {"a": {"mined": mined}, "b": {"mined": None}},
            }
        )
    )
    lineages = {"a": {"mined": None}, "b": {"mined": None}, "c": {"mined": {"verified": 1}}}
    note = bench.keep_mined(lineages, earlier)
    assert lineages["a"]["mined"] == mined  # kept
    assert lineages["b"]["mined"] is None  # none to keep
    assert lineages["c"]["mined"] == {"verified": 1}  # this run's own stays
    assert "for 1 lineages" in note and "from build/public_mine" in note


def test_figures_carried_twice_name_the_mining_once(tmp_path: Path) -> None:
    # each detection rerun keeps the figures again: the note still names the one mining run
    first = tmp_path / "first.json"
    first.write_text(
        json.dumps(
            {
                "command": "python bench/public_lineages.py --mined build/public_mine",
                "mined_note": "from build/public_mine",
                "lineages": {"a": {"mined": {"verified": 1}}},
            }
        )
    )
    lineages: dict[str, dict] = {"a": {"mined": None}}
    second = tmp_path / "second.json"
    second.write_text(
        json.dumps(
            {
                "command": "python bench/public_lineages.py --keep-mined first.json",
                "mined_note": bench.keep_mined(lineages, first),
                "lineages": lineages,
            }
        )
    )
    again: dict[str, dict] = {"a": {"mined": None}}
    note = bench.keep_mined(again, second)
    assert again["a"]["mined"] == {"verified": 1}
    assert note.count("from build/public_mine") == 1 and "kept from" not in note[9:]
    assert "--mined build/public_mine" in note and "--keep-mined" not in note


def test_a_nested_note_of_older_outputs_is_read_to_its_mining() -> None:
    nested = (
        "kept from r.json for 2 lineages (its mining: kept from r.json for 2 lineages (its "
        "mining: from build/public_mine; its command: python x.py --mined m); its command: "
        "python x.py --keep-mined r.json)"
    )
    origin = bench.mining_origin({"mined_note": nested, "command": "python x.py --keep"})
    assert origin == ("from build/public_mine", "python x.py --mined m")


def test_a_round_trip_at_the_experts_speed_counts_with_or_without_a_gain() -> None:
    # a step within noise on the H200 whose rule still wrote the expert's kernel back at its
    # speed is reproduced, not verified; figures from before the flag was kept use the ratio
    mined = {
        "skill_figures": [
            {"mechanism": "pragma_unroll", "verified": False, "round_trip_reproduced": True},
            {"mechanism": "fast_math", "verified": False, "round_trip_ratio": 0.995},
            {"mechanism": "split_k", "verified": False, "round_trip_ratio": 0.97},
            {"mechanism": "smem_staging", "verified": True, "round_trip_reproduced": False,
             "round_trip_ratio": 1.0},
            {"mechanism": "launch_bounds", "round_trip_reproduced": True},
        ]
    }  # fmt: skip
    present = ["pragma_unroll", "fast_math", "split_k", "smem_staging"]
    assert bench.reproduced_mapped(mined, present) == ["fast_math", "pragma_unroll"]


def test_the_fused_classifiers_reference_is_softmax_minus_the_target_times_dloss() -> None:
    # our definition of llm.c's fused classifier, checked against what the harness's CPU code
    # computes, written out by hand: padded rows, an odd vocabulary, zero pads
    torch = pytest.importorskip("torch")
    from klineage.gate.inputs import run_reference

    definition = load_problem(PUBLIC / "llmc_classifier_fused").definition
    n, v, p = 3, 5, 8
    logits = torch.linspace(-2.0, 3.0, n * p).reshape(n, p)
    dlosses = torch.tensor([0.5, -1.0, 2.0])
    targets = torch.tensor([0, 4, 2], dtype=torch.int32)
    given = {"logits": logits, "dlosses": dlosses, "targets": targets}
    out = run_reference(definition, given, {"N": n, "V": v, "P": p})
    for row in range(n):
        x = [float(e) for e in logits[row, :v]]
        top = max(x)
        total = sum(math.exp(e - top) for e in x)
        probs = [math.exp(e - top) / total for e in x]
        target = int(targets[row])
        assert float(out["losses"][row]) == pytest.approx(
            -(x[target] - top) + math.log(total), rel=1e-5
        )
        for col in range(p):
            want = 0.0 if col >= v else (probs[col] - (col == target)) * float(dlosses[row])
            assert float(out["dlogits"][row, col]) == pytest.approx(want, rel=1e-5, abs=1e-7)
