"""The grid_stride_loop mechanism: fixtures both ways, heldout kernels, grids, refusals."""

from __future__ import annotations

import json

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import (
    FIXTURES,
    PUBLIC_FORMS,
    RoundTripSuite,
    compile_ok,
    matching_candidate,
)
from tests.mechanisms.test_vectorized_access import listing_experts

NAME = "grid_stride_loop"
mechanism = get(NAME)


class TestGridStrideLoop(RoundTripSuite):
    mechanism = NAME


def test_detect_finds_what_the_experts_list() -> None:
    """Every listed entry is detected (no expert lists one today), and the experts, which
    size their grids to the rows, hold none."""
    for expert in listing_experts(NAME):
        entries = json.loads((expert / "mechanisms.json").read_text())
        listed = [e for e in entries if e["mechanism"] == NAME]
        report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
        assert report.recall == 1.0, str(report)
    for name in ("softmax", "topk", "fused_add_rmsnorm"):
        assert (
            mechanism.detect(KernelSource.from_file(REPO / f"expert_kernels/{name}/kernel.cu"))
            == []
        )


@pytest.mark.nvcc
def test_heldout_kernels_take_a_capped_grid_and_compile(mechanism_builder: Builder) -> None:
    results = []
    for name, launch in [
        ("gelu", "gelu_tanh<<<(unsigned)min((int64_t)((n + 256 - 1) / 256), (int64_t)528), 256"),
        ("embedding_gather", "embedding_gather<<<(unsigned)min((int64_t)((tokens * hidden + 256"),
    ]:
        kernel = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        (candidate,) = mechanism.candidates(kernel)
        result = mechanism.apply(kernel, candidate, Carrier(max_blocks=528))
        assert launch in result.text
        (site,) = mechanism.detect(result)
        assert site.supported and mechanism.carrier_of(result, site) == Carrier(max_blocks=528)
        results.append(result)
    assert "      continue;\n" in results[1].text  # the early return of an invalid id
    compile_ok(mechanism_builder, results)


def test_without_a_cap_the_grid_stays() -> None:
    kernel = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    result = mechanism.apply(kernel, mechanism.candidates(kernel)[0])
    assert "gelu_tanh<<<(unsigned)blocks, 256, 0, stream>>>" in result.text
    assert "i += (int64_t)gridDim.x * blockDim.x) {" in result.text


def _kernel(body: str, launch: str = "k<<<num_sms * 4, 256, 0, s>>>(x, n);") -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__global__ void k(float* x, int64_t n) {\n"
        f"{body}\n}}\n"
        'extern "C" int run(float* x, int64_t n, cudaStream_t s) {\n'
        "  int num_sms = 0;\n"
        "  cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0);\n"
        f"  {launch}\n  return 0;\n}}\n"
    )


LOOP = (
    "  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;"
    " i += blockDim.x * (int64_t)gridDim.x)"
)


def test_an_sm_count_grid_becomes_a_grid_that_covers_n() -> None:
    kernel = _kernel(f"{LOOP}\n    x[i] *= 2.0f;")
    (site,) = mechanism.detect(kernel)
    removed = mechanism.remove(kernel, site)
    assert "k<<<(unsigned)((n + 256 - 1) / 256), 256, 0, s>>>(x, n);" in removed.text
    assert "  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;\n  if (i < n)\n" in (
        removed.text
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (f"{LOOP} {{\n    if (x[i] < 0.0f) return;\n    x[i] = 1.0f;\n  }}", "returns"),
        (f"{LOOP} {{\n    if (x[i] < 0.0f) break;\n  }}\n  x[0] = 0.0f;", "code follows"),
        (f"{LOOP} x[i] = blockIdx.x;", "reads blockIdx.x"),
        (f"{LOOP} x[i] = 0.0f;\n{LOOP.replace('< n', '< n / 2')} x[i] = 1.0f;", "different bound"),
    ],
)
def test_unsafe_loops_are_detected_but_refused(body: str, reason: str) -> None:
    kernel = _kernel(body)
    site = mechanism.detect(kernel)[0]
    assert reason in (site.refusal or "")
    with pytest.raises(MechanismRefused):
        mechanism.remove(kernel, site)


