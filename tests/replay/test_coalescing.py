"""Rival loop layouts raced in the order the target's loads favor (klineage.replay.coalescing)."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.replay.coalescing import (
    BLOCKS,
    LANES,
    REUSED,
    STRIDED,
    calls_for_staging,
    loop_spread,
    spread_first,
    stage_first,
)
from tests.conftest import REPO

ROWS = """
__global__ void row_totals(const float* x, float* y, int rows, int cols) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float acc = 0.f;
  for (int c = 0; c < cols; ++c) acc += x[row * cols + c];
  y[row] = acc;
}
"""
COLUMNS = """
__global__ void column_totals(const float* x, float* y, int rows, int cols) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float acc = 0.f;
  for (int r = 0; r < rows; ++r) acc += x[r * cols + col];
  y[col] = acc;
}
"""


def test_a_thread_walking_its_own_row_favors_lanes_and_a_column_walk_blocks() -> None:
    assert loop_spread(KernelSource(ROWS)) == LANES
    assert loop_spread(KernelSource(COLUMNS)) == BLOCKS
    # both kernels in one file: the loads disagree, the retrieval's order stands
    assert loop_spread(KernelSource(ROWS + COLUMNS)) is None


def test_a_vector_every_thread_reads_says_nothing() -> None:
    # gemv: the matrix row is the thread's own run (lanes); the vector is read at one
    # address by every thread, which favors neither
    gemv = KernelSource.from_file(REPO / "heldout" / "gemv" / "kernel.cu")
    assert loop_spread(gemv) == LANES
    elementwise = KernelSource.from_file(REPO / "heldout" / "gelu" / "kernel.cu")
    assert loop_spread(elementwise) is None


def test_rivals_swap_places_and_nothing_else_moves() -> None:
    ranked = ["vectorized_access", "block_per_row", "pragma_unroll", "warp_per_row", "split_k"]
    rivals = {"block_per_row", "warp_per_row", "split_k"}
    closed = {m: rivals - {m} for m in rivals}
    columns = spread_first(ranked, str, closed, KernelSource(COLUMNS))
    assert columns == [
        "vectorized_access",
        "split_k",
        "pragma_unroll",
        "block_per_row",
        "warp_per_row",
    ]
    assert spread_first(ranked, str, closed, KernelSource(ROWS)) == ranked
    # a split that does not close the rows' sites is no rival: nothing to reorder
    apart = {"block_per_row": {"warp_per_row"}, "warp_per_row": {"block_per_row"}}
    assert spread_first(ranked, str, apart, KernelSource(COLUMNS)) == ranked


OUTER_PRODUCT = """
__global__ void matmul(const float* a, const float* b, float* c, int m, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  int row = i / n;
  int col = i - row * n;
  float acc = 0.f;
  for (int p = 0; p < k; ++p) acc += a[row * k + p] * b[p * n + col];
  c[i] = acc;
}
"""
TRANSPOSED_READ = """
__global__ void flip(const float* x, float* y, int rows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  int c = i / rows;
  int r = i - c * rows;
  y[i] = x[r * cols + c];
}
"""
ELEMENTWISE = """
__global__ void scale(const float* x, float* y, float s, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = s * x[i];
}
"""


def test_reused_and_strided_loads_call_for_staging_and_a_row_walk_does_not() -> None:
    # a: one address across the lanes, b: contiguous across them, both walked by p
    assert calls_for_staging(KernelSource(OUTER_PRODUCT)) == REUSED
    # consecutive lanes read elements `cols` apart, outside any loop
    assert calls_for_staging(KernelSource(TRANSPOSED_READ)) == STRIDED
    assert calls_for_staging(KernelSource(ELEMENTWISE)) is None
    # a thread's own row: strided across lanes too, but inside the loop a layout spreads
    assert calls_for_staging(KernelSource(ROWS)) is None
    assert calls_for_staging(KernelSource(COLUMNS)) is None


def test_staging_moves_first_only_where_called_for_and_not_when_held_back() -> None:
    ranked = ["vectorized_access", "restrict_pointers", "smem_staging", "launch_bounds"]
    staged = ["smem_staging", "vectorized_access", "restrict_pointers", "launch_bounds"]
    assert stage_first(ranked, str, KernelSource(OUTER_PRODUCT)) == staged
    assert stage_first(ranked, str, KernelSource(TRANSPOSED_READ)) == staged
    assert stage_first(ranked, str, KernelSource(ELEMENTWISE)) == ranked
    held = stage_first(ranked, str, KernelSource(OUTER_PRODUCT), {"smem_staging"})
    assert held == ranked
