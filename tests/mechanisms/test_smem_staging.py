"""The smem_staging mechanism: staged tiles replaced by the global loads they hold, and the
forward direction on a blocked loop and on the naive GEMMs of heldout/."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.conditions import AxisAtMost, BlockSizeAtMost, SharedMemoryAtMost
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import (
    PUBLIC_FORMS,
    RoundTripSuite,
    compile_ok,
    fixture_pairs,
    removal_chain,
)
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("smem_staging")
NAIVE = [REPO / "heldout" / "sgemm" / "kernel.cu", REPO / "heldout" / "batched_hgemm" / "kernel.cu"]


class TestSmemStaging(RoundTripSuite):
    mechanism = "smem_staging"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("smem_staging") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    """The expert's staging is fed by cp.async and read by ldmatrix: detected, refused."""
    check_expert_removals_compile(mechanism_builder, "smem_staging", expect_some=False)


def _expert_sites() -> list[Site]:
    return mechanism.detect(KernelSource.from_file(REPO / "expert_kernels/gemm_bf16/kernel.cu"))


def test_the_expert_staging_is_refused_with_a_reason() -> None:
    (site,) = _expert_sites()
    assert "cp.async" in (site.refusal or "")


def test_reads_become_the_stored_value_of_the_thread_that_stored_them() -> None:
    after = fixture_pairs("smem_staging")[0].after.text
    assert "((row < M && t * TILE + k < K) ? A[row * K + t * TILE + k] : 0.0f)" in after
    assert "((t * TILE + k < K && col < N) ? B[(t * TILE + k) * N + col] : 0.0f)" in after


def test_a_value_reading_the_thread_index_by_another_spelling_is_refused() -> None:
    before = fixture_pairs("smem_staging")[0].before
    shifted = KernelSource(
        before.text.replace("A[row * K + t * TILE + tx]", "A[threadIdx.x * K + t]")
    )
    (site,) = mechanism.detect(shifted)
    assert "depends on threadIdx.x through something other than tx" in (site.refusal or "")


def test_a_local_computed_from_the_thread_index_is_written_out_renamed() -> None:
    """``col = blockIdx.x * TILE + tx`` in the stored value: the element thread (ty, k) stored
    reads ``blockIdx.x * TILE + k`` there (the fixture row_loader is the public form)."""
    before = fixture_pairs("smem_staging")[0].before
    shifted = KernelSource(before.text.replace("A[row * K + t * TILE + tx]", "A[col * K + t]"))
    (site,) = mechanism.detect(shifted)
    assert site.supported, site.refusal
    after = removal_chain(mechanism, shifted).states[-1].text
    assert "A[(blockIdx.x * TILE + k) * K + t]" in after


def test_the_block_must_cover_the_tile() -> None:
    before = fixture_pairs("smem_staging")[0].before
    small = KernelSource(before.text.replace("dim3 block(TILE, TILE);", "dim3 block(TILE, 8);"))
    (site,) = mechanism.detect(small)
    assert "some elements would be stored by no thread" in (site.refusal or "")


@pytest.mark.parametrize("path", NAIVE, ids=lambda p: p.parent.name)
def test_the_naive_gemm_is_tiled(path: Path) -> None:
    naive = KernelSource.from_file(path)
    (candidate,) = mechanism.candidates(naive)
    assert candidate.supported and candidate.detail["form"] == "naive"
    tiled = mechanism.apply(naive, candidate, Carrier(tile_size=32))
    assert "__shared__ float tile_a[32][32];" in tiled.text
    assert "dim3(32, 32)" in tiled.text and "if (tile_row < m && tile_col < n)" in tiled.text
    (site,) = mechanism.detect(tiled)
    assert site.supported
    blocked = mechanism.remove(tiled, site)
    (again,) = mechanism.candidates(blocked)
    assert again.detail["form"] == "blocked"
    carrier = mechanism.carrier_of(tiled, site)
    assert mechanism.apply(blocked, again, carrier).text == tiled.text