def test_a_barrier_in_the_loop_goes_to_the_general_removal() -> None:
    # a thread past n skipped the barrier in the loop's last turn as it skips it now
    kernel = _kernel(f"{LOOP} {{\n    x[i] = 0.0f;\n    __syncthreads();\n  }}")
    (site,) = mechanism.detect(kernel)
    assert site.supported and site.detail.get("form") == "index", site.refusal
    after = mechanism.remove(kernel, site).text
    assert "if (i < n) {\n    x[i] = 0.0f;\n    __syncthreads();" in after
    assert "k<<<(unsigned)((n + 256 - 1) / 256), 256, 0, s>>>(x, n);" in after


_FINAL_SUM = (
    "  __shared__ float partial[256];\n"
    "  float sum = 0.0f;\n"
    f"{LOOP}\n    sum += x[i];\n"
    "  partial[threadIdx.x] = sum;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {{\n"
    "    float total = 0.0f;\n"
    "    for (int t = 0; t < 256; ++t) total += partial[t];\n"
    "    {store};\n"
    "  }}"
)


def test_a_sum_carried_out_to_a_place_no_block_picks_is_refused() -> None:
    # one block summed every element into x[0]; a grid covering n would have each block
    # write its own part of the sum there
    kernel = _kernel(_FINAL_SUM.format(store="x[0] = total"), "k<<<1, 256, 0, s>>>(x, n);")
    (site,) = mechanism.detect(kernel)
    assert not site.supported
    assert "carry sum out of it" in (site.refusal or "")
    assert "`x[0]` (line" in (site.refusal or "")


def test_a_sum_carried_out_to_an_atomic_is_removed() -> None:
    # every block's part adds up in the atomic, however many blocks there are
    kernel = _kernel(_FINAL_SUM.format(store="atomicAdd(&x[0], total)"))
    (site,) = mechanism.detect(kernel)
    assert site.supported and site.detail.get("form") == "index", site.refusal
    removed = mechanism.remove(kernel, site).text
    assert "if (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n)\n" in removed
    assert "k<<<(unsigned)((n + 256 - 1) / 256), 256, 0, s>>>(x, n);" in removed


def test_a_loop_in_a_device_helper_is_refused() -> None:
    helper = KernelSource(
        "#include <stdint.h>\n"
        f"__device__ void fill(float* x, int64_t n) {{\n{LOOP} x[i] = 0.0f;\n}}\n"
    )
    (site,) = mechanism.detect(helper)
    assert "device helper" in (site.refusal or "")


def test_a_launch_outside_the_file_is_refused() -> None:
    kernel = _kernel(f"{LOOP} x[i] = 0.0f;", launch="(void)s;")
    (site,) = mechanism.detect(kernel)
    assert "no launch of k" in (site.refusal or "")


def test_a_zero_cap_is_refused() -> None:
    kernel = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    with pytest.raises(MechanismRefused, match="at least 1"):
        mechanism.apply(kernel, mechanism.candidates(kernel)[0], Carrier(max_blocks=0))


def _named_stride() -> str:
    path = PUBLIC_FORMS / NAME / "named_stride.before.cu"
    return path.read_text(encoding="utf-8")


def test_a_named_stride_and_first_index_are_part_of_the_loop() -> None:
    kernel = KernelSource(_named_stride())
    sites = {s.function: s for s in mechanism.detect(kernel)}
    assert {name: s.supported for name, s in sites.items()} == {
        "scale_front": True,
        "scale_back": True,
    }
    after = mechanism.remove(kernel, sites["scale_front"]).text
    # the stride is read by nothing once the loop is gone, and the first index is written
    # where the one-element form declares it: the forward rule takes the kernel back
    assert "const size_t threads" not in after and "tid" not in after
    assert "size_t k = blockDim.x * (size_t)blockIdx.x + threadIdx.x;\n  if (k < count) {" in after
    front = [c for c in mechanism.candidates(KernelSource(after)) if c.function == "scale_front"]
    assert front and front[0].supported
    # a first index of another type converts on the way: it stays named
    converting = KernelSource(_named_stride().replace("const size_t tid", "const int tid"))
    (site,) = [s for s in mechanism.detect(converting) if s.function == "scale_front"]
    kept = mechanism.remove(converting, site).text
    assert "const int tid = blockDim.x" in kept and "size_t k = tid;" in kept


