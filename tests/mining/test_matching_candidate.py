"""`matching_candidate`: where a removal's forward rule goes back. With no candidate around the
changed bytes, the nearest one must not come from a foreign function (another kernel of the
walk's first state, not the removed site's): re-applying there would stage another kernel and
call it the round trip. A helper the removals wrote is not foreign."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mining.removal import matching_candidate

# `copy_rows` has a loop (a pragma_unroll candidate); `scale_rows` has none, so the changed
# bytes of an edit in `scale_rows` sit inside no candidate.
BEFORE = """#include <cuda_runtime.h>

__global__ void copy_rows(const float* x, float* y, int n) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) y[k] = x[k];
}

__global__ void scale_rows(const float* x, float* y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float scaled = a * x[i];
  if (i < n) y[i] = scaled;
}
"""

AFTER = BEFORE.replace(
    "  const float scaled = a * x[i];\n  if (i < n) y[i] = scaled;", "  if (i < n) y[i] = a * x[i];"
)

# the removal wrote a helper with a loop above the kernel it changed
HELPER = """__device__ void fill_rows(float* y, int n) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) y[k] = 0.0f;
}

"""
AFTER_WITH_HELPER = AFTER.replace(
    "__global__ void scale_rows", HELPER + "__global__ void scale_rows"
)


def test_nearest_candidate_comes_from_the_removed_sites_function() -> None:
    unroll = get("pragma_unroll")
    before, after = KernelSource(BEFORE), KernelSource(AFTER)
    anywhere = matching_candidate(unroll, before, after)
    assert anywhere is not None and anywhere.function == "copy_rows"
    assert matching_candidate(unroll, before, after, {"copy_rows"}) is None


def test_nearest_candidate_may_be_a_helper_the_removal_wrote() -> None:
    unroll = get("pragma_unroll")
    before, after = KernelSource(BEFORE), KernelSource(AFTER_WITH_HELPER)
    found = matching_candidate(unroll, before, after, {"copy_rows"})
    assert found is not None and found.function == "fill_rows"


def test_a_candidate_around_the_change_is_taken_in_any_function() -> None:
    unroll = get("pragma_unroll")
    with_pragma = BEFORE.replace("  for (int k", "#pragma unroll 4\n  for (int k")
    before, after = KernelSource(with_pragma), KernelSource(BEFORE)
    found = matching_candidate(unroll, before, after, {"scale_rows"})
    assert found is not None and found.function == "copy_rows"
    assert found == matching_candidate(unroll, before, after)
