"""Mining through the real build stage with a labelled stand-in for the GPU stages."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.lineage import AttemptStatus, LineageGraph, Termination
from klineage.mining.mine import mine
from klineage.mining.walk import MiningBudget
from klineage.skills import Measured, SkillLibrary
from tests.conftest import FIXTURES
from tests.mechanisms.roundtrip import PUBLIC_FORMS
from tests.mining.conftest import Mined
from tests.mining.stand_in_gate import StandInGate, mine_gated

pytestmark = pytest.mark.nvcc

PROBLEM = FIXTURES / "mining" / "exp_scale"
EXPERT = ["restrict_pointers", "readonly_ldg", "fast_math", "launch_bounds", "pragma_unroll"]
# what removing each mechanism costs (slowdown factor): the walk peels the cheapest first
COST = {
    "restrict_pointers": 1.01,
    "readonly_ldg": 1.05,
    "fast_math": 1.20,
    "launch_bounds": 1.02,
    "pragma_unroll": 1.10,
}


def _gate(builder: Builder, **rules) -> StandInGate:
    return StandInGate(builder, cost=COST, expert_mechanisms=EXPERT, **rules)


def test_complete_walk_peels_cheapest_first_and_verifies_every_skill(mined: Mined) -> None:
    report, tmp_path = mined.report, mined.out
    assert report.termination == "complete"
    assert report.steps == 5 and report.skills == 5 and report.verified == 5
    assert report.recall == 1.0 and report.missed == []
    lineage = LineageGraph.load(tmp_path / "lineages" / "exp_scale_f32.json")
    order = [a.mechanism for a in lineage.main_path()]
    assert order == sorted(COST, key=COST.get)
    final = lineage.state(lineage.meta.final)
    assert "__restrict__" not in final.source and "__ldg" not in final.source
    assert "__expf" not in final.source and "#pragma unroll" not in final.source
    # at step 0 every mechanism was tried: 5 attempts, one chosen
    assert len(lineage.attempts_from(lineage.root)) == 5
    library = SkillLibrary.load(tmp_path)
    fast_math = next(s for s in library if s.mechanism == "fast_math")
    assert fast_math.effect.geomean_speedup == pytest.approx(1.20, rel=1e-3)
    assert fast_math.verified and fast_math.round_trip_ratio == pytest.approx(1.0, rel=1e-3)
    assert fast_math.round_trip_exact is True
    assert "__expf" in fast_math.anchor.after and "expf" in fast_math.anchor.before
    for skill in library:
        assert skill.conditions, f"{skill.id} has no condition"
        assert skill.effect.workloads, f"{skill.id} has no measured effect"
        card = (tmp_path / skill.id / "SKILL.md").read_text()
        assert card.startswith("---\nname: ") and "## When it is valid" in card


def test_lineage_and_skills_round_trip_exactly(builder: Builder, tmp_path: Path) -> None:
    mine_gated(PROBLEM, tmp_path, gate=_gate(builder))
    path = tmp_path / "lineages" / "exp_scale_f32.json"
    lineage = LineageGraph.load(path)
    assert lineage.to_json() == json.loads(path.read_text())
    first = (tmp_path / "skills.jsonl").read_text()
    SkillLibrary.load(tmp_path).save()
    assert (tmp_path / "skills.jsonl").read_text() == first


def test_a_removal_that_breaks_is_rejected_and_the_walk_gets_stuck(
    builder: Builder, tmp_path: Path
) -> None:
    report = mine_gated(PROBLEM, tmp_path, gate=_gate(builder, breaks=["pragma_unroll"]))
    assert report.termination == "stuck"
    assert report.steps == 4 and report.rejected >= 1
    lineage = LineageGraph.load(tmp_path / "lineages" / "exp_scale_f32.json")
    rejected = [a for a in lineage.attempts() if a.status is AttemptStatus.REJECTED]
    assert {a.mechanism for a in rejected} == {"pragma_unroll"}
    assert all(
        a.gate_status == "INCORRECT_NUMERICAL" and "elements wrong" in a.message for a in rejected
    )
    library = SkillLibrary.load(tmp_path)
    assert "pragma_unroll" not in {s.mechanism for s in library}
    assert report.missed == ["pragma_unroll"]
    risky = next(s for s in library if s.mechanism == "restrict_pointers")
    assert any(r.kind == "rejected_sibling" and r.mechanism == "pragma_unroll" for r in risky.risks)


TAIL_LOOP = """\
// exp_scale with a full-vector path and a tail loop: two __ldg sites; __expf the only other
// mechanism (the others are gone already, so the walk builds few states)
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void exp_scale(const float* x, float alpha, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  if (cols % 4 == 0) {
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = __expf(__ldg(&x[r * cols + c])) * alpha;
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      y[i] = __expf(__ldg(&x[i])) * alpha;
    }
  }
}

