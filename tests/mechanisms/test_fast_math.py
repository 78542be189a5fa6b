"""The fast_math mechanism: fixtures both ways, operator precedence, float-only divisions."""

from __future__ import annotations

import pytest

from klineage.conditions import ToleranceAtLeast
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get, remove_all
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok, removal_chain

mechanism = get("fast_math")


class TestFastMath(RoundTripSuite):
    mechanism = "fast_math"


def _device(body: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <math.h>\n"
        "__device__ float f(float a, float b, float c, int k, double d) {\n"
        f"  return {body};\n}}\n"
        "__global__ void use(float* y) { y[0] = f(y[1], y[2], y[3], 1, 2.0); }\n"
        'extern "C" int run(float* y, cudaStream_t s) {\n'
        "  use<<<1, 1, 0, s>>>(y);\n  return (int)cudaGetLastError();\n}\n"
    )


@pytest.mark.parametrize(
    ("fast", "accurate"),
    [
        ("__expf(a - b)", "expf(a - b)"),
        ("__powf(a, b)", "powf(a, b)"),
        ("__fdividef(a, b * c)", "a / (b * c)"),
        ("__fdividef(a - b, c)", "(a - b) / c"),
        ("__fdividef(a * b, c)", "a * b / c"),
        ("-__fdividef(a, b)", "-(a / b)"),
        ("c * __fdividef(a, b)", "c * (a / b)"),
        ("c - __fdividef(a, b)", "c - a / b"),
        ("c * rsqrtf(a + b)", "c * (1.0f / sqrtf(a + b))"),
        ("rsqrtf(a) + c", "1.0f / sqrtf(a) + c"),
        ("__fdividef(a, b) < c ? a : b", "a / b < c ? a : b"),
    ],
)
def test_removal_keeps_the_grouping(fast: str, accurate: str) -> None:
    assert f"return {accurate};" in remove_all(_device(fast), mechanism).text


@pytest.mark.parametrize(
    ("accurate", "fast"),
    [
        ("c * (1.0f / sqrtf(a + b))", "c * rsqrtf(a + b)"),
        ("(a + b) / c", "__fdividef(a + b, c)"),
        ("a / (float)k", "__fdividef(a, (float)k)"),
        ("logf(a) / 2.0f", "__fdividef(__logf(a), 2.0f)"),
    ],
)
def test_application_replaces_the_right_expression(accurate: str, fast: str) -> None:
    source = _device(accurate)
    current = source
    while mechanism.candidates(current):
        current = mechanism.apply(current, mechanism.candidates(current)[0])
    assert f"return {fast};" in current.text


@pytest.mark.parametrize("division", ["a / d", "k / 2", "d / 2.0", "(a + d) / b"])
def test_divisions_that_are_not_float_are_not_candidates(division: str) -> None:
    assert mechanism.candidates(_device(division)) == []


def _struct_division(division: str) -> KernelSource:
    # a running (max, sum) pair kept in a struct of the file, as online softmax kernels do
    return KernelSource(
        "struct __align__(8) Pair { float m; float d; int n; double w; };\n"
        "__global__ void k(const Pair* p, float* y) {\n"
        f"  Pair r = p[0];\n  y[0] = {division};\n}}\n"
    )


@pytest.mark.parametrize(
    ("division", "candidate"),
    [("1.0f / r.d", True), ("r.m / r.n", True), ("1.0f / r.w", False), ("r.n / 2", False)],
)
def test_divisions_by_fields_of_a_struct_of_the_file(division: str, candidate: bool) -> None:
    sites = [s for s in mechanism.candidates(_struct_division(division)) if s.supported]
    assert bool(sites) is candidate
    if candidate:
        applied = mechanism.apply(_struct_division(division), sites[0])
        left, right = division.split(" / ")
        assert f"y[0] = __fdividef({left}, {right});" in applied.text


def test_host_code_is_never_a_candidate() -> None:
    source = KernelSource("#include <math.h>\nfloat h(float a) { return expf(a) / 2.0f; }\n")
    assert mechanism.candidates(source) == []


def test_a_wrong_arity_is_detected_but_refused() -> None:
    source = _device("__expf(a, b)")
    (site,) = mechanism.detect(source)
    assert site.refusal and "2 arguments" in site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, site)


def test_conditions_name_the_accuracy_cost() -> None:
    source = _device("__expf(a)")
    (condition,) = mechanism.conditions(source, mechanism.detect(source)[0])
    assert isinstance(condition, ToleranceAtLeast) and condition.rtol == 1e-5
    sine = _device("__sinf(a)")
    (prose,) = mechanism.conditions(sine, mechanism.detect(sine)[0])
    assert "[-pi, pi]" in prose.prose


@pytest.mark.nvcc
def test_precedence_rewrites_compile(mechanism_builder: Builder) -> None:
    body = "c * rsqrtf(a + b) - __fdividef(a - b, c) * __expf(-__fdividef(a, b))"
    chain = removal_chain(mechanism, _device(body))
    assert "c * (1.0f / sqrtf(a + b)) - (a - b) / c * expf(-(a / b))" in chain.states[-1].text
    compile_ok(mechanism_builder, chain.states)
