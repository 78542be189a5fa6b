"""`klineage new` on an expert file with no run(...) (launched from its own main() or harness):
a run(...) that launches its kernel, inputs and outputs read from what the kernel stores
through, the grid and block left to the user and said so."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.formats.scaffold import ScaffoldError, new_problem
from klineage.gate.build import Builder
from klineage.kernel import KernelSource

HARNESS = """\
#include <cstdio>
#include "cuda_runtime.h"
#define THREADS 128
// y = alpha * x + y over n elements, launched from its own main()
__global__ void __launch_bounds__(THREADS) axpy(float* x, float* y, float alpha, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = alpha * x[i] + y[i];
}
int main() {
  float *x, *y;
  cudaMalloc(&x, 1024 * sizeof(float));
  cudaMalloc(&y, 1024 * sizeof(float));
  axpy<<<8, THREADS>>>(x, y, 2.0f, 1024);
  printf("%d\\n", (int)cudaDeviceSynchronize());
  return 0;
}
"""

TEMPLATES = """\
template <int BLOCK = 256>
__global__ void scale(const float* x, float* y, int n) {
  int i = blockIdx.x * BLOCK + threadIdx.x;
  if (i < n) y[i] = 2.f * x[i];
}
template <int BLOCK>
__global__ void shift(const float* x, float* y, int n) {
  int i = blockIdx.x * BLOCK + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.f;
}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expert.cu"
    path.write_text(text)
    return path


def test_a_file_without_run_gets_one_that_launches_its_kernel(tmp_path: Path) -> None:
    made = new_problem("axpy", _write(tmp_path, HARNESS), tmp_path / "axpy")
    definition = made.problem.definition
    # y is stored through: the output; x only read: an input, passed back without its const
    assert list(definition.inputs) == ["x", "alpha"] and list(definition.outputs) == ["y"]
    assert definition.inputs["alpha"].shape is None and definition.var_axes() == ["n"]
    text = (made.problem.root / "kernel.cu").read_text()
    assert (
        'extern "C" int run(const float* x, float alpha, float* y, int64_t n, cudaStream_t stream)'
    ) in text
    assert "axpy<<<grid, block, 0, stream>>>(const_cast<float*>(x), y, alpha, (unsigned)n);" in text
    assert "dim3 block(THREADS);  // TODO" in text
    assert "set the grid and the block of the run(...) written for axpy" in made.todo[0]
    # the quoted toolkit include is nvcc's, nothing to copy
    assert not [t for t in made.todo if "cuda_runtime.h" in t]


@pytest.mark.nvcc
def test_the_written_run_builds(tmp_path: Path, device_builder: Builder) -> None:
    made = new_problem("axpy", _write(tmp_path, HARNESS), tmp_path / "axpy")
    kernel = KernelSource.from_file(made.problem.root / "kernel.cu")
    (result,) = device_builder.build_many([(kernel.text, kernel.name)])
    assert result.ok, result.message


def test_several_kernels_need_a_name_and_an_undefaulted_template_is_refused(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, TEMPLATES)
    # only scale can be launched as written (BLOCK has a default): it is chosen
    made = new_problem("scale", path, tmp_path / "scale")
    assert "scale<<<grid, block, 0, stream>>>" in (made.problem.root / "kernel.cu").read_text()
    with pytest.raises(ScaffoldError, match="shift is a template whose parameters BLOCK"):
        new_problem("shift", path, tmp_path / "shift", launch="shift")
    with pytest.raises(
        ScaffoldError, match=r"no __global__ kernel nope \(its kernels: scale, shift"
    ):
        new_problem("nope", path, tmp_path / "nope", launch="nope")
    twice = TEMPLATES.replace("template <int BLOCK>", "template <int BLOCK = 128>")
    with pytest.raises(
        ScaffoldError, match=r"name the one run\(\.\.\.\) should launch with --launch"
    ):
        new_problem("two", _write(tmp_path, twice), tmp_path / "two")
