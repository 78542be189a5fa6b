"""A launch bound's register cap, lifted where a rewrite spills under it: real nvcc builds of
a staged product whose accumulators outgrow 64 registers a thread (256 threads x 4 blocks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.mining.removal import apply_everywhere
from klineage.problem import load_problem
from klineage.replay.register_cap import lift_register_cap, spill_bytes, without_min_blocks
from klineage.replay.run import ReplayBudget
from klineage.skills import SkillLibrary
from tests.conftest import REPO
from tests.mining.stand_in_gate import StandInGate, replay_gated

# one output a thread: few registers, no spill under the cap
LIGHT = """#include <cuda_runtime.h>
__global__ void __launch_bounds__(256, 4) product(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int k = 0; k < 64; ++k) acc += a[k * n + i] * b[k];
  c[i] = acc;
}
extern "C" int run(const float* a, const float* b, float* c, int n, cudaStream_t stream) {
  product<<<(n + 255) / 256, 256, 0, stream>>>(a, b, c, n);
  return (int)cudaGetLastError();
}
"""

# a 10 x 10 register tile of accumulators a thread: more than 64 registers
HEAVY = """#include <cuda_runtime.h>
__global__ void __launch_bounds__(256, 4) product(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float acc[10][10] = {};
  for (int k = 0; k < 64; ++k) {
    float ra[10], rb[10];
#pragma unroll
    for (int r = 0; r < 10; ++r) ra[r] = a[k * n + i * 10 + r];
#pragma unroll
    for (int s = 0; s < 10; ++s) rb[s] = b[k * 10 + s];
#pragma unroll
    for (int r = 0; r < 10; ++r)
#pragma unroll
      for (int s = 0; s < 10; ++s) acc[r][s] += ra[r] * rb[s];
  }
#pragma unroll
  for (int r = 0; r < 10; ++r)
#pragma unroll
    for (int s = 0; s < 10; ++s) c[(i * 10 + r) * 10 + s] = acc[r][s];
}
extern "C" int run(const float* a, const float* b, float* c, int n, cudaStream_t stream) {
  product<<<(n + 255) / 256, 256, 0, stream>>>(a, b, c, n);
  return (int)cudaGetLastError();
}
"""


def test_minimum_blocks_are_dropped_and_the_max_threads_kept() -> None:
    kernel = KernelSource(
        "template <int T>\n"
        "__global__ void __launch_bounds__(T, 4) a(float* x) { x[0] = 1.f; }\n"
        "__global__ void __launch_bounds__(256 /* threads */, 2) b(float* x) { x[0] = 2.f; }\n"
        "__global__ void __launch_bounds__(128) c(float* x) { x[0] = 3.f; }\n"
    )
    lifted = without_min_blocks(kernel)
    assert lifted is not None
    assert "__launch_bounds__(T) a(" in lifted.text
    assert "__launch_bounds__(256) b(" in lifted.text
    assert "__launch_bounds__(128) c(" in lifted.text
    assert without_min_blocks(KernelSource("__global__ void __launch_bounds__(64) d() {}")) is None


@pytest.mark.nvcc
def test_a_rewrite_that_spills_under_the_cap_is_written_without_it(
    shared_builder: Builder,
) -> None:
    light, heavy = KernelSource(LIGHT), KernelSource(HEAVY)
    assert spill_bytes(shared_builder.build(light.text)) == 0
    assert (spill_bytes(shared_builder.build(heavy.text)) or 0) > 0
    lifted = lift_register_cap(shared_builder, light, heavy)
    assert lifted is not None
    kernel, why = lifted
    assert "__launch_bounds__(256) product(" in kernel.text
    assert spill_bytes(shared_builder.build(kernel.text)) == 0
    assert "spilled" in why and "0 without it" in why
    # the state spilled as much already: not the rewrite's doing, nothing lifted
    assert lift_register_cap(shared_builder, heavy, heavy) is None
    # no spill: nothing to lift
    assert lift_register_cap(shared_builder, light, light) is None


@pytest.mark.nvcc
def test_replay_races_the_wide_register_tile_without_the_cap_it_spills_under(
    shared_builder: Builder, tmp_path: Path
) -> None:
    """sgemm's staged tiles under `__launch_bounds__(256, 4)`, as the finished replay had them:
    the 4 x 4 register tile and the 8 x 8 raced beside it both spill under the cap (88 and
    5,464 bytes: their tile loads unroll, every load in flight before the stores), so each is
    gated without the minimum blocks, the run saying so. A stand-in gate at the GPU boundary
    times both tiles alike."""
    problem = tmp_path / "sgemm"
    shutil.copytree(REPO / "heldout" / "sgemm", problem)
    naive = load_problem(problem).kernel_source()
    staged = apply_everywhere(naive, get("smem_staging"), Carrier(tile_size=16))
    bounds = Carrier(block_size=256, min_blocks=4)
    capped = apply_everywhere(staged, get("launch_bounds"), bounds)
    (problem / "kernel.cu").write_text(capped.text, encoding="utf-8")
    committed = SkillLibrary.load(REPO / "skills_out")
    coarsening = [s for s in committed if s.mechanism == "thread_coarsening"]
    SkillLibrary(tmp_path / "lib", coarsening).save()
    report = replay_gated(
        [problem],
        tmp_path / "lib",
        tmp_path / "out",
        gate=StandInGate(shared_builder, cost={"thread_coarsening": 2.0}),
        methods=["skills"],
        budget=ReplayBudget(gate_runs=4),
    )
    [result] = report.results
    wide = [r for r in result.runs if r.carrier.get("tm") == 8]
    assert wide, [(r.action, r.carrier, r.outcome) for r in result.runs]
    assert "without its minimum blocks" in wide[0].intent
    assert "spilled 5464 bytes" in wide[0].intent
    narrow = [r for r in result.runs if r.action == "thread_coarsening" and "tm" not in r.carrier]
    assert narrow and all("spilled 88 bytes under that register cap" in r.intent for r in narrow)
