"""The build stage holds the kernel's run(...) against the definition's ABI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.gate.build import Builder, FailureKind
from klineage.gate.gate import Gate
from klineage.gate.result import Status
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from klineage.problem.abi import KernelAbi
from tests.conftest import FIXTURES

STAND_IN = "tests.gate.cpu_stand_in:CpuStandInRunner"
PROBLEM = FIXTURES / "problems" / "scale_rows"
CORRECT = (FIXTURES / "kernels" / "scale_rows" / "correct.cu").read_text()
# the same kernel with `cols` left out of run(...): it compiles and links
NO_COLS = CORRECT.replace("int64_t rows, int64_t cols,", "int64_t rows,").replace(
    "rows * cols", "rows"
)


@pytest.mark.nvcc
def test_a_run_without_cols_is_a_compile_error_before_any_gpu_work(
    shared_builder: Builder,
) -> None:
    problem = load_problem(PROBLEM)
    expected = KernelAbi.from_definition(problem.definition).prototype
    with Gate(shared_builder, worker_runner=STAND_IN) as gate:
        verdict = gate.run(problem, KernelSource(NO_COLS, name="no_cols.cu"))
        plain = gate.builder.build(NO_COLS, name="no_cols.cu")
    assert plain.ok  # nvcc alone is happy: only the definition knows cols is missing
    assert verdict.status is Status.COMPILE_ERROR and not verdict.workloads
    assert verdict.build.failure is FailureKind.SIGNATURE and verdict.build.library is None
    assert "no parameter for cols" in verdict.build.message
    assert verdict.build.message.splitlines()[-1] == f"  expected: {expected}"


@pytest.mark.nvcc
def test_a_run_without_c_linkage_shows_the_line_expected(tmp_path: Path) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm is not installed, so the export check is skipped by design")
    mangled = CORRECT.replace('extern "C" int run', "int run")
    problem = load_problem(PROBLEM)
    build = Gate(Builder(cache_dir=tmp_path), worker_runner=STAND_IN).build(
        KernelSource(mangled), problem
    )
    assert build.failure is FailureKind.MISSING_RUN
    assert "found C++-mangled run(float const*, float, float*, long, long" in build.message
    expected = KernelAbi.from_definition(problem.definition).prototype
    assert build.message.splitlines()[-1] == f"  expected: {expected}"


@pytest.mark.nvcc
@pytest.mark.usefixtures("shared_cache_dir")
def test_build_only_reports_the_mismatch_and_exits_1(tmp_path: Path) -> None:
    kernel = tmp_path / "no_cols.cu"
    kernel.write_text(NO_COLS)
    result = CliRunner().invoke(
        app, ["gate", str(PROBLEM), "--kernel", str(kernel), "--build-only"]
    )
    assert result.exit_code == 1, result.output
    assert "COMPILE_ERROR" in result.output
    assert 'expected: extern "C" int run(const float* x, float alpha, float* y,' in result.output
