"""The warp_per_row mechanism: fixtures both ways (from heldout/row_max and
heldout/cross_entropy), removal of hand-written warp-per-row forms, the softmax expert, and
``apply`` on held-out row reductions."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
    heldout_applications,
)
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok

mechanism = get("warp_per_row")


class TestWarpPerRow(RoundTripSuite):
    mechanism = "warp_per_row"


WARP_ROWS = """#include <cuda_runtime.h>
#include <stdint.h>

constexpr int kWarps = 4;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void row_sums(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) s += x[r * cols + c];
  s = warp_sum(s);
  if (lane == 0) y[r] = s;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  row_sums<<<(unsigned)((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
"""


def test_a_hand_written_warp_per_row_kernel_becomes_thread_per_row() -> None:
    source = KernelSource(WARP_ROWS)
    (site,) = mechanism.detect(source)
    assert site.supported, site.refusal
    removed = mechanism.remove(source, site).text
    assert "const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;" in removed
    assert "for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c];" in removed
    assert "warp_sum(s)" not in removed and "lane" not in removed.split("row_sums(")[1]
    assert "  y[r] = s;" in removed
    assert "<<<(unsigned)((rows + (kWarps * 32) - 1) / (kWarps * 32)), kWarps * 32," in removed
    assert mechanism.candidates(KernelSource(removed))


def test_a_lane_used_elsewhere_is_refused() -> None:
    source = KernelSource(WARP_ROWS.replace("s += x[r * cols + c]", "s += x[r * cols + c] * lane"))
    (site,) = mechanism.detect(source)
    assert "the lane variable lane at line 16" in (site.refusal or "")


def test_rows_per_block_follow_the_block_size() -> None:
    source = KernelSource.from_file(
        __import__("tests.conftest", fromlist=["REPO"]).REPO / "heldout" / "row_sum" / "kernel.cu"
    )
    (candidate,) = mechanism.candidates(source)
    applied = mechanism.apply(source, candidate, Carrier(block_size=128)).text
    assert "row_sum<<<(unsigned)((rows + 3) / 4), 128, 0, stream>>>" in applied
    assert "const int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;" in applied


def test_the_expert_is_detected_where_listed() -> None:
    assert_detected_where_listed("warp_per_row")


@pytest.mark.nvcc
def test_expert_removals_compile_or_refuse(mechanism_builder: Builder) -> None:
    refusals = check_expert_removals_compile("warp_per_row", mechanism_builder)
    # softmax_warp_rows and l2_pool_warp_rows hold the row in registers across strided slots
    assert len(refusals) == 2 and all("row_in_registers" in r for r in refusals)


@pytest.mark.nvcc
def test_apply_on_heldout_row_reductions_compiles(mechanism_builder: Builder) -> None:
    names = ["row_sum", "layernorm", "mean_pool"]  # row_max, cross_entropy: the fixtures
    compile_ok(mechanism_builder, heldout_applications("warp_per_row", names))


THREAD_ROWS_FMA = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void row_squares(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.0f;
  for (int64_t c = 0; c < cols; ++c) s = fmaf(x[r * cols + c], x[r * cols + c], s);
  y[r] = sqrtf(s);
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  row_squares<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
"""


def test_a_sum_of_products_through_fmaf_is_a_sum() -> None:
    """``s = fmaf(a, b, s)``: the lanes' partial sums of products meet in a warp sum; an fmaf
    that also reads ``s`` in a product is no sum."""
    source = KernelSource(THREAD_ROWS_FMA)
    (candidate,) = mechanism.candidates(source)
    assert candidate.supported, candidate.refusal
    applied = mechanism.apply(source, candidate).text
    assert "for (int64_t c = threadIdx.x & 31; c < cols; c += 32)" in applied
    assert "s = warp_reduce_sum(s);" in applied
    assert "if ((threadIdx.x & 31) == 0) y[r] = sqrtf(s);" in applied
    squared = KernelSource(THREAD_ROWS_FMA.replace("x[r * cols + c], s)", "s, s)"))
    (refused,) = mechanism.candidates(squared)
    assert "which is not a sum, a max or a min of it" in (refused.refusal or "")
