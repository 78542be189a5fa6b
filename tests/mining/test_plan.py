"""Planning a mining walk on the CPU (``plan_walk``, ``klineage mechanisms walk``): removals in
mining's order, each state built, the sites that stay with their rules' reasons."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all
from klineage.mining.plan import NOT_TAKEN, PlannedStep, plan_walk
from tests.conftest import FIXTURES

PUBLIC_FORMS = FIXTURES / "public_forms"
ROW_CACHE = PUBLIC_FORMS / "smem_staging" / "row_cache.before.cu"
# the same expert launched with its block in a variable: the row cache's forward rule sizes
# the slices from a `dim3(x, y)` in the launch, so it refuses this one (evidence only)
NAMED_BLOCK = ROW_CACHE.read_text().replace(
    "  center_rows_cached<<<blocks, dim3(32, kRowsPerBlock), slices",
    "  const dim3 block(32, kRowsPerBlock);\n  center_rows_cached<<<blocks, block, slices",
)
runner = CliRunner()


def test_a_plan_takes_the_cache_before_the_warp_rows_and_builds_each_state() -> None:
    built: list[str] = []
    told: list[PlannedStep] = []

    def build(state: KernelSource) -> str:
        built.append(state.text)
        return "OK"

    plan, last = plan_walk(KernelSource.from_file(ROW_CACHE), build, on_step=told.append)
    # warp_per_row is refused while the row cache indexes shared memory by threadIdx.y
    assert plan.removed.index("smem_staging") < plan.removed.index("warp_per_row")
    assert told == plan.steps and len(built) == len(plan.steps)
    assert built[-1] == last.text and all(step.build == "OK" for step in plan.steps)
    assert all(step.lines for step in plan.steps)
    assert [s for s in detect_all(last) if s.supported] == []


def test_each_step_says_what_its_forward_rule_does_there() -> None:
    plan, _ = plan_walk(KernelSource.from_file(ROW_CACHE))
    steps = {step.mechanism: step for step in plan.steps}
    # the vectors come back byte for byte; the row cache's forward rule writes its own names
    assert steps["vectorized_access"].transferable and steps["vectorized_access"].exact
    assert steps["smem_staging"].transferable and not steps["smem_staging"].exact
    named, _ = plan_walk(KernelSource(NAMED_BLOCK))
    cache = next(step for step in named.steps if step.mechanism == "smem_staging")
    assert not cache.transferable
    assert "not written dim3(x, y)" in str(cache.forward_refusal)
    # the exchange loop turns back into shuffles, though not the expert's own text
    assert steps["warp_shuffle_reduction"].transferable
    assert not steps["warp_shuffle_reduction"].exact


def test_the_sites_that_stay_carry_their_rules_reasons() -> None:
    kernel = KernelSource.from_file(PUBLIC_FORMS / "grid_stride_loop" / "row_turns.before.cu")
    plan, _ = plan_walk(kernel, max_steps=1)
    assert len(plan.steps) == 1 and plan.steps[0].build is None
    assert plan.staying, "one step leaves the other removals' sites"
    assert all(site.refusal and site.line >= 1 for site in plan.staying)
    assert {s.refusal for s in plan.staying if s.refusal == NOT_TAKEN}, "removable ones left"


def test_the_cli_prints_the_plan_as_json(tmp_path: Path) -> None:
    kernel = tmp_path / "kernel.cu"
    shutil.copy(ROW_CACHE, kernel)
    result = runner.invoke(app, ["mechanisms", "walk", str(kernel), "--no-build", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    removed = [step["mechanism"] for step in plan["steps"]]
    assert removed.index("smem_staging") < removed.index("warp_per_row")
    assert all(step["build"] is None for step in plan["steps"])


@pytest.mark.nvcc
def test_the_cli_builds_a_problem_folders_states_under_its_options(tmp_path: Path) -> None:
    folder = tmp_path / "center_rows"
    shutil.copytree(PUBLIC_FORMS / "problems" / "center_rows", folder)
    shutil.copy(PUBLIC_FORMS / "grid_stride_loop" / "rows_by_z.before.cu", folder / "kernel.cu")
    result = runner.invoke(app, ["mechanisms", "walk", str(folder)])
    assert result.exit_code == 0, result.output
    assert "removed grid_stride_loop" in result.stderr
    assert "0 states that do not compile" in " ".join(result.stdout.split())
    broken = folder / "kernel.cu"
    broken.write_text(broken.read_text().replace("(int)cols);", "(int)cols)"))
    result = runner.invoke(app, ["mechanisms", "walk", str(folder), "--json"])
    steps = json.loads(result.stdout)["steps"]
    assert steps and all(step["build"] != "OK" for step in steps)


def test_the_cli_summarizes_a_folder_of_cuda_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "rows.cuh").write_text(NAMED_BLOCK)
    shutil.copy(PUBLIC_FORMS / "grid_stride_loop" / "named_stride.before.cu", repo / "a.cu")
    (repo / "notes.txt").write_text("not CUDA")
    result = runner.invoke(app, ["mechanisms", "walk", str(repo), "--json"])
    assert result.exit_code == 0, result.output
    plans = {plan["kernel"]: plan for plan in json.loads(result.stdout)}
    assert set(plans) == {"a.cu", "src/rows.cuh"}
    assert [s["mechanism"] for s in plans["a.cu"]["steps"]] == ["grid_stride_loop"]
    result = runner.invoke(app, ["mechanisms", "walk", str(repo)])
    assert "2 of 2 files have a step a walk can take" in " ".join(result.stdout.split())
    assert "smem_staging (evidence only)" in result.stdout


def test_the_cli_says_when_a_folder_holds_no_cuda(tmp_path: Path) -> None:
    result = runner.invoke(app, ["mechanisms", "walk", str(tmp_path)])
    assert result.exit_code == 2
    assert "no .cu or .cuh file under it" in result.stderr


def test_the_cli_plans_without_builds_where_nvcc_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import klineage.gate.build as build

    def missing(_: str) -> tuple[str, str]:
        raise build.BuildToolError("nvcc not found on PATH")

    monkeypatch.setattr(build, "_probe_nvcc", missing)
    kernel = tmp_path / "kernel.cu"
    shutil.copy(ROW_CACHE, kernel)
    result = runner.invoke(app, ["mechanisms", "walk", str(kernel), "--json"])
    assert result.exit_code == 0, result.output
    assert "states not built (nvcc not found on PATH)" in " ".join(result.stderr.split())
    assert all(step["build"] is None for step in json.loads(result.stdout)["steps"])
