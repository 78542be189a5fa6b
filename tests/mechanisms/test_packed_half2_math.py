"""The packed_half2_math mechanism: fixtures both ways, the rmsnorm expert, pairs, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import ArchAtLeast
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok, forward_chain, removal_chain
from tests.mechanisms.test_vectorized_access import listing_experts

NAME = "packed_half2_math"
mechanism = get(NAME)
EXPERTS = listing_experts(NAME)


class TestPackedHalf2Math(RoundTripSuite):
    mechanism = NAME


@pytest.mark.parametrize("expert", EXPERTS, ids=[p.name for p in EXPERTS])
def test_detect_finds_what_the_expert_lists(expert: Path) -> None:
    entries = json.loads((expert / "mechanisms.json").read_text())
    listed = [e for e in entries if e["mechanism"] == NAME]
    report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
    assert report.recall == 1.0, str(report)


@pytest.mark.nvcc
def test_every_expert_site_is_removable_and_compiles(mechanism_builder: Builder) -> None:
    without = []
    for expert in EXPERTS:
        kernel = KernelSource.from_file(expert / "kernel.cu")
        sites = mechanism.detect(kernel)
        assert sites and all(s.supported for s in sites), [str(s) for s in sites]
        for site in sites:
            assert len(mechanism.detect(mechanism.remove(kernel, site))) == len(sites) - 1
        chain = removal_chain(mechanism, kernel)
        assert len(chain.sites) == len(sites)
        without.append(KernelSource(chain.states[-1].text, name=f"{expert.name}-unpacked"))
    compile_ok(mechanism_builder, without)


def test_rmsnorm_hadd2_on_union_fields_becomes_two_scalar_adds() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels/fused_add_rmsnorm/kernel.cu")
    (hadd2,) = [s for s in mechanism.detect(kernel) if s.detail["intrinsic"] == "__hadd2"]
    assert hadd2.detail["precision"] == "bf16"
    removed = mechanism.remove(kernel, hadd2)
    assert (
        "row[i].pair[j] = __halves2bfloat162(__hadd(a[i].pair[j].x, row[i].pair[j].x), "
        "__hadd(a[i].pair[j].y, row[i].pair[j].y));"
    ) in removed.text
    assert mechanism.conditions(kernel, hadd2) == [
        ArchAtLeast(sm=80, why="packed bfloat162 arithmetic needs sm_80")
    ]


def _device(body: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
        "template <typename T>\n"
        "__device__ T twice(T a, T b, __half2* h, __nv_bfloat162 r, __nv_bfloat162 s) {\n"
        f"{body}\n}}\n"
    )


def test_adjacent_scalar_halves_pair_up() -> None:
    body = "  r.x = __hmul(r.x, s.x);\n  r.y = __hmul(r.y, s.y);\n  return a;"
    kernel = _device(body)
    (candidate,) = mechanism.candidates(kernel)
    assert candidate.detail == {"precision": "bf16", "kind": "arithmetic"}
    applied = mechanism.apply(kernel, candidate)
    assert "  r = __hmul2(r, s);\n  return a;" in applied.text
    assert [s.detail["intrinsic"] for s in mechanism.detect(applied)] == ["__hmul2"]


@pytest.mark.parametrize(
    "body",
    [
        "  r.x = __hmul(r.x, s.x);\n  r.y = __hadd(r.y, s.y);\n  return a;",  # two operations
        "  r.x = __hmul(r.x, s.x);\n  r.y = __hmul(s.y, r.y);\n  return a;",  # swapped
        "  h[0].x = __hmul(r.x, s.x);\n  h[0].y = __hmul(r.y, s.y);\n  return a;",  # types
        "  h[0] = __halves2half2(__hmul(h[1].x, h[2].x), __hmul(h[1].y, h[3].y));\n  return a;",
    ],
)
def test_halves_that_do_not_match_are_not_candidates(body: str) -> None:
    assert mechanism.candidates(_device(body)) == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("  return __hadd2(a, b);", "type is unknown"),
        ("  h[0] = __hmul2(h[1], h[2]++);\n  return a;", "side effects"),
        ("  h[0] = __hfma2(h[1], h[2]);\n  return a;", "2 arguments"),
    ],
)
def test_unsafe_sites_are_detected_but_refused(body: str, reason: str) -> None:
    kernel = _device(body)
    (site,) = mechanism.detect(kernel)
    assert reason in (site.refusal or "")
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.remove(kernel, site)


def test_conversions_need_no_architecture() -> None:
    kernel = _device("  const float2 f = __bfloat1622float2(r);\n  return a;")
    (site,) = mechanism.detect(kernel)
    assert site.detail["kind"] == "from_pair" and mechanism.conditions(kernel, site) == []


def test_an_operation_inside_another_waits_for_it() -> None:
    kernel = _device("  const float2 f = __half22float2(__hmul2(h[0], h[1]));\n  return a;")
    outer, inner = mechanism.detect(kernel)
    assert "remove that one first" in (outer.refusal or "") and inner.supported
    chain = removal_chain(mechanism, kernel)
    assert [s.detail["intrinsic"] for s in chain.sites] == ["__hmul2", "__half22float2"]
    assert "__hmul2" not in chain.states[-1].text and "__half22float2" not in chain.states[-1].text


# ---------------------------------------------------------------------------------------------
# Forward on naive code: the row loop that converts one element a turn
# ---------------------------------------------------------------------------------------------

FORWARD = REPO / "tests/fixtures/mechanisms" / NAME / "forward"
"""``<case>.naive.cu`` and ``<case>.applied.cu``: apply at every loop candidate, in order."""
FORWARD_CASES = ["row_dot", "rmsnorm"]
HELDOUT_LOOPS = {"batched_hgemm": 1, "gemv": 1, "layernorm": 3, "row_max": 1}
"""Held-out kernels whose row loops pair up, with how many loops do."""


def pair_every_loop(kernel: KernelSource) -> KernelSource:
    """Apply at the first loop candidate until none is left."""
    for _ in range(20):
        loops = [s for s in mechanism.candidates(kernel) if s.detail["kind"] == "loop"]
        supported = [s for s in loops if s.supported]
        if not supported:
            return kernel
        kernel = mechanism.apply(kernel, supported[0])
    raise AssertionError("pairing does not stop")


def _forward_pair(case: str) -> tuple[KernelSource, KernelSource]:
    return (
        KernelSource.from_file(FORWARD / f"{case}.naive.cu"),
        KernelSource.from_file(FORWARD / f"{case}.applied.cu"),
    )


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_naive_row_loops_pair_up_as_the_fixture(case: str) -> None:
    naive, applied = _forward_pair(case)
    got = pair_every_loop(naive)
    assert got.text == applied.text
    assert not got.parsed.errors
    pairs = [s for s in mechanism.detect(got) if s.detail["kind"] == "from_pair"]
    assert len(pairs) == {"row_dot": 2, "rmsnorm": 3}[case]
    assert all(s.supported for s in pairs)


def test_the_heldout_row_loops_pair_up() -> None:
    reached = {}
    for folder in sorted((REPO / "heldout").iterdir()):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        loops = [s for s in mechanism.candidates(kernel) if s.detail["kind"] == "loop"]
        if any(s.supported for s in loops):
            reached[folder.name] = sum(s.supported for s in loops)
    assert reached == HELDOUT_LOOPS


@pytest.mark.nvcc
def test_both_states_compile(mechanism_builder: Builder) -> None:
    sources = [k for case in FORWARD_CASES for k in _forward_pair(case)]
    for name in HELDOUT_LOOPS:
        sources.append(
            pair_every_loop(KernelSource.from_file(REPO / "heldout" / name / "kernel.cu"))
        )
    compile_ok(mechanism_builder, sources)


def _row_cases(elem: str, inputs: list[tuple[str, str]], output: Buffer, call: str) -> list[Case]:
    """Rows of even and odd lengths, aligned and not (every row, or odd rows only)."""
    cases = []
    for rows, cols, offset in [(5, 64, 0), (7, 37, 0), (3, 64, 1), (4, 1, 0), (2, 0, 0)]:
        buffers = [
            Buffer(name, elem, count, offset=offset if name != "weight" else 0)
            for name, count in inputs
        ]
        cases.append(Case({"rows": rows, "cols": cols}, [*buffers, output], call, "rows", 4))
    return cases


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("case", "cases"),
    [
        (
            "row_dot",
            _row_cases(
                "__half",
                [("x", "rows * cols"), ("w", "cols")],
                Buffer("y", "__half", "rows", output=True),
                "row_dot(x, w, y, rows, cols)",
            ),
        ),
        (
            "rmsnorm",
            _row_cases(
                "__nv_bfloat16",
                [("x", "rows * cols"), ("weight", "cols")],
                Buffer("y", "__nv_bfloat16", "rows * cols", output=True),
                "rmsnorm_rows(x, weight, y, rows, cols)",
            ),
        ),
    ],
)
def test_paired_loops_compute_the_same_bits_on_the_host(case: str, cases: list[Case]) -> None:
    """Run on the CPU, thread after thread: every output bit is the naive kernel's, for rows
    of odd length, unaligned rows and rows of one element or none."""
    naive, applied = _forward_pair(case)
    want = run_on_host(naive.text, cases)
    assert len(want.splitlines()) == len(cases)
    assert run_on_host(applied.text, cases) == want


@pytest.mark.nvcc
def test_the_paired_heldout_layernorm_and_gemv_compute_the_same_bits_on_the_host() -> None:
    layernorm = _row_cases(
        "__nv_bfloat16",
        [("x", "rows * cols"), ("weight", "cols"), ("bias", "cols")],
        Buffer("y", "__nv_bfloat16", "rows * cols", output=True),
        "layernorm_rows(x, weight, bias, y, rows, cols)",
    )
    gemv = _row_cases(
        "__nv_bfloat16",
        [("A", "rows * cols"), ("x", "cols")],
        Buffer("y", "__nv_bfloat16", "rows", output=True),
        "gemv(A, x, y, rows, cols)",
    )
    for name, cases in (("layernorm", layernorm), ("gemv", gemv)):
        naive = KernelSource.from_file(REPO / "heldout" / name / "kernel.cu")
        want = run_on_host(naive.text, cases)
        assert run_on_host(pair_every_loop(naive).text, cases) == want, name


def _row_loop(body: str, before: str = "") -> KernelSource:
    return KernelSource(
        "#include <cuda_fp16.h>\n#include <stdint.h>\n"
        "__device__ float g(float v);\n"
        "__global__ void k(const __half* x, __half* y, int64_t n, float s) {\n"
        "  float acc = 0.0f;\n"
        f"{before}"
        f"  for (int64_t c = 0; c < n; ++c) {body}\n"
        "  y[0] = __float2half(acc);\n}\n"
    )


@pytest.mark.parametrize(
    ("body", "before", "reason"),
    [
        ("if (s > 0.0f) acc += __half2float(x[c]);", "", "read only when"),
        ("acc += s > 0.0f ? __half2float(x[c]) : 0.0f;", "", "read only when"),
        ("y[c] = __float2half(__half2float(x[c]) * s);", "", "storing into x"),
        ("{ acc += __half2float(x[c]); if (acc > s) break; }", "", "leaves a turn early"),
        ("acc += g(__half2float(x[c]));", "", "effects are unknown"),
        ("acc += __half2float(x[c]);", "#pragma unroll 4\n", "#pragma"),
        ("{ acc += __half2float(x[c]); c += 1; }", "", "changes c"),
        ("acc += __half2float(x[c]) * __half2float(x[c + 1]);", "", "also uses otherwise"),
    ],
)
def test_unsound_pairings_are_refused(body: str, before: str, reason: str) -> None:
    kernel = _row_loop(body, before)
    if "storing into" in reason:  # x and y are one buffer here: y is x, not a parameter
        kernel = KernelSource(
            kernel.text.replace("__half* y,", "__half* z,").replace(
                "float acc = 0.0f;", "float acc = 0.0f;\n  __half* y = const_cast<__half*>(x);"
            )
        )
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail["kind"] == "loop"]
    assert reason in (site.refusal or ""), site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.apply(kernel, site)


def test_a_store_through_another_parameter_is_allowed() -> None:
    kernel = _row_loop("y[c] = __float2half(__half2float(x[c]) * s);")
    (site,) = mechanism.candidates(kernel)
    assert site.supported and site.detail == {"kind": "loop", "precision": "half", "pointers": "x"}
    assert "const int64_t c = c_pair + 1;" in mechanism.apply(kernel, site).text


def test_the_tail_of_a_paired_loop_is_not_paired_again() -> None:
    paired = pair_every_loop(_row_loop("acc += __half2float(x[c]);"))
    assert "for (int64_t c = c_pair; c < n; ++c)" in paired.text
    assert [s for s in mechanism.candidates(paired) if s.detail["kind"] == "loop"] == []


HALF2_MACROS = """#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define HALF2(value) (reinterpret_cast<half2 *>(&(value))[0])
#define LDST128BITS(value) (reinterpret_cast<float4 *>(&(value))[0])
__global__ void add_f16x8(half *a, half *b, half *c, int N) {
  int idx = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  half pack_a[8], pack_b[8], pack_c[8];
  LDST128BITS(pack_a[0]) = LDST128BITS(a[idx]);
  LDST128BITS(pack_b[0]) = LDST128BITS(b[idx]);
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    HALF2(pack_c[i]) = __hadd2(HALF2(pack_a[i]), HALF2(pack_b[i]));
  }
  if ((idx + 7) < N) {
    LDST128BITS(c[idx]) = LDST128BITS(pack_c[0]);
  }
}
"""


@pytest.mark.nvcc
def test_operands_read_through_access_macros_are_half2_values(mechanism_builder: Builder) -> None:
    # a public idiom: packs of eight halves moved with a 128-bit macro and added two at a time
    # through a half2 macro; the macro's reads are typed (half2) and free of side effects
    kernel = KernelSource(HALF2_MACROS)
    chain = removal_chain(mechanism, kernel)
    assert len(chain.sites) == 1
    assert "__hadd(HALF2(pack_a[i]).y, HALF2(pack_b[i]).y)" in chain.states[-1].text
    (candidate,) = mechanism.candidates(chain.states[-1])
    assert mechanism.apply(chain.states[-1], candidate).text == kernel.text
    vectors = get("vectorized_access")
    assert len([s for s in vectors.detect(kernel) if s.supported]) == 9
    compile_ok(mechanism_builder, [*chain.states, removal_chain(vectors, kernel).states[-1]])


def test_half2_macro_reads_merge_back_into_the_macro() -> None:
    # __halves2half2 makes both __half2 and half2; the split read merges into the type the file
    # has a macro for (half2 here), so all nine removed accesses come back by apply
    vectors = get("vectorized_access")
    kernel = KernelSource(HALF2_MACROS)
    chain = removal_chain(vectors, kernel)
    assert len(chain.sites) == 9
    split = chain.states[-1]
    assert "HALF2(pack_a[i])" not in split.text
    forward_chain(vectors, chain)  # every state comes back exactly, HALF2 reads included
