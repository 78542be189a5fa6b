"""A warp or a block per row, in the spellings public kernels use."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.mechanisms import get

warp_per_row = get("warp_per_row")
block_per_row = get("block_per_row")

# a warp per row in a 32 x y block, packed loads of four floats
WARP_2D = """\
struct alignas(16) F4 { float v[4]; };
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__global__ void row_means(const float* x, float* mean, int rows, int cols) {
  assert(blockDim.x == 32);
  int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float s = 0.f;
  for (int c = threadIdx.x * 4; c < cols; c += 32 * 4) {
    F4 v = *reinterpret_cast<const F4*>(xr + c);
    s += v.v[0] + v.v[1] + v.v[2] + v.v[3];
  }
  s = warp_sum(s);
  if (threadIdx.x == 0) mean[row] = s / cols;
}
"""

# a block per row through cooperative groups, the row from blockIdx.y
BLOCK_CG = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
template <int kThreads>
__global__ void row_dots(const float* a, const float* b, float* out, int cols) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  __shared__ float partial[32];
  const int row = blockIdx.y;
  float s = 0.f;
  for (int c = block.thread_rank(); c < cols; c += kThreads) s += a[row * cols + c] * b[c];
  partial[warp.meta_group_rank()] = cg::reduce(warp, s, cg::plus<float>{});
  block.sync();
  if (warp.meta_group_rank() == 0) {
    s = cg::reduce(warp, warp.thread_rank() < kThreads / 32 ? partial[warp.thread_rank()] : 0.f,
                   cg::plus<float>{});
    if (warp.thread_rank() == 0) out[row] = s;
  }
}
"""

# a thread per row: neither
THREAD_ROWS = """\
__global__ void row_sums(const float* x, float* y, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += x[r * cols + c];
  y[r] = s;
}
"""


def test_a_warp_per_row_in_a_2d_block_is_found_and_refused_with_its_form() -> None:
    (site,) = warp_per_row.detect(KernelSource(WARP_2D))
    assert site.function == "row_means" and site.refusal is not None
    assert site.refusal.startswith("the site is a warp-per-row kernel in another spelling")
    assert "strides by the warp: 128 from 4·threadIdx.x" in site.refusal
    assert "this rule needs the canonical warp-per-row kernel" in site.refusal
    assert block_per_row.detect(KernelSource(WARP_2D)) == []


def test_a_block_per_row_with_cooperative_groups_is_found() -> None:
    (site,) = block_per_row.detect(KernelSource(BLOCK_CG))
    assert site.function == "row_dots"
    assert "strides by the block: kThreads from threadIdx.x" in str(site.refusal)
    assert warp_per_row.detect(KernelSource(BLOCK_CG)) == []


def test_a_thread_per_row_is_neither() -> None:
    kernel = KernelSource(THREAD_ROWS)
    assert warp_per_row.detect(kernel) == [] and block_per_row.detect(kernel) == []
