// Top-k per row, float32 values and int64 indices, in any order.
//
// Radix selection on an order-preserving 32-bit key, one 1024-thread block per row:
//   pass 1  histogram of the key's top 12 bits in shared memory (one read of the row, float4
//           loads); a block-wide scan finds the bin that holds the k-th largest key
//   pass 2  a second read (from L2) emits every element above that bin straight to the
//           output and, when they fit, copies the bin's elements into shared memory
//   then    two more radix digits (12 and 8 bits) run over those candidates in shared memory
//           only, giving the exact k-th key; candidates above it are emitted, and ties take
//           the remaining slots
// If the bin is too crowded for shared memory (adversarial data), the two extra digits are
// found by filtered passes over the row instead. Output slots are handed out with warp
// ballots: one shared-memory atomic per warp, each lane's slot from a popcount prefix.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kTopShift = 20;  // digit 1: key bits 31..20
constexpr int kMidShift = 8;   // digit 2: key bits 19..8
constexpr uint32_t kMidMask = 0xfffu;
constexpr uint32_t kLowMask = 0xffu;  // digit 3: key bits 7..0
constexpr int kBins = 4096;
constexpr int kLowBins = 256;
constexpr int kCapacity = 3072;  // candidates kept in shared memory

struct Selection {
  uint32_t bin;    // the bin holding the wanted element
  uint32_t above;  // elements in higher bins
};

struct Shared {
  uint32_t hist[kBins];
  uint32_t cand_key[kCapacity];
  uint32_t cand_index[kCapacity];
  uint32_t warp_prefix[kWarps];
  uint32_t total;
  uint32_t n_candidates;
  uint32_t n_greater;
  uint32_t n_equal;
  Selection selection;
};

// Larger float -> larger key; NaN sorts above +inf, as torch.topk treats it.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

__device__ __forceinline__ void zero_hist(Shared& sh, int bins) {
  for (int i = threadIdx.x; i < bins; i += kThreads) sh.hist[i] = 0;
  __syncthreads();
}

// Which bin holds the want-th largest element (1-based)? Thread t owns a run of bins; a
// block-wide scan gives each thread the count above its run, and the one thread whose run
// contains the answer walks it from the top. Call after the histogram is complete.
__device__ Selection find_bin(Shared& sh, int bins, uint32_t want) {
  const int per = bins >= kThreads ? bins / kThreads : 1;
  const int first = threadIdx.x * per;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  uint32_t mine = 0;
  if (first < bins)
    for (int j = 0; j < per; ++j) mine += sh.hist[first + j];
  uint32_t inclusive = mine;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) sh.warp_prefix[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint32_t own = sh.warp_prefix[lane];
    uint32_t scan = own;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const uint32_t other = __shfl_up_sync(kFullMask, scan, offset);
      if (lane >= offset) scan += other;
    }
    sh.warp_prefix[lane] = scan - own;
    if (lane == 31) sh.total = scan;
  }
  __syncthreads();
  inclusive += sh.warp_prefix[warp];
  const uint32_t above = sh.total - inclusive;
  if (mine > 0 && above < want && want <= above + mine) {
    uint32_t count = above;
    for (int j = per - 1; j >= 0; --j) {
      const uint32_t in_bin = sh.hist[first + j];
      if (count + in_bin >= want) {
        sh.selection = {(uint32_t)(first + j), count};
        break;
      }
      count += in_bin;
    }
  }
  __syncthreads();
  return sh.selection;
}

// Warp-aggregated slot allocation: lanes with `take` get consecutive slots from `counter`.
// Returns the lane's slot, or UINT32_MAX when it takes nothing. All 32 lanes must call it.
__device__ __forceinline__ uint32_t claim_slot(bool take, uint32_t* counter) {
  const unsigned mask = __ballot_sync(kFullMask, take);
  if (mask == 0) return UINT32_MAX;
  const int lane = threadIdx.x & 31;
  const int leader = __ffs(mask) - 1;
  uint32_t base = 0;
  if (lane == leader) base = atomicAdd(counter, (uint32_t)__popc(mask));
  base = __shfl_sync(kFullMask, base, leader);
  return take ? base + __popc(mask & ((1u << lane) - 1u)) : UINT32_MAX;
}

