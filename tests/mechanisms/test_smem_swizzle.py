"""The smem_swizzle mechanism: an XOR-swizzled layout helper turned into the identity, and
back."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, expert_removal_builds

mechanism = get("smem_swizzle")


class TestSmemSwizzle(RoundTripSuite):
    mechanism = "smem_swizzle"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("smem_swizzle") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    # the wgmma gemm's swizzle is also the hardware's (descriptor mode) and is refused there;
    # whatever expert removals exist must compile, and the mma.sync gemm's must exist
    for name, ok, message in expert_removal_builds(mechanism_builder, "smem_swizzle"):
        assert ok, f"{name} does not compile:\n{message}"
    kernel = KernelSource.from_file(REPO / "bench" / "gemm_variants" / "mma_sync.cu")
    (site,) = [s for s in get("smem_swizzle").detect(kernel) if s.supported]
    removed = get("smem_swizzle").remove(kernel, site)
    (result,) = mechanism_builder.build_many([(removed.text, "mma_sync.cu")])
    assert result.ok, result.message


def test_inline_xors_are_refused() -> None:
    source = KernelSource(
        "__global__ void k(float* y) {\n  __shared__ float t[32][32];\n"
        "  t[threadIdx.y][threadIdx.x ^ (threadIdx.y & 7)] = 1.0f;\n  __syncthreads();\n"
        "  y[threadIdx.x] = t[threadIdx.x][threadIdx.y ^ (threadIdx.x & 7)];\n"
        "  y[threadIdx.y] = t[0][threadIdx.x ^ 16];  // an exchange, not a swizzle\n}\n"
    )
    sites = mechanism.detect(source)
    assert len(sites) == 2 and all("written inline" in (s.refusal or "") for s in sites)


def test_a_helper_used_once_is_refused() -> None:
    source = KernelSource(
        "__device__ int swizzle(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) "
        "<< 4); }\n__global__ void k(int* y) { y[0] = swizzle(1, 2); }\n"
    )
    (site,) = mechanism.detect(source)
    assert "called fewer than twice" in (site.refusal or "")


def test_apply_checks_the_chunks_fit_in_a_row() -> None:
    after = fixture_pairs("smem_swizzle")[0].after
    (candidate,) = mechanism.candidates(after)
    assert "(chunk ^ (row & 7))" in mechanism.apply(after, candidate).text
    with pytest.raises(MechanismRefused, match="multiple of 16 chunks"):
        mechanism.apply(after, candidate, Carrier(mask=15))
    with pytest.raises(MechanismRefused, match="is not 2\\^k - 1"):
        mechanism.apply(after, candidate, Carrier(mask=6))


def test_a_template_helper_is_checked_for_every_instantiation() -> None:
    from klineage.removal import reapply, remove_mechanism

    # fmha's swizzle<kD>: rows of kD * 2 bytes, kD = 64 or 128 from the launches: 8 or 16 chunks
    expert = KernelSource.from_file(REPO / "expert_kernels" / "fmha_fp16" / "kernel.cu")
    removal = remove_mechanism(expert, mechanism)
    assert removal.changed and reapply(removal).text == expert.text
    # an instantiation with 64-byte rows (kD = 32: 4 chunks) cannot hold an 8-chunk permutation
    narrow = KernelSource(removal.simplified.text.replace("launch<64>(", "launch<32>("))
    assert "launch<32>(" in narrow.text
    (candidate,) = mechanism.candidates(narrow)
    with pytest.raises(MechanismRefused, match="multiple of 8 chunks"):
        mechanism.apply(narrow, candidate)
