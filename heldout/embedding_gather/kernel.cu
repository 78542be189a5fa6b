// Embedding lookup, bfloat16 table, int64 ids: out[t, h] = table[ids[t], h].
// Naive: one thread per output element. An id outside [0, vocab) gives NaN, never a read out of
// bounds.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

__global__ void embedding_gather(const __nv_bfloat16* table, const int64_t* ids,
                                 __nv_bfloat16* out, int64_t vocab, int64_t hidden,
                                 int64_t tokens) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden;
  const int64_t h = i - t * hidden;
  const int64_t id = ids[t];
  if (id < 0 || id >= vocab) {
    out[i] = __float2bfloat16(NAN);
    return;
  }
  out[i] = table[id * hidden + h];
}

extern "C" int run(const __nv_bfloat16* table, const int64_t* ids, __nv_bfloat16* out,
                   int64_t vocab, int64_t hidden, int64_t tokens, cudaStream_t stream) {
  const int64_t n = tokens * hidden;
  if (n <= 0) return 0;
  const int64_t blocks = (n + 255) / 256;
  embedding_gather<<<(unsigned)blocks, 256, 0, stream>>>(table, ids, out, vocab, hidden, tokens);
  return (int)cudaGetLastError();
}
