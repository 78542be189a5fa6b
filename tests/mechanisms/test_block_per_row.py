"""The block_per_row mechanism: fixtures both ways (from heldout/log_softmax and
heldout/layernorm), the canonical forms and their refusals, the experts, and ``apply`` on every
held-out row reduction."""

from __future__ import annotations

import re

import pytest

from klineage.conditions import AxisAtMost, BlockSizeAtMost, BlockSizeMultiple
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.reductions_experts import (
    HELDOUT,
    assert_detected_where_listed,
    check_expert_removals_compile,
    heldout_applications,
)
from tests.mechanisms.roundtrip import PUBLIC_FORMS, RoundTripSuite, compile_ok

mechanism = get("block_per_row")

ROW_REDUCTIONS = [
    "row_sum",
    "row_max",
    "log_softmax",
    "layernorm",
    "l2_normalize",
    "cross_entropy",
    "gemv",
    "mean_pool",
    "column_sum",
    "sgemm",
    "batched_hgemm",
]


class TestBlockPerRow(RoundTripSuite):
    mechanism = "block_per_row"


def _thread_rows(body: str, extra: str = "") -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <math.h>\n#include <stdint.h>\n"
        f"{extra}"
        "__global__ void k(const float* x, float* y, int64_t rows, int64_t cols) {\n"
        "  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (r >= rows) return;\n"
        f"{body}\n}}\n"
        'extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols,\n'
        "                   cudaStream_t s) {\n"
        "  k<<<(unsigned)((rows + 255) / 256), 256, 0, s>>>(x, y, rows, cols);\n"
        "  return (int)cudaGetLastError();\n}\n"
    )


def test_a_sum_is_spread_over_the_block_and_reduced() -> None:
    source = _thread_rows(
        "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[r * cols + c];\n"
        "  y[r] = acc;"
    )
    (candidate,) = mechanism.candidates(source)
    applied = mechanism.apply(source, candidate, Carrier(block_size=512)).text
    assert "const int64_t r = (int64_t)blockIdx.x;" in applied
    assert "for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)" in applied
    assert "acc = block_reduce_sum(acc);" in applied
    assert "if (threadIdx.x == 0) y[r] = acc;" in applied
    assert "k<<<(unsigned)rows, 512, 0, s>>>" in applied
    assert "__device__ __forceinline__ float block_reduce_sum(float v)" in applied


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            "  float acc = 1.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n  y[r] = acc;",
            "does not start from a zero literal",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) {\n    acc += x[c];\n"
            "    y[r * cols + c] = acc * 0.5f;\n  }",  # a running sum, not stored as one: no scan
            "a running value, not a reduction",
        ),
        (
            "  double acc = 0.0;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n  y[r] = acc;",
            "is not a float",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc = acc * 0.5f + x[c];\n"
            "  y[r] = acc;",
            "not a sum, a max or a min",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; c += 2) acc += x[c];\n"
            "  y[r] = acc;",
            "with a step of 1",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n"
            "  y[r] = acc;\n  acc = y[r] * 2.0f;",
            "written elsewhere",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n"
            "  atomicAdd(y, acc);",
            "is not an assignment",
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n"
            "  y[r] = acc;\n  if (cols > 4) acc = 0.0f;\n"
            "  for (int64_t c = 0; c < cols; ++c) acc += x[c] * x[c];\n  y[r] += acc;",
            "acc is written before its loop",  # a reset on one path only
        ),
        (
            "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n"
            "  y[r] = acc;\n  acc = 1.0f;\n"
            "  for (int64_t c = 0; c < cols; ++c) acc += x[c] * x[c];\n  y[r] += acc;",
            "acc is written before its loop",
        ),
    ],
)
def test_non_canonical_thread_rows_are_refused(body: str, reason: str) -> None:
    source = _thread_rows(body)
    (candidate,) = mechanism.candidates(source)
    assert candidate.refusal is not None and reason in candidate.refusal
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.apply(source, candidate)


REUSED_SUM = (
    "  const float* row = x + r * cols;\n  float sum = 0.0f;\n"
    "  for (int64_t c = 0; c < cols; ++c) sum += row[c];\n  const float m = sum / cols;\n"
    "  sum = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) {\n    const float d = row[c] - m;\n"
    "    sum += d * d;\n  }\n  y[r] = rsqrtf(sum / cols + 1e-5f);"
)


