"""The readonly_ldg mechanism: fixtures both ways, other __ldg forms, compiles."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get, remove_all
from klineage.mining.removal import apply_everywhere
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok

mechanism = get("readonly_ldg")

FORMS = """\
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void forms(const float* __restrict__ x, const float4* __restrict__ v,
                      float* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float a = __ldg(x + i);
  float b = __ldg(v + i).x;
  float c = 2.0f * __ldg(&v[i]).y;
  const float* p = x + i;
  float d = __ldg(p);
  y[i] = a + b + c + d;
}
extern "C" int run(const float* x, const float* v, float* y, int64_t n, cudaStream_t s) {
  forms<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, (const float4*)v, y, n);
  return (int)cudaGetLastError();
}
"""


class TestReadonlyLdg(RoundTripSuite):
    mechanism = "readonly_ldg"


def test_other_ldg_forms_become_plain_loads_with_the_right_grouping() -> None:
    plain = remove_all(KernelSource(FORMS), mechanism).text
    assert "float a = x[i];" in plain
    assert "float b = v[i].x;" in plain
    assert "float c = 2.0f * v[i].y;" in plain
    assert "float d = *p;" in plain


@pytest.mark.nvcc
def test_other_forms_compile_after_removal(mechanism_builder: Builder) -> None:
    compile_ok(mechanism_builder, [KernelSource(FORMS), remove_all(KernelSource(FORMS), mechanism)])


def test_candidates_are_reads_of_const_pointers_in_device_code() -> None:
    source = KernelSource(
        "__global__ void k(const float* x, float* y, const int* idx, const float* h) {\n"
        "  y[0] = x[idx[0]];\n"
        "  const float* p = &x[1];\n"
        "}\n"
        "void host(const float* h) { float a = h[0]; }\n"
    )
    found = [site.snippet for site in mechanism.candidates(source)]
    assert found == ["x[idx[0]]", "idx[0]"]  # not y (written), not &x[1], not host code


def test_ldg_with_two_arguments_is_detected_but_refused() -> None:
    source = KernelSource("__global__ void k(const float* x) { float a = __ldg(x, 1); }\n")
    (site,) = mechanism.detect(source)
    assert site.refusal and "2 arguments" in site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, site)
    assert remove_all(source, mechanism) is source


def test_a_read_through_a_const_pointer_cast_is_a_candidate() -> None:
    # the form the removal writes for `__ldg(reinterpret_cast<const uint4*>(p))` (gemm_bf16)
    source = KernelSource(
        "__device__ uint4 keep(const void* p, float* q) {\n"
        "  float a = *(const float*)q + *(float*)q;\n"
        "  const float* r = &*(const float*)q;\n"
        "  return *reinterpret_cast<const uint4*>(p);\n"
        "}\n"
    )
    candidates = mechanism.candidates(source)
    assert [c.snippet for c in candidates] == [
        "*(const float*)q",
        "*reinterpret_cast<const uint4*>(p)",
    ]  # not the non-const cast, not the address-taken one
    applied = mechanism.apply(source, candidates[1]).text
    assert "return __ldg(reinterpret_cast<const uint4*>(p));" in applied
    applied = mechanism.apply(source, candidates[0]).text
    assert "float a = __ldg((const float*)q) + *(float*)q;" in applied


# ids read in groups through pointer sums, values reinterpreted through a local's address, and a
# helper handed a shared tile: only the global reads may take __ldg
GATHER = """\
#include <cuda_bf16.h>
#include <stdint.h>
__device__ float widen(uint4 packed) {
  const __nv_bfloat162* halves = reinterpret_cast<const __nv_bfloat162*>(&packed);
  return __low2float(halves[0]) + __high2float(halves[3]);
}
__device__ float pick(const float* values, int i) { return values[i]; }
__global__ void gather(const uint4* __restrict__ table, const int64_t* __restrict__ ids,
                       float* __restrict__ out, int bag) {
  __shared__ float tile[32];
  const int64_t* own = ids + blockIdx.x * bag;
  float acc = 0.f;
  for (int j = 0; j + 2 <= bag; j += 2) {
    const int64_t a = __ldg(own + j + 0), b = __ldg(own + j + 1);
    acc += widen(__ldg(table + a)) + widen(__ldg(table + b));
  }
  tile[threadIdx.x % 32] = acc;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = pick(tile, threadIdx.x % 32);
}
"""


def test_reads_through_local_or_shared_addresses_are_refused() -> None:
    source = KernelSource(GATHER)
    plain = remove_all(source, mechanism)
    refused = {c.snippet: c.refusal for c in mechanism.candidates(plain) if not c.supported}
    assert set(refused) == {"halves[0]", "halves[3]", "values[i]"}
    assert "local memory, where __ldg faults" in refused["halves[0]"]
    assert "shared memory, where __ldg faults" in refused["values[i]"]


def test_a_read_through_a_pointer_sum_takes_ldg_back_unchanged() -> None:
    source = KernelSource(GATHER)
    plain = remove_all(source, mechanism)
    assert "const int64_t a = *(own + j + 0), b = *(own + j + 1);" in plain.text
    again = apply_everywhere(plain, mechanism, Carrier())
    # `table + a` came back as `table[a]` and goes forward as `&table[a]`: the same address
    expected = source.text.replace("table + a", "&table[a]").replace("table + b", "&table[b]")
    assert again.text == expected


@pytest.mark.nvcc
def test_the_gather_compiles_both_ways(mechanism_builder: Builder) -> None:
    source = KernelSource(GATHER)
    compile_ok(mechanism_builder, [source, remove_all(source, mechanism)])
