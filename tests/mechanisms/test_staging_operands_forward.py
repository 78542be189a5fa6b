"""smem_staging's ``operand_tiles`` form: a register-tiled turn that reads its operands from
global memory (what the loader removal leaves of a SIMT GEMM's staged tiles) gets them staged
again, checked on the host emulator (the same bits as the removed and the expert kernels),
with nvcc, by the removal reading the result back, and by its refusals."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import kernel_block_dims
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import compile_ok
from tests.mechanisms.staging_support import apply_form, form_candidate, staged_pair, staging

FORM = "operand_tiles"
CASES = ["vector_tiles", "vector_pairs"]


def _case(kernel: str) -> Case:
    """A 128 x 128 x 32 product on a 2 x 2 grid of 16 x 16 blocks (64 x 64 x 16 tiles); the
    operands 16-byte aligned, as the expert's float4 copies need."""
    return Case(
        axes={"m": 128, "n": 128, "k": 32},
        buffers=[
            Buffer("c", "float", "m * n", output=True),
            Buffer("a", "float", "m * k", offset=4),
            Buffer("b", "float", "k * n", offset=8),
        ],
        call=f"{kernel}<64, 64, 16, 4, 4>(a, b, c, (int)m, (int)n, (int)k)",
        threads="",
        grid="dim3(2, 2)",
        block_dims="dim3(16, 16)",
    )


def _kernel(case: str) -> str:
    return f"sgemm_{case}"


@pytest.mark.parametrize("case", CASES)
def test_the_removed_tiles_are_staged_again_with_the_same_bits(case: str) -> None:
    expert, removed = staged_pair(case)
    staged = apply_form(removed.text, FORM)
    assert "__shared__ float tile_a[64][16];" in staged
    assert "__shared__ float tile_b[16][64];" in staged
    assert "tile_a[i + TM * threadIdx.y][k] * tile_b[k][j + TN * threadIdx.x]" in staged
    assert staged.count("__syncthreads();") == 2
    host = [_case(_kernel(case))]
    bits = run_on_host(removed.text, host)
    assert bits.strip()
    assert run_on_host(staged, host) == bits
    assert run_on_host(expert.text, host) == bits


@pytest.mark.parametrize("case", CASES)
def test_the_staged_kernel_builds_and_its_staging_is_removed_again(
    case: str, mechanism_builder: Builder
) -> None:
    _, removed = staged_pair(case)
    staged = KernelSource(apply_form(removed.text, FORM))
    compile_ok(mechanism_builder, [staged])
    (site,) = [s for s in staging.detect(staged) if s.supported]
    again = staging.remove(staged, site)
    assert "__shared__" not in again.text and "__syncthreads" not in again.text
    host = [_case(_kernel(case))]
    assert run_on_host(again.text, host) == run_on_host(removed.text, host)


def _refusal(text: str) -> str:
    site = form_candidate(KernelSource(text), FORM)
    assert not site.supported
    return site.refusal or ""


def _removed() -> str:
    return staged_pair("vector_tiles")[1].text


A_READ = "a[BK * kt + BM * K * blockIdx.y + (K) * (threadIdx.y * TM + i) + (k)]"


def test_a_read_under_a_condition_is_refused() -> None:
    text = _removed().replace(A_READ, f"(k < K ? {A_READ} : 0.0f)")
    assert "under a condition" in _refusal(text)


def test_a_row_and_column_moving_with_one_index_are_refused() -> None:
    text = _removed().replace("+ (k)]", "+ (k + threadIdx.y)]")
    assert "both move with ['threadIdx.y']" in _refusal(text)


def test_an_index_that_skips_rows_is_refused() -> None:
    text = _removed().replace("(threadIdx.y * TM + i)", "(threadIdx.y * 2 * TM + i)")
    assert "skips values or repeats them" in _refusal(text)


def test_tiles_past_static_shared_memory_are_refused() -> None:
    text = _removed().replace("BK = 16,", "BK = 128,")
    assert "more than the 49152 of static shared memory" in _refusal(text)


def test_a_return_before_the_loop_is_refused() -> None:
    text = _removed().replace(
        "  float acc[TM][TN] = {{0.0f}};", "  if (M == 0) return;\n  float acc[TM][TN] = {{0.0f}};"
    )
    assert "may return before the loop" in _refusal(text)


def test_a_local_dim3_block_keeps_its_shape() -> None:
    """``dim3 block(BN / TN, BM / TM)`` is 16 x 16 threads, not 256 x 1."""
    removed = KernelSource(_removed())
    kernel = removed.parsed.function("sgemm_vector_tiles")
    assert kernel is not None
    assert kernel_block_dims(removed.parsed, kernel) == (16, 16, 1)


def test_a_read_in_a_loop_of_a_run_time_trip_count_is_refused() -> None:
    """A loop to N may run no turn: its reads would not cover the tile the fill reads."""
    text = _removed().replace(
        "for (int j = 0; j < TN; ++j) {\n          acc",
        "for (int j = 0; j < N; ++j) {\n          acc",
    )
    assert "does not count from 0 to a constant" in _refusal(text)
