// Row softmax, float32: y[r, :] = softmax(x[r, :]).
// One block per row; warp-shuffle reductions combined through shared memory.
// A correct starting point for the gate; the expert version is tracked in its own issue.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Reduces v across the block; every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* scratch) {
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

__global__ void __launch_bounds__(kThreads)
softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float scratch[kWarps];
  const float* row_in = x + blockIdx.x * cols;
  float* row_out = y + blockIdx.x * cols;

  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = fmaxf(m, row_in[c]);
  m = block_reduce<true>(m, scratch);

  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) s += expf(row_in[c] - m);
  s = block_reduce<false>(s, scratch);

  const float inv = 1.0f / s;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) row_out[c] = expf(row_in[c] - m) * inv;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return 0;
  softmax_rows<<<(unsigned)rows, kThreads, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
