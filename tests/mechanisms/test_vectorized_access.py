"""The vectorized_access mechanism: fixtures both ways, experts, heldout kernels, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import AxisDivisible, PointerAlignment
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, Site, get
from klineage.mechanisms.recall import detection_recall
from klineage.mining.removal import apply_everywhere, candidate_in, reapply, remove_mechanism
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host
from tests.mechanisms.roundtrip import (
    FIXTURES,
    RoundTripSuite,
    compile_ok,
    forward_chain,
    removal_chain,
)

NAME = "vectorized_access"
mechanism = get(NAME)


class TestVectorizedAccess(RoundTripSuite):
    mechanism = NAME


def listing_experts(name: str) -> list[Path]:
    """The expert kernel folders whose mechanisms.json lists ``name``."""
    return [
        listed.parent
        for listed in sorted((REPO / "expert_kernels").glob("*/mechanisms.json"))
        if any(entry["mechanism"] == name for entry in json.loads(listed.read_text()))
    ]


EXPERTS = listing_experts(NAME)


@pytest.mark.parametrize("expert", EXPERTS, ids=[p.name for p in EXPERTS])
def test_detect_finds_what_the_expert_lists(expert: Path) -> None:
    listed = [
        e for e in json.loads((expert / "mechanisms.json").read_text()) if e["mechanism"] == NAME
    ]
    report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
    assert report.recall == 1.0, str(report)


@pytest.mark.nvcc
def test_every_expert_site_is_removable_and_compiles(mechanism_builder: Builder) -> None:
    """Each site of each listing expert comes out on its own (one site fewer, a re-parse
    without errors); removed one after another, the kernel without any compiles."""
    without = []
    for expert in EXPERTS:
        kernel = KernelSource.from_file(expert / "kernel.cu")
        sites = mechanism.detect(kernel)
        assert sites and all(s.supported for s in sites), [str(s) for s in sites]
        for site in sites:
            assert len(mechanism.detect(mechanism.remove(kernel, site))) == len(sites) - 1
        chain = removal_chain(mechanism, kernel)
        assert len(chain.sites) == len(sites)
        without.append(KernelSource(chain.states[-1].text, name=f"{expert.name}-scalar"))
    compile_ok(mechanism_builder, without)


def test_softmax_sites_read_their_alignment_back_to_the_problem() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels/softmax/kernel.cu")
    for site in mechanism.detect(kernel):
        conditions = mechanism.conditions(kernel, site)
        assert AxisDivisible(axis="cols", k=4) in [
            c.model_copy(update={"why": ""}) for c in conditions
        ]
        assert any(isinstance(c, PointerAlignment) and c.bytes == 16 for c in conditions)


def test_rmsnorm_uint4_needs_hidden_divisible_by_8() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels/fused_add_rmsnorm/kernel.cu")
    (load, *_) = mechanism.detect(kernel)
    axes = [c for c in mechanism.conditions(kernel, load) if isinstance(c, AxisDivisible)]
    assert [(c.axis, c.k) for c in axes] == [("hidden", 8)]


# ---------------------------------------------------------------------------------------------
# Forward, on the heldout naive kernels
# ---------------------------------------------------------------------------------------------

HELDOUT = {
    "gelu": ("kernel", 4, "float4"),
    "bias_relu": ("kernel", 8, "uint4"),
    "row_sum": ("loop", 4, "float4"),
    "embedding_gather": ("kernel", 8, "uint4"),  # an early exit that also stores
}


@pytest.mark.nvcc
def test_heldout_kernels_vectorize_and_compile(mechanism_builder: Builder) -> None:
    applied = []
    for name, (form, width, vector) in HELDOUT.items():
        kernel = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        (candidate,) = [c for c in mechanism.candidates(kernel) if c.detail["form"] == form]
        result = mechanism.apply(kernel, candidate)
        (site,) = [s for s in mechanism.detect(result) if s.detail["form"] == form]
        assert site.supported and mechanism.carrier_of(result, site) == Carrier(vector_width=width)
        assert f"reinterpret_cast<const {vector}*>" in result.text or vector in result.text
        again = mechanism.remove(result, site)
        assert not [s for s in mechanism.detect(again) if s.detail["form"] == form]
        applied.append(KernelSource(result.text, name=f"{name}-vectorized"))
    compile_ok(mechanism_builder, applied)


def test_a_kernel_grid_shrinks_by_the_width() -> None:
    kernel = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    (candidate,) = mechanism.candidates(kernel)
    result = mechanism.apply(kernel, candidate, Carrier(vector_width=2))
    assert "const float2 x_vec = reinterpret_cast<const float2*>(x)[i_vec];" in result.text
    assert "gelu_tanh<<<(unsigned)((n + 2 * 256 - 1) / (2 * 256)), 256, 0, stream>>>" in result.text
    with pytest.raises(MechanismRefused, match="no 32-byte vector"):
        mechanism.apply(kernel, candidate, Carrier(vector_width=8))


def test_loop_conditions_name_the_row_length() -> None:
    kernel = KernelSource.from_file(FIXTURES / NAME / "loop.after.cu")
    candidate = mechanism.candidates(kernel)[-1]
    conditions = mechanism.conditions(kernel, candidate)
    assert {(c.axis, c.k) for c in conditions if isinstance(c, AxisDivisible)} == {("cols", 8)}
    assert {c.tensor for c in conditions if isinstance(c, PointerAlignment)} == {"z", "w"}


DISPATCHED_ROWS = """
namespace narrow_rows {
__global__ void shift_rows(const float* x, float* y, long rows, long cols) {
  const long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* out = y + r * cols;
  for (long c = 0; c < cols; ++c) out[c] = x[r * cols + c] + 1.0f;
}
int launch(const float* x, float* y, long rows, long cols, cudaStream_t stream) {
  shift_rows<<<(unsigned)((rows + 255) / 256), 256, 0, stream>>>(x, y, rows, cols);
  return 0;
}
}  // namespace narrow_rows

