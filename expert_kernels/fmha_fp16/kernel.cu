// Attention forward, float16: O = softmax(Q K^T / sqrt(d)) V, non-causal, fp32 accumulation.
//
// Q, K, V, O are [batch, heads, seq, d] contiguous, d = 64 or 128 (a template parameter).
// FlashAttention-2 structure, on mma.sync m16n8k16 (f16 in, f32 accumulate):
//   - one block of 4 warps per (64 query rows, head, batch); each warp owns 16 query rows;
//   - the Q tile is staged once through shared memory and kept in registers as mma A
//     fragments for the whole key loop;
//   - K and V tiles of 64 keys go through a two-slot ring of 16-byte cp.async copies
//     (zero-filled past seq_k), XOR-swizzled so every ldmatrix phase hits 32 distinct banks;
//   - S = Q K^T per warp (16 x 64) in registers; keys >= seq_k are set to -inf before the row
//     max; the online softmax keeps a running max m and sum l per row and rescales the O
//     accumulators by exp2((m_old - m_new) * scale * log2 e);
//   - the S accumulators of two adjacent n8 tiles are exactly the A fragment of one k16 slice
//     of P, so P is packed to half2 in registers and fed straight into O += P V, whose B
//     fragments come from V (stored [key][d]) by ldmatrix .trans;
//   - the epilogue divides by l and writes half2 (4-byte) stores for rows < seq_q.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kBM = 64;        // query rows per block
constexpr int kBN = 64;        // keys per tile
constexpr int kWarps = 4;      // each owns 16 query rows
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

// ------------------------------------------------------------------ PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; with pred false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The same, each 8x8 matrix transposed on the way: lane l gets column l / 4 of the stored rows.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// d += a * b for one m16n8k16 tile: a is 16x16 row-major (4 regs), b is 16x8 "col" (2 regs).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ------------------------------------------------------------------ shared-memory layout

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][kD] half tile (kD * 2 bytes a
// row, a multiple of 128). The chunk's low 3 bits are XORed with the row's: the 8 rows that
// one ldmatrix phase reads (same logical chunk) fall in 8 different bank groups.
template <int kD>
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return (uint32_t)(row * (kD * 2) + ((chunk ^ (row & 7)) << 4));
}

// Copies rows [row0, row0 + 64) of a [rows][kD] matrix into a swizzled tile at `tile`; rows at
// or past `rows` are zero-filled (and read from `base`, which is always a valid address).
template <int kD>
__device__ __forceinline__ void load_tile(uint32_t tile, const __half* __restrict__ base,
                                          int row0, int rows) {
  constexpr int kChunks = kD / 8;                // 16-byte chunks per row
  constexpr int kRowStep = kThreads / kChunks;   // rows covered by one pass of the block
  const int chunk = threadIdx.x % kChunks;
  const int r = threadIdx.x / kChunks;
#pragma unroll
  for (int i = 0; i < kBN / kRowStep; ++i) {
    const int row = r + i * kRowStep;
    const bool ok = row0 + row < rows;
    const __half* src = ok ? base + (size_t)(row0 + row) * kD + chunk * 8 : base;
    cp_async_16(tile + swizzle<kD>(row, chunk), src, ok);
  }
}

// ------------------------------------------------------------------ the kernel

