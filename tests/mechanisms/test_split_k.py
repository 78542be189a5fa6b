"""The split_k mechanism: the host's choice of K splits deleted, so one block owns K; the
carried choice put back where the split path is still there."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mining.removal import reapply, remove_each_site, remove_mechanism
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, removal_chain
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("split_k")


class TestSplitK(RoundTripSuite):
    mechanism = "split_k"

    def test_a_new_split_is_refused(self) -> None:
        """Without a carried choice apply is refused: a new split needs a workspace, a
        reduction and a heuristic."""
        for pair in self.pairs():
            simplified = removal_chain(self.subject, pair.before).states[-1]
            candidates = self.subject.candidates(simplified)
            assert candidates
            for candidate in candidates:
                with pytest.raises(MechanismRefused, match="reduction kernel"):
                    self.subject.apply(simplified, candidate)


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("split_k") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "split_k")


def test_kernel_sites_point_at_the_host_choice() -> None:
    from tests.conftest import REPO

    kernel = KernelSource.from_file(REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu")
    sites = mechanism.detect(kernel)
    host = [s for s in sites if s.detail["side"] == "host"]
    assert len(host) == 2 and all(s.supported for s in host)
    kernels = [s for s in sites if s.detail["side"] == "kernel"]
    assert kernels and all("host-side choice" in (s.refusal or "") for s in kernels)


def test_a_choice_that_does_more_is_refused() -> None:
    source = KernelSource(  # the count is a split count by being the grid's y extent
        "__global__ void part(int n) {}\n"
        'extern "C" int run(long n) {\n  int splits = 2;\n'
        "  if (n < 64) splits = 4;\n  part<<<dim3(1, splits), 32>>>(n);\n  return splits;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "initialized to 1" in (site.refusal or "")


def _gemm() -> KernelSource:
    from tests.conftest import REPO

    return KernelSource.from_file(REPO / "expert_kernels" / "gemm_bf16" / "kernel.cu")


def test_each_of_the_gemm_choices_goes_back_alone_where_it_was() -> None:
    """Two `int splits = 1;` blocks (skinny and tiled): the candidate is the one whose choice
    is gone, and its carried choice restores the expert."""
    kernel = _gemm()
    assert [c for c in mechanism.candidates(kernel) if c.supported] == []
    whole = remove_mechanism(kernel, mechanism)
    assert reapply(whole).text == kernel.text
    for single in remove_each_site(kernel, whole):
        (candidate,) = [c for c in mechanism.candidates(single.simplified) if c.supported]
        assert candidate.detail == {"side": "host", "split": "splits"}
        assert reapply(single).text == kernel.text


def test_a_carried_choice_that_assigns_something_else_is_refused() -> None:
    kernel = _gemm()
    whole = remove_mechanism(kernel, mechanism)
    candidate = next(c for c in mechanism.candidates(whole.simplified) if c.supported)
    for choice in ("if (tiles < sms) tiles = 2;", "if (tiles < sms) splits = 2; else splits = 3;"):
        with pytest.raises(MechanismRefused, match="carried choice"):
            mechanism.apply(whole.simplified, candidate, Carrier(choice=choice))


def test_a_count_nothing_reads_is_no_candidate() -> None:
    source = KernelSource('extern "C" int run(long n) {\n  int splits = 1;\n  return 0;\n}\n')
    assert [c for c in mechanism.candidates(source) if c.supported] == []


HELDOUT_COLUMNS = REPO / "heldout" / "column_sum" / "kernel.cu"

NAIVE_MAX = """\
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void column_top(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
  y[c] = acc;
}
extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  column_top<<<(unsigned)((cols + 127) / 128), 128, 0, s>>>(x, y, rows, cols);
  return (int)cudaGetLastError();
}
"""


def _loop_candidate(kernel: KernelSource):  # type: ignore[no-untyped-def]
    (candidate,) = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop"]
    return candidate


def test_a_naive_column_sum_is_split_over_block_rows() -> None:
    """One thread per column walking every row: each block row takes a range of rows and adds
    its partials atomically into the output, zeroed on the launch's stream; the host's choice
    is in the form the removal deletes, so the split comes out again."""
    naive = KernelSource.from_file(HELDOUT_COLUMNS)
    candidate = _loop_candidate(naive)
    assert candidate.supported and candidate.function == "column_sum"
    split = mechanism.apply(naive, candidate)
    text = split.text
    assert "int64_t cols, long long split_rows)" in text
    assert (
        "for (int64_t r = (long long)blockIdx.y * split_rows; r < rows && "
        "r < ((long long)blockIdx.y + 1) * split_rows; ++r)" in text
    )
    assert "atomicAdd(&y[c], acc);" in text and "y[c] = acc;" not in text
    assert "cudaMemsetAsync(y, 0, (size_t)(cols) * sizeof(float), stream);" in text
    assert "const long long split_wanted = (long long)split_sms * 8;" in text
    assert "((long long)(rows) + 128 - 1) / 128" in text
    assert "<<<dim3((unsigned)split_blocks, (unsigned)splits), 256, 0, stream>>>" in text
    assert "(x, y, rows, cols, rows_per_split);" in text
    (site,) = [s for s in mechanism.detect(split) if s.supported]
    assert site.detail == {"side": "host"}
    unsplit = remove_mechanism(split, mechanism).simplified.text
    assert "long long splits = 1;" in unsplit and "if (split_blocks < split_wanted" not in unsplit
    conditions = " ".join(c.text for c in mechanism.conditions(split, candidate))
    assert "no fixed order" in conditions


def test_a_carrier_sets_the_split_heuristic() -> None:
    naive = KernelSource.from_file(HELDOUT_COLUMNS)
    carried = Carrier.model_validate({"blocks_per_sm": 4, "min_rows": 64})
    text = mechanism.apply(naive, _loop_candidate(naive), carried).text
    assert "(long long)split_sms * 4;" in text and "+ 64 - 1) / 64" in text
    with pytest.raises(MechanismRefused, match="positive integers"):
        mechanism.apply(naive, _loop_candidate(naive), Carrier.model_validate({"min_rows": 0}))


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("acc += x[r * cols + c];", "acc = fmaxf(acc, x[r * cols + c]);"), None),
        (("float acc = 0.0f;", "float acc = 1.0f;"), "does not start at 0"),
        (("y[c] = acc;", "y[c] = acc;\n  y[0] = 0.0f;"), "statements follow the loop"),
        (("y[c] = acc;", "y[c] = acc * c;"), "reads more than acc and the kernel's parameters"),
        (("r < rows; ++r", "r < rows; r += 2"), "does not step r by one"),
        (("threadIdx.x;\n  if", "threadIdx.x + threadIdx.y;\n  if"), "is not `blockIdx.x"),
        (
            ("if (c >= cols) return;", "if (c >= cols) return;\n  float* out = y;"),
            "the kernel reads y at line 6",
        ),
        (("y[c] = acc;", "*(y + c) = acc;"), "is not stored as `y[i] = acc;`"),
        (("acc += x[r * cols + c];", "acc += x[r * cols + c] + y[r];"), "reads y at line 7"),
    ],
)
def test_other_forms_are_refused_with_what_differs(edit: tuple[str, str], why: str | None) -> None:
    kernel = KernelSource(NAIVE_MAX.replace(*edit))
    candidates = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop"]
    if why is None:  # a max is no `acc += value` loop: no candidate at all
        assert candidates == []
        return
    (candidate,) = candidates
    assert not candidate.supported and why in (candidate.refusal or ""), candidate.refusal
    assert "reduction kernel" in (candidate.refusal or "")


@pytest.mark.nvcc
def test_split_sums_compile(mechanism_builder: Builder) -> None:
    from tests.mechanisms.roundtrip import compile_ok

    sources = []
    for name in ("column_sum", "row_sum", "mean_pool", "gemv", "batched_hgemm", "sgemm"):
        naive = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        sources.append(mechanism.apply(naive, _loop_candidate(naive)))
    compile_ok(mechanism_builder, sources)


def test_a_sum_stored_through_an_epilogue_meets_in_a_workspace() -> None:
    """mean_pool stores ``__float2half(acc / (float)seq)``: the splits add into a float
    workspace allocated on the stream, and a second kernel (the index, the guard and the store
    as written) stores the epilogue of each sum; the workspace is freed on the stream."""
    naive = KernelSource.from_file(REPO / "heldout" / "mean_pool" / "kernel.cu")
    text = mechanism.apply(naive, _loop_candidate(naive)).text
    assert "int64_t hidden, float* split_sums, long long split_rows)" in text
    assert "atomicAdd(&split_sums[i], acc);" in text
    finish = text.split("__global__ void mean_pool_finish(")[1].split("\n}")[0]
    assert "int64_t hidden, const float* split_sums)" in finish
    assert "if (i >= batch * hidden) return;" in finish
    assert "const float acc = split_sums[i];" in finish
    assert "y[i] = __float2half(acc / (float)seq);" in finish
    host = text.split('extern "C"')[1]
    assert "(size_t)(batch * hidden) * sizeof(float), stream);" in host
    assert host.index("mean_pool<<<dim3(") < host.index("mean_pool_finish<<<(unsigned)blocks")
    assert host.index("mean_pool_finish<<<") < host.index("cudaFreeAsync(split_sums, stream);")
    (site,) = [s for s in mechanism.detect(KernelSource(text)) if s.supported]
    assert site.detail == {"side": "host"}


TILED_PRODUCT = """
#define TILE 16
__global__ void tiled_product(float* c, const float* a, const float* b, int wa, int wb) {
  __shared__ float sa[TILE][TILE];
  __shared__ float sb[TILE][TILE];
  const int a_first = wa * TILE * blockIdx.y;
  const int a_last = a_first + wa - 1;
  const int b_first = TILE * blockIdx.x;
  float acc = 0.f;
  for (int ia = a_first, ib = b_first; ia <= a_last; ia += TILE, ib += TILE * wb) {
    sa[threadIdx.y][threadIdx.x] = a[ia + wa * threadIdx.y + threadIdx.x];
    sb[threadIdx.y][threadIdx.x] = b[ib + wb * threadIdx.y + threadIdx.x];
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += sa[threadIdx.y][k] * sb[k][threadIdx.x];
    __syncthreads();
  }
  c[wb * TILE * blockIdx.y + TILE * blockIdx.x + wb * threadIdx.y + threadIdx.x] = acc;
}
"""

K_CHUNKS = """
__global__ void chunk_sums(float* partial, const float* x, int rows, int cols, int chunk) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int r_first = blockIdx.y * chunk;
  const int r_end = r_first + chunk;
  float acc = 0.f;
  for (int r = r_first; r < r_end; ++r) acc += x[(size_t)r * cols + col];
  partial[(size_t)blockIdx.y * cols + col] = acc;
}
"""


def test_a_tiled_product_walking_its_block_row_is_no_k_split() -> None:
    # a row of A from wa * TILE * blockIdx.y, wa long: the blocks along y walk rows TILE
    # apart, not chunks of one K range (cuda-samples matrixMul's spelling)
    assert mechanism.detect(KernelSource(TILED_PRODUCT)) == []


def test_chunks_as_long_as_the_step_between_blocks_are_a_k_split() -> None:
    sites = mechanism.detect(KernelSource(K_CHUNKS))
    assert [s.snippet.split(" = ")[0] for s in sites] == [
        "chunk_sums: const int r_first",
        "chunk_sums: const int r_end",
    ]
    assert all("host-side choice" in str(s.refusal) for s in sites)
    # the same chunk read as a row of a wider matrix: rows apart again
    rows = K_CHUNKS.replace("blockIdx.y * chunk;", "blockIdx.y * chunk * 4;")
    assert mechanism.detect(KernelSource(rows)) == []
