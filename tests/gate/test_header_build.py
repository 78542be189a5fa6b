"""A kernel that includes a header kept next to it in its problem folder builds (nvcc compiles
a copy of the source in a temporary folder, so the folder is passed as an include folder),
and a header edited on disk is another build and another verdict, never a cached one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klineage.gate.build import Builder, BuildStatus
from klineage.gate.log import problem_fingerprint
from klineage.problem import load_problem
from tests.conftest import REPO

pytestmark = pytest.mark.nvcc

SOFTMAX = REPO / "expert_kernels" / "softmax"
HEADER_USE = '#include "tile.h"\nstatic_assert(TILE_FROM_HEADER == 32, "read from tile.h");\n'


def _problem_with_header(folder: Path) -> Path:
    folder.mkdir()
    for name in ("definition.json", "workloads.jsonl"):
        shutil.copy(SOFTMAX / name, folder / name)
    (folder / "kernel.cu").write_text(HEADER_USE + (SOFTMAX / "kernel.cu").read_text())
    (folder / "tile.h").write_text("#pragma once\n#define TILE_FROM_HEADER 32\n")
    return folder


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    return Builder(cache_dir=tmp_path_factory.mktemp("header-cache"), device_only=True)


def test_the_problem_folder_is_an_include_folder_of_the_build(
    tmp_path: Path, builder: Builder
) -> None:
    problem = load_problem(_problem_with_header(tmp_path / "with_header"))
    source = problem.kernel_source().text
    alone = builder.with_options(problem.compile_options).build(source)
    assert alone.status is BuildStatus.COMPILE_ERROR and "tile.h" in alone.message
    assert problem.build_options.cuda_cflags == (f"-I{problem.root.resolve()}",)
    built = builder.with_options(problem.build_options).build(source)
    assert built.ok, built.message


def test_a_header_edited_on_disk_is_another_build_and_another_verdict_key(
    tmp_path: Path, builder: Builder
) -> None:
    folder = _problem_with_header(tmp_path / "edited")
    problem = load_problem(folder)
    source = problem.kernel_source().text
    options = builder.with_options(problem.build_options)
    key, judged_on = options.key(source), problem_fingerprint(problem, problem.workloads)
    assert options.build(source).ok
    (folder / "tile.h").write_text("#pragma once\n#define TILE_FROM_HEADER 64\n")
    assert options.key(source) != key
    assert problem_fingerprint(problem, problem.workloads) != judged_on
    rebuilt = options.build(source)
    assert not rebuilt.cached and rebuilt.status is BuildStatus.COMPILE_ERROR
    assert "read from tile.h" in rebuilt.message


def test_a_kernel_without_local_headers_keeps_its_options_and_keys() -> None:
    problem = load_problem(SOFTMAX)
    assert problem.build_options == problem.compile_options
    assert problem.headers() == ()
