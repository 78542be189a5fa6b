// Row softmax, float32: y[r, :] = softmax(x[r, :]), for rows of any length.
//
// The row is read from memory once and written once wherever it fits in registers:
//   cols <= 1024, cols % 4 == 0   one warp per row, float4 loads, warp-shuffle reductions
//   cols <= 32768, cols % 4 == 0  one block per row, float4 loads, warp + block reductions
//   otherwise                     one block per row, online (single-pass) max and sum, then
//                                 a second pass that writes (float4 when aligned)
// Exponentials use the fast hardware path (__expf): its error (~1e-6 relative for the
// arguments softmax produces) is far inside float32's 1e-4 tolerance.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Block-wide reduction through one float per warp in shared memory; every thread gets it.
template <int kThreads, bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = lane < kWarps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
  r = kMax ? warp_max(r) : warp_sum(r);
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

// ---- rows held in registers ---------------------------------------------------------------

// Each thread holds kVec float4s of the row, strided by the group size so a warp's loads are
// contiguous 512-byte runs. Slots past the row end hold -inf (they add exp(-inf) = 0).
template <int kVec>
__device__ __forceinline__ void load_row(const float4* __restrict__ row, int64_t n4, int first,
                                         int stride, float4 (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int64_t c = first + (int64_t)i * stride;
    v[i] = c < n4 ? __ldg(row + c) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  }
}

template <int kVec>
__device__ __forceinline__ float local_max(const float4 (&v)[kVec]) {
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kVec; ++i) m = fmaxf(m, fmaxf(fmaxf(v[i].x, v[i].y), fmaxf(v[i].z, v[i].w)));
  return m;
}

// Replaces each value by exp(value - m) and returns their sum.
template <int kVec>
__device__ __forceinline__ float exp_and_sum(float4 (&v)[kVec], float m) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    v[i].x = __expf(v[i].x - m);
    v[i].y = __expf(v[i].y - m);
    v[i].z = __expf(v[i].z - m);
    v[i].w = __expf(v[i].w - m);
    s += (v[i].x + v[i].y) + (v[i].z + v[i].w);
  }
  return s;
}

template <int kVec>
__device__ __forceinline__ void store_row(float4* __restrict__ row, int64_t n4, int first,
                                          int stride, const float4 (&v)[kVec], float inv) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const int64_t c = first + (int64_t)i * stride;
    if (c < n4) row[c] = make_float4(v[i].x * inv, v[i].y * inv, v[i].z * inv, v[i].w * inv);
  }
}

// One warp per row: no shared memory, no block barrier.
template <int kVec, int kWarpsPerBlock>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
softmax_warp_rows(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                  int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t n4 = cols / 4;
  float4 v[kVec];
  load_row<kVec>(reinterpret_cast<const float4*>(x + r * cols), n4, lane, 32, v);
  const float m = warp_max(local_max<kVec>(v));
  const float s = warp_sum(exp_and_sum<kVec>(v, m));
  store_row<kVec>(reinterpret_cast<float4*>(y + r * cols), n4, lane, 32, v, 1.0f / s);
}

// One block per row, the row in registers across the block.
template <int kThreads, int kVec>
__global__ void __launch_bounds__(kThreads)
softmax_block_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  const int64_t n4 = cols / 4;
  float4 v[kVec];
  load_row<kVec>(reinterpret_cast<const float4*>(x + r * cols), n4, threadIdx.x, kThreads, v);
  const float m = block_reduce<kThreads, true>(local_max<kVec>(v), scratch);
  const float s = block_reduce<kThreads, false>(exp_and_sum<kVec>(v, m), scratch);
  store_row<kVec>(reinterpret_cast<float4*>(y + r * cols), n4, threadIdx.x, kThreads, v,
                  1.0f / s);
}

// ---- rows too long (or misaligned) for registers: online softmax -------------------------

