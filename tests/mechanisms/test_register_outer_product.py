"""The register_outer_product mechanism: the round trip on its fixtures, the public idiom (a
scalar per output row, two reduction loops), the same output bits on the host, and each
refusal with the form it found."""

from __future__ import annotations

import pytest

from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import call_arguments
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from klineage.mechanisms._outer_product_index import mixed_radix, polynomial, unify
from klineage.mining.removal import reapply, remove_mechanism
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import FIXTURES, PUBLIC_FORMS, RoundTripSuite

mechanism = get("register_outer_product")
BEFORE = (FIXTURES / "register_outer_product" / "before.cu").read_text()
AFTER = (FIXTURES / "register_outer_product" / "after.cu").read_text()
ROW_DOTS = (PUBLIC_FORMS / "register_outer_product" / "row_dots.before.cu").read_text()
BLOCK_TILED = (PUBLIC_FORMS / "register_outer_product" / "block_tiled.before.cu").read_text()
WARP_SUBTILES = (PUBLIC_FORMS / "register_outer_product" / "warp_subtiles.before.cu").read_text()
HELPER_FILLS = (PUBLIC_FORMS / "register_outer_product" / "helper_fills.before.cu").read_text()


class TestRegisterOuterProduct(RoundTripSuite):
    mechanism = "register_outer_product"


def test_the_removal_sums_each_output_reading_its_operands_where_they_were_loaded() -> None:
    (site,) = mechanism.detect(KernelSource(BEFORE))
    assert site.detail == {"accumulator": "acc", "outputs": "4 x 4"}
    removed = mechanism.remove(KernelSource(BEFORE), site).text
    assert "sum += a[(row0 + i) * k + s] * b[s * n + col0 + j];" in removed
    assert "float sum = acc[i][j];" in removed and "acc[i][j] = sum;" in removed
    assert "acc_lhs" not in removed and "acc_rhs" not in removed
    assert removed.index("for (int i = 0; i < kRows; ++i)") < removed.index("for (int s = 0")


def test_the_public_idiom_moves_a_row_scalar_and_both_reduction_loops() -> None:
    (site,) = mechanism.detect(KernelSource(ROW_DOTS))
    assert site.supported and site.detail["outputs"] == "8 x 8"
    removed = mechanism.remove(KernelSource(ROW_DOTS), site).text
    assert (
        "sum += xr[(int64_t)K * min(ii, last_row) + si] * "
        "wr[(int64_t)K * min(ji, last_col) + si];" in removed
    )
    outputs = removed.index("for (int ji = 0; ji < 8; ++ji) {")
    assert outputs < removed.index("for (int so = 0;") < removed.index("for (int si = so;")
    assert "float lhs" not in removed and "float rhs[8]" not in removed
    # no loop is unrolled that was not: the walk would take a pragma of ours for the expert's
    assert removed.count("#pragma unroll") == ROW_DOTS.count("#pragma unroll")


def test_registers_declared_before_the_loops_go_with_them() -> None:
    """A flat accumulator `r[m * TN + n]`, template trip counts and register arrays declared
    at the top, filled in the turn: the removal deletes the arrays with their fills."""
    (site,) = mechanism.detect(KernelSource(BLOCK_TILED))
    assert site.supported and site.detail == {"accumulator": "threadResults", "outputs": "TM x TN"}
    removed = mechanism.remove(KernelSource(BLOCK_TILED), site).text
    assert "regM" not in removed and "regN" not in removed
    assert (
        "sum += As[(threadRow * TM + resIdxM) * BK + dotIdx] "
        "* Bs[dotIdx * BN + threadCol * TN + resIdxN];" in removed
    )
    assert "threadResults[resIdxM * TN + resIdxN] = sum;" in removed


@pytest.mark.parametrize(
    ("flat", "found"),
    [
        ("resIdxN + resIdxM * TN", True),
        ("resIdxM * TM + resIdxN", False),  # not one slot per output unless TM == TN
        ("resIdxM + resIdxN", False),
    ],
)
def test_a_flat_accumulator_needs_one_slot_per_output(flat: str, found: bool) -> None:
    text = BLOCK_TILED.replace(
        "threadResults[resIdxM * TN + resIdxN] +=", f"threadResults[{flat}] +="
    )
    assert bool(mechanism.detect(KernelSource(text))) == found