struct Output {
  float* values;
  int64_t* indices;
  __device__ __forceinline__ void put(uint32_t slot, uint32_t key, uint32_t index) const {
    values[slot] = key_value(key);
    indices[slot] = index;
  }
};

// Visits every element of the row in a loop whose trip count is the same for all threads
// (warp-collective calls inside `visit` are safe); `valid` is false past the row's end.
template <bool kVec4, typename Visit>
__device__ __forceinline__ void for_each_uniform(const float* __restrict__ row, int64_t n,
                                                 Visit visit) {
  if (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t base = 0; base < n / 4; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      const bool valid = i < n / 4;
      const float4 v = valid ? __ldg(row4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      visit(order_key(v.x), (uint32_t)(4 * i), valid);
      visit(order_key(v.y), (uint32_t)(4 * i + 1), valid);
      visit(order_key(v.z), (uint32_t)(4 * i + 2), valid);
      visit(order_key(v.w), (uint32_t)(4 * i + 3), valid);
    }
  } else {
    for (int64_t base = 0; base < n; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      const bool valid = i < n;
      visit(order_key(valid ? __ldg(row + i) : 0.f), (uint32_t)i, valid);
    }
  }
}

// Pass 1: histogram of the top digit, with four float4 loads in flight per thread.
template <bool kVec4>
__device__ void histogram_top(Shared& sh, const float* __restrict__ row, int64_t n) {
  if (kVec4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = n / 4;
    for (int64_t base = threadIdx.x; base < n4; base += 4 * kThreads) {
      float4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = base + (int64_t)u * kThreads;
        v[u] = i < n4 ? __ldg(row4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (base + (int64_t)u * kThreads < n4) {
          atomicAdd(&sh.hist[order_key(v[u].x) >> kTopShift], 1u);
          atomicAdd(&sh.hist[order_key(v[u].y) >> kTopShift], 1u);
          atomicAdd(&sh.hist[order_key(v[u].z) >> kTopShift], 1u);
          atomicAdd(&sh.hist[order_key(v[u].w) >> kTopShift], 1u);
        }
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
      atomicAdd(&sh.hist[order_key(__ldg(row + i)) >> kTopShift], 1u);
  }
  __syncthreads();
}

// Candidates (the top bin's elements) are in shared memory: finish the selection there.
__device__ void select_from_candidates(Shared& sh, Selection top, uint32_t k, Output out) {
  const uint32_t n = sh.n_candidates;
  const uint32_t need = k - top.above;
  zero_hist(sh, kBins);
  for (uint32_t i = threadIdx.x; i < n; i += kThreads)
    atomicAdd(&sh.hist[(sh.cand_key[i] >> kMidShift) & kMidMask], 1u);
  __syncthreads();
  const Selection mid = find_bin(sh, kBins, need);
  zero_hist(sh, kLowBins);
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = sh.cand_key[i];
    if (((key >> kMidShift) & kMidMask) == mid.bin) atomicAdd(&sh.hist[key & kLowMask], 1u);
  }
  __syncthreads();
  const Selection low = find_bin(sh, kLowBins, need - mid.above);
  const uint32_t threshold = (top.bin << kTopShift) | (mid.bin << kMidShift) | low.bin;
  const uint32_t greater = top.above + mid.above + low.above;
  for (uint32_t base = 0; base < n; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const bool valid = i < n;
    const uint32_t key = valid ? sh.cand_key[i] : 0u;
    const uint32_t index = valid ? sh.cand_index[i] : 0u;
    const uint32_t gt = claim_slot(valid && key > threshold, &sh.n_greater);
    if (gt != UINT32_MAX) out.put(gt, key, index);
    const uint32_t eq = claim_slot(valid && key == threshold, &sh.n_equal);
    if (eq != UINT32_MAX && greater + eq < k) out.put(greater + eq, key, index);
  }
}

// The top bin is too crowded for shared memory: find the last two digits by filtered
// passes over the row, then emit from the row.
template <bool kVec4>
__device__ void select_from_row(Shared& sh, const float* __restrict__ row, int64_t n,
                                Selection top, uint32_t k, Output out) {
  const uint32_t need = k - top.above;
  zero_hist(sh, kBins);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = order_key(__ldg(row + i));
    if ((key >> kTopShift) == top.bin) atomicAdd(&sh.hist[(key >> kMidShift) & kMidMask], 1u);
  }
  __syncthreads();
  const Selection mid = find_bin(sh, kBins, need);
  const uint32_t prefix = (top.bin << 12) | mid.bin;
  zero_hist(sh, kLowBins);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = order_key(__ldg(row + i));
    if ((key >> kMidShift) == prefix) atomicAdd(&sh.hist[key & kLowMask], 1u);
  }
  __syncthreads();
  const Selection low = find_bin(sh, kLowBins, need - mid.above);
  const uint32_t threshold = (prefix << kMidShift) | low.bin;
  const uint32_t greater = top.above + mid.above + low.above;
  for_each_uniform<kVec4>(row, n, [&](uint32_t key, uint32_t index, bool valid) {
    const uint32_t gt = claim_slot(valid && key > threshold, &sh.n_greater);
    if (gt != UINT32_MAX) out.put(gt, key, index);
    const uint32_t eq = claim_slot(valid && key == threshold, &sh.n_equal);
    if (eq != UINT32_MAX && greater + eq < k) out.put(greater + eq, key, index);
  });
}