@pytest.mark.nvcc
@pytest.mark.parametrize("group", ["block_per_row", "warp_per_row"])
def test_a_sum_reset_to_zero_for_a_second_walk_is_reduced_after_each_loop(group: str) -> None:
    """llm.c's layernorm idiom: one ``sum`` for the mean's walk and, set to ``0.0f`` again, for
    the variance's. Each loop is spread and reduced on its own, and the host-emulated group
    kernel gives the thread-per-row values for rows shorter than a warp and longer than the
    block."""
    from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host

    naive = _thread_rows(REUSED_SUM)
    (site,) = get(group).candidates(naive)
    assert site.refusal is None
    spread = get(group).apply(naive, site, Carrier(block_size=128))
    helper = "block_reduce_sum" if group == "block_per_row" else "warp_reduce_sum"
    assert spread.text.count(f"sum = {helper}(sum);") == 2
    assert spread.text.index(f"sum = {helper}(sum);") < spread.text.index("const float m")

    def cases(grid: str) -> list[Case]:
        shapes = ((1, 5), (3, 31), (5, 300))
        return [
            Case(
                {"rows": rows, "cols": cols},
                [Buffer("x", "float", "rows * cols"), Buffer("y", "float", "rows", True)],
                "k(x, y, rows, cols)",
                "rows",
                **({"grid": grid, "block_dims": "dim3(128)"} if grid else {}),
            )
            for rows, cols in shapes
        ]

    grid = (
        "dim3((unsigned)rows)" if group == "block_per_row" else "dim3((unsigned)((rows + 3) / 4))"
    )
    want = floats(run_on_host(naive.text, cases("")))
    assert_close(floats(run_on_host(spread.text, cases(grid))), want)


def test_a_helper_using_the_thread_layout_is_refused() -> None:
    helper = "__device__ float lane_of() { return (float)(threadIdx.x & 31); }\n"
    source = _thread_rows(
        "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c] * lane_of();\n"
        "  y[r] = acc;",
        helper,
    )
    (candidate,) = mechanism.candidates(source)
    assert "calls lane_of, which uses threadIdx.x" in (candidate.refusal or "")


def test_a_max_may_start_anywhere_and_several_accumulators_share_a_loop() -> None:
    source = _thread_rows(
        "  float m = x[0];\n  float s = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) {\n"
        "    const float v = x[r * cols + c];\n    m = fmaxf(v, m);\n    s = s + v;\n  }\n"
        "  y[r] = m + s;"
    )
    applied = mechanism.apply(source, mechanism.candidates(source)[0]).text
    assert "  m = block_reduce_max(m);\n  s = block_reduce_sum(s);" in applied


def test_block_carrier_is_checked() -> None:
    source = KernelSource.from_file(HELDOUT / "row_sum" / "kernel.cu")
    (candidate,) = mechanism.candidates(source)
    for bad in (100, 2048):
        with pytest.raises(MechanismRefused, match="multiple of 32"):
            mechanism.apply(source, candidate, Carrier(block_size=bad))


def test_conditions() -> None:
    source = KernelSource.from_file(HELDOUT / "row_sum" / "kernel.cu")
    (candidate,) = mechanism.candidates(source)
    multiple, at_most, rows = mechanism.conditions(source, candidate)
    assert isinstance(multiple, BlockSizeMultiple) and multiple.block_size == "256"
    assert isinstance(at_most, BlockSizeAtMost) and at_most.n == 1024
    assert isinstance(rows, AxisAtMost) and rows.axis == "rows"
    applied = mechanism.apply(source, candidate, Carrier(block_size=128))
    (site,) = mechanism.detect(applied)
    assert mechanism.carrier_of(applied, site) == Carrier(block_size=128)
    assert mechanism.conditions(applied, site)[0].block_size == "128"


def test_the_experts_are_detected_where_listed() -> None:
    assert_detected_where_listed("block_per_row")


@pytest.mark.nvcc
def test_expert_removals_compile_or_refuse(mechanism_builder: Builder) -> None:
    refusals = check_expert_removals_compile("block_per_row", mechanism_builder)
    assert len(refusals) == 2  # rows held in registers across block-strided slots
    assert all("row_in_registers" in r for r in refusals)
    helper_form = KernelSource(BLOCK_ROWS)
    compile_ok(mechanism_builder, [mechanism.remove(helper_form, mechanism.detect(helper_form)[0])])


def test_apply_works_on_every_heldout_row_reduction() -> None:
    assert len(heldout_applications("block_per_row", ROW_REDUCTIONS)) == len(ROW_REDUCTIONS)


