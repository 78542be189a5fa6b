// Row L2 normalization, float32: y = x / max(sqrt(sum(x^2)), 1e-12).
// Naive: one thread per row, two passes over the row (sum of squares, write).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void l2_normalize_rows(const float* x, float* y, int64_t rows, int64_t dim) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* in = x + r * dim;
  float* out = y + r * dim;
  float sq = 0.0f;
  for (int64_t c = 0; c < dim; ++c) sq += in[c] * in[c];
  const float denom = fmaxf(sqrtf(sq), 1e-12f);
  for (int64_t c = 0; c < dim; ++c) out[c] = in[c] / denom;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows <= 0) return 0;
  const int64_t blocks = (rows + 255) / 256;
  l2_normalize_rows<<<(unsigned)blocks, 256, 0, stream>>>(x, y, rows, dim);
  return (int)cudaGetLastError();
}
