"""The warp_shuffle_reduction mechanism: fixtures both ways, the exchange's exact lane
arithmetic, refusals, and the experts (softmax, fused_add_rmsnorm)."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast, BlockSizeMultiple
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get, remove_all
from klineage.mechanisms._reductions_exchange import partner_index
from klineage.mining.removal import reapply, remove_mechanism
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import (
    PUBLIC_FORMS,
    RoundTripSuite,
    compile_ok,
    fixture_pairs,
    forward_chain,
    removal_chain,
)

mechanism = get("warp_shuffle_reduction")


class TestWarpShuffleReduction(RoundTripSuite):
    mechanism = "warp_shuffle_reduction"


def _device(body: str, qualifiers: str = "__device__", params: str = "float v") -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n"
        f"{qualifiers} float f({params}) {{\n{body}\n  return v;\n}}\n"
        "__global__ void use(float* y) { y[threadIdx.x] = f(y[threadIdx.x]); }\n"
    )


LOOP = "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);"


@pytest.mark.parametrize(
    ("shuffle", "read"),
    [
        ("__shfl_xor_sync(0xffffffffu, v, o)", "xchg[xchg_warp][xchg_lane ^ o]"),
        (
            "__shfl_down_sync(0xffffffffu, v, o)",
            "xchg[xchg_warp][xchg_lane + o < 32 ? xchg_lane + o : xchg_lane]",
        ),
    ],
)
def test_each_lane_reads_the_shuffle_source_lane(shuffle: str, read: str) -> None:
    source = _device(f"  for (int o = 16; o > 0; o >>= 1) v += {shuffle};")
    removed = remove_all(source, mechanism)
    assert f"v += {read};" in removed.text
    assert removed.text.count("__syncwarp();") == 2
    assert "__shared__ float xchg[32][32];" in removed.text


def test_an_unrolled_step_is_rewritten_in_place() -> None:
    source = _device(
        "  v += __shfl_xor_sync(0xffffffffu, v, 16);\n  v += __shfl_xor_sync(~0u, v, 8);"
    )
    removed = remove_all(source, mechanism)
    assert "v += xchg[xchg_warp][xchg_lane ^ 16];" in removed.text
    assert "v += xchg[xchg_warp][xchg_lane ^ 8];" in removed.text
    assert removed.text.count("__shared__") == 1


@pytest.mark.parametrize(
    ("body", "qualifiers", "reason"),
    [
        (LOOP.replace("0xffffffffu", "0x0000ffffu"), "__device__", "not a full-warp constant"),
        (LOOP.replace("0xffffffffu", "__activemask()"), "__device__", "not a full-warp constant"),
        (LOOP.replace("o = 16", "o = 32"), "__device__", "outside 0..31"),
        (LOOP.replace("o > 0", "o != 3"), "__device__", "cannot be worked out"),
        (LOOP.replace(", o)", ", o, 16)"), "__device__", "not below the width 16"),
        (LOOP.replace(", o)", ", o, 12)"), "__device__", "not a constant power of two"),
        (LOOP.replace(", o)", ", o, 64)"), "__device__", "not a constant power of two"),
        (
            "  int seg = threadIdx.x & 7;\n" + LOOP.replace(", o)", ", o, seg)"),
            "__device__",
            "width seg, not a constant power of two",
        ),
        (
            "  float w = v;\n  for (int o = 16; o > 0; o >>= 1) {\n"
            "    w += __shfl_xor_sync(~0u, v, o);\n"
            "    v += __shfl_xor_sync(~0u, w, o);\n  }",
            "__device__",
            "assigns w, which a later shuffle of the step publishes (w)",
        ),
        (
            "  float a, b;\n  for (int o = 16; o > 0; o >>= 1) {\n"
            "    a = __shfl_xor_sync(~0u, v, o);\n"
            "    v += a;\n"
            "    b = __shfl_xor_sync(~0u, v, o);\n  }",
            "__device__",
            "not all in the leading statements",
        ),
        (LOOP, "__host__ __device__", "also compiles for the host"),
        (LOOP.replace("v, o)", "v * 2.0f, o)"), "__device__", "not a variable or a field"),
        (
            "  for (int o = 16; o > 0; o >>= 1) { v *= 1.0f; v += __shfl_xor_sync(~0u, v, o); }",
            "__device__",
            "not all in the leading statements",
        ),
        (
            "  for (int o = 16; o > 0; o >>= 1) v = (v += 1.0f) + __shfl_xor_sync(~0u, v, o);",
            "__device__",
            "writes a variable inside an expression",
        ),
        (
            "  switch (v > 0.f) { case 1: v += __shfl_xor_sync(~0u, v, 1); }",
            "__device__",
            "not directly inside a block or an if",
        ),
    ],
)
def test_non_canonical_steps_are_detected_but_refused(
    body: str, qualifiers: str, reason: str
) -> None:
    source = _device(body, qualifiers)
    (site,) = mechanism.detect(source)
    assert site.refusal is not None and reason in site.refusal
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.remove(source, site)
    assert remove_all(source, mechanism) is source


def test_a_taken_exchange_name_is_refused() -> None:
    source = _device(LOOP, params="float v, int xchg_lane")
    (site,) = mechanism.detect(source)
    assert "xchg_lane" in (site.refusal or "")


def test_scans_belong_to_warp_shuffle_scan() -> None:
    scan = _device("  for (int o = 1; o < 32; o <<= 1) v += __shfl_up_sync(~0u, v, o);")
    assert mechanism.detect(scan) == []
    mixed = _device(
        "  for (int o = 1; o < 32; o <<= 1) v += __shfl_up_sync(~0u, v, o) + "
        "__shfl_xor_sync(~0u, v, o);"
    )
    (site,) = mechanism.detect(mixed)
    assert "mixes" in (site.refusal or "")


def test_the_mask_comes_back_from_the_carrier() -> None:
    source = _device(LOOP.replace("0xffffffffu", "kMask"))
    source = KernelSource("constexpr unsigned kMask = 0xffffffffu;\n" + source.text)
    (site,) = mechanism.detect(source)
    assert mechanism.carrier_of(source, site) == Carrier(mask="kMask")
    removed = mechanism.remove(source, site)
    (candidate,) = mechanism.candidates(removed)
    assert "__shfl_xor_sync(0xffffffffu, v, o)" in mechanism.apply(removed, candidate).text
    with pytest.raises(MechanismRefused, match="not a constant name"):
        mechanism.apply(removed, candidate, Carrier(mask="a + b"))


def test_conditions_need_whole_warps_and_sm30() -> None:
    source = KernelSource.from_file(
        __import__("tests.conftest", fromlist=["REPO"]).REPO
        / "expert_kernels"
        / "fused_add_rmsnorm"
        / "kernel.cu"
    )
    (site,) = mechanism.detect(source)
    multiple, arch = mechanism.conditions(source, site)
    assert isinstance(multiple, BlockSizeMultiple) and multiple.k == 32
    assert isinstance(arch, ArchAtLeast) and arch.sm == 30


def test_experts_are_detected_where_listed() -> None:
    assert_detected_where_listed("warp_shuffle_reduction")


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    refusals = check_expert_removals_compile("warp_shuffle_reduction", mechanism_builder)
    assert refusals == []


def test_straight_line_shuffles_mid_function_come_back_exactly() -> None:
    # fmha's epilogue: quad sums of two row sums after other statements, no loop
    kernel = KernelSource(
        "__global__ void k(float* y) {\n"
        "  float l0 = y[threadIdx.x], l1 = 2.0f * l0;\n"
        "  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);\n"
        "  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);\n"
        "  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);\n"
        "  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);\n"
        "  y[threadIdx.x] = l0 + l1;\n"
        "}\n"
    )
    removal = remove_mechanism(kernel, get("warp_shuffle_reduction"))
    assert len(removal.sites) == 4 and "__shfl" not in removal.simplified.text
    assert len(mechanism.candidates(removal.simplified)) == 4
    assert reapply(removal).text == kernel.text  # the exchange buffer and lane math gone too


# -- shuffle steps in the forms public experts write --------------------------------------------


def _comes_back_exactly(kernel: KernelSource, subject: str = "warp_shuffle_reduction") -> str:
    """Remove every site, check no shuffle is left and re-applying gives the kernel back;
    return the removed text."""
    removal = remove_mechanism(kernel, get(subject))
    assert removal.sites and "__shfl" not in removal.simplified.text
    assert reapply(removal).text == kernel.text
    return removal.simplified.text


MERGE_PAIRS = """#include <cuda_runtime.h>
struct __align__(8) MaxSum {
  float m;
  float d;
};
template <const int kLanes = 32>
__device__ __forceinline__ MaxSum merge_lanes(MaxSum value) {
  unsigned int mask = 0xffffffff;
#pragma unroll
  for (int stride = kLanes >> 1; stride >= 1; stride >>= 1) {
    MaxSum other;
    other.m = __shfl_xor_sync(mask, value.m, stride);
    other.d = __shfl_xor_sync(mask, value.d, stride);
    const bool mine = value.m > other.m;
    const MaxSum big = mine ? value : other;
    const MaxSum small = mine ? other : value;
    value.d = big.d + small.d * __expf(small.m - big.m);
    value.m = big.m;
  }
  return value;
}
__global__ void k(const float* x, float* y) {
  MaxSum v{x[threadIdx.x], 1.0f};
  v = merge_lanes<32>(v);
  if (threadIdx.x == 0) y[0] = v.m + logf(v.d);
}
"""


@pytest.mark.nvcc
def test_a_declared_partner_and_a_local_full_mask_are_kept_where_they_are(
    mechanism_builder: Builder,
) -> None:
    # a public idiom: the partner's fields shuffled into a struct declared at the top of the
    # step, through a mask held in a local
    kernel = KernelSource(MERGE_PAIRS)
    removed = _comes_back_exactly(kernel)
    step = removed[removed.index("MaxSum other;") :]
    assert step.index("xchg1[xchg_warp][xchg_lane] = value.d;") < step.index("__syncwarp();")
    assert "other.d = xchg1[xchg_warp][xchg_lane ^ stride];" in step
    compile_ok(mechanism_builder, [KernelSource(removed)])
    written = KernelSource(MERGE_PAIRS.replace("#pragma unroll\n", "  mask >>= 0;\n"))
    (site,) = mechanism.detect(written)
    assert site.refusal == "the mask mask is not a full-warp constant"


PAIR_LOOP = """  float w = 2.0f * v, a, b;
  for (int o = warpSize / 2; o > 0; o >>= 1) {
    __syncwarp();
    a = __shfl_down_sync(0xffffffffu, v, o);
    b = __shfl_down_sync(0xffffffffu, w, o);
    v = fmaxf(v, a);
    w += b;
  }
  v += w;"""


def test_leading_shuffles_of_a_step_publish_every_value_first() -> None:
    source = _device(PAIR_LOOP)
    (site,) = mechanism.detect(source)
    assert site.supported and site.node_kind == "for_statement", site.refusal
    removed = _comes_back_exactly(source)
    assert (
        "    __syncwarp();\n"
        "    xchg[xchg_warp][xchg_lane] = v;\n"
        "    xchg1[xchg_warp][xchg_lane] = w;\n"
        "    __syncwarp();\n"
        "    a = xchg[xchg_warp][xchg_lane + o < 32 ? xchg_lane + o : xchg_lane];\n"
        "    b = xchg1[xchg_warp][xchg_lane + o < 32 ? xchg_lane + o : xchg_lane];\n"
        "    __syncwarp();\n"
        "    v = fmaxf(v, a);\n"
    ) in removed
    (candidate,) = mechanism.candidates(KernelSource(removed))
    assert candidate.node_kind == "for_statement"  # the loop, as the removed site was


def test_a_step_may_assign_what_only_its_own_or_earlier_shuffles_publish() -> None:
    source = _device(
        "  float w = v;\n  for (int o = 16; o > 0; o >>= 1) {\n"
        "    v += __shfl_xor_sync(0xffffffffu, v, o);\n"
        "    w += __shfl_xor_sync(0xffffffffu, w, o) + __shfl_xor_sync(0xffffffffu, v, o);\n"
        "  }\n  v += w;"
    )
    (site,) = mechanism.detect(source)
    assert "assigns v" in (site.refusal or "")  # v is published again after its update
    reordered = _device(
        "  float w = v;\n  for (int o = 16; o > 0; o >>= 1) {\n"
        "    w += __shfl_xor_sync(0xffffffffu, w, o) + __shfl_xor_sync(0xffffffffu, v, o);\n"
        "    v += __shfl_xor_sync(0xffffffffu, v, o);\n  }\n  v += w;"
    )
    (site,) = mechanism.detect(reordered)
    assert site.supported, site.refusal
    _comes_back_exactly(reordered)


UNROLLED = """  float parts[2] = {v, 2.0f * v};
  for (int k = 0; k < 2; ++k) {
    float t = parts[k];
    t += FIRST;
    t += SECOND;
    v += t;
  }"""


@pytest.mark.parametrize(
    ("first", "second", "index"),
    [
        (
            "__shfl_down_sync(0xffffffff, t, 1, 4)",
            "__shfl_down_sync(0xffffffff, t, 2, 4)",
            "xchg_lane % 4 + 1 < 4 ? xchg_lane + 1 : xchg_lane",
        ),
        (
            "__shfl_xor_sync(0xffffffff, t, 1, kSegment)",
            "__shfl_xor_sync(0xffffffff, t, 8, kSegment)",
            "xchg_lane ^ (1 % kSegment)",
        ),
        (
            "__shfl_down_sync(0xffffffff, t, 16, warpSize)",
            "__shfl_xor_sync(0xffffffff, t, 1)",
            "xchg_lane % warpSize + 16 < warpSize ? xchg_lane + 16 : xchg_lane",
        ),
    ],
)
def test_unrolled_steps_inside_a_loop_over_something_else_are_steps_of_their_own(
    first: str, second: str, index: str
) -> None:
    body = UNROLLED.replace("FIRST", first).replace("SECOND", second)
    source = KernelSource("constexpr int kSegment = 16;\n" + _device(body).text)
    sites = mechanism.detect(source)
    assert [s.node_kind for s in sites] == ["expression_statement"] * 2
    assert all(s.supported for s in sites), [s.refusal for s in sites]
    removed = _comes_back_exactly(source)
    assert f"t += xchg[xchg_warp][{index}];" in removed


def test_a_scan_step_with_a_width_comes_back_too() -> None:
    body = (
        "  for (int o = 1; o < 8; o <<= 1) {\n    v += __shfl_up_sync(0xffffffffu, v, o, 8);\n  }"
    )
    removed = _comes_back_exactly(_device(body), "warp_shuffle_scan")
    assert "v += xchg[xchg_warp][xchg_lane % 8 >= o ? xchg_lane - o : xchg_lane];" in removed


def test_a_mask_passed_in_stays_refused_and_named() -> None:
    # cuda-samples' warpReduceSum: the caller's mask may leave lanes out, which the exchange
    # (every lane publishes and reads) cannot mirror
    source = KernelSource(
        "template <class T> __device__ T sum_lanes(unsigned int mask, T x) {\n"
        "  for (int o = warpSize / 2; o > 0; o /= 2) x += __shfl_down_sync(mask, x, o);\n"
        "  return x;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert site.refusal == "the mask mask is not a full-warp constant"


@pytest.mark.parametrize(
    "case", ["online_pairs", "quad_columns", "template_width", "macro_dispatch"]
)
def test_the_public_form_pairs_come_back_by_apply(case: str) -> None:
    (pair,) = [p for p in fixture_pairs(mechanism.name, PUBLIC_FORMS) if p.case == case]
    forward_chain(mechanism, removal_chain(mechanism, pair.before))


def _shuffle_source_lane(kind: str, lane: int, offset: int, width: int) -> int:
    """The lane a ``__shfl_{kind}_sync(mask, v, offset, width)`` reads, as the PTX ISA
    defines ``shfl.sync``: CUDA passes the segment mask ``32 - width`` and a clamp of 31
    (0 for up); a lane whose source falls outside its segment reads its own value."""
    segment_mask = 32 - width
    clamp = 0 if kind == "up" else 31
    bound = (lane & segment_mask) | (clamp & ~segment_mask & 31)
    delta = offset & 31
    if kind == "up":
        source, valid = lane - delta, lane - delta >= bound
    elif kind == "down":
        source, valid = lane + delta, lane + delta <= bound
    else:
        source, valid = lane ^ delta, (lane ^ delta) <= bound
    return source if valid else lane


def test_the_partner_index_is_the_shuffle_source_lane_for_every_lane_offset_and_width() -> None:
    cases = [
        (kind, width, offset, lane)
        for kind in ("xor", "down", "up")
        for width in (None, 1, 2, 4, 8, 16, 32)
        for offset in range(32)
        for lane in range(32)
        # an xor past the width is refused: the exchange writes lane ^ off
        if not (kind == "xor" and width is not None and offset >= width)
    ]
    lines = [
        f"constexpr int p{i} = "
        f"{partner_index(kind, str(off), None if w is None else str(w), lane=str(lane))};"
        for i, (kind, w, off, lane) in enumerate(cases)
    ]
    # the C expressions the removal writes, evaluated with C's precedence by the constant folder
    values = KernelSource("\n".join(lines)).parsed.integer_constants
    wrong = [
        case
        for i, case in enumerate(cases)
        if values[f"p{i}"] != _shuffle_source_lane(case[0], case[3], case[2], case[1] or 32)
    ]
    assert len(values) == len(cases) and wrong == []


def test_an_xor_past_the_width_would_leave_its_segment() -> None:
    # why it is refused: some lanes read a lower segment, which lane ^ off does not say
    assert _shuffle_source_lane("xor", 4, 4, 4) == 0
    assert _shuffle_source_lane("xor", 0, 4, 4) == 0


# -- a naive block tree reduction, finished by shuffles ----------------------------------------

TREE_KERNEL = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void row_sum_tree(const float* x, float* y, int64_t cols) {
  __shared__ float partial[256];
  const int tid = threadIdx.x;
  const float* row = x + (int64_t)blockIdx.x * cols;
  float acc = 0.0f;
  for (int64_t c = tid; c < cols; c += blockDim.x) acc += row[c];
  partial[tid] = acc;
  __syncthreads();
  for (int s = START; s > 0; s >>= 1) {
    if (tid < s) STEP;
    __syncthreads();
  }
  if (tid == 0) y[blockIdx.x] = partial[0];
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  row_sum_tree<<<(unsigned)rows, BLOCK, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
"""
SUM_STEP = "partial[tid] += partial[tid + s]"