@pytest.mark.nvcc
def test_apply_on_heldout_row_reductions_compiles(mechanism_builder: Builder) -> None:
    """log_softmax and layernorm compile as the fixtures; the others here."""
    names = ["row_sum", "row_max", "l2_normalize", "cross_entropy", "gemv", "mean_pool"]
    compile_ok(mechanism_builder, heldout_applications("block_per_row", names))


@pytest.mark.nvcc
def test_apply_leaves_no_unused_variable_behind(mechanism_builder: Builder) -> None:
    """The naive launches size their grid in a local (`blocks`); one block per row no longer
    reads it, so apply deletes it rather than leave nvcc warning #177."""
    names = ["row_sum", "row_max", "l2_normalize", "cross_entropy", "gemv", "mean_pool"]
    sources = heldout_applications("block_per_row", names)
    for source, result in zip(
        sources, mechanism_builder.build_many([(s.text, s.name) for s in sources]), strict=True
    ):
        assert result.ok and "#177" not in result.log, f"{source.name}:\n{result.log}"


def test_a_biased_sum_is_refused_and_a_scan_is_a_scan_candidate() -> None:
    conv = KernelSource.from_file(HELDOUT / "causal_conv1d" / "kernel.cu")
    (candidate,) = mechanism.candidates(conv)
    assert candidate.refusal and "form" not in candidate.detail
    cumsum = KernelSource.from_file(HELDOUT / "cumsum_rows" / "kernel.cu")
    (candidate,) = mechanism.candidates(cumsum)
    assert candidate.supported and candidate.detail["form"] == "scan"


CUMSUM = (HELDOUT / "cumsum_rows" / "kernel.cu").read_text()

ROW_SCAN = """#include <cuda_runtime.h>
#include <stdint.h>

// running totals of 0.5 * x along each row, one thread a row
__global__ void half_running_totals(const float* x, float* out, int n_rows, int n_cols) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n_rows) return;
  float running = 0.f;
  for (int j = 0; j < n_cols; j++) {
    running += 0.5f * x[row * n_cols + j];
    out[row * n_cols + j] = running;
  }
}

extern "C" int run(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t s) {
  half_running_totals<<<(unsigned)((rows + 63) / 64), 64, 0, s>>>(x, out, (int)rows, (int)cols);
  return (int)cudaGetLastError();
}
"""


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("text", "call", "block", "items"),
    [
        (ROW_SCAN, "half_running_totals(x, y, rows, cols)", 64, None),
        (ROW_SCAN, "half_running_totals(x, y, rows, cols)", 64, 3),
        (ROW_SCAN, "half_running_totals(x, y, rows, cols)", 64, 8),
        (CUMSUM, "cumsum_rows(x, y, rows, cols)", 128, None),
        (CUMSUM, "cumsum_rows(x, y, rows, cols)", 128, 8),
    ],
    ids=["fixture", "fixture-three-items", "fixture-eight-items", "cumsum_rows", "cumsum_rows-8"],
)
def test_a_row_scan_becomes_a_block_scan_with_the_same_sums(
    text: str, call: str, block: int, items: int | None
) -> None:
    """A block per row scanning blockDim.x * K elements a turn (each thread K consecutive
    elements serially, warp shuffles over the threads' totals, then the warps' totals through
    shared memory) gives the serial loop's sums within float rounding: rows shorter than a
    warp, than the block, than a turn, and several turns long."""
    from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host

    naive = KernelSource(text)
    (site,) = mechanism.candidates(naive)
    carrier = Carrier(block_size=block, **({} if items is None else {"items_per_thread": items}))
    scanned = mechanism.apply(naive, site, carrier)
    assert "__syncthreads();" in scanned.text
    per_turn = block * (items or 1)
    assert f"+= blockDim.x{'' if per_turn == block else f' * {items}'})" in scanned.text
    # one block of `block` threads per row: the grid is the launch's row count
    assert re.search(rf"<<<\(unsigned\)\(*(\(int\))?rows\)*, {block}, 0, ", scanned.text)

    def cases(grid: bool) -> list[Case]:
        out = []
        shapes = ((1, 1), (3, 31), (2, block + 7), (2, 3 * block), (2, 2 * per_turn + 5))
        for rows, cols in shapes:
            buffers = [
                Buffer("x", "float", "rows * cols"),
                Buffer("y", "float", "rows * cols", True),
            ]
            launch = (
                {"grid": "dim3((unsigned)rows)", "block_dims": f"dim3({block})"} if grid else {}
            )
            out.append(Case({"rows": rows, "cols": cols}, buffers, call, "rows", **launch))
        return out

    want = floats(run_on_host(naive.text, cases(grid=False)))
    assert_close(floats(run_on_host(scanned.text, cases(grid=True))), want)
    compile_ok(Builder(device_only=True), [scanned])


