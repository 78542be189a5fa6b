"""Reductions in the spellings public kernels use: cooperative groups, grid strides."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mining.removal import reapply, remove_mechanism
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

warp_reduction = get("warp_shuffle_reduction")
grid_stride = get("grid_stride_loop")

# one block per row, partial sums reduced per warp with cooperative groups, then across warps
CG_ROWS = """\
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <stdint.h>
namespace cg = cooperative_groups;

__global__ void row_sums(const float* x, float* y, int cols) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  __shared__ float partial[32];
  const float* row = x + blockIdx.x * cols;
  float s = 0.f;
  for (int c = block.thread_rank(); c < cols; c += blockDim.x) s += row[c];
  partial[warp.meta_group_rank()] = cg::reduce(warp, s, cg::plus<float>{});
  block.sync();
  s = warp.thread_rank() < warp.meta_group_size() ? partial[warp.thread_rank()] : 0.f;
  s = cg::reduce(warp, s, cg::plus<float>{});
  if (block.thread_rank() == 0) y[blockIdx.x] = s;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  row_sums<<<rows, 256, 0, stream>>>(x, y, (int)cols);
  return (int)cudaGetLastError();
}
"""

HALF_WARP = CG_ROWS.replace("thread_block_tile<32>", "thread_block_tile<16>").replace(
    "tiled_partition<32>", "tiled_partition<16>"
)

# a reduction whose grid-stride loop keeps its stride in a variable and reads two elements
STRIDED_SUM = """\
template <unsigned kThreads>
__global__ void partial_sums(const float* __restrict__ in, float* __restrict__ out, unsigned n) {
  __shared__ float warp_sums[kThreads / 32];
  unsigned step = kThreads * gridDim.x * 2;
  unsigned i = blockIdx.x * kThreads * 2 + threadIdx.x;
  float acc = 0.f;
  while (i < n) {
    acc += in[i];
    if (i + kThreads < n) acc += in[i + kThreads];
    i += step;
  }
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffff, acc, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) acc += warp_sums[w];
    out[blockIdx.x] = acc;
  }
}

