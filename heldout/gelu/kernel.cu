// GELU, tanh form, float32: y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
// Naive: one thread per element, scalar loads, 1-D grid of 256-thread blocks.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void gelu_tanh(const float* x, float* y, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float k_beta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float k_kappa = 0.044715f;
  const float inner = k_beta * (v + k_kappa * v * v * v);
  y[i] = 0.5f * v * (1.0f + tanhf(inner));
}

extern "C" int run(const float* x, float* y, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  const int64_t n = tokens * hidden;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  gelu_tanh<<<(unsigned)blocks, 256, 0, stream>>>(x, y, n);
  return (int)cudaGetLastError();
}