extern "C" int run(const float* x, float* y, long rows, long cols, cudaStream_t stream) {
  return narrow_rows::launch(x, y, rows, cols, stream);
}
"""


def test_a_row_pointer_reached_through_a_qualified_call_names_its_axis() -> None:
    # a launch-size dispatch calls each variant's host function in its own namespace: the
    # row length must still read back to the problem's axis, so that a workload of odd rows
    # drops the plain vectors (or takes the peeled ones) before a gate run faults on them
    kernel = KernelSource(DISPATCHED_ROWS)
    sites = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop"]
    assert sites
    conditions = mechanism.conditions(kernel, sites[0])
    assert ("cols", 4) in {(c.axis, c.k) for c in conditions if isinstance(c, AxisDivisible)}


# ---------------------------------------------------------------------------------------------
# Refusals and non-candidates
# ---------------------------------------------------------------------------------------------


def _device(body: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__device__ void take(float4& v) { v.x = 0.0f; }\n"
        "__global__ void k(const float4* p4, float4* q4, float* y, int64_t n) {\n"
        f"{body}\n}}\n"
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("  int64_t i = 0;\n  float4 a = p4[i++];", "side effects"),
        ("  float4& r = q4[0];\n  r.x = 1.0f;", "reference"),
        ("  take(q4[1]);", "by reference"),
        ("  float4 a, b = make_float4(0, 0, 0, 0);\n  a = (q4[0] = b);", "value is used"),
    ],
)
def test_unsafe_accesses_are_detected_but_refused(body: str, reason: str) -> None:
    sites = mechanism.detect(_device(body))
    assert sites and all(s.refusal for s in sites)
    assert reason in (sites[0].refusal or "")
    with pytest.raises(MechanismRefused):
        mechanism.remove(_device(body), sites[0])


def test_component_and_register_accesses_are_not_vector_accesses() -> None:
    body = "  float4 v[2];\n  v[0] = v[1];\n  y[0] = p4[0].x;\n  q4[1].y = 2.0f;"
    assert mechanism.detect(_device(body)) == []


@pytest.mark.parametrize(
    "loop",
    [
        "for (int64_t c = 0; c < n; ++c) { if (y[c] > 0.0f) break; y[c] = 1.0f; }",
        "for (int64_t c = 0; c < n; ++c) { if (c > 2) y[c] = 0.0f; }",
        "for (int64_t c = 0; c < n; ++c) y[c + 1] = y[c];",
        "for (int64_t c = 0; c < n; ++c) { __syncthreads(); y[c] = 0.0f; }",
    ],
)
def test_loops_that_cannot_be_split_into_lanes_are_not_candidates(loop: str) -> None:
    kernel = _device(f"  {loop}")
    assert [c for c in mechanism.candidates(kernel) if c.detail["form"] == "loop"] == []


def test_a_tampered_vector_loop_is_not_taken_for_the_canonical_form() -> None:
    text = (FIXTURES / NAME / "loop.before.cu").read_text()
    tampered = KernelSource(text.replace("acc += row[c];", "acc += 2.0f * row[c];"))
    forms = [s.detail["form"] for s in mechanism.detect(tampered)]
    assert "loop" in forms and forms.count("loop") == 1  # only the bf16 loop is canonical
    assert "load" in forms  # the float4 load of the tampered loop is reported on its own


def test_the_same_names_twice_are_refused() -> None:
    kernel = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    clashing = KernelSource(kernel.text.replace("k_beta", "x_vec"))
    (candidate,) = mechanism.candidates(clashing)
    with pytest.raises(MechanismRefused, match="already used"):
        mechanism.apply(clashing, candidate)


def test_a_store_through_a_cast_splits_and_merges_back() -> None:
    body = "  *reinterpret_cast<float2*>(y + 2 * n) = make_float2(1.0f, 2.0f);"
    kernel = _device(body)
    (site,) = mechanism.detect(kernel)
    split = mechanism.remove(kernel, site)
    assert "float* elems = reinterpret_cast<float*>(reinterpret_cast<float2*>(y + 2 * n));" in (
        split.text
    )
    (candidate,) = mechanism.candidates(split)
    assert mechanism.apply(split, candidate).text == kernel.text


ADDRESS_MACROS = FIXTURES.parent / "public_forms" / "vectorized_access" / "address_macros"


def test_access_macros_split_and_merge_back_into_the_macro() -> None:
    kernel = KernelSource.from_file(ADDRESS_MACROS.with_suffix(".before.cu"))
    sites = mechanism.detect(kernel)
    assert [(s.detail["form"], s.detail["access"]) for s in sites] == [
        ("store", "macro"),
        ("load", "macro"),
        ("store", "macro"),
        ("load", "macro"),
    ]
    chain = removal_chain(mechanism, kernel)
    assert "float* elems2 = reinterpret_cast<float*>(&(y[idx]));" in chain.states[-1].text
    forward_chain(mechanism, chain)  # every state comes back exactly, FLOAT4(...) included


def test_a_split_merges_into_the_first_macro_of_its_vector_type() -> None:
    body = "  float4 v = WIDE(y[4 * n]);\n  BITS(y[4 * n + 4]) = v;"
    macros = (
        "#define WIDE(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
        "#define BITS(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
    )
    kernel = KernelSource(macros + _device(body).text)
    back = apply_everywhere(removal_chain(mechanism, kernel).states[-1], mechanism, Carrier())
    assert "float4 v = WIDE(y[4 * n]);" in back.text
    assert "WIDE(y[4 * n + 4]) = v;" in back.text  # the same access, spelled with WIDE


@pytest.mark.nvcc
def test_a_walk_respelled_in_the_first_macro_still_applies_again(
    mechanism_builder: Builder,
) -> None:
    # two macros of one body, the second used for a copy whose value is also a macro read:
    # merging the value spells it with the first macro, so the state the store's split is
    # found in differs from the one it is applied to; the walk forward still takes it there
    macros = (
        "#define WIDE(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
        "#define LDST128(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
    )
    body = (
        "  float4 v = WIDE(y[4 * n]);\n  LDST128(y[4 * n + 8]) = LDST128(y[4 * n + 4]);\n  take(v);"
    )
    kernel = KernelSource(macros + _device(body).text)
    removal = remove_mechanism(kernel, mechanism)
    assert len(removal.sites) == 3
    back = reapply(removal)
    assert "WIDE(y[4 * n + 8]) = WIDE(y[4 * n + 4]);" in back.text
    assert back.text == kernel.text.replace("LDST128(y[", "WIDE(y[")
    compile_ok(mechanism_builder, [removal.simplified, back])


def test_an_element_indexed_through_an_arithmetic_macro_has_no_side_effects() -> None:
    macros = (
        "#define FETCH_FLOAT4(pointer) (reinterpret_cast<float4*>(&(pointer))[0])\n"
        "#define OFFSET(row, col, ld) ((row) * (ld) + (col))\n"
    )
    body = "  float4 v = FETCH_FLOAT4(y[OFFSET(n, 4 * threadIdx.x, 64)]);\n  take(v);"
    (site,) = mechanism.detect(KernelSource(macros + _device(body).text))
    assert site.supported and site.detail["access"] == "macro"


def test_a_macro_access_whose_element_has_side_effects_is_refused() -> None:
    macro = "#define WIDE(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
    kernel = KernelSource(macro + _device("  int64_t i = 0;\n  float4 v = WIDE(y[i++]);").text)
    (site,) = mechanism.detect(kernel)
    assert site.refusal == "the address has side effects"


# A packed-struct idiom: loads and stores of 16 bytes through cache-hinted intrinsics inside the
# struct's helpers (__ldcs, __stcs, __stcg), beside plain ones.
HINTED = """#include <stdint.h>
#include <cuda_runtime.h>

