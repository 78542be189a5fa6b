"""`klineage mechanisms ...`: list, detect, candidates, remove, apply."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES

runner = CliRunner()


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    path = tmp_path / "kernel.cu"
    shutil.copy(FIXTURES / "launch_bounds" / "before.cu", path)
    return path


def test_list_shows_every_mechanism() -> None:
    result = runner.invoke(app, ["mechanisms", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    names = {row["name"] for row in rows}
    assert {"fast_math", "launch_bounds", "pragma_unroll"} <= names
    table = runner.invoke(app, ["mechanisms", "list"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "launch_bounds" in table.output


def test_detect_prints_a_table_of_sites(kernel: Path) -> None:
    result = runner.invoke(
        app, ["mechanisms", "detect", str(kernel), "-m", "launch_bounds"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "3 detected sites in kernel.cu" in result.output
    assert "__launch_bounds__(128, 4)" in result.output and "add_one" in result.output


def test_a_problem_folder_stands_for_its_kernel(kernel: Path, tmp_path: Path) -> None:
    folder = runner.invoke(app, ["mechanisms", "detect", str(kernel.parent), "--json"])
    file = runner.invoke(app, ["mechanisms", "detect", str(kernel), "--json"])
    assert folder.exit_code == 0 and folder.output == file.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["mechanisms", "detect", str(empty)])
    assert result.exit_code == 2 and "folder without kernel.cu" in result.output


def test_detect_and_candidates_as_json(kernel: Path) -> None:
    result = runner.invoke(app, ["mechanisms", "detect", str(kernel), "--json"])
    sites = json.loads(result.output)
    assert {s["mechanism"] for s in sites} >= {"launch_bounds", "restrict_pointers"}
    assert all({"index", "id", "function", "start_line", "snippet"} <= set(s) for s in sites)
    result = runner.invoke(
        app, ["mechanisms", "candidates", str(kernel), "-m", "pragma_unroll", "--json"]
    )
    assert json.loads(result.output) == []  # the fixture's kernels have no loops


def test_remove_prints_a_unified_diff(kernel: Path) -> None:
    before = kernel.read_text()
    result = runner.invoke(
        app, ["mechanisms", "remove", str(kernel), "launch_bounds", "--site", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "--- a/kernel.cu" in result.output and "+++ b/kernel.cu" in result.output
    assert "-__global__ void __launch_bounds__(128, 4) add_one(" in result.output
    assert "+__global__ void add_one(" in result.output
    assert kernel.read_text() == before  # a diff only


def test_remove_by_site_id_and_write_out(kernel: Path, tmp_path: Path) -> None:
    sites = json.loads(
        runner.invoke(
            app, ["mechanisms", "detect", str(kernel), "-m", "launch_bounds", "--json"]
        ).output
    )
    out = tmp_path / "simpler.cu"
    result = runner.invoke(
        app,
        [
            "mechanisms",
            "remove",
            str(kernel),
            "launch_bounds",
            "--site",
            sites[1]["id"],
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "__launch_bounds__(kBlock)" not in out.read_text()
    assert out.read_text().count("__launch_bounds__") == 2


def test_apply_in_place_with_a_carrier(kernel: Path) -> None:
    runner.invoke(
        app, ["mechanisms", "remove", str(kernel), "launch_bounds", "--site", "2", "--in-place"]
    )
    assert "(128, 4)" not in kernel.read_text()
    result = runner.invoke(
        app,
        [
            "mechanisms",
            "apply",
            str(kernel),
            "launch_bounds",
            "--carrier",
            "min_blocks=3",
            "--in-place",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "__global__ void __launch_bounds__(128, 3) add_one(" in kernel.read_text()
    assert "condition: the block size must be at most 128" in result.output


def test_refusals_exit_1_with_the_reason(kernel: Path) -> None:
    runner.invoke(
        app, ["mechanisms", "remove", str(kernel), "launch_bounds", "--site", "2", "--in-place"]
    )
    result = runner.invoke(
        app, ["mechanisms", "apply", str(kernel), "launch_bounds", "--carrier", "block_size=64"]
    )
    assert result.exit_code == 1
    assert "block_size=64 is below the 128 threads add_one is launched with" in result.output
    typo = runner.invoke(
        app, ["mechanisms", "apply", str(kernel), "launch_bounds", "--carrier", "unroll=2"]
    )
    assert typo.exit_code == 2  # a key the mechanism does not have is bad input, not a refusal
    assert "unknown key(s) unroll" in typo.output


def test_bad_input_exits_2(kernel: Path, tmp_path: Path) -> None:
    unknown = runner.invoke(app, ["mechanisms", "remove", str(kernel), "fastmath"])
    assert unknown.exit_code == 2 and "did you mean 'fast_math'" in unknown.output
    missing = runner.invoke(app, ["mechanisms", "detect", str(tmp_path / "none.cu")])
    assert missing.exit_code == 2 and "no such kernel file" in missing.output
    site = runner.invoke(app, ["mechanisms", "remove", str(kernel), "launch_bounds", "--site", "9"])
    assert site.exit_code == 2 and "has 3 detected sites (0-2)" in site.output
    carrier = runner.invoke(
        app, ["mechanisms", "apply", str(kernel), "fast_math", "--carrier", "x"]
    )
    assert carrier.exit_code == 2 and "key=value" in carrier.output
    both = runner.invoke(
        app,
        [
            "mechanisms",
            "remove",
            str(kernel),
            "launch_bounds",
            "--out",
            str(tmp_path / "o.cu"),
            "--in-place",
        ],
    )
    assert both.exit_code == 2


def test_remove_without_the_mechanism_exits_1_and_writes_nothing(
    kernel: Path, tmp_path: Path
) -> None:
    out = tmp_path / "o.cu"
    result = runner.invoke(
        app, ["mechanisms", "remove", str(kernel), "fast_math", "--out", str(out)]
    )
    assert result.exit_code == 1  # like a refusal: nothing was removed
    assert "nothing to remove" in result.output and "---" not in result.output
    assert not out.exists()


def test_an_unknown_carrier_key_is_bad_input(kernel: Path) -> None:
    result = runner.invoke(
        app, ["mechanisms", "apply", str(kernel), "pragma_unroll", "--carrier", "unrol=4"]
    )
    assert result.exit_code == 2
    assert "unknown key(s) unrol; pragma_unroll accepts: unroll" in result.output


def test_apply_names_the_default_carrier_plainly(tmp_path: Path) -> None:
    out = tmp_path / "row_sum.cu"
    naive = REPO / "heldout" / "row_sum" / "kernel.cu"
    result = runner.invoke(
        app, ["mechanisms", "apply", str(naive), "block_per_row", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "with the rule's default carrier" in result.output and "(defaults)" not in result.output
    # the launch now takes one block per row: the old grid size is not left behind unused
    assert "blocks" in naive.read_text() and "blocks" not in out.read_text()
