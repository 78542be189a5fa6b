"""Shared memory through declarations, casts, factories and helper parameters."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.kernel import KernelSource

# weights staged once through a cast of the dynamic buffer, rows one warp each
CAST_STAGING = """\
struct alignas(16) Vec4 { float v[4]; };
__device__ Vec4 load4(const float* p) { return *reinterpret_cast<const Vec4*>(p); }
__global__ void scale_rows(const float* w, const float* x, float* y, int rows, int cols) {
  extern __shared__ char smem[];
  Vec4* sw = reinterpret_cast<Vec4*>(smem);
  for (int c = threadIdx.x * 4; c < cols; c += blockDim.x * 4) sw[c / 4] = load4(w + c);
  __syncthreads();
  int row = blockIdx.x;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[row * cols + c] = x[row * cols + c] * sw[c / 4].v[c % 4];
}
"""

# tiles stored by a helper that gets the shared arrays as parameters
HELPER_STAGING = """\
template <int T>
__device__ void load_tiles(const float* a, const float* b, float* as, float* bs, int n, int k0) {
  int r = threadIdx.y, c = threadIdx.x;
  as[r * T + c] = a[(blockIdx.y * T + r) * n + k0 + c];
  bs[r * T + c] = b[(k0 + r) * n + blockIdx.x * T + c];
}
template <int T>
__global__ void mm(const float* a, const float* b, float* out, int n) {
  __shared__ float as[T * T], bs[T * T];
  float acc = 0.f;
  for (int k0 = 0; k0 < n; k0 += T) {
    load_tiles<T>(a, b, as, bs, n, k0);
    __syncthreads();
    for (int k = 0; k < T; ++k) acc += as[threadIdx.y * T + k] * bs[k * T + threadIdx.x];
    __syncthreads();
  }
  out[(blockIdx.y * T + threadIdx.y) * n + blockIdx.x * T + threadIdx.x] = acc;
}
"""

# the classic utility struct that hands out the dynamic shared buffer
FACTORY = """\
template <class T> struct DynamicShared {
  __device__ operator T*() { extern __shared__ int raw[]; return (T*)raw; }
};
__global__ void block_sum(const float* x, float* y) {
  float* s = DynamicShared<float>();
  s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) y[blockIdx.x] = s[0] + s[1];
}
"""


def _shared(text: str, name: str):
    source = KernelSource(text).parsed
    function = source.function(name)
    assert function is not None
    return analysis(source).shared(function)


def test_stores_through_a_cast_of_the_dynamic_buffer_are_copies() -> None:
    shared = _shared(CAST_STAGING, "scale_rows")
    (copy,) = shared.copies
    assert copy.store.buffer.name == "smem" and copy.store.direction == "store"
    assert [(load.buffer.name, load.bytes) for load in copy.loads] == [("w", 16)]
    assert shared.stages() and len(shared.barriers) == 1
    assert {a.buffer.name for a in shared.accesses} == {"smem"}


def test_stores_made_by_a_helper_are_seen_at_the_call() -> None:
    shared = _shared(HELPER_STAGING, "mm")
    stored = sorted(c.store.buffer.name for c in shared.copies)
    assert stored == ["as", "bs"]
    copy = next(c for c in shared.copies if c.store.buffer.name == "as")
    assert copy.store.helper == "load_tiles" and copy.loads[0].buffer.name == "a"
    assert "k0@11" in str(copy.loads[0].offset)  # the helper's k0 is the caller's loop
    assert len(shared.barriers) == 2


def test_a_shared_memory_factory_is_shared_memory() -> None:
    shared = _shared(FACTORY, "block_sum")
    (copy,) = shared.copies
    assert copy.store.buffer.space == "shared" and copy.loads[0].buffer.name == "x"
