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
    counted_at_run_time,
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
    after = KernelSource(counted_at_run_time(_pair("micro_tiles")[1].text))
    staged = _apply(after.text)
    assert (
        "template <int BM, int BK, int BN>\n"
        "__device__ void stage_tiles(float *tile_a, const float *A, float *tile_b, "
        "const float *B, int K, int N) {\n"
    ) in staged
    # A's tile is stored transposed (a slot row runs along A's rows, which are contiguous):
    # consecutive threads take consecutive slot rows, so a warp reads runs of A, not one
    # element of each of 32 rows (2.4x slower on SGEMM_CUDA's warp-tiled kernel, H100); a
    # thread loads four of them at once where every address is 16-byte aligned, and stores
    # them into four slot rows (element by element, a warp's stores hit one bank 16 times:
    # SGEMM_CUDA's round trip fell to 0.35 of the expert's float4 loader on an H100)
    # B's slot rows are its rows: a thread copies four consecutive slots. One test covers
    # both tiles, so all their vector loads are in one block, in flight together (a test a
    # tile kept B's loads behind A's stores: SGEMM_CUDA's round trip 0.94 on an H100); the
    # scalar loops where any address is unaligned
    assert (
        "  if (BK % 4 == 0 && K % 4 == 0 && reinterpret_cast<unsigned long long>(A) % 16 == 0 &&\n"
        "      BN % 4 == 0 && N % 4 == 0 && reinterpret_cast<unsigned long long>(B) % 16 == 0) {\n"
        "    for (int slot = thread * 4; slot < BK * BM; slot += threads * 4) {\n"
        "      const int hi = slot % BK;\n"
        "      const int lo = slot / BK;\n"
        "      const float4 quad = reinterpret_cast<const float4 *>(&A[lo * K + hi])[0];\n"
        "      tile_a[hi * BM + lo] = quad.x;\n"
        "      tile_a[(hi + 1) * BM + lo] = quad.y;\n"
        "      tile_a[(hi + 2) * BM + lo] = quad.z;\n"
        "      tile_a[(hi + 3) * BM + lo] = quad.w;\n"
        "    }\n"
        "    for (int slot = thread * 4; slot < BK * BN; slot += threads * 4) {\n"
        "      const int hi = slot / BN;\n"
        "      const int lo = slot % BN;\n"
        "      reinterpret_cast<float4 *>(&tile_b[hi * BN + lo])[0] =\n"
        "          reinterpret_cast<const float4 *>(&B[lo + hi * N])[0];\n"
        "    }\n"
        "  } else {\n"
        "    for (int slot = thread; slot < BK * BM; slot += threads) {\n"
        "      const int hi = slot % BK;\n"
        "      const int lo = slot / BK;\n"
        "      tile_a[hi * BM + lo] = A[lo * K + hi];\n"
        "    }\n"
        "    for (int hi = 0; hi < BK; ++hi) {\n"
        "      for (int lo = thread; lo < BN; lo += threads) {\n"
        "        tile_b[hi * BN + lo] = B[lo + hi * N];\n"
        "      }\n"
        "    }\n"
        "  }\n"
    ) in staged
    assert (
        "  __shared__ float tile_a[BM * BK];\n  __shared__ __align__(16) float tile_b[BN * BK];\n"
        "  for (int k0 = 0; k0 < K; k0 += BK) {\n"
        "    stage_tiles<BM, BK, BN>(tile_a, A, tile_b, B, K, N);\n"
        "    __syncthreads();\n"
    ) in staged
    assert "a_frag[i] = tile_a[k * BM + ty * TM + i];" in staged
    assert "b_frag[j] = tile_b[k * BN + tx * TN + j];" in staged
    assert "    B += BK * N;\n    __syncthreads();\n  }\n" in staged


