"""A warp or a block per row, in the spellings public kernels use."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host
from tests.mechanisms.roundtrip import PUBLIC_FORMS, removal_chain
from tests.mechanisms.test_warp_per_row import WARP_ROWS

warp_per_row = get("warp_per_row")
block_per_row = get("block_per_row")

# a warp per row in a 32 x y block, packed loads of four floats
WARP_2D = """\
struct alignas(16) F4 { float v[4]; };
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__global__ void row_means(const float* x, float* mean, int rows, int cols) {
  assert(blockDim.x == 32);
  int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float s = 0.f;
  for (int c = threadIdx.x * 4; c < cols; c += 32 * 4) {
    F4 v = *reinterpret_cast<const F4*>(xr + c);
    s += v.v[0] + v.v[1] + v.v[2] + v.v[3];
  }
  s = warp_sum(s);
  if (threadIdx.x == 0) mean[row] = s / cols;
}
"""

# a block per row through cooperative groups, the row from blockIdx.y
BLOCK_CG = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;
template <int kThreads>
__global__ void row_dots(const float* a, const float* b, float* out, int cols) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  __shared__ float partial[32];
  const int row = blockIdx.y;
  float s = 0.f;
  for (int c = block.thread_rank(); c < cols; c += kThreads) s += a[row * cols + c] * b[c];
  partial[warp.meta_group_rank()] = cg::reduce(warp, s, cg::plus<float>{});
  block.sync();
  if (warp.meta_group_rank() == 0) {
    s = cg::reduce(warp, warp.thread_rank() < kThreads / 32 ? partial[warp.thread_rank()] : 0.f,
                   cg::plus<float>{});
    if (warp.thread_rank() == 0) out[row] = s;
  }
}
"""

# a thread per row: neither
THREAD_ROWS = """\
__global__ void row_sums(const float* x, float* y, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += x[r * cols + c];
  y[r] = s;
}
"""


def _launched(block: str) -> str:
    return WARP_2D + (
        'extern "C" int run(const float* x, float* mean, long long rows, long long cols,\n'
        "                   cudaStream_t s) {\n"
        f"  row_means<<<(unsigned)((rows + 3) / 4), {block}, 0, s>>>(x, mean, (int)rows,\n"
        "                                                       (int)cols);\n"
        "  return 0;\n}\n"
    )


def test_a_warp_per_row_in_a_2d_block_is_found_and_needs_its_launch() -> None:
    (site,) = warp_per_row.detect(KernelSource(WARP_2D))
    assert site.function == "row_means"
    assert site.refusal == "no launch of row_means in this file to rewrite"
    assert block_per_row.detect(KernelSource(WARP_2D)) == []


def test_a_warp_per_row_in_a_2d_block_with_packed_loads_becomes_a_thread_per_row() -> None:
    kernel = KernelSource(_launched("dim3(32, 4)"))
    (site,) = warp_per_row.detect(kernel)
    assert site.supported
    (after,) = removal_chain(warp_per_row, kernel).states[1:]
    text = after.text
    # every thread of the 32 x 4 block takes its own row, four packed elements at a time
    row = "((int64_t)blockIdx.x * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x"
    assert f"int row = {row};" in text
    assert "for (int c = 0; c < cols; c += 4) {" in text
    assert "warp_sum(s)" not in text and "mean[row] = s / cols;" in text
    assert "if (threadIdx.x == 0)" not in text
    assert "row_means<<<(unsigned)(((((int)rows)) + 127) / 128), dim3(32, 4), 0, s>>>" in text
    assert "assert(blockDim.x == 32);" in text  # the block keeps its shape
    assert not [s for s in warp_per_row.detect(after) if s.supported]


def test_a_2d_warp_row_launched_with_another_block_width_is_refused() -> None:
    (site,) = warp_per_row.detect(KernelSource(_launched("dim3(16, 8)")))
    assert site.refusal is not None
    assert "is not one-dimensional (dim3(16, 8))" in site.refusal


def test_a_block_per_row_with_cooperative_groups_is_found() -> None:
    (site,) = block_per_row.detect(KernelSource(BLOCK_CG))
    assert site.function == "row_dots"
    assert "strides by the block: kThreads from threadIdx.x" in str(site.refusal)
    assert warp_per_row.detect(KernelSource(BLOCK_CG)) == []


