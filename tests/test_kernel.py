"""Kernel sources: fingerprints and the ABI derived from a definition."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from klineage.kernel import AbiError, KernelAbi, KernelSource, fingerprint_of
from klineage.problem import load_definition
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
