"""bench/public_sweep.py: every mechanism over every CUDA file of a folder, crashes caught
and named (on fixtures written here, in the public idioms)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klineage.mechanisms import get
from tests.bench_scripts import load_bench_script
from tests.mechanisms.roundtrip import PUBLIC_FORMS

sweep = load_bench_script("public_sweep")


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "someone+kernels"
    (folder / "src").mkdir(parents=True)
    for name in ("templated_warps.before.cu", "linear_warps.before.cu"):
        shutil.copy(PUBLIC_FORMS / "warp_tiling" / name, folder / "src" / name)
    (folder / "src" / "notes.txt").write_text("not CUDA\n")
    (folder / "dir.cu").mkdir()  # a folder named like a file is skipped
    return folder


def test_a_folder_is_swept_file_by_file_with_paths_relative_to_it(tmp_path: Path) -> None:
    summary = sweep.sweep([_folder(tmp_path)])
    assert summary["files"] == 2 and summary["crashes"] == []
    assert summary["supported_sites"]["warp_tiling"] == 2
    assert summary["first_site_removals"] >= 2
    assert {f["file"] for f in summary["slowest_files"]} == {
        "someone+kernels/src/templated_warps.before.cu",
        "someone+kernels/src/linear_warps.before.cu",
    }


def test_an_exception_other_than_a_refusal_is_a_crash_with_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = get("rasterization")

    def broken(source):  # type: ignore[no-untyped-def]
        raise KeyError("a form nobody expected")

    monkeypatch.setattr(rule, "find_candidates", broken)
    summary = sweep.sweep([_folder(tmp_path)])
    crashes = summary["crashes"]
    assert len(crashes) == 2 and {c["mechanism"] for c in crashes} == {"rasterization"}
    assert crashes[0]["stage"] == "candidates" and "KeyError" in crashes[0]["error"]
    assert crashes[0]["file"].startswith("someone+kernels/src/")
