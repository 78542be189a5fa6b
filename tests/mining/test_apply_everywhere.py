"""`apply_everywhere`: a forward rule applied at every site, once each, never nested in its own
output (a dispatch whose fallback keeps the loop it specialized would otherwise be rewritten
again inside that fallback, up to the apply limit)."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.mining.removal import apply_everywhere

# One thread per row, two passes over the row: the register form's dispatch keeps the plain
# loops as its fallback, which the rule would match again.
ROW_RMS = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void rms_scale_rows(const float* x, float* y, int64_t rows, int64_t n) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* src = x + r * n;
  float* dst = y + r * n;
  float acc = 0.0f;
  for (int64_t k = 0; k < n; ++k) acc += src[k] * src[k];
  const float inv = rsqrtf(acc / (float)n + 1e-6f);
  for (int64_t k = 0; k < n; ++k) dst[k] = src[k] * inv;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t n, cudaStream_t stream) {
  rms_scale_rows<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, y, rows, n);
  return (int)cudaGetLastError();
}
"""

TWO_KERNELS = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void scale(const float* x, float* y, float a, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}

__global__ void shift(const float* x, float* y, float b, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + b;
}

extern "C" int run(const float* x, float* y, float* z, float a, int64_t n, cudaStream_t stream) {
  scale<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, a, n);
  shift<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, z, a, n);
  return (int)cudaGetLastError();
}
"""


def test_a_rule_whose_output_holds_its_site_applies_once() -> None:
    rule = get("row_in_registers")
    kernel = KernelSource(ROW_RMS)
    assert [s for s in rule.candidates(kernel) if s.supported]
    applied = apply_everywhere(kernel, rule, Carrier())
    # one dispatch on the row length, not a chain of them nested in each other's fallback
    dispatches = [line for line in applied.text.splitlines() if "if (n <= " in line]
    assert len(dispatches) == 1, applied.text
    assert len(applied.text) < 3 * len(ROW_RMS)


def test_every_site_still_takes_the_rule() -> None:
    applied = apply_everywhere(KernelSource(TWO_KERNELS), get("restrict_pointers"), Carrier())
    assert applied.text.count("__restrict__") == 4  # both kernels' two pointers