@pytest.mark.parametrize(
    ("old", "new", "function", "reason"),
    [
        (  # the stride's local is read in the body too: its gridDim.x read is the kernel's
            "out[k] = alpha * in[k];",
            "out[k] = alpha * in[k] + (float)(threads & 1);",
            "scale_front",
            "also reads gridDim.x",
        ),
        (  # the first index's local is written: it is not the header's alone
            "  for (size_t k = tid;",
            "  tid += 0;\n  for (size_t k = tid;",
            "scale_front",
            "also reads blockIdx.x",
        ),
        (  # after the loop the index holds its last value, past count
            "    out[pos] = alpha * in[pos];\n  }\n",
            "    out[pos] = alpha * in[pos];\n  }\n  if (pos == count) out[0] = 0.f;\n",
            "scale_back",
            "which code after the loop reads",
        ),
        (  # written before the loop by a statement of its own
            "  for (; pos < count;",
            "  pos += 1;\n  for (; pos < count;",
            "scale_back",
            "which statements other than its own write",
        ),
    ],
)
def test_named_loop_parts_are_refused_where_they_are_not_the_loops_alone(
    old: str, new: str, function: str, reason: str
) -> None:
    text = _named_stride()
    assert old in text
    kernel = KernelSource(text.replace(old, new, 1))
    (site,) = [s for s in mechanism.detect(kernel) if s.function == function]
    assert reason in str(site.refusal), site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(kernel, site)


def _dim3_grid() -> str:
    path = PUBLIC_FORMS / NAME / "dim3_grid.before.cu"
    return path.read_text(encoding="utf-8")


def test_a_dim3_grid_variable_gets_the_new_size_in_its_declaration() -> None:
    kernel = KernelSource(_dim3_grid())
    (site,) = mechanism.detect(kernel)
    after = mechanism.remove(kernel, site).text
    assert "dim3 dimGrid((unsigned)((count + dimBlock.x - 1) / dimBlock.x), 1, 1);" in after
    assert "scale_all<<<dimGrid, dimBlock, 0, stream>>>" in after


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # another kernel's grid would change with this one's
            "  return (int)cudaGetLastError();",
            "  other<<<dimGrid, dimBlock, 0, stream>>>(y);\n  return (int)cudaGetLastError();",
            "which the launch of other reads too",
        ),
        (
            "  scale_all<<<",
            "  dimGrid.x = 128;\n  scale_all<<<",
            "written after its declaration",
        ),
        (  # the new size reads the block, declared after the grid
            "  dim3 dimBlock(256, 1, 1);\n  dim3 dimGrid(264, 1, 1);",
            "  dim3 dimGrid(264, 1, 1);\n  dim3 dimBlock(256, 1, 1);",
            "declared before dimBlock, which its new size reads",
        ),
    ],
)
def test_a_dim3_grid_variable_is_refused_where_its_new_size_would_not_be_this_launchs(
    old: str, new: str, reason: str
) -> None:
    text = _dim3_grid()
    assert old in text
    text = text.replace(old, new)
    text = text.replace(
        'extern "C"', '__global__ void other(float* p) { p[0] = 0.f; }\n\nextern "C"'
    )
    kernel = KernelSource(text)
    (site,) = [s for s in mechanism.detect(kernel) if s.function == "scale_all"]
    assert reason in str(site.refusal), site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(kernel, site)


def test_a_canonical_loop_launched_with_dim3_variables_goes_to_the_general_removal() -> None:
    text = _dim3_grid().replace("  int id = threadIdx.x + blockIdx.x * blockDim.x;\n", "")
    text = text.replace("(int i = id;", "(int i = threadIdx.x + blockIdx.x * blockDim.x;")
    kernel = KernelSource(text)
    (site,) = mechanism.detect(kernel)
    assert site.supported and site.detail.get("form") == "index", site.refusal
    after = mechanism.remove(kernel, site).text
    assert "int i = threadIdx.x + blockIdx.x * blockDim.x;\n  if (i < count) {" in after
    assert "dim3 dimGrid((unsigned)((count + dimBlock.x - 1) / dimBlock.x), 1, 1);" in after


def _dim3_removed() -> KernelSource:
    return KernelSource((PUBLIC_FORMS / NAME / "dim3_grid.after.cu").read_text(encoding="utf-8"))


