// Out-of-place transpose, float32: y[c, r] = x[r, c].
// Naive: one thread per output element (writes coalesced, reads strided by cols).
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void transpose_2d(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t c = i / rows;  // y is [cols, rows]
  const int64_t r = i - c * rows;
  y[i] = x[r * cols + c];
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  transpose_2d<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
