"""The smem_padding mechanism: padded shared tiles and padded row pitches, both ways."""

from __future__ import annotations

import pytest

from klineage.conditions import SharedMemoryAtMost
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("smem_padding")


class TestSmemPadding(RoundTripSuite):
    mechanism = "smem_padding"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("smem_padding") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "smem_padding")


def test_apply_pads_the_last_extent_by_one_by_default() -> None:
    after = fixture_pairs("smem_padding")[0].after
    (candidate,) = mechanism.candidates(after)
    padded = mechanism.apply(after, candidate)
    assert "__shared__ float tile[TILE][TILE + 1];" in padded.text
    (condition,) = mechanism.conditions(after, candidate)
    assert isinstance(condition, SharedMemoryAtMost)
    assert (condition.bytes, condition.usage) == (48 * 1024, "(4096) + 128")
    with pytest.raises(MechanismRefused, match=r"not in 1\.\.64"):
        mechanism.apply(after, candidate, Carrier(pad=100))


def test_a_pitch_needs_its_pad_from_the_carrier() -> None:
    after = next(p for p in fixture_pairs("smem_padding") if p.case == "pitch").after
    (candidate,) = mechanism.candidates(after)
    with pytest.raises(MechanismRefused, match="counts in its own unit"):
        mechanism.apply(after, candidate)
    assert "kTile * 4 + 8;" in mechanism.apply(after, candidate, Carrier(pad=8)).text


def test_a_tile_used_through_a_pointer_is_refused() -> None:
    source = KernelSource(
        "__global__ void k(float* y) {\n  __shared__ float t[32][32 + 1];\n"
        "  float* p = &t[0][0];\n  t[threadIdx.x][0] = 1.0f;\n  y[0] = p[40];\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "other than as a full subscript" in (site.refusal or "")


def test_loose_extents_get_parentheses() -> None:
    source = KernelSource(
        "__global__ void k(float* y) {\n  __shared__ float t[8][1 << 5];\n"
        "  t[threadIdx.y][threadIdx.x] = 1.0f;\n  y[0] = t[0][0];\n}\n"
    )
    (candidate,) = mechanism.candidates(source)
    assert "t[8][(1 << 5) + 1]" in mechanism.apply(source, candidate).text


def _staged_heldout(problem: str) -> KernelSource:
    """The held-out naive GEMM with smem_staging's forward rewrite: the 2-D tiles to pad."""
    from tests.conftest import REPO

    staging = get("smem_staging")
    naive = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
    return staging.apply(naive, staging.candidates(naive)[0])


@pytest.mark.parametrize("problem", ["sgemm", "batched_hgemm"])
def test_apply_pads_the_tiles_smem_staging_writes(problem: str) -> None:
    staged = _staged_heldout(problem)
    assert not mechanism.detect(staged)
    candidates = [c for c in mechanism.candidates(staged) if c.supported]
    assert len(candidates) == 2
    padded = staged
    for _ in candidates:
        padded = mechanism.apply(padded, next(c for c in mechanism.candidates(padded)))
    assert KernelSource(padded.text).parsed.errors == ()
    assert "__shared__ float tile_a[16][16 + 1];" in padded.text
    assert len(mechanism.detect(padded)) == 2


@pytest.mark.nvcc
def test_the_padded_staged_heldout_gemms_compile(mechanism_builder: Builder) -> None:
    from tests.mechanisms.roundtrip import compile_ok

    padded = []
    for problem in ("sgemm", "batched_hgemm"):
        staged = _staged_heldout(problem)
        padded.append(mechanism.apply(staged, mechanism.candidates(staged)[0]))
    compile_ok(mechanism_builder, padded)


# A Hopper epilogue in the idiom of public warp-specialized GEMMs: each consumer warpgroup
# stores its accumulators into a padded C tile with stmatrix, at lane offsets computed from the
# padded pitch, and one thread hands the tile to a TMA store whose box was encoded padded.
PADDED_EPILOGUE = """
#include <cuda.h>
#include <cuda_bf16.h>
template <int BM, int BN>
struct Tiles {
    alignas(128) __nv_bfloat16 C[BN * (BM + 8)];
};
__device__ void store_tile(const CUtensorMap* map, __nv_bfloat16* tile, int row, int col);
template <int BM, int BN>
__global__ void epilogue(const __grid_constant__ CUtensorMap mapC) {
    extern __shared__ __align__(128) unsigned char buffer[];
    Tiles<BM, BN>& tiles = *reinterpret_cast<Tiles<BM, BN>*>(buffer);
    __nv_bfloat16* sC = tiles.C;
    constexpr int kRowsPadded = BM + 8;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __nv_bfloat16* tile = sC + warp * kRowsPadded * 16;
    unsigned offset = (lane % 8) * kRowsPadded + (lane & 8);
    unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(tile)) + offset * 2;
    asm volatile("stmatrix.sync.aligned.m8n8.x1.trans.shared::cta.b16 [%0], {%1};"
                 :: "r"(addr), "r"(0));
    if (threadIdx.x == 0) store_tile(&mapC, tile, blockIdx.y * BM, blockIdx.x * BN);
}
"""


def test_a_padded_pitch_lane_offsets_and_a_tensor_map_also_use_is_detected_and_refused() -> None:
    """Detected by its name and its `E + P` form; refused, naming the lane offset and the
    tensor-map copy that still assume the padded rows (dropping the pad alone breaks them)."""
    (site,) = mechanism.detect(KernelSource(PADDED_EPILOGUE))
    assert site.detail == {"pitch": "kRowsPadded", "pad": "8"}
    assert not site.supported
    reason = site.refusal or ""
    assert "used at line 17" in reason and "(lane % 8) * kRowsPadded" in reason
    assert "tensor-map copy at line 21" in reason and "store_tile(&mapC, tile" in reason
    with pytest.raises(MechanismRefused):
        mechanism.remove(KernelSource(PADDED_EPILOGUE), site)


def test_without_a_tensor_map_the_refusal_names_only_the_other_use() -> None:
    text = PADDED_EPILOGUE.replace(
        "    if (threadIdx.x == 0) store_tile(&mapC, tile, blockIdx.y * BM, blockIdx.x * BN);\n",
        "",
    )
    (site,) = mechanism.detect(KernelSource(text))
    assert "used at line 17" in (site.refusal or "") and "tensor-map" not in (site.refusal or "")


def test_a_padded_constant_that_never_addresses_shared_memory_is_not_a_site() -> None:
    """A name saying pad is not enough: some use must address a shared buffer."""
    text = (
        "constexpr int kRowPadded = 64 + 8;\n"
        "__global__ void k(float* y) { y[threadIdx.x * kRowPadded] = 0.0f; }\n"
    )
    assert mechanism.detect(KernelSource(text)) == []