COLUMN_STRIP = """\
#include <cstddef>
#include <cuda_runtime.h>

// C = A B on one 8 x 32 tile (A 8 x k, B k x 32): each of 32 threads a column strip of 8,
// the B value of each k kept in a register, the A offsets computed per output
template <typename T, size_t ROWS>
__global__ void column_strip(const T* A, const T* B, T* C, size_t k) {
  T results[ROWS] = {static_cast<T>(0)};
  for (size_t k_i{0U}; k_i < k; ++k_i) {
    size_t const b_row{k_i};
    T const b_val{B[b_row * 32U + threadIdx.x]};
    for (size_t r{0U}; r < ROWS; ++r) {
      size_t const a_row{r};
      T const a_val{A[a_row * k + k_i]};
      results[r] += a_val * b_val;
    }
  }
  for (size_t r{0U}; r < ROWS; ++r) C[r * 32U + threadIdx.x] = results[r];
}
"""


def _column_strip_launch() -> Case:
    """One 32-thread block of the column strip, over 11 steps of k."""
    return Case(
        axes={"kd": 11},
        buffers=[
            Buffer("out", "float", "8 * 32", output=True),
            Buffer("lhs", "float", "8 * kd", offset=1),
            Buffer("rhs", "float", "kd * 32", offset=2),
        ],
        call="column_strip<float, 8>(lhs, rhs, out, (size_t)kd)",
        threads="32",
        block=32,
    )


def test_offsets_and_values_declared_per_output_move_into_the_sum() -> None:
    """Brace-initialized loops, a register of the turn (`b_val`), offsets of the turn and of
    each output (`b_row`, `a_row`), and a value read per output (`a_val`, not reused)."""
    kernel = KernelSource(COLUMN_STRIP)
    (site,) = mechanism.detect(kernel)
    assert site.supported and site.detail == {"accumulator": "results", "outputs": "ROWS"}
    removed = mechanism.remove(kernel, site).text
    assert (
        "size_t const b_row{k_i};\n      size_t const a_row{r};\n"
        "      sum += A[a_row * k + k_i] * B[b_row * 32U + threadIdx.x];" in removed
    )
    assert "b_val" not in removed and "a_val" not in removed
    launch = _column_strip_launch()
    kept = run_on_host(COLUMN_STRIP, [launch])
    assert kept.strip() and run_on_host(removed, [launch]) == kept


@pytest.mark.nvcc
def test_a_single_output_loop_takes_the_forward_back_to_a_scalar_register() -> None:
    """One output loop (1-D thread tiling): the factor that reads no output loop becomes one
    register per turn, the other is read per output (its offsets, then its value, as the
    author wrote them); the applied kernel is detected again and prints the same bytes."""
    kernel = KernelSource(COLUMN_STRIP)
    (site,) = mechanism.detect(kernel)
    removed = mechanism.remove(kernel, site)
    (candidate,) = mechanism.candidates(removed)
    applied = mechanism.apply(removed, candidate, mechanism.carrier_of(kernel, site))
    assert "const T b_val = B[b_row * 32U + threadIdx.x];" in applied.text
    assert "size_t const a_row{r};\n      const T a_val = A[a_row * k + k_i];" in (applied.text)
    assert [s.supported for s in mechanism.detect(applied)] == [True]
    launch = _column_strip_launch()
    kept = run_on_host(COLUMN_STRIP, [launch])
    assert kept.strip() and run_on_host(applied.text, [launch]) == kept


def test_values_read_per_output_alone_are_no_register_reuse() -> None:
    """Without the turn's register, every factor is read per output: nothing is reused."""
    text = COLUMN_STRIP.replace("T const b_val{B[b_row * 32U + threadIdx.x]};\n", "").replace(
        "a_val * b_val", "a_val * B[b_row * 32U + threadIdx.x]"
    )
    assert not mechanism.detect(KernelSource(text))


