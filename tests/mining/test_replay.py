"""Replay through the real build stage with the labelled stand-in for the GPU stages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from klineage.gate.bottleneck import classify, peaks_for
from klineage.gate.build import Builder
from klineage.gate.counters import CounterChange
from klineage.gate.profile import Profile
from klineage.kernel import KernelSource
from klineage.lineage import LineageGraph
from klineage.problem import load_problem
from klineage.replay.results import GateRunRecord
from klineage.replay.retrieve import retrieve
from klineage.replay.run import ReplayBudget, ReplayReport, load_replay
from klineage.skills import Measured, ProfileEvidence, Skill, SkillLibrary, profile_evidence
from tests.conftest import FIXTURES, REPO
from tests.mining.conftest import Mined
from tests.mining.stand_in_gate import StandInGate, replay_gated
from tests.mining.test_mine import EXPERT, PROBLEM, _gate
from tests.recorded_profiles import gelu_launch

pytestmark = pytest.mark.nvcc

TARGET = FIXTURES / "mining" / "exp_target"


@pytest.fixture(scope="module")
def skills(mined: Mined) -> Path:
    return mined.out


def test_retrieval_ranks_by_gain_and_drops_what_cannot_apply(skills: Path) -> None:
    library = list(SkillLibrary.load(skills))
    problem = load_problem(TARGET)
    naive = KernelSource.from_file(TARGET / "kernel.cu")
    result = retrieve(library, problem, naive)
    ranked = [r.mechanism for r in result.ranked]
    assert ranked[0] == "fast_math"  # the largest measured gain, same op and dtype
    assert set(ranked) == {"fast_math", "readonly_ldg", "launch_bounds", "restrict_pointers"}
    dropped = {d.mechanism: d.reason for d in result.dropped}
    assert dropped == {"pragma_unroll": "its mechanism has no candidate site here"}
    assert all(r.source_problem == "exp_scale_f32" for r in result.ranked)


def test_leakage_guard_drops_skills_from_the_same_problem(skills: Path) -> None:
    library = list(SkillLibrary.load(skills))
    expert = KernelSource.from_file(PROBLEM / "kernel.cu")
    result = retrieve(library, load_problem(PROBLEM), expert)
    assert not result.ranked
    assert {d.reason for d in result.dropped} == {"mined from this same problem (leakage guard)"}


def test_a_failing_condition_drops_the_skill_and_names_workload(
    skills: Path, tmp_path: Path
) -> None:
    library = SkillLibrary.load(skills)
    skill = next(s for s in library if s.mechanism == "fast_math")
    blocked = skill.model_copy(
        update={"conditions": [{"kind": "axis_divisible", "axis": "cols", "k": 1024}]}
    )
    result = retrieve([blocked], load_problem(TARGET), KernelSource.from_file(TARGET / "kernel.cu"))
    [drop] = result.dropped
    assert drop.reason == "a condition fails"
    assert drop.condition.startswith("cols must be divisible by 1024")
    assert drop.workload == "rows=64,cols=512"


def test_replay_methods_on_the_same_budget(builder: Builder, skills: Path, tmp_path: Path) -> None:
    gate = StandInGate(
        builder,
        cost={
            "fast_math": 1.5,
            "readonly_ldg": 1.1,
            "launch_bounds": 1.02,
            "restrict_pointers": 1.05,
        },
        expert_mechanisms=EXPERT,
    )
    report = replay_gated([TARGET], skills, tmp_path, gate=gate, budget=ReplayBudget(gate_runs=6))
    by_method = {r.method: r for r in report.results}
    assert set(by_method) == {"skills", "blind", "memory"}
    for result in report.results:
        assert len(result.runs) <= 6
        assert result.speedup >= 1.0
        # real nvcc builds behind every verdict: their cost is carried even when cached
        assert all(run.gate_seconds > 0 for run in result.runs)
        assert result.gate_seconds > sum(run.gate_seconds for run in result.runs)
    skilled = by_method["skills"]
    # fast_math first (highest gain), kept at once: 1.5x after one gate run
    assert skilled.runs[0].action == "fast_math" and skilled.runs[0].outcome == "kept"
    assert skilled.runs_to_90 <= 3
    assert skilled.speedup == pytest.approx(1.5 * 1.1 * 1.05 * 1.02, rel=0.02)
    assert {u.source for u in skilled.skills_used} == {"exp_scale_f32"}
    saved = load_replay(tmp_path / "replay.json")
    assert [s.method for s in saved.summary] == ["skills", "blind", "memory"]
    assert (tmp_path / "lineages" / "exp_target_f32.skills.json").is_file()
    data = json.loads((tmp_path / "lineages" / "exp_target_f32.blind.json").read_text())
    assert data["graph"]["method"] == "blind"
    pytest.importorskip("matplotlib")
    assert (tmp_path / "replay.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("fast_math", [0.9, 0.995])
def test_a_skill_that_measured_slower_on_the_way_waits_behind_the_rest(
    builder: Builder, skills: Path, tmp_path: Path, fast_math: float
) -> None:
    """fast_math, ranked first, makes this target slower (measurably, or within noise: it
    changed nothing, and before 2026-12-05 was tried first again); the other three each gain."""
    gate = StandInGate(
        builder,
        cost={
            "fast_math": fast_math,
            "readonly_ldg": 1.3,
            "launch_bounds": 1.2,
            "restrict_pointers": 1.1,
        },
        expert_mechanisms=EXPERT,
    )
    report = replay_gated(
        [TARGET], skills, tmp_path, gate=gate, methods=["skills"], budget=ReplayBudget(gate_runs=8)
    )
    [result] = report.results
    actions = [(r.action, r.outcome) for r in result.runs]
    # measurably slower at the start, fast_math is not tried again at the next states until
    # the skills not yet measured slower have had their turn (before: first at every state)
    assert actions[0] == ("fast_math", "slower")
    kept = [a for a, outcome in actions if outcome == "kept"]
    assert sorted(kept[:3]) == ["launch_bounds", "readonly_ldg", "restrict_pointers"]
    last_kept = max(i for i, (_, outcome) in enumerate(actions) if outcome == "kept")
    retried = [a for a, _ in actions[1 : last_kept + 1]].count("fast_math")
    assert retried == 0  # neither slower nor idle goes before a skill not yet tried
    assert result.speedup == pytest.approx(1.3 * 1.2 * 1.1, rel=0.02)


def test_replay_command_rejects_an_unknown_baseline(skills: Path) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    result = CliRunner().invoke(
        app, ["replay", str(TARGET), "--skills", str(skills), "--baselines", "blind,guess"]
    )
    assert result.exit_code == 2 and "unknown baseline 'guess'" in result.output


def test_print_report_shows_every_method(builder: Builder, skills: Path, tmp_path: Path) -> None:
    from rich.console import Console

    from klineage.cli.replay import print_report

    gate = _gate(builder)
    report = replay_gated(
        [TARGET], skills, tmp_path, gate=gate, methods=["skills"], budget=ReplayBudget(gate_runs=2)
    )
    wide = Console(width=240, record=True)
    print_report(report, wide)
    text = wide.export_text()
    assert "exp_target_f32" in text and "geomean vs naive" in text
    assert "repeats not gated" in text  # moves of machine code already gated from a state


class _RecordingGate(StandInGate):
    """The stand-in, noting for each verdict its problem and whether the build was cached."""

    def __init__(self, builder: Builder, **options: object) -> None:
        super().__init__(builder, **options)  # type: ignore[arg-type]
        self.problems: list[str] = []
        self.cached: list[bool] = []

    def run(self, problem, kernel, **options):  # type: ignore[no-untyped-def]
        self.problems.append(problem.name)
        self.cached.append(self.builder.build(kernel.text, name=kernel.name).cached)
        return super().run(problem, kernel, **options)


def test_candidates_are_built_ahead_of_their_gate_runs(
    skills: Path, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    fresh = Builder(cache_dir=tmp_path_factory.mktemp("fresh_cache"))
    gate = _RecordingGate(fresh, cost={"fast_math": 1.5}, expert_mechanisms=EXPERT)
    # a fresh cache rebuilds every state this walk reaches: three runs show it, at less cost
    report = replay_gated(
        [TARGET], skills, tmp_path, gate=gate, methods=["blind"], budget=ReplayBudget(gate_runs=3)
    )
    [result] = report.results
    assert len(result.runs) >= 2
    # the start is gated before anything is planned; every candidate was compiled beforehand
    assert gate.cached[0] is False
    assert all(gate.cached[1:]), gate.cached


def test_problems_spread_over_several_gates(builder: Builder, skills: Path, tmp_path: Path) -> None:
    first = _RecordingGate(builder, cost={"fast_math": 1.5}, expert_mechanisms=EXPERT)
    second = _RecordingGate(builder, cost={"fast_math": 1.5}, expert_mechanisms=EXPERT)
    report = replay_gated(
        [TARGET, PROBLEM],
        skills,
        tmp_path,
        gates=[first, second],
        methods=["skills", "blind"],
        budget=ReplayBudget(gate_runs=3),
    )
    assert [(r.problem, r.method) for r in report.results] == [
        ("exp_target_f32", "skills"),
        ("exp_target_f32", "blind"),
        ("exp_scale_f32", "skills"),
        ("exp_scale_f32", "blind"),
    ]
    # each gate judged whole problems: one problem's verdicts are never split across GPUs
    assert first.problems and second.problems
    assert len(set(first.problems)) == 1 and len(set(second.problems)) == 1
    assert set(first.problems) != set(second.problems)


def test_replay_command_rejects_malformed_devices(skills: Path) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    result = CliRunner().invoke(
        app, ["replay", str(TARGET), "--skills", str(skills), "--devices", "0,gpu1"]
    )
    assert result.exit_code == 2 and "expected GPU indexes" in result.output


def test_misses_name_the_mechanism_and_the_evidence(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    # grid_stride_loop pays off here, but no expert used it: blind finds it, skills cannot
    gate = StandInGate(
        builder,
        cost={"fast_math": 1.5, "grid_stride_loop": 1.4},
        expert_mechanisms=EXPERT,
    )
    report = replay_gated(
        [TARGET],
        skills,
        tmp_path,
        gate=gate,
        methods=["skills", "blind"],
        budget=ReplayBudget(gate_runs=12),
    )
    by_method = {r.method: r for r in report.results}
    assert by_method["blind"].speedup > by_method["skills"].speedup * 1.05
    misses = {m.mechanism: m for m in report.misses}
    assert misses["grid_stride_loop"].reason == "no_skill"
    assert misses["grid_stride_loop"].baseline == "blind"
    assert misses["grid_stride_loop"].ratio == pytest.approx(1.4, rel=0.01)
    assert "fast_math" not in misses  # both kept it at the same gain
    saved = load_replay(tmp_path / "replay.json")
    assert [m.reason for m in saved.misses] == [m.reason for m in report.misses]


def _skills_bounds_runs(tmp_path: Path, gate: StandInGate) -> list[GateRunRecord]:
    """The launch_bounds runs of the skills method replaying the library in tmp_path/lib."""
    report = replay_gated(
        [TARGET],
        tmp_path / "lib",
        tmp_path / "out",
        gate=gate,
        methods=["skills"],
        budget=ReplayBudget(gate_runs=12),
    )
    [result] = report.results
    return [r for r in result.runs if r.action == "launch_bounds"]


class _BoundAwareGate(StandInGate):
    """The stand-in, where one `__launch_bounds__(N)` is worth a further `cost["bounds_N"]`
    (a carrier that matters), so two carriers of one skill measure differently."""

    def __init__(self, builder: Builder, bound: int, **rules: Any) -> None:
        super().__init__(builder, **rules)
        self.bound = bound

    def present(self, kernel: KernelSource) -> set[str]:
        found = super().present(kernel)
        if f"__launch_bounds__({self.bound})" in kernel.text:
            found.add(f"bounds_{self.bound}")
        return found


def test_a_kept_skill_keeps_its_fastest_carrier(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    library = SkillLibrary.load(skills)
    bounds = next(s for s in library if s.mechanism == "launch_bounds")
    wider = bounds.model_copy(update={"id": f"{bounds.id}-512", "carrier": {"block_size": 512}})
    with_both = SkillLibrary(tmp_path / "lib", [*library, wider])
    with_both.save()
    gate = _BoundAwareGate(
        builder, 512, cost={"launch_bounds": 1.02, "bounds_512": 1.3}, expert_mechanisms=EXPERT
    )
    bounds_runs = _skills_bounds_runs(tmp_path, gate)
    outcomes = {r.outcome for r in bounds_runs}
    assert {"kept", "outranked"} <= outcomes
    [kept] = [r for r in bounds_runs if r.outcome == "kept"]
    assert kept.carrier.get("block_size") == 512
    assert kept.ratio == pytest.approx(1.02 * 1.3, rel=0.01)
    [passed_over] = [r for r in bounds_runs if r.outcome == "outranked"]
    assert passed_over.ratio == pytest.approx(1.02, rel=0.01)
    assert passed_over.speedup < kept.speedup  # it did not move the walk
    lineage = json.loads((tmp_path / "out" / "lineages" / "exp_target_f32.skills.json").read_text())
    chosen = [e for e in lineage["edges"] if e["mechanism"] == "launch_bounds" and e["chosen"]]
    assert len(chosen) == 1


def test_a_mechanisms_third_carrier_waits_for_the_next_skills_first(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    """Three launch_bounds cards that rank first (block sizes 512, 384 and 128, which this
    256-thread launch refuses) give the mechanism four carriers here with the card it was
    mined with; after two gate runs of them, none kept, the next skill gets its turn, and the
    other carriers wait behind every later move: tried, not dropped."""
    library = SkillLibrary.load(skills)
    fast = next(s for s in library if s.mechanism == "fast_math")
    bounds = next(s for s in library if s.mechanism == "launch_bounds")
    strong = fast.effect.model_copy(update={"geomean_speedup": 5.0})
    cards = [
        bounds.model_copy(
            update={"id": f"{bounds.id}-{n}", "carrier": {"block_size": n}, "effect": strong}
        )
        for n in (512, 384, 128)
    ]
    SkillLibrary(tmp_path / "lib", [*library, *cards]).save()
    ranked = retrieve(
        [*library, *cards], load_problem(TARGET), KernelSource.from_file(TARGET / "kernel.cu")
    ).ranked
    assert [r.mechanism for r in ranked[:4]] == ["launch_bounds"] * 3 + ["fast_math"]

    def runs(cost: dict[str, float], budget: int, out: str, **options: Any) -> ReplayReport:
        gate = StandInGate(builder, cost=cost, expert_mechanisms=EXPERT)
        return replay_gated(
            [TARGET],
            tmp_path / "lib",
            tmp_path / out,
            gate=gate,
            methods=["skills"],
            budget=ReplayBudget(gate_runs=budget),
            **options,
        )

    # the bounds are worth nothing here, fast_math is: it is the third run, not the fifth
    report = runs({"fast_math": 1.5}, 3, "worth")
    assert report.carriers_first == 2
    first = report.results[0].runs
    assert [r.action for r in first] == ["launch_bounds", "launch_bounds", "fast_math"]
    assert first[2].outcome == "kept"
    # as replays ran before: every carrier of the first-ranked skill in a row
    in_a_row = runs({"fast_math": 1.5}, 3, "in_a_row", carriers_first=None)
    assert in_a_row.carriers_first is None
    assert [r.action for r in in_a_row.results[0].runs] == ["launch_bounds"] * 3
    with pytest.raises(ValueError, match="carriers_first must be at least 1"):
        runs({}, 3, "none", carriers_first=0)
    # nothing is worth anything: every skill has its turn, then the bounds that waited
    every = runs({}, 12, "nothing").results[0].runs
    actions = [r.action for r in every]
    assert actions[:2] == ["launch_bounds", "launch_bounds"]
    assert set(actions[2:5]) == {"fast_math", "readonly_ldg", "restrict_pointers"}
    waited = [r.carrier.get("block_size") for r in every[5:] if r.action == "launch_bounds"]
    assert 512 in waited


def _save_with_bounds_of_512(skills: Path, folder: Path) -> None:
    """The library in `skills`, its launch_bounds skills learned at block size 512, saved in
    `folder`."""
    tuned = [
        s.model_copy(update={"carrier": {"block_size": 512}})
        if s.mechanism == "launch_bounds"
        else s
        for s in SkillLibrary.load(skills)
    ]
    SkillLibrary(folder, tuned).save()


def test_the_rules_default_carrier_competes_with_learned_ones(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    """A carrier learned on one expert (block size 512) passes; the rule's default for this
    target (its 256-thread launch) is then gated from the same state and kept, faster."""
    _save_with_bounds_of_512(skills, tmp_path / "lib")
    # the bound the target's own launch implies (256) is worth 1.3x more; the tuned 512 is not
    gate = _BoundAwareGate(
        builder, 256, cost={"launch_bounds": 1.02, "bounds_256": 1.3}, expert_mechanisms=EXPERT
    )
    bounds_runs = _skills_bounds_runs(tmp_path, gate)
    [kept] = [r for r in bounds_runs if r.outcome == "kept"]
    assert kept.carrier.get("block_size") is None  # the rule's default
    assert kept.ratio == pytest.approx(1.02 * 1.3, rel=0.01)
    [passed_over] = [r for r in bounds_runs if r.outcome == "outranked"]
    assert passed_over.carrier.get("block_size") == 512


@pytest.mark.parametrize(("edge", "kept_bound"), [(1.01, None), (1.05, 512)])
def test_within_noise_of_a_learned_carrier_the_rules_default_is_kept(
    builder: Builder, skills: Path, tmp_path: Path, edge: float, kept_bound: int | None
) -> None:
    """The learned block size 512 measures `edge` faster than the rule's default (the target's
    own 256): within timing noise (1%) the default's kernel is the one the walk goes on from;
    past it (5%), the learned carrier's."""
    _save_with_bounds_of_512(skills, tmp_path / "lib")
    gate = _BoundAwareGate(
        builder, 512, cost={"launch_bounds": 1.05, "bounds_512": edge}, expert_mechanisms=EXPERT
    )
    bounds_runs = _skills_bounds_runs(tmp_path, gate)
    [kept] = [r for r in bounds_runs if r.outcome == "kept"]
    assert kept.carrier.get("block_size") == kept_bound
    [passed_over] = [r for r in bounds_runs if r.outcome == "outranked"]
    assert passed_over.carrier.get("block_size") == (512 if kept_bound is None else None)
    assert passed_over.ratio > kept.ratio if kept_bound is None else passed_over.ratio < kept.ratio


