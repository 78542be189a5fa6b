"""The thread_coarsening mechanism: fixtures both ways, heldout kernels, experts, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok
from tests.mechanisms.test_vectorized_access import listing_experts

NAME = "thread_coarsening"
mechanism = get(NAME)
ALL_EXPERTS = sorted(p.parent for p in (REPO / "expert_kernels").glob("*/kernel.cu"))


class TestThreadCoarsening(RoundTripSuite):
    mechanism = NAME


def test_detect_finds_what_the_experts_list() -> None:
    """Every entry for this mechanism in an expert's mechanisms.json is detected (no expert
    lists one today: their coarsening is the hand-written kind below)."""
    for expert in listing_experts(NAME):
        entries = json.loads((expert / "mechanisms.json").read_text())
        listed = [e for e in entries if e["mechanism"] == NAME]
        report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
        assert report.recall == 1.0, str(report)


@pytest.mark.parametrize("expert", ALL_EXPERTS, ids=lambda p: p.name)
def test_expert_coarsening_is_reported_with_the_reason_it_is_refused(expert: Path) -> None:
    """Expert kernels coarsen through helpers and register arrays (softmax's load_row, the
    rmsnorm access loops, topk's four loads in flight): honest refusals, never rewrites."""
    kernel = KernelSource.from_file(expert / "kernel.cu")
    for site in mechanism.detect(kernel):
        assert site.refusal and "canonical form" in site.refusal
        with pytest.raises(MechanismRefused):
            mechanism.remove(kernel, site)


def test_the_expert_loops_over_register_slots_are_found() -> None:
    found = {
        name: [s.start_line for s in mechanism.detect(KernelSource.from_file(path))]
        for name, path in [
            ("softmax", REPO / "expert_kernels/softmax/kernel.cu"),
            ("topk", REPO / "expert_kernels/topk/kernel.cu"),
        ]
    }
    assert found == {"softmax": [55, 88], "topk": [166]}


@pytest.mark.nvcc
def test_heldout_kernels_coarsen_and_compile(mechanism_builder: Builder) -> None:
    gelu = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    coarse = mechanism.apply(gelu, mechanism.candidates(gelu)[0], Carrier(coarsen=8))
    assert "gelu_tanh<<<(unsigned)((n + 8 * 256 - 1) / (8 * 256)), 256, 0, stream>>>" in (
        coarse.text
    )
    gather = KernelSource.from_file(REPO / "heldout/embedding_gather/kernel.cu")
    (candidate,) = mechanism.candidates(gather)
    contiguous = mechanism.apply(gather, candidate, Carrier(layout="contiguous"))
    assert "    const int64_t i = i_first + i_step;\n    if (i >= tokens * hidden) return;" in (
        contiguous.text
    )
    assert "      continue;\n" in contiguous.text  # the element's early return
    (site,) = mechanism.detect(contiguous)
    assert mechanism.carrier_of(contiguous, site) == Carrier(coarsen=4, layout="contiguous")
    compile_ok(mechanism_builder, [coarse, contiguous])


def _kernel(
    body: str, launch: str = "k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, n);"
) -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__global__ void k(float* x, int64_t n) {\n"
        "  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
        f"  if (i >= n) return;\n{body}\n}}\n"
        'extern "C" int run(float* x, int64_t n, cudaStream_t s) {\n'
        f"  {launch}\n  return 0;\n}}\n"
    )


@pytest.mark.parametrize(
    ("body", "launch", "reason"),
    [
        ("  x[i] += blockIdx.x;", None, "reads blockIdx.x"),
        ("  x[i] = 0.0f;\n  __syncthreads();", None, "__syncthreads"),
        ("  for (int j = 0; j < 4; ++j) if (x[i] > j) return;", None, "nested loop"),
        ("  x[i] = 0.0f;", "(void)s;", "no launch of k"),
    ],
)
def test_unsafe_kernels_are_refused_with_a_reason(
    body: str, launch: str | None, reason: str
) -> None:
    kernel = _kernel(body) if launch is None else _kernel(body, launch)
    (candidate,) = mechanism.candidates(kernel)
    assert reason in (candidate.refusal or "")
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.apply(kernel, candidate)


def test_a_bound_the_launch_cannot_see_is_refused() -> None:
    kernel = KernelSource(
        _kernel("  x[i] = 0.0f;").text.replace("if (i >= n) return;", "if (i >= n * g) return;")
    )
    kernel = KernelSource("__device__ int64_t g;\n" + kernel.text)
    (candidate,) = mechanism.candidates(kernel)
    with pytest.raises(MechanismRefused, match="not a kernel parameter"):
        mechanism.apply(kernel, candidate)


@pytest.mark.parametrize(
    ("carrier", "reason"), [({"coarsen": 1}, "one element"), ({"layout": "x"}, "not 'strided'")]
)
def test_bad_carriers_are_refused(carrier: dict[str, int | str], reason: str) -> None:
    kernel = _kernel("  x[i] = 0.0f;")
    with pytest.raises(MechanismRefused, match=reason):
        mechanism.apply(kernel, mechanism.candidates(kernel)[0], Carrier(**carrier))


def test_the_canonical_form_survives_edits_to_the_element_code_only() -> None:
    text = (FIXTURES / NAME / "before.cu").read_text()
    edited = KernelSource(text.replace("y[i] = fmaxf(x[i], 0.0f);", "y[i] = fmaxf(x[i], 1.0f);"))
    assert len([s for s in mechanism.detect(edited) if s.supported]) == 2
    swapped = KernelSource(text.replace("i_step < 4", "i_step < 3"))
    assert len([s for s in mechanism.detect(swapped) if s.supported]) == 1


def test_an_unroll_pragma_with_a_count_is_still_the_canonical_form() -> None:
    # experts write `#pragma unroll 4` as often as `#pragma unroll`; either belongs to
    # pragma_unroll and leaves the coarsened loop removable
    text = (FIXTURES / NAME / "before.cu").read_text()
    counted = KernelSource(text.replace("#pragma unroll\n", "#pragma unroll 4\n", 1))
    assert counted.text != text
    assert len([s for s in mechanism.detect(counted) if s.supported]) == 2
    other = KernelSource(text.replace("#pragma unroll\n", "#pragma nounroll\n", 1))
    assert len([s for s in mechanism.detect(other) if s.supported]) == 1
