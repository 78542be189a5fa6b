"""`klineage import` / `export` / `python -m klineage` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from klineage.cli import app
from tests.conftest import FIXTURES, REPO

PROBLEM = FIXTURES / "problems" / "scale_rows"
KERNEL = FIXTURES / "kernels" / "scale_rows" / "correct.cu"


def test_export_then_import_gives_the_same_kernel(tmp_path: Path) -> None:
    runner = CliRunner()
    solution = tmp_path / "out" / "scale.json"
    exported = runner.invoke(
        app, ["export", str(PROBLEM), "--kernel", str(KERNEL), "--out", str(solution)]
    )
    assert exported.exit_code == 0, exported.output
    assert json.loads(solution.read_text())["spec"]["binding"] == "torch"
    folder = tmp_path / "back"
    missing = runner.invoke(
        app,
        [
            "import",
            str(solution),
            "--definition",
            str(PROBLEM / "definition.json"),
            "--out",
            str(folder),
        ],
    )
    assert missing.exit_code == 2 and "--workloads" in missing.output
    assert not folder.exists()  # nothing half-written
    imported = runner.invoke(
        app,
        [
            "import",
            str(solution),
            "--definition",
            str(PROBLEM / "definition.json"),
            "--workloads",
            str(PROBLEM / "workloads.jsonl"),
            "--out",
            str(folder),
        ],
    )
    assert imported.exit_code == 0, imported.output
    assert (folder / "kernel.cu").read_text() == KERNEL.read_text()


def test_import_kernelbench_prints_what_it_chose(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "import",
            "kernelbench",
            str(FIXTURES / "kernelbench" / "linear_scale.py"),
            "--out",
            str(tmp_path / "p"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "const: they size the weights" in result.output
    assert (tmp_path / "p" / "definition.json").is_file()


def test_python_dash_m_is_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "klineage", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0 and "import" in result.stdout and "export" in result.stdout
