"""Skills from several folders: the committed skills split in two, read back, and the folder of
each used skill shown in a replay report (the kept H200 report, re-labelled). No GPU, no nvcc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from klineage.cli import app
from klineage.cli.replay import print_report
from klineage.replay.run import ReplayReport
from klineage.replay.sources import SkillSources
from tests.conftest import REPO

COMMITTED = REPO / "skills_out"
KEPT_REPORT = REPO / "bench" / "results" / "replay.json"


def _lines() -> list[str]:
    text = (COMMITTED / "skills.jsonl").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def _folder(root: Path, name: str, lines: list[str]) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "skills.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_two_folders_give_every_skill_with_the_folder_it_came_from(tmp_path: Path) -> None:
    lines = _lines()
    ours = _folder(tmp_path, "ours", lines[:20])
    theirs = _folder(tmp_path, "theirs", lines[20:])
    sources = SkillSources.load([ours, theirs])
    assert len(sources) == len(lines)
    first_ids = {json.loads(line)["id"] for line in lines[:20]}
    for skill in sources.skills:
        expected = ours if skill.id in first_ids else theirs
        assert sources.folder_of[skill.id] == str(expected)
    assert sources.folders == [str(ours), str(theirs)]


def test_one_folder_reads_as_before() -> None:
    sources = SkillSources.load(COMMITTED)
    assert len(sources) == len(_lines())
    assert set(sources.folder_of.values()) == {str(COMMITTED)}


def test_the_same_skill_in_two_folders_is_read_once_from_the_first(tmp_path: Path) -> None:
    lines = _lines()
    ours = _folder(tmp_path, "ours", lines[:10])
    copy = _folder(tmp_path, "copy", lines[5:15])
    sources = SkillSources.load([ours, copy])
    assert len(sources) == 15
    shared = json.loads(lines[7])["id"]
    assert sources.folder_of[shared] == str(ours)


def test_two_different_skills_under_one_id_are_refused_naming_both(tmp_path: Path) -> None:
    lines = _lines()
    changed = json.loads(lines[0])
    changed["intent"] = "the same id, another skill"
    ours = _folder(tmp_path, "ours", lines[:3])
    theirs = _folder(tmp_path, "theirs", [json.dumps(changed)])
    with pytest.raises(ValueError, match="different contents") as raised:
        SkillSources.load([ours, theirs])
    assert str(ours) in str(raised.value) and str(theirs) in str(raised.value)


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        SkillSources.load([COMMITTED, tmp_path / "nowhere"])
    with pytest.raises(ValueError, match="no skills folder"):
        SkillSources.load([])


def test_the_replay_command_takes_several_folders_and_names_a_missing_one(
    tmp_path: Path,
) -> None:
    # the folders are read before any gate opens, so this needs no GPU
    result = CliRunner().invoke(
        app,
        [
            "replay",
            str(REPO / "heldout" / "gelu"),
            "--skills",
            str(COMMITTED),
            "--skills",
            str(tmp_path / "nowhere"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2
    assert "nowhere" in result.output and "no such folder" in result.output


def test_an_older_report_names_its_one_folder_as_a_list(tmp_path: Path) -> None:
    # the kept report written back as reports were before several folders: one folder named
    # by a string, no folder on each used skill
    data = json.loads(KEPT_REPORT.read_text(encoding="utf-8"))
    data["skills"] = "skills_out"
    for result in data["results"]:
        for use in result["skills_used"]:
            del use["folder"]
    assert any(result["skills_used"] for result in data["results"])
    older = tmp_path / "replay.json"
    older.write_text(json.dumps(data), encoding="utf-8")
    report = ReplayReport.load(older)
    assert report.skills == ["skills_out"]
    assert all(u.folder == "" for r in report.results for u in r.skills_used)


def test_the_printed_report_names_each_used_skill_s_folder_when_there_are_several() -> None:
    report = ReplayReport.load(KEPT_REPORT)
    report.skills = ["skills_out", "public_skills"]
    used = next(r for r in report.results if r.method == "skills" and r.skills_used)
    used.skills_used[0].folder = "public_skills"
    console = Console(width=400, record=True)
    print_report(report, console)
    text = console.export_text()
    assert f"({used.skills_used[0].source} in public_skills" in text
    saved = ReplayReport.model_validate_json(report.model_dump_json())
    assert saved.skills == ["skills_out", "public_skills"]
    assert saved.results == report.results
