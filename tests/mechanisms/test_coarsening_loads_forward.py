"""Loads per turn of a grid-stride loop written forward (thread_coarsening, ``form: pairs``):
the removed state offers the loop where the removal happened, applying gives the coarsened
state back, removing that again gives the removed state, and the forms the rule does not take
are refused with the form they are in."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms.base import Site
from klineage.mining.removal import matching_candidate, reapply, remove_mechanism
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok, diff

coarsening = get("thread_coarsening")
PROBLEMS = PUBLIC_FORMS / "problems"

# a templated block size, the stride in a local before the loop, a shared-memory tree after it
SUM_REMOVED = """\
#include <cstdint>
#include <cuda_runtime.h>

template <unsigned int kBlockSize>
__global__ void block_sums(const float* __restrict__ values, float* __restrict__ sums,
                           unsigned int count) {
  __shared__ float tree[kBlockSize];
  const unsigned int lane = threadIdx.x;
  const unsigned int step = kBlockSize * gridDim.x;
  unsigned int k = blockIdx.x * kBlockSize + threadIdx.x;
  float total = 0.0f;
  while (k < count) {
    total += values[k];
    k += step;
  }
  tree[lane] = total;
  __syncthreads();
  for (unsigned int s = kBlockSize / 2; s > 0; s >>= 1) {
    if (lane < s) tree[lane] += tree[lane + s];
    __syncthreads();
  }
  if (lane == 0) sums[blockIdx.x] = tree[0];
}

constexpr unsigned int kThreads = 256;
constexpr unsigned int kBlocks = 80;
__device__ float scratch[kBlocks];

extern "C" int run(const float* x, float* total, int64_t n, cudaStream_t stream) {
  float* partial = nullptr;
  cudaError_t err = cudaGetSymbolAddress((void**)&partial, scratch);
  if (err != cudaSuccess) return (int)err;
  block_sums<kThreads><<<kBlocks, kThreads, 0, stream>>>(x, partial, (unsigned int)n);
  block_sums<kThreads><<<1, kThreads, 0, stream>>>(partial, total, kBlocks);
  return (int)cudaGetLastError();
}
"""
SUM_COARSENED = SUM_REMOVED.replace(
    "k = blockIdx.x * kBlockSize + threadIdx.x;", "k = blockIdx.x * kBlockSize * 2 + threadIdx.x;"
).replace(
    "    total += values[k];\n    k += step;\n",
    "    total += values[k];\n"
    "    if (k + kBlockSize < count) total += values[k + kBlockSize];\n"
    "    k += step * 2;\n",
)

# a float max over blockDim.x threads, in a `for` loop with the stride written out
MAX_REMOVED = """\
#include <cstdint>
#include <cuda_runtime.h>

