// Linear layer with a fused bias and ReLU, float32: y = relu(x @ w^T + b), as nn.Linear stores
// its weight: x [m, k] (tokens by in-features), w [n, k] (out-features by in-features), b [n].
//
// SIMT tiling (float32 without TF32, so no tensor cores):
//   - each block owns a 128 x 128 tile of y and walks k in steps of 8;
//   - each of its 256 threads owns an 8 x 8 register micro-tile (two 4-row groups by two
//     4-column groups), placed so that one k step's shared-memory reads are broadcasts or a
//     single 128-byte wavefront: 4 vector reads feed 64 fused multiply-adds;
//   - x and w tiles come in as float4 runs along k and are stored k-major (transposed) in
//     shared memory, each row padded by 4 floats so the transposed stores hit 32 banks;
//   - double buffering: the next k tile is loaded into registers while the current one is
//     multiplied out of shared memory, then stored into the other buffer: one barrier per tile;
//   - epilogue in registers: bias, ReLU, float4 stores.
// The tiled kernel needs k % 4 == 0 and n % 4 == 0 (16-byte rows); other sizes take a plain
// 16 x 16 shared-memory kernel.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kTileM = 128;
constexpr int kTileN = 128;
constexpr int kTileK = 8;
constexpr int kThreads = 256;
constexpr int kPad = 4;  // floats of padding per shared row: keeps float4 alignment
constexpr int kPitch = kTileM + kPad;

// One float4 of a k-contiguous operand row, or zeros past the matrix edge.
__device__ __forceinline__ float4 load_k4(const float* __restrict__ rows, int row, int rows_total,
                                          int col, int k) {
  if (row < rows_total && col < k)
    return __ldg(reinterpret_cast<const float4*>(rows + (int64_t)row * k + col));
  return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

__global__ void __launch_bounds__(kThreads, 2)
linear_relu_tiled(const float* __restrict__ x, const float* __restrict__ w,
                  const float* __restrict__ bias, float* __restrict__ y, int m, int n, int k) {
  __shared__ __align__(16) float xs[2][kTileK][kPitch];
  __shared__ __align__(16) float ws[2][kTileK][kPitch];

  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * kTileM;
  const int n0 = blockIdx.x * kTileN;

  // Loader: 128 rows x 8 k of each operand = 256 float4s, one per thread.
  const int load_row = tid >> 1;
  const int load_col = (tid & 1) * 4;

  // Compute layout: 8 warps as 4 (m) x 2 (n) warp tiles of 32 x 64; lanes as 4 x 8.
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int row_base = (warp & 3) * 32 + (lane >> 3) * 4;  // + {0, 16} + i
  const int col_base = (warp >> 2) * 64 + (lane & 7) * 4;  // + {0, 32} + j

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }

  // The first tile, stored k-major: xs[stage][k][row].
  float4 x_next = load_k4(x, m0 + load_row, m, load_col, k);
  float4 w_next = load_k4(w, n0 + load_row, n, load_col, k);
  xs[0][load_col + 0][load_row] = x_next.x;
  xs[0][load_col + 1][load_row] = x_next.y;
  xs[0][load_col + 2][load_row] = x_next.z;
  xs[0][load_col + 3][load_row] = x_next.w;
  ws[0][load_col + 0][load_row] = w_next.x;
  ws[0][load_col + 1][load_row] = w_next.y;
  ws[0][load_col + 2][load_row] = w_next.z;
  ws[0][load_col + 3][load_row] = w_next.w;
  __syncthreads();

  for (int k0 = 0, stage = 0; k0 < k; k0 += kTileK, stage ^= 1) {
    const bool more = k0 + kTileK < k;
    if (more) {  // in flight while this tile is multiplied
      x_next = load_k4(x, m0 + load_row, m, k0 + kTileK + load_col, k);
      w_next = load_k4(w, n0 + load_row, n, k0 + kTileK + load_col, k);
    }
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[8];
      float b[8];
      const float4 a0 = *reinterpret_cast<const float4*>(&xs[stage][kk][row_base]);
      const float4 a1 = *reinterpret_cast<const float4*>(&xs[stage][kk][row_base + 16]);
      const float4 b0 = *reinterpret_cast<const float4*>(&ws[stage][kk][col_base]);
      const float4 b1 = *reinterpret_cast<const float4*>(&ws[stage][kk][col_base + 32]);
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
      a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
      b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w;
      b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    if (more) {  // the other buffer was last read before the previous barrier
      const int next = stage ^ 1;
      xs[next][load_col + 0][load_row] = x_next.x;
      xs[next][load_col + 1][load_row] = x_next.y;
      xs[next][load_col + 2][load_row] = x_next.z;
      xs[next][load_col + 3][load_row] = x_next.w;
      ws[next][load_col + 0][load_row] = w_next.x;
      ws[next][load_col + 1][load_row] = w_next.y;
      ws[next][load_col + 2][load_row] = w_next.z;
      ws[next][load_col + 3][load_row] = w_next.w;
    }
    __syncthreads();
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int col = n0 + col_base + h * 32;
    if (col >= n) continue;  // n % 4 == 0: the whole float4 is in or out
    const float4 b4 = __ldg(reinterpret_cast<const float4*>(bias + col));
#pragma unroll
    for (int g = 0; g < 2; ++g) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = m0 + row_base + g * 16 + i;
        if (row >= m) continue;
        const float* a = &acc[g * 4 + i][h * 4];
        const float4 out = make_float4(fmaxf(a[0] + b4.x, 0.0f), fmaxf(a[1] + b4.y, 0.0f),
                                       fmaxf(a[2] + b4.z, 0.0f), fmaxf(a[3] + b4.w, 0.0f));
        *reinterpret_cast<float4*>(y + (int64_t)row * n + col) = out;
      }
    }
  }
}

