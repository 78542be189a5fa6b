"""Staging written back into tile loops whose 2-D helper-staged tiles a removal turned into
bounds-checked global reads (``form: tile_loop_2d``): the candidate sits on the tile loop of
the removed state, applying stages each tile through a generated loader (rows handed back to
the reader helper the removal copied), removing that staging again gives the removed state
back exactly, and the forms it does not take are refused by name."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused
from klineage.mechanisms.base import Site
from klineage.mining.removal import matching_candidate, reapply, remove_mechanism
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

CASES = ["bounded_rows_2d", "helper_tiles_2d", "helper_tiles_2d_reader"]
"""Pairs whose removal leaves bounds-checked reads: through reader-helper copies
(bounded_rows_2d: 16 x 16 blocks, float tiles of template extents; helper_tiles_2d_reader:
1-D blocks, size_t extents) or in the kernel (helper_tiles_2d)."""


def _pair(case: str) -> tuple[KernelSource, KernelSource]:
    return staged_pair(case)


def _candidate(kernel: KernelSource) -> Site:
    return form_candidate(kernel, "tile_loop_2d")


def _apply(text: str) -> str:
    return apply_form(text, "tile_loop_2d")


def _remove(text: str) -> str:
    return remove_helper_staging(text)


@pytest.mark.parametrize("case", CASES)
def test_the_removed_state_offers_the_2d_tile_loop_where_the_removal_happened(case: str) -> None:
    before, after = _pair(case)
    site = matching_candidate(staging, before, after)
    assert site is not None and site.supported, site and site.refusal
    assert site.detail == {"form": "tile_loop_2d"}
    assert site.snippet.startswith("for (")


@pytest.mark.parametrize("case", CASES)
def test_removing_the_applied_staging_gives_the_removed_state_back(case: str) -> None:
    _, after = _pair(case)
    staged = _apply(after.text)
    assert staged.count("__shared__") == 2 and staged.count("__syncthreads();") == 2
    assert _remove(staged) == after.text


def test_a_compile_time_thread_count_unrolls_the_loader() -> None:
    """The kernel names its block's thread count (``THREADS``, 256 at run()'s launch): the
    loader counts turns by it, unrolled; a kernel without one counts at run time."""
    _, after = _pair("bounded_rows_2d")
    staged = _apply(after.text)
    assert "template <int WIDTH, int TK, int WIDTH_2, unsigned int THREADS>" in staged
    assert "int const threads" not in staged
    assert (
        "  #pragma unroll\n"
        "  for (int slot = 0; slot < TK * WIDTH / THREADS; ++slot) {\n"
        '    static_assert(TK * WIDTH % THREADS == 0, "the block fills a tile in whole turns");\n'
        "    int const slot_k = (thread + slot * THREADS) % TK;\n"
        "    int const slot_b = (thread + slot * THREADS) / TK;\n"
    ) in staged
    assert "stage_tiles_2d<TM, TK, TN, THREADS>(tile_a, a, " in staged
    # the removal kept the count, though the loader was its one reader (leimao V06's
    # NUM_THREADS), so the forward rule finds it again
    runtime = _apply(counted_at_run_time(after.text))
    assert "  int const threads = blockDim.x * blockDim.y * blockDim.z;\n" in runtime
    assert "#pragma unroll\n  for (int slot = 0;" not in runtime


@pytest.mark.parametrize("case", CASES)
def test_the_walk_reapplies_the_staging_it_removed(case: str) -> None:
    """The round trip of a walk: remove the expert's staging, apply the forward rule where
    the removal happened; the result stages again, and its removal is the expert's."""
    before, _ = _pair(case)
    removal = remove_mechanism(before, staging)
    again = reapply(removal)
    assert again.text != removal.simplified.text and "__shared__" in again.text
    assert _remove(again.text) == _remove(before.text) == removal.simplified.text


