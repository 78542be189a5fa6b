// gemm_bf16_nt: C[M,N] = A[M,K] @ B[N,K]^T, bf16 in, fp32 accumulation, bf16 out (sm_90a).
// Three paths, chosen in run() by shape:
//   M > 16   128x256 block tiles over two warpgroups, each issuing wgmma.mma_async m64n256k16
//            with A and B read by the tensor cores from shared memory through 128-byte-swizzle
//            matrix descriptors; a 4-slot cp.async ring (prefetch distance 2) feeds them; the
//            XOR of the 16-byte chunk index with (row & 7) over 128-byte rows is the hardware
//            swizzle once each tile starts on a 1024-byte boundary; grouped rasterization for
//            L2 reuse; K split over blocks (fp32 workspace + a reduction) when tiles are few
//   M <= 16  B streamed from global memory straight into mma.sync m16n8k16 fragments
//   K % 8    a simple correct fallback for shapes the 16-byte paths cannot load
// The klineage build stage compiles wgmma sources for sm_90a automatically. The earlier
// mma.sync version of the tiled path is kept in bench/gemm_variants/mma_sync.cu.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

using bf16 = __nv_bfloat16;

// ------------------------------------------------------------------ PTX wrappers

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; with pred false nothing is read and the 16 bytes are zeroed.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  {  /* klineage:cp_async_pipeline: asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory"); */
    // cp.async made synchronous: the same bytes land in shared memory now (zero past
    // the bytes read), so the wait_group that orders them has nothing left to wait for.
    uint4* kl_dst = static_cast<uint4*>(__cvta_shared_to_generic((size_t)(dst)));
    const uint4* kl_src = (const uint4*)(src);
    const int kl_read = (int)(src_bytes);
    if (kl_read >= 16) {
      {
        const uint4 packed = make_uint4(reinterpret_cast<const unsigned int*>(kl_src)[0],
                                        reinterpret_cast<const unsigned int*>(kl_src)[1],
                                        reinterpret_cast<const unsigned int*>(kl_src)[2],
                                        reinterpret_cast<const unsigned int*>(kl_src)[3]);
        unsigned int* elems = reinterpret_cast<unsigned int*>(kl_dst);
        elems[0] = packed.x;
        elems[1] = packed.y;
        elems[2] = packed.z;
        elems[3] = packed.w;
      }
    } else {
      for (int kl_j = 0; kl_j < 16; ++kl_j)
        reinterpret_cast<unsigned char*>(kl_dst)[kl_j] =
            kl_j < kl_read ? reinterpret_cast<const unsigned char*>(kl_src)[kl_j] : 0;
    }
  }
}

__device__ __forceinline__ void cp_async_commit() {
  { /* klineage:cp_async_pipeline: asm volatile("cp.async.commit_group;\n" ::: "memory"); */ ; }
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  { /* klineage:cp_async_pipeline: asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); */ ; }
}

