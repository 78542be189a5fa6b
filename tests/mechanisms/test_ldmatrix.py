"""The ldmatrix mechanism: ldmatrix emulated with shuffles and shared loads, and put back."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection

mechanism = get("ldmatrix")


class TestLdmatrix(RoundTripSuite):
    mechanism = "ldmatrix"


# The gemm expert's tiled path moved to wgmma (descriptors, no ldmatrix); its earlier
# mma.sync + ldmatrix version is kept and verified correct on an H200.
MMA_SYNC_GEMM = REPO / "bench" / "gemm_variants" / "mma_sync.cu"


def test_experts_listing_it_are_detected() -> None:
    check_expert_detection("ldmatrix")  # asserts each listing, if any expert lists it
    sites = get("ldmatrix").detect(KernelSource.from_file(MMA_SYNC_GEMM))
    assert len(sites) == 3 and all(s.supported for s in sites)


@pytest.mark.nvcc
def test_every_removal_in_the_mma_sync_gemm_compiles(mechanism_builder: Builder) -> None:
    kernel = KernelSource.from_file(MMA_SYNC_GEMM)
    subject = get("ldmatrix")
    removed = [subject.remove(kernel, site) for site in subject.detect(kernel)]
    results = mechanism_builder.build_many([(k.text, "mma_sync.cu") for k in removed])
    assert len(results) == 3
    for result in results:
        assert result.ok, result.message


def test_lanes_fetch_the_row_address_of_the_lane_that_holds_it() -> None:
    before = fixture_pairs("ldmatrix")[0].before
    x4 = mechanism.detect(before)[0]
    text = mechanism.remove(before, x4).text
    assert "__shfl_sync(0xffffffffu, kl_addr, 8 * kl_i + (kl_lane >> 2))" in text
    assert "__cvta_shared_to_generic(kl_row + 4u * (kl_lane & 3))" in text
    trans = next(p for p in fixture_pairs("ldmatrix") if p.case == "trans").before
    site = next(s for s in mechanism.detect(trans) if s.detail["instruction"].count(".trans"))
    transposed = mechanism.remove(trans, site).text
    assert "8 * kl_i + 2 * (kl_lane & 3) + 1" in transposed
    assert "kl_r[kl_i] = kl_lo | (kl_hi << 16);" in transposed


def test_addresses_with_offsets_and_other_shapes_are_refused() -> None:
    source = KernelSource(
        "#include <stdint.h>\n__device__ void f(uint32_t (&r)[1], uint32_t a) {\n"
        '  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1+16];" '
        ': "=r"(r[0]) : "r"(a));\n'
        '  asm volatile("ldmatrix.sync.aligned.m16n16.x1.trans.shared.b8 {%0}, [%1];" '
        ': "=r"(r[0]) : "r"(a));\n}\n'
    )
    offset, shape = mechanism.detect(source)
    assert "not a plain register operand" in (offset.refusal or "")
    assert "m8n8.x1/x2/x4" in (shape.refusal or "")
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, shape)


def test_conditions() -> None:
    before = fixture_pairs("ldmatrix")[0].before
    conditions = mechanism.conditions(before, mechanism.detect(before)[0])
    assert any(isinstance(c, ArchAtLeast) and c.sm == 75 for c in conditions)