def test_a_thread_per_row_is_neither() -> None:
    kernel = KernelSource(THREAD_ROWS)
    assert warp_per_row.detect(kernel) == [] and block_per_row.detect(kernel) == []


def test_a_tile_shuffle_left_in_a_cooperative_groups_warp_row_is_refused_by_line() -> None:
    before = (PUBLIC_FORMS / "warp_per_row" / "rows_cg.before.cu").read_text()
    assert warp_per_row.detect(KernelSource(before))[0].supported
    broadcast = before.replace(
        "const float mean = sum / cols;", "const float mean = warp.shfl(sum, 0) / cols;"
    )
    (site,) = warp_per_row.detect(KernelSource(broadcast))
    assert site.refusal is not None
    assert site.refusal.startswith("warp.shfl(sum, 0) at line 19 is not a group-strided loop")


def test_the_block_width_assert_may_name_the_warp_size_by_a_macro() -> None:
    text = "#define WARP_SIZE 32U\n" + _launched("dim3(32, 4)").replace(
        "assert(blockDim.x == 32);", "assert(WARP_SIZE == blockDim.x);"
    )
    (site,) = warp_per_row.detect(KernelSource(text))
    assert site.supported
    (after,) = removal_chain(warp_per_row, KernelSource(text)).states[1:]
    assert "assert(WARP_SIZE == blockDim.x);" in after.text
    # a width the block does not have is not a warp's: the assert ties the kernel to it
    wrong = text.replace("#define WARP_SIZE 32U", "#define WARP_SIZE 16U")
    (refused,) = warp_per_row.detect(KernelSource(wrong))
    assert refused.refusal is not None and "blockDim.x" in refused.refusal


def test_a_row_check_that_lets_the_last_row_through_returns_at_the_row_count_after() -> None:
    # llm.c fused_residual_forward k4 writes `if (idx > N) return;`: a spare warp would touch
    # row N; a thread per row always has spare threads, so the rewrite returns at `>=`
    strict = KernelSource(_launched("dim3(32, 4)"))
    loose = KernelSource(strict.text.replace("if (row >= rows) return;", "if (row > rows) return;"))
    (site,) = warp_per_row.detect(loose)
    assert site.supported
    (after,) = removal_chain(warp_per_row, loose).states[1:]
    (want,) = removal_chain(warp_per_row, strict).states[1:]
    assert after.text == want.text
    assert "if (row >= rows) return;" in after.text and "row > rows" not in after.text


def test_a_row_check_on_another_variable_is_no_bound_check() -> None:
    text = _launched("dim3(32, 4)").replace("if (row >= rows) return;", "if (cols > rows) return;")
    (site,) = warp_per_row.detect(KernelSource(text))
    assert site.refusal == "the warp row index at line 8 has no bound check"


# a block per row whose warp partials go through scratch under new names, a shuffle helper
SCRATCH_HELPER = """\
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__global__ void row_totals(const float* x, float* y, int cols) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const float* xr = x + (size_t)blockIdx.x * cols;
  float p = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) p += xr[c];
  float w = warp_sum(p);
  if (lane == 0) partial[wid] = w;
  __syncthreads();
  float r = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.f;
  float total = warp_sum(r);
  __syncthreads();
  if (threadIdx.x == 0) y[blockIdx.x] = total;
}
extern "C" int run(const float* x, float* y, long long rows, long long cols, cudaStream_t s) {
  row_totals<<<(unsigned)rows, 128, 0, s>>>(x, y, (int)cols);
  return 0;
}
"""


def test_a_block_reduction_through_scratch_under_new_names_becomes_the_partial() -> None:
    (site,) = block_per_row.detect(KernelSource(SCRATCH_HELPER))
    assert site.supported
    (after,) = removal_chain(block_per_row, KernelSource(SCRATCH_HELPER)).states[1:]
    text = after.text
    assert "float w = p;" in text and "float total = w;" in text
    for gone in ("partial[", "__syncthreads", "lane", "wid", "float r ="):
        assert gone not in text, gone
    assert "y[blockIdx.x]" not in text and "] = total;" in text


def test_a_cooperative_groups_barrier_left_outside_the_reduction_is_refused() -> None:
    """A thread per row returns early past its last row: a barrier left behind would wait for
    threads that are gone, however it is spelled."""
    cg_header = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n"
    text = cg_header + SCRATCH_HELPER.replace(
        "  if (threadIdx.x == 0) y[blockIdx.x] = total;",
        "  cg::this_thread_block().sync();\n  if (threadIdx.x == 0) y[blockIdx.x] = total;",
    )
    (site,) = block_per_row.detect(KernelSource(text))
    assert site.refusal == "cg::this_thread_block().sync() at line 20 is not part of a reduction"


