"""Skill cards say plainly what a step measured, and `verified` means a reproduced gain."""

from __future__ import annotations

import pytest

from klineage.limits import CARD_SNIPPET_SHOWN
from klineage.problem import load_problem
from klineage.replay.retrieve import retrieve
from klineage.skills import (
    Effect,
    Measured,
    Skill,
    SkillLibrary,
    WorkloadEffect,
    anchor_of,
    card_code,
    render_skill_md,
)
from tests.conftest import REPO


@pytest.fixture(scope="module")
def library() -> SkillLibrary:
    return SkillLibrary.load(REPO / "skills_out")


def _workload(label: str, *trials: float) -> WorkloadEffect:
    speedup = sorted(trials)[len(trials) // 2]
    return WorkloadEffect(
        label=label,
        speedup=speedup,
        trial_speedups=list(trials),
        spread=0.0,
        before_ms=speedup,
        after_ms=1.0,
    )


def _effect(*workloads: WorkloadEffect, geomean: float) -> Effect:
    return Effect(workloads=list(workloads), geomean_speedup=geomean)


def test_a_gain_needs_a_workload_faster_in_every_trial() -> None:
    assert _effect(_workload("a", 1.2, 1.3, 1.25), geomean=1.25).measured is Measured.GAIN
    # 1.02x overall, but the trials disagree on the only workload: no measurable gain
    disagree = _effect(_workload("a", 0.98, 1.06, 1.02), geomean=1.02)
    assert disagree.measured is Measured.NO_GAIN
    assert "no workload faster in every trial" in disagree.summary()
    noise = _effect(_workload("a", 1.004, 1.006, 1.005), geomean=1.005)
    assert noise.measured is Measured.NO_GAIN and "within the 1% timing noise" in noise.summary()
    slower = _effect(_workload("a", 0.6, 0.62, 0.61), geomean=0.61)
    assert slower.measured is Measured.SLOWER and "measured slower: 0.61x" in slower.summary()


def test_verified_means_the_round_trip_reproduced_a_gain(library: SkillLibrary) -> None:
    skill = library.get("vectorized_access--softmax_rows_f32--3ae639dc")
    assert skill.effect.measured is Measured.GAIN
    cases = {
        (True, Measured.GAIN): True,
        (False, Measured.GAIN): False,
        (True, Measured.NO_GAIN): False,
        (True, Measured.SLOWER): False,
    }
    effects = {
        Measured.GAIN: skill.effect,
        Measured.NO_GAIN: _effect(_workload("a", 1.0, 1.001, 0.999), geomean=1.0),
        Measured.SLOWER: _effect(_workload("a", 0.9, 0.9, 0.9), geomean=0.9),
    }
    for (reproduced, measured), verified in cases.items():
        copy = skill.model_copy(
            update={"round_trip_reproduced": reproduced, "effect": effects[measured]}
        )
        copy.settle_verified()
        assert copy.verified is verified, (reproduced, measured)
    untried = skill.model_copy(update={"round_trip_reproduced": None})
    untried.settle_verified()
    assert untried.verified is None


def test_the_slowest_cards_say_so(library: SkillLibrary) -> None:
    unroll = render_skill_md(library.get("pragma_unroll--fmha_fp16--21b20c20"))
    assert "Measured slower: 0.93x on these workloads, no gain" in unroll
    assert 'measured: "slower"' in unroll and "verified: false" in unroll
    assert "Measured gain" not in unroll
    ballot = render_skill_md(library.get("warp_ballot_compaction--topk_f32"))
    risks = ballot.split("## Risks")[1].split("## Before")[0]
    assert "none observed" not in risks and "- measured slower: 0.94x" in risks
    assert "- slower on batch=64,length=131072,k=2048: 0.870x in every trial" in risks
    assert "the round trip reproduced the code, not a gain" in ballot


def test_a_card_within_the_noise_says_no_measurable_gain(library: SkillLibrary) -> None:
    card = render_skill_md(library.get("readonly_ldg--softmax_rows_f32--7e98e35e"))
    assert "No measurable gain on these workloads: 0.998x" in card
    assert 'measured: "no measurable gain"' in card and "verified: false" in card


def test_the_committed_library_follows_the_current_rules(library: SkillLibrary) -> None:
    skills = list(library)
    # every expert mined under the audited gate, with the machine-code check
    assert len(skills) == 88
    for skill in skills:
        again = skill.model_copy()
        again.settle_verified()
        assert again.verified is skill.verified, skill.id
    counts = {m: sum(s.effect.measured is m for s in skills) for m in Measured}
    assert counts == {Measured.GAIN: 44, Measured.NO_GAIN: 40, Measured.SLOWER: 4}
    assert sum(bool(s.verified) for s in skills) == 44
    # every round trip passed its gate (embedding_bag_sum's __ldg, once re-applied at a pointer
    # into a local variable and faulting, re-applies since its re-mine at a site that passes)
    failed = [s.id for s in skills if not s.round_trip_reproduced]
    assert failed == []


def test_cards_show_code_a_reader_writes(library: SkillLibrary) -> None:
    for skill in library:
        card = render_skill_md(skill)
        assert "klineage:" not in card.split("## Before")[1], skill.id  # restore marks
        assert "`<file>`" not in card, skill.id
        if "tensor_core_mma" in skill.id and "gemm" in skill.id:
            assert skill.scope.arch == "sm_90a"  # wgmma, as its condition says
    assert card_code("x = 1 /* klineage:rasterization kGroupM */ * n;") == "x = 1 * n;"


def test_a_long_anchor_is_cut_after_a_whole_line() -> None:
    simplified = "int a;\n"
    optimized = "int a;\n" + "".join(f'  asm("op" : "+f"(d[{i}]));\n' for i in range(200))
    _, after = anchor_of(simplified, optimized, None)
    kept, note = after.rsplit("\n", 1)
    assert len(kept) <= CARD_SNIPPET_SHOWN and kept.endswith("));")
    assert note.startswith("// ... ") and "more lines" in note


def test_retrieval_gives_no_gain_to_a_step_within_the_noise(library: SkillLibrary) -> None:
    gain = library.get("vectorized_access--softmax_rows_f32--3ae639dc")
    noise = gain.model_copy(
        update={
            "id": "vectorized_access--noise--00000000",
            "effect": _effect(_workload("a", 1.004, 1.006, 1.005), geomean=1.005),
        }
    )
    slower = gain.model_copy(
        update={
            "id": "vectorized_access--slower--00000000",
            "effect": _effect(_workload("a", 0.9, 0.9, 0.9), geomean=0.9),
        }
    )
    ranked = retrieve([gain, noise, slower], load_problem(REPO / "heldout" / "gelu")).ranked
    by_id = {r.skill: r for r in ranked}
    assert [r.skill for r in ranked] == [gain.id, noise.id, slower.id]
    assert by_id[noise.id].gain == 0.0 and by_id[noise.id].measured == "no measurable gain"
    assert by_id[slower.id].gain < 0 and by_id[gain.id].measured == "gain"


def test_a_skill_prints_as_a_short_summary(library: SkillLibrary) -> None:
    skill: Skill = library.get("online_softmax")
    assert repr(skill) == (
        "Skill('online_softmax--softmax_rows_f32--22b06008', measured gain: 1.28x, verified=True)"
    )
    text = str(skill)
    assert len(text) < 1000 and text.startswith("online_softmax--softmax_rows_f32--22b06008")


def test_the_committed_cards_are_what_the_library_renders(library: SkillLibrary) -> None:
    # bench/rerender_skills.py wrote them; a change to the card format must re-render them
    lines = (REPO / "skills_out" / "skills.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines == [skill.model_dump_json() for skill in library]
    for skill in library:
        card = (REPO / "skills_out" / skill.id / "SKILL.md").read_text(encoding="utf-8")
        assert card == render_skill_md(skill), skill.id


@pytest.mark.parametrize(
    ("skill_id", "written"),
    [
        ("warp_per_row--l2_pool_rows_f16--e06074e6", "s = warp_reduce_sum(s);"),
        (
            "smem_staging--linear_relu_f32--189385b0",
            "acc = fmaf(xs[ty][kk], ws[kk][tx], acc);",
        ),
    ],
)
def test_two_cards_with_fmaf_sums_transfer_since_their_re_mine(
    library: SkillLibrary, skill_id: str, written: str
) -> None:
    """Their first round trips restored the edge's source (the rules then refused `s = fmaf(f,
    f, s)` and a blocked `acc = fmaf(x, y, acc)`); the rules now write those forms, the re-mine
    re-applied the removal by rule, and the cards are transferable."""
    from klineage.kernel import KernelSource
    from klineage.lineage import LineageGraph
    from klineage.mechanisms import get
    from klineage.mining.removal import reapply, remove_mechanism

    skill = library.get(skill_id)
    assert skill.transferable is True
    lineage = LineageGraph.load(REPO / "skills_out" / "lineages" / f"{skill.evidence.problem}.json")
    optimized = KernelSource(lineage.state(skill.evidence.optimized).source)
    removal = remove_mechanism(optimized, get(skill.mechanism))
    assert removal.simplified.fingerprint == skill.evidence.simplified
    again = reapply(removal).text
    assert written in again and written not in removal.simplified.text