def test_a_helper_with_the_callers_registers_and_sub_tiles_is_interchanged() -> None:
    """Register arrays and accumulator received as parameters, fills over two loops each
    (`regM[wm * TM + i]`), four output loops and a flat mixed-radix accumulator index."""
    (site,) = mechanism.detect(KernelSource(WARP_SUBTILES))
    assert site.supported and site.detail["outputs"] == "WMITER x WNITER x TM x TN"
    removed = mechanism.remove(KernelSource(WARP_SUBTILES), site).text
    helper = removed[: removed.index("__global__")]
    assert "regM[" not in helper.split("{", 1)[1] and "regN[" not in helper.split("{", 1)[1]
    assert (
        "sum += As[k * BM + warpRow * WM + wm * WSUBM + rowInWarp * TM + m] * "
        "Bs[k * BN + warpCol * WN + wn * WSUBN + colInWarp * TN + n];" in removed
    )
    # the caller's arrays stay: it still passes them
    assert "float regM[WMITER * TM] = {0.0f};" in removed


def test_products_and_fills_in_helpers_are_interchanged_in_the_callers_loop() -> None:
    """One helper fills 2-D register arrays from a shared row (called once per operand),
    another accumulates the products: read with both written out in the kernel's loop, the
    removal leaves per-output sums there, deletes the helpers no call reaches, and keeps
    their checks."""
    kernel = KernelSource(HELPER_FILLS)
    (site,) = mechanism.detect(kernel)
    assert site.supported and site.function == "accumulate_products"
    assert mechanism.carrier_of(kernel, site) == Carrier(first="a_regs", second="b_regs")
    removed = mechanism.remove(kernel, site).text
    assert "fill_registers" not in removed and "accumulate_products" not in removed
    assert "a_regs" not in removed and "b_regs" not in removed
    assert "static_assert(TILE_M % THREAD_M == 0U);" in removed
    assert "sum += a_tile[kk][base + y_2] * b_tile[kk][base_2 + x_2];" in removed
    assert "size_t const base{(ty * THREAD_M) + ry_2 * (THREADS_Y * THREAD_M)};" in removed
    assert removed.index("for (size_t ry_2{0U};") < removed.index("for (size_t kk{0U};")


def test_helper_fills_that_may_not_cover_the_products_are_refused() -> None:
    """A fill's repeat count written as an expression is compared in every instantiation:
    one short of what the products read is refused, and so is one whose values the file
    does not fix (a kernel template it never launches)."""
    short = HELPER_FILLS.replace(
        "TILE_M / (THREAD_M * THREADS_Y), THREADS_Y",
        "TILE_M / (THREAD_M * THREADS_Y) - 1, THREADS_Y",
    )
    (site,) = mechanism.detect(KernelSource(short))
    assert (
        "a register array a_regs filled for r < (TILE_M / (THREAD_M * THREADS_Y) - 1), fewer than"
        in (site.refusal or "")
    )
    launch = HELPER_FILLS[HELPER_FILLS.index("    gemm_helper_fills<float") :]
    launch = launch[: launch.index(";") + 1]
    unknown = HELPER_FILLS.replace(launch, "")  # a template the file never instantiates
    assert unknown != HELPER_FILLS
    (site,) = mechanism.detect(KernelSource(unknown))
    assert "which may be fewer than" in (site.refusal or "")


def test_helpers_that_cannot_be_written_out_are_refused_with_both_forms() -> None:
    text = HELPER_FILLS.replace("(a_tile[kk], a_regs,", "(&a_tile[kk][0], a_regs,")
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    refusal = site.refusal or ""
    assert refusal.startswith("an outer product of register arrays a helper receives")
    assert "passed `&a_tile[kk][0]`, not a name or an element of one" in refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(KernelSource(text), site)


@pytest.mark.parametrize("case", ["warp_subtiles", "helper_fills"])
def test_a_removed_tile_of_sums_takes_the_forward_back_to_register_products(case: str) -> None:
    """What the removal leaves (four output loops, each sum started from and stored back into
    its accumulator, offsets in the turn) is a forward candidate: per turn, each factor over
    its own output loops into a register array, then the products into the accumulator."""
    removed = mechanism.remove(KernelSource(_TILED_CASES[case][0]), _first(case))
    (candidate,) = mechanism.candidates(removed)
    applied = mechanism.apply(removed, candidate, Carrier(first="xs", second="ys"))
    (site,) = mechanism.detect(applied)
    assert site.supported
    assert mechanism.carrier_of(applied, site) == Carrier(first="xs", second="ys")
    back = mechanism.remove(applied, site).text
    assert " ".join(back.split()) == " ".join(removed.text.split())


