"""The tensor_core_mma mechanism: mma.sync emulated on the FMA pipes, and put back."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast, BlockSizeMultiple
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("tensor_core_mma")


class TestTensorCoreMma(RoundTripSuite):
    mechanism = "tensor_core_mma"


def _asm_kernel(instruction: str, operands: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_fp16.h>\n#include <stdint.h>\n"
        "__device__ void f(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {\n"
        f'  asm volatile("{instruction}" {operands});\n}}\n'
    )


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("tensor_core_mma") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "tensor_core_mma")


def test_the_emulation_gathers_the_fragments_of_the_ptx_layout() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    (site,) = [s for s in mechanism.detect(before) if s.node_kind == "expression_statement"]
    text = mechanism.remove(before, site).text
    # A rows g and g + 8 come from lane 4 g + s; B columns 2t and 2t + 1 from lanes
    # 4 (2t) + s and 4 (2t + 1) + s; the bf16 pairs unpack low half first.
    for piece in (
        "kl_a[2 * kl_h], 4 * kl_g + kl_s",
        "kl_a[2 * kl_h + 1], 4 * kl_g + kl_s",
        "kl_b[kl_h], 8 * kl_t + kl_s",
        "kl_b[kl_h], 8 * kl_t + 4 + kl_s",
        "kl_d[3] += kl_y0 * kl_q0 + kl_y1 * kl_q1;",
        "__uint_as_float((kl_a_lo) << 16)",
        "float kl_d[4] = {d[0], d[1], d[2], d[3]};",
        "d[3] = kl_d[3];",
    ):
        assert piece in text


def test_the_wrapper_and_its_call_sites_go_together() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    sites = mechanism.detect(before)
    assert [s.node_kind for s in sites] == ["expression_statement", "call_expression"]
    call = sites[1]
    assert call.function == "gemm_mma" and call.detail["wrapper"] == "mma_m16n8k16"
    assert mechanism.remove(before, call).text == mechanism.remove(before, sites[0]).text


@pytest.mark.parametrize(
    ("instruction", "operands", "reason"),
    [
        (
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
            "{%0,%1,%2,%3};",
            ': "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b0)',
            "is not m16n8k16.row.col",
        ),
        ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0}, %1, %2;", "", "wgmma"),
    ],
)
def test_other_forms_are_detected_and_refused(instruction: str, operands: str, reason: str) -> None:
    source = _asm_kernel(instruction, operands)
    (site,) = mechanism.detect(source)
    assert site.refusal is not None and reason in site.refusal
    with pytest.raises(MechanismRefused, match=reason):
        mechanism.remove(source, site)


def test_wmma_is_detected_and_refused() -> None:
    source = KernelSource(
        "#include <mma.h>\nusing namespace nvcuda;\n"
        "__global__ void k() { wmma::mma_sync(c, a, b, c); }\n"
    )
    (site,) = mechanism.detect(source)
    assert "opaque" in (site.refusal or "")


def test_apply_restores_only_its_own_emulation() -> None:
    naive = fixture_pairs("tensor_core_mma")[0].after
    assert [c for c in mechanism.candidates(naive) if c.supported]
    edited = KernelSource(naive.text.replace("kl_d[0] += kl_x0", "kl_d[0] -= kl_x0"))
    (candidate,) = mechanism.candidates(edited)
    assert "edited since the removal" in (candidate.refusal or "")
    with pytest.raises(MechanismRefused, match="edited since the removal"):
        mechanism.apply(edited, candidate)
    scalar = KernelSource.from_file(REPO / "heldout" / "sgemm" / "kernel.cu")
    (loop,) = mechanism.candidates(scalar)
    with pytest.raises(MechanismRefused, match="re-tiles the loop"):
        mechanism.apply(scalar, loop)


def test_conditions() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    conditions = mechanism.conditions(before, mechanism.detect(before)[1])
    arch = next(c for c in conditions if isinstance(c, ArchAtLeast))
    assert arch.sm == 80 and not arch.specific
    warp = next(c for c in conditions if isinstance(c, BlockSizeMultiple))
    assert (warp.k, warp.block_size) == (32, "32")
    assert any("multiple of 16" in c.prose for c in conditions)


def test_an_f16_mma_removed_from_the_fmha_expert_is_restorable() -> None:
    # the f16 emulation needs cuda_fp16.h: a need of the whole file, so the remembered
    # statement (parsed alone when the stash is checked) must not be refused for lacking it
    expert = KernelSource.from_file(REPO / "expert_kernels" / "fmha_fp16" / "kernel.cu")
    site = next(s for s in mechanism.detect(expert) if s.node_kind == "expression_statement")
    assert site.supported and "f16.f16" in str(site.detail["instruction"])
    simplified = mechanism.remove(expert, site)
    (candidate,) = [c for c in mechanism.candidates(simplified) if c.supported]
    assert mechanism.apply(simplified, candidate).text == expert.text
    without_header = KernelSource(expert.text.replace("#include <cuda_fp16.h>", ""))
    site = next(
        s for s in mechanism.detect(without_header) if s.node_kind == "expression_statement"
    )
    assert site.refusal == "the f16 emulation needs cuda_fp16.h, which the file lacks"
