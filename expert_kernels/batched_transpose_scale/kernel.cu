// Batched transpose with a scale, float32: y[b, c, r] = scale * x[b, r, c]
// (x [batch, rows, cols] -> y [batch, cols, rows]), e.g. scaled keys laid out for a
// k-major attention product, or a per-head weight re-layout.
//
// Tiled through shared memory so both the reads and the writes are coalesced:
//   - a block of 32 x 8 threads moves one 64 x 64 tile; each thread 16 elements (2 columns
//     32 apart, 8 rows 8 apart), so 16 independent loads are in flight per thread before the
//     barrier: enough bytes in flight to keep HBM3e busy at 8 blocks per SM;
//   - the tile's rows are padded to 65 floats: a warp reading a tile column touches 32
//     different banks instead of one;
//   - the scale is applied on the way into shared memory; blockIdx.z is the batch.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kTile = 64;
constexpr int kWarpWidth = 32;  // threads across the tile; each does kTile / kWarpWidth columns
constexpr int kBlockRows = 8;   // threads along the tile's rows; each does kTile / kBlockRows

__global__ void __launch_bounds__(kWarpWidth * kBlockRows)
transpose_scale_tiles(const float* __restrict__ x, float* __restrict__ y, float scale,
                      int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t plane = (int64_t)blockIdx.z * rows * cols;
  const float* __restrict__ src = x + plane;
  float* __restrict__ dst = y + plane;
  const int64_t r0 = (int64_t)blockIdx.y * kTile;
  const int64_t c0 = (int64_t)blockIdx.x * kTile;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;

  // Read: a warp reads 32 consecutive columns of one row. Every load is issued before the
  // first store to shared memory, so all 16 are in flight together.
  constexpr int kRowSteps = kTile / kBlockRows;
  constexpr int kColSteps = kTile / kWarpWidth;
  float v[kRowSteps][kColSteps];
#pragma unroll
  for (int j = 0; j < kRowSteps; ++j) {
#pragma unroll
    for (int i = 0; i < kColSteps; ++i) {
      const int64_t r = r0 + ty + j * kBlockRows;
      const int64_t c = c0 + tx + i * kWarpWidth;
      v[j][i] = r < rows && c < cols ? __ldg(src + r * cols + c) : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kRowSteps; ++j) {
#pragma unroll
    for (int i = 0; i < kColSteps; ++i)
      tile[ty + j * kBlockRows][tx + i * kWarpWidth] = v[j][i] * scale;
  }
  __syncthreads();

  // Write: a warp writes 32 consecutive rows of one column of x, a row of y.
#pragma unroll
  for (int j = 0; j < kTile; j += kBlockRows) {
#pragma unroll
    for (int i = 0; i < kTile; i += kWarpWidth) {
      const int64_t c = c0 + ty + j;
      const int64_t r = r0 + tx + i;
      if (c < cols && r < rows) dst[c * rows + r] = tile[tx + i][ty + j];
    }
  }
}

}  // namespace

extern "C" int run(const float* x, float scale, float* y, int64_t batch, int64_t rows,
                   int64_t cols, cudaStream_t stream) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return 0;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t col_tiles = (cols + kTile - 1) / kTile;
  if (batch > 65535 || row_tiles > 65535 || col_tiles > 0x7fffffff)
    return (int)cudaErrorInvalidConfiguration;
  const dim3 grid((unsigned)col_tiles, (unsigned)row_tiles, (unsigned)batch);
  transpose_scale_tiles<<<grid, dim3(kWarpWidth, kBlockRows), 0, stream>>>(x, y, scale, rows, cols);
  return (int)cudaGetLastError();
}
