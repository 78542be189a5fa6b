// Column maximum, float32: y[c] = max(x[:, c]) over every row (e.g. per-channel activation
// ranges for quantization calibration, or max-pooling over tokens).
//
// A column reduction reads rows that lie cols apart, so the work is laid out for coalescing:
//   - a block of 32 x 8 threads owns 128 columns: each lane reads a float4 of 4 adjacent
//     columns (a warp reads 512 contiguous bytes of one row), the 8 thread rows interleave
//     the rows, 4 loads in flight per thread;
//   - the 8 partial maxima of a column meet in shared memory;
//   - when the columns alone give too few blocks to fill the GPU, the rows are split across
//     blockIdx.y as well, and the splits combine with integer atomics on the float bits
//     (atomicMax for non-negative values, atomicMin on the unsigned bits for negative ones,
//     into an output first filled with 0xFF bytes, below every float under both orders).
// Columns not a multiple of 4 (or an unaligned pointer) take the same kernel one float at a
// time.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kLanes = 32;     // threadIdx.x: one vector of columns each
constexpr int kRowLanes = 8;   // threadIdx.y: rows interleaved
constexpr int kInFlight = 4;   // loads issued before their maxima are taken
constexpr int kBlocksPerSm = 8;  // one full wave of 256-thread blocks
constexpr int kMinRowsPerSplit = 128;

template <int kVec>
struct Pack;  // kVec adjacent columns moved as one access
template <>
struct Pack<4> {
  using type = float4;
};
template <>
struct Pack<1> {
  using type = float;
};

__device__ __forceinline__ float vmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float4 vmax(float4 a, float4 b) {
  return make_float4(fmaxf(a.x, b.x), fmaxf(a.y, b.y), fmaxf(a.z, b.z), fmaxf(a.w, b.w));
}

template <typename T>
__device__ __forceinline__ T lowest();
template <>
__device__ __forceinline__ float lowest<float>() { return -INFINITY; }
template <>
__device__ __forceinline__ float4 lowest<float4>() {
  return make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
}

// Max into a float that other blocks update too; the float's bits order like signed ints
// for non-negative values and like reversed unsigned ints for negative ones.
__device__ __forceinline__ void atomic_max(float* address, float v) {
  if (!signbit(v))
    atomicMax(reinterpret_cast<int*>(address), __float_as_int(v));
  else
    atomicMin(reinterpret_cast<unsigned*>(address), __float_as_uint(v));
}

__device__ __forceinline__ void store_max(float* out, float m, bool shared_output) {
  if (shared_output)
    atomic_max(out, m);
  else
    *out = m;
}

__device__ __forceinline__ void store_max(float* out, float4 m, bool shared_output) {
  if (shared_output) {
    atomic_max(out + 0, m.x);
    atomic_max(out + 1, m.y);
    atomic_max(out + 2, m.z);
    atomic_max(out + 3, m.w);
  } else {
    *reinterpret_cast<float4*>(out) = m;
  }
}

template <int kVec>
__global__ void __launch_bounds__(kLanes * kRowLanes)
column_max_strips(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                  int64_t cols, int64_t rows_per_split) {
  using Vec = typename Pack<kVec>::type;
  __shared__ Vec partial[kRowLanes][kLanes];
  const int64_t vecs = cols / kVec;  // vectors per row
  const int64_t v = (int64_t)blockIdx.x * kLanes + threadIdx.x;
  const int64_t first = (int64_t)blockIdx.y * rows_per_split;
  const int64_t last = first + rows_per_split < rows ? first + rows_per_split : rows;

  Vec m = lowest<Vec>();
  if (v < vecs) {
    const Vec* __restrict__ column = reinterpret_cast<const Vec*>(x) + v;
    int64_t r = first + threadIdx.y;
    for (; r + (kInFlight - 1) * kRowLanes < last; r += kInFlight * kRowLanes) {
      Vec loaded[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) loaded[i] = __ldg(column + (r + i * kRowLanes) * vecs);
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) m = vmax(m, loaded[i]);
    }
    for (; r < last; r += kRowLanes) m = vmax(m, __ldg(column + r * vecs));
  }
  partial[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y != 0 || v >= vecs) return;
#pragma unroll
  for (int i = 1; i < kRowLanes; ++i) m = vmax(m, partial[i][threadIdx.x]);
  store_max(y + v * kVec, m, gridDim.y > 1);
}

int sm_count() {
  static int count = 0;  // one device per process in the harness
  if (count == 0) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
      count = 1;
  }
  return count;
}

template <int kVec>
int launch(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t col_blocks = (cols / kVec + kLanes - 1) / kLanes;
  const int64_t wanted = (int64_t)sm_count() * kBlocksPerSm;
  const int64_t fill = (wanted + col_blocks - 1) / col_blocks;  // splits that fill the GPU
  const int64_t most = (rows + kMinRowsPerSplit - 1) / kMinRowsPerSplit;  // worth the atomics
  int64_t splits = 1;
  if (col_blocks < wanted) splits = fill < most ? fill : most;
  const int64_t rows_per_split = (rows + splits - 1) / splits;  // an empty split adds -inf
  if (splits > 1) {
    const cudaError_t err = cudaMemsetAsync(y, 0xFF, cols * sizeof(float), stream);
    if (err != cudaSuccess) return (int)err;
  }
  const dim3 grid((unsigned)col_blocks, (unsigned)splits);
  column_max_strips<kVec><<<grid, dim3(kLanes, kRowLanes), 0, stream>>>(x, y, rows, cols,
                                                                       rows_per_split);
  return (int)cudaGetLastError();
}

}  // namespace

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols <= 0) return 0;
  if (rows <= 0) return (int)cudaErrorInvalidValue;  // the max of no rows is undefined
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y)) & 15) == 0;
  if (cols % 4 == 0 && aligned) return launch<4>(x, y, rows, cols, stream);
  return launch<1>(x, y, rows, cols, stream);
}
