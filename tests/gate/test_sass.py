"""Machine code of a build: fingerprints, histograms, deltas, and the no-op check, on real
nvcc builds of tests/fixtures/sass/kernel.cu and small edits of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate import sass
from klineage.gate.build import Builder
from klineage.gate.noop import NoOpReason, edited_lines, no_machine_code_change

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sass" / "kernel.cu"
BASE = FIXTURE.read_text()

# edits of the fixture, each one kind of change
NO_PRAGMA = BASE.replace("#pragma unroll\n", "")
SCALAR_DEAD_BRANCH = BASE.replace(
    "reinterpret_cast<float4*>(y)[i] = reinterpret_cast<const float4*>(x)[i];",
    "for (int k = 0; k < 4; ++k) y[i * 4 + k] = x[i * 4 + k];",
)
BLOCK_128 = BASE.replace("const int threads = 256;", "const int threads = 128;")
WIDE_SUM = BASE.replace(
    "  for (int k = 0; k < 4; ++k) acc += x[i * 4 + k];",
    "  const float4 v = reinterpret_cast<const float4*>(x)[i];\n  acc = v.x + v.y + v.z + v.w;",
)
RESTRICT = BASE.replace(
    "sum4(const float* x, float* y,", "sum4(const float* __restrict__ x, float* __restrict__ y,"
)
COMMENTED = "// a comment changes the translation unit's hash, not its code\n" + BASE


@pytest.fixture
def builder(shared_builder: Builder) -> Builder:
    """The run's builder: these tests read what a build holds, so BASE compiles once for all
    of them (the one test of what the cache keeps has its own)."""
    return shared_builder


def test_edits_apply() -> None:
    # each variant really differs from the fixture (a silent no-op replace would pass below)
    variants = {BASE, NO_PRAGMA, SCALAR_DEAD_BRANCH, BLOCK_128, WIDE_SUM, RESTRICT, COMMENTED}
    assert len(variants) == 7


@pytest.mark.nvcc
def test_fingerprints_ignore_the_translation_units_hash(builder: Builder) -> None:
    base, commented = builder.build(BASE), builder.build(COMMENTED)
    assert base.ok and commented.ok
    assert base.machine_code is not None and commented.machine_code is not None
    assert base.machine_code.fingerprint == commented.machine_code.fingerprint
    assert {f.name.split("(")[0] for f in base.machine_code.kernels} == {
        "sum4",
        "void copy_wide<1>",
    }
    assert all(f.instructions > 0 for f in base.machine_code.kernels)
    assert base.machine_code.fingerprint_seconds < 1.0


@pytest.mark.nvcc
@pytest.mark.parametrize(("edited", "same_device"), [(BLOCK_128, True), (WIDE_SUM, False)])
def test_a_real_change_is_not_a_no_op(builder: Builder, edited: str, same_device: bool) -> None:
    # a host-only choice (the block size) and a device change (float4 loads) both count
    base, other = builder.build(BASE), builder.build(edited)
    assert base.machine_code is not None and other.machine_code is not None
    assert base.machine_code.same_device(other.machine_code) is same_device
    assert not base.machine_code.same_host(other.machine_code) or not same_device
    assert no_machine_code_change(builder, BASE, edited) is None


@pytest.mark.nvcc
def test_a_kernel_stubs_argument_layout_is_not_a_host_change(builder: Builder) -> None:
    # `__restrict__` on a kernel's parameters makes gcc lay out the host stub's argument
    # copies differently; the launch is the same, so the host fingerprint is too
    base, restricted = builder.build(BASE), builder.build(RESTRICT)
    assert base.machine_code is not None and restricted.machine_code is not None
    assert base.machine_code.same_host(restricted.machine_code)


@pytest.mark.nvcc
@pytest.mark.nvdisasm
def test_pragma_the_compiler_already_applies(builder: Builder) -> None:
    refusal = no_machine_code_change(builder, BASE, NO_PRAGMA)
    assert refusal is not None
    assert refusal.reason is NoOpReason.COMPILER_ALREADY_DOES_IT
    pragma = BASE.splitlines().index("#pragma unroll") + 1
    assert refusal.edited_lines == [pragma, pragma + 1]


@pytest.mark.nvcc
@pytest.mark.nvdisasm
def test_edit_in_a_branch_no_instantiation_keeps(builder: Builder) -> None:
    refusal = no_machine_code_change(builder, BASE, SCALAR_DEAD_BRANCH)
    assert refusal is not None
    assert refusal.reason is NoOpReason.NEVER_INSTANTIATED
    assert "never instantiated" in refusal.message


@pytest.mark.nvcc
@pytest.mark.nvdisasm
def test_histogram_delta_and_cache(build_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builder = Builder(cache_dir=build_cache)  # its own cache: nvdisasm runs here first
    base = builder.build(BASE, disassemble=True)
    wide = builder.build(WIDE_SUM, disassemble=True)
    assert base.machine_code is not None and wide.machine_code is not None
    sum4 = next(f for f in base.machine_code.kernels if f.name.startswith("sum4"))
    assert sum4.histogram == {"LDG.E": 4, "STG.E": 1}
    assert base.machine_code.disassembler and base.machine_code.disassembly_seconds > 0
    lines = sass.render_delta(sass.delta(base.machine_code, wide.machine_code))
    assert lines == ["`LDG.E` x4 -> `LDG.E.128` x1 in `sum4` " + lines[0].rsplit("` ", 1)[1]]
    assert sass.signature_shown(("global_width",), wide.machine_code, base.machine_code)
    assert not sass.signature_shown(("SHFL", "BAR"), wide.machine_code, base.machine_code)
    # the histogram is kept in the entry: a second look never runs nvdisasm again
    monkeypatch.setattr(sass, "_nvdisasm", _no_nvdisasm)
    again = builder.build(BASE, disassemble=True)
    assert again.cached and again.machine_code == base.machine_code


def _no_nvdisasm(*args: object) -> tuple[str, str]:
    raise AssertionError("nvdisasm ran for a histogram the cache holds")


@pytest.mark.nvcc
@pytest.mark.nvdisasm
def test_signature_present_on_a_target(builder: Builder) -> None:
    wide = builder.build(WIDE_SUM, disassemble=True).machine_code
    base = builder.build(BASE, disassemble=True).machine_code
    assert wide is not None and base is not None
    gained = {"global_width:LDG.128": 1}
    lost = {"global_width:LDG.32": 4}
    # the fixture's wide variant still has scalar loads (copy_wide<1>): the skill is proposed
    assert not sass.signature_present(("global_width",), gained, lost, wide)
    assert not sass.signature_present(("global_width",), gained, lost, base)
    assert sass.signature_present(("global_width",), gained, {}, wide)
    assert not sass.signature_present((), gained, {}, wide)


def test_edited_lines_cover_the_line_after_a_removed_pragma() -> None:
    pragma = BASE.splitlines().index("#pragma unroll") + 1
    assert edited_lines(BASE, NO_PRAGMA) == [pragma, pragma + 1]
    assert edited_lines(BASE, BASE) == []


def test_histograms_from_a_listing() -> None:
    listing = (
        '\t.section\t.text._Z4sum4PKfPfl,"ax",@progbits\n'
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;\n"
        "        /*0010*/              @!P0 LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;\n"
        "        /*0020*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], RZ ;\n"
        "        /*0030*/                   HFMA2.MMA R5, -RZ, RZ, 0, 0 ;\n"
        "        /*0040*/                   SHFL.BFLY PT, R3, R2, 0x10, 0x1f ;\n"
    )
    assert sass.parse_histograms(listing) == {
        "_Z4sum4PKfPfl": {
            "HGMMA.64x256x16.F32.BF16": 1,
            "LDG.E.128.CONSTANT": 1,
            "SHFL.BFLY": 1,
        }
    }


@pytest.mark.nvcc
@pytest.mark.nvdisasm
@pytest.mark.usefixtures("shared_cache_dir")
def test_build_only_prints_the_machine_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from klineage.cli import app

    monkeypatch.setenv("COLUMNS", "200")
    problem = Path(__file__).resolve().parents[1] / "fixtures" / "mining" / "exp_scale"
    result = CliRunner().invoke(app, ["gate", str(problem), "--build-only"])
    assert result.exit_code == 0, result.output
    assert "machine code" in result.output and "LDG.E.CONSTANT" in result.output
    assert "device " in result.output and ", host " in result.output


@pytest.mark.parametrize(
    "spelling",
    [
        "void (anonymous namespace)::rows<512, false>(const float *, float *, long)",
        "void <unnamed>::rows<(int)512, (bool)0>(const float *, float *, long)",
    ],
)
def test_a_kernel_reads_the_same_from_either_demangler(spelling: str) -> None:
    assert sass.short_name(spelling) == "rows<512,false>"


def test_a_true_template_argument_from_cu_filt() -> None:
    assert sass.short_name("void <unnamed>::rows<(int)-4, (bool)1>(float *)") == "rows<-4,true>"