def test_runs_of_eight_are_the_alternative_raced_on_a_row_scan_only() -> None:
    assert mechanism.alternative_carriers(KernelSource(CUMSUM)) == [Carrier(items_per_thread=8)]
    assert mechanism.alternative_carriers(KernelSource(BLOCK_ROWS)) == []


def test_a_scan_block_of_one_warp_is_refused() -> None:
    naive = KernelSource(ROW_SCAN)
    (site,) = mechanism.candidates(naive)
    with pytest.raises(MechanismRefused, match=r"64\.\.1024"):
        mechanism.apply(naive, site, Carrier(block_size=32))
    with pytest.raises(MechanismRefused, match=r"items_per_thread=33 is not in 1\.\.32"):
        mechanism.apply(naive, site, Carrier(block_size=64, items_per_thread=33))


BLOCK_ROWS = """#include <cuda_runtime.h>
#include <stdint.h>

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kThreads>
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = threadIdx.x < kThreads / 32 ? scratch[threadIdx.x] : 0.0f;
  return warp_sum(v);
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads) k(const float* x, float* y, int64_t cols) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float p = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) p += x[r * cols + c];
  const float total = block_sum<kThreads>(p, scratch);
  if (threadIdx.x == 0) y[r] = total;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  k<128><<<(unsigned)rows, 128, 0, s>>>(x, y, cols);
  return (int)cudaGetLastError();
}
"""


def test_a_block_per_row_kernel_with_a_helper_becomes_thread_per_row() -> None:
    source = KernelSource(BLOCK_ROWS)
    (site,) = mechanism.detect(source)
    removed = mechanism.remove(source, site).text
    assert "const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;" in removed
    assert "if (r >= rows) return;" in removed and "int64_t cols, int64_t rows)" in removed
    assert "for (int64_t c = 0; c < cols; ++c) p += x[r * cols + c];" in removed
    assert "const float total = p;" in removed and "  y[r] = total;" in removed
    assert "__shared__" not in removed.split("__global__")[1]
    assert "k<128><<<(unsigned)((rows + 127) / 128), 128, 0, s>>>(x, y, cols, rows);" in removed


def test_a_partial_read_before_the_block_reduction_is_refused() -> None:
    source = KernelSource(
        BLOCK_ROWS.replace("  const float total", "  y[r] = p;\n  const float total")
    )
    (site,) = mechanism.detect(source)
    assert "p, accumulated by the block-strided loop" in (site.refusal or "")


def test_a_block_larger_than_the_launch_bounds_is_refused() -> None:
    source = _thread_rows(
        "  float acc = 0.0f;\n  for (int64_t c = 0; c < cols; ++c) acc += x[c];\n  y[r] = acc;"
    )
    source = KernelSource(
        source.text.replace("__global__ void k(", "__global__ void __launch_bounds__(256) k(")
    )
    (candidate,) = mechanism.candidates(source)
    with pytest.raises(MechanismRefused, match=r"exceeds __launch_bounds__\(256\)"):
        mechanism.apply(source, candidate, Carrier(block_size=512))


def test_a_template_kernel_keeps_its_compile_time_stride() -> None:
    """RMSNorm's scalar fallback is ``template <int kThreads>`` with
    ``__launch_bounds__(kThreads)``: re-applying strides by kThreads, as the expert does (a
    ``blockDim.x`` stride measured 0.95x in the H200 round trip), and checks the bounds in
    every instantiation instead of refusing them as not a number."""
    import re

    from klineage.mining.removal import reapply, remove_mechanism
    from tests.conftest import REPO

    expert = KernelSource.from_file(REPO / "expert_kernels" / "fused_add_rmsnorm" / "kernel.cu")
    removal = remove_mechanism(expert, get("block_per_row"))
    assert removal.changed
    assert "c += kThreads" not in removal.simplified.text.split("add_rmsnorm_rows_scalar")[1][:900]
    strides = re.findall(r"c \+= (\w+)", reapply(removal).text)
    assert strides == re.findall(r"c \+= (\w+)", expert.text) == ["kThreads", "kThreads"]
    # a kernel instantiated with a bound below the carrier's block size is refused
    narrow = KernelSource(
        removal.simplified.text.replace(
            "add_rmsnorm_rows_scalar<512>", "add_rmsnorm_rows_scalar<256>"
        )
    )
    (candidate,) = [c for c in get("block_per_row").candidates(narrow) if c.supported]
    with pytest.raises(MechanismRefused, match="exceeds __launch_bounds__\\(256\\)"):
        get("block_per_row").apply(narrow, candidate, Carrier(block_size=512))