def _first(case: str) -> Site:
    return mechanism.detect(KernelSource(_TILED_CASES[case][0]))[0]


def test_the_round_trip_reapplies_in_the_caller_the_inlined_removal_rewrote() -> None:
    """The helper form's removal lands in the kernel (the helpers are gone): the walk's
    re-application looks for its candidate there, not only in the removed site's helper."""
    removal = remove_mechanism(KernelSource(HELPER_FILLS), mechanism)
    assert removal.sites[0].function == "accumulate_products"
    reapplied = reapply(removal)
    (site,) = mechanism.detect(reapplied)
    assert site.supported and site.function == "gemm_helper_fills"
    assert mechanism.carrier_of(reapplied, site) == Carrier(first="a_regs", second="b_regs")


def test_the_tile_forward_declares_each_sides_offsets_in_its_fill() -> None:
    removed = mechanism.remove(KernelSource(HELPER_FILLS), _first("helper_fills"))
    applied = mechanism.apply(removed, mechanism.candidates(removed)[0]).text
    fill = applied[applied.index("T acc_lhs[REPEATS_Y][THREAD_M];") :]
    fill = fill[: fill.index("T acc_rhs")]
    assert "size_t const base{(ty * THREAD_M) + ry_2 * (THREADS_Y * THREAD_M)};" in fill
    assert "acc_lhs[ry_2][y_2] = a_tile[kk][base + y_2];" in fill
    assert "acc[ry_2][rx_2][y_2][x_2] += acc_lhs[ry_2][y_2] * acc_rhs[rx_2][x_2];" in applied


def test_a_tile_whose_factor_reads_every_output_loop_is_no_candidate() -> None:
    removed = mechanism.remove(KernelSource(HELPER_FILLS), _first("helper_fills")).text
    text = removed.replace("a_tile[kk][base + y_2]", "a_tile[kk][base + y_2 + x_2]")
    assert text != removed
    assert not mechanism.candidates(KernelSource(text))


def test_registers_a_caller_also_reads_are_refused() -> None:
    text = WARP_SUBTILES.replace(
        "    A += BK;\n", "    if (regM[0] > 1e30f) C[0] = 0.0f;\n    A += BK;\n"
    )
    assert text != WARP_SUBTILES
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    assert "a register array regM the function receives, which a caller also uses" in (
        site.refusal or ""
    )


def test_registers_filled_for_fewer_outputs_than_read_them_are_refused() -> None:
    """A fill over `i < 2` read at `m < TM` would leave the other slots to an earlier turn."""
    text = WARP_SUBTILES.replace("for (int i = 0; i < TM; ++i)", "for (int i = 0; i < 2; ++i)")
    assert text != WARP_SUBTILES
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    assert "a register array regM filled for i < 2, fewer than the outputs" in (site.refusal or "")


def test_an_accumulator_index_that_may_share_slots_is_not_read() -> None:
    text = WARP_SUBTILES.replace(
        "acc[(wm * TM + m) * (WNITER * TN) + wn * TN + n] +=",
        "acc[(wm * TM + m) * TN + wn * TN + n] +=",
    )
    assert text != WARP_SUBTILES
    assert not mechanism.detect(KernelSource(text))


def _expressions(*texts: str) -> tuple[ParsedSource, list[Node]]:
    """The expressions parsed as the arguments of one call, in one source."""
    source = KernelSource(f"__device__ void f() {{ g({', '.join(texts)}); }}\n").parsed
    (call,) = source.iter_nodes("call_expression")
    return source, call_arguments(call)


