"""The warp_ballot_compaction mechanism: fixtures both ways, the top-k expert, uniformity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import BlockSizeMultiple, Prose
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get, remove_all
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok

NAME = "warp_ballot_compaction"
mechanism = get(NAME)
TOPK = KernelSource.from_file(REPO / "expert_kernels" / "topk" / "kernel.cu")


def experts_listing(name: str) -> list[Path]:
    """The expert kernel folders whose mechanisms.json lists ``name``."""
    return [
        listed.parent
        for listed in sorted((REPO / "expert_kernels").glob("*/mechanisms.json"))
        if any(e["mechanism"] == name for e in json.loads(listed.read_text()))
    ]


class TestWarpBallotCompaction(RoundTripSuite):
    mechanism = NAME


def _kernel(loop: str, claim: str = "claim_slot(i < n && x[i] > 0.f, count)") -> KernelSource:
    """A compaction kernel whose claim sits inside ``loop`` (``{}`` marks the body)."""
    body = f"const uint32_t slot = {claim};\n    if (slot != UINT32_MAX) y[slot] = x[i];"
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__device__ uint32_t claim_slot(bool take, uint32_t* counter) {\n"
        "  return take ? atomicAdd(counter, 1u) : UINT32_MAX;\n}\n"
        "__global__ void k(const float* x, float* y, uint32_t* count, int64_t n) {\n"
        f"  {loop.replace('{}', body)}\n}}\n"
        'extern "C" int run(const float* x, float* y, uint32_t* c, int64_t n, cudaStream_t s) {\n'
        "  k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, y, c, n);\n"
        "  return (int)cudaGetLastError();\n}\n"
    )


UNIFORM = "for (int64_t b = blockIdx.x * 256; b < n; b += 256 * gridDim.x) {\n    "
UNIFORM += "const int64_t i = b + threadIdx.x;\n    {}\n  }"


def test_a_claim_reached_by_whole_warps_is_a_candidate() -> None:
    (site,) = mechanism.candidates(_kernel(UNIFORM))
    assert site.supported, site.refusal


@pytest.mark.parametrize(
    ("loop", "why"),
    [
        (
            "const int64_t i = blockIdx.x * 256 + threadIdx.x;\n  if (i >= n) return;\n  {}",
            "the `return` at line 8 may leave some lanes behind",
        ),
        ("for (int64_t i = threadIdx.x; i < n; i += 256) {\n    {}\n  }", "`i < n` may differ"),
        (
            "const int64_t i = threadIdx.x;\n  if (x[i] > 0.f) {\n    {}\n  }",
            "`(x[i] > 0.f)` may differ",
        ),
        (UNIFORM.replace("{}", "if (i >= n) break;\n    {}"), "the `break` at line"),
    ],
)
def test_a_claim_some_lanes_may_skip_is_refused(loop: str, why: str) -> None:
    source = _kernel(loop)
    (site,) = mechanism.candidates(source)
    assert site.refusal is not None and why in site.refusal
    with pytest.raises(MechanismRefused, match="reach"):
        mechanism.apply(source, site)


def test_a_claim_with_side_effects_in_its_predicate_is_refused() -> None:
    source = _kernel(UNIFORM, claim="i < n && x[i] > 0.f ? atomicAdd(count, 1u) : UINT32_MAX")
    assert mechanism.candidates(source)[-1].supported
    impure = _kernel(UNIFORM, claim="(y[i]++ > 0.f) ? atomicAdd(count, 1u) : UINT32_MAX")
    sites = [s for s in mechanism.candidates(impure) if s.function == "k"]
    assert sites and "side effects" in (sites[0].refusal or "")


def test_topk_claim_slot_is_removed_to_one_atomic_per_lane() -> None:
    (site,) = mechanism.detect(TOPK)
    assert site.supported and site.function == "claim_slot"
    plain = mechanism.remove(TOPK, site)
    assert "return take ? atomicAdd(counter, (uint32_t)1) : UINT32_MAX;" in plain.text
    assert "__ballot_sync" not in plain.text and mechanism.detect(plain) == []


def test_topk_claim_slot_is_reapplied_through_lambdas_and_helpers() -> None:
    """claim_slot is called from lambdas handed to for_each_uniform and from a loop over
    shared-memory candidates: the uniformity analysis follows both."""
    plain = remove_all(TOPK, mechanism)
    (candidate,) = mechanism.candidates(plain)
    assert candidate.supported, candidate.refusal
    again = mechanism.apply(plain, candidate)
    assert [s.supported for s in mechanism.detect(again)] == [True]
    assert remove_all(again, mechanism).text == plain.text


def test_topk_is_detected_where_its_mechanisms_json_says() -> None:
    folders = experts_listing(NAME)
    assert folders, "no expert kernel lists warp_ballot_compaction"
    for folder in folders:
        report = detection_recall(
            KernelSource.from_file(folder / "kernel.cu"),
            [
                e
                for e in json.loads((folder / "mechanisms.json").read_text())
                if e["mechanism"] == NAME
            ],
        )
        assert report.recall == 1.0, str(report)


def test_other_ballot_atomics_are_detected_and_refused() -> None:
    counting = KernelSource(
        "__global__ void k(const float* x, unsigned* total) {\n"
        "  const bool keep = x[threadIdx.x] > 0.f;\n"
        "  if ((threadIdx.x & 31) == 0)\n"
        "    atomicAdd(total, __popc(__ballot_sync(0xffffffffu, keep)));\n"
        "}\n"
    )
    (site,) = mechanism.detect(counting)
    assert site.refusal is not None and "only counts" in site.refusal
    partial = KernelSource(
        TOPK.text.replace("__ballot_sync(kFullMask, take)", "__ballot_sync(0xffffu, take)")
    )
    (site,) = mechanism.detect(partial)
    assert site.refusal is not None and "full warp mask" in site.refusal
    assert remove_all(partial, mechanism) is partial


def test_an_early_exit_before_a_declared_slot_is_refused() -> None:
    """Removing `if (mask == 0) return ...;` would run the code after the slot where the
    original returned."""
    before = KernelSource.from_file(FIXTURES / NAME / "inline.before.cu")
    early = before.text.replace(
        "    const int slot_lane", "    if (slot_mask == 0) return;\n    const int slot_lane"
    )
    (site,) = mechanism.detect(KernelSource(early))
    assert site.refusal is not None and "does not return a value" in site.refusal


def test_conditions_state_whole_warps_and_slot_order() -> None:
    (site,) = mechanism.detect(TOPK)
    conditions = mechanism.conditions(TOPK, site)
    (multiple,) = [c for c in conditions if isinstance(c, BlockSizeMultiple)]
    assert multiple.k == 32 and multiple.block_size == "1024"
    prose = " ".join(c.prose for c in conditions if isinstance(c, Prose))
    assert "must not depend on slot order" in prose and "warp-uniform" in prose


@pytest.mark.nvcc
def test_expert_removals_and_reapplications_compile(mechanism_builder: Builder) -> None:
    sources: list[KernelSource] = []
    for folder in experts_listing(NAME):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        for site in mechanism.detect(kernel):
            assert site.supported, f"{folder.name}: {site} refused: {site.refusal}"
            plain = mechanism.remove(kernel, site)
            sources.append(plain)
            for candidate in mechanism.candidates(plain):
                sources.append(mechanism.apply(plain, candidate))
    sources.append(mechanism.apply(_kernel(UNIFORM), mechanism.candidates(_kernel(UNIFORM))[0]))
    compile_ok(mechanism_builder, sources)
