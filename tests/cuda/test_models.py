"""The models of the analysis layer: cooperative groups, packed vectors, PTX, the call graph."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.kernel import KernelSource

COOPERATIVE = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

__device__ float pair_max(float a, float b) { return a > b ? a : b; }

__global__ void rows(const float* x, float* y, int cols) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  int row = blockIdx.x * warp.meta_group_size() + warp.meta_group_rank();
  float s = 0.f;
  for (int c = warp.thread_rank(); c < cols; c += warp.size()) s += x[row * cols + c];
  s = cg::reduce(warp, s, cg::plus<float>{});
  float m = cg::reduce(warp, s, pair_max);
  s += warp.shfl_down(s, 1);
  block.sync();
  if (warp.thread_rank() == 0) y[row] = s + m;
}
"""

PACKED = """\
typedef __nv_bfloat16 elem_t;
template <class T> struct alignas(16) Pack {
  static constexpr int size = sizeof(int4) / sizeof(T);
  T v[size];
};
using pack_t = Pack<elem_t>;
struct alignas(16) Quad { float q[4]; };
template <class T> __device__ Pack<T> load_pack(const T* p) {
  return Pack<T>{*reinterpret_cast<const int4*>(p)};
}
template <class T> __device__ void store_pack(T* p, Pack<T> value) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<int4*>(&value);
}
__global__ void copy(const elem_t* in, elem_t* out, int n) {
  int i = (blockIdx.x * blockDim.x + threadIdx.x) * pack_t::size;
  if (i < n) store_pack(out + i, load_pack(in + i));
}
"""

PTX = """\
#define LOAD_FRAGMENT(R0, R1, addr) \\
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\\n" \\
               : "=r"(R0), "=r"(R1) : "r"(addr))
#define COPY_16(dst, src) \\
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(dst), "l"(src))
#define COMMIT() asm volatile("cp.async.commit_group;\\n" ::)
__device__ void wait_all() { asm volatile("cp.async.wait_group 0;\\n" ::); }
__device__ void fence_then_wait() { wait_all(); }
__global__ void tile(const half* a) {
  __shared__ half s[64];
  unsigned r0, r1;
  unsigned dst = __cvta_generic_to_shared(&s[threadIdx.x * 8]);
  COPY_16(dst, a + threadIdx.x * 8);
  COMMIT();
  fence_then_wait();
  __syncthreads();
  LOAD_FRAGMENT(r0, r1, dst);
}
"""


def test_cooperative_groups_are_read_as_warps_ranks_reductions_and_barriers() -> None:
    source = KernelSource(COOPERATIVE).parsed
    groups = analysis(source).cooperative_groups
    function = source.function("rows")
    assert function is not None
    warp = groups.group(function, "warp")
    assert warp is not None and warp.is_warp  # declared in a statement the grammar misreads
    reduces = [(r.op, r.op_name) for r in groups.reduces]
    assert reduces == [("sum", "cg::plus"), ("custom", "pair_max")]
    assert [s.kind for s in groups.shuffles] == ["shfl_down"]
    assert [b.scope for b in groups.barriers] == ["block"]
    indices = analysis(source).indices(function)
    (loop,) = indices.loops
    assert str(loop.init) == "lane" and loop.step.value == 32
    load = next(a for a in indices.accesses() if a.buffer.name == "x")
    assert load.offset.coefficient("warp").atoms() == {"cols"}


GROUP_PARAMETERS = """\
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
template <int TILE>
__device__ float any_tile(const cg::thread_block_tile<TILE>& tile, float v) { return v; }
__device__ float by_warp(cg::thread_block_tile<32>& warp, float v) {
  return cg::reduce(warp, v, cg::plus<float>{});
}
__device__ float by_half(const cg::thread_block_tile<16> &half, float v) {
  return cg::reduce(half, v, cg::plus<float>{});
}
__device__ void by_block(cooperative_groups::thread_block block) { block.sync(); }
"""


def test_groups_handed_to_a_helper_are_known_by_their_parameter_types() -> None:
    source = KernelSource(GROUP_PARAMETERS).parsed
    groups = analysis(source).cooperative_groups
    functions = {f.name: f for f in source.functions}
    warp = groups.group(functions["by_warp"], "warp")
    assert warp is not None and warp.is_warp
    half = groups.group(functions["by_half"], "half")
    assert half is not None and (half.kind, half.size) == ("tile", 16) and not half.is_warp
    block = groups.group(functions["by_block"], "block")
    assert block is not None and block.kind == "block"
    assert [b.scope for b in groups.barriers] == ["block"]
    # a tile whose size is a template parameter is not taken for a warp
    assert groups.group(functions["any_tile"], "tile") is None
    assert [r.group.size if r.group else None for r in groups.reduces] == [32, 16]


