"""A naive kernel's threads run one after another on the host, to check a rewrite's arithmetic
without a GPU.

Each thread of a one-dimensional launch is a call of the kernel function with
``blockIdx``/``threadIdx`` set, one after another, for kernels whose threads do not talk to
each other. A case with a ``grid`` (a ``dim3``, with ``block_dims``) runs blocks one after
another and the threads of a block as host threads, so ``__shared__`` arrays (static locals,
one copy for the block running), ``__syncthreads()`` (a barrier of the block's threads),
``__device__`` helpers (host functions here; ``__expf``, ``__logf``, ``__int_as_float`` and
``__ldg`` as their host equivalents) and the ``__shfl_*_sync`` shuffles (a barrier of the
warp's threads, every lane taking part) work, and so do cooperative groups' block, 32-thread
tiles and ``cg::reduce`` (a stand-in for the headers); atomics and other warp collectives do
not. The ``extern "C" int run`` launcher is cut off;
the driver allocates the buffers (filled with pseudo-random values, each at an element
offset, to make rows unaligned on purpose), calls the kernel for every thread and prints the
outputs' bytes. Two versions of a kernel agree when they print the same.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_PRELUDE = """\
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
static thread_local uint3 kl_block, kl_thread;
static dim3 kl_block_dim, kl_grid_dim;
#define blockIdx kl_block
#define threadIdx kl_thread
#define blockDim kl_block_dim
#define gridDim kl_grid_dim
#undef __global__
#define __global__ static
#undef __shared__
#define __shared__ static
// device helpers run as host functions; the device-only intrinsics they use, as host code
#undef __device__
#define __device__
#undef __forceinline__
#define __forceinline__ inline
#undef __launch_bounds__
#define __launch_bounds__(...)
static float kl_int_as_float(int bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}
#define __int_as_float(bits) kl_int_as_float(bits)
#define __expf(v) expf(v)
#define __ldg(p) (*(p))
#define __logf(v) logf(v)
static std::mutex kl_mutex;
static std::condition_variable kl_turn;
static unsigned kl_waiting = 0, kl_generation = 0, kl_parties = 1;
static void kl_sync() {
  std::unique_lock<std::mutex> lock(kl_mutex);
  const unsigned generation = kl_generation;
  if (++kl_waiting == kl_parties) {
    kl_waiting = 0;
    ++kl_generation;
    kl_turn.notify_all();
    return;
  }
  kl_turn.wait(lock, [&] { return generation != kl_generation; });
}
#define __syncthreads() kl_sync()
// Warp shuffles, for a `grid` case (a block's threads are host threads): each lane posts its
// value in its warp's row, the warp's threads meet, each reads its source lane, and meet again
// before the row is reused. Every lane of a warp must reach the same shuffles (as with a full
// mask on the GPU); a warp whose lanes all returned takes no part.
static unsigned kl_warp_waiting[32], kl_warp_generation[32];
static unsigned long long kl_warp_row[32][32];
static void kl_warp_sync(unsigned warp) {
  const unsigned threads = kl_block_dim.x * kl_block_dim.y * kl_block_dim.z;
  const unsigned parties = threads - warp * 32 < 32 ? threads - warp * 32 : 32;
  std::unique_lock<std::mutex> lock(kl_mutex);
  const unsigned generation = kl_warp_generation[warp];
  if (++kl_warp_waiting[warp] == parties) {
    kl_warp_waiting[warp] = 0;
    ++kl_warp_generation[warp];
    kl_turn.notify_all();
    return;
  }
  kl_turn.wait(lock, [&] { return generation != kl_warp_generation[warp]; });
}
static unsigned kl_linear() {
  return kl_thread.x + kl_block_dim.x * (kl_thread.y + kl_block_dim.y * kl_thread.z);
}
template <typename T>
static T kl_exchange(T value, unsigned source_lane) {
  const unsigned warp = kl_linear() / 32, lane = kl_linear() % 32;
  memcpy(&kl_warp_row[warp][lane], &value, sizeof(T));
  kl_warp_sync(warp);
  T out;
  memcpy(&out, &kl_warp_row[warp][source_lane & 31], sizeof(T));
  kl_warp_sync(warp);
  return out;
}
template <typename T>
static T kl_shfl_up(T v, unsigned d) {
  const unsigned lane = kl_linear() % 32;
  return kl_exchange(v, lane >= d ? lane - d : lane);
}
template <typename T>
static T kl_shfl_down(T v, unsigned d) {
  const unsigned lane = kl_linear() % 32;
  return kl_exchange(v, lane + d < 32 ? lane + d : lane);
}
#define __shfl_sync(mask, v, src) kl_exchange((v), (unsigned)(src))
#define __shfl_up_sync(mask, v, d) kl_shfl_up((v), (unsigned)(d))
#define __shfl_down_sync(mask, v, d) kl_shfl_down((v), (unsigned)(d))
#define __shfl_xor_sync(mask, v, m) kl_exchange((v), (kl_linear() % 32) ^ (unsigned)(m))
"""

_COOPERATIVE_GROUPS = """\
// Cooperative groups, for a `grid` case, in place of the headers: the block, its 32-thread
// tiles, and cg::reduce over a tile as a butterfly through the warp exchange above.
namespace cooperative_groups {
struct thread_block {
  unsigned thread_rank() const { return kl_linear(); }
  unsigned size() const { return kl_block_dim.x * kl_block_dim.y * kl_block_dim.z; }
  unsigned num_threads() const { return size(); }
  void sync() const { kl_sync(); }
};
template <unsigned Size>
struct thread_block_tile {
  static_assert(Size == 32, "only 32-thread tiles are emulated");
  unsigned thread_rank() const { return kl_linear() % 32; }
  unsigned meta_group_rank() const { return kl_linear() / 32; }
  unsigned meta_group_size() const { return (thread_block().size() + 31) / 32; }
  void sync() const { kl_warp_sync(kl_linear() / 32); }
};
inline thread_block this_thread_block() { return thread_block(); }
template <unsigned Size>
thread_block_tile<Size> tiled_partition(const thread_block&) { return thread_block_tile<Size>(); }
template <typename T>
struct plus {
  T operator()(T a, T b) const { return a + b; }
};
template <typename T>
struct greater {
  T operator()(T a, T b) const { return a > b ? a : b; }
};
template <typename T>
struct less {
  T operator()(T a, T b) const { return a < b ? a : b; }
};
template <typename T, typename Op>
T reduce(const thread_block_tile<32>&, T value, Op op) {
  for (unsigned offset = 16; offset > 0; offset >>= 1)
    value = op(value, kl_exchange(value, (kl_linear() % 32) ^ offset));
  return value;
}
}  // namespace cooperative_groups
"""
_CG_INCLUDE = re.compile(r"^#include\s*<cooperative_groups(/reduce)?\.h>[ \t]*\n", re.M)

_DRIVER = """\
static uint32_t kl_seed = 12345u;
static float kl_random() {
  kl_seed = kl_seed * 1664525u + 1013904223u;
  return (float)(kl_seed >> 8) / 16777216.0f * 4.0f - 2.0f;
}
static void kl_fill(float* p, int64_t n) { for (int64_t i = 0; i < n; ++i) p[i] = kl_random(); }
static void kl_fill(__half* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = __float2half(kl_random());
}
static void kl_fill(__nv_bfloat16* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = __float2bfloat16(kl_random());
}
// ids and counts: small signed integers (-32..31), so both valid and invalid ids occur
static void kl_fill(int32_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = (int32_t)(kl_random() * 16.0f);
}
static void kl_fill(int64_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = (int64_t)(kl_random() * 16.0f);
}
template <typename T>
static void kl_print(const char* name, const T* p, int64_t n) {
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(p);
  printf("%s:", name);
  for (int64_t i = 0; i < n * (int64_t)sizeof(T); ++i) printf("%02x", bytes[i]);
  printf("\\n");
}
template <typename F>
static void kl_launch(int64_t threads, unsigned block, F kernel) {
  const unsigned grid = (unsigned)((threads + block - 1) / block);
  kl_grid_dim = dim3(grid);
  kl_block_dim = dim3(block);
  for (unsigned b = 0; b < grid; ++b) {
    for (unsigned t = 0; t < block; ++t) {
      kl_block = make_uint3(b, 0, 0);
      kl_thread = make_uint3(t, 0, 0);
      kernel();
    }
  }
}
template <typename F>
static void kl_launch_grid(dim3 grid, dim3 block, F kernel) {
  kl_grid_dim = grid;
  kl_block_dim = block;
  kl_parties = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::vector<std::thread> threads;
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx)
              threads.emplace_back([=, &kernel] {
                kl_block = make_uint3(bx, by, bz);
                kl_thread = make_uint3(tx, ty, tz);
                kernel();
              });
        for (std::thread& thread : threads) thread.join();
      }
  kl_parties = 1;
}
"""


@dataclass(frozen=True)
class Buffer:
    """One pointer argument: its element type, its element count (a C++ expression over the
    axes), whether the kernel writes it, and the element offset it starts at."""

    name: str
    type: str
    count: str
    output: bool = False
    offset: int = 0


@dataclass(frozen=True)
class Case:
    """One call: axis values, buffers, the kernel call (C++) and how many threads run it."""

    axes: dict[str, int]
    buffers: list[Buffer]
    call: str
    threads: str
    block: int = 256
    grid: str = ""
    """A ``dim3`` expression: run this grid of ``block_dims`` blocks instead (``threads`` and
    ``block`` unused), each block's threads as host threads."""
    block_dims: str = "dim3(16, 16)"