@pytest.mark.parametrize(
    ("index", "variables", "bounds", "ok"),
    [
        ("i * N + j", ["i", "j"], ["M", "N"], True),
        ("j + N * i", ["i", "j"], ["M", "N"], True),
        ("(w * T + m) * (W * U) + v * U + n", ["w", "v", "m", "n"], ["X", "W", "T", "U"], True),
        ("(w * T + m) * U + v * U + n", ["w", "v", "m", "n"], ["X", "W", "T", "U"], False),
        ("i * M + j", ["i", "j"], ["M", "N"], False),
        ("i + j", ["i", "j"], ["M", "N"], False),
        ("i * i + j", ["i", "j"], ["M", "N"], False),
        ("4 * i + j + 7", ["i", "j"], ["2", "4"], True),
    ],
)
def test_mixed_radix_indices(index: str, variables: list[str], bounds: list[str], ok: bool) -> None:
    source, (node, *limits) = _expressions(index, *bounds)
    assert mixed_radix(source, node, variables, limits) == ok


def test_polynomials_and_unification() -> None:
    source, (node,) = _expressions("(a + 2) * (b - a)")
    assert polynomial(source, node) == {("a", "b"): 1, ("a", "a"): -1, ("b",): 2, ("a",): -2}
    assert unify("w * TM + i", {"w", "i"}, "w * TM + resIdxM") == {"w": "w", "i": "resIdxM"}
    assert unify("w * TM + i", {"w", "i"}, "w * TN + m") is None
    assert unify("u", {"u"}, "i + 1") is None


def test_apply_names_the_registers_as_the_carrier_says() -> None:
    kernel = KernelSource(AFTER)
    (candidate,) = mechanism.candidates(kernel)
    applied = mechanism.apply(kernel, candidate, Carrier(first="a_reg", second="b_reg")).text
    assert "float a_reg[kRows];" in applied and "float b_reg[4];" in applied
    assert "acc[i][j] += a_reg[i] * b_reg[j];" in applied
    # a name already taken in the function gets a fresh one
    clash = mechanism.apply(kernel, candidate, Carrier(first="row0")).text
    assert "float row0_2[kRows];" in clash


def test_apply_caches_each_factor_by_the_output_index_it_reads() -> None:
    swapped = AFTER.replace(
        "sum += a[(row0 + i) * k + s] * b[s * n + col0 + j];",
        "sum += b[s * n + col0 + j] * a[(row0 + i) * k + s];",
    )
    kernel = KernelSource(swapped)
    applied = mechanism.apply(kernel, mechanism.candidates(kernel)[0]).text
    assert "float acc_lhs[4];" in applied and "float acc_rhs[kRows];" in applied
    assert "acc[i][j] += acc_lhs[j] * acc_rhs[i];" in applied


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (("b[s * n + col0 + j]", "b[s * n + j]"), None),  # still a candidate: b reads j only
        (("b[s * n + col0 + j]", "b[s * n + col0 + j + i]"), "reads i and j"),
        (("b[s * n + col0 + j]", "b[s * n + col0]"), "reads neither"),
        (("for (int s = 0; s < k; ++s) {", "for (int s = i; s < k; ++s) {"), "header"),
        (("float sum = acc[i][j];", "float sum = (float)i;"), "a start that reads i"),
        (("acc[i][j] = sum;", "acc[i][j] = sum;\n      b[j] = sum;"), "stores into b"),
    ],
)
def test_forward_candidates_need_one_output_index_per_factor(
    change: tuple[str, str], why: str | None
) -> None:
    text = AFTER.replace(*change).replace("const float* __restrict__ b", "float* __restrict__ b")
    assert text != AFTER
    candidates = mechanism.candidates(KernelSource(text))
    assert bool(candidates) == (why is None), why


def test_a_reduction_that_writes_other_state_is_no_candidate() -> None:
    text = AFTER.replace(
        "for (int s = 0; s < k; ++s) {\n        sum",
        "for (int s = 0; s < k; ++s) {\n        ++row_count;\n        sum",
    ).replace("float acc[kRows][4] = {};", "float acc[kRows][4] = {};\n  int row_count = 0;")
    assert "++row_count" in text
    assert not mechanism.candidates(KernelSource(text))


