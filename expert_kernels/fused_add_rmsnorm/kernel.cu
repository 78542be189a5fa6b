// Fused residual add + RMSNorm, bfloat16:
//   residual = x + residual        (written back in place)
//   y = residual * rsqrt(mean(residual^2) + eps) * weight
//
// One block per row. Where the row fits (hidden % 8 == 0, hidden <= 16384) every access is
// 16 bytes (8 bf16), the sum x + residual is done as packed bf16x2 adds and stays in
// registers between the two halves of the kernel, so each row is read once and written
// once: 5 passes' worth of bytes in all (x, residual, weight in; residual, y out). The sum of
// squares is a warp-shuffle reduction combined across warps through shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kPerAccess = 8;  // bf16 values in one 16-byte access

union Pack16 {
  uint4 raw;
  __nv_bfloat162 pair[4];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// kVec 16-byte accesses per thread, strided by the block so each warp reads 512 contiguous
// bytes per access.
template <int kThreads, int kVec>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_rows(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ residual,
                 const __nv_bfloat16* __restrict__ weight, float eps,
                 __nv_bfloat16* __restrict__ y, int64_t hidden) {
  __shared__ float scratch[kThreads / 32];
  const int64_t offset = (int64_t)blockIdx.x * hidden;
  const uint4* x16 = reinterpret_cast<const uint4*>(x + offset);
  uint4* r16 = reinterpret_cast<uint4*>(residual + offset);
  const uint4* w16 = reinterpret_cast<const uint4*>(weight);
  uint4* y16 = reinterpret_cast<uint4*>(y + offset);
  const int64_t accesses = hidden / kPerAccess;

  Pack16 row[kVec];  // x + residual for this thread's slice, kept in registers
  Pack16 a[kVec];
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {  // issue every load before the first use
    const int64_t c = threadIdx.x + (int64_t)i * kThreads;
    if (c < accesses) {
      a[i].raw = __ldg(x16 + c);
      row[i].raw = r16[c];
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int64_t c = threadIdx.x + (int64_t)i * kThreads;
    if (c < accesses) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        row[i].pair[j] = __hadd2(a[i].pair[j], row[i].pair[j]);
        const float2 f = __bfloat1622float2(row[i].pair[j]);
        squares += f.x * f.x + f.y * f.y;
      }
      r16[c] = row[i].raw;
    }
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(squares, scratch) / (float)hidden + eps);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int64_t c = threadIdx.x + (int64_t)i * kThreads;
    if (c < accesses) {
      Pack16 w, out;
      w.raw = __ldg(w16 + c);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(row[i].pair[j]);
        const float2 g = __bfloat1622float2(w.pair[j]);
        out.pair[j] = __floats2bfloat162_rn(f.x * inv_rms * g.x, f.y * inv_rms * g.y);
      }
      y16[c] = out.raw;
    }
  }
}

// Any hidden size: scalar accesses, the sum written to residual and read back in pass two.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
add_rmsnorm_rows_scalar(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ residual,
                        const __nv_bfloat16* __restrict__ weight, float eps,
                        __nv_bfloat16* __restrict__ y, int64_t hidden) {
  __shared__ float scratch[kThreads / 32];
  const int64_t offset = (int64_t)blockIdx.x * hidden;
  float squares = 0.0f;
  for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
    const __nv_bfloat16 s = __hadd(x[offset + c], residual[offset + c]);
    residual[offset + c] = s;
    const float f = __bfloat162float(s);
    squares += f * f;
  }
  const float inv_rms = rsqrtf(block_sum<kThreads>(squares, scratch) / (float)hidden + eps);
  for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
    const float f = __bfloat162float(residual[offset + c]);  // this thread wrote it above
    y[offset + c] = __float2bfloat16_rn(f * inv_rms * __bfloat162float(weight[c]));
  }
}

template <int kThreads, int kVec>
void launch_rows(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                 float eps, __nv_bfloat16* y, int64_t tokens, int64_t hidden, cudaStream_t s) {
  add_rmsnorm_rows<kThreads, kVec><<<(unsigned)tokens, kThreads, 0, s>>>(x, residual, weight,
                                                                         eps, y, hidden);
}

}  // namespace

extern "C" int run(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                   float eps, __nv_bfloat16* y, int64_t tokens, int64_t hidden,
                   cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return 0;
  const bool packed = hidden % kPerAccess == 0;
  if (packed && hidden <= 2048) launch_rows<256, 1>(x, residual, weight, eps, y, tokens, hidden, stream);
  else if (packed && hidden <= 4096) launch_rows<256, 2>(x, residual, weight, eps, y, tokens, hidden, stream);
  else if (packed && hidden <= 8192) launch_rows<512, 2>(x, residual, weight, eps, y, tokens, hidden, stream);
  else if (packed && hidden <= 16384) launch_rows<1024, 2>(x, residual, weight, eps, y, tokens, hidden, stream);
  else
    add_rmsnorm_rows_scalar<512><<<(unsigned)tokens, 512, 0, stream>>>(x, residual, weight, eps,
                                                                       y, hidden);
  return (int)cudaGetLastError();
}