def _tree(start: str = "blockDim.x / 2", step: str = SUM_STEP, block: str = "256") -> KernelSource:
    text = TREE_KERNEL.replace("START", start).replace("STEP", step).replace("BLOCK", block)
    return KernelSource(text)


def _tree_candidate(kernel: KernelSource) -> Site:
    (site,) = [c for c in mechanism.candidates(kernel) if c.detail.get("kind") == "block_tree"]
    return site


@pytest.mark.parametrize(
    ("start", "step", "shuffle_step"),
    [
        (
            "blockDim.x / 2",
            SUM_STEP,
            "kl_tail += __shfl_down_sync(0xffffffffu, kl_tail, kl_offset);",
        ),
        (
            "128",
            "partial[tid] = fmaxf(partial[tid], partial[tid + s])",
            "kl_tail = fmaxf(kl_tail, __shfl_down_sync(0xffffffffu, kl_tail, kl_offset));",
        ),
    ],
)
def test_a_block_tree_ends_in_warp_shuffles(start: str, step: str, shuffle_step: str) -> None:
    naive = _tree(start, step)
    assert not mechanism.detect(naive)
    finished = mechanism.apply(naive, _tree_candidate(naive))
    assert KernelSource(finished.text).parsed.errors == ()
    assert f"for (int s = {start}; s > 16; s >>= 1)" in finished.text
    assert shuffle_step in finished.text
    assert "if (tid == 0) partial[0] = kl_tail;" in finished.text
    (site,) = mechanism.detect(finished)
    assert site.detail["kind"] == "down" and site.supported
    assert not [c for c in mechanism.candidates(finished) if c.detail.get("kind") == "block_tree"]


