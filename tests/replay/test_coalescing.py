"""Rival loop layouts raced in the order the target's loads favor (klineage.replay.coalescing)."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.replay.coalescing import BLOCKS, LANES, loop_spread, spread_first
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
