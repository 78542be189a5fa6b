// Batched float16 matrix product with float32 accumulation: c[i] = a[i] @ b[i];
// a [batch, m, k], b [batch, k, n], c [batch, m, n], all row-major.
// Naive: one thread per element of c looping over k.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void batched_hgemm(const __half* a, const __half* b, __half* c, int64_t batch,
                              int64_t m, int64_t n, int64_t k) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= batch * m * n) return;
  const int64_t bi = i / (m * n);
  const int64_t rest = i - bi * m * n;
  const int64_t row = rest / n;
  const int64_t col = rest - row * n;
  const __half* a_row = a + (bi * m + row) * k;
  const __half* b_col = b + bi * k * n + col;
  float acc = 0.0f;
  for (int64_t p = 0; p < k; ++p) acc += __half2float(a_row[p]) * __half2float(b_col[p * n]);
  c[i] = __float2half(acc);
}

extern "C" int run(const __half* a, const __half* b, __half* c, int64_t batch, int64_t m,
                   int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t total = batch * m * n;
  if (total <= 0) return 0;
  const int64_t blocks = (total + 255) / 256;
  batched_hgemm<<<(unsigned)blocks, 256, 0, stream>>>(a, b, c, batch, m, n, k);
  return (int)cudaGetLastError();
}