PER_OUTPUT_SUMS = """\
#include <cstdint>
#include <cuda_runtime.h>

// y = alpha * x w^T, w stored [N, K]: each thread an 8 x 8 block, one dot product per output
__global__ void scaled_dots(const float* x, const float* w, float* y, int M, int N, int K,
                            float alpha) {
  const int i0 = 8 * (blockIdx.y * blockDim.y + threadIdx.y);
  const int j0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (i0 >= M || j0 >= N) return;
  for (int io = 0; io < 8; ++io) {
    const int i = min(i0 + io, M - 1);
    for (int jo = 0; jo < 8; ++jo) {
      const int j = min(j0 + jo, N - 1);
      float val = 0.0f;
      for (int s = 0; s < K; ++s) {
        val += x[(int64_t)i * K + s] * w[(int64_t)j * K + s];
      }
      if (i0 + io < M && j0 + jo < N) y[(int64_t)i * N + j] = val * alpha;
    }
  }
}
"""


def test_per_output_sums_become_a_register_tile_and_an_epilogue() -> None:
    """The naive form (a sum per output, used right away) takes the rewrite through a tile
    of sums: the fills declare the row and the column again, the epilogue gets each sum."""
    kernel = KernelSource(PER_OUTPUT_SUMS)
    (candidate,) = mechanism.candidates(kernel)
    assert candidate.detail == {"sum": "val"}
    applied = mechanism.apply(kernel, candidate).text
    for line in (
        "float acc[8][8];",
        "acc[io][jo] = 0.0f;",
        "const int i = min(i0 + io, M - 1);\n      acc_lhs[io] = x[(int64_t)i * K + s];",
        "acc[io][jo] += acc_lhs[io] * acc_rhs[jo];",
        "float val = acc[io][jo];",
        "if (i0 + io < M && j0 + jo < N) y[(int64_t)i * N + j] = val * alpha;",
    ):
        assert line in applied, line
    # the rewrite is itself an outer product the removal takes back
    (site,) = mechanism.detect(KernelSource(applied))
    assert site.supported


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            ("float acc_rhs[4];", "float acc_rhs[4];\n    float spare = 0.0f;"),
            "also declares spare, which no factor reads",
        ),
        (
            ("acc_lhs[i] = a[(row0 + i) * k + s];", "acc_lhs[i] = a[(row0 + i) * k + s++];"),
            "has side effects",
        ),
        (
            ("acc_rhs[j] = b[s * n + col0 + j];", "acc_rhs[j] = b[s * n + col0 + j] * acc_lhs[0];"),
            "computed from other registers of the turn",
        ),
        (
            ("acc_lhs[i] = a[(row0 + i) * k + s];", "acc_lhs[i] = a[(row0 + i) * k + s + j0];"),
            None,  # j0 is declared before the loops below: no name they shadow
        ),
        (
            ("acc_rhs[j] = b[s * n + col0 + j];", "acc_rhs[j] = b[s * n + col0 + i];"),
            "reads i, a name the output loops would shadow",
        ),
        (
            ("acc[i][j] += acc_lhs[i] * acc_rhs[j];", "acc[i][j] += acc_lhs[i] * acc_rhs[0];"),
            "read at `0`, not at the slot its fill stores",
        ),
        (
            ("  for (int s = 0; s < k; ++s) {\n", "  for (int s = 0; s < k; ++s, ++row0) {\n"),
            "also writes row0",
        ),
    ],
)
def test_unsafe_turns_are_refused_with_the_form_found(
    change: tuple[str, str], reason: str | None
) -> None:
    text = BEFORE.replace(*change)
    if "j0" in text:
        text = text.replace("float acc[kRows][4] = {};", "float acc[kRows][4] = {};\n  int j0 = 0;")
    if "++row0" in text:
        text = text.replace("const int row0", "int row0")
    assert text != BEFORE
    kernel = KernelSource(text)
    (site,) = mechanism.detect(kernel)
    if reason is None:
        assert site.supported
        return
    assert not site.supported and reason in (site.refusal or ""), site.refusal
    with pytest.raises(MechanismRefused, match="the site is"):
        mechanism.remove(kernel, site)


