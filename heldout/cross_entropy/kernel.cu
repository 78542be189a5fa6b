// Per-token cross-entropy, float32 logits, int64 targets:
// loss[t] = max + log(sum(exp(logits[t, :] - max))) - logits[t, targets[t]].
// Naive: one thread per token, two passes over its row (max, sum of exp).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void cross_entropy_rows(const float* logits, const int64_t* targets, float* loss,
                                   int64_t tokens, int64_t vocab) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* row = logits + t * vocab;
  const int64_t target = targets[t];
  if (target < 0 || target >= vocab) {  // no out-of-bounds read for a bad id
    loss[t] = NAN;
    return;
  }
  float m = -INFINITY;
  for (int64_t c = 0; c < vocab; ++c) m = fmaxf(m, row[c]);
  float s = 0.0f;
  for (int64_t c = 0; c < vocab; ++c) s += expf(row[c] - m);
  loss[t] = (m + logf(s)) - row[target];
}

extern "C" int run(const float* logits, const int64_t* targets, float* loss, int64_t tokens,
                   int64_t vocab, cudaStream_t stream) {
  if (tokens <= 0) return 0;
  const int64_t blocks = (tokens + 255) / 256;
  cross_entropy_rows<<<(unsigned)blocks, 256, 0, stream>>>(logits, targets, loss, tokens, vocab);
  return (int)cudaGetLastError();
}
