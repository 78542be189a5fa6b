"""The row_in_registers mechanism: fixtures both ways, what makes a re-read unsafe (and is
refused), and detection on the softmax and RMSNorm experts."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.reductions_experts import (
    HELDOUT,
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok

mechanism = get("row_in_registers")
FIXTURE = (FIXTURES / "row_in_registers" / "before.cu").read_text()


class TestRowInRegisters(RoundTripSuite):
    mechanism = "row_in_registers"


def test_the_reload_keeps_the_loads_pragma_and_the_pass_keeps_its_own() -> None:
    after = (FIXTURES / "row_in_registers" / "after.cu").read_text()
    assert after.count("#pragma unroll") == FIXTURE.count("#pragma unroll") + 1
    assert after.count("v[i] = c < cols ? in[c] : 0.0f;") == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            (
                "for (int i = 0; i < kVec; ++i) sq += v[i] * v[i];",
                "for (int i = 0; i < kVec; ++i) { sq += v[i] * v[i]; v[i] *= 2.0f; }",
            ),
            "assigns v[i]",
        ),
        (
            (
                "for (int i = 0; i < kVec; ++i) sq += v[i] * v[i];",
                "for (int i = 0; i < kVec; ++i) { sq += v[i] * v[i]; x[i] = 0.0f; }",
            ),
            "writes memory the load reads",
        ),
        (
            ("v[i] = c < cols ? in[c] : 0.0f;", "v[i] = c < cols ? in[c] : 0.0f;\n    sq += 1.0f;"),
            "the load also assigns sq",
        ),
    ],
)
def test_unsafe_re_reads_are_refused(change: tuple[str, str], reason: str) -> None:
    text = FIXTURE.replace("const float* __restrict__ x", "float* __restrict__ x")
    text = text.replace(*change)
    if "sq += 1.0f" in text:
        text = text.replace("  float v[kVec];", "  float sq = 0.0f;\n  float v[kVec];").replace(
            "  float sq = 0.0f;\n#pragma", "#pragma"
        )
    source = KernelSource(text)
    (site,) = mechanism.detect(source)
    assert site.refusal is not None and reason in site.refusal, site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.remove(source, site)


def test_a_batched_load_used_once_is_not_a_held_row() -> None:
    source = KernelSource(
        "__global__ void k(const float* x, float* y) {\n  float v[4];\n"
        "  for (int i = 0; i < 4; ++i) v[i] = x[i];\n"
        "  for (int i = 0; i < 4; ++i) y[i] = v[i];\n}\n"
    )
    assert mechanism.detect(source) == []


def test_the_experts_are_detected_where_listed() -> None:
    assert_detected_where_listed("row_in_registers")


@pytest.mark.nvcc
def test_expert_sites_refuse_with_the_pass_that_rewrites_the_row(
    mechanism_builder: Builder,
) -> None:
    refusals = check_expert_removals_compile("row_in_registers", mechanism_builder)
    assert len(refusals) == 3
    assert all("re-reading the row from memory would not give them" in r for r in refusals)


# ---------------------------------------------------------------------------------------------
# Forward on naive passes: a register path for rows up to a compile-time bound
# ---------------------------------------------------------------------------------------------

FORWARD = FIXTURES / "row_in_registers" / "forward"
"""``<case>.naive.cu`` and ``<case>.applied.cu``: apply at the one dispatch candidate."""
FORWARD_CASES = ["softmax", "warp_rms"]
HELDOUT_DISPATCH = ["l2_normalize", "layernorm", "log_softmax"]


def _dispatch(kernel: KernelSource, carrier: Carrier | None = None) -> KernelSource:
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("kind") == "dispatch"]
    return mechanism.apply(kernel, site, carrier)


@pytest.mark.parametrize("case", FORWARD_CASES)
def test_naive_passes_get_a_register_path_as_the_fixture(case: str) -> None:
    naive = KernelSource.from_file(FORWARD / f"{case}.naive.cu")
    applied = _dispatch(naive)
    assert applied.text == (FORWARD / f"{case}.applied.cu").read_text()
    (held,) = mechanism.detect(applied)
    assert held.supported and held.detail == {"array": "in_row"}


def test_the_heldout_passes_that_reread_a_row_get_one() -> None:
    reached = []
    for folder in sorted(HELDOUT.iterdir()):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        if any(s.supported for s in mechanism.candidates(kernel)):
            reached.append(folder.name)
    assert reached == HELDOUT_DISPATCH
    (refused,) = mechanism.candidates(KernelSource.from_file(HELDOUT / "cross_entropy/kernel.cu"))
    assert "declaring s, used after them" in (refused.refusal or "")


@pytest.mark.nvcc
def test_both_states_compile(mechanism_builder: Builder) -> None:
    sources = [
        KernelSource.from_file(FORWARD / f"{c}.{s}.cu")
        for c in FORWARD_CASES
        for s in ("naive", "applied")
    ]
    sources += [
        _dispatch(KernelSource.from_file(HELDOUT / n / "kernel.cu")) for n in HELDOUT_DISPATCH
    ]
    sources.append(
        _dispatch(KernelSource.from_file(FORWARD / "softmax.naive.cu"), Carrier(elements=4))
    )
    compile_ok(mechanism_builder, sources)


@pytest.mark.nvcc
def test_the_register_path_computes_the_same_bits_on_the_host() -> None:
    """Thread after thread on the CPU, with 4 elements held: rows of 1 to 4 take the register
    path, longer ones the original passes; every output bit is the naive kernel's."""
    naive = KernelSource.from_file(FORWARD / "softmax.naive.cu")
    cases = [
        Case(
            {"rows": 6, "cols": cols},
            [Buffer("x", "float", "rows * cols"), Buffer("y", "float", "rows * cols", output=True)],
            "softmax_rows(x, y, rows, cols)",
            "rows",
            4,
        )
        for cols in (1, 3, 4, 5, 37)
    ]
    want = run_on_host(naive.text, cases)
    assert len(want.splitlines()) == len(cases)
    for carrier in (Carrier(elements=4), Carrier()):
        assert run_on_host(_dispatch(naive, carrier).text, cases) == want


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["log_softmax", "layernorm", "l2_normalize"])
def test_block_strided_passes_get_a_register_path_with_the_same_bits(name: str) -> None:
    """After block per row, each thread walks its row by blockDim.x between block reductions;
    rows of at most 4 turns a thread (4 * 64 elements here) take the register path, longer
    ones the passes as they were, and every output bit is the block-per-row kernel's."""
    from klineage.mining.removal import apply_everywhere

    block = apply_everywhere(
        KernelSource.from_file(HELDOUT / name / "kernel.cu"), get("block_per_row"), Carrier()
    )
    applied = _dispatch(block, Carrier(elements=4))
    assert "<= 4 * blockDim.x)" in applied.text and "* blockDim.x;" in applied.text
    kernel = block.parsed.kernels[0]
    axes = [p.name for p in kernel.params if not p.is_pointer]
    pointers = [p for p in kernel.params if p.is_pointer]
    rows, length = axes
    buffers = [
        Buffer(
            p.name,
            p.base_type.replace("const ", "").strip(),
            f"{rows} * {length}" if p.name in ("x", "y") else length,
            output=p.name == "y",
        )
        for p in pointers
    ]
    cases = [
        Case(
            {rows: 3, length: n},
            buffers,
            f"{kernel.name}({', '.join(p.name for p in kernel.params)})",
            rows,
            grid=f"dim3((unsigned){rows})",
            block_dims="dim3(64)",
        )
        for n in (1, 70, 256, 257, 600)
    ]
    want = run_on_host(block.text, cases)
    assert len(want.splitlines()) == len(cases)
    assert run_on_host(applied.text, cases) == want


