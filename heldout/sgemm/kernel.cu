// float32 matrix product C = A @ B; A [m, k], B [k, n], C [m, n], all row-major.
// Naive: one thread per element of C looping over k with a float32 accumulator.
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void sgemm(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  const int64_t row = i / n;
  const int64_t col = i - row * n;
  float acc = 0.0f;
  for (int64_t p = 0; p < k; ++p) acc += A[row * k + p] * B[p * n + col];
  C[i] = acc;
}

extern "C" int run(const float* A, const float* B, float* C, int64_t m, int64_t n, int64_t k,
                   cudaStream_t stream) {
  const int64_t total = m * n;
  if (total <= 0) return 0;
  const int64_t blocks = (total + 255) / 256;
  sgemm<<<(unsigned)blocks, 256, 0, stream>>>(A, B, C, m, n, k);
  return (int)cudaGetLastError();
}