def test_a_capped_forward_sizes_the_grid_by_a_flat_dim3_blocks_x() -> None:
    # what the removal leaves of warpAggregatedAtomicsCG's filter_arr: the grid capped again
    # at the removal's block count, over dimBlock.x threads a block (its y and z are 1)
    kernel = _dim3_removed()
    (site,) = mechanism.candidates(kernel)
    after = mechanism.apply(kernel, site, Carrier(max_blocks=264)).text
    assert "i < count; i += (int)gridDim.x * blockDim.x)" in after
    assert (
        "scale_all<<<(unsigned)min((int64_t)((count + dimBlock.x - 1) / dimBlock.x), "
        "(int64_t)264), dimBlock, 0, stream>>>"
    ) in after


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("dim3 dimBlock(256, 1, 1);", "dim3 dimBlock(256, 2, 1);"),  # 512 threads, not x
        ("  dim3 dimGrid(", "  dimBlock.y = 2;\n  dim3 dimGrid("),  # changed after
    ],
)
def test_a_capped_forward_refuses_a_dim3_block_whose_count_is_not_its_x(old: str, new: str) -> None:
    text = _dim3_removed().text
    assert old in text
    kernel = KernelSource(text.replace(old, new))
    (site,) = mechanism.candidates(kernel)
    with pytest.raises(MechanismRefused, match="y and z are not both 1"):
        mechanism.apply(kernel, site, Carrier(max_blocks=264))


# ---------------------------------------------------------------------------------------------
# The forward rule over an index guarded along any grid dimension
# ---------------------------------------------------------------------------------------------

GRID_FIXTURES = FIXTURES / NAME


def _fixture(name: str) -> str:
    return (GRID_FIXTURES / name).read_text(encoding="utf-8")


def _guarded(kernel: KernelSource) -> list[Site]:
    return [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "guarded"]


@pytest.mark.parametrize(
    ("case", "snippet"),
    [
        ("bias_atomic", "if (int r = blockIdx.y * rows_per_turn + lane_row; r < rows)"),
        ("z_rows", "int64_t row = (int64_t)blockIdx.x * blockDim.z + threadIdx.z; if (row < rows)"),
    ],
)
def test_an_index_guarded_along_another_axis_is_a_supported_candidate(
    case: str, snippet: str
) -> None:
    (site,) = _guarded(KernelSource(_fixture(f"{case}.after.cu")))
    assert site.supported, site.refusal
    assert site.snippet == snippet


def test_the_loop_strides_by_the_blocks_own_term_and_the_cap_goes_where_the_grid_is() -> None:
    y_turns = KernelSource(_fixture("bias_atomic.after.cu"))
    applied = mechanism.apply(y_turns, _guarded(y_turns)[0], Carrier(max_blocks=16)).text
    loop = "for (int r = blockIdx.y * rows_per_turn + lane_row; r < rows; r += gridDim.y * "
    assert f"    {loop}rows_per_turn)\n" in applied
    assert (  # the y size of the dim3 grid, in its declaration
        "dim3 grid((unsigned)((cols + 7) / 8), (unsigned)min((int64_t)((((int)rows) + block.z * 4"
        " - 1) / (block.z * 4)), (int64_t)16));"
    ) in applied
    z_rows = KernelSource(_fixture("z_rows.after.cu"))
    applied = mechanism.apply(z_rows, _guarded(z_rows)[0], Carrier(max_blocks=1024)).text
    assert (  # the block's term keeps its cast
        "  for (int64_t row = (int64_t)blockIdx.x * blockDim.z + threadIdx.z; row < rows;\n"
        "       row += (int64_t)gridDim.x * blockDim.z) {\n"
    ) in applied
    assert (
        "rms_scale<<<(unsigned)min((int64_t)((rows + block.z - 1) / block.z), (int64_t)1024),"
        in (applied)
    )
    # a kernel picking its scratch row by blockIdx.y: the host's count of rows is capped
    slots = KernelSource.from_file(PUBLIC_FORMS / NAME / "row_turns.after.cu")
    applied = mechanism.apply(slots, _guarded(slots)[0], Carrier(max_blocks=2)).text
    assert (
        "const int turns = (unsigned)min((int64_t)((((int)rows) + 4 * block.z - 1) / "
        "(4 * block.z)), (int64_t)2);"
    ) in applied