def _passes(first: str, second: str, between: str = "", bound: str = "n") -> KernelSource:
    return KernelSource(
        "#include <stdint.h>\n"
        "__global__ void k(float* x, float* y, const int64_t* lens, int64_t n) {\n"
        "  const int64_t r = blockIdx.x;\n"
        "  float a = 0.0f;\n"
        f"  for (int64_t c = 0; c < {bound}; ++c) {first}\n"
        f"{between}"
        f"  for (int64_t c = 0; c < {bound}; ++c) {second}\n"
        "}\n"
    )


@pytest.mark.parametrize(
    ("kernel", "reason"),
    [
        (_passes("a += x[c];", "x[c] = x[c] / a;"), "storing into x[c]"),
        (_passes("if (a < 1.0f) a += x[c];", "y[c] = x[c] / a;"), "only on some turns"),
        (_passes("a += x[c];", "y[c] = x[c] / a;", bound="lens[r]"), "differs between threads"),
        (_passes("a += x[c];", "y[c] = x[c] / a;", "  x[0] = 1.0f;\n"), "storing into x"),
        (_passes("a += x[c];", "y[c] = x[c] + x[c + 1];"), "other than as x[c]"),
    ],
)
def test_unsound_register_paths_are_refused(kernel: KernelSource, reason: str) -> None:
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("kind") == "dispatch"]
    assert reason in (site.refusal or ""), site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.apply(kernel, site)


def test_the_held_elements_are_checked() -> None:
    naive = KernelSource.from_file(FORWARD / "softmax.naive.cu")
    with pytest.raises(MechanismRefused, match="elements=0"):
        _dispatch(naive, Carrier(elements=0))