def test_blockdim_x_is_a_warp_stride_only_where_the_lane_is_threadidx_x() -> None:
    (site,) = warp_per_row.detect(KernelSource(WARP_ROWS))
    assert site.supported
    # a 128-thread block: lanes striding by blockDim.x skip most of the row
    by_block = WARP_ROWS.replace("c += 32)", "c += blockDim.x)")
    (refused,) = warp_per_row.detect(KernelSource(by_block))
    assert refused.refusal is not None
    assert refused.refusal.startswith("the lane variable lane at line 16 is not a group-strided")


WALK_BACK = PUBLIC_FORMS / "warp_per_row" / "rows_2d_walk_back.before.cu"


def test_a_walk_whose_end_is_read_after_its_loop_is_refused() -> None:
    # where a lane's walk stops is not where a thread's stops: reading it is refused
    text = WALK_BACK.read_text().replace(
        "  c -= kLanes * kPack;\n", "  if (c == cols) y[0] = mean;\n  c -= kLanes * kPack;\n"
    )
    (site,) = warp_per_row.detect(KernelSource(text))
    assert site.refusal is not None
    assert "c at line 30 is used after the loop at line 24" in site.refusal


def test_a_walk_back_by_another_step_is_refused() -> None:
    text = WALK_BACK.read_text().replace(
        "for (; c >= 0; c -= kLanes * kPack)", "for (; c >= 0; c -= kPack)"
    )
    (site,) = warp_per_row.detect(KernelSource(text))
    assert site.refusal is not None and "is used after the loop" in site.refusal


# A block per row whose row goes to a helper: the helper strides the row by the block (the
# maximum walked backwards, as some public code does for the cache) and reduces through a
# block reducer whose warp reduction is a template argument (a function pointer), one reducer
# shared by sums and maxima.
HELPER_ROWS = """\
#include <math.h>
#include <stdint.h>
using warp_fn = float (*)(float);
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
template <warp_fn reduce_warp>
__device__ float block_reduce(float v, float pad) {
  __shared__ float slots[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float w = reduce_warp(v);
  if (lane == 0) slots[warp] = w;
  __syncthreads();
  w = lane < blockDim.x / 32 ? slots[lane] : pad;
  w = reduce_warp(w);
  __syncthreads();
  return w;
}
template <warp_fn reduce_warp>
__device__ float block_reduce(float v) {
  return block_reduce<reduce_warp>(v, 0.0f);
}
__device__ float2 row_stats(const float* x, int row, int cols) {
  float m = -INFINITY, s = 0.0f;
  for (int c = cols + threadIdx.x - blockDim.x; c >= 0; c -= blockDim.x)
    m = fmaxf(m, x[row * cols + c]);
  m = block_reduce<warp_max>(m, -INFINITY);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(x[row * cols + c] - m);
  return make_float2(m, block_reduce<warp_sum>(s));
}
__global__ void log_norm(const float* x, float* out, int cols) {
  int row = blockIdx.x;
  float2 st = row_stats(x, row, cols);
  if (threadIdx.x == 0) out[row] = st.x + logf(st.y);
}

extern "C" int run(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  log_norm<<<(unsigned)rows, 64, 0, stream>>>(x, out, (int)cols);
  return 0;
}
"""


def test_a_row_a_helper_block_reduces_becomes_a_thread_per_row_that_runs_it_alone() -> None:
    kernel = KernelSource(HELPER_ROWS)
    (site,) = block_per_row.detect(kernel)
    assert site.supported, site.refusal
    after = block_per_row.remove(kernel, site).text
    assert "for (int c = cols - 1; c >= 0; c -= 1)" in after
    assert "for (int c = 0; c < cols; c += 1)" in after
    assert "m = block_reduce" not in after  # a reduction of one value into itself goes
    assert "return make_float2(m, s);" in after
    assert "int row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;" in after
    assert "if (row >= rows) return;" in after
    assert "if (threadIdx.x == 0)" not in after
    assert (
        "log_norm<<<(unsigned)((rows + 63) / 64), 64, 0, stream>>>(x, out, (int)cols, rows);"
        in after
    )
    assert block_per_row.detect(KernelSource(after)) == []


