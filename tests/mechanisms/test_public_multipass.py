"""The multi-pass reductions (one partial per block, read by a second pass): removing a
block's chunk loop (thread_coarsening) and a grid-stride ``while`` loop (grid_stride_loop),
with the host's partial count following, or refused with the form found and the form needed.

The CPU checks read the loads' index forms from the analysis of both fixtures and enumerate,
for a small grid, which elements every thread sums before and after: every element once."""

from __future__ import annotations

from collections import Counter

import pytest

from klineage.cuda.analysis import IndexForm, analysis
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

coarsening = get("thread_coarsening")
grid_stride = get("grid_stride_loop")


def _fixture(path: str) -> KernelSource:
    return KernelSource((PUBLIC_FORMS / path).read_text())


def _loads(kernel: KernelSource) -> list[IndexForm]:
    source = kernel.parsed
    function = source.kernels[0]
    return [
        a.offset
        for a in analysis(source).indices(function).accesses()
        if a.buffer.space == "global" and a.direction == "load"
    ]


def _at(form: IndexForm, **values: int) -> int:
    bound = {name.replace("_", "."): IndexForm.constant(v) for name, v in values.items()}
    value = form.substitute(bound).value
    assert value is not None, (form, values)
    return value


def test_a_block_chunk_becomes_one_element_per_thread_and_every_element_is_summed_once() -> None:
    before = _fixture("thread_coarsening/chunk_partials.before.cu")
    after = _fixture("thread_coarsening/chunk_partials.after.cu")
    (old,) = _loads(before)
    (new,) = _loads(after)
    (atom,) = [a for a in old.atoms() if "@" in a]
    per, block, blocks = 4, 8, 3  # NUM_PER_THREAD, blockSize, the old grid
    n = per * block * blocks
    read_before = Counter(
        _at(old, blockIdx_x=b, threadIdx_x=t, blockSize=block, **{atom: k})
        for b in range(blocks)
        for t in range(block)
        for k in range(per)
    )
    read_after = Counter(
        _at(new, blockIdx_x=b, threadIdx_x=t, blockSize=block)
        for b in range(blocks * per)  # the host's grid, times NUM_PER_THREAD
        for t in range(block)
    )
    assert read_before == read_after == Counter(range(n))
    run = after.text.split('extern "C"')[1]
    assert "blocks = (unsigned)(n / (NUM_PER_THREAD * kThreads)) * NUM_PER_THREAD;" in run
    assert "<<<blocks, kThreads, 0, stream>>>(x, partial)" in run  # the grid follows blocks
    assert "(partial, total, blocks)" in run  # and so does the second pass's count


