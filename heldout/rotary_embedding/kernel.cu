// Rotary position embedding, NeoX (rotate-half) style, bfloat16 q, float32 cos/sin tables:
// with x1 = q[t, h, j] and x2 = q[t, h, half + j] (j < half),
//   out[t, h, j]        = x1 * cos[t, j] - x2 * sin[t, j]
//   out[t, h, half + j] = x2 * cos[t, j] + x1 * sin[t, j]
// computed in float32. Naive: one thread per output element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void rotary_neox(const __nv_bfloat16* q, const float* cos, const float* sin,
                            __nv_bfloat16* out, int64_t tokens, int64_t heads, int64_t head_dim,
                            int64_t half_dim) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= tokens * heads * head_dim) return;
  const int64_t d = i % head_dim;
  const int64_t th = i / head_dim;  // t * heads + h
  const int64_t t = th / heads;
  const bool first = d < half_dim;
  const int64_t j = first ? d : d - half_dim;
  const __nv_bfloat16* vec = q + th * head_dim;
  const float x1 = __bfloat162float(vec[j]);
  const float x2 = __bfloat162float(vec[half_dim + j]);
  const float c = cos[t * half_dim + j];
  const float s = sin[t * half_dim + j];
  const float r = first ? x1 * c - x2 * s : x2 * c + x1 * s;
  out[i] = __float2bfloat16(r);
}

extern "C" int run(const __nv_bfloat16* q, const float* cos, const float* sin, __nv_bfloat16* out,
                   int64_t tokens, int64_t heads, int64_t head_dim, int64_t half_dim,
                   cudaStream_t stream) {
  const int64_t n = tokens * heads * head_dim;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  rotary_neox<<<(unsigned)blocks, 256, 0, stream>>>(q, cos, sin, out, tokens, heads, head_dim,
                                                    half_dim);
  return (int)cudaGetLastError();
}
