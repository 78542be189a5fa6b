// Bias add + ReLU, float16: y[r, c] = relu(x[r, c] + bias[c]), the sum rounded to float16 once.
// Naive: one thread per element, scalar loads, 1-D grid of 256-thread blocks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void bias_relu(const __half* x, const __half* bias, __half* y, int64_t rows,
                          int64_t cols) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t c = i % cols;
  // Add in float32 and round once, as PyTorch's float16 add does; rounding keeps the sign, so
  // relu before or after it gives the same value.
  const float s = __half2float(x[i]) + __half2float(bias[c]);
  y[i] = __float2half(s > 0.0f ? s : 0.0f);
}

extern "C" int run(const __half* x, const __half* bias, __half* y, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  bias_relu<<<(unsigned)blocks, 256, 0, stream>>>(x, bias, y, rows, cols);
  return (int)cudaGetLastError();
}
