// Column sums, float32: y[c] = sum(x[:, c]).
// Naive: one thread per column walking down the rows with a float32 accumulator.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void column_sum(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
  y[c] = acc;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols <= 0) return 0;
  const int64_t blocks = (cols + 255) / 256;
  column_sum<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