template <int kD>
__global__ void __launch_bounds__(kThreads, kD == 128 ? 2 : 4)
    fmha_fwd(const __half* __restrict__ q, const __half* __restrict__ k,
             const __half* __restrict__ v, __half* __restrict__ o, int seq_q, int seq_k,
             float scale_log2) {
  constexpr int kTileBytes = kBN * kD * 2;  // one K or V tile; the Q tile is the same size
  constexpr int kDK = kD / 16;              // k16 slices of d (S = Q K^T)
  constexpr int kDN = kD / 8;               // n8 tiles of d (O)
  constexpr int kSN = kBN / 8;              // n8 tiles of keys (S)
  static_assert(kBM == kBN, "the Q tile borrows the layout of a K tile");

  extern __shared__ __align__(128) unsigned char smem[];
  // slot s: K tile at s * 2 * kTileBytes, V tile right after it. Q is staged in slot 1's K
  // tile before the loop starts (slot 1 is first written by the copies of key tile 1).
  const uint32_t base = smem_addr(smem);
  const uint32_t q_tile = base + 2 * kTileBytes;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;  // mma group: rows g and g + 8 of the warp's 16
  const int t = lane & 3;   // thread in group: columns 2t, 2t + 1 of each n8 tile

  const size_t head = (size_t)blockIdx.z * gridDim.y + blockIdx.y;
  const int q0 = blockIdx.x * kBM;
  const __half* qh = q + head * (size_t)seq_q * kD;
  const __half* kh = k + head * (size_t)seq_k * kD;
  const __half* vh = v + head * (size_t)seq_k * kD;
  __half* oh = o + head * (size_t)seq_q * kD;

  const int n_tiles = (seq_k + kBN - 1) / kBN;

  load_tile<kD>(q_tile, qh, q0, seq_q);
  if (n_tiles > 0) {
    load_tile<kD>(base, kh, 0, seq_k);
    load_tile<kD>(base + kTileBytes, vh, 0, seq_k);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // Q fragments: A of S = Q K^T, slice kk covers d in [16 kk, 16 kk + 16). Lanes 0-15 give
  // rows 0-15 at chunk 2 kk, lanes 16-31 the same rows at chunk 2 kk + 1.
  uint32_t qf[kDK][4];
  {
    const int row = warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < kDK; ++kk)
      ldmatrix_x4(qf[kk], q_tile + swizzle<kD>(row, kk * 2 + (lane >> 4)));
  }
  __syncthreads();  // every warp has its Q before slot 1 is overwritten

  float acc[kDN][4];
#pragma unroll
  for (int j = 0; j < kDN; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (raw scores) of rows g, g + 8
  float l0 = 0.0f, l1 = 0.0f;            // this lane's share of the running sums

  // Lane roles for the K and V fragments (fixed over the loop).
  const int k_row = (lane & 7) + ((lane >> 4) << 3);  // key within a 16-key pair of n8 tiles
  const int k_chunk = (lane >> 3) & 1;                // which 8 of the 16 d of a k16 slice
  const int v_row = lane & 15;                        // key within a k16 slice of P
  const int v_chunk = lane >> 4;                      // which n8 tile of a pair of d tiles

  for (int it = 0; it < n_tiles; ++it) {
    const int slot = it & 1;
    cp_async_wait_all();  // this thread's copies of tile it (none left on the first pass)
    __syncthreads();      // everyone's copies landed; nobody still reads the other slot
    if (it + 1 < n_tiles) {
      const uint32_t next = base + (slot ^ 1) * 2 * kTileBytes;
      load_tile<kD>(next, kh, (it + 1) * kBN, seq_k);
      load_tile<kD>(next + kTileBytes, vh, (it + 1) * kBN, seq_k);
    }
    cp_async_commit();

    const uint32_t k_tile = base + slot * 2 * kTileBytes;
    const uint32_t v_tile = k_tile + kTileBytes;

    // S = Q K^T: 16 rows x 64 keys for this warp.
    float s[kSN][4];
#pragma unroll
    for (int j = 0; j < kSN; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kDK; ++kk) {
#pragma unroll
      for (int np = 0; np < kSN / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + swizzle<kD>(np * 16 + k_row, kk * 2 + k_chunk));
        mma_f16_16816(s[2 * np], qf[kk], b[0], b[1]);
        mma_f16_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }

    // Keys past seq_k (only in the last tile) count as -inf, before the row max.
    const int k0 = it * kBN;
    if (k0 + kBN > seq_k) {
#pragma unroll
      for (int j = 0; j < kSN; ++j) {
        const int key = k0 + j * 8 + 2 * t;
        if (key >= seq_k) s[j][0] = s[j][2] = -INFINITY;
        if (key + 1 >= seq_k) s[j][1] = s[j][3] = -INFINITY;
      }
    }

    // Online softmax: the row's 64 scores are spread over the 4 lanes of a quad.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < kSN; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Scaled maxima; a row with no valid key yet keeps 0 so that -inf - -inf never occurs.
    const float ms0 = mx0 == -INFINITY ? 0.0f : mx0 * scale_log2;
    const float ms1 = mx1 == -INFINITY ? 0.0f : mx1 * scale_log2;
    // Rescale factors of what was accumulated so far: 0 on the first tile (m = -inf).
    const float alpha0 = exp2f(m0 * scale_log2 - ms0);
    const float alpha1 = exp2f(m1 * scale_log2 - ms1);

    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kSN; ++j) {
      s[j][0] = exp2f(fmaf(s[j][0], scale_log2, -ms0));
      s[j][1] = exp2f(fmaf(s[j][1], scale_log2, -ms0));
      s[j][2] = exp2f(fmaf(s[j][2], scale_log2, -ms1));
      s[j][3] = exp2f(fmaf(s[j][3], scale_log2, -ms1));
      sum0 += s[j][0] + s[j][1];
      sum1 += s[j][2] + s[j][3];
    }
    l0 = l0 * exp2f(m0 * scale_log2 - ms0) + sum0;  // = alpha0 (the same expression)
    l1 = l1 * exp2f(m1 * scale_log2 - ms1) + sum1;
    m0 = mx0;
    m1 = mx1;
#pragma unroll
    for (int j = 0; j < kDN; ++j) {
      acc[j][0] *= alpha0;
      acc[j][1] *= alpha0;
      acc[j][2] *= alpha1;
      acc[j][3] *= alpha1;
    }

    // O += P V. The C fragments of n8 tiles 2 kk and 2 kk + 1 of S are the A fragment of k16
    // slice kk of P: (g, 2t..), (g + 8, 2t..), (g, 8 + 2t..), (g + 8, 8 + 2t..).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]),
                              pack_half2(s[2 * kk][2], s[2 * kk][3]),
                              pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDN / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + swizzle<kD>(kk * 16 + v_row, dp * 2 + v_chunk));
        mma_f16_16816(acc[2 * dp], pa, b[0], b[1]);
        mma_f16_16816(acc[2 * dp + 1], pa, b[2], b[3]);
      }
    }
  }
  cp_async_wait_all();

  // Epilogue: the full row sums, then O / l as half2 stores.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = 1.0f / l0;
  const float inv1 = 1.0f / l1;
  const int row0 = q0 + warp * 16 + g;
  const int row1 = row0 + 8;
