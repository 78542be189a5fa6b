// SwiGLU gate, bfloat16: y[t, j] = silu(x[t, j]) * x[t, d + j], computed in float32.
// Naive: one thread per output element, scalar loads, 1-D grid of 256-thread blocks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void silu_and_mul(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t tokens,
                             int64_t d, int64_t two_d) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= tokens * d) return;
  const int64_t t = i / d;
  const int64_t j = i - t * d;
  const float gate = __bfloat162float(x[t * two_d + j]);
  const float up = __bfloat162float(x[t * two_d + d + j]);
  const float silu = gate / (1.0f + expf(-gate));
  y[i] = __float2bfloat16(silu * up);
}

extern "C" int run(const __nv_bfloat16* x, __nv_bfloat16* y, int64_t tokens, int64_t d,
                   int64_t two_d, cudaStream_t stream) {
  const int64_t n = tokens * d;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  silu_and_mul<<<(unsigned)blocks, 256, 0, stream>>>(x, y, tokens, d, two_d);
  return (int)cudaGetLastError();
}
