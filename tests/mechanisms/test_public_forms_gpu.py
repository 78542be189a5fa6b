"""The public-form removals keep the kernel correct: each before/after pair of
``tests/fixtures/public_forms`` passes the gate's check on its problem's workloads (GPU), and
declares the ``run(...)`` its problem implies (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.kernel import KernelSource
from klineage.problem import Problem, load_problem
from klineage.problem.abi import KernelAbi
from tests.conftest import FIXTURES
from tests.mechanisms.roundtrip import PUBLIC_FORMS
from tests.mechanisms.test_public_removals import PAIRS, Pair

PROBLEMS = PUBLIC_FORMS / "problems"
PROBLEM_OF_CASE: dict[str, Path] = {
    "cast_once": FIXTURES / "mining" / "scale_shift_rows",
    "persistent_rows": PROBLEMS / "centered_affine",
    "rows_by_z": PROBLEMS / "center_rows",
    "row_turns": PROBLEMS / "column_totals",
    "rows_2d": PROBLEMS / "center_rows",
    "rows_2d_walk_back": PROBLEMS / "center_rows",
    "rows_2d_split_stores": PROBLEMS / "center_rows",
    "rows_cg": PROBLEMS / "center_rows",
    "scratch_pairs": PROBLEMS / "center_rows",
    "serial_unrolled": PROBLEMS / "row_softmax",
    "serpentine": PROBLEMS / "scale_tiles",
    "rotation": PROBLEMS / "scale_tiles",
    "rotation_ldmatrix": PROBLEMS / "copy_fragments",
    "guarded_tree": PROBLEMS / "block_totals",
    "template_width": PROBLEMS / "block_totals",
    "macro_dispatch": PROBLEMS / "block_totals",
    "online_pairs": PROBLEMS / "row_logsumexp",
    "tile_parameter": PROBLEMS / "row_logsumexp",
    "quad_columns": PROBLEMS / "column_totals",
    "loads_per_turn": PROBLEMS / "vector_total",
    "chunk_partials": PROBLEMS / "vector_chunk_total",
    "rows_per_block": PROBLEMS / "causal_center",
    "pair_partials": PROBLEMS / "vector_total",
    "transpose_once": PROBLEMS / "transpose",
    "helper_tiles": PROBLEMS / "sgemm_tiles",
    "helper_tiles_2d": PROBLEMS / "sgemm_bounded",
    "helper_tiles_2d_reader": PROBLEMS / "sgemm_bounded",
    "bounded_rows_2d": PROBLEMS / "sgemm_bounded",
    "row_cache": PROBLEMS / "center_rows",
    "row_params": PROBLEMS / "centered_affine",
    "row_params_float": PROBLEMS / "centered_affine",
    "clamped_count": PROBLEMS / "column_totals",
    "rows_cg_causal": PROBLEMS / "causal_center",
    "rows_untaken_path": PROBLEMS / "center_rows",
    "row_loader": PROBLEMS / "linear_nt",
    "aligned_vectors": PROBLEMS / "linear_nt",
    "templated_warps": PROBLEMS / "sgemm_tiles",
    "warp_tiles": PROBLEMS / "sgemm_tiles",
    "micro_tiles": PROBLEMS / "sgemm_tiles",
    "vector_tiles": PROBLEMS / "sgemm_tiles",
    "vector_pairs": PROBLEMS / "sgemm_tiles",
    "linear_warps": PROBLEMS / "sgemm_bounded",
    "named_stride": PROBLEMS / "scale_tiles",
    "dim3_grid": PROBLEMS / "scale_tiles",
    "batch_by_z": PROBLEMS / "scale_tiles",
    "tiles_by_block": PROBLEMS / "scale_tiles",
    "held_index": PROBLEMS / "scale_tiles",
    "earlier_index": PROBLEMS / "scale_tiles",
    "ring_stages": PROBLEMS / "stream_affine",
    "address_macros": PROBLEMS / "stream_affine",
    "wide_template": PROBLEMS / "gemm_nt_bf16",
    "row_dots": PROBLEMS / "linear_nt",
    "block_tiled": PROBLEMS / "sgemm_tiles",
    "warp_subtiles": PROBLEMS / "sgemm_tiles",
    "helper_fills": PROBLEMS / "sgemm_bounded",
    "paired_offsets": PROBLEMS / "sgemm_tiles",
}


def _problem(pair: Pair) -> Problem:
    return load_problem(PROBLEM_OF_CASE[pair.case])


def _id(pair: Pair) -> str:
    return f"{pair.mechanism}-{pair.case}"


def test_every_pair_has_a_problem() -> None:
    assert {pair.case for pair in PAIRS} == set(PROBLEM_OF_CASE)


@pytest.mark.parametrize("pair", PAIRS, ids=_id)
def test_both_states_declare_the_run_their_problem_implies(pair: Pair) -> None:
    abi = KernelAbi.from_definition(_problem(pair).definition)
    for kernel in (pair.before, pair.after):
        assert abi.mismatch(kernel.text) is None, abi.mismatch(kernel.text)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("pair", PAIRS, ids=_id)
def test_the_removal_keeps_the_kernel_correct(gate, pair: Pair) -> None:
    problem = _problem(pair)
    for state, kernel in (("before", pair.before), ("after", pair.after)):
        source = KernelSource(kernel.text, name=f"{pair.case}.{state}.cu")
        verdict = gate.run(problem, source, time_it=False)
        failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
        assert verdict.passed, (state, verdict.build.message, failing)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_rows_per_block_applied_forward_keeps_the_kernel_correct(gate) -> None:
    # the forward of the rows-per-block removal, on its one-row-per-block fixture: 4 rows a
    # block; also on an odd row count, where the last block's later turns take the guard
    from klineage.mechanisms import Carrier, get

    coarsening = get("thread_coarsening")
    after = KernelSource(
        (PUBLIC_FORMS / "thread_coarsening" / "rows_per_block.after.cu").read_text()
    )
    (site,) = [c for c in coarsening.candidates(after) if c.detail.get("form") == "rows"]
    for rows in (2, 4, 8):
        forward = coarsening.apply(after, site, Carrier(rows=rows))
        source = KernelSource(forward.text, name=f"rows_per_block.forward{rows}.cu")
        verdict = gate.run(load_problem(PROBLEMS / "causal_center"), source, time_it=False)
        failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
        assert verdict.passed, (rows, verdict.build.message, failing)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_tile_transpose_applied_forward_keeps_the_kernel_correct(gate) -> None:
    # the forward of the tile-once removal: the shared-memory transpose written back into the
    # tiled kernel that reads its input transposed
    from klineage.mechanisms import Carrier, get

    staging = get("smem_staging")
    after = KernelSource((PUBLIC_FORMS / "smem_staging" / "transpose_once.after.cu").read_text())
    (site,) = [c for c in staging.candidates(after) if c.detail.get("form") == "tile_transpose"]
    forward = staging.apply(after, site, Carrier())
    source = KernelSource(forward.text, name="transpose_once.forward.cu")
    verdict = gate.run(load_problem(PROBLEMS / "transpose"), source, time_it=False)
    failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
    assert verdict.passed, (verdict.build.message, failing)


def _staged_forward_passes(gate, case: str, form: str) -> None:
    """The smem_staging form ``form`` applied forward on ``case``'s removed state passes the
    gate's correctness check on the case's problem."""
    from klineage.mechanisms import Carrier, get

    staging = get("smem_staging")
    after = KernelSource((PUBLIC_FORMS / "smem_staging" / f"{case}.after.cu").read_text())
    (site,) = [c for c in staging.candidates(after) if c.detail.get("form") == form]
    forward = staging.apply(after, site, Carrier())
    source = KernelSource(forward.text, name=f"{case}.forward.cu")
    verdict = gate.run(load_problem(PROBLEM_OF_CASE[case]), source, time_it=False)
    failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
    assert verdict.passed, (verdict.build.message, failing)


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["helper_tiles", "warp_tiles", "micro_tiles"])
def test_tile_loop_applied_forward_keeps_the_kernel_correct(gate, case: str) -> None:
    # the forward of the helper removal: tiles staged by the generated loader in the tile loop
    # of global reads the removal left
    _staged_forward_passes(gate, case, "tile_loop")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["bounded_rows_2d", "helper_tiles_2d", "helper_tiles_2d_reader"])
def test_tile_loop_2d_applied_forward_keeps_the_kernel_correct(gate, case: str) -> None:
    # the forward of the 2-D helper removal: bounds-checked tiles staged again by the
    # generated loader, rows handed back to the reader helper
    _staged_forward_passes(gate, case, "tile_loop_2d")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["row_params", "row_params_float", "persistent_rows"])
def test_row_vectors_applied_forward_keep_the_kernel_correct(gate, case: str) -> None:
    # the forward of the once removal: the row-invariant parameters staged again, in a
    # kernel without a dynamic buffer and in one whose own buffer moves past the copy
    _staged_forward_passes(gate, case, "row_vectors")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["vector_tiles", "vector_pairs"])
def test_operand_tiles_applied_forward_keep_the_kernel_correct(gate, case: str) -> None:
    # the forward of the loader removal on a register-tiled SIMT GEMM: the operands the turn
    # reads from global memory staged again, filled by the whole block
    _staged_forward_passes(gate, case, "operand_tiles")


def _rows_spread_forward_passes(gate, fixture: str, problem: str) -> None:
    """block_per_row and warp_per_row applied to a thread-per-row fixture keep it correct."""
    from klineage.mechanisms import get

    kernel = KernelSource((PUBLIC_FORMS / "block_per_row" / fixture).read_text())
    states = [("thread", kernel)]
    for name in ("block_per_row", "warp_per_row"):
        mechanism = get(name)
        states.append((name, mechanism.apply(kernel, mechanism.candidates(kernel)[0])))
    for label, state in states:
        source = KernelSource(state.text, name=f"{fixture}.{label}.cu")
        verdict = gate.run(load_problem(PROBLEMS / problem), source, time_it=False)
        failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
        assert verdict.passed, (label, verdict.build.message, failing)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_packs_and_tails_spread_forward_keep_the_kernel_correct(gate) -> None:
    # a thread per row that stores 16-byte packs at a sum of terms and a tail from its start:
    # rows of whole packs, and rows of a tail only
    _rows_spread_forward_passes(gate, "packed_tail.cu", "center_rows_odd")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("fixture", "problem"),
    [
        ("helper_online.cu", "row_logsumexp_odd"),
        ("helper_online_up.cu", "row_softmax"),
        ("online_rows.cu", "row_softmax"),
    ],
)
def test_helper_rows_spread_forward_keep_the_kernel_correct(gate, fixture: str, problem: str):
    # a thread per row that folds its row into an online (max, sum) pair, in a helper walking
    # it down with a partial group first or forward, or in its own loop
    _rows_spread_forward_passes(gate, fixture, problem)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_a_capped_forward_over_a_dim3_block_keeps_the_kernel_correct(gate) -> None:
    # grid_stride_loop applied to what its removal leaves of a sample's dim3 launch, the grid
    # capped at 8 blocks of dimBlock.x threads: every element still reached
    from klineage.mechanisms import Carrier, get

    mechanism = get("grid_stride_loop")
    kernel = KernelSource((PUBLIC_FORMS / "grid_stride_loop" / "dim3_grid.after.cu").read_text())
    applied = mechanism.apply(kernel, mechanism.candidates(kernel)[0], Carrier(max_blocks=8))
    assert "(int64_t)8), dimBlock" in applied.text
    verdict = gate.run(load_problem(PROBLEMS / "scale_tiles"), applied, time_it=False)
    failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
    assert verdict.passed, (verdict.build.message, failing)


@pytest.mark.gpu
@pytest.mark.nvcc
def test_paired_offsets_staged_forward_keep_the_kernel_correct(gate) -> None:
    # the blocked form on a tile loop that walks A and B with two offsets its header declares
    _staged_forward_passes(gate, "paired_offsets", "blocked")
