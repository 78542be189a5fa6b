// Row log-softmax, float32: y[r, c] = x[r, c] - max - log(sum(exp(x[r, :] - max))).
// Naive: one thread per row, three passes over the row (max, sum of exp, write).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void log_softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* in = x + r * cols;
  float* out = y + r * cols;
  float m = -INFINITY;
  for (int64_t c = 0; c < cols; ++c) m = fmaxf(m, in[c]);
  float s = 0.0f;
  for (int64_t c = 0; c < cols; ++c) s += expf(in[c] - m);
  const float log_s = logf(s);
  for (int64_t c = 0; c < cols; ++c) out[c] = (in[c] - m) - log_s;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows <= 0) return 0;
  const int64_t blocks = (rows + 255) / 256;
  log_softmax_rows<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
