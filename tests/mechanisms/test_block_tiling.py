"""The block_tiling mechanism: detected in tiled GEMMs; removal and application refused,
except for the width of a wgmma tile (N 256 <-> 128), which moves with its wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from klineage.mechanisms._wgmma_tile import RetileRefused, _retemplate, wgmma_wrappers
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("block_tiling")


class TestBlockTiling(RoundTripSuite):
    mechanism = "block_tiling"

    def test_forward_restores_before(self) -> None:
        """Nothing is removed, and there is nowhere to apply it: both refused."""
        for pair in self.pairs():
            assert pair.before.text == pair.after.text
            (site,) = self.subject.detect(pair.before)
            with pytest.raises(MechanismRefused, match="re"):
                self.subject.remove(pair.before, site)
            assert self.subject.candidates(pair.before) == []


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("block_tiling") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    """gemm_bf16's wide wgmma tile is the one expert tile a rule narrows."""
    check_expert_removals_compile(mechanism_builder, "block_tiling")


def test_the_site_is_the_tile_extents() -> None:
    before = fixture_pairs("block_tiling")[0].before
    (site,) = mechanism.detect(before)
    assert site.detail["extents"] == "kBM,kBN" and (site.start_line, site.end_line) == (8, 9)


def test_one_origin_is_not_a_tile() -> None:
    source = KernelSource(
        "constexpr int kThreads = 256;\n__global__ void k(float* y) {\n"
        "  const int i = blockIdx.x * kThreads + threadIdx.x;\n  y[i] = 0.0f;\n}\n"
    )
    assert mechanism.detect(source) == []


# ----------------------------------------------------------------------------- wgmma width

GEMM = Path(__file__).resolve().parents[2] / "expert_kernels" / "gemm_bf16" / "kernel.cu"


def _gemm(text: str | None = None) -> KernelSource:
    return KernelSource(text if text is not None else GEMM.read_text(), name="gemm_bf16")


def _wide(kernel: KernelSource) -> Site:
    (site,) = [s for s in mechanism.detect(kernel) if s.supported]
    return site


def test_the_wgmma_tile_has_a_removable_site_at_its_n_extent() -> None:
    kernel = _gemm()
    refused, wide = mechanism.detect(kernel)
    assert refused.refusal is not None and wide.refusal is None
    assert wide.detail["extent"] == "kBN" and wide.detail["n"] == 256
    assert kernel.parsed.text_of((wide.start_byte, wide.end_byte)) == "kBN = 256"


def test_removal_narrows_the_tile_the_wrapper_and_the_accumulators_together() -> None:
    kernel = _gemm()
    narrow = mechanism.remove(kernel, _wide(kernel))
    text = narrow.text
    assert "constexpr int kBN = 128;" in text
    assert "void wgmma_m64n128k16(float (&d)[64]" in text
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" in text
    assert '"}, %64, %65, 1, 1, 1, 0, 0;\\n"' in text
    assert '"+f"(d[63])' in text and '"+f"(d[64])' not in text
    assert "float d[64];" in text and "i < 64; ++i) d[i] = 0.0f;" in text
    assert "wgmma_m64n128k16(d, smem_desc(" in text and "m64n256k16(d" not in text
    # the narrow tile is no longer the widest one; the tile itself is still detected
    assert [s.supported for s in mechanism.detect(narrow)] == [False]
    (candidate,) = mechanism.candidates(narrow)
    assert candidate.detail["n"] == 128


def test_the_carried_wrapper_restores_the_expert_byte_for_byte() -> None:
    kernel = _gemm()
    site = _wide(kernel)
    carrier = mechanism.carrier_of(kernel, site)
    assert "m64n256k16" in str(carrier.as_dict()["wrapper"])
    narrow = mechanism.remove(kernel, site)
    (candidate,) = mechanism.candidates(narrow)
    assert mechanism.apply(narrow, candidate, carrier).text == kernel.text


def test_without_a_carrier_the_wrapper_is_rendered_with_every_operand() -> None:
    kernel = _gemm()
    narrow = mechanism.remove(kernel, _wide(kernel))
    (candidate,) = mechanism.candidates(narrow)
    wide = mechanism.apply(narrow, candidate)
    (wrapper,) = wgmma_wrappers(wide.parsed)
    assert wrapper.n == 256 and wrapper.function.name == "wgmma_m64n256k16"
    assert [o.constraint for o in wrapper.asm.operands] == ["+f"] * 128 + ["l", "l"]
    assert "{%0, %1," in wrapper.asm.template and "%127}, %128, %129, 1, 1, 1, 0, 0;" in (
        wrapper.asm.template
    )
    # only the wrapper's line breaks differ from the expert's
    assert wide.text.replace("\n", "").replace(" ", "").replace('""', "") == (
        kernel.text.replace("\n", "").replace(" ", "").replace('""', "")
    )