def test_a_grid_stride_pair_loop_becomes_one_turn_per_thread_covering_n() -> None:
    before = _fixture("grid_stride_loop/pair_partials.before.cu")
    after = _fixture("grid_stride_loop/pair_partials.after.cu")
    source = before.parsed
    (loop,) = [
        v
        for v in analysis(source).indices(source.kernels[0]).loops
        if v.step is not None and v.step.coefficient("gridDim.x").terms
    ]
    block, capped = 4, 2
    for n in (1, 7, 8, 37, 64):
        read_before: Counter[int] = Counter()
        for b in range(capped):
            for t in range(block):
                i = _at(loop.init, blockIdx_x=b, threadIdx_x=t, blockSize=block)
                step = _at(loop.step, gridDim_x=capped, blockSize=block)
                while i < n:  # the loop and its guard, as the fixture writes them
                    read_before[i] += 1
                    if i + block < n:
                        read_before[i + block] += 1
                    i += step
        first, second = _loads(after)
        read_after: Counter[int] = Counter()
        for b in range((n + 2 * block - 1) // (2 * block)):  # the new grid
            for t in range(block):
                i = _at(first, blockIdx_x=b, threadIdx_x=t, blockSize=block)
                if i < n:
                    read_after[i] += 1
                    j = _at(second, blockIdx_x=b, threadIdx_x=t, blockSize=block)
                    if j < n:
                        read_after[j] += 1
        assert read_before == read_after == Counter(range(n)), n
    run = after.text.split('extern "C"')[1]
    assert "kMaxBlocks ?" not in run  # the cap went
    assert "(partial, total, blocks)" in run


# a fixed __device__ array as large as the coarsened grid: K times more partials overflow it
FIXED_ARRAY = """\
#include <cstdint>
#include <cuda_runtime.h>
template <unsigned blockSize, int K>
__global__ void sums(const float* g, float* out) {
  float s = 0.f;
  for (int k = 0; k < K; k++) s += g[blockIdx.x * (blockSize * K) + k * blockSize + threadIdx.x];
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}
__global__ void last(const float* p, float* total, unsigned count) {
  if (threadIdx.x != 0) return;
  float s = 0.f;
  for (unsigned i = 0; i < count; ++i) s += p[i];
  total[0] = s;
}
__device__ float partials[64];
extern "C" int run(const float* x, float* total, int64_t n, cudaStream_t stream) {
  float* p = nullptr;
  cudaGetSymbolAddress((void**)&p, partials);
  const unsigned blocks = 64;
  sums<32, 4><<<blocks, 32, 0, stream>>>(x, p);
  last<<<1, 32, 0, stream>>>(p, total, blocks);
  return (int)cudaGetLastError();
}
"""


def test_partials_in_a_fixed_array_too_small_for_the_new_count_are_refused() -> None:
    (site,) = [
        s for s in coarsening.detect(KernelSource(FIXED_ARRAY)) if "loop over k" in str(s.refusal)
    ]
    assert not site.supported
    assert "each block handling K elements" in str(site.refusal)  # the form found
    assert "`partials[64]`, a fixed `__device__` array" in str(site.refusal)
    assert "would write 256 of them, more than it holds" in str(site.refusal)


def test_the_same_kernel_as_second_pass_writing_the_output_is_refused() -> None:
    text = FIXED_ARRAY.replace("__device__ float partials[64];", "__device__ float partials[256];")
    text = text.replace(
        "last<<<1, 32, 0, stream>>>(p, total, blocks);",
        "sums<32, 2><<<1, 32, 0, stream>>>(p, total);",
    )
    (site,) = [s for s in coarsening.detect(KernelSource(text)) if "loop over k" in str(s.refusal)]
    assert "a launch writing its partials into the output total" in str(site.refusal)


def test_a_capped_grid_over_a_fixed_array_is_refused() -> None:
    kernel = _fixture("thread_coarsening/loads_per_turn.before.cu")
    (site,) = grid_stride.detect(kernel)
    assert not site.supported
    assert "a grid-stride `while` loop over gridDim.x" in str(site.refusal)  # the form found
    assert "`partials[64]`, a fixed `__device__` array" in str(site.refusal)
    assert "a number without a bound of them" in str(site.refusal)


def test_a_grid_the_second_pass_does_not_read_is_refused() -> None:
    text = _fixture("thread_coarsening/chunk_partials.before.cu").text.replace(
        "(partial, total, blocks);", "(partial, total, 4096u);"
    )
    (site,) = coarsening.detect(KernelSource(text))
    assert "no second launch in run reading the partials with the count blocks" in str(site.refusal)


def test_an_output_pass_is_named_beside_a_fixed_array_too_small() -> None:
    # the kernel is its own final pass, into the output: growing that grid is never sound,
    # so the refusal names it even where the partial array stops the rule first
    text = FIXED_ARRAY.replace(
        "last<<<1, 32, 0, stream>>>(p, total, blocks);",
        "sums<32, 2><<<1, 32, 0, stream>>>(p, total);",
    )
    (site,) = [s for s in coarsening.detect(KernelSource(text)) if "loop over k" in str(s.refusal)]
    assert not site.supported
    assert "would write 256 of them, more than it holds" in str(site.refusal)
    assert "a launch writing its partials into the output total" in str(site.refusal)
    assert "`sums<32, 2><<<1, 32, 0, stream>>>(p, total)`" in str(site.refusal)
    assert "another pass would have to sum its partials" in str(site.refusal)


# the passes launched from a host helper, whose buffer parameter the ABI function fills with
# the partial array or, on the pass that leaves one value, the output
HELPER_PASSES = (
    _fixture("thread_coarsening/loads_per_turn.before.cu")
    .text.replace(
        'extern "C" int run(',
        "void launch_pass(unsigned count, unsigned blocks, const float* in, float* out,\n"
        "                 cudaStream_t stream) {\n"
        "  partial_totals<kThreads><<<blocks, kThreads, 0, stream>>>(in, out, count);\n"
        "}\n\n"
        'extern "C" int run(',
    )
    .replace(
        "  partial_totals<kThreads><<<blocks, kThreads, 0, stream>>>(x, partial, (unsigned)n);\n"
        "  partial_totals<kThreads><<<1, kThreads, 0, stream>>>(partial, total, blocks);\n",
        "  launch_pass((unsigned)n, blocks, x, blocks == 1 ? total : partial, stream);\n"
        "  if (blocks > 1) launch_pass(blocks, 1, partial, total, stream);\n",
    )
)


def test_partials_into_a_helper_parameter_name_what_its_callers_pass() -> None:
    assert "launch_pass(blocks, 1, partial, total, stream)" in HELPER_PASSES
    (site,) = grid_stride.detect(KernelSource(HELPER_PASSES))
    assert not site.supported
    assert "a grid-stride `while` loop over gridDim.x" in str(site.refusal)  # the form found
    assert "out, a parameter of the host function launch_pass" in str(site.refusal)
    assert "its callers pass `blocks == 1 ? total : partial`, `total`" in str(site.refusal)
    assert "on some passes the output total" in str(site.refusal)


@pytest.mark.nvcc
def test_the_helper_passes_fixture_compiles(mechanism_builder: Builder) -> None:
    # the refusal above is about code that builds: the fixture is a valid program
    compile_ok(mechanism_builder, [KernelSource(HELPER_PASSES, name="helper_passes")])


def test_an_output_pass_that_stops_the_rule_itself_is_named_once() -> None:
    text = FIXED_ARRAY.replace("__device__ float partials[64];", "__device__ float partials[256];")
    text = text.replace(
        "last<<<1, 32, 0, stream>>>(p, total, blocks);",
        "sums<32, 2><<<1, 32, 0, stream>>>(p, total);",
    )
    (site,) = [s for s in coarsening.detect(KernelSource(text)) if "loop over k" in str(s.refusal)]
    assert str(site.refusal).count("into the output total") == 1
    assert "`sums<32, 2><<<1, 32, 0, stream>>>(p, total)`" in str(site.refusal)