extern "C" int run(const float* x, float alpha, float* y, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (rows == 0) return 0;
  exp_scale<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, alpha, y, rows, cols);
  return (int)cudaGetLastError();
}
"""


def _with_a_tail_loop(folder: Path) -> Path:
    """exp_scale as TAIL_LOOP, its mechanisms.json listing the two mechanisms it has."""
    shutil.copytree(PROBLEM, folder)
    (folder / "kernel.cu").write_text(TAIL_LOOP)
    listed = json.loads((folder / "mechanisms.json").read_text())
    kept = [m for m in listed if m["mechanism"] in ("readonly_ldg", "fast_math")]
    for entry in kept:
        entry["lines"] = [10, 15]
    (folder / "mechanisms.json").write_text(json.dumps(kept, indent=1))
    return folder


def test_a_mechanism_that_cannot_go_everywhere_goes_where_it_can(
    builder: Builder, tmp_path: Path
) -> None:
    """The tail loop's __ldg is needed (the stand-in says so); the full path's is not.
    Removing both is rejected, so each site is tried alone: the full path's removal becomes
    the skill, and the rejected whole removal is one of its risks."""
    problem = _with_a_tail_loop(tmp_path / "problem")
    gate = _gate(builder, needed_text=["__ldg(&x[i])"])
    report = mine_gated(problem, tmp_path / "out", gate=gate)
    assert report.recall == 1.0 and "readonly_ldg" not in report.missed
    lineage = LineageGraph.load(tmp_path / "out" / "lineages" / "exp_scale_f32.json")
    root = lineage.attempts_from(lineage.root)
    ldg = [a for a in root if a.mechanism == "readonly_ldg"]
    assert [(a.status, len(a.sites)) for a in ldg] == [
        (AttemptStatus.REJECTED, 2),
        (AttemptStatus.ACCEPTED, 1),
        (AttemptStatus.REJECTED, 1),
    ]
    alone = ldg[1]
    assert alone.id.endswith(f"-site-{alone.sites[0]['id']}")
    child = lineage.state(alone.child).source
    assert "__expf(x[r * cols + c])" in child and "__ldg(&x[i])" in child
    skill = next(s for s in SkillLibrary.load(tmp_path / "out") if s.mechanism == "readonly_ldg")
    # the stand-in charges nothing while one __ldg is left: the round trip reproduces the
    # step, but a step that gained nothing verifies no gain
    assert skill.round_trip_reproduced and "__ldg(&x[r * cols + c])" in skill.anchor.after
    assert skill.effect.measured is Measured.NO_GAIN and skill.verified is False
    own = [r for r in skill.risks if r.kind == "rejected_sibling" and r.mechanism == "readonly_ldg"]
    # each names the sites it removed: both, then the tail's alone
    assert [r.message.count("exp_scale:") for r in own] == [2, 1]
    assert all(r.message.startswith("removing it at exp_scale:") for r in own)
    # the tail's __ldg never goes: every later state rejects removing it again
    final = lineage.state(lineage.meta.final).source
    assert "__ldg(&x[i])" in final and "__ldg(&x[r * cols + c])" not in final


def test_conditions_are_inferred_from_probes(builder: Builder, tmp_path: Path) -> None:
    # while __launch_bounds__ is present, probes with cols % 4 != 0 fail (the stand-in's rule)
    rules = {"probe_failures": {"launch_bounds": lambda axes: axes["cols"] % 4 != 0}}
    mine_gated(PROBLEM, tmp_path, gate=_gate(builder, **rules))
    skill = next(s for s in SkillLibrary.load(tmp_path) if s.mechanism == "launch_bounds")
    kinds = {(c["kind"], c.get("axis"), c.get("k")) for c in skill.conditions}
    assert ("axis_divisible", "cols", 4) in kinds
    assert {p["workload"] for p in skill.probe_evidence} == {
        "rows=1,cols=1",
        "rows=3,cols=33",
        "rows=4,cols=33",
        "rows=2,cols=34",
    }
    assert any(r.kind == "failing_probe" for r in skill.risks)
    others = [s for s in SkillLibrary.load(tmp_path) if s.mechanism != "launch_bounds"]
    assert all(not s.probe_evidence for s in others)


def test_budget_stops_the_walk_and_resume_repeats_nothing(builder: Builder, tmp_path: Path) -> None:
    gate = _gate(builder)
    first = mine_gated(PROBLEM, tmp_path, gate=gate, budget=MiningBudget(gate_runs=3))
    assert first.termination == Termination.BUDGET.value
    runs_first = gate.runs
    second = mine_gated(PROBLEM, tmp_path, gate=gate, resume=True)
    assert second.termination == "complete"
    # no verdict was made twice: every one the first run made was served from the log
    log = tmp_path / "gatelog" / "exp_scale_f32.jsonl"
    keys = [json.loads(line)["key"] for line in log.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == gate.runs
    assert second.cached_verdicts >= 1 and gate.runs > runs_first


def test_two_gates_gate_each_state_side_by_side_with_the_same_result(
    builder: Builder, tmp_path: Path
) -> None:
    single = mine_gated(PROBLEM, tmp_path / "one", gate=_gate(builder))
    first, second = _gate(builder), _gate(builder)
    double = mine_gated(PROBLEM, tmp_path / "two", gate=first, gates=[first, second])
    # both GPUs' gates judged attempts; the walk, its skills and its figures did not change
    assert first.runs > 0 and second.runs > 0
    assert first.runs + second.runs == single.walk_gate_runs + single.probe_gate_runs + (
        single.round_trip_gate_runs
    )
    assert double.model_dump(exclude={"wall_seconds", "folder"}) == single.model_dump(
        exclude={"wall_seconds", "folder"}
    )
    assert (tmp_path / "one" / "skills.jsonl").read_text() == (
        tmp_path / "two" / "skills.jsonl"
    ).read_text()


def test_mine_command_rejects_malformed_devices() -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    result = CliRunner().invoke(app, ["mine", str(PROBLEM), "--devices", "zero"])
    assert result.exit_code == 2 and "expected GPU indexes" in result.output


def test_re_mining_a_problem_keeps_the_others_and_drops_its_stale_cards(
    builder: Builder, tmp_path: Path
) -> None:
    mine_gated(PROBLEM, tmp_path, gate=_gate(builder))
    mined = list(SkillLibrary.load(tmp_path))
    other = mined[0].model_copy(
        update={
            "id": "other-skill",
            "evidence": mined[0].evidence.model_copy(update={"problem": "other_problem"}),
        }
    )
    SkillLibrary.update_problem(tmp_path, "other_problem", [other])
    kept, dropped = mined[:2], mined[2:]

    # two writers at once, as two `mine` processes sharing one --out folder would be
    with ThreadPoolExecutor(2) as pool:
        list(
            pool.map(
                lambda job: SkillLibrary.update_problem(tmp_path, *job),
                [("exp_scale_f32", kept), ("other_problem", [other])] * 4,
            )
        )

    library = SkillLibrary.load(tmp_path)
    assert sorted(s.id for s in library) == sorted([other.id, *(s.id for s in kept)])
    for skill in dropped:
        assert not (tmp_path / skill.id).exists(), f"stale card {skill.id} left behind"
    for skill in [*kept, other]:
        assert (tmp_path / skill.id / "SKILL.md").is_file()


WMMA_TILE = """#include <mma.h>
// a wmma tile product: detected as tensor_core_mma, refused by its rule (opaque fragments)
__device__ void wmma_tile(const half* a, const half* b, float* c) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, half, nvcuda::wmma::row_major> fa;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, half, nvcuda::wmma::col_major> fb;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fc;
  nvcuda::wmma::fill_fragment(fc, 0.0f);
  nvcuda::wmma::load_matrix_sync(fa, a, 16);
  nvcuda::wmma::load_matrix_sync(fb, b, 16);
  nvcuda::wmma::mma_sync(fc, fa, fb, fc);
  nvcuda::wmma::store_matrix_sync(c, fc, 16, nvcuda::wmma::mem_row_major);
}
"""


ONE_STEP_FROM_WMMA = (
    """\
