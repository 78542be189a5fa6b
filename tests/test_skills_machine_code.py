"""The committed skills_out/: every skill's step changes the machine code (device SASS or host
launch), and its card shows how."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.gate.noop import same_machine_code
from klineage.lineage import AttemptStatus, LineageGraph
from klineage.skills import Skill, SkillLibrary
from tests.conftest import REPO

SKILLS = REPO / "skills_out"


def _library() -> tuple[SkillLibrary, dict[str, LineageGraph]]:
    library = SkillLibrary.load(SKILLS)
    lineages = {p.stem: LineageGraph.load(p) for p in (SKILLS / "lineages").glob("*.json")}
    return library, lineages


def test_no_committed_skill_runs_the_same_machine_code_on_both_sides() -> None:
    library, lineages = _library()
    assert len(library) > 0
    for skill in library:
        lineage = lineages[skill.evidence.problem]
        optimized = lineage.state(skill.evidence.optimized).code
        simplified = lineage.state(skill.evidence.simplified).code
        assert optimized is not None and simplified is not None, skill.id
        assert not same_machine_code(optimized, simplified), skill.id
        evidence = skill.machine_code
        assert evidence is not None, skill.id
        assert evidence.sass_delta or evidence.host_changed, skill.id
        card = (SKILLS / skill.id / "SKILL.md").read_text()
        assert "## Machine code" in card and "host code (the launch)" in card, skill.id


def test_the_lineages_keep_the_refused_no_ops_with_their_reasons() -> None:
    _, lineages = _library()
    refused = [
        (lineage, attempt)
        for lineage in lineages.values()
        for attempt in lineage.attempts()
        if attempt.status is AttemptStatus.NO_MACHINE_CODE_CHANGE
    ]
    assert refused, "the committed walks refused no removal as a no-op"
    for lineage, attempt in refused:
        assert attempt.no_op is not None and attempt.no_op["reason"] in {
            "never_instantiated",
            "compiler_already_does_it",
        }
        # a walk never continues from a no-op; a lineage mined before the check and
        # re-extracted since (bench/reextract.py) says so, and keeps the walk it recorded
        assert not attempt.chosen or lineage.meta.reextracted


def _smallest(library: SkillLibrary, lineages: dict[str, LineageGraph], n: int) -> list[Skill]:
    def size(skill: Skill) -> int:
        return len(lineages[skill.evidence.problem].state(skill.evidence.optimized).source)

    return sorted(library, key=size)[:n]


@pytest.mark.nvcc
def test_a_rebuild_agrees_that_the_steps_change_machine_code(shared_builder: Builder) -> None:
    library, lineages = _library()
    builder = shared_builder  # an expert state test_experts builds too compiles once
    for skill in _smallest(library, lineages, 2):
        lineage = lineages[skill.evidence.problem]
        sources = [
            lineage.state(fp).source for fp in (skill.evidence.optimized, skill.evidence.simplified)
        ]
        optimized, simplified = builder.build_many(sources)
        assert not same_machine_code(optimized.machine_code, simplified.machine_code), skill.id