def test_naive_conditions_bound_the_grid_and_the_tiles() -> None:
    naive = KernelSource.from_file(NAIVE[1])
    (candidate,) = mechanism.candidates(naive)
    conditions = mechanism.conditions(naive, candidate)
    assert any(isinstance(c, SharedMemoryAtMost) and c.usage == "2048" for c in conditions)
    axes = {c.axis: c.n for c in conditions if isinstance(c, AxisAtMost)}
    assert axes == {"m": 65535 * 16, "batch": 65535}


def test_blocked_conditions_ask_for_a_tile_sized_block() -> None:
    after = fixture_pairs("smem_staging")[0].after
    (candidate,) = mechanism.candidates(after)
    conditions = mechanism.conditions(after, candidate)
    bound = next(c for c in conditions if isinstance(c, BlockSizeAtMost))
    assert (bound.n, bound.block_size) == (256, "256")
    assert any(isinstance(c, SharedMemoryAtMost) and "2048" in (c.usage or "") for c in conditions)


def test_bad_tile_sizes_are_refused() -> None:
    naive = KernelSource.from_file(NAIVE[0])
    (candidate,) = mechanism.candidates(naive)
    with pytest.raises(MechanismRefused, match="is not one of"):
        mechanism.apply(naive, candidate, Carrier(tile_size=12))
    after = fixture_pairs("smem_staging")[0].after
    with pytest.raises(MechanismRefused, match="fixes the tile at 16"):
        mechanism.apply(after, mechanism.candidates(after)[0], Carrier(tile_size=32))


@pytest.mark.nvcc
def test_the_tiled_heldout_gemms_compile(mechanism_builder: Builder) -> None:
    sources = []
    for path in NAIVE:
        naive = KernelSource.from_file(path)
        tiled = mechanism.apply(naive, mechanism.candidates(naive)[0])
        sources += [tiled, mechanism.remove(tiled, mechanism.detect(tiled)[0])]
    compile_ok(mechanism_builder, sources)


def test_a_blocked_loop_summing_through_fmaf_is_staged_again() -> None:
    """The staged fixture's removed loop written ``acc = fmaf(x, y, acc)`` (an expert's
    spelling): the forward rule stages it as it does ``acc += x * y``."""
    before = fixture_pairs("smem_staging")[0].before
    blocked = removal_chain(mechanism, before).states[-1].text
    summed = (
        "acc += ((row < M && t * TILE + k < K) ? A[row * K + t * TILE + k] : 0.0f) * "
        "((t * TILE + k < K && col < N) ? B[(t * TILE + k) * N + col] : 0.0f);"
    )
    assert summed in blocked
    fused = KernelSource(
        blocked.replace(
            summed,
            "acc = fmaf((row < M && t * TILE + k < K) ? A[row * K + t * TILE + k] : 0.0f, "
            "(t * TILE + k < K && col < N) ? B[(t * TILE + k) * N + col] : 0.0f, acc);",
        )
    )
    (candidate,) = mechanism.candidates(fused)
    assert candidate.detail["form"] == "blocked" and candidate.supported, candidate.refusal
    staged = mechanism.apply(fused, candidate).text
    assert "__syncthreads();" in staged
    (loop,) = [line for line in staged.splitlines() if "for (int k = 0; k < TILE" in line]
    assert "acc = fmaf(" in loop and "A[" not in loop and "B[" not in loop


# ---------------------------------------------------------------------------------------------
# Forward on a naive transpose (form=transpose): 32 x 32 tiles through a padded shared tile
# ---------------------------------------------------------------------------------------------

SCALED_TRANSPOSE = """#include <cuda_fp16.h>
#include <stdint.h>

__global__ void flip(const __half* a, __half* b, float s, int64_t m, int64_t n) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * m) return;
  const int64_t col = t / m;
  const int64_t row = t % m;
  b[t] = __float2half(__half2float(a[row * n + col]) * s);
}

extern "C" int run(const __half* a, __half* b, float s, int64_t m, int64_t n, cudaStream_t st) {
  const int64_t blocks = (m * n + 127) / 128;
  flip<<<(unsigned)blocks, 128, 0, st>>>(a, b, s, m, n);
  return 0;
}
"""


