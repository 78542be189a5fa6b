"""The pragma_unroll mechanism: fixtures both ways, candidates, carriers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite

mechanism = get("pragma_unroll")

LOOPS = """\
__global__ void k(float* x, int n) {
  for (int i = 0; i < 4; ++i) x[i] = 0.0f;
  if (n > 0)
    for (int i = 0; i < 4; ++i) x[i] = 1.0f;
#pragma unroll 1
  for (int i = 0; i < n; ++i) x[i] += 1.0f;
  _Pragma("unroll") for (int i = 0; i < 4; ++i) x[i] *= 2.0f;
  while (n-- > 0) {}
}
void host(float* x) { for (int i = 0; i < 4; ++i) x[i] = 0.0f; }
"""


class TestPragmaUnroll(RoundTripSuite):
    mechanism = "pragma_unroll"


def test_candidates_are_loops_directly_in_device_blocks_without_a_pragma() -> None:
    source = KernelSource(LOOPS)
    (candidate,) = mechanism.candidates(source)
    assert candidate.start_line == 2 and candidate.snippet == "for (int i = 0; i < 4; ++i)"
    assert mechanism.detect(source) == []  # `#pragma unroll 1` forbids unrolling: not a site


def test_carrier_sets_the_factor() -> None:
    source = KernelSource(LOOPS)
    candidate = mechanism.candidates(source)[0]
    applied = mechanism.apply(source, candidate, Carrier(unroll=4))
    assert "{\n  #pragma unroll 4\n  for (int i = 0; i < 4; ++i) x[i] = 0.0f;" in applied.text
    (site,) = mechanism.detect(applied)
    assert mechanism.carrier_of(applied, site) == Carrier(unroll=4)
    with pytest.raises(MechanismRefused, match="forbids unrolling"):
        mechanism.apply(source, candidate, Carrier(unroll=1))
    named = mechanism.apply(source, candidate, Carrier.from_pairs(["factor=kVec"]))
    assert "#pragma unroll kVec" in named.text
    with pytest.raises(ValidationError):  # a typed carrier field
        Carrier.from_pairs(["unroll=four"])


def test_a_loop_sharing_its_line_gets_the_pragma_on_a_line_of_its_own() -> None:
    source = KernelSource("__device__ void f(float* x) { for (int i = 0; i < 2; ++i) x[i] = 0; }\n")
    applied = mechanism.apply(source, mechanism.candidates(source)[0])
    assert applied.text.splitlines()[1] == "#pragma unroll"
    assert len(mechanism.detect(applied)) == 1


def test_a_pragma_above_a_comment_goes_back_to_the_loop_under_the_comment() -> None:
    from klineage.mining.removal import reapply, remove_mechanism

    # the pragma, then a comment line, then the inner loop: the deletion point is before the
    # comment, outside the inner loop, and still belongs to it
    kernel = KernelSource(
        "__global__ void k(float* y, int n) {\n"
        "#pragma unroll\n"
        "  for (int it = 0; it < 4; ++it) {\n"
        "    y[it] += 1.0f;\n"
        "#pragma unroll\n"
        "    // second pass\n"
        "    /* over eight */\n"
        "    for (int j = 0; j < 8; ++j) y[j] *= 2.0f;\n"
        "  }\n"
        "}\n"
    )
    removal = remove_mechanism(kernel, get("pragma_unroll"))
    assert len(removal.sites) == 2
    restored = reapply(removal).text
    # it goes back right above its loop, under the comments
    expected = kernel.text.replace(
        "#pragma unroll\n    // second pass\n    /* over eight */\n",
        ("// second pass\n/* over eight */\n#pragma unroll\n"),
    )
    assert " ".join(restored.split()) == " ".join(expected.split())  # indentation aside


def test_column_zero_pragmas_inside_an_outer_loop_go_back_before_their_own_loops() -> None:
    from klineage.mining.removal import reapply, remove_mechanism

    # the pragma lines sit at column 0, as in the fmha and top-k experts: deleting one leaves
    # the change point in the indentation before its loop, which the outer loop contains
    kernel = KernelSource(
        "__global__ void k(float* y, int n) {\n"
        "  for (int it = 0; it < n; ++it) {\n"
        "#pragma unroll\n"
        "    for (int j = 0; j < 4; ++j) y[j] += 1.0f;\n"
        "#pragma unroll\n"
        "    for (int j = 0; j < 8; ++j) y[j] *= 2.0f;\n"
        "  }\n"
        "}\n"
    )
    removal = remove_mechanism(kernel, get("pragma_unroll"))
    assert removal.changed and "#pragma" not in removal.simplified.text
    restored = reapply(removal).text
    assert restored.count("#pragma unroll") == 2
    assert " ".join(restored.split()) == " ".join(kernel.text.split())  # indentation aside
