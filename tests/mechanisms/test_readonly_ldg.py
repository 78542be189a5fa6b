"""The readonly_ldg mechanism: fixtures both ways, other __ldg forms, compiles."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get, remove_all
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