def test_vector_filled_registers_are_detected_and_refused() -> None:
    """Registers filled element by element from float4 reads (as a shared-memory micro-tile
    does) are found, and the refusal quotes the statement it cannot move."""
    text = BEFORE.replace(
        """    #pragma unroll
    for (int i = 0; i < kRows; ++i) {
      acc_lhs[i] = a[(row0 + i) * k + s];
    }
""",
        """    const float4 lhs4 = *reinterpret_cast<const float4*>(&a[s * m + row0]);
    acc_lhs[0] = lhs4.x; acc_lhs[1] = lhs4.y; acc_lhs[2] = lhs4.z; acc_lhs[3] = lhs4.w;
""",
    )
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    assert "a turn that also runs `acc_lhs[0] = lhs4.x;`" in (site.refusal or "")


def test_dot_products_without_registers_are_not_detected() -> None:
    assert not mechanism.detect(KernelSource(AFTER))


_TILED_CASES: dict[str, tuple[str, dict[str, int], str, str, str]] = {
    # kernel, axes, block, grid, call: products whose B operand is k x n
    "block_tiled": (
        BLOCK_TILED,
        {"m": 64, "n": 128, "kd": 24},
        "dim3(256)",
        "dim3(2, 1)",
        "sgemm_blocktiled<64, 64, 8, 4, 4>((int)m, (int)n, (int)kd, lhs, rhs, out)",
    ),
    "warp_subtiles": (
        WARP_SUBTILES,
        {"m": 64, "n": 128, "kd": 32},
        "dim3(128)",
        "dim3(2, 1)",
        "sgemm_warp_tiles<64, 64, 16, 32, 32, 2, 2, 4, 2, 128>"
        "((int)m, (int)n, (int)kd, lhs, rhs, out)",
    ),
    "helper_fills": (
        HELPER_FILLS,
        {"m": 40, "n": 36, "kd": 20},
        "dim3(16)",
        "dim3(2, 2)",
        "gemm_helper_fills<float, 32, 32, 8, 4, 4>"
        "((size_t)m, (size_t)n, (size_t)kd, lhs, rhs, out)",
    ),
}


def _host_case(case: str) -> tuple[str, Case]:
    """(kernel, launch): the fixture's 8 x 8 product on one 2 x 2 block, the row dots' 21 x 19
    product with edges on one 3 x 3 block, the block-tiled product on two 256-thread blocks,
    the helper fills' 40 x 36 product with edges on 2 x 2 blocks, and the per-output sums'
    21 x 19 product."""
    second = Buffer("rhs", "float", "n * kd", offset=2)
    block, grid = "dim3(3, 3)", "dim3(1)"
    if case == "fixture":
        second = Buffer("rhs", "float", "kd * n", offset=2)
        axes, call, block, text = {"m": 8, "n": 8, "kd": 13}, "block_product", "dim3(2, 2)", BEFORE
        call += "(lhs, rhs, out, (int)m, (int)n, (int)kd)"
    elif case in _TILED_CASES:
        second = Buffer("rhs", "float", "kd * n", offset=2)
        text, axes, block, grid, call = _TILED_CASES[case]
    elif case == "row_dots":
        axes, text = {"m": 21, "n": 19, "kd": 13}, ROW_DOTS
        call = "row_dots(lhs, rhs, out, (int)m, (int)n, (int)kd)"
    else:
        axes, text = {"m": 21, "n": 19, "kd": 13}, PER_OUTPUT_SUMS
        call = "scaled_dots(lhs, rhs, out, (int)m, (int)n, (int)kd, 0.75f)"
    launch = Case(
        axes=axes,
        buffers=[
            Buffer("out", "float", "m * n", output=True),
            Buffer("lhs", "float", "m * kd", offset=1),
            second,
        ],
        call=call,
        threads="",
        grid=grid,
        block_dims=block,
    )
    return text, launch


@pytest.mark.nvcc
@pytest.mark.parametrize(
    "case", ["fixture", "row_dots", "block_tiled", "warp_subtiles", "helper_fills"]
)
def test_the_removal_computes_the_same_bits_on_the_host(case: str) -> None:
    """Interchanged, every output sums the same products in the same order."""
    text, launch = _host_case(case)
    kernel = KernelSource(text)
    removed = mechanism.remove(kernel, mechanism.detect(kernel)[0]).text
    kept = run_on_host(text, [launch])
    assert kept.strip() and run_on_host(removed, [launch]) == kept


