"""`klineage skills` and `klineage lineage` on skills mined with the stand-in gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.gate.build import Builder
from tests.mining.conftest import Mined
from tests.mining.test_mine import PROBLEM, _gate

pytestmark = pytest.mark.nvcc
runner = CliRunner()


@pytest.fixture(scope="module")
def mined_out(mined: Mined) -> Path:
    return mined.out


def test_skills_list_and_show(mined_out: Path) -> None:
    listed = runner.invoke(app, ["skills", "list", "--out", str(mined_out)])
    assert listed.exit_code == 0, listed.output
    assert "fast_math--exp_scale_f32" in listed.output
    shown = runner.invoke(app, ["skills", "show", "fast_math--exp", "--out", str(mined_out)])
    assert shown.exit_code == 0, shown.output
    assert "## When it is valid" in shown.output and "__expf" in shown.output
    missing = runner.invoke(app, ["skills", "show", "nope", "--out", str(mined_out)])
    assert missing.exit_code == 2 and "no skill 'nope'" in missing.output


def test_lineage_show_draws_the_dag(mined_out: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "dag.png"
    shown = runner.invoke(
        app, ["lineage", "show", "exp_scale_f32", "--out", str(mined_out), "--png", str(png)]
    )
    assert shown.exit_code == 0, shown.output
    assert "complete" in shown.output and "fast_math" in shown.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    unknown = runner.invoke(app, ["lineage", "show", "nope", "--out", str(mined_out)])
    assert unknown.exit_code == 2 and "exp_scale_f32" in unknown.output


def test_skills_list_without_skills_says_what_to_do(tmp_path: Path) -> None:
    result = runner.invoke(app, ["skills", "list", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "run `klineage mine` first" in result.output


def test_mine_report_keeps_each_finished_problem_when_a_later_one_fails(
    builder: Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU boundary: the command's gates are the labelled stand-in, built by the real nvcc stage
    import contextlib

    import klineage.gate.pool

    @contextlib.contextmanager
    def stand_in_gates(devices, **options):  # type: ignore[no-untyped-def]
        # mining pairs every timed verdict; without --profile no optional stage is on
        assert options["time_reference"] == "unpaired"
        assert options.get("profile") is None and options.get("energy") is None
        yield [_gate(builder)]

    monkeypatch.setattr(klineage.gate.pool, "open_gates", stand_in_gates)
    broken = tmp_path / "broken"  # a complete folder whose expert does not compile
    broken.mkdir()
    for name in ("definition.json", "workloads.jsonl"):
        (broken / name).write_text((PROBLEM / name).read_text())
    (broken / "kernel.cu").write_text('extern "C" int run() { return nope; }\n')
    report = tmp_path / "report.json"
    args = ["mine", str(PROBLEM), str(broken), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, [*args, "--report", str(report)])
    assert result.exit_code == 2 and "broken" in result.output, result.output
    problems = json.loads(report.read_text())["problems"]
    assert [p["problem"] for p in problems] == ["exp_scale_f32"]
    assert problems[0]["termination"] == "complete"
    # of the fixture's five mechanisms, the compiler already applies two (no machine code
    # change at the state they were tried): three skills
    assert problems[0]["skills"] == 3 and problems[0]["no_machine_code_change"] >= 2


def test_the_drawing_puts_the_main_path_down_the_left(mined_out: Path) -> None:
    from klineage.cli.drawing import _positions
    from klineage.lineage import LineageGraph

    lineage = LineageGraph.load(mined_out / "lineages" / "exp_scale_f32.json")
    positions = _positions(lineage)
    main = [lineage.root, *(a.child for a in lineage.main_path())]
    assert [positions[n] for n in main] == [(0.0, -float(row)) for row in range(len(main))]
    side = [n for n in lineage.graph.nodes if n not in main]
    assert side and all(positions[n][0] >= 1.0 for n in side)
    assert set(positions) == set(lineage.graph.nodes)


def test_mine_with_profile_says_when_the_gate_made_no_profile(
    builder: Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GPU boundary: the labelled stand-in gate, here one that does not profile (as a gate whose
    # ncu is missing): the skills come without counters, and the command says so
    import contextlib

    import klineage.gate.pool

    @contextlib.contextmanager
    def stand_in_gates(devices, **options):  # type: ignore[no-untyped-def]
        assert options.get("profile") is not None
        yield [_gate(builder)]

    monkeypatch.setattr(klineage.gate.pool, "open_gates", stand_in_gates)
    out = tmp_path / "out"
    result = runner.invoke(app, ["mine", str(PROBLEM), "--out", str(out), "--profile"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "--profile: counters on 0 of 3 skills" in said
    assert f"klineage gate {PROBLEM} --profile" in said
