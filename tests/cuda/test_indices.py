"""Index analysis: rows, lanes, warps, loops and addresses, however they are spelled."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.forms import IndexForm
from klineage.kernel import KernelSource

# one warp per row in a 2-D block (32 x rows_per_block), as many public layer norms write it
WARP_ROWS_2D = """\
__global__ void row_norm(const float* __restrict__ in, float* __restrict__ out, int rows,
                         int cols) {
  assert(blockDim.x == 32);
  int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const float* x = in + row * cols;
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += 32) s += x[c] * x[c];
  out[row] = s;
}
"""

# the same row written with a warp index and a lane from a flat block
WARP_ROWS_FLAT = """\
__global__ void row_norm(const float* in, float* out, int rows, int cols) {
  const int warps = blockDim.x / warpSize;
  int tid = threadIdx.x;
  int warp_id = tid / warpSize;
  int lane = tid % warpSize;
  int row = blockIdx.x * warps + warp_id;
  in += row * cols;
  float s = 0.f;
  for (int c = lane; c < cols; c += warpSize) s += in[c];
  if (lane == 0) out[row] = s;
}
"""

# a grid-stride accumulation with the stride in a variable that is doubled
DOUBLED_STRIDE = """\
template <unsigned B>
__global__ void partial(const float* x, float* y, unsigned n) {
  unsigned stride = B * gridDim.x;
  float acc = 0;
  unsigned i = blockIdx.x * B * 2 + threadIdx.x;
  stride = stride << 1;
  while (i < n) {
    acc += x[i];
    if (i + B < n) acc += x[i + B];
    i += stride;
  }
  y[blockIdx.x * B + threadIdx.x] = acc;
}
"""


def _indices(text: str, name: str = "row_norm"):
    source = KernelSource(text).parsed
    function = source.function(name)
    assert function is not None
    return analysis(source).indices(function)


def test_a_2d_warp_row_is_uniform_across_the_lanes() -> None:
    indices = _indices(WARP_ROWS_2D)
    assert indices.lane_is_thread_x()
    (loop,) = indices.loops
    assert str(loop.init) == "threadIdx.x" and loop.step == IndexForm.constant(32)
    load = next(a for a in indices.accesses() if a.buffer.name == "in")
    assert load.buffer.space == "global" and load.direction == "load"
    row_part = load.offset.without({loop.atom})
    assert indices.thread_atoms(row_part) == {"threadIdx.y"}  # the row: uniform across lanes
    assert load.offset.coefficient(loop.atom) == IndexForm.constant(1)  # contiguous


def test_warp_and_lane_are_derived_from_a_flat_block() -> None:
    indices = _indices(WARP_ROWS_FLAT)
    (loop,) = indices.loops
    assert str(loop.init) == "lane" and loop.step.value == 32
    load = next(a for a in indices.accesses() if a.buffer.name == "in")
    assert load.offset.coefficient("warp") == IndexForm.atom("cols")
    assert "[blockDim.x / warpSize]" in str(load.offset)  # warps per block: opaque, uniform
    store = next(a for a in indices.accesses() if a.buffer.name == "out")
    assert store.direction == "store" and indices.thread_atoms(store.offset) == {"warp"}


def test_a_while_loop_with_a_reassigned_stride_is_a_grid_stride_loop() -> None:
    indices = _indices(DOUBLED_STRIDE, "partial")
    (loop,) = indices.loops
    assert str(loop.step) == "2·B·gridDim.x"
    assert str(loop.init) == "2·B·blockIdx.x + threadIdx.x"
    offsets = sorted(str(a.offset) for a in indices.accesses() if a.buffer.name == "x")
    assert offsets == ["B + i@7", "i@7"]


def test_a_write_in_a_branch_without_braces_does_not_define_a_later_use() -> None:
    indices = _indices(
        "__global__ void k(float* out, int n) {\n"
        "  int x = threadIdx.x;\n"
        "  if (n > 4) x = threadIdx.x + 1;\n"
        "  out[x] = 0.f;\n"
        "}\n",
        "k",
    )
    store = next(a for a in indices.accesses() if a.buffer.name == "out")
    # either value may reach the store: neither 1 + threadIdx.x nor threadIdx.x, but opaque
    assert str(store.offset) == "[x]"


def test_counted_loops_know_their_trip_count() -> None:
    indices = _indices(
        "__global__ void k(float* y) {\n"
        "  constexpr int kRows = 4;\n"
        "  for (int r = 0; r < kRows; ++r) y[blockIdx.x * kRows + r] = 0.f;\n"
        "}\n",
        "k",
    )
    (loop,) = indices.loops
    assert loop.counted and loop.trip == 4
    (store,) = indices.accesses()
    assert store.offset.coefficient("blockIdx.x").value == 4


def test_a_second_variable_a_for_header_steps_is_carried_not_already_stepped() -> None:
    """`for (a = .., b = b0; ..; a += s, b += t)`: the update clause runs after the body, so
    the body reads b as b0 plus the loop's advance, not as b0 + t (its first turn's value)."""
    indices = _indices(
        "__global__ void k(float* out, const float* m, int wa, int wb) {\n"
        "  for (int a = 16 * blockIdx.y, b = 16 * blockIdx.x; a < wa; a += 16, b += 16 * wb)\n"
        "    out[threadIdx.x] += m[b + wb * threadIdx.y + threadIdx.x];\n"
        "}\n",
        "k",
    )
    load = next(a for a in indices.accesses() if a.buffer.name == "m")
    assert str(load.offset) == "[b advanced@2] + 16·blockIdx.x + threadIdx.x + threadIdx.y·wb"
