// LayerNorm, bfloat16 in and out, float32 statistics, eps 1e-5:
// y = (x - mean) / sqrt(var + eps) * weight + bias, var biased (divided by hidden).
// Naive: one thread per row, three passes over the row (mean, variance, write).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void layernorm_rows(const __nv_bfloat16* x, const __nv_bfloat16* weight,
                               const __nv_bfloat16* bias, __nv_bfloat16* y, int64_t tokens,
                               int64_t hidden) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= tokens) return;
  const __nv_bfloat16* in = x + r * hidden;
  __nv_bfloat16* out = y + r * hidden;
  float sum = 0.0f;
  for (int64_t c = 0; c < hidden; ++c) sum += __bfloat162float(in[c]);
  const float mean = sum / (float)hidden;
  float sq = 0.0f;
  for (int64_t c = 0; c < hidden; ++c) {
    const float d = __bfloat162float(in[c]) - mean;
    sq += d * d;
  }
  const float var = sq / (float)hidden;
  const float inv_std = 1.0f / sqrtf(var + 1e-5f);
  for (int64_t c = 0; c < hidden; ++c) {
    const float norm = (__bfloat162float(in[c]) - mean) * inv_std;
    out[c] = __float2bfloat16(norm * __bfloat162float(weight[c]) + __bfloat162float(bias[c]));
  }
}

extern "C" int run(const __nv_bfloat16* x, const __nv_bfloat16* weight, const __nv_bfloat16* bias,
                   __nv_bfloat16* y, int64_t tokens, int64_t hidden, cudaStream_t stream) {
  if (tokens <= 0) return 0;
  const int64_t blocks = (tokens + 255) / 256;
  layernorm_rows<<<(unsigned)blocks, 256, 0, stream>>>(x, weight, bias, y, tokens, hidden);
  return (int)cudaGetLastError();
}
