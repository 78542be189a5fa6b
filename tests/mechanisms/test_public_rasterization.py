"""Block orders other than row-major, found by what the block index goes through."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

rasterization = get("rasterization")

# every other slab of block rows walks its column backwards
SERPENTINE = """\
#define TILE 64
__global__ void fill(float* c, int n) {
  const int tile_row = (blockIdx.z & 1) ? (gridDim.y - 1 - blockIdx.y) : blockIdx.y;
  const int tile_col = blockIdx.z * gridDim.x + blockIdx.x;
  c[(tile_row * TILE + threadIdx.y) * n + tile_col * TILE + threadIdx.x] = 1.f;
}
"""

# a persistent kernel whose tiles come from a table, in the order the host wrote it
TABLE = """\
struct TileQueue {
  const int* order;
  int next_slot;
  __device__ TileQueue(const int* table, int block) : order(table + block * 64), next_slot(0) {}
  __device__ bool next(int& tile_m, int& tile_n) {
    int packed = order[next_slot++];
    if (packed < 0) return false;
    tile_m = packed >> 16;
    tile_n = packed & 0xffff;
    return true;
  }
};
__global__ void persistent(const int* table, float* c, int n) {
  TileQueue queue(table, blockIdx.x);
  int tm, tn;
  while (queue.next(tm, tn)) c[(tm * 32 + threadIdx.y) * n + tn * 32 + threadIdx.x] = 0.f;
}
"""

# row-major tiles from a linear block index: no remapping
ROW_MAJOR = """\
__global__ void plain(float* c, int n, int tiles_n) {
  const int tile_m = blockIdx.x / tiles_n;
  const int tile_n = blockIdx.x % tiles_n;
  c[(tile_m * 32 + threadIdx.y) * n + tile_n * 32 + threadIdx.x] = 0.f;
}
"""


def test_a_serpentine_order_is_found_and_removed_to_row_major() -> None:
    (site,) = rasterization.detect(KernelSource(SERPENTINE))
    assert site.start_line == 3 and site.supported and site.detail["form"] == "serpentine"
    removed = rasterization.remove(KernelSource(SERPENTINE), site).text
    assert "const int tile_row = blockIdx.y;" in removed


def test_an_order_read_from_a_table_by_a_scheduler_is_found() -> None:
    (site,) = rasterization.detect(KernelSource(TABLE))
    assert site.snippet == "while (queue.next(tm, tn))"
    assert "a tile order read from a table by the scheduler's next" in str(site.refusal)
    (loop,) = get("grid_stride_loop").detect(KernelSource(TABLE))
    assert "a persistent loop taking work from a scheduler" in str(loop.refusal)


def test_a_row_major_decomposition_is_not_rasterization() -> None:
    assert rasterization.detect(KernelSource(ROW_MAJOR)) == []


def test_a_serpentine_whose_branches_are_not_a_reversal_is_refused() -> None:
    path = PUBLIC_FORMS / "rasterization" / "serpentine.before.cu"
    shifted = KernelSource(
        path.read_text(encoding="utf-8").replace(
            "gridDim.y - blockIdx.y - 1", "gridDim.y - blockIdx.y"
        )
    )
    (site,) = get("rasterization").detect(shifted)
    assert "as a serpentine, it is a block order" in str(site.refusal)
    assert "whose branches are not one walked backwards" in str(site.refusal)
    with pytest.raises(MechanismRefused):
        get("rasterization").remove(shifted, site)
