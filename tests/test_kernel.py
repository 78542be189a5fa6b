"""Kernel sources: fingerprints and the ABI derived from a definition."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from klineage.kernel import KernelSource, fingerprint_of
from klineage.problem import load_definition, load_problem
from klineage.problem.abi import AbiError, KernelAbi
from tests.conftest import FIXTURES, REPO


def test_fingerprint_ignores_line_endings_and_trailing_blanks() -> None:
    text = "__global__ void k() {}\nint x;\n"
    assert fingerprint_of(text) == fingerprint_of(text.replace("\n", "\r\n"))
    assert fingerprint_of(text) == fingerprint_of("__global__ void k() {}   \nint x;\n\n\n")
    assert fingerprint_of(text) != fingerprint_of(text.replace("x", "y"))
    assert len(fingerprint_of(text)) == 16


def test_kernel_source_from_file(tmp_path: Path) -> None:
    path = tmp_path / "k.cu"
    path.write_text("int a;\n")
    kernel = KernelSource.from_file(path)
    assert kernel.name == "k.cu" and kernel.path == path
    assert kernel.fingerprint == fingerprint_of("int a;\n")
    with pytest.raises(FileNotFoundError, match="no such kernel file"):
        KernelSource.from_file(tmp_path / "missing.cu")


def test_signature_from_softmax_definition() -> None:
    abi = KernelAbi.from_definition(load_definition(REPO / "expert_kernels" / "softmax"))
    assert abi.prototype == (
        'extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, '
        "cudaStream_t stream)"
    )
    assert abi.argtypes == [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]


def test_scalars_by_value_and_axes_in_definition_order() -> None:
    abi = KernelAbi.from_definition(load_definition(FIXTURES / "problems" / "scale_rows"))
    assert [p.name for p in abi.params] == ["x", "alpha", "y", "rows", "cols", "stream"]
    assert abi.argtypes[1] is ctypes.c_float
    assert "float alpha" in abi.prototype


def _definition_with(tmp_path: Path, **changes: object):
    data = json.loads((FIXTURES / "problems" / "scale_rows" / "definition.json").read_text())
    data.update(changes)
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "definition.json").write_text(json.dumps(data))
    return load_definition(folder)


def test_const_axes_are_not_parameters_and_half_types_are_spelled(tmp_path: Path) -> None:
    definition = _definition_with(
        tmp_path,
        axes={"rows": {"type": "var"}, "cols": {"type": "const", "value": 64}},
        inputs={
            "x": {"shape": ["rows", "cols"], "dtype": "bfloat16"},
            "alpha": {"shape": None, "dtype": "float32"},
        },
        outputs={"y": {"shape": ["rows", "cols"], "dtype": "float16"}},
    )
    abi = KernelAbi.from_definition(definition)
    assert abi.prototype == (
        'extern "C" int run(const __nv_bfloat16* x, float alpha, __half* y, int64_t rows, '
        "cudaStream_t stream)"
    )


def test_half_scalar_is_refused_with_a_reason(tmp_path: Path) -> None:
    definition = _definition_with(
        tmp_path,
        inputs={
            "x": {"shape": ["rows", "cols"], "dtype": "float32"},
            "alpha": {"shape": None, "dtype": "float16"},
        },
    )
    with pytest.raises(AbiError, match="cannot be passed by value"):
        KernelAbi.from_definition(definition)


def test_bind_sets_the_signature_on_a_real_library() -> None:
    libc = ctypes.CDLL(None)
    definition = load_definition(FIXTURES / "problems" / "scale_rows")
    with pytest.raises(AbiError, match="does not export"):
        KernelAbi.from_definition(definition).bind(libc)


def test_inplace_output_has_no_pointer_and_its_input_is_mutable(tmp_path: Path) -> None:
    definition = _definition_with(
        tmp_path,
        inputs={
            "x": {"shape": ["rows", "cols"], "dtype": "float32"},
            "alpha": {"shape": None, "dtype": "float32"},
        },
        outputs={
            "y": {"shape": ["rows", "cols"], "dtype": "float32"},
            "x_out": {"shape": ["rows", "cols"], "dtype": "float32", "inplace_of": "x"},
        },
        reference="def run(x, alpha):\n    return x * alpha, x + 1\n",
    )
    abi = KernelAbi.from_definition(definition)
    assert abi.prototype == (
        'extern "C" int run(float* x, float alpha, float* y, int64_t rows, int64_t cols, '
        "cudaStream_t stream)"
    )


SOFTMAX_PROTOTYPE = (
    'extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream)'
)


def _softmax_abi() -> KernelAbi:
    return KernelAbi.from_definition(load_definition(REPO / "expert_kernels" / "softmax"))


def test_a_run_missing_an_axis_is_named_with_the_expected_line() -> None:
    source = (
        "#include <cuda_runtime.h>\n"
        "// run(x, y, rows, cols, stream) is what the definition wants\n"
        'extern "C" int run(const float* x, float* y, int64_t rows, cudaStream_t stream) {\n'
        "  return 0;\n}\n"
    )
    message = _softmax_abi().mismatch(source, "mine.cu")
    assert message is not None
    first, found, expected = message.splitlines()
    assert first.startswith("mine.cu:3: run(...) does not match")
    assert "4 parameters where the definition implies 5" in first and "cols" in first
    assert found.split(":", 1)[1].strip().startswith('extern "C" int run(const float* x')
    assert expected == f"  expected: {SOFTMAX_PROTOTYPE}"


def test_a_narrow_axis_and_a_value_for_a_pointer_are_mismatches() -> None:
    narrow = 'extern "C" int run(const float* x, float* y, int rows, long long cols, void* s);'
    message = _softmax_abi().mismatch(narrow)
    assert message is not None and "parameter 3 `int rows` should be int64_t rows" in message
    assert "parameter 4" not in message  # long long is 64 bits, and a void* carries the stream
    value = 'extern "C" { int run(float x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {'
    assert "should be a device pointer" in (_softmax_abi().mismatch(value + "}}") or "")


def test_matching_runs_pass_whatever_their_names_and_qualifiers() -> None:
    abi = _softmax_abi()
    variants = [
        SOFTMAX_PROTOTYPE + " { return 0; }",
        'extern "C" int run(const float* __restrict__ in, float* __restrict__ out, '
        "int64_t, int64_t, cudaStream_t) { return 0; }",
        'extern "C" __host__ int run(const void* x, void* y, long rows, size_t cols,\n'
        "                            cudaStream_t stream) { return run_impl(x, y); }",
        "__global__ void k() {}\n",  # no run at all: the symbol check reports that
    ]
    assert [abi.mismatch(v) for v in variants] == [None] * len(variants)


def test_every_committed_kernel_matches_its_definition() -> None:
    folders = sorted([*REPO.glob("expert_kernels/*/"), *REPO.glob("heldout/*/")])
    assert len(folders) >= 27
    for folder in folders:
        problem = load_problem(folder)
        abi = KernelAbi.from_definition(problem.definition)
        assert abi.mismatch(problem.kernel_source().text) is None, folder.name
