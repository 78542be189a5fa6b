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


def test_a_return_of_some_threads_before_the_kernel_s_loop_is_refused() -> None:
    """Threads that left would miss the fill's barrier; a whole block may leave."""
    uniform = _removed().replace(
        "  float acc[TM][TN] = {{0.0f}};", "  if (M == 0) return;\n  float acc[TM][TN] = {{0.0f}};"
    )
    assert form_candidate(KernelSource(uniform), FORM).supported
    text = uniform.replace("if (M == 0) return;", "if (threadIdx.y * TM >= M) return;")
    assert "may return before the loop for some threads only" in _refusal(text)


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


# A lower-triangle score matrix in a public idiom: the kernel calls its body through a
# function-pointer template parameter; whole blocks above the diagonal return; the body moves
# its operand pointers to the block's rows and walks each 16-wide slice of the depth rotated
# by the thread's column, `(s + threadIdx.x) % 16` (what the loader removal leaves of tiles a
# block staged for it).
ROTATED = """\
#include <cuda_runtime.h>
#include <stdint.h>

using body_fn = void (*)(float* out, const float* a, const float* b, int lda, int ldb, int depth);

__device__ void scores_body(float* out, const float* a, const float* b, int lda, int ldb,
                            int depth) {
  if (blockIdx.y > blockIdx.x) return;
  a += 64 * blockIdx.x * lda;
  b += 64 * blockIdx.y * ldb;
  float acc[4][4] = {};
  for (int d0 = 0; d0 < depth; d0 += 16) {
    for (int s = 0; s < 16; ++s) {
      float right[4];
      for (int u = 0; u < 4; ++u)
        right[u] = b[d0 + ldb * (u + 4 * threadIdx.y) + (s + threadIdx.x) % 16];
      for (int i = 0; i < 4; ++i) {
        float left = a[d0 + lda * (i + 4 * threadIdx.x) + (s + threadIdx.x) % 16];
        for (int j = 0; j < 4; ++j) acc[i][j] += left * right[j];
      }
    }
  }
  const int width = 64 * gridDim.x;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j)
      out[(64 * blockIdx.x + 4 * threadIdx.x + i) * width + 64 * blockIdx.y + 4 * threadIdx.y +
          j] = acc[i][j];
}

template <body_fn body>
__global__ void scores(float* out, const float* a, const float* b, int lda, int ldb, int depth) {
  body(out, a, b, lda, ldb, depth);
}

extern "C" int run(const float* A, const float* B, float* OUT, int64_t n, int64_t d,
                   cudaStream_t stream) {
  scores<scores_body><<<dim3((unsigned)(n / 64), (unsigned)(n / 64)), dim3(16, 16), 0, stream>>>(
      OUT, A, B, (int)d, (int)d, (int)d);
  return (int)cudaGetLastError();
}
"""


def _rotated_case() -> Case:
    return Case(
        axes={"n": 128, "d": 48},
        buffers=[
            Buffer("out", "float", "n * n", output=True),
            Buffer("a", "float", "n * d", offset=1),
            Buffer("b", "float", "n * d", offset=3),
        ],
        call="scores<scores_body>(out, a, b, (int)d, (int)d, (int)d)",
        threads="",
        grid="dim3(2, 2)",
        block_dims="dim3(16, 16)",
    )


def test_a_rotated_walk_in_a_body_the_kernel_calls_is_staged() -> None:
    site = form_candidate(KernelSource(ROTATED), FORM)
    assert site.function == "scores_body" and site.supported, site.refusal
    staged = apply_form(ROTATED, FORM)
    assert "right[u] = tile_b[4 * threadIdx.y + u][(s + threadIdx.x) % 16];" in staged
    assert "float left = tile_a[i + 4 * threadIdx.x][(s + threadIdx.x) % 16];" in staged
    # the pointers already moved to the block's rows: the fill adds only the turn's slice
    assert "a[(long long)d0 + (long long)(lda) * (slot / 16) + slot % 16]" in staged
    host = [_rotated_case()]
    bits = run_on_host(ROTATED, host)
    assert bits.strip() and run_on_host(staged, host) == bits


def test_the_rotated_staging_builds(mechanism_builder: Builder) -> None:
    compile_ok(mechanism_builder, [KernelSource(apply_form(ROTATED, FORM))])


