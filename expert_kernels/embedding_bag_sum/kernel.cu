// Embedding bag (sum), bfloat16 table, int64 ids: out[b, :] = sum_j table[ids[b, j], :],
// accumulated in float32 and rounded to bfloat16 once (bags of tokens, n-grams or sparse
// features, as nn.EmbeddingBag(mode="sum") with a fixed bag size).
//
// A gather moves whole table rows, so every access is 16 bytes (8 bf16) of a row:
//   - each thread owns 8 columns of one bag and walks the bag; a block holds threadIdx.x
//     threads across the row (up to 256) and, for short rows, several bags along threadIdx.y,
//     so no lane idles and blocks stay 256 threads wide;
//   - the bag's ids are the same for every thread of the block: read through the read-only
//     cache, once per row per block;
//   - 4 rows are loaded before any is added, so 4 independent 16-byte loads are in flight;
//   - bf16 pairs widen to float2 (8 values per load), the sums stay in registers.
// An id outside [0, vocab) contributes NaN instead of reading out of bounds. Rows whose
// width is not a multiple of 8 (or unaligned pointers) take a one-element-per-thread kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kPerAccess = 8;     // bf16 values in one 16-byte access
constexpr int kInFlight = 4;      // rows loaded before they are added
constexpr int kMaxThreads = 256;

constexpr unsigned kNanPair = 0x7fc07fc0u;  // two bfloat16 quiet NaNs

// 8 columns of one table row, or NaNs for an id outside the table. A bad id reads row 0 and
// discards it, so the load is unconditional and several stay in flight (vocab > 0).
__device__ __forceinline__ uint4 load_chunk(const __nv_bfloat16* __restrict__ table, int64_t id,
                                            int64_t vocab, int64_t hidden, int64_t chunk) {
  const bool valid = id >= 0 && id < vocab;
  const uint4* row = reinterpret_cast<const uint4*>(table + (valid ? id : 0) * hidden);
  const uint4 raw = __ldg(row + chunk);
  return valid ? raw : make_uint4(kNanPair, kNanPair, kNanPair, kNanPair);
}

__device__ __forceinline__ void accumulate(float (&acc)[kPerAccess], uint4 raw) {
  const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pair[i]);
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

// At least 4 blocks per SM, not the 8 a full SM would hold: ptxas then keeps the 4 rows' ids
// and loads in flight together instead of squeezing into 32 registers one row at a time.
__global__ void __launch_bounds__(kMaxThreads, 4)
embedding_bag_rows(const __nv_bfloat16* __restrict__ table, const int64_t* __restrict__ ids,
                   __nv_bfloat16* __restrict__ out, int64_t vocab, int64_t hidden, int64_t bags,
                   int64_t bag) {
  const int64_t b = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;
  const int64_t chunk = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
  if (b >= bags || chunk * kPerAccess >= hidden) return;
  const int64_t* __restrict__ bag_ids = ids + b * bag;

  float acc[kPerAccess];
#pragma unroll
  for (int i = 0; i < kPerAccess; ++i) acc[i] = 0.0f;

  int64_t j = 0;
  for (; j + kInFlight <= bag; j += kInFlight) {
    int64_t row_ids[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) row_ids[u] = __ldg(bag_ids + j + u);
    uint4 rows[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      rows[u] = load_chunk(table, row_ids[u], vocab, hidden, chunk);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) accumulate(acc, rows[u]);
  }
  for (; j < bag; ++j)
    accumulate(acc, load_chunk(table, __ldg(bag_ids + j), vocab, hidden, chunk));

  uint4 result;
  __nv_bfloat162* pair = reinterpret_cast<__nv_bfloat162*>(&result);
#pragma unroll
  for (int i = 0; i < 4; ++i) pair[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  reinterpret_cast<uint4*>(out + b * hidden)[chunk] = result;
}

// Any width: one output element per thread.
__global__ void __launch_bounds__(kMaxThreads)
embedding_bag_elements(const __nv_bfloat16* __restrict__ table,
                       const int64_t* __restrict__ ids, __nv_bfloat16* __restrict__ out,
                       int64_t vocab, int64_t hidden, int64_t bags, int64_t bag) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= bags * hidden) return;
  const int64_t b = i / hidden;
  const int64_t h = i - b * hidden;
  float acc = 0.0f;
  for (int64_t j = 0; j < bag; ++j) {
    const int64_t id = __ldg(ids + b * bag + j);
    acc += id < 0 || id >= vocab ? NAN : __bfloat162float(table[id * hidden + h]);
  }
  out[i] = __float2bfloat16(acc);
}

}  // namespace

extern "C" int run(const __nv_bfloat16* table, const int64_t* ids, __nv_bfloat16* out,
                   int64_t vocab, int64_t hidden, int64_t bags, int64_t bag,
                   cudaStream_t stream) {
  if (bags <= 0 || hidden <= 0) return 0;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  if (vocab > 0 && hidden % kPerAccess == 0 && aligned) {
    const int64_t chunks = hidden / kPerAccess;
    // Threads across the row, and as many bags as fill 256 threads along y.
    const int across = (int)(chunks < kMaxThreads ? chunks : kMaxThreads);
    const int down = kMaxThreads / across;
    const dim3 block(across, down);
    const dim3 grid((unsigned)((bags + down - 1) / down),
                    (unsigned)((chunks + across - 1) / across));
    embedding_bag_rows<<<grid, block, 0, stream>>>(table, ids, out, vocab, hidden, bags, bag);
  } else {
    const int64_t blocks = (bags * hidden + kMaxThreads - 1) / kMaxThreads;
    embedding_bag_elements<<<(unsigned)blocks, kMaxThreads, 0, stream>>>(table, ids, out, vocab,
                                                                         hidden, bags, bag);
  }
  return (int)cudaGetLastError();
}