def test_rows_go_back_to_the_one_reader_helper_the_removal_copied() -> None:
    before, after = _pair("bounded_rows_2d")
    staged = _apply(counted_at_run_time(after.text))
    reader = before.text[
        before.text.index("template <int WIDTH") : before.text.index(
            "template <int TM, int TN, int TK, int RM"
        )
    ]
    assert reader in staged and "_from_" not in staged
    assert "      take_part<TM, RM>(tile_a[kk], a_reg, threadIdx.y);\n" in staged
    assert "      take_part<TN, RN>(tile_b[kk], b_reg, threadIdx.x);\n" in staged
    assert (
        "  __shared__ float tile_a[TK][TM];\n  __shared__ float tile_b[TK][TN];\n"
        "  for (int step = 0; step < steps; ++step) {\n"
        "    stage_tiles_2d<TM, TK, TN>(tile_a, a, rows, step, depth, depth, tile_b, b, cols, "
        "cols);\n    __syncthreads();\n"
    ) in staged
    assert "    }\n    __syncthreads();\n  }\n" in staged


def test_the_loader_walks_each_tile_along_its_contiguous_global_dimension() -> None:
    _, after = _pair("bounded_rows_2d")
    staged = _apply(counted_at_run_time(after.text))
    assert (
        "template <int WIDTH, int TK, int WIDTH_2>\n"
        "__device__ void stage_tiles_2d(float tile_a[TK][WIDTH], const float* a, int rows, "
        "int step, int depth, int lda, float tile_b[TK][WIDTH_2], const float* b, int cols, "
        "int ldb) {\n"
    ) in staged
    # A's K side is contiguous: the slot's fast part walks it (coalesced), stored transposed
    assert (
        "  for (int slot = thread; slot < TK * WIDTH; slot += threads) {\n"
        "    int const slot_k = slot % TK;\n"
        "    int const slot_b = slot / TK;\n"
        "    float value = 0.0f;\n"
        "    if ((blockIdx.y * WIDTH + slot_b) < rows && (step * TK + slot_k) < depth) {\n"
        "      value = a[(blockIdx.y * WIDTH + slot_b) * lda + (step * TK + slot_k)];\n"
        "    }\n"
        "    tile_a[slot_k][slot_b] = value;\n"
    ) in staged
    assert "    int const slot_k = slot / WIDTH_2;\n    int const slot_b = slot % WIDTH_2;\n" in (
        staged
    )


def test_reads_in_the_kernel_read_the_tiles() -> None:
    _, after = _pair("helper_tiles_2d")
    staged = _apply(after.text)
    assert "A_vals[y] = tile_a[k_i][thread_row_idx * THREAD_TILE_SIZE_Y + y];" in staged
    assert "B_vals[x] = tile_b[k_i][thread_col_idx * THREAD_TILE_SIZE_X + x];" in staged
    assert "__shared__ T tile_a[BLOCK_TILE_SIZE_K][BLOCK_TILE_SIZE_Y];" in staged


