"""The row_in_registers mechanism: fixtures both ways, what makes a re-read unsafe (and is
refused), and detection on the softmax and RMSNorm experts."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite

mechanism = get("row_in_registers")
FIXTURE = (FIXTURES / "row_in_registers" / "before.cu").read_text()


class TestRowInRegisters(RoundTripSuite):
    mechanism = "row_in_registers"


def test_the_reload_keeps_the_loads_pragma_and_the_pass_keeps_its_own() -> None:
    after = (FIXTURES / "row_in_registers" / "after.cu").read_text()
    assert after.count("#pragma unroll") == FIXTURE.count("#pragma unroll") + 1
    assert after.count("v[i] = c < cols ? in[c] : 0.0f;") == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            (
                "for (int i = 0; i < kVec; ++i) sq += v[i] * v[i];",
                "for (int i = 0; i < kVec; ++i) { sq += v[i] * v[i]; v[i] *= 2.0f; }",
            ),
            "assigns v[i]",
        ),
        (
            (
                "for (int i = 0; i < kVec; ++i) sq += v[i] * v[i];",
                "for (int i = 0; i < kVec; ++i) { sq += v[i] * v[i]; x[i] = 0.0f; }",
            ),
            "writes memory the load reads",
        ),
        (
            ("v[i] = c < cols ? in[c] : 0.0f;", "v[i] = c < cols ? in[c] : 0.0f;\n    sq += 1.0f;"),
            "the load also assigns sq",
        ),
    ],
)
def test_unsafe_re_reads_are_refused(change: tuple[str, str], reason: str) -> None:
    text = FIXTURE.replace("const float* __restrict__ x", "float* __restrict__ x")
    text = text.replace(*change)
    if "sq += 1.0f" in text:
        text = text.replace("  float v[kVec];", "  float sq = 0.0f;\n  float v[kVec];").replace(
            "  float sq = 0.0f;\n#pragma", "#pragma"
        )
    source = KernelSource(text)
    (site,) = mechanism.detect(source)
    assert site.refusal is not None and reason in site.refusal, site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, site)


def test_a_batched_load_used_once_is_not_a_held_row() -> None:
    source = KernelSource(
        "__global__ void k(const float* x, float* y) {\n  float v[4];\n"
        "  for (int i = 0; i < 4; ++i) v[i] = x[i];\n"
        "  for (int i = 0; i < 4; ++i) y[i] = v[i];\n}\n"
    )
    assert mechanism.detect(source) == []


def test_the_experts_are_detected_where_listed() -> None:
    assert_detected_where_listed("row_in_registers")


@pytest.mark.nvcc
def test_expert_sites_refuse_with_the_pass_that_rewrites_the_row(
    mechanism_builder: Builder,
) -> None:
    refusals = check_expert_removals_compile("row_in_registers", mechanism_builder)
    assert len(refusals) == 3
    assert all("re-reading the row from memory would not give them" in r for r in refusals)