// Any shape: 16 x 16 tiles of x and w in padded shared memory, one output per thread.
constexpr int kPlain = 16;

__global__ void __launch_bounds__(kPlain * kPlain)
linear_relu_plain(const float* __restrict__ x, const float* __restrict__ w,
                  const float* __restrict__ bias, float* __restrict__ y, int m, int n, int k) {
  __shared__ float xs[kPlain][kPlain + 1];
  __shared__ float ws[kPlain][kPlain + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int row = blockIdx.y * kPlain + ty;
  const int col = blockIdx.x * kPlain + tx;
  const int w_row = blockIdx.x * kPlain + ty;  // the w row this thread loads
  float acc = 0.0f;
  for (int k0 = 0; k0 < k; k0 += kPlain) {
    xs[ty][tx] = row < m && k0 + tx < k ? x[(int64_t)row * k + k0 + tx] : 0.0f;
    ws[ty][tx] = w_row < n && k0 + tx < k ? w[(int64_t)w_row * k + k0 + tx] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kPlain; ++kk) acc = fmaf(xs[ty][kk], ws[tx][kk], acc);
    __syncthreads();
  }
  if (row < m && col < n) y[(int64_t)row * n + col] = fmaxf(acc + bias[col], 0.0f);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

extern "C" int run(const float* x, const float* w, const float* b, float* y, int64_t m,
                   int64_t n, int64_t k, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return 0;  // k == 0 is fine: every tile is relu(b)
  const bool vectors = k % 4 == 0 && n % 4 == 0 && aligned16(x) && aligned16(w) &&
                       aligned16(b) && aligned16(y);
  if (vectors) {
    const dim3 grid((unsigned)((n + kTileN - 1) / kTileN), (unsigned)((m + kTileM - 1) / kTileM));
    linear_relu_tiled<<<grid, kThreads, 0, stream>>>(x, w, b, y, (int)m, (int)n, (int)k);
  } else {
    const dim3 grid((unsigned)((n + kPlain - 1) / kPlain), (unsigned)((m + kPlain - 1) / kPlain));
    linear_relu_plain<<<grid, dim3(kPlain, kPlain), 0, stream>>>(x, w, b, y, (int)m, (int)n,
                                                                (int)k);
  }
  return (int)cudaGetLastError();
}
