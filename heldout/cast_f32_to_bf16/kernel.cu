// float32 -> bfloat16 conversion, round to nearest even.
// Naive: one thread per element, scalar loads, 1-D grid of 256-thread blocks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void cast_f32_to_bf16(const float* x, __nv_bfloat16* y, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = __float2bfloat16(x[i]);
}

extern "C" int run(const float* x, __nv_bfloat16* y, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  cast_f32_to_bf16<<<(unsigned)blocks, 256, 0, stream>>>(x, y, n);
  return (int)cudaGetLastError();
}
