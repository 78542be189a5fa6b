"""Once a removal leaves a kernel no shared memory, its launches ask for none: the simpler
state is timed at the occupancy its own code allows, not at that of a request it no longer
uses. An opt-in for the launch's size follows it; one for another size is left alone."""

from __future__ import annotations

from klineage.cuda.edit import apply_edits
from klineage.kernel import KernelSource
from klineage.mechanisms._dynamic_shared import idle_requests

HOST = """\
__global__ void rows(float* out, const float* inp, int cols) {
  out[blockIdx.x * cols + threadIdx.x] = inp[blockIdx.x * cols + threadIdx.x];
}
__global__ void other(float* out) { out[threadIdx.x] = 0.f; }

extern "C" int run(float* out, const float* inp, int n, int cols, cudaStream_t stream) {
  const size_t smem = 10 * cols * sizeof(float);
  cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096);
  rows<<<n, cols, smem, stream>>>(out, inp, cols);
  other<<<1, 32, smem, stream>>>(out);
  return 0;
}
"""


def _idle(text: str, kernel: str) -> str:
    source = KernelSource(text).parsed
    function = next(f for f in source.functions if f.name == kernel)
    return apply_edits(source, idle_requests(source, function)).text


def test_the_kernels_launches_and_their_opt_in_ask_for_none() -> None:
    idle = _idle(HOST, "rows")
    assert "rows<<<n, cols, 0, stream>>>(out, inp, cols);" in idle
    assert "cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);" in idle
    # another size's opt-in and another kernel's request are not this launch's
    assert "cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, 4096);" in (
        idle
    )
    assert "other<<<1, 32, smem, stream>>>(out);" in idle


def test_a_launch_that_asks_for_none_is_left_as_it_is() -> None:
    text = HOST.replace("rows<<<n, cols, smem, stream>>>", "rows<<<n, cols>>>")
    assert _idle(text, "rows") == text