SOFTMAX = "expert_kernels/softmax/kernel.cu"


@pytest.mark.nvcc
def test_an_online_softmax_merge_goes_back_with_its_carried_reduction(
    mechanism_builder: Builder,
) -> None:
    """softmax_online_rows accumulates a MaxSum with push() and combines the threads with
    warp_merge through shared memory. The removal carries that reduction; re-applying puts it
    after the statement holding the accumulating loops (`if (kAligned)`), with its scratch, and
    compiles. The two H200 round trips of this skill were refused before this."""
    from klineage.mining.removal import reapply, remove_mechanism
    from tests.conftest import REPO

    mechanism = get("block_per_row")
    expert = KernelSource.from_file(REPO / SOFTMAX)
    removal = remove_mechanism(expert, mechanism)
    assert [s.function for s in removal.sites] == ["softmax_online_rows"]
    assert removal.carriers[0].get_str("merge_variable") == "acc"
    back = reapply(removal)
    kernel = back.text.split("softmax_online_rows(")[1].split("launch-size choice")[0]
    # once, after the `if (kAligned)` that holds both accumulating loops, as the expert has it
    assert kernel.count("acc = warp_merge(acc);") == 2  # the warps, then the block
    assert back.text.count("__shared__ MaxSum scratch[kThreads / 32];") == 1
    assert "c += kThreads" in kernel and "acc = push(acc, __ldg(row_in + c))" in kernel
    compile_ok(mechanism_builder, [back])


def test_a_user_typed_merge_needs_its_carried_reduction() -> None:
    from klineage.mining.removal import remove_mechanism
    from tests.conftest import REPO

    mechanism = get("block_per_row")
    removal = remove_mechanism(KernelSource.from_file(REPO / SOFTMAX), mechanism)
    simplified = removal.simplified
    (candidate,) = [
        c for c in mechanism.candidates(simplified) if c.function == "softmax_online_rows"
    ]
    assert candidate.supported  # stores through `float* elems = ...&out4[c]` are per element
    with pytest.raises(MechanismRefused, match="only a carried block reduction gives"):
        mechanism.apply(simplified, candidate, Carrier(block_size=512))
    carried = removal.carriers[0].as_dict()
    other = {**carried, "merge_reduction": carried["merge_reduction"].replace("-INFINITY", "0.0f")}
    with pytest.raises(MechanismRefused, match="does not use as its identity"):
        mechanism.apply(simplified, candidate, Carrier.model_validate(other))


def test_a_merge_read_inside_its_statement_after_a_loop_is_refused() -> None:
    """The carried reduction goes after the statement holding the loops; a read of the
    accumulator in that statement after a loop would see one thread's part."""
    from klineage.mining.removal import remove_mechanism
    from tests.conftest import REPO

    mechanism = get("block_per_row")
    removal = remove_mechanism(KernelSource.from_file(REPO / SOFTMAX), mechanism)
    loop_end = "acc = push(push(push(push(acc, v.x), v.y), v.z), v.w);\n    }\n"
    assert loop_end in removal.simplified.text
    peeking = KernelSource(
        removal.simplified.text.replace(loop_end, loop_end + "    const float peek = acc.m;\n")
    )
    (candidate,) = [c for c in mechanism.candidates(peeking) if c.function == "softmax_online_rows"]
    with pytest.raises(MechanismRefused, match=r"acc is read at line \d+, after a loop"):
        mechanism.apply(peeking, candidate, removal.carriers[0])


CACHE_HINTS = """
__global__ void row_stats(float* out, float* mean, const float* inp, int rows, int cols) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* x = inp + row * cols;
  float total = 0.0f;
  for (int c = 0; c < cols; ++c) total += __ldcs(x + c);
  const float m = total / cols;
  if (mean != nullptr) {
    __stcs(mean + row, m);
  }
  float* o = out + row * cols;
  for (int c = 0; c < cols; ++c) __stcs(o + c, __ldcs(x + c) - m);
}

extern "C" int run(const float* inp, float* out, float* mean, int rows, int cols,
                   cudaStream_t stream) {
  row_stats<<<(rows + 255) / 256, 256, 0, stream>>>(out, mean, inp, rows, cols);
  return (int)cudaGetLastError();
}
"""