@pytest.mark.nvcc
def test_without_a_cap_the_guarded_grid_stays_and_the_removal_gives_the_kernel_back(
    mechanism_builder: Builder,
) -> None:
    applied = []
    for case in ("bias_atomic", "z_rows"):
        kernel = KernelSource(_fixture(f"{case}.after.cu"))
        result = mechanism.apply(kernel, _guarded(kernel)[0])
        host = kernel.text[kernel.text.index('extern "C"') :]
        assert result.text.endswith(host)  # the grid stays: the loop runs once
        (site,) = [s for s in mechanism.detect(result) if s.supported]
        assert site.detail.get("form") == "index"
        assert mechanism.remove(result, site).text == kernel.text
        applied.append(result)
    compile_ok(mechanism_builder, applied)


@pytest.mark.parametrize(
    "case",
    ["rows_by_z", "row_turns", "batch_by_z", "tiles_by_block", "held_index", "earlier_index"],
)
def test_the_public_form_removals_are_walked_forward_again(case: str) -> None:
    before = KernelSource.from_file(PUBLIC_FORMS / NAME / f"{case}.before.cu")
    after = KernelSource.from_file(PUBLIC_FORMS / NAME / f"{case}.after.cu")
    (site,) = [s for s in mechanism.detect(before) if s.supported]
    candidate = matching_candidate(mechanism, before, after)
    assert candidate.detail.get("form") == "guarded" and candidate.supported
    again = mechanism.apply(after, candidate, mechanism.carrier_of(before, site))
    (found,) = [s for s in mechanism.detect(again) if s.supported]
    assert mechanism.remove(again, found).text == after.text


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("case", "loop"),
    [
        ("batch_by_z", "  for (int p = blockIdx.z; p < planes; p += gridDim.z) {\n"),
        (
            "tiles_by_block",
            "  for (unsigned int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {\n",
        ),
    ],
)
def test_an_index_a_whole_block_shares_is_walked_by_the_blocks_in_turns(
    mechanism_builder: Builder, case: str, loop: str
) -> None:
    # one item per block (no thread index in the offset): every thread of a block takes the
    # same turns, so the loop is sound with or without barriers
    after = KernelSource.from_file(PUBLIC_FORMS / NAME / f"{case}.after.cu")
    (candidate,) = _guarded(after)
    assert candidate.supported, candidate.refusal
    applied = mechanism.apply(after, candidate)
    assert loop in applied.text
    assert applied.text.endswith(after.text[after.text.index('extern "C"') :])  # grid stays
    compile_ok(mechanism_builder, [after, applied])


def test_an_index_held_in_a_local_steps_by_the_locals_block_term() -> None:
    after = KernelSource.from_file(PUBLIC_FORMS / NAME / "held_index.after.cu")
    (candidate,) = _guarded(after)
    applied = mechanism.apply(after, candidate).text
    assert "  for (int p = first; p < width * height; p += blockDim.x * gridDim.x) {\n" in applied
    # a local the kernel also reads elsewhere is not part of the index: its block term is
    # not the index's to step by
    shared = KernelSource(
        after.text.replace("out[p] = 2.0f * in[p];", "out[p + 0 * first] = 2.0f * in[p];")
    )
    (refused,) = _guarded(shared)
    assert not refused.supported
    assert "not written as one term `blockIdx.x * S`" in (refused.refusal or "")


def test_an_index_declared_before_other_setup_gets_a_loop_without_an_initializer() -> None:
    after = KernelSource.from_file(PUBLIC_FORMS / NAME / "earlier_index.after.cu")
    (candidate,) = _guarded(after)
    applied = mechanism.apply(after, candidate).text
    assert "  for (; tid < count; tid += gridDim.x * blockDim.x) {\n" in applied
    assert "  size_t tid = blockIdx.x * blockDim.x + threadIdx.x;\n" in applied  # it stays
    # read after the guard, the index would hold the loop's last value there: a bound check
    reread = KernelSource(after.text.replace("  }\n}\n", "  }\n  out[0] += (float)tid;\n}\n", 1))
    assert "out[0] += (float)tid;" in reread.text
    assert _guarded(reread) == []
    # the bound read after the guard is the same after the loop: still a candidate
    bound_after = KernelSource(
        after.text.replace("  }\n}\n", "  }\n  if (count == 0) out[0] = 0.0f;\n}\n", 1)
    )
    (candidate,) = _guarded(bound_after)
    assert candidate.supported, candidate.refusal