// d += a * b for one m16n8k16 tile: a is 16x16 row-major (4 regs), b is 16x8 "col" (2 regs).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
  {  /* klineage:tensor_core_mma: asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1)); */
    // m16n8k16 on the FMA pipes (PTX ISA fragment layout): lane 4 * g + t holds A
    // rows g, g + 8 at k 2t, 2t + 1 (regs 0, 1) and 2t + 8, 2t + 9 (regs 2, 3), B
    // column g at those k (regs 0, 1), C and D rows g, g + 8 at columns 2t, 2t + 1.
    const unsigned kl_a[4] = {a0, a1, a2, a3};
    const unsigned kl_b[2] = {b0, b1};
    float kl_d[4] = {d[0], d[1], d[2], d[3]};
    const int kl_lane = (int)(((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) & 31u);
    const int kl_g = kl_lane >> 2;
    const int kl_t = kl_lane & 3;
    for (int kl_s = 0; kl_s < 4; ++kl_s) {  // lane 4 * g + kl_s holds k 2 * kl_s, +1
      for (int kl_h = 0; kl_h < 2; ++kl_h) {  // k 0..7, then k 8..15
        const unsigned kl_a_lo = __shfl_sync(0xffffffffu, kl_a[2 * kl_h], 4 * kl_g + kl_s);
        const unsigned kl_a_hi = __shfl_sync(0xffffffffu, kl_a[2 * kl_h + 1], 4 * kl_g + kl_s);
        const unsigned kl_b_0 = __shfl_sync(0xffffffffu, kl_b[kl_h], 8 * kl_t + kl_s);
        const unsigned kl_b_1 = __shfl_sync(0xffffffffu, kl_b[kl_h], 8 * kl_t + 4 + kl_s);
        const float kl_x0 = __uint_as_float((kl_a_lo) << 16), kl_x1 = __uint_as_float((kl_a_lo) & 0xffff0000u);  // A row g
        const float kl_y0 = __uint_as_float((kl_a_hi) << 16), kl_y1 = __uint_as_float((kl_a_hi) & 0xffff0000u);  // A row g + 8
        const float kl_p0 = __uint_as_float((kl_b_0) << 16), kl_p1 = __uint_as_float((kl_b_0) & 0xffff0000u);  // B column 2t
        const float kl_q0 = __uint_as_float((kl_b_1) << 16), kl_q1 = __uint_as_float((kl_b_1) & 0xffff0000u);  // B column 2t + 1
        kl_d[0] += kl_x0 * kl_p0 + kl_x1 * kl_p1;
        kl_d[1] += kl_x0 * kl_q0 + kl_x1 * kl_q1;
        kl_d[2] += kl_y0 * kl_p0 + kl_y1 * kl_p1;
        kl_d[3] += kl_y0 * kl_q0 + kl_y1 * kl_q1;
      }
    }
    d[0] = kl_d[0];
    d[1] = kl_d[1];
    d[2] = kl_d[2];
    d[3] = kl_d[3];
  }
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __halves2bfloat162(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
  return *reinterpret_cast<uint32_t*>(&v);
}

// ------------------------------------------------------------------ WGMMA wrappers

// Shared-memory matrix descriptor of a K-major tile with 128-byte rows and the 128-byte
// swizzle: start address, leading-byte offset (unused for swizzled K-major; 16 bytes),
// stride-byte offset 1024 (from one 8-row group to the next), swizzle mode 1 (128B).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
  uint64_t desc = (uint64_t)((addr & 0x3FFFF) >> 4);
  desc |= (uint64_t)(128 >> 4) << 16;
  desc |= (uint64_t)(1024 >> 4) << 32;
  desc |= (uint64_t)0 << 62;
  return desc;
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d[64x256 fp32, this warpgroup] += A[64x16] * B[256x16]^T, both K-major in shared memory.
// Register i of a thread (warp w4 of the group, lane 4g + t) holds row 16 w4 + g + 8 ((i/2)%2),
// column 8 (i/4) + 2t + (i%2).
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a,
                                                 uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
      "%120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
        "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
        "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
        "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
        "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
        "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
        "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
        "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
        "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
        "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b));
}

// ------------------------------------------------------------------ tiled path (M > 16)

