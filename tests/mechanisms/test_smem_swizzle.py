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
    # every expert removal must compile (the wgmma gemm's moves its descriptors with it), and
    # the mma.sync gemm's must exist
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
    from klineage.mining.removal import reapply, remove_mechanism

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


GEMM = REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu"


def test_a_layout_wgmma_reads_moves_with_its_descriptors() -> None:
    from klineage.mining.removal import reapply, remove_mechanism

    expert = KernelSource.from_file(GEMM)
    (site,) = mechanism.detect(expert)
    assert site.supported and site.detail["pitch"] == "(kBK * 2)"
    removal = remove_mechanism(expert, mechanism)
    text = removal.simplified.text
    # interleaved core matrices, read with swizzle mode 0, LBO 128 and k16 steps of 256 bytes
    assert "(row >> 3) * 1024 + chunk * 128 + (row & 7) * 16" in text
    assert "desc |= (uint64_t)0 << 62;" in text and "(uint64_t)(128 >> 4) << 16" in text
    assert "smem_desc(a_base + ks * 256), smem_desc(b_base + ks * 256)" in text
    assert "^ (row & 7)" not in text and "ks * 32" not in text
    assert reapply(removal).text == expert.text
    (condition,) = mechanism.conditions(expert, site)
    assert "128-byte swizzle mode" in condition.text


def _wgmma_file(helper: str, call: str, lbo: int = 16, mode: int = 1) -> KernelSource:
    return KernelSource(
        "#include <stdint.h>\n"
        f"__device__ uint32_t swizzle(int row, int chunk) {{ return (uint32_t)({helper}); }}\n"
        "__device__ uint64_t smem_desc(uint32_t addr) {\n"
        "  uint64_t desc = (uint64_t)((addr & 0x3FFFF) >> 4);\n"
        f"  desc |= (uint64_t)({lbo} >> 4) << 16;\n  desc |= (uint64_t)(1024 >> 4) << 32;\n"
        f"  desc |= (uint64_t){mode} << 62;\n  return desc;\n}}\n"
        "__global__ void k(uint64_t* y, uint32_t base) {\n"
        '  asm volatile("// wgmma.mma_async stands here");\n'
        f"  y[0] = swizzle(threadIdx.x, 1);\n  for (int ks = 0; ks < 4; ++ks) y[ks] = {call};\n}}\n"
    )


def test_descriptor_forms_outside_the_rule_are_refused() -> None:
    swizzled = "row * 128 + ((chunk ^ (row & 7)) << 4)"
    ok = _wgmma_file(swizzled, "smem_desc(base + ks * 32)")
    (site,) = mechanism.detect(ok)
    assert site.supported
    cases = {
        "rows of 256 bytes": _wgmma_file(
            swizzled.replace("128", "256"), "smem_desc(base + ks * 32)"
        ),
        "adds a 'k * step' offset": _wgmma_file(swizzled, "smem_desc(base)"),
        "a constant is added": _wgmma_file(swizzled, "smem_desc(base + ks * 32 + 16)"),
        "swizzle mode 0": _wgmma_file(swizzled, "smem_desc(base + ks * 32)", mode=0),
        "k step 24": _wgmma_file(swizzled, "smem_desc(base + ks * 24)"),
    }
    for reason, kernel in cases.items():
        (site,) = mechanism.detect(kernel)
        assert reason in (site.refusal or ""), (reason, site.refusal)


def test_apply_needs_the_interleaved_form_the_removal_writes() -> None:
    interleaved = "(row >> 3) * 1024 + chunk * 128 + (row & 7) * 16"
    plain = _wgmma_file(interleaved, "smem_desc(base + ks * 256)", lbo=128, mode=0)
    (candidate,) = mechanism.candidates(plain)
    applied = mechanism.apply(plain, candidate).text
    assert "row * 128 + ((chunk ^ (row & 7)) << 4)" in applied and "ks * 32" in applied
    assert "(uint64_t)1 << 62" in applied and "(uint64_t)(16 >> 4) << 16" in applied
    other = _wgmma_file("row * 128 + chunk * 16", "smem_desc(base + ks * 256)", lbo=128, mode=0)
    (candidate,) = mechanism.candidates(other)
    with pytest.raises(MechanismRefused, match="not the interleaved core-matrix layout"):
        mechanism.apply(other, candidate)
    with pytest.raises(MechanismRefused, match="the descriptors' swizzle is mask 7"):
        mechanism.apply(plain, mechanism.candidates(plain)[0], Carrier(mask=3))


def test_the_card_shows_each_place_the_layout_moved() -> None:
    """The descriptor, the helper and the k steps are far apart in the file: the skill's
    before/after anchor shows the three places, not one window cut off after the first."""
    from klineage.mining.removal import remove_mechanism
    from klineage.skills import anchor_of

    expert = KernelSource.from_file(GEMM)
    removal = remove_mechanism(expert, mechanism)
    before, after = anchor_of(removal.simplified.text, expert.text, None)
    assert before.count("// ...") == after.count("// ...") == 2
    assert "(uint64_t)0 << 62" in before and "(uint64_t)1 << 62" in after
    assert "chunk * 128" in before and "(chunk ^ (row & 7)) << 4" in after
    assert "ks * 256" in before and "ks * 32" in after


def test_the_layout_helper_is_recognized_by_what_it_computes_not_its_name() -> None:
    pair = fixture_pairs("smem_swizzle")[0]
    renamed = KernelSource(pair.before.text.replace("swizzle(", "tile_offset("))
    (site,) = mechanism.detect(renamed)
    assert site.supported and site.function == "tile_offset"
    expected = pair.after.text.replace("swizzle(", "tile_offset(")
    assert mechanism.remove(renamed, site).text == expected
    (candidate,) = mechanism.candidates(KernelSource(expected))
    assert candidate.function == "tile_offset"


def test_a_helper_named_swizzle_that_computes_no_layout_is_not_one() -> None:
    hashed = KernelSource(
        "__device__ int swizzle(int key, int salt) { return key ^ (salt & 7); }\n"
        "__global__ void k(int* y) { y[threadIdx.x] = swizzle(threadIdx.x, 3) + swizzle(1, 2); }\n"
    )
    assert mechanism.detect(hashed) == [] and mechanism.candidates(hashed) == []