def test_a_rotation_too_short_to_reach_every_column_is_refused() -> None:
    text = ROTATED.replace("% 16]", "% 32]")
    assert "does not reach every value below 32" in _refusal(text)


def test_a_return_of_some_threads_before_the_loop_is_refused() -> None:
    text = ROTATED.replace("if (blockIdx.y > blockIdx.x) return;", "if (threadIdx.x > 8) return;")
    assert "may return before the loop for some threads only" in _refusal(text)


def test_a_body_the_kernel_calls_under_a_condition_is_refused() -> None:
    text = ROTATED.replace(
        "  body(out, a, b, lda, ldb, depth);", "  if (depth > 0) body(out, a, b, lda, ldb, depth);"
    )
    assert "calls under a condition or loop" in _refusal(text)


def test_a_kernel_that_already_stages_is_refused_when_applied() -> None:
    """Candidates skip kernels with shared memory; applying at the loop anyway is refused."""
    from klineage.cuda.tree import NotInForm
    from klineage.mechanisms._staging_operands_forward import operand_tiles

    text = _removed().replace(
        "  float acc[TM][TN] = {{0.0f}};",
        "  __shared__ float spare[4];\n  float acc[TM][TN] = {{0.0f}};",
    )
    parsed = KernelSource(text).parsed
    kernel = parsed.function("sgemm_vector_tiles")
    assert kernel is not None and kernel.body is not None
    loop = next(s for s in kernel.body.named_children if s.type == "for_statement")
    with pytest.raises(NotInForm, match="already stages in shared memory"):
        operand_tiles(parsed, kernel, loop)


def test_a_kernel_with_shared_memory_offers_no_candidate() -> None:
    text = _removed().replace(
        "  float acc[TM][TN] = {{0.0f}};",
        "  __shared__ float spare[4];\n  float acc[TM][TN] = {{0.0f}};",
    )
    assert [c for c in staging.candidates(KernelSource(text)) if c.detail.get("form") == FORM] == []


def test_a_kernel_whose_helper_synchronizes_is_refused() -> None:
    """A barrier the kernel already reaches, here through a helper it calls, is refused:
    the fill's barriers would have to agree with it."""
    text = (
        _removed()
        .replace(
            "template <int BM, int BN, int BK, int TM, int TN>",
            "__device__ void settle() { __syncthreads(); }\n\n"
            "template <int BM, int BN, int BK, int TM, int TN>",
            1,
        )
        .replace("  float acc[TM][TN] = {{0.0f}};", "  settle();\n  float acc[TM][TN] = {{0.0f}};")
    )
    assert "already synchronizes its block" in _refusal(text)


WIDE_K = """\
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void product(float* C, const float* A, const float* B, int n) {
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * 16 + ty, col = blockIdx.x * 16 + tx;
  float acc = 0.0f;
  for (int t = 0; t < n; t += 32) {
    for (int k = 0; k < 32; ++k) acc += A[row * n + t + k] * B[(t + k) * n + col];
  }
  C[row * n + col] = acc;
}

extern "C" int run(const float* A, const float* B, float* C, int64_t n, cudaStream_t s) {
  product<<<dim3((unsigned)(n / 16), (unsigned)(n / 16)), dim3(16, 16), 0, s>>>(C, A, B, (int)n);
  return (int)cudaGetLastError();
}
"""


def test_a_loop_the_blocked_form_refuses_is_staged_by_this_one() -> None:
    # a 16 x 16 block walking k 32 at a time: the one-element-per-thread tiles of the blocked
    # form would need a 32 x 32 block, but the turn reads a 16 x 32 and a 32 x 16 tile
    site = form_candidate(KernelSource(WIDE_K), FORM)
    assert site.supported, site.refusal
    staged = apply_form(WIDE_K, FORM)
    assert staged.count("__syncthreads();") == 2
    case = Case(
        axes={"n": 64},
        buffers=[
            Buffer("C", "float", "n * n", output=True),
            Buffer("A", "float", "n * n", offset=1),
            Buffer("B", "float", "n * n", offset=2),
        ],
        call="product(C, A, B, (int)n)",
        threads="",
        grid="dim3(4, 4)",
        block_dims="dim3(16, 16)",
    )
    bits = run_on_host(WIDE_K, [case])
    assert bits.strip() and run_on_host(staged, [case]) == bits
