"""Caching a row in shared memory on its first pass (smem_staging's forward rule for the form
the row cache removal takes out): the candidate on the removed fixture, the text the rule
writes, the removal taking it out again, rows a block / a threadIdx.y / a warp, the cached
kernel computing what the uncached one does (threads emulated on the host), nvcc builds, and
refusals that name what breaks the form."""

from __future__ import annotations

import re

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from klineage.mining.removal import apply_everywhere, remove_mechanism
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok
from tests.mechanisms.test_staging_row_vectors import _host_case as params_case

staging = get("smem_staging")
FORMS = PUBLIC_FORMS / "smem_staging"

# A row a block, three passes (max, sum of exponentials, write), each loading the row again
# inside a statement: the first pass gets a local for the load.
BLOCK_ROWS = """#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__device__ float block_max(float v) {
  __shared__ float part[32];
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : -INFINITY;
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  return v;
}

__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();
  return v;
}

__global__ void log_softmax_block_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = blockIdx.x;
  const float* in = x + r * cols;
  float* out = y + r * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, __ldg(&in[c]));
  m = block_max(m);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(__ldg(&in[c]) - m);
  const float log_s = logf(block_sum(s));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = __ldg(&in[c]) - m - log_s;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  log_softmax_block_rows<<<(unsigned)rows, 64, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
"""

