// Row sums, float32: y[r] = sum(x[r, :]).
// Naive: one thread per row walking the row with a float32 accumulator.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void row_sum(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = x + r * cols;
  float acc = 0.0f;
  for (int64_t c = 0; c < cols; ++c) acc += row[c];
  y[r] = acc;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return 0;
  const int64_t blocks = (rows + 255) / 256;
  row_sum<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
