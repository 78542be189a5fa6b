"""The warp_tiling mechanism: in a SIMT kernel, warps regrouped from 2-D patches into strips of
a block-wide thread grid (removal) and back (application), checked on the host."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import PUBLIC_FORMS, RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("warp_tiling")
PUBLIC = PUBLIC_FORMS / "warp_tiling"


class TestWarpTiling(RoundTripSuite):
    mechanism = "warp_tiling"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("warp_tiling") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "warp_tiling")


def test_the_site_spans_the_warp_and_lane_indices() -> None:
    before = fixture_pairs("warp_tiling")[0].before
    (site,) = mechanism.detect(before)
    assert (site.start_line, site.end_line) == (20, 21) and site.supported
    assert mechanism.carrier_of(before, site) == Carrier(lane_cols=4)
    (condition,) = mechanism.conditions(before, site)
    assert "multiple of 32" in condition.prose


@pytest.mark.parametrize("case", ["templated_warps", "linear_warps"])
def test_counts_written_as_template_expressions_move_with_the_grid(case: str) -> None:
    """A count read from a constexpr local declared after the warp index is written out where
    the grid is declared, and the lanes per row are checked at compile time."""
    before = KernelSource.from_file(PUBLIC / f"{case}.before.cu")
    (site,) = mechanism.detect(before)
    removed = mechanism.remove(before, site)
    assert "static_assert(32 %" in removed.text
    if case == "templated_warps":
        assert "SUBN" in before.text.split("lane_col =")[1].split(";")[0]
        assert "((WN / ITN) / TN)" in removed.text.split("const unsigned warp_id")[0]
    (back,) = [c for c in mechanism.candidates(removed) if c.supported]
    assert back.detail.get("form") == "rebuilt"
    restored = mechanism.apply(removed, back, mechanism.carrier_of(before, site))
    assert [s.supported for s in mechanism.detect(restored)] == [True]


SIMT_GRID = """\
#include <cuda_runtime.h>
#include <stdint.h>
// One block of 256 threads computes a 64 x 64 tile of C, each thread a 4 x 4 tile at row
// 4 * (t / 16) and column 4 * (t % 16) of it: threads fill a 16-column grid row by row.
__global__ void sgemm_grid(const float* A, const float* B, float* C, int M, int N, int K) {
  __shared__ float As[8][64];
  __shared__ float Bs[8][64];
  const int row = threadIdx.x / 16;
  const int col = threadIdx.x % 16;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += 8) {
    for (int i = threadIdx.x; i < 8 * 64; i += 256) {
      const int kk = i / 64, x = i % 64;
      As[kk][x] = (m0 + x < M && k0 + kk < K) ? A[(m0 + x) * K + k0 + kk] : 0.0f;
      Bs[kk][x] = (k0 + kk < K && n0 + x < N) ? B[(k0 + kk) * N + n0 + x] : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < 8; ++kk)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += As[kk][row * 4 + i] * Bs[kk][col * 4 + j];
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      const int r = m0 + row * 4 + i, c = n0 + col * 4 + j;
      if (r < M && c < N) C[r * N + c] = acc[i][j];
    }
}
extern "C" int run(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
                   cudaStream_t stream) {
  const dim3 grid((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64));
  sgemm_grid<<<grid, 256, 0, stream>>>(A, B, C, (int)M, (int)N, (int)K);
  return (int)cudaGetLastError();
}
"""


def _grid_site(kernel: KernelSource):  # -> Site
    (site,) = mechanism.candidates(kernel)
    assert site.supported and site.detail["columns"] == "16"
    return site


@pytest.mark.parametrize("lane_cols", [4, 8])
def test_a_block_wide_grid_becomes_warp_tiles(lane_cols: int) -> None:
    kernel = KernelSource(SIMT_GRID)
    applied = mechanism.apply(kernel, _grid_site(kernel), Carrier(lane_cols=lane_cols))
    assert f"lane / {lane_cols}" in applied.text and "warp / (16 / " in applied.text
    (site,) = mechanism.detect(applied)  # the warp grid it wrote is this mechanism's
    assert site.supported and mechanism.carrier_of(applied, site) == Carrier(lane_cols=lane_cols)
    assert not mechanism.candidates(applied)


def test_the_tile_loads_grid_is_not_a_candidate() -> None:
    """`i / 64` and `i % 64` split a loop counter, and no store reads a load's coordinates."""
    kernel = KernelSource(SIMT_GRID)
    assert "const int kk = i / 64, x = i % 64;" in kernel.text
    assert [s.detail["columns"] for s in mechanism.candidates(kernel)] == ["16"]