MN = [{"m": 1, "n": 1}, {"m": 3, "n": 70}, {"m": 33, "n": 5}, {"m": 40, "n": 64}]
NCHW = [{"n": 1, "c": 3, "h": 5, "w": 7}, {"n": 2, "c": 40, "h": 3, "w": 11}]
# (kernel text, call, element type, axes, the tiled grid: y's rows over x, its columns over y)
TRANSPOSES = {
    "scaled_half": (
        SCALED_TRANSPOSE, "flip(a, b, 1.5f, m, n)", "__half", MN, "n", "m"
    ),
    "transpose_2d": (
        (REPO / "heldout" / "transpose_2d" / "kernel.cu").read_text(),
        "transpose_2d(a, b, m, n)", "float", MN, "n", "m",
    ),
    "nchw_to_nhwc": (
        (REPO / "heldout" / "nchw_to_nhwc" / "kernel.cu").read_text(),
        "nchw_to_nhwc(a, b, n, c, h, w)", "__half", NCHW, "n * h * w", "c",
    ),
}  # fmt: skip


def _transpose_cases(case: str, tiled: bool) -> list[Case]:
    _, call, element, axes, rows, cols = TRANSPOSES[case]
    cases = []
    for values in axes:
        total = " * ".join(values)
        buffers = [Buffer("a", element, total, offset=1), Buffer("b", element, total, True)]
        grid = f"dim3((unsigned)(({rows} + 31) / 32), (unsigned)(({cols} + 31) / 32))"
        cases.append(
            Case(values, buffers, call, total, grid=grid if tiled else "", block_dims="dim3(32, 8)")
        )
    return cases


@pytest.mark.nvcc
@pytest.mark.parametrize("case", sorted(TRANSPOSES))
def test_a_naive_transpose_is_staged_through_a_padded_tile(case: str) -> None:
    """The tiled kernel writes the naive kernel's bytes (edges of partial tiles included, the
    input at an unaligned offset) when a block's threads run on the CPU."""
    naive = KernelSource(TRANSPOSES[case][0])
    [site] = [s for s in mechanism.candidates(naive) if s.detail.get("form") == "transpose"]
    tiled = mechanism.apply(naive, site, mechanism.default_carrier(naive, site))
    assert "[32][32 + 1];" in tiled.text and "__syncthreads();" in tiled.text
    assert ", dim3(32, 8), 0, " in tiled.text and "blocks" not in tiled.text.split("run(")[1]
    want = run_on_host(naive.text, _transpose_cases(case, tiled=False))
    assert run_on_host(tiled.text, _transpose_cases(case, tiled=True)) == want
    compile_ok(Builder(device_only=True), [tiled])


def test_a_kernel_reading_straight_or_twice_is_no_transpose() -> None:
    """A copy that reads x[i] (no transpose), or a value reading the index outside its one
    read, offers no transpose site."""
    for before, after in (
        ("a[row * n + col]", "a[col * m + row]"),
        ("__half2float(a[row * n + col]) * s", "__half2float(a[row * n + col]) * (float)row"),
    ):
        text = SCALED_TRANSPOSE.replace(before, after)
        assert text != SCALED_TRANSPOSE
        sites = mechanism.candidates(KernelSource(text))
        assert not [s for s in sites if s.detail.get("form") == "transpose"], after