#pragma unroll
  for (int j = 0; j < kDN; ++j) {
    const int col = j * 8 + 2 * t;
    if (row0 < seq_q)
      *reinterpret_cast<__half2*>(oh + (size_t)row0 * kD + col) =
          __floats2half2_rn(acc[j][0] * inv0, acc[j][1] * inv0);
    if (row1 < seq_q)
      *reinterpret_cast<__half2*>(oh + (size_t)row1 * kD + col) =
          __floats2half2_rn(acc[j][2] * inv1, acc[j][3] * inv1);
  }
}

template <int kD>
int launch(const __half* q, const __half* k, const __half* v, __half* o, int64_t batch,
           int64_t heads, int64_t seq_q, int64_t seq_k, cudaStream_t stream) {
  constexpr int kSmem = 4 * kBN * kD * 2;  // two slots of (K, V) tiles: 64 KB at d = 128
  cudaError_t err = cudaFuncSetAttribute(fmha_fwd<kD>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((unsigned)((seq_q + kBM - 1) / kBM), (unsigned)heads, (unsigned)batch);
  const float scale_log2 = kLog2e / sqrtf((float)kD);
  fmha_fwd<kD><<<grid, kThreads, kSmem, stream>>>(q, k, v, o, (int)seq_q, (int)seq_k,
                                                   scale_log2);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" int run(const __half* q, const __half* k, const __half* v, __half* o, int64_t batch,
                   int64_t heads, int64_t seq_q, int64_t seq_k, int64_t head_dim,
                   cudaStream_t stream) {
  if (batch < 0 || heads < 0 || seq_q < 0 || seq_k < 0) return (int)cudaErrorInvalidValue;
  if (batch == 0 || heads == 0 || seq_q == 0) return (int)cudaSuccess;
  if (seq_q > INT32_MAX - kBM || seq_k > INT32_MAX - kBN || heads > 65535 || batch > 65535 ||
      (seq_q + kBM - 1) / kBM > INT32_MAX)
    return (int)cudaErrorInvalidValue;
  if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15) return (int)cudaErrorInvalidValue;
  if (head_dim == 128) return launch<128>(q, k, v, o, batch, heads, seq_q, seq_k, stream);
  if (head_dim == 64) return launch<64>(q, k, v, o, batch, heads, seq_q, seq_k, stream);
  return (int)cudaErrorInvalidValue;
}