def test_a_grid_as_wide_as_a_warp_row_is_refused() -> None:
    kernel = KernelSource(SIMT_GRID)
    with pytest.raises(MechanismRefused, match="two or more warp rows"):
        mechanism.apply(kernel, _grid_site(kernel), Carrier(lane_cols=16))


MMA_WARPS = """\
#include <cuda_fp16.h>
#include <stdint.h>
__global__ void mma_warps(const uint32_t* a, float* c) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int wm = warp / 2, wn = warp % 2;
  const int group = lane / 4, quad = lane % 4;
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  uint32_t x = a[threadIdx.x];
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, "
               "{%4,%4}, {%0,%1,%2,%3};" : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "r"(x));
  c[(wm * 16 + group) * 64 + wn * 32 + quad * 2] = d0 + d1 + d2 + d3;
}
"""


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (MMA_WARPS, "warp-collective `mma`"),
        (
            MMA_WARPS.split("  asm volatile")[0]
            + "  d0 = __shfl_down_sync(0xffffffff, (float)x, 1);\n"
            + "  c[(wm * 16 + group) * 64 + wn * 32 + quad * 2] = d0;\n}\n",
            "warp-collective `__shfl_down_sync`",
        ),
        (
            SIMT_GRID.replace(
                "  const int row = threadIdx.x / 16;\n  const int col = threadIdx.x % 16;\n",
                "  const int warp = threadIdx.x / 32;\n  const int lane = threadIdx.x % 32;\n"
                "  const int row = (warp / 2) * 8 + lane / 4, col = (warp % 2) * 4 + lane % 4;\n"
                "  As[0][warp] = 0.0f;\n",
            ),
            "used as `As\\[0\\]\\[warp\\]`",
        ),
    ],
    ids=["mma", "shuffle", "warp_as_an_index"],
)
def test_warps_whose_lanes_matter_are_refused_with_the_form(text: str, reason: str) -> None:
    kernel = KernelSource(text)
    (site,) = [s for s in mechanism.detect(kernel)]
    assert not site.supported
    with pytest.raises(MechanismRefused, match=reason):
        mechanism.remove(kernel, site)


def test_a_grid_beside_a_shuffle_is_refused_as_a_candidate() -> None:
    text = SIMT_GRID.replace(
        "  const int m0 =",
        "  const float probe = __shfl_sync(0xffffffff, 0.0f, 0);\n  const int m0 =",
    )
    (site,) = mechanism.candidates(KernelSource(text))
    assert not site.supported and "__shfl_sync" in str(site.refusal)


# ---- on the host: every state computes the same bits ----------------------------------------


def _gemm_case(m: int, n: int, k: int, call: str, grid: str, block: str):  # -> Case
    from tests.mechanisms.host_emulation import Buffer, Case

    buffers = [
        Buffer("A", "float", "M * K"),
        Buffer("B", "float", "K * N", offset=1),
        Buffer("C", "float", "M * N", output=True),
    ]
    return Case({"M": m, "N": n, "K": k}, buffers, call, "M * N", grid=grid, block_dims=block)


