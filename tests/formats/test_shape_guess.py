"""`klineage new` reads each tensor's shape from how the kernels run launches index it (the
index analysis's polynomials), and leaves to the user what the indexing does not say."""

from __future__ import annotations

import json
from pathlib import Path

from klineage.formats.scaffold import new_problem
from klineage.formats.shape_guess import guess_shapes
from klineage.kernel import KernelSource
from klineage.problem.abi import declared_run
from tests.mechanisms.roundtrip import PUBLIC_FORMS

ROOT = Path(__file__).resolve().parents[2]
TILED = PUBLIC_FORMS / "smem_staging" / "vector_tiles.before.cu"

ROWS = """\
#include <cstdint>
#include <cuda_runtime.h>
// one block per row; bias added along the row, the row's total kept
__global__ void add_bias_rows(const float* x, const float* bias, float* y, float* totals,
                              int rows, int cols) {
  float total = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = x[blockIdx.x * cols + c] + bias[c];
    y[blockIdx.x * cols + c] = v;
    total += v;
  }
  if (threadIdx.x == 0) totals[blockIdx.x] = total;  // one thread: a racy sketch, not a sum
}
extern "C" int run(const float* x, const float* bias, float* y, float* totals, int64_t rows,
                   int64_t cols, cudaStream_t stream) {
  add_bias_rows<<<(unsigned)rows, 128, 0, stream>>>(x, bias, y, totals, (int)rows, (int)cols);
  return (int)cudaGetLastError();
}
"""

FLAT = """\
#include <cstdint>
#include <cuda_runtime.h>
// one thread per element of a flattened [rows, cols] tensor; the bias by column
__global__ void flat_bias(const float* x, const float* bias, float* y, int64_t rows,
                          int64_t cols) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  y[i] = x[i] + bias[i % cols];
}
extern "C" int run(const float* x, const float* bias, float* y, int64_t rows, int64_t cols,
                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  flat_bias<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, bias, y, rows, cols);
  return (int)cudaGetLastError();
}
"""

GATHER = """\
#include <cstdint>
#include <cuda_runtime.h>
// rows of a table gathered by id: which row is read is data, not indexing
__global__ void gather(const float* table, const int64_t* ids, float* out, int64_t tokens,
                       int64_t hidden) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= tokens * hidden) return;
  const int64_t t = i / hidden;
  out[i] = table[ids[t] * hidden + i % hidden];
}
extern "C" int run(const float* table, const int64_t* ids, float* out, int64_t tokens,
                   int64_t hidden, cudaStream_t stream) {
  const int64_t n = tokens * hidden;
  gather<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(table, ids, out, tokens, hidden);
  return (int)cudaGetLastError();
}
"""


def _guess(text: str) -> dict[str, list[str]]:
    declared = declared_run(text)
    assert declared is not None
    params = list(declared.params)[:-1]
    names = [p.text.split("*")[-1].strip() for p in params if p.is_pointer]
    axes = [p.text.split()[-1] for p in params if not p.is_pointer]
    return guess_shapes(KernelSource(text, name="kernel.cu").parsed, names, axes)


def test_a_tiled_gemm_reads_as_row_major_matrices() -> None:
    # rows of A walk the grid's y (sized from M), rows of B the K tile loop (bounded by K)
    assert _guess(TILED.read_text()) == {"A": ["M", "K"], "B": ["K", "N"], "C": ["M", "N"]}


def test_a_block_per_row_kernel_reads_rows_from_the_grid_and_columns_from_the_loop() -> None:
    assert _guess(ROWS) == {
        "x": ["rows", "cols"],
        "bias": ["cols"],
        "y": ["rows", "cols"],
        "totals": ["rows"],
    }


def test_a_flat_index_spans_the_axes_the_grid_is_sized_from() -> None:
    # `i % cols` spans cols alone
    assert _guess(FLAT) == {"x": ["rows", "cols"], "bias": ["cols"], "y": ["rows", "cols"]}


def test_a_gathered_row_is_left_to_the_user() -> None:
    assert _guess(GATHER) == {"ids": ["tokens"], "out": ["tokens", "hidden"]}


def _declared_shapes(problem: Path) -> dict[str, list[str] | None]:
    definition = json.loads((problem / "definition.json").read_text())
    return {n: s.get("shape") for n, s in {**definition["inputs"], **definition["outputs"]}.items()}


# flat outputs whose order of axes the indexing cannot tell (y[i] over rows * cols), and a
# filter extent that is a file constant, not an axis
UNREADABLE = {
    ("transpose_2d", "y"),
    ("nchw_to_nhwc", "y"),
    ("causal_conv1d", "weight"),
}


def test_what_it_reads_of_the_held_out_kernels_is_their_definition() -> None:
    read = 0
    for kernel in sorted((ROOT / "heldout").glob("*/kernel.cu")):
        declared = _declared_shapes(kernel.parent)
        for tensor, shape in _guess(kernel.read_text()).items():
            read += 1
            if (kernel.parent.name, tensor) not in UNREADABLE:
                assert shape == declared[tensor], (kernel.parent.name, tensor)
    # of the 22 naive kernels' 56 tensors, 45 are read; the rest keep the every-axis guess
    assert read >= 40


def test_the_scaffold_writes_what_it_read_and_says_so(tmp_path: Path) -> None:
    made = new_problem("tiles", TILED, tmp_path / "tiles")
    definition = made.problem.definition
    assert definition.inputs["A"].shape == ["M", "K"] and definition.outputs["C"].shape == [
        "M",
        "N",
    ]
    (line,) = [t for t in made.todo if "confirm each tensor's shape" in t]
    assert "read from the kernel's indexing: A [M, K], B [K, N], C [M, N]" in line
    assert "guessed over every axis" not in line