def test_a_tile_loop_fed_by_copies_made_synchronous_says_so() -> None:
    """fmha's tiles arrive through cp.async; once cp_async_pipeline's removal has made the
    copies synchronous, the refusal no longer asks for that removal first."""
    from klineage.mining.removal import remove_mechanism

    kernel = KernelSource.from_file(REPO / "expert_kernels" / "fmha_fp16" / "kernel.cu")
    rule = get("smem_staging")
    [before] = [s for s in rule.detect(kernel) if s.refusal and "tiles arrive" in s.refusal]
    assert "cp.async copies into a shared buffer (remove cp_async_pipeline first)" in str(
        before.refusal
    )
    synchronous = remove_mechanism(kernel, get("cp_async_pipeline")).states[-1]
    live = [line for line in synchronous.text.splitlines() if line.strip().startswith("asm")]
    assert live and not any("cp.async" in line for line in live)  # only in comments now
    [after] = [s for s in rule.detect(synchronous) if s.refusal and "tiles arrive" in s.refusal]
    assert "that cp_async_pipeline's removal made synchronous" in str(after.refusal)
    assert "remove cp_async_pipeline first" not in str(after.refusal)


TREE_SCRATCH = """\
__global__ void block_sums(const float* in, float* out, int n) {
  __shared__ float partial[256];
  const int tid = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[tid] = i < n ? in[i] : 0.f;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) STEP;
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = partial[0];
}
"""


@pytest.mark.parametrize(
    "step", ["partial[tid] += partial[tid + s]", "partial[tid] = partial[tid] + partial[tid + s]"]
)
def test_a_reductions_scratch_filled_once_is_not_a_staged_tile(step: str) -> None:
    """Shared memory a block reduction updates in place is scratch, not a tile staged for
    reading: no smem_staging site."""
    kernel = KernelSource(TREE_SCRATCH.replace("STEP", step))
    assert mechanism.detect(kernel) == []
    # a tile written once more, by a value that does not read it, is still a (refused) tile
    kept = KernelSource(TREE_SCRATCH.replace("STEP", "out[0] = partial[tid + s]"))
    (site,) = mechanism.detect(kept)
    assert not site.supported and "staged once" in str(site.refusal)


PAIRED_OFFSETS = PUBLIC_FORMS / "smem_staging" / "paired_offsets.after.cu"


def test_a_tile_loop_with_two_header_offsets_is_staged_again() -> None:
    # `for (int a = a0, b = b0; ...; a += TILE, b += b_step)`: b moves only with the header,
    # the same for every thread, so B's factor varies along x alone
    kernel = KernelSource.from_file(PAIRED_OFFSETS)
    (site,) = mechanism.candidates(kernel)
    assert site.supported, site.refusal
    applied = mechanism.apply(kernel, site).text
    assert "tile_a[ty][tx] = A[a + (wA) * (ty) + (tx)];" in applied
    assert "tile_b[ty][tx] = B[b + (wB) * (ty) + (tx)];" in applied
    assert "acc += tile_a[ty][k] * tile_b[k][tx];" in applied


def test_a_header_offset_the_body_also_moves_is_not_uniform() -> None:
    text = PAIRED_OFFSETS.read_text(encoding="utf-8")
    old = "      acc += A[a + (wA) * (ty) + (k)] * B[b + (wB) * (k) + (tx)];\n"
    assert old in text
    moved = KernelSource(text.replace(old, old + "      b += tx;\n"))
    (site,) = mechanism.candidates(moved)
    assert not site.supported


@pytest.mark.nvcc
def test_paired_offsets_staged_again_compute_the_same_product_on_the_host() -> None:
    # a block's 16 x 16 threads run as host threads: the staged tiles give the bytes the
    # global reads gave, over several tiles of K
    after = KernelSource.from_file(PAIRED_OFFSETS)
    (site,) = mechanism.candidates(after)
    staged = mechanism.apply(after, site)
    buffers = [
        Buffer("A", "float", "M * K"),
        Buffer("B", "float", "K * N"),
        Buffer("C", "float", "M * N", output=True),
    ]
    case = Case(
        {"M": 32, "N": 48, "K": 64},
        buffers,
        "tiled_product(C, A, B, K, N)",
        "M * N",
        grid="dim3(N / 16, M / 16)",
        block_dims="dim3(16, 16)",
    )
    want = run_on_host(after.text, [case])
    assert want.strip()
    assert run_on_host(staged.text, [case]) == want
