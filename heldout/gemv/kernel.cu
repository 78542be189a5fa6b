// Matrix-vector product, bfloat16 in and out, float32 accumulation: y[i] = sum_j A[i, j] * x[j].
// Naive: one thread per output row walking the row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void gemv(const __nv_bfloat16* A, const __nv_bfloat16* x, __nv_bfloat16* y, int64_t m,
                     int64_t k) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m) return;
  const __nv_bfloat16* a = A + row * k;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) acc += __bfloat162float(a[j]) * __bfloat162float(x[j]);
  y[row] = __float2bfloat16(acc);
}

extern "C" int run(const __nv_bfloat16* A, const __nv_bfloat16* x, __nv_bfloat16* y, int64_t m,
                   int64_t k, cudaStream_t stream) {
  if (m <= 0) return 0;
  const int64_t blocks = (m + 255) / 256;
  gemv<<<(unsigned)blocks, 256, 0, stream>>>(A, x, y, m, k);
  return (int)cudaGetLastError();
}
