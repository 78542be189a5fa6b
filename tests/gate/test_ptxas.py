"""Parsing of `-Xptxas -v` output from captured text (no nvcc needed)."""

from __future__ import annotations

import shutil

import pytest

from klineage.gate import ptxas
from klineage.gate.ptxas import PtxasReport, demangle, parse_ptxas

# Captured from nvcc 13.0, `-arch=sm_90`: no cmem items, "cumulative stack size", a
# non-inlined device function reported after the entries, a maxrregcount warning.
NVCC13_SM90 = (
    (
        "ptxas warning : For profile sm_90 adjusting per thread register count of 16 to lower bound"
        " of 24\n"
        "ptxas info    : Overriding maximum register limit 256 for '_Z5spillPfi' with  24 of"
        " maxrregcount option\n"
    )
    + """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5tkernIdLi64EEvPT_l' for 'sm_90'
ptxas info    : Function properties for _Z5tkernIdLi64EEvPT_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 512 bytes smem
ptxas info    : Compile time = 3.279 ms
ptxas info    : Compiling entry function '_Z5spillPfi' for 'sm_90'
ptxas info    : Function properties for _Z5spillPfi
    2912 bytes stack frame, 3168 bytes spill stores, 3616 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 2912 bytes cumulative stack size
ptxas info    : Compile time = 81.874 ms
ptxas info    : Compiling entry function '_Z3fooPfl' for 'sm_90'
ptxas info    : Function properties for _Z3fooPfl
    256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 256 bytes cumulative stack size, 1024 bytes smem
ptxas info    : Compile time = 4.035 ms
ptxas info    : Function properties for _Z6helperfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
)

# Captured from nvcc 13.0 with `-rdc=true` and two targets: sm_80 still prints cmem, the
# device function's block sits between entries, and each target starts with a gmem line.
NVCC13_RDC_TWO_TARGETS = """\
ptxas info    : 0 bytes gmem, 400 bytes cmem[3]
ptxas info    : Compiling entry function '_Z4usecPf' for 'sm_80'
ptxas info    : Function properties for _Z4usecPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 360 bytes cmem[0]
ptxas info    : Compile time = 0.701 ms
ptxas info    : Function properties for _Z6helperfi
    264 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compile time = 2.632 ms
ptxas info    : Compiling entry function '_Z3fooPfl' for 'sm_80'
ptxas info    : Function properties for _Z3fooPfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]
ptxas info    : Compile time = 1.253 ms
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperfi
    264 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z3fooPfl' for 'sm_90a'
