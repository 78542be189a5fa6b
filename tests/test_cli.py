"""The `klineage gate` command on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from tests.conftest import FIXTURES, REPO

runner = CliRunner()


@pytest.fixture(autouse=True)
def run_cache(shared_cache_dir: Path) -> None:
    """Builds go to the run's cache (the softmax expert compiles once for every test)."""


@pytest.mark.nvcc
def test_build_only_shows_resources_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "build.json"
    result = runner.invoke(
        app, ["gate", str(REPO / "expert_kernels" / "softmax"), "--build-only", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "built kernel.cu" in result.output and "registers" in result.output
    data = json.loads(out.read_text())
    assert data["status"] == "OK" and data["report"]["kernels"][0]["registers"] > 0


@pytest.mark.nvcc
def test_build_only_compile_error_exits_1_with_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text('#include <cuda_runtime.h>\nextern "C" int run() {\n  return nope;\n}\n')
    result = runner.invoke(
        app,
        ["gate", str(FIXTURES / "problems" / "scale_rows"), "--kernel", str(bad), "--build-only"],
    )
    assert result.exit_code == 1
    assert "COMPILE_ERROR" in result.output and "bad.cu:3" in result.output


def test_bad_problem_folder_exits_2_with_the_reason(tmp_path: Path) -> None:
    result = runner.invoke(app, ["gate", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "problem folder not found" in result.output


def test_missing_kernel_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["gate", str(FIXTURES / "problems" / "scale_rows")])
    assert result.exit_code == 2
    assert "no kernel.cu" in result.output


def test_no_probes_exits_2(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    for name in ("definition.json", "workloads.jsonl"):
        (folder / name).write_text((FIXTURES / "problems" / "scale_rows" / name).read_text())
    kernel = FIXTURES / "kernels" / "scale_rows" / "correct.cu"
    result = runner.invoke(
        app, ["gate", str(folder), "--kernel", str(kernel), "--workloads", "probes"]
    )
    assert result.exit_code == 2
    assert "no probes workloads" in result.output


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_mine_and_replay_check_their_folders_before_looking_for_a_gpu(
    tmp_path: Path, command: str
) -> None:
    """On a machine without a GPU, a folder being prepared is still checked: the first one
    that is not a problem, or lacks its kernel, is named (not the missing GPU)."""
    extra = ["--skills", str(REPO / "skills_out")] if command == "replay" else []
    empty = tmp_path / "p"
    empty.mkdir()
    (empty / "kernel.cu").write_text("// a kernel copied in before its definition\n")
    result = runner.invoke(app, [command, str(empty), "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2
    assert "definition.json not found" in result.output and "GPU" not in result.output
    folder = FIXTURES / "problems" / "scale_rows"  # a definition and workloads, no kernel
    result = runner.invoke(app, [command, str(folder), "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2
    assert "no kernel.cu" in result.output and "scale_rows" in result.output
