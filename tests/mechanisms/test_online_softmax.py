"""The online_softmax mechanism: the scalar form both ways (fixtures from heldout/log_softmax
and heldout/cross_entropy), the (max, sum) pair form of the softmax expert turned into two
passes, and refusals."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok

mechanism = get("online_softmax")


class TestOnlineSoftmax(RoundTripSuite):
    mechanism = "online_softmax"


PAIR = """#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

struct MaxSum {
  float s;
  float m;
};

__device__ __forceinline__ MaxSum push(MaxSum a, float x) {
  if (x <= a.m) return {a.s + expf(x - a.m), a.m};
  return {a.s * expf(a.m - x) + 1.0f, x};
}

__global__ void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  MaxSum acc{0.0f, -INFINITY};
  for (int64_t c = 0; c < cols; ++c) acc = push(acc, x[r * cols + c]);
  const float inv = 1.0f / acc.s;
  for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = expf(x[r * cols + c] - acc.m) * inv;
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  softmax_rows<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
"""


def test_a_pair_becomes_a_max_pass_then_a_sum_pass() -> None:
    source = KernelSource(PAIR)
    (site,) = mechanism.detect(source)
    assert site.supported, site.refusal
    removed = mechanism.remove(source, site).text
    assert "acc.m = fmaxf(acc.m, x[r * cols + c]);" in removed
    assert "row_max = acc.m;" in removed
    assert "acc = MaxSum{0.0f, row_max};" in removed  # field order kept
    assert "acc.s = acc.s + expf(x[r * cols + c] - row_max);" in removed
    assert "__syncthreads" not in removed  # no combine through shared memory here
    assert mechanism.detect(KernelSource(removed)) == []


def test_a_pair_whose_sum_does_not_start_at_zero_is_refused() -> None:
    source = KernelSource(PAIR.replace("acc{0.0f, -INFINITY}", "acc{1.0f, -INFINITY}"))
    (site,) = mechanism.detect(source)
    assert "does not start from 0" in (site.refusal or "")


def test_an_online_loop_in_another_form_is_detected_and_refused() -> None:
    source = KernelSource(
        "__global__ void k(const float* x, float* y, int n) {\n"
        "  float m = -1e30f, s = 0.0f;\n"
        "  for (int c = 0; c < n; ++c) {\n"
        "    const float mn = fmaxf(m, x[c]);\n"
        "    s = s * __expf(m - mn) + __expf(x[c] - mn);\n    m = mn;\n  }\n"
        "  y[0] = s;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "canonical online form" in (site.refusal or "")
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, site)


def test_two_loops_over_different_ranges_are_no_candidate() -> None:
    source = KernelSource(
        "__global__ void k(const float* x, float* y, int n) {\n  float m = -1e30f;\n"
        "  for (int c = 0; c < n; ++c) m = fmaxf(m, x[c]);\n  float s = 0.0f;\n"
        "  for (int c = 1; c < n; ++c) s += expf(x[c] - m);\n  y[0] = s;\n}\n"
    )
    assert mechanism.candidates(source) == []


def test_the_expert_is_detected_where_listed() -> None:
    assert_detected_where_listed("online_softmax")


@pytest.mark.nvcc
def test_expert_and_pair_removals_compile(mechanism_builder: Builder) -> None:
    assert check_expert_removals_compile("online_softmax", mechanism_builder) == []
    source = KernelSource(PAIR)
    compile_ok(mechanism_builder, [mechanism.remove(source, mechanism.detect(source)[0])])


def test_a_pair_loop_with_other_effects_is_refused() -> None:
    loop = "acc = push(acc, x[r * cols + c]);"
    source = KernelSource(PAIR.replace(loop, f"{{ {loop} y[r * cols + c] = 0.0f; }}"))
    (site,) = mechanism.detect(source)
    assert "which two passes would do twice" in (site.refusal or "")


def test_the_two_passes_a_pair_removal_writes_go_back_to_one() -> None:
    """The pair removal's two-pass form is a candidate, and applying there reads the pushed
    elements back from the sum pass: the expert (four pushes per float4, a block combine
    through shared memory) and the small pair kernel come back byte for byte."""
    from klineage.mining.removal import reapply, remove_mechanism
    from tests.conftest import REPO

    for kernel in (
        KernelSource(PAIR),
        KernelSource.from_file(REPO / "expert_kernels" / "softmax" / "kernel.cu"),
    ):
        removal = remove_mechanism(kernel, mechanism)
        assert removal.changed
        (candidate,) = mechanism.candidates(removal.simplified)
        assert candidate.detail["form"] == "pair" and candidate.supported
        assert reapply(removal).text == kernel.text


def test_a_changed_two_pass_form_is_no_candidate() -> None:
    source = KernelSource(PAIR)
    simplified = mechanism.remove(source, mechanism.detect(source)[0])
    assert mechanism.candidates(simplified)
    # the sum pass no longer mirrors the first pass: nothing to read the pushes back from
    edited = KernelSource(simplified.text.replace("acc.s = acc.s + ", "acc.s = 2.0f * acc.s + "))
    assert mechanism.candidates(edited) == []


@pytest.mark.nvcc
def test_a_block_per_row_log_softmax_reads_its_row_once_for_both_statistics() -> None:
    """log_softmax after block per row: each thread's share of the row in one pass, then the
    block's maximum, each sum rescaled to it, and the block's sum; the outputs agree within
    float rounding with the two passes, on rows shorter than the block (threads with no
    element) and longer."""
    from klineage.mechanisms import Carrier
    from klineage.mining.removal import apply_everywhere

    naive = KernelSource.from_file(REPO / "heldout" / "log_softmax" / "kernel.cu")
    block = apply_everywhere(naive, get("block_per_row"), Carrier())
    [site] = [s for s in mechanism.candidates(block) if s.detail.get("form") == "block"]
    online = mechanism.apply(block, site, Carrier())
    assert online.text.count("in[c]") == block.text.count("in[c]") - 1  # one pass fewer
    assert "block_reduce_max(m)" in online.text and "block_reduce_sum(s)" in online.text
    cases = [
        Case(
            {"rows": rows, "cols": cols},
            [Buffer("x", "float", "rows * cols"), Buffer("y", "float", "rows * cols", True)],
            "log_softmax_rows(x, y, rows, cols)",
            "rows",
            grid="dim3((unsigned)rows)",
            block_dims="dim3(256)",
        )
        for rows, cols in ((1, 1), (3, 100), (2, 300), (2, 1000))
    ]
    assert_close(floats(run_on_host(online.text, cases)), floats(run_on_host(block.text, cases)))
    # and back: the removal writes the two passes block per row wrote
    [found] = mechanism.detect(online)
    assert found.detail.get("form") == "block"
    assert mechanism.remove(online, found).text == block.text