// Running (max, sum of exp(x - max)) pair; merging rescales the smaller side.
struct MaxSum {
  float m;
  float s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ MaxSum push(MaxSum a, float value) {
  if (value <= a.m) return {a.m, value == -INFINITY ? a.s : a.s + __expf(value - a.m)};
  return {value, a.s * __expf(a.m - value) + 1.0f};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum a) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    MaxSum b{__shfl_xor_sync(kFullMask, a.m, offset), __shfl_xor_sync(kFullMask, a.s, offset)};
    a = merge(a, b);
  }
  return a;
}

template <int kThreads, bool kAligned>
__global__ void __launch_bounds__(kThreads)
softmax_online_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ MaxSum scratch[kThreads / 32];
  const float* row_in = x + (int64_t)blockIdx.x * cols;
  float* row_out = y + (int64_t)blockIdx.x * cols;
  MaxSum acc{-INFINITY, 0.0f};
  if (kAligned) {
    const float4* in4 = reinterpret_cast<const float4*>(row_in);
    for (int64_t c = threadIdx.x; c < cols / 4; c += kThreads) {
      const float4 v = __ldg(in4 + c);
      acc = push(push(push(push(acc, v.x), v.y), v.z), v.w);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) acc = push(acc, __ldg(row_in + c));
  }
  acc = warp_merge(acc);
  const int lane = threadIdx.x & 31;
  if (lane == 0) scratch[threadIdx.x >> 5] = acc;
  __syncthreads();
  acc = lane < kThreads / 32 ? scratch[lane] : MaxSum{-INFINITY, 0.0f};
  acc = warp_merge(acc);
  const float m = acc.m;
  const float inv = 1.0f / acc.s;
  if (kAligned) {
    const float4* in4 = reinterpret_cast<const float4*>(row_in);
    float4* out4 = reinterpret_cast<float4*>(row_out);
    for (int64_t c = threadIdx.x; c < cols / 4; c += kThreads) {
      const float4 v = __ldg(in4 + c);
      out4[c] = make_float4(__expf(v.x - m) * inv, __expf(v.y - m) * inv,
                            __expf(v.z - m) * inv, __expf(v.w - m) * inv);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads)
      row_out[c] = __expf(__ldg(row_in + c) - m) * inv;
  }
}

// ---- launch-size choice by row length -----------------------------------------------------

template <int kVec>
void launch_warp_rows(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  constexpr int kWarps = 4;
  const unsigned blocks = (unsigned)((rows + kWarps - 1) / kWarps);
  softmax_warp_rows<kVec, kWarps><<<blocks, kWarps * 32, 0, s>>>(x, y, rows, cols);
}

template <int kThreads, int kVec>
void launch_block_rows(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  softmax_block_rows<kThreads, kVec><<<(unsigned)rows, kThreads, 0, s>>>(x, y, cols);
}

}  // namespace

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  const bool aligned = cols % 4 == 0;
  if (aligned && cols <= 128) launch_warp_rows<1>(x, y, rows, cols, stream);
  else if (aligned && cols <= 256) launch_warp_rows<2>(x, y, rows, cols, stream);
  else if (aligned && cols <= 512) launch_warp_rows<4>(x, y, rows, cols, stream);
  else if (aligned && cols <= 1024) launch_warp_rows<8>(x, y, rows, cols, stream);
  else if (aligned && cols <= 2048) launch_block_rows<256, 2>(x, y, rows, cols, stream);
  else if (aligned && cols <= 4096) launch_block_rows<256, 4>(x, y, rows, cols, stream);
  else if (aligned && cols <= 8192) launch_block_rows<512, 4>(x, y, rows, cols, stream);
  else if (aligned && cols <= 16384) launch_block_rows<1024, 4>(x, y, rows, cols, stream);
  else if (aligned && cols <= 32768) launch_block_rows<1024, 8>(x, y, rows, cols, stream);
  else if (aligned) softmax_online_rows<512, true><<<(unsigned)rows, 512, 0, stream>>>(x, y, cols);
  else softmax_online_rows<512, false><<<(unsigned)rows, 512, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