__global__ void column_sums(const float* m, float* out, int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
    acc += m[r * cols + c];
  atomicAdd(&out[c], acc);
}
"""


def test_cg_reduce_over_a_warp_is_a_site_and_its_removal_goes_through_shared_memory(
    mechanism_builder: Builder,
) -> None:
    kernel = KernelSource(CG_ROWS)
    sites = [s for s in warp_reduction.detect(kernel) if s.detail.get("kind") == "cg_reduce"]
    assert [s.start_line for s in sites] == [13, 16] and all(s.supported for s in sites)
    once = warp_reduction.remove(kernel, sites[0])
    assert "klineage_warp_reduce_sum_float(s)" in once.text
    assert "__device__ float klineage_warp_reduce_sum_float(float value)" in once.text
    twice = warp_reduction.remove(once, warp_reduction.detect(once)[0])
    assert twice.text.count("__device__ float klineage_warp_reduce_sum_float") == 1
    assert "cg::reduce(" not in twice.text and not warp_reduction.detect(twice)
    (candidate,) = warp_reduction.candidates(twice)  # the helper's exchange loop
    forward = warp_reduction.apply(twice, candidate)
    assert "value = value + __shfl_xor_sync(0xffffffffu, value, offset);" in forward.text
    compile_ok(mechanism_builder, [once, twice, forward])


def test_cg_reduce_over_a_half_warp_is_refused_with_its_form() -> None:
    kernel = KernelSource(HALF_WARP)
    site = next(s for s in warp_reduction.detect(kernel) if s.detail.get("kind") == "cg_reduce")
    assert site.refusal == (
        "the site is a cg::reduce over a tile of 16 threads; this rule needs a cg::reduce "
        "over a 32-thread tile"
    )
    with pytest.raises(MechanismRefused, match="tile of 16 threads"):
        warp_reduction.remove(kernel, site)


def test_grid_stride_loops_are_found_by_what_their_index_does() -> None:
    kernel = KernelSource(STRIDED_SUM)
    sites = {s.function: s for s in grid_stride.detect(kernel)}
    assert set(sites) == {"partial_sums", "column_sums"}
    assert sites["partial_sums"].snippet == "while (i < n)"
    assert "over gridDim.x (step 2·gridDim.x·kThreads" in str(sites["partial_sums"].refusal)
    assert "in a kernel with block barriers" in str(sites["partial_sums"].refusal)
    assert "over gridDim.y (step blockDim.y·gridDim.y" in str(sites["column_sums"].refusal)
    assert "this rule needs the canonical" in str(sites["column_sums"].refusal)


def _rows_by_z() -> str:
    path = PUBLIC_FORMS / "grid_stride_loop" / "rows_by_z.before.cu"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "const int first = threadIdx.x",
            "if (blockIdx.x == 0) out[0] = 0.f;\n  const int first = threadIdx.x",
            "in a kernel that also reads blockIdx.x",
        ),
        (  # a dim3 grid whose size a later statement sets: its declaration is not the size
            "center_rows<<<blocks,",
            "dim3 grid(blocks);\n  grid.x = blocks;\n  center_rows<<<grid,",
            "launched with the dim3 grid, written after its declaration",
        ),
        (
            "blockDim.z + threadIdx.z;",
            "blockDim.z - threadIdx.z;",  # an offset that may be negative
            "not from blockIdx.d·S + an offset by gridDim.d·S",
        ),
    ],
)
def test_a_grid_stride_loop_over_z_rows_is_refused_outside_its_form(
    old: str, new: str, reason: str
) -> None:
    kernel = KernelSource(_rows_by_z().replace(old, new))
    (site,) = grid_stride.detect(kernel)
    assert reason in str(site.refusal)
    assert "read by its index, it is a grid-stride loop" in str(site.refusal)
    with pytest.raises(MechanismRefused):
        grid_stride.remove(kernel, site)


def test_a_turn_offset_past_the_blocks_first_row_still_covers_every_row() -> None:
    # a thread visits row0 + 1 + j * S for every j; one turn a block over (N + S - 1) / S
    # blocks reaches the same rows below N
    kernel = KernelSource(
        _rows_by_z().replace("blockDim.z + threadIdx.z;", "blockDim.z + threadIdx.z + 1;")
    )
    (site,) = grid_stride.detect(kernel)
    assert site.supported, site.refusal
    after = grid_stride.remove(kernel, site).text
    assert "int row = blockIdx.x * blockDim.z + threadIdx.z + 1;\n  if (row < rows) {" in after
    assert "<<<(unsigned)((((int)rows) + rows_per_block - 1) / rows_per_block)," in after


def _row_turns() -> str:
    path = PUBLIC_FORMS / "grid_stride_loop" / "row_turns.before.cu"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # the count is written at the launch: the scratch size would not follow it
            "dim3(slabs, turns)",
            "dim3(slabs, max(1, turns))",
            "whose count along y is not a local the host sizes its buffers by",
        ),
        (  # the new count would read the block before it is declared
            "  const dim3 block = {kRowLanes, kSlab, 8};\n",
            "",
            "a grid count turns, declared before block, which its new size reads",
        ),
        (  # blockIdx.y read for something other than the block's slot
            "if (threadIdx.z == 0 && threadIdx.x == 0",
            "if (blockIdx.y < 65535 && threadIdx.z == 0 && threadIdx.x == 0",
            "in a kernel that also reads blockIdx.y in",
        ),
        (
            "const int turns = max(1, sms * threads_per_sm / (256 * slabs));",
            "int turns = max(1, sms * threads_per_sm / (256 * slabs));\n  turns = min(turns, 64);",
            "a grid count turns written elsewhere than",
        ),
    ],
)
def test_a_loop_writing_block_slots_is_refused_where_the_count_cannot_follow(
    old: str, new: str, reason: str
) -> None:
    text = _row_turns()
    assert old in text
    text = text.replace(old, new)
    if not new:  # the block, declared again after the count
        text = text.replace(
            "  if ((size_t)cols", "  const dim3 block = {kRowLanes, kSlab, 8};\n  if ((size_t)cols"
        )
    kernel = KernelSource(text)
    (site,) = [s for s in grid_stride.detect(kernel) if s.function == "column_partials"]
    assert reason in str(site.refusal), site.refusal
    with pytest.raises(MechanismRefused):
        grid_stride.remove(kernel, site)


def test_block_slots_in_a_buffer_allocated_once_at_a_fixed_size_are_refused() -> None:
    """The scratch made once, at a size read from the device rather than from the count of
    turns: a grid of one turn a block would write past its end (as llm.c's bias backward
    sizes its buffer by the SM count), so the loop stays."""
    text = _row_turns()
    for old, new in (
        ("if ((size_t)cols * turns > scratch_floats) {", "if (scratch == nullptr) {"),
        ("scratch_floats = (size_t)cols * turns;", "scratch_floats = (size_t)64 * sms;"),
    ):
        assert old in text
        text = text.replace(old, new)
    kernel = KernelSource(text)
    (site,) = [s for s in grid_stride.detect(kernel) if s.function == "column_partials"]
    assert "one slot per block along the grid count turns" in str(site.refusal), site.refusal
    assert "a size that does not read the grid turns" in str(site.refusal)
    with pytest.raises(MechanismRefused):
        grid_stride.remove(kernel, site)
    # as written, the scratch follows the count through scratch_floats: removed
    (site,) = [
        s for s in grid_stride.detect(KernelSource(_row_turns())) if s.function == "column_partials"
    ]
    assert site.supported, site.refusal


def test_the_forward_rule_reapplies_cg_reduce_sites_that_share_one_helper() -> None:
    # both cg::reduce calls were removed into one exchange helper: applying at its loop once
    # re-applies both (the llm.c attention backward walk's round trip refused the second)
    kernel = KernelSource(CG_ROWS)
    removal = remove_mechanism(kernel, warp_reduction)
    assert len(removal.sites) == 2
    assert removal.simplified.text.count("__device__ float klineage_warp_reduce_sum") == 1
    again = reapply(removal)
    assert "__shfl_xor_sync" in again.text and "xchg[" not in again.text
    assert again.text.count("klineage_warp_reduce_sum_float(") == 3  # definition + 2 calls
    assert warp_reduction.candidates(again) == []


def test_reapply_still_refuses_a_site_left_without_its_candidate() -> None:
    kernel = KernelSource(CG_ROWS)
    removal = remove_mechanism(kernel, warp_reduction)
    # nothing applied yet and no candidate in the simplified state: refused, not taken as done
    removal.states[-1] = KernelSource(kernel.text.replace("cg::reduce", "cg_reduce_elsewhere"))
    with pytest.raises(MechanismRefused):
        reapply(removal)


def test_a_dim3_grid_declared_with_one_name_gets_the_new_size() -> None:
    # `dim3 grid(blocks);` parses as a function declarator; in a body it is the variable
    text = _rows_by_z().replace(
        "center_rows<<<blocks,", "dim3 grid(blocks);\n  center_rows<<<grid,"
    )
    kernel = KernelSource(text)
    (site,) = grid_stride.detect(kernel)
    assert site.supported, site.refusal
    after = grid_stride.remove(kernel, site).text
    assert "dim3 grid((unsigned)((((int)rows) + rows_per_block - 1) / rows_per_block));" in after
