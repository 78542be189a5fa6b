"""The restrict_pointers mechanism: fixtures both ways, compiles, refusals."""

from __future__ import annotations

import pytest

from klineage.conditions import Prose
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite

mechanism = get("restrict_pointers")

IN_PLACE = """\
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void axpy(const float* x, float* y, float a, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
extern "C" int run(float* y, int64_t n, cudaStream_t stream) {
  axpy<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(y, y, 2.0f, n);
  return (int)cudaGetLastError();
}
"""


class TestRestrictPointers(RoundTripSuite):
    mechanism = "restrict_pointers"


def test_one_site_per_kernel_naming_the_params() -> None:
    source = KernelSource(
        "__global__ void k(const float* __restrict__ x, float* y, float** z) {}\n"
        "__device__ void d(float* __restrict__ p) {}\n"
    )
    (site,) = mechanism.detect(source)
    assert site.function == "k" and site.detail == {"params": "x"}
    (candidate,) = mechanism.candidates(source)
    assert candidate.detail == {"params": "y"}  # not the pointer to pointer, not x again
    applied = mechanism.apply(source, candidate)
    assert "float* __restrict__ y, float** z" in applied.text
    assert mechanism.candidates(applied) == []


def test_an_in_place_launch_refuses_restrict_with_the_reason() -> None:
    source = KernelSource(IN_PLACE)
    (candidate,) = mechanism.candidates(source)
    assert candidate.refusal and "passes 'y' as both x and y" in candidate.refusal
    with pytest.raises(MechanismRefused) as refused:
        mechanism.apply(source, candidate)
    assert "alias" in refused.value.reason


def test_condition_is_no_aliasing_prose() -> None:
    source = KernelSource("__global__ void k(float* __restrict__ y) {}\n")
    (condition,) = mechanism.conditions(source, mechanism.detect(source)[0])
    assert isinstance(condition, Prose) and "must not overlap" in condition.prose
