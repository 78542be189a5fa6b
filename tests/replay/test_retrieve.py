"""Retrieval on the committed skills: what ranks, in what order, and why the others drop.
No GPU, no nvcc: conditions are checked against the definitions and the kernels' launches."""

from __future__ import annotations

import math

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.problem import Problem, load_problem
from klineage.replay.retrieve import WEIGHTS, retrieve, scope_score, track_record
from klineage.skills import Measured, Skill, SkillLibrary
from tests.conftest import REPO


@pytest.fixture(scope="module")
def library() -> list[Skill]:
    return list(SkillLibrary.load(REPO / "skills_out"))


@pytest.fixture(scope="module")
def rmsnorm() -> Problem:
    return load_problem(REPO / "expert_kernels" / "fused_add_rmsnorm")


@pytest.fixture(scope="module")
def layernorm() -> Problem:
    return load_problem(REPO / "heldout" / "layernorm")


def test_every_skill_is_either_ranked_or_dropped_with_a_reason(
    library: list[Skill], layernorm: Problem
) -> None:
    found = retrieve(library, layernorm)
    ranked, dropped = {r.skill for r in found.ranked}, {d.skill for d in found.dropped}
    assert ranked and not ranked & dropped
    assert ranked | dropped == {s.id for s in library}
    assert all(d.reason for d in found.dropped)


def test_ranked_best_first_by_scope_text_and_gain(library: list[Skill], layernorm: Problem) -> None:
    ranked = retrieve(library, layernorm).ranked
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    for r in ranked:
        expected = WEIGHTS["scope"] * r.scope + WEIGHTS["text"] * r.text + WEIGHTS["gain"] * r.gain
        assert r.score == pytest.approx(expected)
        assert 0.0 <= r.scope <= 1.0 and 0.0 <= r.text <= 1.0 and r.sites > 0


def test_a_skill_never_comes_back_to_the_problem_it_was_mined_from(
    library: list[Skill], rmsnorm: Problem
) -> None:
    found = retrieve(library, rmsnorm)
    assert all(r.source_problem != rmsnorm.name for r in found.ranked)
    own = [d for d in found.dropped if d.reason.startswith("mined from this same problem")]
    assert {d.skill for d in own} == {s.id for s in library if s.evidence.problem == rmsnorm.name}


def test_a_mechanism_with_no_site_in_the_target_drops(
    library: list[Skill], layernorm: Problem
) -> None:
    found = retrieve(library, layernorm)
    kernel = layernorm.kernel_source()
    for dropped in found.dropped:
        if dropped.reason == "its mechanism has no candidate site here":
            mechanism = get(dropped.mechanism)
            assert not [s for s in mechanism.candidates(kernel) if s.supported]


def test_the_kernel_can_be_given_as_text(library: list[Skill], layernorm: Problem) -> None:
    kernel = layernorm.kernel_source()
    as_text = retrieve(library, layernorm, kernel.text)
    as_source = retrieve(library, layernorm, KernelSource(kernel.text, name="layernorm_bf16.cu"))
    assert [r.skill for r in as_text.ranked] == [r.skill for r in as_source.ranked]


def test_scope_prefers_the_same_op_and_dtypes(library: list[Skill], layernorm: Problem) -> None:
    scores = {s.id: scope_score(s, layernorm, "sm_90") for s in library}
    bf16 = [k for k, s in zip(scores, library, strict=True) if "bfloat16" in s.scope.dtypes]
    others = [k for k, s in zip(scores, library, strict=True) if "bfloat16" not in s.scope.dtypes]
    assert bf16 and others
    assert max(scores[k] for k in bf16) > max(scores[k] for k in others)


def test_a_skill_no_forward_rule_applies_is_dropped(
    library: list[Skill], layernorm: Problem
) -> None:
    ranked = retrieve(library, layernorm).ranked
    chosen = next(s for s in library if s.id == ranked[0].skill)
    evidence_only = chosen.model_copy(update={"transferable": False})
    found = retrieve([evidence_only], layernorm)
    assert found.ranked == []
    (dropped,) = found.dropped
    assert dropped.reason == "no forward rule applies the form it was mined in"


def test_a_condition_the_rule_tests_at_run_time_keeps_the_skill_with_its_carrier(
    library: list[Skill],
) -> None:
    # log_softmax's rows of 50,257 floats are not 16-byte aligned; the loop form of
    # vectorized_access can peel each row to alignment at run time (check=peeled), so its
    # skills stay, each with that carrier, instead of being dropped for the one workload
    from klineage.mechanisms import Carrier
    from klineage.mining.removal import apply_everywhere

    problem = load_problem(REPO / "heldout" / "log_softmax")
    rows = apply_everywhere(problem.kernel_source(), get("block_per_row"), Carrier())
    found = retrieve(library, problem, rows)
    vectors = [r for r in found.ranked if r.mechanism == "vectorized_access"]
    assert vectors and all(r.carrier == {"check": "peeled"} for r in vectors)
    assert all("cols must be divisible by 4" in r.checked for r in vectors)
    # a condition its expert learned still has to hold: not a thing a rule tests at run time
    learned = [
        d
        for d in found.dropped
        if d.mechanism == "vectorized_access" and d.reason == "a condition fails"
    ]
    for dropped in learned:
        skill = next(s for s in library if s.id == dropped.skill)
        assert skill.conditions, dropped
    # where every workload keeps the rows aligned, nothing is tested at run time
    layernorm = load_problem(REPO / "heldout" / "layernorm")
    aligned = apply_everywhere(layernorm.kernel_source(), get("block_per_row"), Carrier())
    plain = [
        r
        for r in retrieve(library, layernorm, aligned).ranked
        if r.mechanism == "vectorized_access"
    ]
    assert plain and all(r.carrier == {} and r.checked == "" for r in plain)


def test_a_gain_counts_as_often_as_its_mechanism_gained_elsewhere(
    library: list[Skill], layernorm: Problem
) -> None:
    record = track_record(library, layernorm.name)
    for mechanism in {s.mechanism for s in library}:
        mined = [s for s in library if s.mechanism == mechanism]
        gained = [s for s in mined if s.effect.measured is Measured.GAIN]
        assert record[mechanism] == pytest.approx(len(gained) / len(mined))
    # restrict gained on fewer of its experts than vectors did: its gain counts for less
    assert record["restrict_pointers"] < record["vectorized_access"] < 1.0
    found = retrieve(library, layernorm)
    for ranked in found.ranked:
        skill = next(s for s in library if s.id == ranked.skill)
        own = math.log(skill.effect.geomean_speedup or 1.0)
        if skill.effect.measured is Measured.GAIN:
            assert ranked.gain == pytest.approx(own * record[ranked.mechanism])
        assert ranked.track_record == pytest.approx(record[ranked.mechanism])


def test_a_track_record_leaves_out_the_targets_own_skills(library: list[Skill]) -> None:
    problem = next(s.evidence.problem for s in library if s.mechanism == "restrict_pointers")
    mined = [s for s in library if s.mechanism == "restrict_pointers"]
    others = [s for s in mined if s.evidence.problem != problem]
    gained = [s for s in others if s.effect.measured is Measured.GAIN]
    assert len(others) < len(mined)
    assert track_record(library, problem)["restrict_pointers"] == pytest.approx(
        len(gained) / len(others)
    )