struct alignas(16) Pack4 {
  float v[4];
};

__device__ Pack4 load_streaming(const float* at) {
  Pack4 out;
  int4 bits = __ldcs(reinterpret_cast<const int4*>(at));
  memcpy(&out, &bits, sizeof(bits));
  return out;
}

__device__ void store_streaming(float* at, Pack4 value) {
  int4 bits;
  memcpy(&bits, &value, sizeof(bits));
  __stcs(reinterpret_cast<int4*>(at), bits);
}

__device__ void store_global(float* at, float4 value) {
  __stcg(reinterpret_cast<float4*>(at), value);
}

__global__ void scale_rows(const float* x, float* y, float* z, float s, int64_t n4) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  Pack4 p = load_streaming(x + 4 * i);
  for (int k = 0; k < 4; ++k) p.v[k] *= s;
  store_streaming(y + 4 * i, p);
  store_global(z + 4 * i, make_float4(p.v[0], p.v[1], p.v[2], p.v[3]));
}
"""


@pytest.mark.nvcc
def test_cache_hinted_vector_accesses_split_keep_their_hint_and_merge_back(
    mechanism_builder: Builder,
) -> None:
    kernel = KernelSource(HINTED)
    sites = mechanism.detect(kernel)
    assert [(s.detail["form"], s.detail["access"]) for s in sites] == [
        ("load", "hinted"),
        ("store", "hinted"),
        ("store", "hinted"),
    ]
    chain = removal_chain(mechanism, kernel)
    scalar = chain.states[-1]
    assert "__ldcs(reinterpret_cast<const int*>(reinterpret_cast<const int4*>(at)) + 3)" in (
        scalar.text
    )
    assert "__stcs(&elems[3], packed.w);" in scalar.text
    assert "__stcg(&elems[1], packed.y);" in scalar.text
    assert mechanism.detect(scalar) == []
    compile_ok(mechanism_builder, chain.states)
    back = apply_everywhere(scalar, mechanism, Carrier())
    assert back.text == kernel.text


def test_a_hinted_store_whose_address_has_side_effects_is_refused() -> None:
    body = "  int64_t i = 0;\n  __stcs(q4 + i++, make_float4(0, 0, 0, 0));"
    (site,) = mechanism.detect(_device(body))
    assert "side effects" in (site.refusal or "")


# One thread per element, an early exit for invalid ids: every path stores y[i] (the exit
# stores a zero first), so a lane's element is always written.
LOOKUP = """#include <stdint.h>

__global__ void lookup_scale(const float* table, const int32_t* ids, float* y, float s,
                             int64_t vocab, int64_t width, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = i / width;
  const int64_t id = (int64_t)(ids[row] % (int32_t)(2 * vocab));
  if (id < 0 || id >= vocab) {
    y[i] = 0.0f;
    return;
  }
  y[i] = s * table[id * width + (i - row * width)];
}