template <bool kVec4>
__device__ void topk_row(Shared& sh, const float* __restrict__ row, int64_t n, uint32_t k,
                         Output out) {
  histogram_top<kVec4>(sh, row, n);
  const Selection top = find_bin(sh, kBins, k);
  const uint32_t crowd = sh.hist[top.bin];
  __syncthreads();  // everyone has read the histogram before anyone clears it
  if (crowd > (uint32_t)kCapacity) {
    select_from_row<kVec4>(sh, row, n, top, k, out);
    return;
  }
  // pass 2: everything above the top bin is in the answer; the bin itself is kept
  for_each_uniform<kVec4>(row, n, [&](uint32_t key, uint32_t index, bool valid) {
    const uint32_t digit = key >> kTopShift;
    const uint32_t gt = claim_slot(valid && digit > top.bin, &sh.n_greater);
    if (gt != UINT32_MAX) out.put(gt, key, index);
    const uint32_t slot = claim_slot(valid && digit == top.bin, &sh.n_candidates);
    if (slot != UINT32_MAX) {
      sh.cand_key[slot] = key;
      sh.cand_index[slot] = index;
    }
  });
  __syncthreads();
  select_from_candidates(sh, top, k, out);
}

__global__ void __launch_bounds__(kThreads)
topk_rows(const float* __restrict__ x, float* __restrict__ values, int64_t* __restrict__ indices,
          int64_t length, int64_t k) {
  __shared__ Shared sh;
  if (threadIdx.x == 0) {
    sh.n_candidates = 0;
    sh.n_greater = 0;
    sh.n_equal = 0;
  }
  zero_hist(sh, kBins);
  const int64_t r = blockIdx.x;
  const Output out{values + r * k, indices + r * k};
  const float* row = x + r * length;
  if (length % 4 == 0) topk_row<true>(sh, row, length, (uint32_t)k, out);
  else topk_row<false>(sh, row, length, (uint32_t)k, out);
}

}  // namespace

extern "C" int run(const float* x, float* values, int64_t* indices, int64_t batch,
                   int64_t length, int64_t k, cudaStream_t stream) {
  if (batch == 0 || k == 0) return 0;
  if (k > length || length > (int64_t)UINT32_MAX) return (int)cudaErrorInvalidValue;
  topk_rows<<<(unsigned)batch, kThreads, 0, stream>>>(x, values, indices, length, k);
  return (int)cudaGetLastError();
}