def test_packed_structs_typedefs_and_helpers_are_vectors() -> None:
    source = KernelSource(PACKED).parsed
    vectors = analysis(source).vectors
    packed = vectors.packed("pack_t")
    assert packed is not None and (packed.count, packed.bytes) == (8, 16)
    assert vectors.constant("pack_t::size") == 8
    quad = vectors.packed("Quad")
    assert quad is not None and quad.count == 4 and quad.user_defined
    assert vectors.packed("float4") is not None and vectors.packed("float") is None
    assert {(h.name, h.kind, h.bytes) for h in vectors.helpers.values()} == {
        ("load_pack", "load", 16),
        ("store_pack", "store", 16),
    }
    function = source.function("copy")
    assert function is not None
    accesses = analysis(source).indices(function).accesses()
    assert sorted((a.buffer.name, a.direction, a.bytes) for a in accesses) == [
        ("in", "load", 16),
        ("out", "store", 16),
    ]
    assert str(accesses[0].offset) == "8·blockDim.x·blockIdx.x + 8·threadIdx.x"


ACCESS_MACROS = """
#define FLOAT4(value) (reinterpret_cast<float4 *>(&(value))[0])
#define FETCH_FLOAT2(pointer) (reinterpret_cast<float2*>(&(pointer))[0])
#define HALF2(v) (*reinterpret_cast<half2*>(&(v)))
#define C_STYLE(v) (((int4*)(&(v)))[0])
#define BOTH(v) (*reinterpret_cast<float4*>(&(v))[0])
#define TWO(v, w) (reinterpret_cast<float4*>(&(v))[0])
#define NO_ADDRESS(p) (reinterpret_cast<float4*>(p)[0])
#define SCALAR(v) (reinterpret_cast<float*>(&(v))[0])
"""


def test_access_macros_read_an_elements_address_as_a_vector() -> None:
    macros = analysis(KernelSource(ACCESS_MACROS).parsed).vectors.access_macros
    assert {m.name: m.vector for m in macros.values()} == {
        "FLOAT4": "float4",
        "FETCH_FLOAT2": "float2",
        "HALF2": "half2",
        "C_STYLE": "int4",
    }


def test_an_access_macros_call_is_one_packed_access_of_its_element() -> None:
    source = KernelSource(
        "#define FLOAT4(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
        "__global__ void copy4(float* a, float* c, int n) {\n"
        "  int idx = 4 * (blockIdx.x * blockDim.x + threadIdx.x);\n"
        "  float4 v = FLOAT4(a[idx]);\n"
        "  FLOAT4(c[idx]) = v;\n}\n"
    ).parsed
    function = source.function("copy4")
    assert function is not None
    accesses = analysis(source).indices(function).accesses()
    assert [(a.buffer.name, a.direction, a.bytes) for a in accesses] == [
        ("a", "load", 16),
        ("c", "store", 16),
    ]
    assert str(accesses[1].offset) == "4·blockDim.x·blockIdx.x + 4·threadIdx.x"


def test_arithmetic_macros_are_those_without_writes_or_calls() -> None:
    source = KernelSource(
        "#define OFFSET(row, col, ld) ((row) * (ld) + (col))\n"
        "#define PICK(a, b) ((a) >= (b) ? (a) : (b))\n"
        "#define BUMP(a) ((a)++)\n"
        "#define RESET(a) ((a) = 0)\n"
        "#define SQUARE(a) (sq(a))\n"
        "#define WIDE(v) (reinterpret_cast<float4 *>(&(v))[0])\n"
    ).parsed
    assert analysis(source).arithmetic_macros == {"OFFSET", "PICK"}


def test_ptx_is_found_through_macros_and_wrappers_with_qualifiers_in_any_order() -> None:
    source = KernelSource(PTX).parsed
    ptx = analysis(source).ptx
    function = source.function("tile")
    assert function is not None
    sites = ptx.sites_in(function)
    assert [(s.via, s.name) for s in sites] == [
        ("macro", "COPY_16"),
        ("macro", "COMMIT"),
        ("helper", "fence_then_wait"),
        ("macro", "LOAD_FRAGMENT"),
    ]
    ldmatrix = sites[-1].instructions[0]
    assert ldmatrix.family == "ldmatrix" and ldmatrix.has("x2", "m8n8")
    assert ptx.issues(function, "cp_async_wait")
    shared = analysis(source).shared(function)
    assert [s.name for s in shared.async_copies] == ["COPY_16"] and shared.barriers