extern "C" int run(const float* table, const int32_t* ids, float* y, float s, int64_t vocab,
                   int64_t width, int64_t n, cudaStream_t stream) {
  lookup_scale<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(table, ids, y, s, vocab, width, n);
  return 0;
}
"""


def _lookup_cases() -> list[Case]:
    cases = []
    for rows, width in ((7, 5), (4, 8), (3, 1)):  # a tail, whole vectors, one per row
        n = rows * width
        cases.append(
            Case(
                axes={"vocab": 6, "width": width, "n": n, "rows": rows},
                buffers=[
                    Buffer("table", "float", "vocab * width"),
                    Buffer("ids", "int32_t", "rows"),
                    Buffer("y", "float", "n", output=True),
                ],
                call="lookup_scale(table, ids, y, 0.5f, vocab, width, n)",
                threads="n",
            )
        )
    return cases


@pytest.mark.nvcc
def test_an_early_exit_that_stores_becomes_a_lane_continue() -> None:
    kernel = KernelSource(LOOKUP)
    (candidate,) = mechanism.candidates(kernel)
    assert candidate.supported and candidate.detail["pointers"] == "y"
    result = mechanism.apply(kernel, candidate, Carrier(vector_width=4))
    assert "reinterpret_cast<float4*>(y)[i_vec] = y_vec;" in result.text
    assert "return;\n  }" not in result.text.split("i_lane")[1].split("y_vec;")[0]
    want = run_on_host(kernel.text, _lookup_cases())
    assert run_on_host(result.text, _lookup_cases()) == want
    (site,) = mechanism.detect(result)
    assert mechanism.remove(result, site).text.split("extern")[0] == LOOKUP.split("extern")[0]


def test_an_exit_that_skips_the_store_keeps_the_pointer_scalar() -> None:
    """`if (id >= vocab) return;` leaves y[i] unwritten on that path: storing a whole vector
    would write what the lane never computed, so y is not vectorized (nor anything else)."""
    skips = LOOKUP.replace("    y[i] = 0.0f;\n", "")
    assert skips != LOOKUP
    assert not [c for c in mechanism.candidates(KernelSource(skips)) if c.supported]


def _gather_cases(shapes: tuple[tuple[int, int], ...], table_offset: int = 0) -> list[Case]:
    """embedding_gather's host cases, one per (hidden, tokens), over a vocabulary of 9 (the
    host emulator draws ids from -31 to 31: valid ones and NaN rows)."""
    return [
        Case(
            axes={"vocab": 9, "hidden": hidden, "tokens": tokens},
            buffers=[
                Buffer("table", "__nv_bfloat16", "vocab * hidden", offset=table_offset),
                Buffer("ids", "int64_t", "tokens"),
                Buffer("out", "__nv_bfloat16", "tokens * hidden", output=True),
            ],
            call="embedding_gather(table, ids, out, vocab, hidden, tokens)",
            threads="tokens * hidden",
        )
        for hidden, tokens in shapes
    ]


@pytest.mark.nvcc
def test_the_heldout_gather_computes_the_same_bits_on_the_host() -> None:
    """embedding_gather vectorized (8 bf16 lanes) against its naive kernel, ids both valid and
    not (NaN rows), rows shorter than a vector and a tail."""
    kernel = KernelSource.from_file(REPO / "heldout" / "embedding_gather" / "kernel.cu")
    (candidate,) = mechanism.candidates(kernel)
    vectorized = mechanism.apply(kernel, candidate)
    cases = _gather_cases(((8, 6), (5, 7), (3, 2)))
    want = run_on_host(kernel.text, cases)
    assert run_on_host(vectorized.text, cases) == want


# ---------------------------------------------------------------------------------------------
# Chunked warp scans (form=scan): W floats a lane a turn, the scalar loop as the fallback
# ---------------------------------------------------------------------------------------------

SCAN_FIXTURE = FIXTURES / "vectorized_access" / "scan.after.cu"


def _scan_cases(call: str, rows_name: str, cols_name: str) -> list[Case]:
    """Row lengths that are and are not multiples of 4, and rows that start aligned (offset 0)
    and not (offset 1): both paths of the vector form, and rows past one turn of 128."""
    cases = []
    for rows, cols, offset in ((3, 128, 0), (2, 300, 0), (2, 300, 1), (3, 70, 0), (1, 4, 0)):
        buffers = [
            Buffer("x", "float", f"{rows_name} * {cols_name}", offset=offset),
            Buffer("y", "float", f"{rows_name} * {cols_name}", output=True),
        ]
        cases.append(
            Case({rows_name: rows, cols_name: cols}, buffers, call, "", grid="dim3(2)",
                 block_dims="dim3(64)")
        )  # fmt: skip
    return cases


def _scanned(kernel: KernelSource) -> KernelSource:
    (site,) = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "scan"]
    return mechanism.apply(kernel, site)


@pytest.mark.nvcc
def test_a_vectorized_warp_scan_gives_the_scalar_scans_sums() -> None:
    """The fixture's warp scan (a lane as ``threadIdx.x % 32``, ``__ldg``, unrolled shuffles)
    and cumsum_rows after its warp scan: the vector form's sums match the scalar loop's, on
    rows the vector path takes and rows it leaves to the scalar loop."""
    naive_cumsum = KernelSource.from_file(REPO / "heldout" / "cumsum_rows" / "kernel.cu")
    scan = get("warp_shuffle_scan")
    (rows_site,) = [s for s in scan.candidates(naive_cumsum) if s.detail.get("form") == "rows"]
    cumsum = scan.apply(naive_cumsum, rows_site)
    for kernel, call, axes in (
        (KernelSource.from_file(SCAN_FIXTURE), "row_prefix_sums(x, y, rows, n)", ("rows", "n")),
        (cumsum, "cumsum_rows(x, y, rows, cols)", ("rows", "cols")),
    ):
        vectorized = _scanned(kernel)
        assert "reinterpret_cast<const float4*>" in vectorized.text
        cases = _scan_cases(call, *axes)
        assert_close(floats(run_on_host(vectorized.text, cases)),
                     floats(run_on_host(kernel.text, cases)))  # fmt: skip


def test_a_vectorized_scan_goes_back_to_its_scalar_loop() -> None:
    kernel = KernelSource.from_file(SCAN_FIXTURE)
    vectorized = _scanned(kernel)
    (site,) = [s for s in mechanism.detect(vectorized) if s.detail.get("form") == "scan"]
    assert mechanism.carrier_of(vectorized, site) == Carrier(vector_width=4)
    assert mechanism.conditions(vectorized, site) == []  # checked on the device instead
    assert mechanism.remove(vectorized, site).text == kernel.text
    two = mechanism.apply(kernel, _site_of(kernel), Carrier(vector_width=2))
    assert "float2" in two.text and "base += 32 * 2" in two.text


def _site_of(kernel: KernelSource) -> Site:
    return next(c for c in mechanism.candidates(kernel) if c.detail.get("form") == "scan")


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("out[i] = running + x;", "out[i] = running * x;", "the store is no running sum"),
        ("base += 32)", "base += 64)", "a turn of 64 is not one float a lane"),
        ("const int i = base + lane;", "const int i = base + warp_id;", "not the lane"),
        # a scan step that also stores, or calls what is no shuffle, would run once for W
        ("if (lane >= 1) x += t;", "if (lane >= 1) x += t;\n    dst[lane] = x;", "a store"),
        ("if (lane >= 1) x += t;", "if (lane >= 1) x += t;\n    atomicAdd(dst, x);", "a call"),
        ("t = __shfl_up_sync(kAllLanes, x, 1);\n    if (lane >= 1) x += t;\n", "", None),
    ],
)
def test_a_chunk_loop_in_another_form_is_no_scan_candidate(
    old: str, new: str, why: str | None
) -> None:
    text = SCAN_FIXTURE.read_text()
    assert old in text
    changed = KernelSource(text.replace(old, new))
    found = [c for c in mechanism.candidates(changed) if c.detail.get("form") == "scan"]
    if why is None:  # four shuffle steps are still a scan (of 16 lanes): the rule takes it
        assert len(found) == 1
    else:
        assert found == [], why


def test_a_scan_width_of_eight_floats_is_refused() -> None:
    kernel = KernelSource.from_file(SCAN_FIXTURE)
    with pytest.raises(MechanismRefused, match="a width of 2 or 4 floats"):
        mechanism.apply(kernel, _site_of(kernel), Carrier(vector_width=8))


# ---------------------------------------------------------------------------------------------
# Chunked block scans (form=scan): W floats a thread a turn, the scalar loop as the fallback
# ---------------------------------------------------------------------------------------------

BLOCK_SCAN_FIXTURE = FIXTURES / "vectorized_access" / "block_scan.after.cu"


def _block_scan_cases(call: str, cols_name: str) -> list[Case]:
    """Rows a block each, of 64 threads: lengths that are multiples of 4 over one turn of 256
    and over several (the carry), one not a multiple, one starting misaligned."""
    cases = []
    for rows, cols, offset in ((3, 128, 0), (2, 600, 0), (2, 600, 1), (3, 70, 0), (1, 4, 0)):
        buffers = [
            Buffer("x", "float", f"rows * {cols_name}", offset=offset),
            Buffer("y", "float", f"rows * {cols_name}", output=True),
        ]
        cases.append(
            Case({"rows": rows, cols_name: cols}, buffers, call, "", grid="dim3((unsigned)rows)",
                 block_dims="dim3(64)")
        )  # fmt: skip
    return cases


def _block_rows_cumsum() -> KernelSource:
    """cumsum_rows with a block per row: block_per_row's scan form, one element a thread a
    turn (runs of several are coarsened already: the vector form reads single ones)."""
    naive = KernelSource.from_file(REPO / "heldout" / "cumsum_rows" / "kernel.cu")
    return apply_everywhere(naive, get("block_per_row"), Carrier(items_per_thread=1))


@pytest.mark.nvcc
def test_a_vectorized_block_scan_gives_the_scalar_scans_sums() -> None:
    """The fixture's block scan (a thread as ``tid``, ``__ldg``, totals picked by a
    conditional) and cumsum_rows after block_per_row: the vector form's sums match the scalar
    loop's, over several turns and on rows the vector path leaves to the scalar loop."""
    for kernel, call, cols in (
        (KernelSource.from_file(BLOCK_SCAN_FIXTURE), "block_prefix_sums(x, y, rows, n)", "n"),
        (_block_rows_cumsum(), "cumsum_rows(x, y, rows, cols)", "cols"),
    ):
        vectorized = _scanned(kernel)
        assert "base += blockDim.x * 4" in vectorized.text
        cases = _block_scan_cases(call, cols)
        assert_close(floats(run_on_host(vectorized.text, cases)),
                     floats(run_on_host(kernel.text, cases)))  # fmt: skip


