"""Which memory a pointer may point into: kernels' parameters, locals, shared arrays, helpers."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.source import Node, ParsedSource
from klineage.kernel import KernelSource

SPACES = """\
#include <cuda_bf16.h>
__device__ float first(const float* p) { return p[0]; }
__device__ float second(const float* q) { return q[1]; }
__device__ float both(const float* r) { return r[2]; }
__device__ float sum_pairs(uint4 raw) {
  const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
  return __low2float(pair[0]) + __high2float(pair[3]);
}
__global__ void k(const float* __restrict__ x, float* y, const float* const* tables, int n) {
  __shared__ float tile[256];
  extern __shared__ char dynamic[];
  float scratch[4] = {0.f, 0.f, 0.f, 0.f};
  const float* row = x + blockIdx.x * n;
  const float* staged = reinterpret_cast<const float*>(dynamic) + threadIdx.x;
  const float* either = n > 4 ? row : tile;
  const float* loaded = tables[blockIdx.x];
  const float* back = static_cast<const float*>(__cvta_shared_to_generic((size_t)threadIdx.x));
  float value = row[threadIdx.x];
  const float* mine = &value;
  tile[threadIdx.x] = *(row + threadIdx.x + 1);
  __syncthreads();
  y[threadIdx.x] = first(row) + second(tile) + both(x) + both(scratch) + staged[0] + *mine
                 + either[0] + loaded[0] + scratch[1] + sum_pairs(uint4{}) + back[0];
}
"""


def _spaces(source: ParsedSource, function: str, name: str) -> frozenset[str]:
    found = next(f for f in source.functions if f.name == function)
    assert found.body is not None
    node: Node = next(
        n for n in source.iter_nodes("identifier", within=found.body) if source.text_of(n) == name
    )
    return analysis(source).spaces.of(found, node)


def test_pointers_are_placed_by_where_their_values_come_from() -> None:
    source = KernelSource(SPACES).parsed
    assert _spaces(source, "k", "x") == {"global"}  # a kernel's pointer parameter
    assert _spaces(source, "k", "row") == {"global"}  # x + offset
    assert _spaces(source, "k", "tile") == {"shared"}
    assert _spaces(source, "k", "staged") == {"shared"}  # a cast of extern shared memory
    assert _spaces(source, "k", "scratch") == {"local"}
    assert _spaces(source, "k", "mine") == {"local"}  # &value: a variable's address
    assert _spaces(source, "k", "either") == {"global", "shared"}
    assert _spaces(source, "k", "loaded") == {"unknown"}  # a pointer read from memory
    assert _spaces(source, "k", "back") == {"shared"}  # a shared-space address made generic
    assert _spaces(source, "k", "n") == set()  # not an address


def test_a_helpers_parameter_is_what_its_callers_pass() -> None:
    source = KernelSource(SPACES).parsed
    assert _spaces(source, "first", "p") == {"global"}
    assert _spaces(source, "second", "q") == {"shared"}
    assert _spaces(source, "both", "r") == {"global", "local"}
    # the address of a by-value parameter is the helper's own copy
    assert _spaces(source, "sum_pairs", "pair") == {"local"}


def test_a_helper_nobody_calls_is_unknown_not_global() -> None:
    source = KernelSource("__device__ float lone(const float* p) { return p[0]; }\n").parsed
    assert _spaces(source, "lone", "p") == {"unknown"}