// exp_scale with every catalog mechanism but __expf already gone, and a wmma tile product in
// running code (a branch the workloads never take, but nothing proves it dead)
#include <cuda_runtime.h>
#include <stdint.h>
"""
    + WMMA_TILE
    + """
__global__ void exp_scale(const float* x, float alpha, float* y, int64_t rows, int64_t cols) {
  if (rows < 0) wmma_tile((const half*)x, (const half*)x, y);  // never taken
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t i = r * cols + c;
    y[i] = __expf(x[i]) * alpha;
  }
}

extern "C" int run(const float* x, float alpha, float* y, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  if (rows == 0) return 0;
  exp_scale<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, alpha, y, rows, cols);
  return (int)cudaGetLastError();
}
"""
)


def test_a_walk_ending_with_refused_sites_in_running_code_is_stuck(
    builder: Builder, mined: Mined, tmp_path: Path
) -> None:
    """One step from the end (only __expf left to remove, each state a slow wmma build): the
    walk removes it, then only the wmma product is left, which its rule refuses: stuck."""
    problem = tmp_path / "exp_scale"
    shutil.copytree(PROBLEM, problem)
    (problem / "kernel.cu").write_text(ONE_STEP_FROM_WMMA)
    report = mine_gated(problem, tmp_path / "out", gate=_gate(builder))
    # every catalog mechanism the rules can remove is gone, but the wmma product still runs
    assert report.steps == 1 and report.skills == 1
    assert report.termination == "stuck" and report.remaining == ["tensor_core_mma"]
    lineage = LineageGraph.load(tmp_path / "out" / "lineages" / "exp_scale_f32.json")
    assert lineage.meta.remaining == ["tensor_core_mma"]
    assert [a.mechanism for a in lineage.main_path()] == ["fast_math"]
    final = lineage.state(lineage.meta.final).source
    assert "__expf(" not in final and "nvcuda::wmma::mma_sync" in final
    # the same walk without the wmma product ends complete (the session's walk of exp_scale)
    assert mined.report.termination == "complete" and mined.report.remaining == []


def test_the_walk_builds_every_state_with_the_problems_compile_options(
    builder: Builder, tmp_path: Path
) -> None:
    """A kernel that compiles only with the -D its compile_options.json gives: every state the
    walk builds (for the gate and for its machine code) gets the flag, or nothing would build."""
    problem = tmp_path / "exp_scale"
    shutil.copytree(PROBLEM, problem)
    guarded = ONE_STEP_FROM_WMMA.replace(WMMA_TILE, "").replace(
        "  if (rows < 0) wmma_tile((const half*)x, (const half*)x, y);  // never taken\n", ""
    )
    guard = '#ifndef KL_FROM_OPTIONS\n#error "built without compile_options.json"\n#endif\n'
    (problem / "kernel.cu").write_text(guard + guarded)
    (problem / "compile_options.json").write_text('{"cuda_cflags": ["-DKL_FROM_OPTIONS"]}\n')
    report = mine_gated(problem, tmp_path / "out", gate=_gate(builder))
    assert report.steps == 1 and report.termination == "complete"
    lineage = LineageGraph.load(tmp_path / "out" / "lineages" / "exp_scale_f32.json")
    [step] = lineage.main_path()
    assert step.mechanism == "fast_math" and step.status is AttemptStatus.ACCEPTED
    assert lineage.state(step.child).machine_code is not None  # built with the flag too


def test_a_card_names_carried_code_by_its_size() -> None:
    """A dispatch skill carries its removed if chain (for the round trip); the card says how
    many lines it is and points to the After code, while skills.jsonl keeps it whole."""
    from klineage.skills import render_skill_md
    from tests.conftest import REPO

    library = SkillLibrary.load(REPO / "skills_out")
    skill = next(iter(library))
    chain = "if (cols <= 32) {\n  small<<<1, 32>>>(y);\n  return 0;\n}"
    carried = skill.model_copy(update={"carrier": {"dispatch": chain, "fallback": "after"}})
    card = render_skill_md(carried)
    assert '"dispatch": "<4 lines of code, shown under After>"' in card
    assert '"fallback": "after"' in card and "small<<<" not in card.split("## When")[0]
    assert carried.carrier["dispatch"] == chain


def test_a_card_leaves_out_unset_carrier_choices() -> None:
    from klineage.skills import render_skill_md
    from tests.conftest import REPO

    skill = next(iter(SkillLibrary.load(REPO / "skills_out")))
    unset = {"vector_width": None, "tile_size": None, "unroll": None}
    assert "Carrier" not in render_skill_md(skill.model_copy(update={"carrier": unset}))
    card = render_skill_md(skill.model_copy(update={"carrier": {**unset, "unroll": 4}}))
    assert 'Carrier (instance choices): `{"unroll": 4}`' in card


def test_an_exact_round_trip_is_reproduced_whatever_its_timing_noise(
    builder: Builder, tmp_path: Path
) -> None:
    """A round trip that restored the optimized source exactly rebuilt the optimized kernel
    itself; one trial of it timed against itself reading 0.985 (an H100 mine of llm.c's bias
    gradient had its 3.39x split-K step fail this way) is noise, not a slower rule: the skill
    is reproduced and verified, and its note and card say what the ratio was."""
    from klineage.skills import render_skill_md

    gate = _gate(builder)
    gate.same_kernel_noise = (1.0, 1 / 0.985, 0.996)
    mine_gated(PROBLEM, tmp_path, gate=gate)
    fast_math = next(s for s in SkillLibrary.load(tmp_path) if s.mechanism == "fast_math")
    assert fast_math.round_trip_exact is True
    assert min(fast_math.round_trip_trial_ratios) == pytest.approx(0.985, rel=1e-3)
    assert fast_math.round_trip_reproduced is True and fast_math.verified is True
    assert "the same kernel timed twice read" in fast_math.round_trip_note
    assert "slower than the optimized one" not in fast_math.round_trip_note
    card = render_skill_md(fast_math)
    assert "Round trip: verified" in card
    assert "one kernel timed twice" in card and "so it counts as reproduced" in card


def test_a_card_tells_timing_noise_from_a_different_rewrite() -> None:
    """A card written under the older rule, whose round trip restored the optimized source
    but read 0.991 in a trial (the cold H200 softmax runs had three), stays NOT verified, and
    says the ratio is one kernel timed twice; a different source gets no such sentence."""
    from klineage.skills import render_skill_md
    from tests.conftest import REPO

    skill = next(iter(SkillLibrary.load(REPO / "skills_out")))
    noisy = skill.model_copy(
        update={
            "verified": False,
            "round_trip_reproduced": False,
            "round_trip_ratio": 0.991,
            "round_trip_exact": True,
        }
    )
    card = render_skill_md(noisy)
    assert "Round trip: NOT verified (optimized / re-applied latency 0.991)" in card
    assert "one kernel timed twice" in card and "older rule" in card
    different = noisy.model_copy(update={"round_trip_exact": False})
    assert "one kernel timed twice" not in render_skill_md(different)


def test_removals_that_change_no_machine_code_cost_no_gate_run(
    builder: Builder, tmp_path: Path
) -> None:
    gate = _gate(builder)
    report = mine(PROBLEM, tmp_path, gate=gate)
    lineage = LineageGraph.load(tmp_path / "lineages" / "exp_scale_f32.json")
    no_ops = [a for a in lineage.attempts() if a.status is AttemptStatus.NO_MACHINE_CODE_CHANGE]
    # the 4-trip loop is unrolled with or without its pragma: the compiler already does it
    assert "pragma_unroll" in {a.mechanism for a in no_ops}
    assert report.no_machine_code_change == len(no_ops) >= 1
    assert all(a.no_op and a.no_op["reason"] and a.message for a in no_ops)
    assert not any(a.chosen for a in no_ops)
    # no verdict was made for a refused child, and none of them became a skill
    logged = tmp_path / "gatelog" / "exp_scale_f32.jsonl"
    lines = logged.read_text().splitlines()
    judged = {json.loads(line)["verdict"]["fingerprint"] for line in lines}
    assert not judged & {a.child for a in no_ops}
    library = SkillLibrary.load(tmp_path)
    assert not {s.evidence.edge for s in library} & {a.id for a in no_ops}
    assert "pragma_unroll" not in {s.mechanism for s in library}
    # a mechanism may be a no-op at one state and not at a later one: restrict's promise
    # matters once __ldg is gone and the compiler must prove the loads read-only itself
    assert report.skills == len(library) < 5
    for skill in library:  # every card carries the step's machine code
        assert skill.machine_code is not None
        assert skill.machine_code.sass_delta or skill.machine_code.host_changed
        card = (tmp_path / skill.id / "SKILL.md").read_text()
        assert "## Machine code" in card and "registers" in card


def test_a_verdict_is_shared_by_states_with_the_same_machine_code(
    builder: Builder, tmp_path: Path
) -> None:
    from klineage.gate.log import GateLog
    from klineage.kernel import KernelSource
    from klineage.problem import load_problem

    problem = load_problem(PROBLEM)
    expert = KernelSource.from_file(PROBLEM / "kernel.cu")
    same_code = KernelSource("// only a comment differs\n" + expert.text)
    gate = _gate(builder)
    path = tmp_path / "log.jsonl"
    first = GateLog(path, gate, share=True)
    made = first.run(problem, expert)
    shared = first.run(problem, same_code)
    assert gate.runs == 1 and first.shared == 1
    assert shared.fingerprint == same_code.fingerprint != made.fingerprint
    assert shared.workloads == made.workloads
    # a log written without machine keys is indexed from the sources a lineage holds
    old = GateLog(tmp_path / "old.jsonl", gate)
    old.run(problem, expert)
    resumed = GateLog(tmp_path / "old.jsonl", gate, share=True)
    resumed.learn_sources({expert.fingerprint: expert.text})
    resumed.run(problem, same_code)
    assert gate.runs == 2 and resumed.shared == 1


def _row_cache_expert(tmp_path: Path, text: str) -> Path:
    """The center_rows problem with an expert that caches each warp's row in the dynamic
    buffer on its first pass (the public-form fixture)."""
    problem = tmp_path / "center_rows"
    shutil.copytree(PUBLIC_FORMS / "problems" / "center_rows", problem)
    (problem / "kernel.cu").write_text(text)
    return problem


ROW_CACHE_EXPERT = (PUBLIC_FORMS / "smem_staging" / "row_cache.before.cu").read_text()


def test_a_form_without_a_forward_rule_is_restored_verified_and_not_transferable(
    builder: Builder, tmp_path: Path
) -> None:
    """The expert launches with a block held in a variable, where the row cache's forward
    rule needs `dim3(x, y)` in the launch to size the slices: the removal exists, the forward
    rule refuses, so the round trip restores the source the lineage edge removed; the skill
    records the gain and is kept out of replay."""
    text = ROW_CACHE_EXPERT.replace(
        "  center_rows_cached<<<blocks, dim3(32, kRowsPerBlock), slices",
        "  const dim3 block(32, kRowsPerBlock);\n  center_rows_cached<<<blocks, block, slices",
    )
    assert "<<<blocks, block, slices" in text
    problem = _row_cache_expert(tmp_path, text)
    tmp_path = tmp_path / "out"
    gate = StandInGate(builder, cost={"smem_staging": 1.3}, expert_mechanisms=["smem_staging"])
    mine_gated(problem, tmp_path, gate=gate)  # warp_per_row and others go after it
    skill = next(s for s in SkillLibrary.load(tmp_path) if s.mechanism == "smem_staging")
    assert skill.effect.measured is Measured.GAIN
    assert skill.transferable is False and skill.verified is True
    assert skill.round_trip_exact is True
    assert skill.round_trip_note.startswith("no forward rule re-applies this form (")
    assert "not written dim3(x, y)" in skill.round_trip_note
    assert "the round trip restored the source the lineage edge removed" in skill.round_trip_note
    card = (tmp_path / skill.id / "SKILL.md").read_text()
    assert "transferable: false" in card and "Not transferable: no forward rule" in card


def test_a_cached_row_is_cached_again_by_the_forward_rule(builder: Builder, tmp_path: Path) -> None:
    """The same expert launched with `dim3(32, rows)`: the round trip re-applies the row cache
    with the forward rule (its own names, the same slices), so the skill transfers."""
    problem = _row_cache_expert(tmp_path, ROW_CACHE_EXPERT)
    tmp_path = tmp_path / "out"
    gate = StandInGate(builder, cost={"smem_staging": 1.3}, expert_mechanisms=["smem_staging"])
    mine_gated(problem, tmp_path, gate=gate)
    skill = next(s for s in SkillLibrary.load(tmp_path) if s.mechanism == "smem_staging")
    assert skill.effect.measured is Measured.GAIN
    assert skill.transferable is True and skill.verified is True
    assert skill.round_trip_exact is False
    assert skill.round_trip_note == "re-applying gave a different source than the optimized one"


def test_parameters_staged_once_are_staged_again_by_the_forward_rule(
    builder: Builder, tmp_path: Path
) -> None:
    """The expert stages its row parameters once through casts of the dynamic buffer; the
    forward rule stages them again where the removal read them from global memory, so the
    skill is transferable (its round trip writes other code than the expert's: the gate's)."""
    problem = tmp_path / "scale_shift_rows"  # the problem files, with the public-form expert
    shutil.copytree(FIXTURES / "mining" / "scale_shift_rows", problem)
    shutil.copy(PUBLIC_FORMS / "smem_staging" / "cast_once.before.cu", problem / "kernel.cu")
    gate = StandInGate(builder, cost={"smem_staging": 1.3}, expert_mechanisms=["smem_staging"])
    report = mine_gated(problem, tmp_path / "out", gate=gate)
    assert report.steps == 1 and report.skills == 1
    (skill,) = SkillLibrary.load(tmp_path / "out")
    assert skill.mechanism == "smem_staging" and skill.transferable is True


def test_skills_with_a_forward_rule_are_transferable(mined: Mined) -> None:
    assert all(skill.transferable is True for skill in SkillLibrary.load(mined.out))


def test_a_removal_wrong_only_after_another_says_so_on_its_card(
    builder: Builder, tmp_path: Path
) -> None:
    # the expert is wrong without both __restrict__ and __expf (a fault one removal alone
    # hides): fast_math is correct to remove from the expert, and wrong once restrict is gone
    gate = _gate(builder, breaks_together=[["restrict_pointers", "fast_math"]])
    report = mine_gated(PROBLEM, tmp_path, gate=gate)
    assert report.termination == "stuck"  # fast_math stays: every later state rejects it
    lineage = LineageGraph.load(tmp_path / "lineages" / "exp_scale_f32.json")
    later = [
        a
        for a in lineage.attempts()
        if a.mechanism == "fast_math" and a.status is AttemptStatus.REJECTED
    ]
    assert later and all(a.parent != lineage.root for a in later)
    skill = next(s for s in SkillLibrary.load(tmp_path) if s.mechanism == "fast_math")
    assert skill.evidence.optimized == lineage.root  # the expert's own removal, accepted
    elsewhere = [r for r in skill.risks if r.kind == "rejected_elsewhere"]
    assert len(elsewhere) == len(later)
    assert elsewhere[0].message.startswith("removing it after restrict_pointers went: ")
    assert elsewhere[0].status == "INCORRECT_NUMERICAL"
    card = (tmp_path / skill.id / "SKILL.md").read_text()
    assert "- rejected_elsewhere: fast_math -> INCORRECT_NUMERICAL: removing it after" in card