@pytest.mark.parametrize(
    ("kernel", "reason"),
    [
        (_tree(block="dim3(16, 16)"), "not one constant 1-D size"),
        (_tree(block="48"), "power of two of at least 16"),
        (_tree(start="8", block="16"), "power of two of at least 16"),
        (_tree(start="256"), "do not cover the tree of 512 values"),
        (
            KernelSource(
                _tree().text.replace(
                    "  if (tid == 0) y[blockIdx.x] = partial[0];",
                    "  y[blockIdx.x * 256 + tid] = partial[tid];",
                )
            ),
            "partial[tid] is read at line",
        ),
        (
            KernelSource(_tree().text.replace("  partial[tid] = acc;\n  __syncthreads();\n", "")),
            "not right after partial[tid] = ...",
        ),
    ],
)
def test_a_tree_whose_rewrite_would_not_be_exact_is_refused(
    kernel: KernelSource, reason: str
) -> None:
    site = _tree_candidate(kernel)
    assert reason in (site.refusal or "")
    with pytest.raises(MechanismRefused):
        mechanism.apply(kernel, site)


@pytest.mark.nvcc
def test_the_finished_trees_compile(mechanism_builder: Builder) -> None:
    from tests.mechanisms.roundtrip import compile_ok

    sums = _tree()
    maxima = _tree("128", "partial[tid] = fmaxf(partial[tid], partial[tid + s])")
    compile_ok(mechanism_builder, [mechanism.apply(k, _tree_candidate(k)) for k in (sums, maxima)])


