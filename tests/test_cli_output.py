"""What the read-only commands print: cards byte for byte, identifiers never cut at 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import klineage.cli.main
import klineage.cli.mechanisms
import klineage.cli.mine
from klineage.cli import app
from klineage.cli.tables import short_kernel_names
from klineage.mechanisms import all_mechanisms
from klineage.skills import SkillLibrary
from tests.conftest import REPO

runner = CliRunner()
SKILLS = REPO / "skills_out"


@pytest.fixture
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' consoles as a plain 80-column terminal would size them."""
    for module in (klineage.cli.main, klineage.cli.mine, klineage.cli.mechanisms):
        monkeypatch.setattr(module, "console", Console(width=80))


def test_skills_show_into_a_file_is_the_card_unchanged(tmp_path: Path) -> None:
    skill_id = "cp_async_pipeline--gemm_bf16_nt--1a8d67e8"
    card = (SKILLS / skill_id / "SKILL.md").read_text(encoding="utf-8")
    assert max(len(line) for line in card.splitlines()) > 80  # long lines survive as they are
    for extra in ([], ["--raw"]):
        shown = runner.invoke(app, ["skills", "show", skill_id, "--out", str(SKILLS), *extra])
        assert shown.exit_code == 0, shown.output
        assert shown.output == card


def test_an_ambiguous_prefix_lists_every_match() -> None:
    shown = runner.invoke(app, ["skills", "show", "vectorized", "--out", str(SKILLS)])
    assert shown.exit_code == 2
    matching = [s.id for s in SkillLibrary.load(SKILLS) if s.id.startswith("vectorized")]
    assert "ambiguous" in shown.output and len(matching) > 1
    assert all(f"  {skill_id}\n" in shown.output for skill_id in matching)


def _lines(output: str) -> list[str]:
    return output.splitlines()


@pytest.mark.usefixtures("eighty_columns")
def test_skills_list_keeps_ids_gain_and_verified_at_80_columns() -> None:
    listed = runner.invoke(app, ["skills", "list", "--out", str(SKILLS)])
    assert listed.exit_code == 0, listed.output
    lines = _lines(listed.output)
    assert max(len(line) for line in lines) <= 80
    for skill in SkillLibrary.load(SKILLS):
        assert skill.id in lines, skill.id  # whole, on a line of its own
    assert "gain: 0.93x, measured: slower, verified: no" in listed.output


@pytest.mark.usefixtures("eighty_columns")
def test_mechanism_names_are_never_cut_at_80_columns() -> None:
    listed = runner.invoke(app, ["mechanisms", "list"])
    assert listed.exit_code == 0, listed.output
    lines = _lines(listed.output)
    assert max(len(line) for line in lines) <= 80 and len(lines) < 200
    assert all(m.name in lines for m in all_mechanisms())
    kernel = REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu"
    detected = runner.invoke(app, ["mechanisms", "detect", str(kernel)])
    assert detected.exit_code == 0, detected.output
    title, *rest = _lines(detected.output)
    assert title.endswith("detected sites in kernel.cu")
    firsts = [line.split() for line in rest if not line.startswith(" ")]
    names = {words[1] for words in firsts if len(words) >= 2 and words[0].isdigit()}
    assert {"register_fragment_streaming", "launch_size_dispatch", "cp_async_pipeline"} <= names
    assert names <= {m.name for m in all_mechanisms()}


def test_kernel_names_are_shortened_but_kept_apart() -> None:
    names = [
        "void (anonymous namespace)::softmax_block_rows<1024, 8>(float const*, float*, long)",
        "void (anonymous namespace)::softmax_block_rows<1024, 4>(float const*, float*, long)",
        "void <unnamed>::f(int)",
        "void g(float*)",
        "void g(int*)",
    ]
    assert short_kernel_names(names) == [
        "softmax_block_rows<1024, 8>",
        "softmax_block_rows<1024, 4>",
        "f",
        "void g(float*)",
        "void g(int*)",
    ]