@pytest.mark.nvcc
def test_an_unrolled_block_scan_keeps_its_pragma_on_both_loops(shared_builder: Builder) -> None:
    """The replay kept ``#pragma unroll`` on cumsum's chunk loop (1.07x): the vector form
    puts one before each loop, none before the ``if`` (where nvcc warns that it unrolls
    nothing), and the removal gives the unrolled loop back."""
    kernel = _block_rows_cumsum()
    loop = "  for (int64_t c_base = 0;"
    assert kernel.text.count(loop) == 1
    unrolled = KernelSource(kernel.text.replace(loop, "  #pragma unroll\n" + loop))
    vectorized = _scanned(unrolled)
    assert vectorized.text.count("#pragma unroll\n    for (int64_t c_base = 0;") == 2
    assert "#pragma unroll\n  if (" not in vectorized.text
    build = shared_builder.build(vectorized.text)
    assert build.ok and "must precede a loop" not in build.log
    (site,) = [s for s in mechanism.detect(vectorized) if s.detail.get("form") == "scan"]
    assert mechanism.remove(vectorized, site).text == unrolled.text


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("base += blockDim.x)", "base += 2 * blockDim.x)", "two floats a thread a turn"),
        ("out[i] = running + below + x;", "out[i] = running + below;", "no thread's float"),
        ("out[i] = running + below + x;", "out[i] = below + x;", "the carry is not added"),
        ("const int i = base + tid;", "const int i = base + wid;", "not the thread"),
        ("    __syncthreads();  // warp_sums", "    // warp_sums", "no barrier at the end"),
        ("if (lane == 31) warp_sums[wid] = x;", "if (lane == 31) out[wid] = x;", "a global store"),
        ("const int tid = threadIdx.x;", "const int tid = threadIdx.x + 0 * threadIdx.y;",
         "a 2-D block"),
    ],
)  # fmt: skip
def test_a_chunk_loop_in_another_form_is_no_block_scan_candidate(
    old: str, new: str, why: str
) -> None:
    text = BLOCK_SCAN_FIXTURE.read_text()
    assert old in text
    changed = KernelSource(text.replace(old, new))
    found = [c for c in mechanism.candidates(changed) if c.detail.get("form") == "scan"]
    assert found == [], why