def test_cache_hinted_loads_and_stores_are_a_thread_rows_reads_and_writes() -> None:
    # llm.c writes its row statistics with __stcs(mean + row, m) and streams with __ldcs
    kernel = KernelSource(CACHE_HINTS)
    (site,) = mechanism.candidates(kernel)
    assert site.supported, site.refusal
    applied = mechanism.apply(kernel, site).text
    assert "if (threadIdx.x == 0) __stcs(mean + row, m);" in applied
    assert "for (int c = threadIdx.x; c < cols; c += blockDim.x) __stcs(o + c," in applied


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # one address for every element: two threads of the block would write it
            "__stcs(o + c, __ldcs(x + c) - m);",
            "__stcs(o + row, __ldcs(x + c) - m);",
            "so two threads of a group could write one element",
        ),
        (  # the statistics read back where another thread of the block stored them
            "  float* o = out + row * cols;",
            "  const float again = __ldcs(mean + row);\n  float* o = out + row * cols;",
            "is read at line",
        ),
    ],
)
def test_cache_hinted_accesses_are_refused_where_threads_would_share_them(
    old: str, new: str, reason: str
) -> None:
    assert old in CACHE_HINTS
    (site,) = mechanism.candidates(KernelSource(CACHE_HINTS.replace(old, new)))
    assert reason in str(site.refusal), site.refusal


@pytest.mark.nvcc
def test_cache_hinted_rows_applied_compile(mechanism_builder: Builder) -> None:
    kernel = KernelSource(CACHE_HINTS)
    (site,) = mechanism.candidates(kernel)
    compile_ok(mechanism_builder, [kernel, mechanism.apply(kernel, site)])


PACKED_TAIL = PUBLIC_FORMS / "block_per_row" / "packed_tail.cu"


@pytest.mark.parametrize(
    ("name", "packs", "tail"),
    [
        (
            "block_per_row",
            "for (int i = threadIdx.x; i < packs; i += blockDim.x) {",
            "for (int i = tail + threadIdx.x; i < cols; i += blockDim.x) __stcs(",
        ),
        (
            "warp_per_row",
            "for (int i = threadIdx.x & 31; i < packs; i += 32) {",
            "for (int i = tail + (threadIdx.x & 31); i < cols; i += 32) __stcs(",
        ),
    ],
)
def test_packs_stored_at_a_sum_of_terms_and_a_tail_from_its_start_are_spread(
    name: str, packs: str, tail: str
) -> None:
    # llm.c-style rows: a pack per turn at `out + row * cols + i * size` (i * size moves one
    # pack a turn, so turns own their elements), then the tail from `tail`, by 1
    kernel = KernelSource.from_file(PACKED_TAIL)
    (candidate,) = get(name).candidates(kernel)
    assert candidate.supported, candidate.refusal
    applied = get(name).apply(kernel, candidate).text
    assert packs in applied
    assert "store_pack(out + row * cols + i * f128::size, packed);" in applied
    assert tail in applied


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # turns two elements apart, each storing four: neighbours overlap
            "store_pack(out + row * cols + i * f128::size, packed);",
            "store_pack(out + row * cols + i * 2, packed);",
            "so two threads of a group could write one element",
        ),
        (  # a start the thread's own sum moves: the group's threads would not agree on it
            "const int tail = packs * f128::size;",
            "const int tail = packs * f128::size + (total > 0.0f);",
            "reads a name the kernel writes",
        ),
        (  # from the row's start by 2: not the form a group's rank offsets
            "for (int i = tail; i < cols; i++)",
            "for (int i = tail; i < cols; i += 2)",
            "does not step by 1",
        ),
    ],
)
def test_packs_and_tails_outside_the_forms_are_refused(old: str, new: str, reason: str) -> None:
    text = PACKED_TAIL.read_text(encoding="utf-8")
    assert old in text
    (candidate,) = mechanism.candidates(KernelSource(text.replace(old, new)))
    assert reason in str(candidate.refusal), candidate.refusal


@pytest.mark.nvcc
def test_packs_and_tails_spread_compile(mechanism_builder: Builder) -> None:
    kernel = KernelSource.from_file(PACKED_TAIL)
    spread = [get(n) for n in ("block_per_row", "warp_per_row")]
    applied = [m.apply(kernel, m.candidates(kernel)[0]) for m in spread]
    compile_ok(mechanism_builder, [kernel, *applied])