@pytest.mark.nvcc
def test_the_thread_per_row_computes_what_the_block_per_row_did_on_the_host() -> None:
    kernel = KernelSource(HELPER_ROWS)
    (site,) = block_per_row.detect(kernel)
    after = block_per_row.remove(kernel, site).text
    results = []
    for text, grid in ((HELPER_ROWS, True), (after, False)):
        cases = []
        for rows, cols in ((3, 1), (5, 70), (2, 200)):  # fewer columns than threads, a tail
            buffers = [
                Buffer("x", "float", "rows * cols"),
                Buffer("out", "float", "rows", output=True),
            ]
            call = "log_norm(x, out, (int)cols)" if grid else "log_norm(x, out, (int)cols, rows)"
            cases.append(
                Case(
                    axes={"rows": rows, "cols": cols},
                    buffers=buffers,
                    call=call,
                    threads="rows",
                    block=64,
                    grid="dim3(rows)" if grid else "",
                    block_dims="dim3(64)",
                )
            )
        results.append(floats(run_on_host(text, cases)))
    before, thread_rows = results
    assert len(before) == 3 and all(
        len(v) == n for v, n in zip(before.values(), (3, 5, 2), strict=True)
    )
    assert_close(thread_rows, before)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            (
                "float m = -INFINITY, s = 0.0f;",
                "__shared__ float seen[64]; float m = -INFINITY, s = 0.0f;",
            ),
            "shared memory",
        ),
        (
            (
                "return make_float2(m, block_reduce<warp_sum>(s));",
                "return make_float2(warp_max(m), s);",
            ),
            "works across threads",
        ),
        (("float m = -INFINITY, s = 0.0f;", "float m = threadIdx.y, s = 0.0f;"), "threadIdx.y"),
        (
            (
                "  return make_float2(m, block_reduce<warp_sum>(s));",
                "  __syncthreads();\n  return make_float2(m, block_reduce<warp_sum>(s));",
            ),
            "calls __syncthreads",
        ),
        (
            (
                "  return make_float2(m, block_reduce<warp_sum>(s));",
                "  __syncwarp();\n  return make_float2(m, block_reduce<warp_sum>(s));",
            ),
            "calls __syncwarp",
        ),
        (
            (
                "__global__ void log_norm",
                "__device__ float2 again(const float* x) { return row_stats(x, 0, 4); }\n"
                "__global__ void log_norm",
            ),
            "again calls it too",
        ),
    ],
)
def test_row_code_a_one_thread_block_would_change_is_refused(
    change: tuple[str, str], reason: str
) -> None:
    (site,) = block_per_row.detect(KernelSource(HELPER_ROWS.replace(*change)))
    assert "hands its row to row_stats" in (site.refusal or "")
    assert reason in (site.refusal or "")


def test_a_block_reducer_is_one_only_where_every_caller_passes_a_warp_reduction() -> None:
    # the same reducer instantiated once with a function that is no warp reduction
    text = HELPER_ROWS.replace(
        "__global__ void log_norm",
        "__device__ float twice(float v) { return 2.0f * v; }\n"
        "__device__ float other(float v) { return block_reduce<twice>(v, 0.0f); }\n"
        "__global__ void log_norm",
    )
    assert block_per_row.detect(KernelSource(text)) == []


def test_row_code_that_syncs_a_cooperative_group_is_refused() -> None:
    text = HELPER_ROWS.replace(
        "#include <math.h>\n",
        "#include <math.h>\n#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n",
    ).replace(
        "  float m = -INFINITY, s = 0.0f;\n",
        "  cg::thread_block block = cg::this_thread_block();\n  float m = -INFINITY, s = 0.0f;\n"
        "  block.sync();\n",
    )
    (site,) = block_per_row.detect(KernelSource(text))
    assert "row_stats works across threads through cooperative groups" in (site.refusal or "")