# ---------------------------------------------------------------------------------------------
# Lanes in one row (form=rows): the row split done once a vector when D % W == 0
# ---------------------------------------------------------------------------------------------

ROWS_FIXTURE = FIXTURES / "vectorized_access" / "rows.after.cu"
SPLITTING = [
    "bias_relu",
    "causal_conv1d",
    "embedding_gather",
    "mean_pool",
    "rotary_embedding",
    "sgemm",
    "silu_and_mul",
    "transpose_2d",
]
"""Held-out kernels whose elements split their flat index by a row length (row first, column
first, or only a column)."""


def _in_rows(kernel: KernelSource) -> KernelSource:
    """The kernel vectorized, then its lanes split by row once a vector."""
    (vector,) = [c for c in mechanism.candidates(kernel) if c.supported]
    vectorized = mechanism.apply(kernel, vector)
    (rows,) = [c for c in mechanism.candidates(vectorized) if c.detail.get("form") == "rows"]
    return mechanism.apply(vectorized, rows)


@pytest.mark.nvcc
def test_lanes_in_one_row_compute_the_same_bits_on_the_host() -> None:
    """embedding_gather and the fixture (column split first) with rows a multiple of 8 long
    (the shared-row path) and not (the per-lane split), partial vectors at the end."""
    gather = KernelSource.from_file(REPO / "heldout" / "embedding_gather" / "kernel.cu")
    gather_cases = _gather_cases(((8, 6), (16, 3), (24, 5), (5, 7), (12, 3)))
    # a table one element off 16 bytes: the first lane fills the row an element at a time
    gather_cases += _gather_cases(((16, 3),), table_offset=1)
    fixture = KernelSource.from_file(ROWS_FIXTURE)
    fixture_cases = [
        Case(
            axes={"rows": rows, "cols": cols},
            buffers=[
                Buffer("x", "__nv_bfloat16", "rows * cols"),
                Buffer("scale", "float", "rows"),
                Buffer("offset", "float", "cols"),
                Buffer("y", "__nv_bfloat16", "rows * cols", output=True),
            ],
            call="scale_offset(x, scale, offset, y, rows, cols)",
            threads="rows * cols",
        )
        for rows, cols in ((4, 8), (3, 32), (5, 12), (2, 7))
    ]
    for kernel, cases in ((gather, gather_cases), (fixture, fixture_cases)):
        rows_form = _in_rows(kernel)
        assert "% 8 == 0) {  // a vector's lanes share one row" in rows_form.text
        assert run_on_host(rows_form.text, cases) == run_on_host(kernel.text, cases)


@pytest.mark.nvcc
def test_row_reads_are_loaded_once_a_vector_and_give_the_same_bits() -> None:
    """What the lanes read at ``P[X + h]`` (the table row of a gathered id, silu_and_mul's gate
    and up halves, bias_relu's bias) comes from one 16-byte load in the first lane (or one
    element at a time where it is not aligned); every output bit is the naive kernel's."""
    gather = _in_rows(KernelSource.from_file(REPO / "heldout" / "embedding_gather" / "kernel.cu"))
    assert "uint4 table_row;" in gather.text
    assert "table_row = *reinterpret_cast<const uint4*>(table_row_at);" in gather.text
    assert "reinterpret_cast<const __nv_bfloat16*>(&table_row)[i_lane]" in gather.text
    silu = KernelSource.from_file(REPO / "heldout" / "silu_and_mul" / "kernel.cu")
    silu_cases = [
        Case(
            axes={"tokens": tokens, "d": d, "two_d": 2 * d},
            buffers=[
                Buffer("x", "__nv_bfloat16", "tokens * two_d", offset=offset),
                Buffer("y", "__nv_bfloat16", "tokens * d", output=True),
            ],
            call="silu_and_mul(x, y, tokens, d, two_d)",
            threads="tokens * d",
        )
        for tokens, d, offset in ((3, 8, 0), (2, 24, 0), (3, 16, 1), (2, 12, 0))
    ]
    bias_relu = KernelSource.from_file(REPO / "heldout" / "bias_relu" / "kernel.cu")
    bias_cases = [
        Case(
            axes={"rows": rows, "cols": cols},
            buffers=[
                Buffer("x", "__half", "rows * cols"),
                Buffer("bias", "__half", "cols", offset=offset),
                Buffer("y", "__half", "rows * cols", output=True),
            ],
            call="bias_relu(x, bias, y, rows, cols)",
            threads="rows * cols",
        )
        for rows, cols, offset in ((3, 8, 0), (2, 32, 0), (4, 16, 3), (3, 10, 0))
    ]
    for kernel, cases, register in (
        (silu, silu_cases, "uint4 x_row_2;"),
        (bias_relu, bias_cases, "uint4 bias_row;"),
    ):
        rows_form = _in_rows(kernel)
        assert register in rows_form.text
        assert run_on_host(rows_form.text, cases) == run_on_host(kernel.text, cases)


def test_a_read_only_some_lanes_make_is_not_loaded_for_all() -> None:
    """A read under `?:`, or after a branch the lanes may take apart, stays a lane's own."""
    text = ROWS_FIXTURE.read_text()
    text = text.replace(
        "const float* offset,", "const float* offset, const __nv_bfloat16* extra,"
    ).replace("(x, scale, offset, y,", "(x, scale, offset, extra, y,")
    text = text.replace("__nv_bfloat16* y, int64_t rows, int64_t cols, cudaStream_t stream", (
        "const __nv_bfloat16* extra, __nv_bfloat16* y, int64_t rows, int64_t cols, "
        "cudaStream_t stream"))  # fmt: skip
    read = "__bfloat162float(extra[r * cols + c])"
    cases = {
        "conditional": f"  const float e = c > 2 ? {read} : 0.0f;\n",
        "after a lane branch": f"  if (c == 3) return;\n  const float e = {read};\n",
        "every lane": f"  const float e = {read};\n",
    }
    for case, line in cases.items():
        kernel = KernelSource(text.replace("  y[i] = ", line + "  y[i] = e + "))
        rows_form = _in_rows(kernel)
        assert ("uint4 extra_row;" in rows_form.text) == (case == "every lane"), case