__global__ void block_max(const float* __restrict__ x, float* __restrict__ out, int n) {
  extern __shared__ float best[];
  float m = -INFINITY;
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += blockDim.x * gridDim.x) {
    m = fmaxf(m, x[idx]);
  }
  best[threadIdx.x] = m;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) best[threadIdx.x] = fmaxf(best[threadIdx.x], best[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best[0];
}

constexpr int kThreads = 128;
constexpr int kBlocks = 96;
__device__ float maxima[kBlocks];

extern "C" int run(const float* x, float* largest, int64_t n, cudaStream_t stream) {
  float* partial = nullptr;
  cudaError_t err = cudaGetSymbolAddress((void**)&partial, maxima);
  if (err != cudaSuccess) return (int)err;
  const size_t shared = kThreads * sizeof(float);
  block_max<<<kBlocks, kThreads, shared, stream>>>(x, partial, (int)n);
  block_max<<<1, kThreads, shared, stream>>>(partial, largest, kBlocks);
  return (int)cudaGetLastError();
}
"""
MAX_COARSENED = MAX_REMOVED.replace(
    "int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += blockDim.x * gridDim.x",
    "int idx = blockIdx.x * blockDim.x * 2 + threadIdx.x; idx < n; "
    "idx += blockDim.x * gridDim.x * 2",
).replace(
    "    m = fmaxf(m, x[idx]);\n",
    "    m = fmaxf(m, x[idx]);\n    if (idx + blockDim.x < n) m = fmaxf(m, x[idx + blockDim.x]);\n",
)
CASES = {"sum": (SUM_COARSENED, SUM_REMOVED), "max": (MAX_COARSENED, MAX_REMOVED)}


def _candidate(text: str) -> Site:
    (site,) = [c for c in coarsening.candidates(KernelSource(text)) if c.detail.get("form")]
    assert site.detail["form"] == "pairs"
    return site


def _apply(text: str, factor: int | None = None) -> str:
    site = _candidate(text)
    assert site.supported, site.refusal
    carrier = Carrier() if factor is None else Carrier(coarsen=factor)
    return coarsening.apply(KernelSource(text), site, carrier).text


def _remove(text: str) -> str:
    (site,) = [s for s in coarsening.detect(KernelSource(text)) if s.supported]
    assert site.detail["form"] == "pairs"
    return coarsening.remove(KernelSource(text), site).text


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_removed_state_offers_the_loop_where_the_removal_happened(case: str) -> None:
    coarsened, removed = CASES[case]
    assert _remove(coarsened) == removed, diff(_remove(coarsened), removed)
    site = matching_candidate(coarsening, KernelSource(coarsened), KernelSource(removed))
    assert site is not None and site.supported, site and site.refusal
    assert site.detail["form"] == "pairs"
    # the coarsened loop is the removal's site, not a candidate again
    assert not [c for c in coarsening.candidates(KernelSource(coarsened)) if c.detail.get("form")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_applying_writes_two_loads_a_turn_and_removing_them_gives_the_loop_back(
    case: str,
) -> None:
    coarsened, removed = CASES[case]
    applied = _apply(removed)
    assert applied == coarsened, diff(applied, coarsened)
    assert _remove(applied) == removed


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_walk_reapplies_its_removal(case: str) -> None:
    coarsened, removed = CASES[case]
    removal = remove_mechanism(KernelSource(coarsened), coarsening)
    assert removal.simplified.text == removed
    assert removal.carriers == [Carrier(coarsen=2)]
    assert reapply(removal).text == coarsened


def test_the_public_pair_with_its_stride_doubled_in_its_variable_comes_back() -> None:
    # the expert doubled the stride's local before the loop; the rule scales the step where
    # the loop adds it (the local may have other readers), which removes the same way
    before = (PUBLIC_FORMS / "thread_coarsening" / "loads_per_turn.before.cu").read_text()
    after = (PUBLIC_FORMS / "thread_coarsening" / "loads_per_turn.after.cu").read_text()
    site = matching_candidate(coarsening, KernelSource(before), KernelSource(after))
    assert site is not None and site.supported, site and site.refusal
    applied = _apply(after)
    assert "i += stride * 2;" in applied and "if (i + kBlock < n) acc += in[i + kBlock];" in applied
    assert _remove(applied) == after


def test_four_loads_a_turn_are_a_block_apart_and_come_back_out() -> None:
    applied = _apply(SUM_REMOVED, 4)
    assert "k = blockIdx.x * kBlockSize * 4 + threadIdx.x;" in applied
    assert "if (k + 3 * kBlockSize < count) total += values[k + 3 * kBlockSize];" in applied
    assert "k += step * 4;" in applied
    assert _remove(applied) == SUM_REMOVED
    (site,) = [s for s in coarsening.detect(KernelSource(applied)) if s.supported]
    assert coarsening.carrier_of(KernelSource(applied), site) == Carrier(coarsen=4)


def test_a_loop_in_each_branch_is_its_own_candidate() -> None:
    # one branch per path, each declaring its own index (the other's is read after the first)
    text = SUM_REMOVED.replace(
        "  unsigned int k = blockIdx.x * kBlockSize + threadIdx.x;\n  float total = 0.0f;\n"
        "  while (k < count) {\n    total += values[k];\n    k += step;\n  }\n",
        "  float total = 0.0f;\n  if (count > kBlockSize) {\n"
        "    unsigned int k = blockIdx.x * kBlockSize + threadIdx.x;\n"
        "    while (k < count) {\n      total += values[k];\n      k += step;\n    }\n"
        "  } else {\n    unsigned int k = blockIdx.x * kBlockSize + threadIdx.x;\n"
        "    while (k < count) {\n      total += values[k];\n      k += step;\n    }\n  }\n",
    )
    kernel = KernelSource(text)
    sites = [c for c in coarsening.candidates(kernel) if c.detail.get("form")]
    assert len(sites) == 2 and all(s.supported for s in sites), [s.refusal for s in sites]
    applied = coarsening.apply(kernel, sites[0], Carrier())
    assert applied.text.count("k += step * 2;") == 1


@pytest.mark.nvcc
def test_the_applied_loops_compile(mechanism_builder: Builder) -> None:
    sources = [
        KernelSource(_apply(removed, factor), name=f"loads_forward_{case}_{factor or 2}.cu")
        for case, (_, removed) in sorted(CASES.items())
        for factor in (None, 4)
    ]
    compile_ok(mechanism_builder, sources)


@pytest.mark.parametrize(
    ("old", "new", "form"),
    [
        (
            "    total += values[k];\n",
            "    const float v = values[k];\n    total += v * v;\n",
            "a grid-stride loop over k whose turn is 2 statements",
        ),
        (
            "total += values[k];",
            "total = total * 0.5f + values[k];",
            "a turn `total = total * 0.5f + values[k];` whose order matters to total",
        ),
        (
            "total += values[k];",
            "sums[k] = 2.0f * values[k];",
            "a turn that writes `sums[k]`, not a local value",
        ),
        (
            "k = blockIdx.x * kBlockSize + threadIdx.x;",
            "k = (blockIdx.x * kBlockSize + threadIdx.x) * 2;",
            "from 2·blockIdx.x·kBlockSize + 2·threadIdx.x, not one index a thread",
        ),
        (
            "while (k < count) {",
            "while (k <= count) {",
            "with the condition (k <= count), not `k < n`",
        ),
    ],
    ids=["two_statements", "ordered", "store", "scaled_start", "inclusive_bound"],
)
def test_forms_the_rule_does_not_take_are_refused_with_their_form(
    old: str, new: str, form: str
) -> None:
    assert old in SUM_REMOVED
    site = _candidate(SUM_REMOVED.replace(old, new))
    assert not site.supported
    assert form in str(site.refusal), site.refusal
    assert "this rule needs a grid-stride loop `i < n` from `blockIdx.x * B + threadIdx.x`" in (
        str(site.refusal)
    )


def test_one_load_a_turn_is_refused_as_a_factor() -> None:
    site = _candidate(SUM_REMOVED)
    with pytest.raises(MechanismRefused, match="coarsen=1 gives each turn one load"):
        coarsening.apply(KernelSource(SUM_REMOVED), site, Carrier(coarsen=1))


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize(("case", "problem"), [("sum", "vector_total"), ("max", "vector_max")])
def test_the_applied_loops_keep_the_kernel_correct(gate, case: str, problem: str) -> None:
    from klineage.problem import load_problem

    _, removed = CASES[case]
    for factor in (2, 4):
        source = KernelSource(_apply(removed, factor), name=f"loads_forward_{case}_{factor}.cu")
        verdict = gate.run(load_problem(PROBLEMS / problem), source, time_it=False)
        failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
        assert verdict.passed, (factor, verdict.build.message, failing)