def test_each_used_skill_names_the_folder_it_came_from(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    # the mined skills split over two folders, fast_math's alone in the second
    lines = [line for line in (skills / "skills.jsonl").read_text().splitlines() if line.strip()]
    fast = [line for line in lines if json.loads(line)["mechanism"] == "fast_math"]
    rest = [line for line in lines if line not in fast]
    assert fast and rest
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for folder, chosen in ((ours, rest), (theirs, fast)):
        folder.mkdir()
        (folder / "skills.jsonl").write_text("\n".join(chosen) + "\n")
    gate = StandInGate(
        builder, cost={"fast_math": 1.5, "readonly_ldg": 1.1}, expert_mechanisms=EXPERT
    )
    report = replay_gated(
        [TARGET],
        [ours, theirs],
        tmp_path / "out",
        gate=gate,
        methods=["skills"],
        budget=ReplayBudget(gate_runs=4),
    )
    [result] = report.results
    folders = {u.skill.split("--")[0]: u.folder for u in result.skills_used}
    assert folders["fast_math"] == str(theirs)
    assert folders["readonly_ldg"] == str(ours)
    assert load_replay(tmp_path / "out" / "replay.json").skills == [str(ours), str(theirs)]


def _launch_bound(_present: set[str]) -> Profile:
    """The stand-in gate's profile of every state: the recorded H200 counters of a tiny
    launch-bound kernel."""
    profile = Profile(
        workload_uuid="w", label="rows=64,cols=512", launches=[gelu_launch()], minimum_bytes=47104
    )
    profile.bottleneck = classify(profile, peaks=peaks_for("NVIDIA H200"), operand_class="half")
    return profile


COSTS = {"fast_math": 1.5, "readonly_ldg": 1.1, "restrict_pointers": 1.05, "launch_bounds": 1.02}
"""How much slower the target is without each (four skills the stand-in makes each faster)."""


def _skills_and_profiled(
    builder: Builder, library: list[Skill], out: Path, profiles: Any
) -> tuple[ReplayReport, StandInGate]:
    """Skills and profiled replayed side by side (4 gate runs each) with `library` (written
    to out/skills), on a stand-in gate that profiles every state with `profiles`."""
    folder = out / "skills"
    folder.mkdir()
    (folder / "skills.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in library))
    gate = StandInGate(builder, cost=COSTS, expert_mechanisms=EXPERT, profiles=profiles)
    report = replay_gated(
        [TARGET],
        folder,
        out / "out",
        gate=gate,
        methods=["skills", "profiled"],
        budget=ReplayBudget(gate_runs=4),
    )
    return report, gate


def relieving_launch_bounds(library: list[Skill]) -> list[Skill]:
    """`library` with its launch_bounds skills (ranked last by gain) marked as having relieved
    a launch-bound state on their expert."""
    evidence = profile_evidence(
        _launch_bound(set()), _launch_bound(set()).model_copy(deep=True), Measured.GAIN
    )
    relieved = evidence.model_copy(update={"relieves": "launch-bound"})
    return [
        s.model_copy(update={"profile": relieved}) if s.mechanism == "launch_bounds" else s
        for s in library
    ]


def _busy(present: set[str]) -> Profile:
    """The same recorded launch, at 98% achieved occupancy: a GPU with no idle warp slots."""
    profile = _launch_bound(present)
    profile.launches[0].achieved_occupancy_pct = 98.0
    return profile


def test_the_profiled_method_tries_last_a_skill_the_profile_leaves_nothing_to_relieve(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    library = list(SkillLibrary.load(skills))
    # fast_math (first by gain) "filled an idle GPU" on its expert: occupancy 25% -> 93%
    filled = CounterChange(figure="achieved occupancy (%)", simplified=25.0, optimized=93.0)
    evidence = ProfileEvidence(workload="rows=64,cols=512", changes=[filled])
    filling = [
        s.model_copy(update={"profile": evidence}) if s.mechanism == "fast_math" else s
        for s in library
    ]
    report, _ = _skills_and_profiled(builder, filling, tmp_path, _busy)
    by_method = {r.method: r for r in report.results}
    assert by_method["skills"].runs[0].action == "fast_math"
    # every state runs at 98%: the profiled method tries fast_math after everything else
    assert [r.action for r in by_method["profiled"].runs] == [
        "restrict_pointers",
        "readonly_ldg",
        "launch_bounds",
        "fast_math",
    ]
    # the profiles of the states it went on from are kept in its lineage, not only the start's
    lineage = LineageGraph.load(
        tmp_path / "out" / "lineages" / f"{load_problem(TARGET).name}.profiled.json"
    )
    profiled = [n for n, data in lineage.graph.nodes(data=True) if data.get("profile")]
    assert len(profiled) >= 4  # the start and the three kept states before the last run


def test_the_profiled_method_ranks_by_the_bottleneck_and_skills_does_not_beside_it(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    relieving = relieving_launch_bounds(list(SkillLibrary.load(skills)))
    report, gate = _skills_and_profiled(builder, relieving, tmp_path, _launch_bound)
    by_method = {r.method: r for r in report.results}
    # beside the profiled method, skills ranks by gain alone: fast_math first
    assert by_method["skills"].runs[0].action == "fast_math"
    # the profiled method ranks the skill that relieved the state's bottleneck higher
    skilled = [r.action for r in by_method["skills"].runs]
    profiled = [r.action for r in by_method["profiled"].runs]
    assert skilled == ["fast_math", "restrict_pointers", "readonly_ldg", "launch_bounds"]
    assert profiled == ["fast_math", "launch_bounds", "restrict_pointers", "readonly_ldg"]
    assert gate.profiled, "the profiled method profiled the states it went on from"
    assert [s.method for s in report.summary] == ["skills", "profiled"]
    # alone on a profiling gate, the skills method ranks by the bottleneck as before
    alone = replay_gated(
        [TARGET],
        tmp_path / "skills",
        tmp_path / "alone",
        gate=gate,
        budget=ReplayBudget(gate_runs=4),
        methods=["skills"],
    )
    assert [r.action for r in alone.results[0].runs] == profiled


def test_the_profiled_method_needs_gates_that_profile(skills: Path, tmp_path: Path) -> None:
    from klineage.replay.run import replay

    with pytest.raises(ValueError, match="profiled method ranks by profiles"):
        replay([TARGET], skills, tmp_path, methods=["skills", "profiled"])


def test_replay_command_refuses_profiled_without_profile(skills: Path) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    result = CliRunner().invoke(
        app, ["replay", str(TARGET), "--skills", str(skills), "--baselines", "profiled"]
    )
    assert result.exit_code == 2 and "add --profile" in result.output


def test_of_two_skills_that_close_each_other_the_faster_is_kept(
    builder: Builder, tmp_path: Path
) -> None:
    """On a naive SIMT GEMM, vectorizing the loads leaves no tile to stage and staging leaves
    no load to vectorize. The vectorization ranks first (its expert measured a gain, the
    staging's none); once it is kept, the staging is gated from the same state as its rival,
    and kept where it is the faster, instead of being lost."""
    committed = SkillLibrary.load(REPO / "skills_out")
    vector = max(
        (s for s in committed if s.mechanism == "vectorized_access" and s.transferable),
        key=lambda s: s.effect.geomean_speedup or 1.0,
    )
    staging = next(s for s in committed if s.mechanism == "smem_staging" and s.transferable)
    SkillLibrary(tmp_path / "lib", [vector, staging]).save()
    problem = REPO / "heldout" / "sgemm"
    ranked = retrieve([vector, staging], load_problem(problem)).ranked
    assert [r.mechanism for r in ranked] == ["vectorized_access", "smem_staging"]
    gate = StandInGate(builder, cost={"smem_staging": 1.7, "vectorized_access": 1.1})
    report = replay_gated(
        [problem],
        tmp_path / "lib",
        tmp_path / "out",
        gate=gate,
        methods=["skills"],
        budget=ReplayBudget(gate_runs=6),
    )
    [result] = report.results
    outcomes = {(r.action, r.outcome) for r in result.runs}
    assert outcomes == {("vectorized_access", "outranked"), ("smem_staging", "kept")}
    assert [u.skill for u in result.skills_used] == [staging.id]
    lineage = json.loads((tmp_path / "out/lineages/sgemm_f32.skills.json").read_text())
    assert len({e["source"] for e in lineage["edges"]}) == 1  # all gated from the naive state


@pytest.mark.parametrize("race_first", [True, False])
def test_a_rival_that_lost_the_race_past_noise_gets_no_other_carrier(
    builder: Builder, tmp_path: Path, race_first: bool
) -> None:
    """Two vector widths learned on two experts, and staging, their rival, on a naive SIMT
    GEMM. The first width is kept; staging, raced from the same state, measures far faster,
    so the other width refines a lost choice and is not gated. As replays ran before
    the eighth session (`race_before_carriers=False`), it was gated first, ahead of the race."""
    from klineage.gate.log import GateLog
    from klineage.replay.methods import Materializer

    committed = SkillLibrary.load(REPO / "skills_out")
    vector = max(
        (s for s in committed if s.mechanism == "vectorized_access" and "f32" in s.id),
        key=lambda s: s.effect.geomean_speedup or 1.0,
    )
    width = 2 if vector.carrier.get("vector_width") == 4 else 4
    carrier = {**vector.carrier, "vector_width": width}
    other = vector.model_copy(update={"id": f"{vector.id}-w{width}", "carrier": carrier})
    staging = next(s for s in committed if s.mechanism == "smem_staging" and s.transferable)
    problem = load_problem(REPO / "heldout" / "sgemm")
    gate = StandInGate(builder, cost={"smem_staging": 1.7, "vectorized_access": 1.1})
    log = GateLog(tmp_path / "gatelog.jsonl", gate, share=False)
    materializer = Materializer(
        log,
        [vector, other, staging],
        ReplayBudget(gate_runs=6),
        skip_no_ops=False,
        stage_first=False,  # by rank alone: the vectors (a measured gain) before the staging
        race_before_carriers=race_first,
    )
    result, _ = materializer.run(problem, problem.kernel_source(), "skills")
    runs = [(r.action, r.outcome) for r in result.runs]
    vector_runs = [r for r in result.runs if r.action == "vectorized_access"]
    assert ("smem_staging", "kept") in runs
    assert {r.outcome for r in vector_runs} == {"outranked"}
    if race_first:
        assert len(vector_runs) == 1 and runs[1] == ("smem_staging", "kept")
    else:
        assert len(vector_runs) >= 2 and runs[-1] == ("smem_staging", "kept")
        assert width in {r.carrier.get("vector_width") for r in vector_runs}


def test_the_summary_counts_the_moves_the_machine_code_check_left_ungated() -> None:
    """Each refusal for an unchanged machine code is a gate run the check saved; refusals for
    other reasons are not."""
    from klineage.replay.methods import NO_CHANGE, SAME_AS_GATED
    from klineage.replay.results import MethodResult
    from klineage.replay.run import summarize

    def result(method: str, refusals: list[str]) -> MethodResult:
        return MethodResult.model_construct(
            method=method, problem="p", refusals=refusals, speedup=1.0,
            speedup_vs_reference=1.0, runs_to_90=0, runs_to_best=0, wasted=0,
        )  # fmt: skip

    summary = summarize([
        result("skills", [f"skill:a pragma_unroll: {NO_CHANGE}", "skill:b split_k: refused"]),
        result("skills", [f"skill:c restrict_pointers: {NO_CHANGE}"]),
        result("blind", ["blind launch_bounds: refused"]),
        result("blind", [f"blind launch_bounds: {SAME_AS_GATED} (blind launch_bounds)"]),
    ])  # fmt: skip
    assert {s.method: s.no_machine_code_change for s in summary} == {"skills": 2, "blind": 0}
    # a kernel of machine code gated from its state already: counted apart
    assert {s.method: s.same_as_gated for s in summary} == {"skills": 0, "blind": 1}


@pytest.mark.nvcc
def test_an_offline_replay_serves_the_logged_run_and_names_what_the_logs_lack(
    builder: Builder, skills: Path, tmp_path: Path
) -> None:
    """`klineage replay --offline` makes the report of a logged run again, verdicts and
    profiles from the logs, timing nothing; where a verdict is missing it says so and stops."""
    from typer.testing import CliRunner

    from klineage.cli import app
    from klineage.replay.run import replay

    library = relieving_launch_bounds(list(SkillLibrary.load(skills)))
    folder = tmp_path / "skills"
    folder.mkdir()
    (folder / "skills.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in library))
    gate = StandInGate(builder, cost=COSTS, expert_mechanisms=EXPERT, profiles=_launch_bound)
    out = tmp_path / "out"
    online = replay(
        [TARGET], folder, out, gate=gate, methods=["skills", "blind", "profiled"],
        budget=ReplayBudget(gate_runs=4),
    )  # fmt: skip
    command = ["replay", str(TARGET), "--skills", str(folder), "--budget", "4", "--out", str(out)]
    command += ["--baselines", "blind,profiled", "--profile", "--offline"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    offline = load_replay(out / "replay.json")

    def runs(report: ReplayReport) -> list[tuple[str, str, str, float]]:
        return [
            (r.method, run.action, run.outcome, round(run.speedup, 6))
            for r in report.results
            for run in r.runs
        ]

    assert runs(offline) == runs(online) and len(runs(online)) >= 8
    # the last verdict cut from the log: the offline run stops and names the kernel
    log = out / "gatelog" / f"{load_problem(TARGET).name}.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))
    cut = CliRunner().invoke(app, command)
    assert cut.exit_code == 2 and "needs the GPU" in cut.output and "gatelog lack" in cut.output
    fresh = CliRunner().invoke(app, [*command, "--fresh"])
    assert fresh.exit_code == 2 and "--offline serves the logs alone" in fresh.output
