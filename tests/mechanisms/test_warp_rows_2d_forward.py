"""warp_per_row forward on the thread-per-row state a 32 x y block's removal leaves: the row
``((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x`` becomes the
row of the thread's warp again, the lanes ``threadIdx.x`` stride over the row (packed steps
``c += V`` by ``32 * V``, a walk back ``c -= V`` by ``32 * V``), and the grid gives each of the
block's y warps a row. The ``rows_2d_*`` fixture pairs of warp_per_row run the round-trip suite
both ways; these tests show the candidates, the applied text, remove(apply(x)) == x, the build,
and the refusals of what the rule does not take."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES, PUBLIC_FORMS, compile_ok, diff, fixture_pairs

warp_per_row = get("warp_per_row")
block_per_row = get("block_per_row")
TOTALS = KernelSource.from_file(FIXTURES / "warp_per_row" / "rows_2d_totals.after.cu")
PACKED = KernelSource.from_file(FIXTURES / "warp_per_row" / "rows_2d_packed.after.cu")
WALK_BACK = KernelSource.from_file(PUBLIC_FORMS / "warp_per_row" / "rows_2d_walk_back.after.cu")
ROWS_2D = KernelSource.from_file(PUBLIC_FORMS / "warp_per_row" / "rows_2d.after.cu")
SPLIT = KernelSource.from_file(PUBLIC_FORMS / "warp_per_row" / "rows_2d_split_stores.after.cu")
REMOVED = [TOTALS, PACKED, WALK_BACK, ROWS_2D, SPLIT]
IDS = ["totals", "packed", "public-walk-back", "public-rows-2d", "public-split-stores"]


def _applied(kernel: KernelSource) -> KernelSource:
    (site,) = warp_per_row.candidates(kernel)
    assert site.supported, site.refusal
    return warp_per_row.apply(kernel, site, Carrier(block_size=256))


def _refusal(kernel: KernelSource, mechanism: str = "warp_per_row") -> str:
    (site,) = get(mechanism).candidates(kernel)
    assert site.refusal is not None, "the variant should be refused"
    return site.refusal


def _variant(kernel: KernelSource, old: str, new: str) -> KernelSource:
    assert old in kernel.text
    return KernelSource(kernel.text.replace(old, new), name="variant.cu")


@pytest.mark.parametrize("kernel", REMOVED, ids=IDS)
def test_the_removed_state_is_a_supported_candidate(kernel: KernelSource) -> None:
    (site,) = warp_per_row.candidates(kernel)
    assert site.supported and site.function == kernel.parsed.kernels[0].name


def test_the_row_sum_gets_its_warp_back() -> None:
    text = _applied(TOTALS).text
    assert "const int64_t r = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;" in text
    assert "for (int64_t c = threadIdx.x; c < cols; c += 32) s += x[r * cols + c];" in text
    assert "s = warp_reduce_sum(s);\n  if (threadIdx.x == 0) y[r] = s;" in text
    # the block keeps its shape; the grid gives each of its 8 warps a row
    assert "row_totals<<<(unsigned)((rows + 7) / 8), dim3(32, 8), 0, stream>>>" in text


def test_packed_steps_and_the_walk_back_stride_by_the_warp() -> None:
    text = _applied(PACKED).text
    assert "int row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y;" in text
    assert "assert(blockDim.x == kLanes);" in text
    assert "int c = threadIdx.x * f32x4::size;\n  for (; c < cols; c += 32 * f32x4::size) {" in text
    assert "total = warp_reduce_sum(total);\n  squares = warp_reduce_sum(squares);" in text
    assert "c -= 32 * f32x4::size;\n  for (; c >= 0; c -= 32 * f32x4::size) {" in text
    assert "if (threadIdx.x == 0) stats[2 * row] = mean;" in text
    assert "<<<(unsigned)(((((int)rows)) + 3) / 4), dim3(32, kRowsPerBlock), 0, stream>>>" in text


def test_a_packed_walk_through_casts_strides_by_the_warp() -> None:
    text = _applied(WALK_BACK).text
    assert "int c = threadIdx.x * kPack;\n  for (; c < cols; c += 32 * kPack) {" in text
    assert "c -= 32 * kPack;\n  for (; c >= 0; c -= 32 * kPack) {" in text


@pytest.mark.parametrize("kernel", REMOVED, ids=IDS)
def test_removing_what_the_rule_wrote_gives_the_kernel_back(kernel: KernelSource) -> None:
    applied = _applied(kernel)
    (site,) = [s for s in warp_per_row.detect(applied) if s.supported]
    got = warp_per_row.remove(applied, site).text
    assert got == kernel.text, diff(got, kernel.text)


@pytest.mark.nvcc
def test_the_applied_kernels_compile(mechanism_builder: Builder) -> None:
    compile_ok(mechanism_builder, [_applied(kernel) for kernel in REMOVED])


def test_a_store_helper_split_into_hinted_words_is_a_packed_store() -> None:
    # vectorized_access's removal leaves the 128-bit store helper as four __stcs of words
    # through a local; it still writes its pack at out + c, so the lanes may share the row
    text = _applied(SPLIT).text
    assert "for (int c = threadIdx.x * quad4::size; c < cols; c += 32 * quad4::size) {" in text
    assert "put4_streaming(out + c, o);" in text
    assert "sum = warp_reduce_sum(sum);" in text


def test_the_block_rule_refuses_the_2d_index() -> None:
    refusal = _refusal(TOTALS, "block_per_row")
    assert "the thread's linear index in a 2-D block" in refusal
    assert "this rule needs blockIdx.x * blockDim.x + threadIdx.x" in refusal


def test_a_block_whose_x_extent_is_not_32_is_refused() -> None:
    wide = _variant(TOTALS, "dim3(32, 8)", "dim3(64, 4)")
    refusal = _refusal(wide)
    assert "has block dim3(64, 4)" in refusal
    assert "this rule needs a constant 32 x y block" in refusal


def test_a_width_assert_in_a_one_dimensional_kernel_is_refused() -> None:
    one_d = _variant(
        TOTALS,
        "  const int64_t r = ((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + "
        "threadIdx.x;",
        "  assert(blockDim.x == 32);\n  const int64_t r = (int64_t)blockIdx.x * blockDim.x + "
        "threadIdx.x;",
    )
    assert "blockDim.x is used outside the row index" in _refusal(one_d)


def test_a_walk_whose_end_is_read_after_its_loop_is_refused() -> None:
    # where a lane's walk stops is not where a thread's stops
    read = _variant(PACKED, "  c -= f32x4::size;\n", "  stats[0] = c;\n  c -= f32x4::size;\n")
    refusal = _refusal(read)
    assert "c at line 57 is used after the loop at line 44" in refusal
    assert "this rule needs only `c -= f32x4::size; for (; c >= 0; c -= f32x4::size)`" in refusal


def test_a_packed_step_with_another_use_of_its_index_is_refused() -> None:
    mixed = _variant(PACKED, "s[k] = u[k] + v[k];", "s[k] = u[k] + v[k] + c;")
    refusal = _refusal(mixed)
    assert (
        "the loop at line 44: c at line 49 is not the address of a packed load or store" in refusal
    )


def test_a_step_of_two_packs_is_refused() -> None:
    double = _variant(PACKED, "for (; c < cols; c += f32x4::size)", "for (; c < cols; c += 8)")
    refusal = _refusal(double)
    assert "moves 4 elements a call, not the loop's step 8" in refusal


def test_a_split_loop_with_another_step_is_refused() -> None:
    text = ROWS_2D.text.replace(
        "  for (int c = 0; c < cols; ++c) sum += x[c];",
        "  int c = 0;\n  for (; c < cols; c += 2) sum += x[c];",
    )
    refusal = _refusal(KernelSource(text))
    assert "declares c before it and steps by neither 1 nor a packed vector" in refusal


def test_the_block_rule_refuses_a_split_walk() -> None:
    one_d = _variant(
        PACKED,
        "int row = ((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;",
        "int row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
    )
    one_d = _variant(one_d, "  constexpr int kLanes = 32;\n  assert(blockDim.x == kLanes);\n", "")
    one_d = _variant(one_d, "dim3(32, kRowsPerBlock)", "128")
    assert "writes that form back for a warp per row only" in _refusal(one_d, "block_per_row")
    (site,) = warp_per_row.candidates(one_d)  # a 1-D warp per row takes it
    assert site.supported, site.refusal
    text = warp_per_row.apply(one_d, site, Carrier(block_size=128)).text
    assert "int c = (threadIdx.x & 31) * f32x4::size;" in text


def test_heldout_candidates_are_unchanged_by_the_2d_forms() -> None:
    # the held-out naive kernels are 1-D thread per row: neither rule sees a 2-D index there
    for name in ("row_sum", "layernorm", "l2_normalize", "cumsum_rows"):
        kernel = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        for mechanism in (warp_per_row, block_per_row):
            for site in mechanism.candidates(kernel):
                assert "2-D block" not in (site.refusal or "")


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["rows_2d_totals", "rows_2d_packed"])
def test_both_states_pass_the_gate(tmp_path, case: str) -> None:
    # the warp per row the rule writes, and the thread per row it starts from, on the problem
    from klineage.gate.gate import Gate
    from klineage.problem import load_problem

    problems = {
        "rows_2d_totals": REPO / "heldout" / "row_sum",
        "rows_2d_packed": PUBLIC_FORMS / "problems" / "add_normalize",
    }
    problem = load_problem(problems[case])
    (pair,) = [p for p in fixture_pairs("warp_per_row") if p.case == case]
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        for state, kernel in (("before", pair.before), ("after", pair.after)):
            source = KernelSource(kernel.text, name=f"{case}.{state}.cu")
            verdict = gate.run(problem, source, time_it=False)
            failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
            assert verdict.passed, (state, verdict.build.message, failing)