def test_heldout_kernels_that_split_by_row_take_the_rows_form(mechanism_builder: Builder) -> None:
    """Every held-out kernel whose elements split their index by a row length takes the form,
    the canonical vector form is still recognized around it (its removal refused until the
    rows form goes), and removing the rows form gives the vector form back; all compile."""
    written = []
    for name in SPLITTING:
        kernel = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        rows_form = _in_rows(kernel)
        sites = {s.detail["form"]: s for s in mechanism.detect(rows_form)}
        assert set(sites) == {"kernel", "rows"}, name
        assert "form rows" in (sites["kernel"].refusal or ""), name
        vectorized = mechanism.remove(rows_form, sites["rows"])
        assert [s.detail["form"] for s in mechanism.detect(vectorized)] == ["kernel"], name
        assert [c.detail["form"] for c in mechanism.candidates(vectorized)] == ["rows"], name
        written.append(KernelSource(rows_form.text, name=f"{name}-rows"))
    compile_ok(mechanism_builder, written)
    every = {p.parent.name for p in (REPO / "heldout").glob("*/kernel.cu")}
    others = sorted(every - set(SPLITTING))
    for name in others:
        kernel = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        vectorized = apply_everywhere(kernel, mechanism, Carrier())
        assert not [c for c in mechanism.candidates(vectorized) if c.detail.get("form") == "rows"]


@pytest.mark.parametrize(
    "changes",
    [
        [("const int64_t r = i / cols;", "const int64_t r = i / rows;")],
        [("  y[i] = __float2bfloat16(", "  c += 0;\n  y[i] = __float2bfloat16(")],
        [("int64_t c = i % cols;", "float c = i % cols;"), ("offset[c]", "offset[(int64_t)c]")],
    ],
    ids=["two-lengths", "written-column", "float-column"],
)
def test_lanes_that_do_not_keep_their_row_are_no_rows_candidate(
    changes: list[tuple[str, str]],
) -> None:
    """The kernel still vectorizes (the canonical form is there); its lanes are no candidate:
    split by two lengths, writing their column, or holding it in a float."""
    text = ROWS_FIXTURE.read_text().replace("const int64_t c = i % cols;", "int64_t c = i % cols;")
    tampered = text
    for old, new in changes:
        assert old in tampered
        tampered = tampered.replace(old, new)
    vectorized = apply_everywhere(KernelSource(tampered), mechanism, Carrier())
    assert [s.detail["form"] for s in mechanism.detect(vectorized)] == ["kernel"]
    assert not [c for c in mechanism.candidates(vectorized) if c.detail.get("form") == "rows"]
    # the untampered kernel is one
    vectorized = apply_everywhere(KernelSource(text), mechanism, Carrier())
    assert [c.detail["form"] for c in mechanism.candidates(vectorized)] == ["rows"]


# ---------------------------------------------------------------------------------------------
# A loop vectorized behind a run-time alignment test (check=aligned)
# ---------------------------------------------------------------------------------------------


def _block_rows(problem: str) -> KernelSource:
    """The held-out kernel with a block per row (what block_per_row writes first)."""
    naive = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
    return apply_everywhere(naive, get("block_per_row"), Carrier())


def _log_softmax_cases(shapes: tuple[tuple[int, int, int], ...]) -> list[Case]:
    """Block-per-row log_softmax launches of (rows, cols, x's element offset) for the host."""
    cases = []
    for rows, cols, offset in shapes:
        buffers = [
            Buffer("x", "float", "rows * cols", offset=offset),
            Buffer("y", "float", "rows * cols", output=True),
        ]
        cases.append(
            Case({"rows": rows, "cols": cols}, buffers, "log_softmax_rows(x, y, rows, cols)",
                 "", grid="dim3((unsigned)rows)", block_dims="dim3(256)")
        )  # fmt: skip
    return cases