def test_a_return_ending_a_barrier_free_kernel_becomes_continue() -> None:
    body = (
        "  int i = blockIdx.y * blockDim.x + threadIdx.x;\n"
        "  if (i < n) {\n    if (x[i] < 0.0f) return;\n    x[i] *= 2.0f;\n  }"
    )
    kernel = _kernel(body, launch="k<<<dim3(1, (n + 255) / 256), 256, 0, s>>>(x, n);")
    result = mechanism.apply(kernel, _guarded(kernel)[0], Carrier(max_blocks=64)).text
    assert "for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n; i += gridDim.y * " in result
    assert "    if (x[i] < 0.0f) continue;\n" in result
    assert "k<<<dim3(1, (unsigned)min((int64_t)((n + 256 - 1) / 256), (int64_t)64)), 256," in (
        result
    )


_Z_INDEX = "  int64_t row = (int64_t)blockIdx.x * blockDim.z + threadIdx.z;\n"
_Z_BODY = "    const float* x = inp + row * cols;\n"
_Z_END = "x[c] * scale;\n  }\n"


@pytest.mark.parametrize(
    ("case", "old", "new", "reason"),
    [
        ("z_rows", _Z_BODY, f"    row = min(row, rows - 1);\n{_Z_BODY}", "index row is written"),
        ("z_rows", _Z_END, f"{_Z_END}  if (row == 0) out[0] = 0.f;\n", "read after the guard"),
        (  # a lane's continue would meet the others at another shuffle
            "z_rows",
            _Z_BODY,
            f"{_Z_BODY}    if (cols == 0) return;\n",
            "returns in a kernel holding __shfl_xor_sync",
        ),
        (
            "z_rows",
            _Z_INDEX,
            "  const int64_t first_row = (int64_t)blockIdx.x * blockDim.z;\n"
            "  int64_t row = first_row + threadIdx.z;\n",
            "not written as one term `blockIdx.x * S`",
        ),
        (
            "z_rows",
            _Z_BODY,
            f"{_Z_BODY}    if (row + gridDim.x * blockDim.z < rows) out[0] = 0.f;\n",
            "also reads gridDim.x",
        ),
        (
            "bias_atomic",
            "  for (int offset",
            "  acc += (float)blockIdx.y;\n  for (int offset",
            "also reads blockIdx.y in `(float)blockIdx.y`",
        ),
    ],
)
def test_a_guarded_index_outside_the_form_is_refused_with_its_form(
    case: str, old: str, new: str, reason: str
) -> None:
    text = _fixture(f"{case}.after.cu")
    assert old in text
    kernel = KernelSource(text.replace(old, new, 1))
    (site,) = _guarded(kernel)
    assert reason in str(site.refusal), site.refusal
    assert "one item per thread along gridDim" in str(site.refusal)
    assert "this rule needs `T i = blockIdx.d * S + L; if (i < n) ...`" in str(site.refusal)
    with pytest.raises(MechanismRefused):
        mechanism.apply(kernel, site)


def test_a_return_with_code_after_the_guard_is_refused() -> None:
    body = (
        "  int i = blockIdx.y * blockDim.x + threadIdx.x;\n"
        "  if (i < n) {\n    if (x[i] < 0.0f) return;\n    x[i] = 1.0f;\n  }\n"
        "  if (threadIdx.x == 0) x[0] = 0.0f;"
    )
    (site,) = _guarded(_kernel(body))
    assert "returns (it would end the thread's other items)" in str(site.refusal)


def test_a_guarded_index_inside_a_loop_it_would_leave_is_refused() -> None:
    body = (
        "  for (int k = 0; k < 4; ++k) {\n"
        "    int i = blockIdx.y * blockDim.x + threadIdx.x;\n"
        "    if (i < n) {\n      if (x[i] < 0.0f) break;\n      x[i] += 1.0f;\n    }\n  }"
    )
    (site,) = _guarded(_kernel(body))
    assert "leaves a loop around it (`break;`)" in str(site.refusal)


def test_a_cap_is_refused_where_no_launch_can_take_it() -> None:
    body = "  int i = blockIdx.y * blockDim.x + threadIdx.x;\n  if (i < n) x[i] = 0.0f;"
    kernel = _kernel(body, launch="(void)s;")
    (site,) = _guarded(kernel)
    assert site.supported  # without a cap the grid stays, wherever it is launched
    assert "i += gridDim.y * blockDim.x" in mechanism.apply(kernel, site).text
    with pytest.raises(MechanismRefused, match="whose launch cannot take a capped grid"):
        mechanism.apply(kernel, site, Carrier(max_blocks=8))
