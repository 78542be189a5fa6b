// Dropout applied with a given mask, bfloat16: y = mask ? x * scale : 0, scale = 1 / (1 - p).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

// The element rule, shared by the vector body and the scalar paths.
__device__ __forceinline__ __nv_bfloat16 dropped(__nv_bfloat16 v, bool keep, float scale) {
  return __float2bfloat16(keep ? __bfloat162float(v) * scale : 0.0f);
}

// 8 elements a vector: one 16-byte load of x, one 8-byte load of the mask, one 16-byte store;
// 4 vectors a thread, a block apart, so each warp still reads contiguous 512-byte runs while a
// thread keeps 4 independent loads in flight.
__global__ void __launch_bounds__(256)
    dropout_apply_vec8(const __nv_bfloat16* __restrict__ x, const bool* __restrict__ mask,
                       float scale, __nv_bfloat16* __restrict__ y, int64_t vectors) {
  const int64_t i_first = (int64_t)blockIdx.x * blockDim.x * 4 + threadIdx.x;
  #pragma unroll
  for (int i_step = 0; i_step < 4; ++i_step) {
    const int64_t i = i_first + (int64_t)i_step * blockDim.x;
    if (i >= vectors) return;
    const uint4 x_vec = reinterpret_cast<const uint4*>(x)[i];
    const uint2 keep_vec = reinterpret_cast<const uint2*>(mask)[i];
    const __nv_bfloat16* xs = reinterpret_cast<const __nv_bfloat16*>(&x_vec);
    const bool* keeps = reinterpret_cast<const bool*>(&keep_vec);
    uint4 y_vec;
    __nv_bfloat16* ys = reinterpret_cast<__nv_bfloat16*>(&y_vec);
#pragma unroll
    for (int k = 0; k < 8; ++k) ys[k] = dropped(xs[k], keeps[k], scale);
    reinterpret_cast<uint4*>(y)[i] = y_vec;
  }
}

// One element a thread, from `first` on: the tail after the vectors, or everything when a
// pointer is not aligned for the vector loads.
__global__ void dropout_apply_scalar(const __nv_bfloat16* x, const bool* mask, float scale,
                                     __nv_bfloat16* y, int64_t first, int64_t n) {
  const int64_t i = first + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = dropped(x[i], mask[i], scale);
}

extern "C" int run(const __nv_bfloat16* x, const bool* mask, float scale, __nv_bfloat16* y,
                   int64_t tokens, int64_t hidden, cudaStream_t stream) {
  const int64_t n = tokens * hidden;
  if (n <= 0) return 0;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(mask) % 8 == 0;
  if (aligned) {
    const int64_t vectors = n / 8;
    if (vectors > 0) {
      // 4 vectors a thread, 256 threads a block
      dropout_apply_vec8<<<(unsigned)((vectors + 4 * 256 - 1) / (4 * 256)), 256, 0, stream>>>(
          x, mask, scale, y, vectors);
    }
    const int64_t first = vectors * 8;
    if (first < n) {
      dropout_apply_scalar<<<1, 256, 0, stream>>>(x, mask, scale, y, first, n);  // < 8 left
    }
  } else {
    dropout_apply_scalar<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, mask, scale, y, 0,
                                                                          n);
  }
  return (int)cudaGetLastError();
}
