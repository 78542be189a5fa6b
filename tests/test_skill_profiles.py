"""Skills that say what they relieve: the counter deltas of a step on its card, and retrieval
ranking a skill higher where the target's bottleneck is the one it relieved. The profiles
are made of counters recorded on the H200 (tests/recorded_profiles.py); the skills are the
committed library's."""

from __future__ import annotations

import pytest

from klineage.gate.bottleneck import Bottleneck, classify, peaks_for
from klineage.gate.counters import counter_changes
from klineage.gate.profile import LaunchProfile, Profile
from klineage.problem import load_problem
from klineage.replay.retrieve import WEIGHTS, retrieve
from klineage.skills import (
    Measured,
    Skill,
    SkillLibrary,
    profile_evidence,
    render_skill_md,
)
from tests.conftest import REPO
from tests.recorded_profiles import gelu_launch, gemm_launch


def _profile(launch: LaunchProfile, workload: str = "w-largest") -> Profile:
    profile = Profile(
        workload_uuid=workload, label="m=4096,n=4096", launches=[launch], minimum_bytes=47104
    )
    profile.bottleneck = classify(profile, peaks=peaks_for("NVIDIA H200"), operand_class="half")
    return profile


@pytest.fixture(scope="module")
def library() -> SkillLibrary:
    return SkillLibrary.load(REPO / "skills_out")


def test_a_steps_counters_are_compared_simplified_to_optimized() -> None:
    simplified, optimized = _profile(gelu_launch()), _profile(gemm_launch())
    changes = {c.figure: c for c in counter_changes(simplified, optimized)}
    time = changes["GPU time (us)"]
    assert time.simplified == pytest.approx(2.4)
    assert time.optimized == pytest.approx(211.52)  # the gemm report: 211.52 us
    assert changes["tensor pipes (% of peak)"].describe().endswith("(up)")
    assert changes["launches"].describe() == "launches 1 -> 1 (same)"
    # figures only one side reported are left out, not invented
    assert "shared-memory bank conflicts" not in changes  # the gemm's page gave none
    assert not changes["achieved occupancy (%)"].notable  # 12.2% and 12.5%: the same
    assert changes["SM throughput (% of peak)"].describe().endswith("(up)")


def test_the_card_shows_the_counter_deltas_and_what_the_step_relieved(
    library: SkillLibrary,
) -> None:
    skill = library.get("online_softmax")
    assert skill.effect.measured is Measured.GAIN
    evidence = profile_evidence(
        _profile(gelu_launch()), _profile(gemm_launch()), skill.effect.measured
    )
    assert evidence is not None
    assert evidence.simplified_bottleneck == "launch-bound"
    assert evidence.optimized_bottleneck == "compute-bound"
    assert evidence.relieves == "launch-bound"
    profiled = skill.model_copy(update={"profile": evidence})
    card = render_skill_md(profiled)
    assert '\nrelieves: "launch-bound"\n' in card.split("---")[1]  # front matter
    section = card[card.index("## Counters") : card.index("## Risks")]
    assert "the simpler kernel was launch-bound, the optimized one is compute-bound" in section
    assert "It relieves: **launch-bound**." in section
    assert "| GPU time (us) | 2.4 | 211.5 | 88.1x |" in section
    assert "| achieved occupancy (%) | 12.21 | 12.48 | same |" in section
    assert "| tensor pipes (% of peak) | 0.3263 | 72.1 |" in section
    assert Skill.model_validate_json(profiled.model_dump_json()) == profiled
    # the same card without a profile has no such section and no such key
    bare = render_skill_md(skill.model_copy(update={"profile": None}))
    assert "## Counters" not in bare and "relieves" not in bare


def test_a_step_relieves_nothing_without_a_gain_or_a_common_workload() -> None:
    simplified, optimized = _profile(gelu_launch()), _profile(gemm_launch())
    no_gain = profile_evidence(simplified, optimized, Measured.NO_GAIN)
    assert no_gain is not None and no_gain.relieves is None
    assert "relieves no bottleneck on record" in "\n".join(
        render_skill_md(_any_skill().model_copy(update={"profile": no_gain})).splitlines()
    )
    elsewhere = _profile(gemm_launch(), workload="another")
    assert profile_evidence(simplified, elsewhere, Measured.GAIN) is None
    assert profile_evidence(simplified, Profile.skip("no ncu"), Measured.GAIN) is None
    assert profile_evidence(None, optimized, Measured.GAIN) is None


def _any_skill() -> Skill:
    return next(iter(SkillLibrary.load(REPO / "skills_out")))


def test_retrieval_ranks_a_skill_higher_where_it_relieved_the_targets_bottleneck(
    library: SkillLibrary,
) -> None:
    problem = load_problem(REPO / "heldout" / "layernorm")
    # the library without the H200's profiles, so only the one given below can move a rank
    unprofiled = [s.model_copy(update={"profile": None}) for s in library]
    plain = retrieve(unprofiled, problem)
    # the lowest-ranked skill that measured a gain (a step that gained nothing relieves
    # nothing, whatever its counters)
    last = [r for r in plain.ranked if r.measured == "gain"][-1]
    evidence = profile_evidence(_profile(gelu_launch()), _profile(gemm_launch()), Measured.GAIN)
    assert evidence is not None and evidence.relieves == Bottleneck.LAUNCH.value
    skills = [
        s.model_copy(update={"profile": evidence}) if s.id == last.skill else s for s in unprofiled
    ]
    launch_bound = retrieve(skills, problem, bottleneck=Bottleneck.LAUNCH)
    moved = next(r for r in launch_bound.ranked if r.skill == last.skill)
    assert moved.bottleneck == 1.0 and moved.relieves == "launch-bound"
    assert moved.score == pytest.approx(last.score + WEIGHTS["bottleneck"])
    assert launch_bound.ranked.index(moved) < plain.ranked.index(last)
    # a target with another bottleneck, or none known, ranks as before
    for other in (Bottleneck.MEMORY, None):
        same = retrieve(skills, problem, bottleneck=other)
        assert [r.skill for r in same.ranked] == [r.skill for r in plain.ranked]
        assert all(r.bottleneck == 0.0 for r in same.ranked)


def test_the_h200_profiles_on_the_committed_cards_move_memory_bound_targets(
    library: SkillLibrary,
) -> None:
    relieved = {s.id for s in library if s.profile and s.profile.relieves == "memory-bound"}
    assert relieved, "the re-mined softmax and top-k cards were profiled on the H200"
    problem = load_problem(REPO / "heldout" / "layernorm")
    memory_bound = retrieve(library, problem, bottleneck=Bottleneck.MEMORY)
    moved = [r for r in memory_bound.ranked if r.skill in relieved]
    assert moved and all(r.bottleneck == 1.0 for r in moved)
    others = [r for r in memory_bound.ranked if r.skill not in relieved]
    assert all(r.bottleneck == 0.0 for r in others)