def test_a_carried_wrapper_of_another_shape_is_refused() -> None:
    kernel = _gemm()
    narrow = mechanism.remove(kernel, _wide(kernel))
    (candidate,) = mechanism.candidates(narrow)
    wrapper = narrow.parsed.function("wgmma_m64n128k16")
    assert wrapper is not None
    carried = Carrier(wrapper=narrow.parsed.text_of(wrapper.outer))
    with pytest.raises(MechanismRefused, match="not an f32 m64n256 wgmma"):
        mechanism.apply(narrow, candidate, carried)


def test_a_square_tile_takes_the_extent_that_counts_the_accumulators() -> None:
    """kBM = kBN = 256: the epilogue's loops over d run to kBN / 8, so kBN is N."""
    square = _gemm(GEMM.read_text().replace("constexpr int kBM = 128;", "constexpr int kBM = 256;"))
    site = _wide(square)
    assert site.detail["extent"] == "kBN"
    narrow = mechanism.remove(square, site)
    assert "constexpr int kBM = 256;" in narrow.text and "constexpr int kBN = 128;" in narrow.text


def test_an_accumulator_read_past_the_narrow_tile_is_refused() -> None:
    text = GEMM.read_text().replace(
        "  wgmma_wait<0>();\n", "  wgmma_wait<0>();\n  d[0] += d[100];\n", 1
    )
    kernel = _gemm(text)
    with pytest.raises(MechanismRefused, match=r"d\[100\].*outside 64 accumulators"):
        mechanism.remove(kernel, _wide(kernel))


def test_retemplate_renumbers_the_operands_after_the_accumulators() -> None:
    template = (
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p;"
    )
    assert _retemplate(template, 16, 8) == (
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p;"
    )
    with pytest.raises(RetileRefused, match="accumulator list"):
        _retemplate(template.replace("%3, %4", "%4, %3"), 16, 8)


def test_a_kernel_without_a_wgmma_wrapper_has_no_wgmma_tile() -> None:
    from klineage.mechanisms._wgmma_tile import tile_of

    before = fixture_pairs("block_tiling")[0].before
    kernel = before.parsed.kernels[0]
    assert "no device function wrapping" in str(tile_of(before.parsed, kernel, ["kBM", "kBN"]))


TEMPLATE_TILE = (
    Path(__file__).parents[1] / "fixtures/public_forms/block_tiling/wide_template.before.cu"
)


def _template_kernel(old: str = "", new: str = "") -> KernelSource:
    text = TEMPLATE_TILE.read_text(encoding="utf-8")
    assert old in text
    return KernelSource(text.replace(old, new) if old else text, name="wide_template.cu")


def _template_sites(kernel: KernelSource, *, candidates: bool = False) -> list[Site]:
    found = mechanism.candidates(kernel) if candidates else mechanism.detect(kernel)
    return [s for s in found if s.detail.get("form") == "template_wgmma_tile"]


def test_a_template_wgmma_tile_is_found_through_the_kernel_s_alias_of_its_parameter() -> None:
    kernel = _template_kernel()
    (site,) = _template_sites(kernel)
    assert site.supported and site.function == "gemm_wide"
    assert "wgmma tile BN = 256 (a template parameter; wgmma widths 128, 256)" in site.snippet
    assert mechanism.carrier_of(kernel, site) == Carrier(n=256)
    conditions = mechanism.conditions(kernel, site)
    assert any(getattr(c, "sm", None) == 90 and getattr(c, "specific", False) for c in conditions)
    assert any("follows the template parameter BN" in getattr(c, "text", "") for c in conditions)
    assert not any("None" in getattr(c, "text", "") for c in conditions)


def test_removal_halves_the_launch_constant_and_apply_doubles_it_back() -> None:
    kernel = _template_kernel()
    narrow = mechanism.remove(kernel, _template_sites(kernel)[0])
    assert narrow.text == TEMPLATE_TILE.with_name("wide_template.after.cu").read_text()
    assert not _template_sites(narrow)
    (candidate,) = _template_sites(narrow, candidates=True)
    assert mechanism.apply(narrow, candidate).text == kernel.text
    with pytest.raises(MechanismRefused, match="writes widths 128, 256, not 512"):
        mechanism.apply(narrow, candidate, Carrier(n=512))