MASK_PARAMETER = "mask_parameter"


def _mask_parameter_kernel() -> KernelSource:
    (pair,) = [p for p in fixture_pairs(mechanism.name) if p.case == MASK_PARAMETER]
    return pair.before


def test_a_mask_parameter_every_caller_passes_full_comes_back_with_its_name() -> None:
    kernel = _mask_parameter_kernel()
    (site,) = mechanism.detect(kernel)
    assert site.supported
    assert mechanism.carrier_of(kernel, site) == Carrier(mask="lanes")
    removed = _comes_back_exactly(kernel)
    assert "v += xchg[xchg_warp][xchg_lane + step < 32 ? xchg_lane + step : xchg_lane];" in (
        removed
    )


def test_a_ballot_passed_as_the_mask_is_refused_and_named() -> None:
    # the sample's final warp: the ballot holds only the lanes that read a warp total, and the
    # others publish nothing to the exchange
    text = (
        _mask_parameter_kernel()
        .text.replace(
            "  if (t < 32) {\n",
            "  const unsigned int live = __ballot_sync(kAllLanes, t < kThreads / 32);\n"
            "  if (t < kThreads / 32) {\n",
        )
        .replace("lane_total<float>(0xffffffff, acc)", "lane_total<float>(live, acc)")
    )
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    assert site.refusal == (
        "the mask lanes is a parameter of lane_total that its callers do not all pass as a "
        "full-warp constant (block_totals passes live (`__ballot_sync(kAllLanes, t < kThreads "
        "/ 32)`), a ballot holding only the lanes where `t < kThreads / 32`), and the exchange "
        "through shared memory needs every lane of the warp"
    )


def test_a_mask_computed_from_the_block_size_is_refused_and_named() -> None:
    text = _mask_parameter_kernel().text.replace(
        "  acc = lane_total<float>(kAllLanes, acc);\n",
        "  const unsigned int lanes = kAllLanes >> ((32 - (kThreads & 31)) & 31);\n"
        "  acc = lane_total<float>(lanes, acc);\n",
    )
    (site,) = mechanism.detect(KernelSource(text))
    assert not site.supported
    assert "block_totals passes lanes (`kAllLanes >> ((32 - (kThreads & 31)) & 31)`)" in str(
        site.refusal
    )
