"""Split-K recognized by what the counts and indices do, with names that say nothing."""

from __future__ import annotations

import re

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms.base import Carrier, MechanismRefused
from tests.mechanisms.roundtrip import PUBLIC_FORMS

split_k = get("split_k")

# rows of a column sum divided over gridDim.y, a partial per block row, summed by a second
# kernel; the count is called `ways`, nothing is called split
COLUMN_SUMS = """\
#include <stdint.h>
__global__ void partial_cols(const float* x, float* out, int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
    acc += x[r * cols + c];
  out[blockIdx.y * cols + c] = acc;
}
__global__ void add_parts(const float* parts, float* y, int cols, int ways) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.f;
  for (int w = 0; w < ways; ++w) s += parts[w * cols + c];
  y[c] = s;
}
extern "C" int run(const float* x, float* y, float* scratch, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  int ways = 1;
  if (cols < 2048) ways = 8;
  partial_cols<<<dim3((unsigned)cols / 32, ways), dim3(32, 8), 0, stream>>>(
      x, scratch, (int)rows, (int)cols);
  add_parts<<<(unsigned)cols / 32, 32, 0, stream>>>(scratch, y, (int)cols, ways);
  return (int)cudaGetLastError();
}
"""


def test_split_counts_partials_and_their_sum_are_found_by_what_they_do() -> None:
    sites = split_k.detect(KernelSource(COLUMN_SUMS))
    by_function = {s.function: s for s in sites}
    assert set(by_function) == {"partial_cols", "add_parts", "run"}
    assert by_function["partial_cols"].snippet.startswith("partial_cols: for (int r = blockIdx.y")
    assert by_function["add_parts"].snippet == "add_parts: sums the split partials"
    assert by_function["run"].supported  # the host's choice of the count is removable
    removed = split_k.remove(KernelSource(COLUMN_SUMS), by_function["run"])
    assert "if (cols < 2048) ways = 8;" not in removed.text


def test_a_plain_2d_grid_is_not_a_split() -> None:
    plain = COLUMN_SUMS.replace("  if (cols < 2048) ways = 8;\n", "")
    assert plain != COLUMN_SUMS
    sites = split_k.detect(KernelSource(plain.replace("ways = 1", "ways = 4")))
    assert "run" not in {s.function for s in sites}  # a fixed count is no run-time choice


# a choice between two instantiations on a size derived from the arguments and the device
DERIVED_DISPATCH = """\
#include <stdint.h>
#include <type_traits>
template <bool kPartial>
__global__ void col_sums(const float* x, float* out, int rows, int cols,
                         std::bool_constant<kPartial>) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (int r = blockIdx.y; r < rows; r += gridDim.y) acc += x[r * cols + c];
  if (kPartial) out[blockIdx.y * cols + c] = acc; else out[c] = acc;
}
__global__ void add_rows(const float* parts, float* y, int cols, int count) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.f;
  for (int i = 0; i < count; ++i) s += parts[i * cols + c];
  y[c] = s;
}
extern "C" int run(const float* x, float* y, float* scratch, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int blocks_x = (int)(cols / 256);
  const int blocks_y = sms * 4 / blocks_x;
  if (blocks_y <= 1) {
    col_sums<<<dim3(blocks_x, 1), 256, 0, stream>>>(x, y, (int)rows, (int)cols,
                                                     std::bool_constant<false>{});
  } else {
    col_sums<<<dim3(blocks_x, blocks_y), 256, 0, stream>>>(x, scratch, (int)rows, (int)cols,
                                                           std::bool_constant<true>{});
    add_rows<<<blocks_x, 256, 0, stream>>>(scratch, y, (int)cols, blocks_y);
  }
  return (int)cudaGetLastError();
}
"""


def test_a_dispatch_on_a_derived_size_keeps_its_general_branch() -> None:
    dispatch = get("launch_size_dispatch")
    kernel = KernelSource(DERIVED_DISPATCH)
    (site,) = dispatch.detect(kernel)
    assert site.supported and site.snippet.startswith("if (blocks_y <= 1)")
    removed = dispatch.remove(kernel, site)
    assert "std::bool_constant<false>" not in removed.text
    assert "add_rows<<<" in removed.text


CLAMPED = PUBLIC_FORMS / "split_k" / "clamped_count.before.cu"


def test_a_count_clamped_at_one_goes_to_one_and_comes_back() -> None:
    before = KernelSource(CLAMPED.read_text(encoding="utf-8"))
    (site,) = [s for s in split_k.detect(before) if s.supported]
    assert site.function == "run" and site.snippet.startswith("const int stripes = max(1, ")
    after = split_k.remove(before, site)
    assert "const int stripes = 1;" in after.text
    carrier = split_k.carrier_of(before, site)
    assert carrier.as_dict()["clamp"] == "max(1, per_sm * sms / (kThreads * blocks_x))"
    (candidate,) = [c for c in split_k.candidates(after) if c.supported]
    assert split_k.apply(after, candidate, carrier).text == before.text


@pytest.mark.parametrize(
    ("clamp", "why"),
    [
        ("max(1, occupancy * sms)", "reads occupancy, which this function does not declare"),
        ("per_sm * sms", "is not one `max(1, ...)` expression"),
        ("max(2, per_sm)", "is not one `max(1, ...)` expression"),
    ],
)
def test_a_carried_clamp_that_does_not_fit_is_refused(clamp: str, why: str) -> None:
    after = split_k.remove(
        KernelSource(CLAMPED.read_text(encoding="utf-8")),
        next(s for s in split_k.detect(KernelSource(CLAMPED.read_text())) if s.supported),
    )
    (candidate,) = [c for c in split_k.candidates(after) if c.supported]
    with pytest.raises(MechanismRefused, match=re.escape(why)):
        split_k.apply(after, candidate, Carrier(clamp=clamp))


def test_an_unclamped_count_is_no_clamp_site() -> None:
    text = CLAMPED.read_text(encoding="utf-8").replace("max(1, per_sm * sms", "(per_sm * sms")
    assert text != CLAMPED.read_text(encoding="utf-8")
    assert not [s for s in split_k.detect(KernelSource(text)) if s.supported]


# the grid a dim3 local, its extents cast: the count is still found, and its choice removable
DIM3_LOCAL = COLUMN_SUMS.replace(
    "  partial_cols<<<dim3((unsigned)cols / 32, ways), dim3(32, 8), 0, stream>>>(",
    "  const dim3 grid((unsigned)cols / 32, (unsigned)ways);\n"
    "  partial_cols<<<grid, dim3(32, 8), 0, stream>>>(",
)


@pytest.mark.parametrize(
    "spelling",
    [
        "grid((unsigned)cols / 32, (unsigned)ways)",
        "grid{(unsigned)cols / 32, (unsigned)ways}",
        "grid = dim3((unsigned)cols / 32, (unsigned)ways)",
    ],
)
def test_a_grid_declared_as_a_dim3_local_names_its_split_count(spelling: str) -> None:
    text = DIM3_LOCAL.replace("grid((unsigned)cols / 32, (unsigned)ways)", spelling)
    assert text != COLUMN_SUMS and spelling in text
    host = [s for s in split_k.detect(KernelSource(text)) if s.function == "run"]
    assert [s.supported for s in host] == [True]
    removed = split_k.remove(KernelSource(text), host[0])
    assert "if (cols < 2048) ways = 8;" not in removed.text and "int ways = 1;" in removed.text