def test_a_compile_time_thread_count_unrolls_the_loader() -> None:
    """micro_tiles names its block's threads (the removal kept ``THREADS``): the loader
    counts turns by it from 0, unrolled, a guard on the last turn's slots."""
    _, after = _pair("micro_tiles")
    staged = _apply(after.text)
    assert "template <int THREADS, int BM, int BK, int BN>\n" in staged
    assert "const int threads" not in staged
    assert (
        "    #pragma unroll\n"
        "    for (int base = 0; base < BK * BM; base += THREADS * 4) {\n"
        "      const int slot = base + thread * 4;\n"
        "      if (slot < BK * BM) {\n"
        "        const int hi = slot % BK;\n"
    ) in staged
    assert (
        "    #pragma unroll\n"
        "    for (int base = 0; base < BK * BN; base += THREADS) {\n"
        "      const int slot = base + thread;\n"
        "      if (slot < BK * BN) {\n"
        "        const int hi = slot / BN;\n"
        "        const int lo = slot % BN;\n"
        "        tile_b[hi * BN + lo] = B[lo + hi * N];\n"
    ) in staged
    assert "stage_tiles<THREADS, BM, BK, BN>(tile_a, A, tile_b, B, K, N);" in staged
    assert _remove(staged) == after.text
    # the guard must bound the slot by the loader's compile-time names to be read as one
    guarded = staged.replace("if (slot < BK * BN)", "if (slot < N)", 1)
    (site,) = staging.detect(KernelSource(guarded))
    assert site.refusal is not None and "is conditional" in site.refusal


def test_a_flat_loader_splits_its_slot_only_by_a_compile_time_row_count() -> None:
    # the removal reads `slot % BK` and `slot / BK` as a slot row and column; split by a
    # count known only at run time, the stores are not read as a tile's layout
    after = KernelSource(counted_at_run_time(_pair("micro_tiles")[1].text))
    staged = _apply(after.text)
    split = "      const int hi = slot % BK;\n      const int lo = slot / BK;\n"
    assert staged.count(split) == 2  # the vector loop and its scalar fallback
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


def test_a_tile_of_another_element_type_keeps_the_scalar_loader() -> None:
    after = KernelSource(counted_at_run_time(_pair("micro_tiles")[1].text))
    staged = _apply(after.text.replace("float", "double"))
    assert "float4" not in staged and "  if (" not in staged
    assert "      tile_a[hi * BM + lo] = A[lo * K + hi];\n" not in staged
    assert "    tile_a[hi * BM + lo] = A[lo * K + hi];\n" in staged
    assert _remove(staged) == after.text.replace("float", "double")


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("  if (BK % 4 == 0 && K", "  if (thread % 2 == 0 && K"), "a test that differs by thread"),
        (
            ("  } else {\n    for (int slot = thread;", "  }\n  {\n    for (int slot = thread;"),
            "no else",
        ),
        (("reinterpret_cast<unsigned long long>(A) % 16", "(K = 4) % 16"), "an assignment"),
    ],
)
def test_the_removal_reads_only_a_uniform_if_else_of_two_loaders(
    change: tuple[str, str], why: str
) -> None:
    after = KernelSource(counted_at_run_time(_pair("micro_tiles")[1].text))
    staged = _apply(after.text)
    assert change[0] in staged, why
    (site,) = [s for s in staging.detect(KernelSource(staged.replace(*change)))]
    assert site.refusal is not None and "is conditional" in site.refusal, (why, site.refusal)


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
    after = KernelSource(counted_at_run_time(_pair("micro_tiles")[1].text))
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
    """Aligned operands (the loader's float4 loops), then A and B one element off 16 bytes
    (its scalar fallbacks)."""
    call, block, (bm, bn) = EMULATED[case]
    found = []
    for m, n, k, offset in ((bm, bn, 32, 0), (2 * bm, bn, 48, 0), (bm, bn, 32, 1)):
        buffers = [
            Buffer("A", "float", "M * K", offset=offset),
            Buffer("B", "float", "K * N", offset=offset),
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
    cases = _cases(case)
    want = run_on_host(after.text, cases)
    assert run_on_host(_apply(after.text), cases) == want
    # the expert's float4 loads need aligned operands (unaligned, they fault on the host too)
    aligned = [c for c in cases if all(b.offset == 0 for b in c.buffers)]
    assert run_on_host(before.text, aligned) == run_on_host(after.text, aligned)


@pytest.mark.nvcc
def test_the_applied_staging_compiles(mechanism_builder: Builder) -> None:
    compile_ok(
        mechanism_builder,
        [KernelSource(_apply(_pair(case)[1].text), name=f"{case}.staged.cu") for case in CASES],
    )