constexpr int kBM = 128;  // block tile rows (of A and C)
constexpr int kBN = 256;  // block tile columns (rows of B)
constexpr int kBK = 64;   // k per stage: one 128-byte row of 8 16-byte chunks per tile row
constexpr int kStages = 4;
constexpr int kThreads = 256;  // 2 warpgroups, each 64 rows x 256 columns
constexpr int kAStageBytes = kBM * kBK * 2;
constexpr int kBStageBytes = kBN * kBK * 2;
constexpr int kStageBytes = kAStageBytes + kBStageBytes;
constexpr int kTiledSmem = kStages * kStageBytes + 1024;  // + room to align to 1024
constexpr int kCPitch = kBN * 2;  // staged C row: 512 bytes + 16 of padding
constexpr int kGroupM = 8;             // tile-rows per rasterization group
static_assert(kBM * kCPitch <= kStages * kStageBytes,
              "the C tile must fit in the pipeline's memory");

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` of a [rows][64] bf16 tile. The
// chunk index is XORed with the row's low 3 bits: the 8 rows an ldmatrix phase reads (same
// logical chunk, 8 consecutive rows) land in 8 different chunks, i.e. all 32 banks once.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  return (uint32_t)((row >> 3) * 1024 + chunk * 128 + (row & 7) * 16);
}

// Where one thread's cp.async copies of a stage come from and go to. Thread (row0, chunk) =
// (tid / 8, tid % 8) copies chunk `chunk` of tile rows row0 + 32 i: 4 rows of A, 8 of B.
// Adding 32 to a row keeps its low 3 bits, so every copy of a thread has the same swizzled
// chunk and the shared-memory offsets are row0's plus constants.
struct StageLoader {
  const bf16* a;  // A[m0 + row0][chunk * 8]; the next rows are row_step further
  const bf16* b;  // B[n0 + row0][chunk * 8]
  size_t row_step;  // 32 rows of A or B: 32 * K elements
  int a_rows;  // how many of this thread's 4 A rows are inside M
  int b_rows;  // how many of its 8 B rows are inside N
  int k;  // chunk * 8: this thread's first k within a stage
  uint32_t dst;  // swizzled offset of (row0, chunk) within a tile
};

__device__ __forceinline__ StageLoader make_loader(const bf16* A, const bf16* B, int M, int N,
                                                   int K, int m0, int n0) {
  StageLoader l;
  const int chunk = threadIdx.x & 7;
  const int row0 = threadIdx.x >> 3;  // 0..31
  l.a = A + (size_t)(m0 + row0) * K + chunk * 8;
  l.b = B + (size_t)(n0 + row0) * K + chunk * 8;
  l.row_step = (size_t)32 * K;
  l.a_rows = min(max((M - m0 - row0 + 31) / 32, 0), kBM / 32);
  l.b_rows = min(max((N - n0 - row0 + 31) / 32, 0), kBN / 32);
  l.k = chunk * 8;
  l.dst = swizzle(row0, chunk);
  return l;
}

// Copies k-tile `kt` (k = kt * 64 ...) into the stage at `stage_base`: 16 bytes per cp.async,
// 4 + 8 per thread. Chunks outside the matrix are zero-filled (K % 8 == 0, so a chunk is
// either wholly inside or wholly outside) and read from the matrix base instead.
__device__ __forceinline__ void load_stage(const StageLoader& l, uint32_t stage_base,
                                           const bf16* __restrict__ A,
                                           const bf16* __restrict__ B, int K, int kt) {
  const int k0 = kt * kBK;
  const bool k_ok = k0 + l.k < K;
  const uint32_t dst = stage_base + l.dst;
  for (int i = 0; i < kBM / 32; ++i) {
    const bool ok = k_ok && i < l.a_rows;
    const bf16* src = ok ? l.a + i * l.row_step + k0 : A;
    cp_async_16(dst + i * 32 * (kBK * 2), src, ok);
  }
  for (int i = 0; i < kBN / 32; ++i) {
    const bool ok = k_ok && i < l.b_rows;
    const bf16* src = ok ? l.b + i * l.row_step + k0 : B;
    cp_async_16(dst + kAStageBytes + i * 32 * (kBK * 2), src, ok);
  }
}

// grid.x: output tiles (rasterized), grid.y: K splits. With kSplit the fp32 partial tile of
// split blockIdx.y goes to W[blockIdx.y][M][ldw]; otherwise the bf16 tile goes to C.
template <bool kSplit>
__global__ void
gemm_tiled(const bf16* A, const bf16* B, bf16* C,
           float* W, int M, int N, int K, int ldw, int kt_per_split) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The 128-byte swizzle is a function of address bits 4-9: tiles must start on 1024 bytes.
  unsigned char* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wg = warp >> 2;  // warpgroup: rows 64 wg .. 64 wg + 63 of the tile
  const int w4 = warp & 3;   // warp within the warpgroup: 16 of those rows

  // Rasterization: consecutive blocks walk down a group of kGroupM tile-rows before moving
  // to the next tile-column, so the blocks in flight share A rows and B columns in L2.
  const int tiles_m = (M + kBM - 1) / kBM;
  const int tiles_n = (N + kBN - 1) / kBN;
  const int group_width = 1 /* klineage:rasterization kGroupM */ * tiles_n;
  const int group = (int)blockIdx.x / group_width;
  const int first_m = group * 1 /* klineage:rasterization kGroupM */;
  const int group_rows = min(tiles_m - first_m, 1 /* klineage:rasterization kGroupM */);
  const int in_group = (int)blockIdx.x - group * group_width;
  const int m0 = (first_m + in_group % group_rows) * kBM;
  const int n0 = (in_group / group_rows) * kBN;

  const int kt_total = (K + kBK - 1) / kBK;
  const int kt_begin = (int)blockIdx.y * kt_per_split;
  const int k_tiles = max(min(kt_per_split, kt_total - kt_begin), 0);

  const uint32_t smem_base = smem_addr(smem);
  const StageLoader loader = make_loader(A, B, M, N, K, m0, n0);

  // Prologue: k-tiles 0 and 1 in flight, one commit group each (empty or not).
  constexpr int kAhead = kStages - 2;
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles)
      load_stage(loader, smem_base + s * kStageBytes, A, B, K, kt_begin + s);
    cp_async_commit();
  }

  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;

  for (int it = 0; it < k_tiles; ++it) {
    cp_async_wait<kAhead - 1>();  // this thread's copies of k-tile `it` have landed
    fence_proxy_async();          // ... and are visible to the tensor cores' (async) reads
    __syncthreads();              // everyone's; and every warpgroup's wgmma of it-2 is done
    {
      const int next = it + kAhead;  // the slot k-tile it-2 used
      if (next < k_tiles)
        load_stage(loader, smem_base + (next % kStages) * kStageBytes, A, B, K,
                   kt_begin + next);
      cp_async_commit();
    }
    const uint32_t a_base = smem_base + (it % kStages) * kStageBytes + wg * 64 * (kBK * 2);
    const uint32_t b_base = smem_base + (it % kStages) * kStageBytes + kAStageBytes;
    wgmma_fence();
    for (int ks = 0; ks < kBK / 16; ++ks)  // k16 = 32 bytes further along the 128-byte rows
      wgmma_m64n256k16(d, smem_desc(a_base + ks * 256), smem_desc(b_base + ks * 256));
    wgmma_commit();
    wgmma_wait<1>();  // the group of k-tile it-1 is done: its slot may be refilled next time
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's memory is free for the epilogue

  const int g = lane >> 2;
  const int t = lane & 3;
  const int r_base = wg * 64 + w4 * 16 + g;  // tile row of d[4j], d[4j+1]; +8 for d[4j+2..3]
  if constexpr (kSplit) {
    float* w = W + (size_t)blockIdx.y * (size_t)M * (size_t)ldw;
    const int row = m0 + r_base;
    for (int j = 0; j < kBN / 8; ++j) {
      const int col = n0 + j * 8 + 2 * t;
      if (col < N) {  // col + 1 < ldw always (ldw is N rounded up to 8)
        if (row < M)
          {
            const float2 packed = make_float2(d[4 * j], d[4 * j + 1]);
            float* elems = reinterpret_cast<float*>(reinterpret_cast<float2*>(w + (size_t)row * ldw + col));
            elems[0] = packed.x;
            elems[1] = packed.y;
          }
        if (row + 8 < M)
          {
            const float2 packed2 = make_float2(d[4 * j + 2], d[4 * j + 3]);
            float* elems2 = reinterpret_cast<float*>(reinterpret_cast<float2*>(w + (size_t)(row + 8) * ldw + col));
            elems2[0] = packed2.x;
            elems2[1] = packed2.y;
          }
      }
    }
  } else {
    for (int j = 0; j < kBN / 8; ++j) {
      const int cc = j * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(smem + r_base * kCPitch + cc * 2) =
          pack_bf16x2(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<uint32_t*>(smem + (r_base + 8) * kCPitch + cc * 2) =
          pack_bf16x2(d[4 * j + 2], d[4 * j + 3]);
    }
    __syncthreads();
    const bool vec_ok = ((N & 7) == 0) && ((reinterpret_cast<uintptr_t>(C) & 15) == 0);
    constexpr int kChunksPerRow = kBN / 8;
    for (int i = threadIdx.x; i < kBM * kChunksPerRow; i += kThreads) {
      const int r = i / kChunksPerRow;
      const int ch = i % kChunksPerRow;
      const int row = m0 + r;
      const int col = n0 + ch * 8;
      if (row < M && col < N) {
        const uint4 v = make_uint4(reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(smem + r * kCPitch + ch * 16))[0],
                                   reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(smem + r * kCPitch + ch * 16))[1],
                                   reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(smem + r * kCPitch + ch * 16))[2],
                                   reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(smem + r * kCPitch + ch * 16))[3]);
        bf16* dst = C + (size_t)row * N + col;
        if (vec_ok) {
          {
            const uint4 packed3 = v;
            unsigned int* elems3 = reinterpret_cast<unsigned int*>(reinterpret_cast<uint4*>(dst));
            elems3[0] = packed3.x;
            elems3[1] = packed3.y;
            elems3[2] = packed3.z;
            elems3[3] = packed3.w;
          }
        } else {
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
          for (int j = 0; j < 8; ++j)
            if (col + j < N) {
              const unsigned short bits = (unsigned short)(words[j >> 1] >> ((j & 1) * 16));
              dst[j] = __ushort_as_bfloat16(bits);
            }
        }
      }
    }
  }
}

// ------------------------------------------------------------------ skinny path (M <= 16)

constexpr int kSkWarps = 8;  // warps of a block, splitting the block's K range
constexpr int kSkThreads = kSkWarps * 32;
constexpr int kSkNT = 4;  // n8 tiles per warp: a block covers 32 columns
constexpr int kSkCols = kSkNT * 8;
constexpr int kSkUnroll = 4;  // k32 steps whose loads are in flight together

__device__ __forceinline__ uint4 load_keep(const bf16* p) {  // A: reused by every block
  return make_uint4(reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(p))[0],
                    reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(p))[1],
                    reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(p))[2],
                    reinterpret_cast<const unsigned int*>(reinterpret_cast<const uint4*>(p))[3]);
}

__device__ __forceinline__ uint4 load_stream(const bf16* p) {  // B: read once
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

// A k32 step for lane (g, t) = (lane / 4, lane % 4): it loads the 8 consecutive k values
// [8t, 8t+8) of A rows g and g+8 and of B row n0 + 8j + g. The MMA's own k order has lane t
// holding k {2t, 2t+1, 2t+8, 2t+9}; feeding it registers (x, y) and then (z, w) maps those
// to k {8t..8t+3} and {8t+4..8t+7}. A and B go through the same map, so each product pairs
// equal k and the dot product is unchanged.
//
// grid.x: 32-column slices of N, grid.y: K splits (kSplit: fp32 partials to W).
template <bool kSplit>
__global__ void
gemm_skinny(const bf16* A, const bf16* B, bf16* C,
            float* W, int M, int N, int K, int ldw, int steps_per_split) {
  __shared__ float partial[kSkWarps][kSkNT * 4][32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = (int)blockIdx.x * kSkCols;

  const int steps_total = (K + 31) / 32;
  const int split_begin = (int)blockIdx.y * steps_per_split;
  const int split_end = min(split_begin + steps_per_split, steps_total);
  const int per_warp = (max(split_end - split_begin, 0) + kSkWarps - 1) / kSkWarps;
  const int begin = split_begin + warp * per_warp;
  const int end = min(begin + per_warp, split_end);

  const bf16* a0 = A + (size_t)(g < M ? g : 0) * K + t * 8;
  const bf16* a1 = A + (size_t)(g + 8 < M ? g + 8 : 0) * K + t * 8;
  const bf16* bp[kSkNT];
  for (int j = 0; j < kSkNT; ++j) {
    const int n = n0 + j * 8 + g;
    bp[j] = B + (size_t)(n < N ? n : 0) * K + t * 8;
  }

  float acc[kSkNT][4];
  for (int j = 0; j < kSkNT; ++j) {
    for (int r = 0; r < 4; ++r) acc[j][r] = 0.0f;
  }

  // Main loop: kSkUnroll whole k32 steps, every load issued before the first MMA. The loads
  // are unpredicated: rows past M or N were clamped to row 0 above, and they only feed
  // output rows or columns that are never stored.
  int s = begin;
  for (; s + kSkUnroll <= end && (s + kSkUnroll) * 32 <= K; s += kSkUnroll) {
    uint4 av[kSkUnroll][2];
    uint4 bv[kSkUnroll][kSkNT];
    for (int u = 0; u < kSkUnroll; ++u) {
      const int k = (s + u) * 32;
      av[u][0] = load_keep(a0 + k);
      av[u][1] = load_keep(a1 + k);
      for (int j = 0; j < kSkNT; ++j) bv[u][j] = load_stream(bp[j] + k);
    }
    for (int u = 0; u < kSkUnroll; ++u) {
      for (int j = 0; j < kSkNT; ++j) {
        mma_bf16_16816(acc[j], av[u][0].x, av[u][1].x, av[u][0].y, av[u][1].y, bv[u][j].x,
                       bv[u][j].y);
        mma_bf16_16816(acc[j], av[u][0].z, av[u][1].z, av[u][0].w, av[u][1].w, bv[u][j].z,
                       bv[u][j].w);
      }
    }
  }
  // Remainder: one step at a time; the 16-byte chunks past K read nothing and count as zero.
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  for (; s < end; ++s) {
    const int k = s * 32;
    const bool k_ok = k + t * 8 < K;
    const uint4 av0 = k_ok ? load_keep(a0 + k) : zero;
    const uint4 av1 = k_ok ? load_keep(a1 + k) : zero;
    for (int j = 0; j < kSkNT; ++j) {
      const uint4 bv = k_ok ? load_stream(bp[j] + k) : zero;
      mma_bf16_16816(acc[j], av0.x, av1.x, av0.y, av1.y, bv.x, bv.y);
      mma_bf16_16816(acc[j], av0.z, av1.z, av0.w, av1.w, bv.z, bv.w);
    }
  }

  // Sum the 8 warps' accumulators through shared memory; one thread per output value.
  for (int j = 0; j < kSkNT; ++j) {
    for (int r = 0; r < 4; ++r) partial[warp][j * 4 + r][lane] = acc[j][r];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < kSkNT * 4 * 32; o += kSkThreads) {
    const int jr = o >> 5;
    const int ln = o & 31;
    float sum = 0.0f;
    for (int w = 0; w < kSkWarps; ++w) sum += partial[w][jr][ln];
    const int row = (ln >> 2) + ((jr & 3) >= 2 ? 8 : 0);
    const int col = n0 + (jr >> 2) * 8 + (ln & 3) * 2 + (jr & 1);
    if (row < M && col < N) {
      if constexpr (kSplit)
        W[((size_t)blockIdx.y * M + row) * ldw + col] = sum;
      else
        C[(size_t)row * N + col] = __float2bfloat16_rn(sum);
    }
  }
}

// ------------------------------------------------------------------ split-K reduction

// C[row, col..col+7] = sum over splits of W[s][row][col..col+7]; ldw % 8 == 0.
__global__ void
splitk_reduce(const float* W, bf16* C, int M, int N, int ldw,
              int splits) {
  const int chunks_per_row = ldw / 8;
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)M * chunks_per_row) return;
  const int row = (int)(idx / chunks_per_row);
  const int col = (int)(idx % chunks_per_row) * 8;
  if (col >= N) return;
  float sum[8];
  for (int j = 0; j < 8; ++j) sum[j] = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float4* p = reinterpret_cast<const float4*>(W + ((size_t)s * M + row) * ldw + col);
    const float4 lo = __ldcs(p);
    const float4 hi = __ldcs(p + 1);
    sum[0] += lo.x, sum[1] += lo.y, sum[2] += lo.z, sum[3] += lo.w;
    sum[4] += hi.x, sum[5] += hi.y, sum[6] += hi.z, sum[7] += hi.w;
  }
  bf16* dst = C + (size_t)row * N + col;
  if (((N & 7) == 0) && ((reinterpret_cast<uintptr_t>(C) & 15) == 0)) {
    uint4 v;
    v.x = pack_bf16x2(sum[0], sum[1]);
    v.y = pack_bf16x2(sum[2], sum[3]);
    v.z = pack_bf16x2(sum[4], sum[5]);
    v.w = pack_bf16x2(sum[6], sum[7]);
    {
      const uint4 packed = v;
      unsigned int* elems = reinterpret_cast<unsigned int*>(reinterpret_cast<uint4*>(dst));
      elems[0] = packed.x;
      elems[1] = packed.y;
      elems[2] = packed.z;
      elems[3] = packed.w;
    }
  } else {
    for (int j = 0; j < 8; ++j)
      if (col + j < N) dst[j] = __float2bfloat16_rn(sum[j]);
  }
}

// ------------------------------------------------------------------ generic fallback

__global__ void gemm_generic(const bf16* A, const bf16* B,
                             bf16* C, int64_t M, int64_t N, int64_t K) {
  const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= N) return;
  const bf16* b = B + col * K;
  for (int64_t row = blockIdx.y; row < M; row += gridDim.y) {
    const bf16* a = A + row * K;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += __bfloat162float(a[k]) * __bfloat162float(b[k]);
    C[row * N + col] = __float2bfloat16_rn(sum);
  }
}

// ------------------------------------------------------------------ host side

constexpr int kMaxDevices = 64;

int sm_count(int device) {
  static int cached[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return 132;
  if (cached[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        n <= 0)
      n = 132;
    cached[device] = n;
  }
  return cached[device];
}

// A float32 workspace for split-K partials, kept across calls and grown when a call needs
// more. cudaFree synchronizes the device, so an old buffer is never freed under a kernel
// that still reads it.
float* workspace(int device, size_t bytes) {
  static float* buffers[kMaxDevices] = {};
  static size_t sizes[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (sizes[device] < bytes) {
    if (buffers[device] != nullptr) cudaFree(buffers[device]);
    buffers[device] = nullptr;
    sizes[device] = 0;
    const size_t rounded = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
    if (cudaMalloc(&buffers[device], rounded) != cudaSuccess) {
      buffers[device] = nullptr;
      return nullptr;
    }
    sizes[device] = rounded;
  }
  return buffers[device];
}

// The tiled kernel needs more than 48 KB of dynamic shared memory: raise its limit once per
// instantiation and device.
template <bool kSplit>
cudaError_t prepare_tiled(int device) {
  static bool done[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && done[device]) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(
      gemm_tiled<kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize, kTiledSmem);
  if (err == cudaSuccess && device >= 0 && device < kMaxDevices) done[device] = true;
  return err;
}

int ceil_div(int64_t a, int64_t b) { return (int)((a + b - 1) / b); }

cudaError_t launch_reduce(const float* W, bf16* C, int M, int N, int ldw, int splits,
                          cudaStream_t stream) {
  const int64_t threads = (int64_t)M * (ldw / 8);
  splitk_reduce<<<ceil_div(threads, 256), 256, 0, stream>>>(W, C, M, N, ldw, splits);
  return cudaGetLastError();
}

}  // namespace

extern "C" int run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int64_t M,
                   int64_t N, int64_t K, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return (int)cudaGetLastError();
  if (K <= 0) {  // an empty sum: C = 0
    cudaMemsetAsync(C, 0, (size_t)M * N * sizeof(bf16), stream);
    return (int)cudaGetLastError();
  }
  const bool aligned = (K % 8 == 0) && ((reinterpret_cast<uintptr_t>(A) & 15) == 0) &&
                       ((reinterpret_cast<uintptr_t>(B) & 15) == 0);
  const bool fits_int = M < (1 << 30) && N < (1 << 30) && K < (1 << 30);
  if (!aligned || !fits_int) {
    const unsigned rows = (unsigned)(M < 65535 ? M : 65535);
    gemm_generic<<<dim3(ceil_div(N, 128), rows), 128, 0, stream>>>(A, B, C, M, N, K);
    return (int)cudaGetLastError();
  }

  int device = 0;
  cudaGetDevice(&device);
  const int sms = sm_count(device);
  const int m = (int)M, n = (int)N, k = (int)K;
  const int ldw = (n + 7) & ~7;  // workspace row pitch: 32-byte aligned rows

  // Tiled: split K across blocks only when the tiles alone leave SMs idle.
  const int tiles = ceil_div(m, kBM) * ceil_div(n, kBN);
  const int kt_total = ceil_div(k, kBK);
  int splits = 1;
  splits = max(splits, 1);
  const int per_split = ceil_div(kt_total, splits);
  splits = ceil_div(kt_total, per_split);
  if (splits == 1) {
    cudaError_t err = prepare_tiled<false>(device);
    if (err != cudaSuccess) return (int)err;
    gemm_tiled<false><<<dim3(tiles, 1), kThreads, kTiledSmem, stream>>>(A, B, C, nullptr, m, n,
                                                                        k, ldw, per_split);
    return (int)cudaGetLastError();
  }
  cudaError_t err = prepare_tiled<true>(device);
  if (err != cudaSuccess) return (int)err;
  float* W = workspace(device, (size_t)splits * m * ldw * sizeof(float));
  if (W == nullptr) return (int)cudaErrorMemoryAllocation;
  gemm_tiled<true><<<dim3(tiles, splits), kThreads, kTiledSmem, stream>>>(A, B, C, W, m, n, k,
                                                                         ldw, per_split);
  err = cudaGetLastError();
  if (err != cudaSuccess) return (int)err;
  return (int)launch_reduce(W, C, m, n, ldw, splits, stream);
}