READ_A = next(line for line in _pair("bounded_rows_2d")[1].text.splitlines() if "? a[" in line)
CALL_A = "take_part_from_a<TM, RM>(kk, a_reg, threadIdx.y, TK, a, depth, depth, rows, step);"
LOOP_A = "    for (int kk = 0; kk < TK; ++kk) {\n      " + CALL_A


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            (READ_A, READ_A.replace("step * TK", "2 * TK")),
            "whose coordinates are not `t * E + I` and `blockIdx * E + I` (the tile counter",
        ),
        (
            (READ_A, READ_A.replace(" * lda + (step * TK + line_index)]", " * lda]")),
            "that is not `(R < M && C < N ? P[R * L + C] : zero)` over the two coordinates",
        ),
        (
            (CALL_A, CALL_A.replace("depth, depth, rows", "depth, depth + threadIdx.x, rows")),
            "a read over lda, given `depth + threadIdx.x`, which differs between threads",
        ),
        (
            (
                LOOP_A,
                "    int const rows_left = rows;\n"
                + LOOP_A.replace("depth, rows, step", "depth, rows_left, step"),
            ),
            "a read over rows, given `rows_left`, which the loop declares after the point the "
            "tiles are loaded at",
        ),
        (
            ("    for (int kk = 0;", "    rows += 0;\n    for (int kk = 0;"),
            "a read over rows, which the loop writes (rows)",
        ),
        (
            ("  float acc[RM][RN]", "  if (rows == 0) return;\n  float acc[RM][RN]"),
            "a return before or in the loop (line 29)",
        ),
        (
            ("step < steps;", "step < steps + (int)threadIdx.x;"),
            "a loop whose trip count depends on the thread, so a barrier is unsafe",
        ),
        (
            ("  float acc[RM][RN]", "  __shared__ float spare[32];\n  float acc[RM][RN]"),
            "sgemm_bounded_rows, which already uses shared memory or barriers",
        ),
        (
            (
                "  for (int j = 0; j < PART; ++j) {\n    out[j] = ((blockIdx.y",
                "  out[0] = a[0];\n  for (int j = 0; j < PART; ++j) {\n    out[j] = ((blockIdx.y",
            ),
            "a used as `a[0]` in take_part_from_a, not only read through a bounds-checked index",
        ),
        (
            (
                "  for (int j = 0; j < PART; ++j) {\n    out[j] = ((blockIdx.y",
                "  out[0] = line_index;\n"
                "  for (int j = 0; j < PART; ++j) {\n    out[j] = ((blockIdx.y",
            ),
            "take_part_from_a, which uses its row index line_index as `out[0] = line_index`",
        ),
        (
            ("      " + CALL_A, "      " + CALL_A + "\n      " + CALL_A),
            "a read in take_part_from_a, called 2 times",
        ),
    ],
)
def test_forms_the_forward_rule_does_not_take_are_refused_by_name(
    change: tuple[str, str], reason: str
) -> None:
    _, after = _pair("bounded_rows_2d")
    assert change[0] in after.text
    text = after.text.replace(*change)
    site = _candidate(KernelSource(text))
    assert site.refusal is not None and reason in site.refusal, site.refusal
    with pytest.raises(MechanismRefused, match="this rule needs"):
        staging.apply(KernelSource(text), site, Carrier())


def test_a_naive_gemm_offers_no_2d_tile_loop() -> None:
    naive = (
        "__global__ void mm(const float* a, const float* b, float* c, int n) {\n"
        "  int r = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + "
        "threadIdx.x;\n  float s = 0.0f;\n"
        "  for (int k = 0; k < n; ++k) s += a[r * n + k] * b[k * n + col];\n"
        "  c[r * n + col] = s;\n}\n"
    )
    assert [
        c for c in staging.candidates(KernelSource(naive)) if c.detail.get("form") == "tile_loop_2d"
    ] == []


def _cases() -> list[Case]:
    """Two blocks along each dimension with tiles cut by the matrix on every side (8 x 8
    threads, 16 x 16 x 4 tiles, 2 x 2 thread tiles), three tiles along K."""
    call = "sgemm_bounded_rows<16, 16, 4, 2, 2>((int)M, (int)N, (int)K, A, B, C)"
    buffers = [
        Buffer("A", "float", "M * K"),
        Buffer("B", "float", "K * N"),
        Buffer("C", "float", "M * N", output=True),
    ]
    axes = {"M": 21, "N": 19, "K": 11}
    return [Case(axes, buffers, call, "", grid="dim3(2, 2)", block_dims="dim3(8, 8)")]


@pytest.mark.nvcc
def test_the_applied_staging_computes_what_the_expert_and_the_global_reads_did() -> None:
    before, after = _pair("bounded_rows_2d")
    want = run_on_host(before.text, _cases())
    assert want.count("\n") >= 1
    assert run_on_host(after.text, _cases()) == want
    assert run_on_host(_apply(after.text), _cases()) == want
    # counted at run time
    runtime = counted_at_run_time(after.text)
    assert "for (int slot = 0;" not in _apply(runtime)
    assert run_on_host(_apply(runtime), _cases()) == want


@pytest.mark.nvcc
def test_the_applied_staging_compiles(mechanism_builder: Builder) -> None:
    compile_ok(
        mechanism_builder,
        [KernelSource(_apply(_pair(case)[1].text), name=f"{case}.staged.cu") for case in CASES],
    )
