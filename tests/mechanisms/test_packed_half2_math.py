"""The packed_half2_math mechanism: fixtures both ways, the rmsnorm expert, pairs, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import ArchAtLeast
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok, removal_chain
from tests.mechanisms.test_vectorized_access import listing_experts

NAME = "packed_half2_math"
mechanism = get(NAME)
EXPERTS = listing_experts(NAME)


class TestPackedHalf2Math(RoundTripSuite):
    mechanism = NAME


@pytest.mark.parametrize("expert", EXPERTS, ids=[p.name for p in EXPERTS])
def test_detect_finds_what_the_expert_lists(expert: Path) -> None:
    entries = json.loads((expert / "mechanisms.json").read_text())
    listed = [e for e in entries if e["mechanism"] == NAME]
    report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
    assert report.recall == 1.0, str(report)


@pytest.mark.nvcc
def test_every_expert_site_is_removable_and_compiles(mechanism_builder: Builder) -> None:
    without = []
    for expert in EXPERTS:
        kernel = KernelSource.from_file(expert / "kernel.cu")
        sites = mechanism.detect(kernel)
        assert sites and all(s.supported for s in sites), [str(s) for s in sites]
        for site in sites:
            assert len(mechanism.detect(mechanism.remove(kernel, site))) == len(sites) - 1
        chain = removal_chain(mechanism, kernel)
        assert len(chain.sites) == len(sites)
        without.append(KernelSource(chain.states[-1].text, name=f"{expert.name}-unpacked"))
    compile_ok(mechanism_builder, without)


def test_rmsnorm_hadd2_on_union_fields_becomes_two_scalar_adds() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels/fused_add_rmsnorm/kernel.cu")
    (hadd2,) = [s for s in mechanism.detect(kernel) if s.detail["intrinsic"] == "__hadd2"]
    assert hadd2.detail["precision"] == "bf16"
    removed = mechanism.remove(kernel, hadd2)
    assert (
        "row[i].pair[j] = __halves2bfloat162(__hadd(a[i].pair[j].x, row[i].pair[j].x), "
        "__hadd(a[i].pair[j].y, row[i].pair[j].y));"
    ) in removed.text
    assert mechanism.conditions(kernel, hadd2) == [
        ArchAtLeast(sm=80, why="packed bfloat162 arithmetic needs sm_80")
    ]


def _device(body: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
        "template <typename T>\n"
        "__device__ T twice(T a, T b, __half2* h, __nv_bfloat162 r, __nv_bfloat162 s) {\n"
        f"{body}\n}}\n"
    )


def test_adjacent_scalar_halves_pair_up() -> None:
    body = "  r.x = __hmul(r.x, s.x);\n  r.y = __hmul(r.y, s.y);\n  return a;"
    kernel = _device(body)
    (candidate,) = mechanism.candidates(kernel)
    assert candidate.detail == {"precision": "bf16", "kind": "arithmetic"}
    applied = mechanism.apply(kernel, candidate)
    assert "  r = __hmul2(r, s);\n  return a;" in applied.text
    assert [s.detail["intrinsic"] for s in mechanism.detect(applied)] == ["__hmul2"]


@pytest.mark.parametrize(
    "body",
    [
        "  r.x = __hmul(r.x, s.x);\n  r.y = __hadd(r.y, s.y);\n  return a;",  # two operations
        "  r.x = __hmul(r.x, s.x);\n  r.y = __hmul(s.y, r.y);\n  return a;",  # swapped
        "  h[0].x = __hmul(r.x, s.x);\n  h[0].y = __hmul(r.y, s.y);\n  return a;",  # types
        "  h[0] = __halves2half2(__hmul(h[1].x, h[2].x), __hmul(h[1].y, h[3].y));\n  return a;",
    ],
)
def test_halves_that_do_not_match_are_not_candidates(body: str) -> None:
    assert mechanism.candidates(_device(body)) == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("  return __hadd2(a, b);", "type is unknown"),
        ("  h[0] = __hmul2(h[1], h[2]++);\n  return a;", "side effects"),
        ("  h[0] = __hfma2(h[1], h[2]);\n  return a;", "2 arguments"),
    ],
)
def test_unsafe_sites_are_detected_but_refused(body: str, reason: str) -> None:
    kernel = _device(body)
    (site,) = mechanism.detect(kernel)
    assert reason in (site.refusal or "")
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.remove(kernel, site)


def test_conversions_need_no_architecture() -> None:
    kernel = _device("  const float2 f = __bfloat1622float2(r);\n  return a;")
    (site,) = mechanism.detect(kernel)
    assert site.detail["kind"] == "from_pair" and mechanism.conditions(kernel, site) == []


def test_an_operation_inside_another_waits_for_it() -> None:
    kernel = _device("  const float2 f = __half22float2(__hmul2(h[0], h[1]));\n  return a;")
    outer, inner = mechanism.detect(kernel)
    assert "remove that one first" in (outer.refusal or "") and inner.supported
    chain = removal_chain(mechanism, kernel)
    assert [s.detail["intrinsic"] for s in chain.sites] == ["__hmul2", "__half22float2"]
    assert "__hmul2" not in chain.states[-1].text and "__half22float2" not in chain.states[-1].text
