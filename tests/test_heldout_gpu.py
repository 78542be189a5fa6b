"""Every held-out naive kernel passes its gate on all its workloads (GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO

HELDOUT = sorted(p for p in (REPO / "heldout").iterdir() if (p / "definition.json").is_file())

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory):
    from klineage.gate.gate import Gate

    with Gate(Builder(cache_dir=tmp_path_factory.mktemp("cache"))) as judge:
        yield judge


@pytest.mark.parametrize("folder", HELDOUT, ids=lambda p: p.name)
def test_naive_kernel_passes_its_gate(gate, folder: Path) -> None:
    problem = load_problem(folder)
    verdict = gate.run(problem, KernelSource.from_file(problem.kernel_path), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


@pytest.mark.parametrize("name", ["column_sum", "row_sum", "mean_pool", "gemv"])
def test_split_sums_pass_their_gate(gate, name: str) -> None:
    """split_k's forward form on the naive thread-per-output sums: partials added with
    atomics into the zeroed output (column_sum, row_sum) or into a float workspace that a
    second kernel stores (mean_pool, gemv), on every workload."""
    from klineage.mechanisms import get

    problem = load_problem(REPO / "heldout" / name)
    naive = KernelSource.from_file(problem.kernel_path)
    split_k = get("split_k")
    (candidate,) = [c for c in split_k.candidates(naive) if c.detail.get("form") == "loop"]
    split = split_k.apply(naive, candidate)
    verdict = gate.run(problem, split, time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


def test_the_warp_scan_of_cumsum_passes_its_gate(gate) -> None:
    """warp_shuffle_scan's forward form on the naive row scan: a warp per row, 32 elements a
    turn, on every workload (one row of 32,000 to 16,384 rows of 2,048)."""
    from klineage.mechanisms import get

    problem = load_problem(REPO / "heldout" / "cumsum_rows")
    naive = KernelSource.from_file(problem.kernel_path)
    scan = get("warp_shuffle_scan")
    (candidate,) = [c for c in scan.candidates(naive) if c.detail.get("form") == "rows"]
    verdict = gate.run(problem, scan.apply(naive, candidate), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


def test_the_staged_transpose_passes_its_gate(gate) -> None:
    """smem_staging's forward form on the naive transpose: 32 x 32 tiles through a padded
    shared tile, a 2-D grid of 32 x 8 blocks, on every workload."""
    from klineage.mechanisms import get

    problem = load_problem(REPO / "heldout" / "transpose_2d")
    naive = KernelSource.from_file(problem.kernel_path)
    staging = get("smem_staging")
    (candidate,) = [c for c in staging.candidates(naive) if c.detail.get("form") == "transpose"]
    verdict = gate.run(problem, staging.apply(naive, candidate), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]