def _states(before: KernelSource) -> list[KernelSource]:
    """`before`, its removal, and the removal applied forward again."""
    (site,) = mechanism.detect(before)
    removed = mechanism.remove(before, site)
    (back,) = [c for c in mechanism.candidates(removed) if c.supported]
    return [before, removed, mechanism.apply(removed, back, mechanism.carrier_of(before, site))]


@pytest.mark.nvcc
def test_every_state_computes_the_same_bits_on_the_host() -> None:
    """Each output's sum runs over k in the same order in every state; only which thread
    computes it changes, so every state prints the same bytes."""
    from tests.mechanisms.host_emulation import run_on_host

    ours = fixture_pairs("warp_tiling")[0].before
    templated = KernelSource.from_file(PUBLIC / "templated_warps.before.cu")
    linear = KernelSource.from_file(PUBLIC / "linear_warps.before.cu")
    grid_2d = "dim3((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64))"
    runs = [
        (
            ours,
            "sgemm_warp_tiled(A, B, C, (int)M, (int)N, (int)K)",
            "dim3((unsigned)(((M + 63) / 64) * ((N + 63) / 64)))",
            "dim3(128)",
            (70, 100, 19),
        ),
        (
            templated,
            "sgemm_warps<64, 64, 16, 32, 32, 2, 4, 4, 128>((int)M, (int)N, (int)K, A, B, C)",
            grid_2d,
            "dim3(128)",
            (128, 64, 48),
        ),
        (
            linear,
            "gemm_warp_grid<float, 64, 64, 8, 32, 32, 8>((size_t)M, (size_t)N, (size_t)K, A, B, C)",
            grid_2d,
            "dim3(32, 4)",
            (70, 100, 19),
        ),
    ]
    for before, call, grid, block, (m, n, k) in runs:
        case = _gemm_case(m, n, k, call, grid, block)
        printed = {state.text: run_on_host(state.text, [case]) for state in _states(before)}
        assert len(set(printed.values())) == 1, call
    kernel = KernelSource(SIMT_GRID)
    case = _gemm_case(
        70, 100, 19, "sgemm_grid(A, B, C, (int)M, (int)N, (int)K)", grid_2d, "dim3(256)"
    )
    want = run_on_host(kernel.text, [case])
    for lane_cols in (4, 8):
        applied = mechanism.apply(kernel, _grid_site(kernel), Carrier(lane_cols=lane_cols))
        assert run_on_host(applied.text, [case]) == want


@pytest.mark.nvcc
def test_a_thread_index_over_a_constant_row_width_is_restored_too() -> None:
    """``ty * 32 + tx`` (the block's width written as a number, as tutorials write
    ``ty * THREAD_X_PER_BLOCK + tx``): the removal relabels it, and the forward rule finds the
    relabeled grid again; every state prints the same bytes on the host."""
    from tests.mechanisms.host_emulation import run_on_host

    text = (PUBLIC / "linear_warps.before.cu").read_text()
    spelled = "size_t const linear{threadIdx.y * blockDim.x + threadIdx.x};"
    assert spelled in text
    before = KernelSource(
        text.replace(
            spelled,
            "size_t const tx{threadIdx.x};\n  size_t const ty{threadIdx.y};\n"
            "  size_t const linear{ty * 32U + tx};",
        )
    )
    states = _states(before)
    assert "size_t const linear{ty * 32U + tx};" in states[1].text
    # the same indices again, the warp size written as a plain 32
    assert states[2].text == before.text.replace("linear / 32U}", "linear / 32}").replace(
        "linear % 32U}", "linear % 32}"
    )
    case = _gemm_case(
        70,
        100,
        19,
        "gemm_warp_grid<float, 64, 64, 8, 32, 32, 8>((size_t)M, (size_t)N, (size_t)K, A, B, C)",
        "dim3((unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64))",
        "dim3(32, 4)",
    )
    assert len({run_on_host(state.text, [case]) for state in states}) == 1