def test_a_row_named_by_blockidx_inside_a_thread_zero_guard_becomes_the_threads_row() -> None:
    text = HELPER_ROWS.replace(
        "  int row = blockIdx.x;\n  float2 st = row_stats(x, row, cols);\n"
        "  if (threadIdx.x == 0) out[row] = st.x + logf(st.y);\n",
        "  float2 st = row_stats(x, blockIdx.x, cols);\n"
        "  if (threadIdx.x == 0) out[blockIdx.x] = st.x + logf(st.y);\n",
    )
    assert text != HELPER_ROWS
    (site,) = block_per_row.detect(KernelSource(text))
    assert site.supported, site.refusal
    after = block_per_row.remove(KernelSource(text), site).text
    assert "const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;" in after
    assert "float2 st = row_stats(x, row, cols);" in after
    assert "out[row] = st.x + logf(st.y);" in after
    assert "blockIdx.x" not in after.split("const int64_t row =")[1].split("\n", 1)[1]


# A bias gradient added into its buffer (llm.c's matmul_backward_bias idiom, as its removals
# leave it): a product of parameters named before the row index, and the row's output read
# and written back in one statement after the reduction.
BIAS_ROWS = """#include <cuda_runtime.h>
#include <stdint.h>
// per output channel, the sum of dout's column added into dbias
__global__ void bias_grad(float* dbias, const float* dout, int B, int T, int OC) {
  int BT = B * T;
  int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= OC) return;
  float sum = 0.0f;
  for (int i = 0; i < BT; ++i) {
    sum += dout[i * OC + idx];
  }
  {
    dbias[idx] = dbias[idx] + sum;
  }
}

extern "C" int run(float* dbias, const float* dout, int64_t B, int64_t T, int64_t OC,
                   cudaStream_t stream) {
  bias_grad<<<(unsigned)((OC + 255) / 256), 256, 0, stream>>>(dbias, dout, (int)B, (int)T,
                                                              (int)OC);
  return (int)cudaGetLastError();
}
"""


def _bias_cases(grid: str) -> list[Case]:
    call = "bias_grad(dbias, dout, (int)B, (int)T, (int)OC)"
    return [
        Case(
            axes={"B": b, "T": t, "OC": oc},
            buffers=[
                Buffer("dbias", "float", "OC", output=True),
                Buffer("dout", "float", "B * T * OC", offset=1),
            ],
            call=call,
            threads="OC",
            grid=grid,
            block_dims="dim3(256)",
        )
        for b, t, oc in ((1, 3, 5), (2, 50, 9), (3, 70, 40))
    ]


@pytest.mark.nvcc
def test_a_row_updated_in_place_after_uniform_locals_spreads() -> None:
    kernel = KernelSource(BIAS_ROWS)
    want = floats(run_on_host(BIAS_ROWS, _bias_cases("")))
    grids = {"warp_per_row": "dim3((unsigned)((OC + 7) / 8))", "block_per_row": "dim3(OC)"}
    for name, grid in grids.items():
        rule = get(name)
        (candidate,) = rule.candidates(kernel)
        assert candidate.supported, candidate.refusal
        applied = rule.apply(kernel, candidate).text
        assert "int BT = B * T;" in applied
        guard = "(threadIdx.x & 31) == 0" if name == "warp_per_row" else "threadIdx.x == 0"
        assert f"if ({guard}) dbias[idx] = dbias[idx] + sum;" in applied
        assert_close(floats(run_on_host(applied, _bias_cases(grid))), want)


@pytest.mark.parametrize(
    ("old", "new", "refusal"),
    [
        # the output read before the reduction, by every thread of the group
        (
            "  float sum = 0.0f;\n",
            "  float sum = 0.0f;\n  const float old = dbias[idx];\n",
            "read at line",
        ),
        # the element stored twice
        (
            "    dbias[idx] = dbias[idx] + sum;\n",
            "    dbias[idx] = dbias[idx] + sum;\n    dbias[idx] = 2.0f * dbias[idx];\n",
            "read at line",
        ),
        # a leading local written again, or one that differs by thread: no thread row at all
        ("  float sum = 0.0f;\n", "  float sum = 0.0f;\n  BT += 1;\n", None),
        ("  int BT = B * T;\n", "  int BT = B * (int)threadIdx.y;\n", None),
    ],
)
def test_in_place_updates_and_leading_locals_that_do_not_hold_are_refused(
    old: str, new: str, refusal: str | None
) -> None:
    assert old in BIAS_ROWS
    kernel = KernelSource(BIAS_ROWS.replace(old, new))
    for name in ("warp_per_row", "block_per_row"):
        candidates = get(name).candidates(kernel)
        if refusal is None:
            assert candidates == []
        else:
            (candidate,) = candidates
            assert refusal in (candidate.refusal or ""), candidate.refusal
