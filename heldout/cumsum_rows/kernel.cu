// Inclusive prefix sum along each row, float32: y[r, j] = sum(x[r, :j + 1]).
// Naive: one thread per row with a float32 running sum.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void cumsum_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* in = x + r * cols;
  float* out = y + r * cols;
  float acc = 0.0f;
  for (int64_t c = 0; c < cols; ++c) {
    acc += in[c];
    out[c] = acc;
  }
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return 0;
  const int64_t blocks = (rows + 255) / 256;
  cumsum_rows<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
