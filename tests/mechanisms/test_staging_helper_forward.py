"""Staging written back into register-tiled GEMMs whose helper-staged tiles a removal turned
into global reads (``form: tile_loop``): the candidate sits on the tile loop of the removed
state, applying stages each tile through a generated loader, and removing that staging again
gives the removed state back exactly; the forms it does not take are refused by name."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused
from klineage.mechanisms.base import Site
from klineage.mining.removal import matching_candidate
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import compile_ok
from tests.mechanisms.staging_support import (
    apply_form,
    form_candidate,
    remove_helper_staging,
    staged_pair,
    staging,
)

CASES = ["helper_tiles", "warp_tiles", "micro_tiles"]
"""Pairs whose removal leaves a tile loop of global reads: a reader helper (helper_tiles,
warp_tiles: 1-D blocks, warp sub-tiles) or reads in the kernel (micro_tiles: 2-D blocks,
a TM x TN micro-tile a thread)."""


def _pair(case: str) -> tuple[KernelSource, KernelSource]:
    return staged_pair(case)


def _candidate(kernel: KernelSource) -> Site:
    return form_candidate(kernel, "tile_loop")


def _apply(text: str) -> str:
    return apply_form(text, "tile_loop")


def _remove(text: str) -> str:
    return remove_helper_staging(text)


@pytest.mark.parametrize("case", CASES)
def test_the_removed_state_offers_the_tile_loop_where_the_removal_happened(case: str) -> None:
    before, after = _pair(case)
    site = matching_candidate(staging, before, after)
    assert site is not None and site.supported, site and site.refusal
    assert site.detail == {"form": "tile_loop"}
    assert site.snippet.startswith("for (int ")


@pytest.mark.parametrize("case", CASES)
def test_removing_the_applied_staging_gives_the_removed_state_back(case: str) -> None:
    _, after = _pair(case)
    staged = _apply(after.text)
    assert "__shared__" in staged and staged.count("__syncthreads();") == 2
    assert _remove(staged) == after.text


def test_reads_in_the_kernel_are_staged_by_a_loader_all_threads_run() -> None:
    _, after = _pair("micro_tiles")
    staged = _apply(after.text)
    assert (
        "template <int BM, int BK, int BN>\n"
        "__device__ void stage_tiles(float *tile_a, const float *A, float *tile_b, "
        "const float *B, int K, int N) {\n"
    ) in staged
    # A's tile is stored transposed (a slot row runs along A's rows, which are contiguous):
    # consecutive threads take consecutive slot rows, so a warp reads runs of A, not one
    # element of each of 32 rows (2.4x slower on SGEMM_CUDA's warp-tiled kernel, H100)
    assert (
        "  for (int slot = thread; slot < BK * BM; slot += threads) {\n"
        "    const int hi = slot % BK;\n"
        "    const int lo = slot / BK;\n"
        "    tile_a[hi * BM + lo] = A[lo * K + hi];\n"
    ) in staged
    # B's slot rows are its rows: consecutive threads already take consecutive columns
    assert (
        "  for (int hi = 0; hi < BK; ++hi) {\n"
        "    for (int lo = thread; lo < BN; lo += threads) {\n"
        "      tile_b[hi * BN + lo] = B[lo + hi * N];\n"
    ) in staged
    assert (
        "  __shared__ float tile_a[BM * BK];\n  __shared__ float tile_b[BN * BK];\n"
        "  for (int k0 = 0; k0 < K; k0 += BK) {\n"
        "    stage_tiles<BM, BK, BN>(tile_a, A, tile_b, B, K, N);\n"
        "    __syncthreads();\n"
    ) in staged
    assert "a_frag[i] = tile_a[k * BM + ty * TM + i];" in staged
    assert "b_frag[j] = tile_b[k * BN + tx * TN + j];" in staged
    assert "    B += BK * N;\n    __syncthreads();\n  }\n" in staged


def test_a_flat_loader_splits_its_slot_only_by_a_compile_time_row_count() -> None:
    # the removal reads `slot % BK` and `slot / BK` as a slot row and column; split by a
    # count known only at run time, the stores are not read as a tile's layout
    _, after = _pair("micro_tiles")
    staged = _apply(after.text)
    split = "    const int hi = slot % BK;\n    const int lo = slot / BK;\n"
    assert split in staged
    runtime = staged.replace(split, split.replace("BK;", "K;"))
    (site,) = [s for s in staging.detect(KernelSource(runtime)) if s.mechanism == "smem_staging"]
    assert site.refusal is not None and "not affine in the loader's positions" in site.refusal


def test_a_reader_helper_gets_the_tiles_and_loses_the_values_its_reads_needed() -> None:
    _, after = _pair("warp_tiles")
    staged = _apply(after.text)
    assert "const float *tile_a,\n                         const float *tile_b, int warpRow" in (
        staged
    )
    assert "int laneRow, int laneCol) {" in staged
    assert "fragA[sm * TM + i] = tile_a[k * BM + warpRow * WM + sm * SUBM + laneRow * TM + i];" in (
        staged
    )
    assert "(fragA, fragB, acc, tile_a, tile_b, warpRow,\n" in staged
    assert "warpCol, laneRow, laneCol);" in staged


def test_the_applied_staging_is_the_before_state_up_to_the_loader() -> None:
    """The forward rule's loader is a plain loop, not the expert's float4 copies: removing
    either gives the same kernel."""
    before, after = _pair("warp_tiles")
    assert _remove(before.text) == _remove(_apply(after.text)) == after.text


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            (
                "a_frag[i] = A[(k * BM + ty * TM + i) % BM * K + (k * BM + ty * TM + i) / BM]",
                "a_frag[i] = A[(k * BM + ty * TM + i) * K]",
            ),
            "a read `A[(k * BM + ty * TM + i) * K]`, whose index is not split into `X % L` and "
            "`X / L` of one tile-local index X",
        ),
        (
            ("% BM * K + (k * BM + ty * TM + i) / BM]", "% BK + (k * BM + ty * TM + i) / BK * K]"),
            "A moved by `BK`, not a whole number of rows of stride `K` (a tile whose K side is "
            "its slot column, so its other side is unknown)",
        ),
        (
            ("% BM * K +", "% BM * (K + ty) +"),
            "a layout over `K + ty`, which differs between threads",
        ),
        (
            ("  A += blockIdx.y", "  if (M == 0) return;\n  A += blockIdx.y"),
            "a return before the loop (line 13), which threads may take",
        ),
        (
            ("% BM * K + (k * BM + ty * TM + i) / BM]", "% M * K + (k * BM + ty * TM + i) / M]"),
            "reads of A in rows `M` wide, which M sets at run time",
        ),
        (
            ("    B += BK * N;\n", "    B += K * N;\n"),
            "B moved by `K * N`, a tile of rows that K counts at run time",
        ),
        (
            ("k0 < K;", "k0 < K - tx;"),
            "a loop whose trip count depends on the thread, so a barrier is unsafe",
        ),
        (
            ("    B += BK * N;\n", "    B += BK * N;\n    acc[0][0] += 1.0f;\n"),
            "a loop whose pointer moves are not its last statements",
        ),
        (
            ("  float acc[TM][TN]", "  __shared__ float spare[32];\n  float acc[TM][TN]"),
            "sgemm_micro, which already uses shared memory or barriers",
        ),
    ],
)
def test_forms_the_forward_rule_does_not_take_are_refused_by_name(
    change: tuple[str, str], reason: str
) -> None:
    _, after = _pair("micro_tiles")
    assert change[0] in after.text
    text = after.text.replace(*change)
    site = _candidate(KernelSource(text))
    assert site.refusal is not None and reason in site.refusal, site.refusal
    with pytest.raises(MechanismRefused, match="this rule needs a top-level loop"):
        staging.apply(KernelSource(text), site, Carrier())


def test_a_reader_called_twice_is_refused() -> None:
    _, after = _pair("warp_tiles")
    call = "    warps::warpTile<BM, BN, BK, WM, WN, SUBM, SUBN, TM, TN>("
    text = after.text.replace(
        call,
        call.replace("    warps", "    if (K < 0) warps") + "fragA, "
        "fragB, acc, A, B, warpRow, warpCol, laneRow, laneCol, K, N);\n" + call,
    )
    site = _candidate(KernelSource(text))
    assert site.refusal is not None and "passed to warpTile, not a helper called only once" in (
        site.refusal
    )


def test_the_naive_heldout_gemms_keep_their_candidates() -> None:
    for problem in ("sgemm", "batched_hgemm"):
        kernel = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
        found = [(c.detail, c.supported) for c in staging.candidates(kernel)]
        assert found == [({"form": "naive"}, True)], (problem, found)


# (kernel call, block) of each pair on its run()'s tile sizes
EMULATED = {
    "warp_tiles": (
        "sgemm_warps<64, 128, 16, 32, 64, 16, 32, 4, 4, 128>((int)M, (int)N, (int)K, A, B, C)",
        "dim3(128)",
        (64, 128),
    ),
    "micro_tiles": (
        "sgemm_micro<64, 64, 8, 4, 4>((int)M, (int)N, (int)K, A, B, C)",
        "dim3(16, 16)",
        (64, 64),
    ),
}


def _cases(case: str) -> list[Case]:
    call, block, (bm, bn) = EMULATED[case]
    found = []
    for m, n, k in ((bm, bn, 32), (2 * bm, bn, 48)):
        buffers = [
            Buffer("A", "float", "M * K", offset=0),
            Buffer("B", "float", "K * N", offset=0),
            Buffer("C", "float", "M * N", output=True),
        ]
        grid = f"dim3({n // bn}, {m // bm})"
        found.append(Case({"M": m, "N": n, "K": k}, buffers, call, "", grid=grid, block_dims=block))
    return found


@pytest.mark.nvcc
@pytest.mark.parametrize("case", sorted(EMULATED))
def test_the_applied_staging_computes_what_the_global_reads_did(case: str) -> None:
    """The removed state, the staged one and the expert's state write the same bytes when
    each block's threads run on the CPU (several tiles along K, two blocks)."""
    before, after = _pair(case)
    want = run_on_host(after.text, _cases(case))
    assert run_on_host(_apply(after.text), _cases(case)) == want
    assert run_on_host(before.text, _cases(case)) == want


@pytest.mark.nvcc
def test_the_applied_staging_compiles(mechanism_builder: Builder) -> None:
    compile_ok(
        mechanism_builder,
        [KernelSource(_apply(_pair(case)[1].text), name=f"{case}.staged.cu") for case in CASES],
    )