def _case_text(index: int, case: Case) -> str:
    lines = [f"  {{  // case {index}"]
    lines += [f"    const int64_t {name} = {value};" for name, value in case.axes.items()]
    for b in case.buffers:
        lines.append(
            f"    {b.type}* {b.name}_all = ({b.type}*)calloc({b.count} + 8, sizeof({b.type}));"
        )
        lines.append(f"    kl_fill({b.name}_all, {b.count} + 8);")
        lines.append(f"    {b.type}* {b.name} = {b.name}_all + {b.offset};")
    if case.grid:
        launch = f"kl_launch_grid({case.grid}, {case.block_dims}"
    else:
        launch = f"kl_launch({case.threads}, {case.block}"
    lines.append(f"    {launch}, [&] {{ {case.call}; }});")
    for b in case.buffers:
        if b.output:
            lines.append(f'    kl_print("{index}:{b.name}", {b.name}, {b.count});')
    lines += [f"    free({b.name}_all);" for b in case.buffers]
    lines.append("  }")
    return "\n".join(lines)


def program(kernel_text: str, cases: list[Case]) -> str:
    """The host program running ``cases`` on the kernels of ``kernel_text``."""
    device = kernel_text.split('extern "C"')[0]
    if _CG_INCLUDE.search(device):  # the host stand-in, once, where the headers were
        device = _CG_INCLUDE.sub("", device, count=0)
        device = _COOPERATIVE_GROUPS + device
    body = "\n".join(_case_text(i, c) for i, c in enumerate(cases))
    return f"{_PRELUDE}{device}\n{_DRIVER}\nint main() {{\n{body}\n  return 0;\n}}\n"


def run_on_host(kernel_text: str, cases: list[Case]) -> str:
    """Build the host program with nvcc and run it; its output (the outputs' bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "emulate.cu"
        binary = Path(tmp) / "emulate"
        source.write_text(program(kernel_text, cases))
        build = subprocess.run(
            ["nvcc", "-std=c++17", "-O1", "-o", str(binary), str(source), "-lpthread"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert build.returncode == 0, f"{build.stderr}\n{source.read_text()}"
        ran = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
        return ran.stdout


def floats(printed: str) -> dict[str, list[float]]:
    """The float32 outputs the host program printed, by case and buffer name."""
    out = {}
    for line in printed.split():
        name, data = line.split(":", 2)[0:2], line.split(":")[-1]
        raw = bytes.fromhex(data)
        out[":".join(name)] = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return out


def assert_close(got: dict[str, list[float]], want: dict[str, list[float]]) -> None:
    """Every output within float rounding of the other version's (sums in another order)."""
    assert got.keys() == want.keys()
    for name, values in want.items():
        assert len(got[name]) == len(values), name
        for a, b in zip(got[name], values, strict=True):
            assert abs(a - b) <= 1e-4 + 1e-5 * abs(b), (name, a, b)
