"""The smem_histogram mechanism: fixtures both ways, expert forms, the top-k's refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import AxisAtMost, Prose
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get, remove_all
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok

NAME = "smem_histogram"
mechanism = get(NAME)
TOPK = KernelSource.from_file(REPO / "expert_kernels" / "topk" / "kernel.cu")
HELDOUT = KernelSource.from_file(REPO / "heldout" / "histogram" / "kernel.cu")
NAIVE = KernelSource.from_file(FIXTURES / NAME / "after.cu")

BYTE_HISTOGRAM = """\
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void hist256(const uint8_t* __restrict__ data, unsigned int* __restrict__ hist,
                        int n) {
  __shared__ unsigned int s_hist[256];
  if (threadIdx.x < 256) s_hist[threadIdx.x] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&s_hist[data[i]], 1u);
  __syncthreads();
  if (threadIdx.x < 256) atomicAdd(&hist[threadIdx.x], s_hist[threadIdx.x]);
}
extern "C" int run(const uint8_t* data, unsigned int* hist, int64_t n, cudaStream_t s) {
  hist256<<<120, 256, 0, s>>>(data, hist, (int)n);
  return (int)cudaGetLastError();
}
"""


def experts_listing(name: str) -> list[Path]:
    """The expert kernel folders whose mechanisms.json lists ``name``."""
    return [
        listed.parent
        for listed in sorted((REPO / "expert_kernels").glob("*/mechanisms.json"))
        if any(e["mechanism"] == name for e in json.loads(listed.read_text()))
    ]


class TestSmemHistogram(RoundTripSuite):
    mechanism = NAME


def test_an_expert_style_static_histogram_is_removed() -> None:
    source = KernelSource(BYTE_HISTOGRAM)
    (site,) = mechanism.detect(source)
    assert site.supported and site.detail == {"array": "s_hist", "target": "hist", "bins": "256"}
    plain = mechanism.remove(source, site).text
    body = plain[plain.index("int n) {") : plain.index('extern "C"')]
    assert body == (
        "int n) {\n"
        "  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; "
        "i += gridDim.x * blockDim.x)\n"
        "    atomicAdd(&hist[data[i]], 1u);\n"
        "}\n"
    )


def test_a_histogram_read_back_by_the_block_is_refused() -> None:
    consumed = KernelSource(
        BYTE_HISTOGRAM.replace(
            "  __syncthreads();\n  if (threadIdx.x < 256) atomicAdd",
            "  if (s_hist[0] > 7) hist[0] = 1;\n"
            "  __syncthreads();\n  if (threadIdx.x < 256) atomicAdd",
        )
    )
    (site,) = mechanism.detect(consumed)
    assert site.refusal is not None and "reads its histogram at line" in site.refusal
    assert remove_all(consumed, mechanism) is consumed


def test_topk_radix_histograms_are_detected_and_refused() -> None:
    sites = mechanism.detect(TOPK)
    assert [s.function for s in sites] == [
        "histogram_top",
        "select_from_candidates",
        "select_from_row",
    ]
    for site in sites:
        assert site.refusal is not None and "consumed inside the block" in site.refusal
        assert "per-block global scratch" in site.refusal
        with pytest.raises(MechanismRefused, match="consumed inside the block"):
            mechanism.remove(TOPK, site)
    assert remove_all(TOPK, mechanism) is TOPK
    assert mechanism.candidates(TOPK) == []


def test_topk_is_detected_where_its_mechanisms_json_says() -> None:
    folders = experts_listing(NAME)
    assert folders, "no expert kernel lists smem_histogram"
    for folder in folders:
        listed = json.loads((folder / "mechanisms.json").read_text())
        report = detection_recall(
            KernelSource.from_file(folder / "kernel.cu"),
            [e for e in listed if e["mechanism"] == NAME],
        )
        assert report.recall == 1.0, str(report)


def test_heldout_histogram_is_privatized_with_a_bins_condition() -> None:
    (candidate,) = mechanism.candidates(HELDOUT)
    assert candidate.function == "count_values" and candidate.supported
    private = mechanism.apply(HELDOUT, candidate)
    assert "extern __shared__ int32_t shared_counts[];" in private.text
    assert "[&] {" in private.text  # the early returns stay off the barriers
    assert "256, (size_t)bins * sizeof(int32_t), stream>>>" in private.text
    (site,) = mechanism.detect(private)
    (bound,) = [c for c in mechanism.conditions(private, site) if isinstance(c, AxisAtMost)]
    assert (bound.axis, bound.n) == ("bins", 12288)
    assert remove_all(private, mechanism).text == HELDOUT.text


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            ("atomicAdd(&counts[id], 1);", "atomicAdd(&counts[id], 1);\n  counts[0] += 0;"),
            "also read",
        ),
        (
            ("threadIdx.x;\n  if (i >= n)", "threadIdx.x + threadIdx.y;\n  if (i >= n)"),
            "threadIdx.y",
        ),
        (("(n + 255) / 256), 256, 0, stream", "(n + 255) / 256), dim3(256), 0, stream"), "dim3"),
    ],
)
def test_kernels_that_cannot_be_privatized_are_refused(edit: tuple[str, str], why: str) -> None:
    source = KernelSource(NAIVE.text.replace(*edit))
    assert source.text != NAIVE.text
    (candidate,) = mechanism.candidates(source)
    assert candidate.refusal is not None and why in candidate.refusal


def test_apply_needs_a_known_bin_count_that_fits() -> None:
    unguarded = KernelSource(NAIVE.text.replace("  if (id < 0 || id >= vocab) return;\n", ""))
    (candidate,) = mechanism.candidates(unguarded)
    with pytest.raises(MechanismRefused, match="cannot tell the number of bins"):
        mechanism.apply(unguarded, candidate)
    assert "shared_counts" in mechanism.apply(unguarded, candidate, Carrier(bins="vocab")).text
    with pytest.raises(MechanismRefused, match="exceed the 49152 bytes"):
        mechanism.apply(unguarded, candidate, Carrier(bins="20000"))
    with pytest.raises(MechanismRefused, match="neither a constant nor a parameter"):
        mechanism.apply(unguarded, candidate, Carrier(bins="n / 2"))
    dynamic = KernelSource(NAIVE.text.replace("256, 0, stream", "256, 64, stream"))
    with pytest.raises(MechanismRefused, match="already passes dynamic shared memory"):
        mechanism.apply(dynamic, mechanism.candidates(dynamic)[0])


def test_a_guard_on_a_shadowed_index_does_not_count() -> None:
    shadowed = KernelSource(
        NAIVE.text.replace(
            "  atomicAdd(&counts[id], 1);",
            "  {\n    const int64_t id = i;\n    atomicAdd(&counts[id], 1);\n  }",
        )
    )
    (candidate,) = mechanism.candidates(shadowed)
    with pytest.raises(MechanismRefused, match="cannot tell the number of bins"):
        mechanism.apply(shadowed, candidate)


def test_shared_memory_already_in_the_kernel_lowers_the_capacity() -> None:
    busy = KernelSource(
        NAIVE.text.replace(
            "  const int64_t i =", "  __shared__ float scratch[1024];\n  const int64_t i ="
        ).replace("  if (i >= n) return;\n", "  if (i >= n) scratch[0] = 0.f;\n")
    )
    (candidate,) = mechanism.candidates(busy)
    (bound,) = [c for c in mechanism.conditions(busy, candidate) if isinstance(c, AxisAtMost)]
    assert (bound.axis, bound.n) == ("vocab", (49152 - 4096) // 4)
    early = KernelSource(
        NAIVE.text.replace(
            "  const int64_t i =", "  __shared__ float scratch[1024];\n  const int64_t i ="
        )
    )
    (candidate,) = mechanism.candidates(early)
    assert (
        candidate.refusal is not None and "returns early and declares shared" in candidate.refusal
    )


def test_barriers_stay_when_the_kernel_has_other_shared_memory() -> None:
    other = KernelSource(
        BYTE_HISTOGRAM.replace(
            "  __shared__ unsigned int s_hist[256];\n",
            "  __shared__ unsigned int s_hist[256];\n  __shared__ int s_flag;\n",
        )
    )
    plain = remove_all(other, mechanism).text
    assert "s_hist" not in plain and plain.count("__syncthreads();") == 2


def test_conditions_of_a_static_histogram_bound_its_shared_memory() -> None:
    before = KernelSource.from_file(FIXTURES / NAME / "static.before.cu")
    (site,) = mechanism.detect(before)
    conditions = mechanism.conditions(before, site)
    assert any(isinstance(c, Prose) and "one-dimensional" in c.prose for c in conditions)
    assert any("at most 49152 bytes" in c.prose for c in conditions)


@pytest.mark.nvcc
def test_expert_and_heldout_rewrites_compile(mechanism_builder: Builder) -> None:
    sources: list[KernelSource] = []
    for folder in experts_listing(NAME):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        for site in mechanism.detect(kernel):
            if site.supported:
                sources.append(mechanism.remove(kernel, site))
            else:
                assert site.refusal.strip()
    (candidate,) = mechanism.candidates(HELDOUT)
    sources += [mechanism.apply(HELDOUT, candidate), KernelSource(BYTE_HISTOGRAM)]
    sources.append(remove_all(KernelSource(BYTE_HISTOGRAM), mechanism))
    compile_ok(mechanism_builder, sources)