# A row a warp of a 1-D block.
WARP_ROWS = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void center_warp_rows(const float* x, float* y, int rows, int cols) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * (blockDim.x / 32) + warp;
  if (row >= rows) return;
  const float* in = x + (int64_t)row * cols;
  float s = 0.f;
  for (int c = lane; c < cols; c += 32) s += in[c];
  for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
  const float mean = s / cols;
  for (int c = lane; c < cols; c += 32) y[(int64_t)row * cols + c] = in[c] - mean;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  center_warp_rows<<<(unsigned)((rows + 3) / 4), 128, 0, stream>>>(x, y, (int)rows, (int)cols);
  return (int)cudaGetLastError();
}
"""


def _candidate(kernel: KernelSource) -> Site:
    (site,) = [c for c in staging.candidates(kernel) if c.detail.get("form") == "row_cache"]
    return site


def _refusal(text: str) -> str:
    kernel = KernelSource(text)
    site = _candidate(kernel)
    assert site.refusal is not None
    with pytest.raises(MechanismRefused):
        staging.apply(kernel, site)
    return site.refusal


def test_the_removed_fixture_is_cached_again_per_threadidx_y() -> None:
    after = KernelSource((FORMS / "row_cache.after.cu").read_text())
    site = _candidate(after)
    assert site.supported, site.refusal
    applied = staging.apply(after, site).text
    assert "extern __shared__ __align__(16) char cache[];" in applied
    slice_ = "reinterpret_cast<float4*>(cache) + threadIdx.y * ((cols + 4 - 1) / 4);"
    assert f"float4* row_cache = {slice_}" in applied
    # stored after the load's local in the first pass, read in the second
    assert (
        "const float4 chunk = *reinterpret_cast<const float4*>(x + c);\n"
        "    row_cache[c / 4] = chunk;" in applied
    )
    assert "const float4 chunk = row_cache[c / 4];" in applied
    # the launch asks for a slice a row of the block, and the opt-in follows it
    size = "(size_t)(kRowsPerBlock) * (size_t)((((int)cols) + 4 - 1) / 4) * sizeof(float4)"
    assert f"dim3(32, kRowsPerBlock), {size}, stream>>>" in applied
    assert f"MaxDynamicSharedMemorySize, (int)({size}));" in applied


def test_the_removal_takes_the_cache_out_again() -> None:
    after = KernelSource((FORMS / "row_cache.after.cu").read_text())
    applied = staging.apply(after, _candidate(after))
    removal = remove_mechanism(applied, staging)
    assert [s.detail["form"] for s in removal.sites] == ["row_cache"]
    assert removal.simplified.text == after.text
    # and the removed fixture's own cache comes back the same way
    before = KernelSource((FORMS / "row_cache.before.cu").read_text())
    assert remove_mechanism(before, staging).simplified.text == after.text


def test_a_load_inside_a_statement_gets_a_local_in_the_first_pass() -> None:
    applied = staging.apply(KernelSource(BLOCK_ROWS), _candidate(KernelSource(BLOCK_ROWS))).text
    assert "float* row_cache = reinterpret_cast<float*>(cache);" in applied  # a row a block
    first = (
        "for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {\n"
        "    const float cached = __ldg(&in[c]);\n"
        "    row_cache[c] = cached;\n"
        "    m = fmaxf(m, cached);\n"
        "  }"
    )
    assert first in applied
    assert "s += expf(row_cache[c] - m);" in applied
    assert "out[c] = row_cache[c] - m - log_s;" in applied
    assert applied.count("__ldg(&in[c])") == 1
    assert "<<<(unsigned)rows, 64, (size_t)cols * sizeof(float), stream>>>" in applied
    # one rewrite is enough: no candidate is left for a load already cached
    again = [
        c for c in staging.candidates(KernelSource(applied)) if c.detail.get("form") == "row_cache"
    ]
    assert not again


def test_rows_a_warp_take_a_slice_a_warp() -> None:
    applied = staging.apply(KernelSource(WARP_ROWS), _candidate(KernelSource(WARP_ROWS))).text
    assert "reinterpret_cast<float*>(cache) + (threadIdx.x / 32) * cols;" in applied
    assert "128, (size_t)((128) / 32) * (size_t)((int)cols) * sizeof(float), stream>>>" in applied
    assert "y[(int64_t)row * cols + c] = row_cache[c] - mean;" in applied


def _on_host(text: str) -> str:
    """The dynamic buffer as a fixed static one: the emulation has no launch-time size."""
    return re.sub(
        r"extern __shared__ __align__\(16\) char cache\[\];",
        "__shared__ __align__(16) char cache[32768];",
        text,
    )


def _case(kernel: str, rows: int, cols: int, grid: str, block: str, cast: str) -> Case:
    return Case(
        axes={"rows": rows, "cols": cols},
        buffers=[
            Buffer("x", "float", "rows * cols"),
            Buffer("y", "float", "rows * cols", output=True),
        ],
        call=f"{kernel}(x, y, {cast}rows, {cast}cols)",
        threads="",
        grid=grid,
        block_dims=block,
    )


@pytest.mark.nvcc
def test_the_cached_kernels_compute_what_the_uncached_ones_do() -> None:
    for text, cases in (
        (
            BLOCK_ROWS,
            [
                _case("log_softmax_block_rows", rows, cols, f"dim3({rows})", "dim3(64)", "")
                for rows, cols in ((3, 200), (2, 37))
            ],
        ),
        (
            WARP_ROWS,
            [
                _case(
                    "center_warp_rows", rows, cols, f"dim3({(rows + 3) // 4})", "dim3(128)", "(int)"
                )
                for rows, cols in ((6, 100), (4, 33))
            ],
        ),
    ):
        kernel = KernelSource(text)
        applied = staging.apply(kernel, _candidate(kernel)).text
        assert run_on_host(_on_host(applied), cases) == run_on_host(text, cases)


def test_a_load_under_a_condition_is_refused() -> None:
    text = WARP_ROWS.replace(
        "for (int c = lane; c < cols; c += 32) s += in[c];",
        "for (int c = lane; c < cols; c += 32) s += c % 2 ? in[c] : 0.f;",
    )
    assert "under a condition of its loop" in _refusal(text)


def test_a_row_the_kernel_writes_is_refused() -> None:
    text = WARP_ROWS.replace("const float* x", "float* x").replace(
        "y[(int64_t)row * cols + c] = in[c] - mean;", "x[(int64_t)row * cols + c] = in[c] - mean;"
    )
    assert "which the kernel also writes" in _refusal(text)


def test_a_row_a_thread_is_refused() -> None:
    # one thread per row: a slice a thread would be a whole row a thread of the block
    text = (
        WARP_ROWS.replace(
            "const int row = blockIdx.x * (blockDim.x / 32) + warp;",
            "const int row = blockIdx.x * blockDim.x + threadIdx.x;",
        )
        .replace("c = lane;", "c = 0;")
        .replace("c += 32)", "++c)")
    )
    assert "rows told apart by threadIdx.x" in _refusal(text)


def test_a_value_written_between_the_passes_is_refused() -> None:
    text = WARP_ROWS.replace("const float* in = x", "const float* in; in = x").replace(
        "const float mean = s / cols;", "const float mean = s / cols;\n  in += 0;"
    )
    assert "written between its first and last pass" in _refusal(text)


@pytest.mark.nvcc
def test_the_cached_kernels_build(mechanism_builder: Builder) -> None:
    sources = []
    for text in (BLOCK_ROWS, WARP_ROWS, (FORMS / "row_cache.after.cu").read_text()):
        kernel = KernelSource(text)
        sources.append(staging.apply(kernel, _candidate(kernel)))
    compile_ok(mechanism_builder, sources)


def test_a_first_pass_that_may_not_run_has_no_later_pass() -> None:
    # the first pass under a condition, the second after it: a thread that skipped the
    # first would read a slice nothing stored, so nothing is cached
    text = WARP_ROWS.replace(
        "for (int c = lane; c < cols; c += 32) s += in[c];",
        "if (cols > 64) {\n    for (int c = lane; c < cols; c += 32) s += in[c];\n  }",
    )
    kernel = KernelSource(text)
    assert not [c for c in staging.candidates(kernel) if c.detail.get("form") == "row_cache"]
    # a later pass under a condition still follows the first
    text = WARP_ROWS.replace(
        "for (int c = lane; c < cols; c += 32) y[",
        "if (cols > 64)\n    for (int c = lane; c < cols; c += 32) y[",
    )
    assert _candidate(KernelSource(text)).supported


def test_a_first_pass_that_can_skip_its_store_is_refused() -> None:
    text = WARP_ROWS.replace(
        "for (int c = lane; c < cols; c += 32) s += in[c];",
        "for (int c = lane; c < cols; c += 32) {\n    if (c == 7) continue;\n    s += in[c];\n  }",
    )
    assert "can skip its store" in _refusal(text)


def test_the_slices_must_fit_what_a_block_can_opt_in_to() -> None:
    # replay checks a candidate's conditions before a gate run: rows longer than 227 KiB of
    # slices a block (cross_entropy's 128K vocabularies at a row a block) are not tried
    limit = 227 * 1024
    for text, rows in ((BLOCK_ROWS, 1), (WARP_ROWS, 4)):
        kernel = KernelSource(text)
        (condition,) = staging.conditions(kernel, _candidate(kernel))
        assert condition.statement == f"cols must be at most {limit // (rows * 4)}"
        assert f"{rows} row slice(s) of 4-byte elements a block" in condition.why
    after = KernelSource((FORMS / "row_cache.after.cu").read_text())
    (condition,) = staging.conditions(after, _candidate(after))
    assert condition.statement == f"cols must be at most {limit // (8 * 4)}"  # kRowsPerBlock


@pytest.mark.nvcc
def test_applied_everywhere_the_row_is_cached_and_the_vectors_staged() -> None:
    # llm.c layernorm k6's layout, written again: each warp's row slice after the block's
    # copy of the per-column vectors, the launch asking for both
    after = KernelSource((FORMS / "row_params.after.cu").read_text())
    applied = apply_everywhere(after, staging, Carrier()).text
    # the pack's width as the kernel names it, the slices in front of the vectors' copy
    assert "row_cache[c / Vec4::size] = in;" in applied
    assert "const Vec4 in = row_cache[c / Vec4::size];" in applied
    assert "s_gain[i / Vec4::size] = load_vec(gain + i);" in applied
    slices = "blockDim.y * ((cols + Vec4::size - 1) / Vec4::size) * sizeof(Vec4)"
    assert f"reinterpret_cast<Vec4*>((staged + (({slices} + 15) / 16 * 16)));" in applied
    emulated = re.sub(
        r"extern __shared__ __align__\(16\) char staged\[\];",
        "__shared__ __align__(16) char staged[32768];",
        applied,
    )
    cases = [params_case("affine_rows", rows, cols) for rows, cols in ((5, 64), (3, 256))]
    assert run_on_host(emulated, cases) == run_on_host(after.text, cases)


def test_a_helper_load_of_an_undeclared_type_is_refused() -> None:
    # a pack loaded by a helper inside a statement: its type is not written anywhere the
    # rule could read it, so no slot type is guessed
    text = (FORMS / "row_params.after.cu").read_text()
    text = text.replace(
        "const Vec4 in = load_vec(x + c);\n    for (int k = 0; k < Vec4::size; ++k) sum += in[k];",
        "sum += load_vec(x + c)[0];",
    )
    assert "sum += load_vec(x + c)[0];" in text
    refusals = [
        c.refusal
        for c in staging.candidates(KernelSource(text))
        if c.detail.get("form") == "row_cache"
    ]
    assert refusals and "whose value's type is not declared" in str(refusals[0])