@pytest.mark.nvcc
@pytest.mark.usefixtures("eighty_columns")
@pytest.mark.usefixtures("shared_cache_dir")
def test_the_build_table_shows_each_kernel_whole() -> None:
    built = runner.invoke(app, ["gate", str(REPO / "expert_kernels" / "softmax"), "--build-only"])
    assert built.exit_code == 0, built.output
    for name in ("softmax_block_rows<1024, 8>", "softmax_block_rows<256, 4>"):
        assert f" {name} " in built.output
    assert max(len(line) for line in _lines(built.output)) <= 80


@pytest.mark.usefixtures("eighty_columns")
def test_lineage_show_takes_the_folder_or_the_name() -> None:
    by_name = runner.invoke(app, ["lineage", "show", "softmax_rows_f32", "--out", str(SKILLS)])
    folder = str(REPO / "expert_kernels" / "softmax")
    by_folder = runner.invoke(app, ["lineage", "show", folder, "--out", str(SKILLS)])
    assert by_name.exit_code == by_folder.exit_code == 0, by_folder.output
    assert by_name.output == by_folder.output and "online_softmax" in by_name.output


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_mine_and_replay_without_a_gpu_stop_at_once(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import klineage.gate.pool

    monkeypatch.setattr(klineage.gate.pool, "visible_gpus", lambda: 0)  # as on this CPU machine
    folder = "expert_kernels/softmax" if command == "mine" else "heldout/gelu"
    out = tmp_path / "out"
    extra = ["--skills", str(SKILLS)] if command == "replay" else []
    result = runner.invoke(app, [command, str(REPO / folder), "--out", str(out), *extra])
    assert result.exit_code == 2
    assert "no CUDA GPU is visible" in result.output and "klineage gate" in result.output
    assert "mining softmax" not in result.output  # no empty live panel
    assert not out.exists()  # no gatelog/ left behind


def _one_line_error(output: str) -> str:
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


def test_a_corrupt_skills_file_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "skills.jsonl").write_text('{"id": "x"}\n')
    for command in (["skills", "list"], ["skills", "show", "x"]):
        result = runner.invoke(app, [*command, "--out", str(tmp_path)])
        assert result.exit_code == 2
        assert _one_line_error(result.output).startswith(f"{tmp_path / 'skills.jsonl'}:1: ")


def test_a_corrupt_lineage_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "lineages").mkdir()
    (tmp_path / "lineages" / "p.json").write_text('{"nodes": [')
    result = runner.invoke(app, ["lineage", "show", "p", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "p.json: not a lineage" in _one_line_error(result.output)


def test_png_without_matplotlib_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    png = tmp_path / "dag.png"
    args = ["lineage", "show", "softmax_rows_f32", "--out", str(SKILLS), "--png", str(png)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and not png.exists()
    assert result.output.splitlines()[-1] == (
        "drawing needs matplotlib: pip install 'klineage[viz]'"
    )
    assert "Traceback" not in result.output


def test_version_and_help_read_well_at_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("klineage ")
    for command in (["mine"], ["replay"], ["gate"], ["skills", "list"], ["mechanisms", "apply"]):
        shown = runner.invoke(app, [*command, "--help"])
        assert shown.exit_code == 0, shown.output
        assert "<bool>" not in shown.output and "…" not in shown.output
        assert max(len(line) for line in shown.output.splitlines()) <= 80
    listed = runner.invoke(app, ["skills", "list", "--help"]).output
    assert "mechanism" not in listed  # it promised a column the table does not have
    llm = runner.invoke(app, ["mine", "--help"]).output
    assert "openai-compatible:MODEL@http://HOST:PORT/v1" in llm
    # a paragraph is re-wrapped, not broken where the docstring's line ended
    assert "gated like\n  the catalog's" in llm or "gated like the catalog's" in llm