def test_a_checked_loop_tests_its_pointers_and_comes_back() -> None:
    kernel = _block_rows("log_softmax")
    site = next(c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop")
    static = mechanism.conditions(kernel, site)
    assert {(c.axis, c.k) for c in static if isinstance(c, AxisDivisible)} == {("cols", 4)}
    assert all(mechanism.run_time_check(kernel, site, c) for c in static)
    checked = mechanism.apply(kernel, site, Carrier(check="aligned"))
    assert "if (reinterpret_cast<unsigned long long>(in) % 16 == 0) {\n" in checked.text
    assert "  } else {\n    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)" in (
        checked.text
    )
    (found,) = mechanism.detect(checked)
    assert found.supported and found.detail["check"] == "aligned"
    assert mechanism.carrier_of(checked, found) == Carrier(vector_width=4, check="aligned")
    assert not [c for c in mechanism.conditions(checked, found) if isinstance(c, PointerAlignment)]
    assert mechanism.remove(checked, found).text == kernel.text
    with pytest.raises(MechanismRefused, match="check='always'"):
        mechanism.apply(kernel, site, Carrier(check="always"))


def test_a_tampered_check_is_not_taken_for_the_checked_form() -> None:
    kernel = _block_rows("log_softmax")
    site = next(c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop")
    checked = mechanism.apply(kernel, site, Carrier(check="aligned")).text
    tampered = KernelSource(checked.replace("% 16 == 0) {", "% 8 == 0) {", 1))
    assert all("check" not in s.detail for s in mechanism.detect(tampered))


@pytest.mark.nvcc
def test_checked_loops_compute_the_block_rows_outputs_on_the_host() -> None:
    """log_softmax with a block per row, every loop vectorized behind its alignment test, on
    the CPU: rows of odd length (every row misaligned but one in four), of a multiple of 4
    with the buffer aligned and not: the outputs agree within float rounding (a vector's
    lanes sum in another order)."""
    kernel = _block_rows("log_softmax")
    checked = apply_everywhere(kernel, mechanism, Carrier(check="aligned"))
    assert checked.text.count("% 16 == 0") == 4  # in, in, in and out
    cases = _log_softmax_cases(((5, 301, 0), (3, 256, 0), (3, 256, 1), (2, 7, 0)))
    assert_close(floats(run_on_host(checked.text, cases)), floats(run_on_host(kernel.text, cases)))


# ---------------------------------------------------------------------------------------------
# A loop peeled to alignment (check=peeled)
# ---------------------------------------------------------------------------------------------


def test_a_peeled_loop_runs_scalars_to_alignment_then_vectors_and_comes_back() -> None:
    kernel = _block_rows("log_softmax")
    sites = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop"]
    # rows of 50,257 floats break the alignment: every loop here can be peeled instead
    static = mechanism.conditions(kernel, sites[0])
    assert {mechanism.run_time_check(kernel, sites[0], c) for c in static} == {
        Carrier(check="peeled")
    }
    one = mechanism.apply(kernel, sites[0], Carrier(check="peeled"))
    assert "{  // peeled to alignment\n" in one.text
    assert "reinterpret_cast<const float4*>(in + c_head)[c_vec]" in one.text
    assert "for (int64_t c = threadIdx.x; c < c_head; c += blockDim.x)" in one.text
    (found,) = mechanism.detect(one)
    assert found.supported and found.detail["check"] == "peeled"
    assert mechanism.carrier_of(one, found) == Carrier(vector_width=4, check="peeled")
    assert not [c for c in mechanism.conditions(one, found) if isinstance(c, PointerAlignment)]
    assert mechanism.remove(one, found).text == kernel.text
    # the store loop reads and writes: one peel aligns both only when they share a misalignment
    peeled = apply_everywhere(kernel, mechanism, Carrier(check="peeled"))
    assert peeled.text.count("{  // peeled to alignment") == 2
    assert peeled.text.count("% 16 == 0) {  // one peel aligns every pointer") == 1
    assert "} else {\n    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c]" in (
        peeled.text
    )
    assert [s.detail["check"] for s in mechanism.detect(peeled)] == ["peeled"] * 3
    undone = peeled
    for _ in range(3):
        undone = mechanism.remove(undone, mechanism.detect(undone)[0])
    assert undone.text == kernel.text


def test_pointers_of_two_element_sizes_are_not_peeled() -> None:
    kernel = KernelSource(
        "#include <cuda_bf16.h>\n"
        "#include <stdint.h>\n"
        "__global__ void narrow(const float* x, __nv_bfloat16* y, int64_t cols) {\n"
        "  const float* in = x + blockIdx.x * cols;\n"
        "  __nv_bfloat16* out = y + blockIdx.x * cols;\n"
        "  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {\n"
        "    out[c] = __float2bfloat16(in[c]);\n"
        "  }\n"
        "}\n"
    )
    (site,) = [c for c in mechanism.candidates(kernel) if c.detail.get("form") == "loop"]
    # a row length that breaks the vectors' alignment: the scalar loop takes those rows
    broken = AxisDivisible(axis="cols", k=4)
    assert mechanism.run_time_check(kernel, site, broken) == Carrier(check="aligned")
    with pytest.raises(MechanismRefused, match="different sizes"):
        mechanism.apply(kernel, site, Carrier(check="peeled"))


def test_a_tampered_peel_is_not_taken_for_the_peeled_form() -> None:
    kernel = _block_rows("log_softmax")
    peeled = apply_everywhere(kernel, mechanism, Carrier(check="peeled")).text
    tampered = KernelSource(peeled.replace("% 16 / 4);", "% 16 / 2);", 1))
    # its vector load is still one (a single access), but the loop is not the peeled form
    assert [s.detail.get("check") for s in mechanism.detect(tampered)] == [None] + ["peeled"] * 2
    assert mechanism.detect(tampered)[0].detail["form"] == "load"


@pytest.mark.nvcc
def test_peeled_loops_compute_the_block_rows_outputs_on_the_host() -> None:
    """log_softmax with a block per row, every loop peeled to alignment, on the CPU: rows of
    odd length (each starting at another alignment), rows shorter than a peel, rows of a
    multiple of 4 with the buffer aligned and not, and input and output misaligned apart (the
    store loop's scalar branch): the outputs agree within float rounding."""
    kernel = _block_rows("log_softmax")
    peeled = apply_everywhere(kernel, mechanism, Carrier(check="peeled"))
    cases = _log_softmax_cases(((5, 301, 0), (6, 3, 0), (3, 256, 0), (3, 256, 1), (4, 301, 2)))
    assert_close(floats(run_on_host(peeled.text, cases)), floats(run_on_host(kernel.text, cases)))


def test_a_candidate_whose_lines_an_earlier_application_rewrote_is_refused() -> None:
    body = "  LDST128(y[4 * n + 8]) = v;"
    macro = "#define LDST128(value) (reinterpret_cast<float4 *>(&(value))[0])\n"
    kernel = KernelSource(macro + _device(f"  float4 v = p4[n];\n{body}").text)
    removal = remove_mechanism(kernel, mechanism)
    split = removal.simplified
    (candidate,) = [c for c in mechanism.candidates(split) if c.node_kind == "compound_statement"]
    assert candidate_in(mechanism, candidate, split, split) == candidate
    # the split's lines are gone from the text it would be applied to
    elsewhere = KernelSource(macro + _device("  float4 v = p4[n];\n  take(v);").text)
    with pytest.raises(MechanismRefused, match="rewrote the lines of this candidate"):
        candidate_in(mechanism, candidate, split, elsewhere)