def test_the_call_graph_summarizes_helpers() -> None:
    source = KernelSource(PTX + COOPERATIVE.split("namespace cg = cooperative_groups;")[1]).parsed
    graph = analysis(source).call_graph
    assert graph.callees("tile") == ["fence_then_wait"]
    assert graph.reachable("fence_then_wait") == {"wait_all"}
    assert "cp_async_wait" in graph.summary("tile").ptx
    assert graph.summary("tile").block_barrier and not graph.summary("wait_all").block_barrier
    assert graph.call_sites("wait_all")[0][0] == "fence_then_wait"


# A kernel written once for several bodies: the body is a template argument (a pointer to a
# __device__ function), bound where a launcher templated on it launches the kernel. The body
# declares its own shared tiles and barriers: the block's work is all there.
BODY_AS_TEMPLATE_ARGUMENT = """
using body_fn = void (*)(float* out, const float* in, int n);
__device__ void plain_body(float* out, const float* in, int n) {
    out[blockIdx.x * 64 + threadIdx.x] = in[blockIdx.x * 64 + threadIdx.x];
}
__device__ void staged_body(float* out, const float* in, int n) {
    __shared__ float tile[64];
    for (int base = 0; base < n; base += 64) {
        __syncthreads();
        tile[threadIdx.x] = in[base + threadIdx.x];
        __syncthreads();
        out[base + threadIdx.x] = tile[63 - threadIdx.x];
    }
}
template <body_fn body>
__global__ void run_body(float* out, const float* in, int n) { body(out, in, n); }
template <body_fn body>
void launch(float* out, const float* in, int n) { run_body<body><<<1, 64>>>(out, in, n); }
void both(float* out, const float* in, int n) {
    launch<plain_body>(out, in, n);
    run_body<&staged_body><<<1, 64>>>(out, in, n);
}
"""


def test_a_body_bound_as_a_template_argument_is_called_by_the_kernel() -> None:
    """Bound directly at a launch (`&staged_body`) or through a launcher's own template
    parameter (`launch<plain_body>`): both are callees of the kernel, with the call node."""
    source = KernelSource(BODY_AS_TEMPLATE_ARGUMENT).parsed
    graph = analysis(source).call_graph
    assert sorted(graph.callees("run_body")) == ["plain_body", "staged_body"]
    ((caller, node),) = graph.call_sites("staged_body")
    assert caller == "run_body" and source.text_of(node) == "body(out, in, n)"
    assert graph.summary("run_body").block_barrier  # through the staged body


def test_the_block_functions_are_the_kernels_and_bodies_with_their_own_shared_tiles() -> None:
    source = KernelSource(BODY_AS_TEMPLATE_ARGUMENT).parsed
    names = [f.name for f in analysis(source).block_functions]
    assert names == ["run_body", "staged_body"]  # plain_body declares no shared memory
    bodies_only = BODY_AS_TEMPLATE_ARGUMENT.split("template <body_fn body>\n__global__")[0]
    assert analysis(KernelSource(bodies_only).parsed).block_functions == ()  # no kernel


SPLIT_STORES = """
struct alignas(16) pack_t { float v[4]; __device__ int4 bits() const; };
__device__ void put(float* target, pack_t value) {
  {
    const int4 packed = value.bits();
    int* elems = reinterpret_cast<int*>(reinterpret_cast<int4*>(target));
    elems[0] = packed.x; elems[1] = packed.y; elems[2] = packed.z; elems[3] = packed.w;
  }
}
__device__ void put_streaming(float* target, pack_t value) {
  {
    const int4 packed = value.bits();
    int* elems = reinterpret_cast<int*>(reinterpret_cast<int4*>(target));
    __stcs(&elems[0], packed.x); __stcs(&elems[1], packed.y);
    __stcs(elems + 2, packed.z); __stcs(elems + 3, packed.w);
  }
}
__device__ int4 peek(const float* source) {
  const int* elems = reinterpret_cast<const int*>(reinterpret_cast<const int4*>(source));
  return make_int4(__ldcs(&elems[0]), __ldcs(&elems[1]), __ldcs(&elems[2]), __ldcs(&elems[3]));
}
"""


def test_a_store_helper_split_into_element_stores_is_still_a_store() -> None:
    # what vectorized_access's removal leaves of a 128-bit store helper: the cast pointer kept
    # in a local written through plainly or through a store intrinsic (the cache hint kept)
    helpers = analysis(KernelSource(SPLIT_STORES).parsed).vectors.helpers
    assert {name: (h.kind, h.bytes) for name, h in helpers.items()} == {
        "put": ("store", 16),
        "put_streaming": ("store", 16),
        "peek": ("load", 16),
    }
