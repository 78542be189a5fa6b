"""bench/public_walks.py: every CUDA file of a folder walked, summarized per repository and
per mechanism, with the steps no forward rule takes again (on fixtures written here, in the
public idioms)."""

from __future__ import annotations

import shutil
from pathlib import Path

from klineage.kernel import KernelSource
from klineage.mining.plan import plan_walk
from tests.bench_scripts import load_bench_script
from tests.mechanisms.roundtrip import PUBLIC_FORMS

walks = load_bench_script("public_walks")

FILES = {
    "someone+kernels": [
        "vectorized_access/address_macros",
        "grid_stride_loop/dim3_grid",
        "thread_coarsening/chunk_partials",
    ],
    "another+repo": ["smem_staging/transpose_once"],
}


def _folders(tmp_path: Path) -> list[Path]:
    folders = []
    for repository, fixtures in FILES.items():
        folder = tmp_path / repository
        (folder / "src").mkdir(parents=True)
        for fixture in fixtures:
            name = fixture.replace("/", "_") + ".cuh"
            shutil.copy(PUBLIC_FORMS / f"{fixture}.before.cu", folder / "src" / name)
        (folder / "README.md").write_text("not CUDA\n")
        folders.append(folder)
    return folders


def test_every_file_is_walked_and_summarized_per_repository(tmp_path: Path) -> None:
    found = walks.walk_folders(_folders(tmp_path), jobs=1)
    plans = {
        fixture: plan_walk(KernelSource.from_file(PUBLIC_FORMS / f"{fixture}.before.cu"))[0]
        for fixtures in FILES.values()
        for fixture in fixtures
    }
    for repository, fixtures in FILES.items():
        summary = found["repositories"][repository]
        steps = [s for f in fixtures for s in plans[f].steps]
        assert summary["files"] == len(fixtures)
        assert summary["steps"] == len(steps) > 0
        assert summary["steps_with_a_forward_rule"] == sum(s.transferable for s in steps)
        assert summary["sites_that_stay"] == sum(len(plans[f].staying) for f in fixtures)
    assert found["total"]["files"] == 4
    assert found["steps_by_mechanism"]["vectorized_access"]["with_a_forward_rule"] >= 1


def test_a_step_without_a_forward_rule_is_listed_with_its_file_and_refusal(
    tmp_path: Path,
) -> None:
    found = walks.walk_folders(_folders(tmp_path), jobs=2)
    (missing,) = found["steps_without_a_forward_rule"]
    assert missing["file"] == "someone+kernels/src/thread_coarsening_chunk_partials.cuh"
    assert missing["mechanism"] == "thread_coarsening"
    assert "no candidate site" in missing["refusal"]
    # a dim3 launch's grid-stride loop walks forward (its capped grid over dimBlock.x)
    grid = found["steps_by_mechanism"]["grid_stride_loop"]
    assert grid["steps"] == 1 and grid["with_a_forward_rule"] == 1