@pytest.mark.nvcc
def test_the_tile_forward_computes_the_same_bits_on_the_host() -> None:
    text, launch = _host_case("warp_subtiles")
    removed = mechanism.remove(KernelSource(text), _first("warp_subtiles"))
    applied = mechanism.apply(removed, mechanism.candidates(removed)[0]).text
    kept = run_on_host(text, [launch])
    assert kept.strip() and run_on_host(applied, [launch]) == kept


@pytest.mark.nvcc
def test_the_forward_on_per_output_sums_computes_the_same_bits_on_the_host() -> None:
    text, launch = _host_case("per_output_sums")
    kernel = KernelSource(text)
    applied = mechanism.apply(kernel, mechanism.candidates(kernel)[0]).text
    naive = run_on_host(text, [launch])
    assert naive.strip() and run_on_host(applied, [launch]) == naive


_ROW_FILL_HELPERS = """\
template <typename T, size_t COUNT>
__device__ void fill_row(T const row[], T vals[COUNT], size_t first) {
  for (size_t u{0U}; u < COUNT; ++u) {
    vals[u] = row[first + u];
  }
}

template <typename T, size_t TY, size_t TX>
__device__ void accumulate(T const a[TY], T const b[TX], T acc[TY][TX]) {
  for (size_t y{0U}; y < TY; ++y) {
    for (size_t x{0U}; x < TX; ++x) {
      acc[y][x] += a[y] * b[x];
    }
  }
}

"""
_INLINE_FILLS = """\
#pragma unroll
      for (size_t y{0U}; y < THREAD_TILE_SIZE_Y; ++y) {
        A_vals[y] = A_tile_T[k_i][thread_row_idx * THREAD_TILE_SIZE_Y + y];
      }
#pragma unroll
      for (size_t x{0U}; x < THREAD_TILE_SIZE_X; ++x) {
        B_vals[x] = B_tile[k_i][thread_col_idx * THREAD_TILE_SIZE_X + x];
      }
#pragma unroll
      for (size_t y{0U}; y < THREAD_TILE_SIZE_Y; ++y) {
#pragma unroll
        for (size_t x{0U}; x < THREAD_TILE_SIZE_X; ++x) {
          C_results[y][x] += A_vals[y] * B_vals[x];
        }
      }
"""
_HELPER_CALLS = """\
      fill_row<T, THREAD_TILE_SIZE_Y>(A_tile_T[k_i], A_vals, thread_row_idx * THREAD_TILE_SIZE_Y);
      fill_row<T, THREAD_TILE_SIZE_X>(B_tile[k_i], B_vals, thread_col_idx * THREAD_TILE_SIZE_X);
      accumulate<T, THREAD_TILE_SIZE_Y, THREAD_TILE_SIZE_X>(A_vals, B_vals, C_results);
"""


def test_rows_passed_to_fill_helpers_leave_tiles_the_staging_rule_reads() -> None:
    # leimao's V06 order: its fill helpers get a row of a staged tile (`tile[k]`); written out,
    # the products read `tile[k][i]` (not `(tile[k])[i]`), so the staging can go next
    staged = (PUBLIC_FORMS / "smem_staging" / "helper_tiles_2d.before.cu").read_text()
    assert _INLINE_FILLS in staged
    text = staged.replace(_INLINE_FILLS, _HELPER_CALLS).replace(
        "template <typename T, size_t BLOCK_TILE_SIZE_X, size_t BLOCK_TILE_SIZE_Y,\n"
        "          size_t BLOCK_TILE_SIZE_K, size_t THREAD_TILE_SIZE_X",
        _ROW_FILL_HELPERS + "template <typename T, size_t BLOCK_TILE_SIZE_X, size_t "
        "BLOCK_TILE_SIZE_Y,\n          size_t BLOCK_TILE_SIZE_K, size_t THREAD_TILE_SIZE_X",
    )
    kernel = KernelSource(text, name="row_fill_helpers.cu")
    removed = remove_mechanism(kernel, get("register_outer_product")).simplified
    assert "sum += A_tile_T[k_i][(thread_row_idx * THREAD_TILE_SIZE_Y) + y_2]" in removed.text
    staging = get("smem_staging")
    (site,) = staging.detect(removed)
    assert site.supported, site.refusal
    assert "A_tile_T" not in staging.remove(removed, site).text
