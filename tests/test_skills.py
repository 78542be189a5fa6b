"""Skill libraries on disk: skills.jsonl and one SKILL.md per skill, replaced per problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.skills import Skill, SkillLibrary, render_skill_md
from tests.conftest import REPO

COMMITTED = REPO / "skills_out"


@pytest.fixture(scope="module")
def committed() -> list[Skill]:
    return list(SkillLibrary.load(COMMITTED))


def _by_problem(skills: list[Skill], problem: str) -> list[Skill]:
    return [s for s in skills if s.evidence.problem == problem]


def test_a_saved_library_loads_back_the_same(committed: list[Skill], tmp_path: Path) -> None:
    SkillLibrary(tmp_path, committed).save()
    loaded = list(SkillLibrary.load(tmp_path))
    assert loaded == committed
    ids = [json.loads(line)["id"] for line in (tmp_path / "skills.jsonl").read_text().splitlines()]
    assert ids == sorted(ids)  # written in id order, so a diff shows what changed
    first = committed[0]
    assert (tmp_path / first.id / "SKILL.md").read_text() == render_skill_md(first)


def test_updating_a_problem_keeps_the_others_and_drops_its_stale_cards(
    committed: list[Skill], tmp_path: Path
) -> None:
    SkillLibrary(tmp_path, committed).save()
    topk = _by_problem(committed, "topk_f32")
    kept, dropped = topk[:2], topk[2:]
    library = SkillLibrary.update_problem(tmp_path, "topk_f32", kept)
    assert _by_problem(list(library), "topk_f32") == kept
    assert len(library) == len(committed) - len(dropped)
    assert not any((tmp_path / s.id).exists() for s in dropped)
    assert all((tmp_path / s.id / "SKILL.md").is_file() for s in kept)


def test_a_folder_mining_is_about_to_fill_may_be_empty(tmp_path: Path) -> None:
    assert len(SkillLibrary.load(tmp_path / "new", missing_ok=True)) == 0
    with pytest.raises(FileNotFoundError, match="no such folder"):
        SkillLibrary.load(tmp_path / "new")


def test_a_line_that_is_not_a_skill_names_the_file_and_line(
    committed: list[Skill], tmp_path: Path
) -> None:
    lines = [committed[0].model_dump_json(), '{"id": "half a skill"}']
    (tmp_path / "skills.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"skills.jsonl:2: not a skill"):
        SkillLibrary.load(tmp_path)
