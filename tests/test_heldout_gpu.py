"""Every held-out naive kernel passes its gate on all its workloads (GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO
from tests.mechanisms.test_vectorized_access import SPLITTING

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


# Forward forms written for naive held-out kernels, each applied at its one candidate site:
# split_k's partial sums (atomics into the zeroed output for column_sum and row_sum, a float
# workspace a second kernel stores for mean_pool and gemv), warp_shuffle_scan's warp per row
# (32 elements a turn, one row of 32,000 to 16,384 rows of 2,048), block_per_row's block scan
# (256 elements a turn) and smem_staging's tiled transposes (32 x 32 padded tiles on a 2-D grid
# of 32 x 8 blocks).
FORWARD_FORMS = [
    ("column_sum", "split_k", "loop"),
    ("row_sum", "split_k", "loop"),
    ("mean_pool", "split_k", "loop"),
    ("gemv", "split_k", "loop"),
    ("cumsum_rows", "warp_shuffle_scan", "rows"),
    ("cumsum_rows", "block_per_row", "scan"),
    ("transpose_2d", "smem_staging", "transpose"),
    ("nchw_to_nhwc", "smem_staging", "transpose"),
    ("layernorm", "smem_staging", "row_vectors"),  # weight and bias copied before the guard
    ("gemv", "smem_staging", "row_vectors"),
    ("embedding_gather", "vectorized_access", "kernel"),  # its NaN exit, a lane's continue
]


@pytest.mark.parametrize(("name", "mechanism", "form"), FORWARD_FORMS)
def test_forward_forms_pass_their_gate(gate, name: str, mechanism: str, form: str) -> None:
    """The rewritten kernel passes the gate on every workload."""
    from klineage.mechanisms import get

    problem = load_problem(REPO / "heldout" / name)
    naive = KernelSource.from_file(problem.kernel_path)
    rule = get(mechanism)
    (candidate,) = [c for c in rule.candidates(naive) if c.detail.get("form") == form]
    verdict = gate.run(problem, rule.apply(naive, candidate), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


FORMS_AFTER = [
    ("log_softmax", "block_per_row", "online_softmax", "block"),
    ("cross_entropy", "block_per_row", "online_softmax", "block"),
    ("log_softmax", "block_per_row", "row_in_registers", "dispatch"),
    ("layernorm", "block_per_row", "row_in_registers", "dispatch"),
    ("l2_normalize", "block_per_row", "row_in_registers", "dispatch"),
    ("cumsum_rows", "warp_shuffle_scan", "vectorized_access", "scan"),
    # a vector's lanes in one row: the row split once a vector, every row-splitting kernel
    *[(name, "vectorized_access", "vectorized_access", "rows") for name in SPLITTING],
    # staged 16 x 16 tiles of f16 values, multiplied on the tensor cores (mma.sync m16n8k16)
    ("batched_hgemm", "smem_staging", "tensor_core_mma", "mma_tile"),
    # several vectors a thread (4, blockDim apart), the guard and the scalar tail a vector
    ("cast_f32_to_bf16", "vectorized_access", "thread_coarsening", "element"),
    ("gelu", "vectorized_access", "thread_coarsening", "element"),
    # blocks over staged tiles handed out in groups of tile-rows (a grouped order from scratch)
    ("sgemm", "smem_staging", "rasterization", "grid_2d"),
    ("batched_hgemm", "smem_staging", "rasterization", "grid_2d"),
    ("transpose_2d", "smem_staging", "rasterization", "grid_2d"),
]
"""Forms a rule writes on what another rule wrote first (its default carrier, every site)."""


@pytest.mark.parametrize(("name", "first", "mechanism", "form"), FORMS_AFTER)
def test_forward_forms_after_another_pass_their_gate(
    gate, name: str, first: str, mechanism: str, form: str
) -> None:
    """The kernel `first` writes, rewritten by `mechanism`, passes the gate on every workload."""
    from klineage.mechanisms import Carrier, get
    from klineage.mining.removal import apply_everywhere

    problem = load_problem(REPO / "heldout" / name)
    written = apply_everywhere(KernelSource.from_file(problem.kernel_path), get(first), Carrier())
    rule = get(mechanism)
    (candidate,) = [
        c
        for c in rule.candidates(written)
        if form in (c.detail.get("form") or "element", c.detail.get("kind"))
    ]
    verdict = gate.run(problem, rule.apply(written, candidate), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


@pytest.mark.parametrize("check", ["aligned", "peeled"])
@pytest.mark.parametrize("name", ["log_softmax", "cross_entropy"])
def test_loops_vectorized_behind_an_alignment_test_pass_their_gate(
    gate, name: str, check: str
) -> None:
    """Every loop of the block-per-row kernel vectorized behind its run-time alignment test
    (check=aligned: rows of 50,257 floats, misaligned but one in four, take the scalar loops,
    the others the vector ones) or peeled to alignment (check=peeled: every row runs up to
    three scalar elements, then vectors); the gate passes on every workload."""
    from klineage.mechanisms import Carrier, get
    from klineage.mining.removal import apply_everywhere

    problem = load_problem(REPO / "heldout" / name)
    rows = apply_everywhere(
        KernelSource.from_file(problem.kernel_path), get("block_per_row"), Carrier()
    )
    checked = apply_everywhere(rows, get("vectorized_access"), Carrier(check=check))
    assert "% 16" in checked.text
    verdict = gate.run(problem, checked, time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


@pytest.mark.parametrize(
    ("name", "axis", "threshold"),
    [
        ("log_softmax", "cols", 1024),
        ("cross_entropy", "tokens", 512),
        ("l2_normalize", "rows", 4096),
    ],
)
def test_a_dispatch_between_block_and_warp_rows_passes_its_gate(
    gate, name: str, axis: str, threshold: int
) -> None:
    """Replay's dispatch between two rivals (a warp per row at or below the threshold, a
    block per row above, the splits the finished replay's verdicts predict) is correct on
    every workload, each workload taking one kernel or the other."""
    from klineage.mechanisms import Carrier, get
    from klineage.mining.removal import apply_everywhere
    from klineage.replay.dispatch import Split, write_dispatch

    problem = load_problem(REPO / "heldout" / name)
    naive = KernelSource.from_file(problem.kernel_path)
    block = apply_everywhere(naive, get("block_per_row"), Carrier())
    warp = apply_everywhere(naive, get("warp_per_row"), Carrier())
    split = Split(axis, threshold, 1, 1.1)
    dispatch = write_dispatch([block, warp], split, problem.definition.var_axes())
    values = {w.axes[axis] for w in problem.workloads}
    assert min(values) <= threshold < max(values)  # both kernels run
    verdict = gate.run(problem, dispatch, time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]