ptxas info    : Function properties for _Z3fooPfl
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.583 ms
"""

# Odd input: an older toolkit's Used line (no barriers, two cmem banks), a frame line glued
# to the next ptxas line, CRLF line ends, unrelated compiler chatter, an extern "C" kernel.
ODD = (
    'kernel.cu(3): warning #177-D: variable "z" was declared but never referenced\r\n'
    "\r\n"
    "ptxas info    : 0 bytes gmem\r\n"
    "ptxas info    : Compiling entry function 'plain_c_kernel' for 'sm_70'\r\n"
    "ptxas info    : Function properties for plain_c_kernel\r\n"
    "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads"
    "ptxas info    : Used 18 registers, 96 bytes smem, 368 bytes cmem[0], 4 bytes cmem[2]\r\n"
    "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
    "serialized due to the presence of Extern calls\r\n"
    "ptxas info    : Used nonsense, 12 bananas\r\n"
    "random trailing line\r\n"
)


def test_real_nvcc13_output_lists_only_entries() -> None:
    report = parse_ptxas(NVCC13_SM90, demangle_names=False)
    assert [k.mangled_name for k in report.kernels] == [
        "_Z5tkernIdLi64EEvPT_l",
        "_Z5spillPfi",
        "_Z3fooPfl",
    ]
    foo = report.kernels[2]
    assert (foo.arch, foo.registers, foo.barriers, foo.shared_bytes) == ("sm_90", 32, 1, 1024)
    assert (foo.stack_bytes, foo.cumulative_stack_bytes) == (256, 256)
    assert foo.constant_bytes is None  # nvcc 13.0 prints no cmem for sm_90
    spill = report.kernels[1]
    assert (spill.spill_store_bytes, spill.spill_load_bytes, spill.stack_bytes) == (
        3168,
        3616,
        2912,
    )
    assert report.total_spills == 3168 + 3616
    # The device function is kept apart and never taken for a kernel.
    assert [f.mangled_name for f in report.device_functions] == ["_Z6helperfi"]
    assert report.device_functions[0].arch == "sm_90"
    assert report.warnings == [
        "For profile sm_90 adjusting per thread register count of 16 to lower bound of 24"
    ]


def test_two_targets_and_device_function_between_entries() -> None:
    report = parse_ptxas(NVCC13_RDC_TWO_TARGETS, demangle_names=False)
    assert [(k.mangled_name, k.arch) for k in report.kernels] == [
        ("_Z4usecPf", "sm_80"),
        ("_Z3fooPfl", "sm_80"),
        ("_Z3fooPfl", "sm_90a"),
    ]
    usec, foo80, foo90 = report.kernels
    assert usec.constant_bytes == 360 and usec.constant_banks == {0: 360}
    assert foo80.shared_bytes == 1024 and foo80.constant_bytes == 368
    assert foo90.constant_bytes is None
    # Frames of the helper must not leak into the kernels around them.
    assert foo80.stack_bytes == 0 and foo90.stack_bytes == 0
    helpers = report.device_functions
    assert [(f.arch, f.stack_bytes) for f in helpers] == [("sm_80", 264), ("sm_90a", 264)]
    assert report.by_name("_Z3fooPfl", arch="sm_90a") is foo90


def test_odd_lines() -> None:
    report = parse_ptxas(ODD)
    (kernel,) = report.kernels
    assert kernel.name == "plain_c_kernel"  # extern "C": nothing to demangle
    assert (kernel.arch, kernel.registers, kernel.barriers) == ("sm_70", 18, 0)
    assert kernel.shared_bytes == 96
    assert kernel.constant_banks == {0: 368, 2: 4} and kernel.constant_bytes == 372
    assert (kernel.stack_bytes, kernel.spill_store_bytes, kernel.spill_load_bytes) == (16, 8, 4)
    assert report.total_spills == 12
    assert any("Potential Performance Loss" in w for w in report.warnings)
    assert report.device_functions == []


def test_empty_and_unrelated_logs() -> None:
    assert parse_ptxas("").kernels == []
    assert parse_ptxas("nvcc warning : something\n\n").kernels == []
    assert PtxasReport.parse(NVCC13_SM90, demangle_names=False).total_spills == 6784


@pytest.mark.skipif(
    shutil.which("cu++filt") is None and shutil.which("c++filt") is None,
    reason="no cu++filt or c++filt to demangle with",
)
def test_demangled_names_and_lookup() -> None:
    report = parse_ptxas(NVCC13_SM90)
    assert report.kernels[0].name == "void tkern<double, 64>(double*, long)"
    assert report.kernels[0].short_name == "tkern"
    assert report.device_functions[0].name == "helper(float, int)"
    foo = report.by_name("foo")
    assert foo is not None and foo.name == "foo(float*, long)"
    assert report.by_name("foo(float*, long)") is foo
    assert report.by_name("_Z3fooPfl") is foo
    assert report.by_name("nope") is None


def test_ambiguous_short_name_raises() -> None:
    report = parse_ptxas(NVCC13_RDC_TWO_TARGETS, demangle_names=False)
    report.kernels[1].name = report.kernels[2].name = "foo(float*, long)"
    with pytest.raises(KeyError, match="ambiguous"):
        report.by_name("foo")
    assert report.by_name("foo", arch="sm_80") is report.kernels[1]


def test_demangle_without_a_tool_keeps_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ptxas.shutil, "which", lambda _name: None)
    assert demangle(["_Z3fooPfl", "bar"]) == ["_Z3fooPfl", "bar"]
    report = parse_ptxas(NVCC13_SM90)
    assert report.kernels[2].name == "_Z3fooPfl"


def test_short_name_of_nested_templates() -> None:
    report = parse_ptxas(NVCC13_SM90, demangle_names=False)
    kernel = report.kernels[0]
    kernel.name = "void ns::gemm<ns::Tile<128, 64>, (int)3>(float const*, float*)"
    assert kernel.short_name == "gemm"