def test_a_width_the_templated_wgmma_does_not_write_is_not_a_site() -> None:
    # without the N = 128 branch the tile cannot be halved: no site, and no candidate either
    kernel = _template_kernel(
        "  if constexpr (WIDTH == 128) wgmma_m64n128k16(d, desc_a, desc_b);\n", ""
    )
    assert not _template_sites(kernel) and not _template_sites(kernel, candidates=True)


def test_a_width_bound_twice_is_refused_with_the_reason() -> None:
    kernel = _template_kernel(
        "  return (int)cudaGetLastError();\n}",
        "  gemm_wide<BM, 128, BK><<<grid, 128, 0, stream>>>(A, B, C, (int)M, (int)N, (int)K);\n"
        "  return (int)cudaGetLastError();\n}",
    )
    (site,) = _template_sites(kernel)
    assert "is not one constant at the launches" in str(site.refusal)


def test_only_the_widest_template_tile_is_a_site_so_a_walk_halves_it_once() -> None:
    # a templated wgmma with 64, 128 and 256: the 256-wide tile is the site; once halved to
    # 128 it is a candidate only, not a site to halve again
    wider = _template_kernel(
        "  if constexpr (WIDTH == 128) wgmma_m64n128k16(d, desc_a, desc_b);\n",
        "  if constexpr (WIDTH == 128) wgmma_m64n128k16(d, desc_a, desc_b);\n"
        "  if constexpr (WIDTH == 64) wgmma_m64n64k16(d, desc_a, desc_b);\n",
    )
    wider = KernelSource(
        wider.text.replace(
            "template <int WIDTH>\n",
            "__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, "
            'uint64_t b) {\n  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16'
            '.bf16 {...};");\n}\n\ntemplate <int WIDTH>\n',
        )
    )
    (site,) = _template_sites(wider)
    assert "widths 64, 128, 256" in site.snippet
    narrow = mechanism.remove(wider, site)
    assert "constexpr int BN = 128;" in narrow.text
    assert not _template_sites(narrow)
    (candidate,) = _template_sites(narrow, candidates=True)
    assert candidate.detail["n"] == 128


# Tile origins counted in mma tiles, the block rows walked in serpentine order along
# blockIdx.z, and a per-warp address that reads both origins (the idiom of public mma.sync
# HGEMMs): the origins are the tile, the address is not a third origin.
SERPENTINE = """
#define MMA_M 16
#define MMA_N 8
#define BLOCK_ROWS_IN_TILES 16  // 256 rows / MMA_M
#define BLOCK_COLS_IN_TILES 16  // 128 columns / MMA_N
__global__ void hgemm(const half* A, half* C, size_t M, size_t N) {
    const size_t tile_i = (blockIdx.z % 2) ? ((gridDim.y - blockIdx.y - 1) * BLOCK_ROWS_IN_TILES)
                                           : (blockIdx.y * BLOCK_ROWS_IN_TILES);
    const size_t tile_j = (blockIdx.z * gridDim.x + blockIdx.x) * BLOCK_COLS_IN_TILES;
    const size_t warp = threadIdx.x / 32;
    const size_t out = (tile_i + warp * 2) * MMA_M * N + tile_j * MMA_N;
    C[out + threadIdx.x % 32] = A[out];
}
"""


def test_a_serpentine_block_row_in_mma_tile_units_is_a_tile_origin() -> None:
    (site,) = mechanism.detect(KernelSource(SERPENTINE))
    assert site.detail["extents"] == "BLOCK_COLS_IN_TILES,BLOCK_ROWS_IN_TILES"
    assert (site.start_line, site.end_line) == (4, 5) and not site.supported


def test_a_per_thread_address_reading_the_origins_does_not_hide_them() -> None:
    """Without the serpentine branch the tile is still two origins, not the address."""
    text = SERPENTINE.replace(
        "(blockIdx.z % 2) ? ((gridDim.y - blockIdx.y - 1) * BLOCK_ROWS_IN_TILES)\n"
        "                                           : (blockIdx.y * BLOCK_ROWS_IN_TILES)",
        "blockIdx.y * BLOCK_ROWS_IN_TILES",
    )
    assert "?" not in text
    (site,) = mechanism.detect(KernelSource(text))
    assert site.detail["extents"] == "BLOCK_COLS_IN_TILES,BLOCK_ROWS_IN_TILES"
