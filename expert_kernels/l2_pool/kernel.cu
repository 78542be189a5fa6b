// L2 pooling of each row, float16 in and out, float32 accumulation:
// y[r] = sqrt(sum_c x[r, c]^2) (lp-pooling with p = 2 over the whole row: per-token or
// per-head feature norms, rows of a few hundred to a few thousand values).
//
// Rows this short are too small for a block and too long for a thread, so each warp owns a
// row:
//   - lanes read 16 bytes (8 halves) each, side by side: a warp reads 512 contiguous bytes
//     per load, and every load of the row is issued before the first is used (the row sits
//     in a register array sized by a template parameter chosen from the row length);
//   - half pairs widen to float2 for the squares; the lane sums meet through warp shuffles,
//     with no shared memory and no barrier;
//   - 8 warps (8 rows) per block.
// Rows whose length is not a multiple of 8, longer than 4096, or unaligned take a warp-per-row
// loop over single halves.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;
constexpr int kPerAccess = 8;                // halves in one 16-byte load
constexpr int kPerWarpLoad = 32 * kPerAccess;  // halves one warp-wide load covers

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float sum_squares(uint4 raw) {
  const __half2* pair = reinterpret_cast<const __half2*>(&raw);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(pair[i]);
    s = fmaf(f.x, f.x, s);
    s = fmaf(f.y, f.y, s);
  }
  return s;
}

// kLoads 16-byte loads per lane: rows up to kLoads * 256 halves; 0: rows of any length, one
// half per lane per step.
template <int kLoads>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
l2_pool_warp_rows(const __half* __restrict__ x, __half* __restrict__ y, int64_t rows,
                  int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  float s = 0.0f;
  if constexpr (kLoads == 0) {
    const __half* __restrict__ row = x + r * cols;
    for (int64_t c = lane; c < cols; c += 32) {
      const float f = __half2float(row[c]);
      s = fmaf(f, f, s);
    }
  } else {
    const uint4* __restrict__ row = reinterpret_cast<const uint4*>(x + r * cols);
    const int64_t vectors = cols / kPerAccess;
    // Slots past the row end re-read its last vector and are left out of the sum: with no
    // condition on the loads, all of them issue before the first is used.
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int64_t c = lane + (int64_t)i * 32;
      v[i] = __ldg(row + (c < vectors ? c : vectors - 1));
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      if (lane + i * 32 < vectors) s += sum_squares(v[i]);
    }
  }
  s = warp_sum(s);
  if (lane == 0) y[r] = __float2half(sqrtf(s));
}

}  // namespace

extern "C" int run(const __half* x, __half* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return 0;
  const unsigned blocks = (unsigned)((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const int threads = kWarpsPerBlock * 32;
  const bool vectors =
      cols > 0 && cols % kPerAccess == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  if (vectors && cols <= 1 * kPerWarpLoad)
    l2_pool_warp_rows<1><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  else if (vectors && cols <= 2 * kPerWarpLoad)
    l2_pool_warp_rows<2><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  else if (vectors && cols <= 4 * kPerWarpLoad)
    l2_pool_warp_rows<4><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  else if (vectors && cols <= 8 * kPerWarpLoad)
    l2_pool_warp_rows<8><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  else if (vectors && cols <= 16 * kPerWarpLoad)
    l2_pool_warp_rows<16><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  else
    l2_pool_warp_rows<0><<<blocks, threads, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
