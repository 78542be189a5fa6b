"""Thread coarsening recognized by what the indices do, in public kernels' spellings."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

coarsening = get("thread_coarsening")

# each thread sums kPer elements kThreads apart, the trip a template argument
PER_THREAD = """\
template <int kThreads, int kPer>
__global__ void block_sums(const float* in, float* out) {
  float acc = 0.f;
  const int first = blockIdx.x * kThreads * kPer + threadIdx.x;
#pragma unroll
  for (int p = 0; p < kPer; ++p) acc += in[first + p * kThreads];
  if (threadIdx.x == 0) out[blockIdx.x] = acc;
}
"""

# each block walks four rows, last row first
ROWS_PER_BLOCK = """\
__global__ void scale_rows(const float* in, float* out, int n) {
  constexpr int kRows = 4;
  const int top = n - 1 - kRows * blockIdx.x;
  for (int r = 0; r < kRows; ++r) {
    const int row = top - r;
    for (int c = threadIdx.x; c < n; c += blockDim.x) out[row * n + c] = 2.f * in[row * n + c];
  }
}
"""

# an 8 x 4 register tile per thread, written back by a helper
REGISTER_TILE = """\
template <int TM, int TN>
__device__ void write_tile(float* c, int ldc, const float acc[TM][TN], int row0, int col0) {
  for (int i = 0; i < TM; ++i)
    for (int j = 0; j < TN; ++j) c[(row0 + i) * ldc + col0 + j] = acc[i][j];
}
template <int TM, int TN>
__global__ void tile_out(float* c, int ldc) {
  float acc[TM][TN] = {};
  const int row0 = (blockIdx.y * blockDim.y + threadIdx.y) * TM;
  const int col0 = (blockIdx.x * blockDim.x + threadIdx.x) * TN;
  write_tile<TM, TN>(c, ldc, acc, row0, col0);
}
"""

# two loads per iteration of a grid-stride loop whose start advances by two blocks' worth
PAIRS = """\
__global__ void pair_sums(const float* in, float* out, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x * 2 + threadIdx.x;
  float acc = 0.f;
  while (i < n) {
    acc += in[i];
    if (i + blockDim.x < n) acc += in[i + blockDim.x];
    i += blockDim.x * 2 * gridDim.x;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""

# not coarsening: one thread per row over a runtime width, and per-channel filter taps
NOT_COARSENED = """\
constexpr int kTaps = 4;
__global__ void rows(const float* in, float* out, int rows, int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.f;
  for (int c = 0; c < cols; ++c) s += in[r * cols + c];
  out[r] = s;
}
__global__ void taps(const float* x, const float* w, float* y, int channels, int length) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int c = (i / length) % channels;
  float acc = 0.f;
  for (int j = 0; j < kTaps; ++j) acc += w[c * kTaps + j] * x[i + j];
  y[i] = acc;
}
"""


def _site(text: str):
    (site,) = coarsening.detect(KernelSource(text))
    assert site.refusal is not None and "this rule needs the canonical form of coarsening" in (
        site.refusal
    )
    return site


def test_elements_per_thread_through_a_template_trip() -> None:
    site = _site(PER_THREAD)
    assert site.snippet == "for (int p = 0; p < kPer; ++p)"
    assert "each block handling kPer elements kThreads apart of in" in str(site.refusal)


def test_rows_per_block() -> None:
    site = _site(ROWS_PER_BLOCK)
    assert site.snippet == "for (int r = 0; r < kRows; ++r)"
    assert "each block handling kRows elements" in str(site.refusal)


def test_a_register_tile_written_by_a_helper() -> None:
    site = _site(REGISTER_TILE)
    assert site.snippet.startswith("write_tile<TM, TN>(c, ldc, acc, row0, col0)")
    assert "each thread handling TM elements ldc apart of c" in str(site.refusal)
    assert "in write_tile" in str(site.refusal)


def test_two_loads_per_iteration_of_a_grid_stride_loop_are_removed() -> None:
    (site,) = coarsening.detect(KernelSource(PAIRS))
    assert site.snippet == "while (i < n)" and site.supported and site.detail["form"] == "pairs"
    removed = coarsening.remove(KernelSource(PAIRS), site).text
    assert "unsigned i = blockIdx.x * blockDim.x + threadIdx.x;" in removed
    assert "i += blockDim.x * gridDim.x;" in removed and "in[i + blockDim.x]" not in removed


def test_a_row_per_thread_and_filter_taps_are_not_coarsening() -> None:
    assert coarsening.detect(KernelSource(NOT_COARSENED)) == []


def test_loads_per_turn_written_in_one_statement_are_refused_with_their_form() -> None:
    path = PUBLIC_FORMS / "thread_coarsening" / "loads_per_turn.before.cu"
    joined = KernelSource(
        path.read_text(encoding="utf-8").replace(
            "    acc += in[i];\n    if (i + kBlock < n) acc += in[i + kBlock];\n",
            "    acc += in[i] + (i + kBlock < n ? in[i + kBlock] : 0.f);\n",
        )
    )
    (site,) = coarsening.detect(joined)
    assert "as loads per turn, it is a loop reading 2 elements of in in one statement" in str(
        site.refusal
    )
    with pytest.raises(MechanismRefused):
        coarsening.remove(joined, site)
