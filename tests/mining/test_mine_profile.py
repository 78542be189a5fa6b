"""Mining with the profile stage on: the states each skill compares are profiled (and kept in
the lineage), and the skill records its counter deltas and the bottleneck it relieved; replay
profiles the states it goes on from. The GPU stages are the stand-in gate's; the profiles are
made of counters recorded on the H200."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.bottleneck import classify, peaks_for
from klineage.gate.build import Builder
from klineage.gate.profile import LaunchProfile, Profile
from klineage.lineage import LineageGraph
from klineage.replay.run import ReplayBudget
from klineage.skills import SkillLibrary
from tests.conftest import FIXTURES
from tests.mining.stand_in_gate import mine_gated, replay_gated
from tests.mining.test_mine import PROBLEM, _gate
from tests.recorded_profiles import gelu_launch, gemm_launch

pytestmark = pytest.mark.nvcc

LARGEST = "exp-scale-1024x1024"


def _profile(launch: LaunchProfile) -> Profile:
    profile = Profile(
        workload_uuid=LARGEST,
        label="rows=1024,cols=1024",
        launches=[launch],
        minimum_bytes=2 * 1024 * 1024 * 4,
    )
    profile.bottleneck = classify(profile, peaks=peaks_for("NVIDIA H200"))
    return profile


def profile_of(present: set[str]) -> Profile:
    """With fast math, the kernel's counters are the gemm's (compute-bound); without it, the
    small gelu's (launch-bound): a step that changes the bottleneck, and steps that do not."""
    return _profile(gemm_launch() if "fast_math" in present else gelu_launch())


def test_mined_skills_record_their_counter_deltas_and_what_they_relieved(
    builder: Builder, tmp_path: Path
) -> None:
    gate = _gate(builder)
    gate.profiles = profile_of
    report = mine_gated(PROBLEM, tmp_path, gate=gate)
    assert report.skills == 5
    # only the states the skills compare were profiled: the main path's six, once each
    assert len(gate.profiled) == len(set(gate.profiled)) == 6 < gate.runs
    lineage = LineageGraph.load(tmp_path / "lineages" / "exp_scale_f32.json")
    root = lineage.state(lineage.root)
    assert root.profile is not None and root.profile.bottleneck is not None
    assert root.profile.bottleneck.kind.value == "compute-bound"  # the expert has fast math
    library = SkillLibrary.load(tmp_path)
    by_mechanism = {s.mechanism: s for s in library}
    fast_math = by_mechanism["fast_math"].profile
    assert fast_math is not None and fast_math.workload == "rows=1024,cols=1024"
    assert fast_math.simplified_bottleneck == "launch-bound"
    assert fast_math.optimized_bottleneck == "compute-bound"
    assert fast_math.relieves == "launch-bound"  # the stand-in measured it 1.2x faster
    figures = {c.figure: c for c in fast_math.changes}
    assert (
        figures["SM throughput (% of peak)"].optimized
        > figures["SM throughput (% of peak)"].simplified
    )
    card = (tmp_path / by_mechanism["fast_math"].id / "SKILL.md").read_text()
    assert "## Counters" in card and "It relieves: **launch-bound**." in card
    # a step whose two states show the same counters changed none of them
    unroll = by_mechanism["pragma_unroll"].profile
    assert unroll is not None and not any(c.notable for c in unroll.changes)

    # replayed with profiles on: each method reports its start's and its best state's class
    target = FIXTURES / "mining" / "exp_target"
    replayed = replay_gated(
        [target], tmp_path, tmp_path / "replay", gate=gate, budget=ReplayBudget(gate_runs=4)
    )
    profiled_before = len(gate.profiled)
    for result in replayed.results:
        assert result.start_bottleneck == "launch-bound"  # no fast math in the naive kernel
        assert result.start_joules == {} and result.best_joules == {}  # energy was not asked
    skills = next(r for r in replayed.results if r.method == "skills")
    assert [u.skill.split("--")[0] for u in skills.skills_used][:1] == ["fast_math"]
    assert skills.best_bottleneck == "compute-bound"
    # the start and the states a method went on from, not every kernel it gated
    runs = sum(len(r.runs) for r in replayed.results)
    assert len(gate.profiled) - profiled_before < runs
