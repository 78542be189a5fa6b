"""FlashInfer-Trace solutions (files written here) in and out: a kernel exported with its torch
binding imports back to the same kernel, a solution in klineage's ABI becomes a problem folder,
and a solution klineage cannot gate says why, with the line it expects."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from klineage.formats.solution import (
    BINDING_FILE,
    OPTIONS_FILE,
    SolutionError,
    binding_source,
    export_solution,
    import_solution,
    load_solution,
)
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import FIXTURES, REPO

PROBLEM = FIXTURES / "problems" / "scale_rows"
KERNEL = FIXTURES / "kernels" / "scale_rows" / "correct.cu"
EXPECTED_LINE = (
    'extern "C" int run(const float* x, float alpha, float* y, int64_t rows, int64_t cols, '
    "cudaStream_t stream)"
)


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path


def _ours(**spec: object) -> dict:
    return {
        "name": "scale_rows_hand",
        "definition": "scale_rows_f32",
        "author": "a test",
        "spec": {
            "language": "cuda",
            "target_hardware": ["NVIDIA H200"],
            "entry_point": "kernel.cu::run",
            **spec,
        },
        "sources": [{"path": "kernel.cu", "content": KERNEL.read_text()}],
    }


def test_an_exported_kernel_imports_back_unchanged(tmp_path: Path) -> None:
    problem = load_problem(PROBLEM)
    kernel = KernelSource.from_file(KERNEL)
    solution = export_solution(problem, kernel, name="scale_rows_klineage")
    assert solution.spec.entry_point == f"{BINDING_FILE}::run" and solution.spec.binding == "torch"
    path = _write(tmp_path / "solution.json", solution.model_dump(mode="json"))
    back = import_solution(
        path,
        tmp_path / "imported",
        definition_path=PROBLEM / "definition.json",
        workloads_path=PROBLEM / "workloads.jsonl",
    )
    assert back.definition == problem.definition
    assert KernelSource.from_file(back.root / "kernel.cu").fingerprint == kernel.fingerprint
    assert not (back.root / BINDING_FILE).exists()  # our binding is not part of the problem


def test_the_binding_reads_axes_from_shapes_and_calls_run_in_abi_order() -> None:
    text = binding_source(load_problem(PROBLEM).definition)
    declared = (
        'extern "C" int run(const void* x, float alpha, void* y, int64_t rows, int64_t cols, '
        "cudaStream_t stream);"
    )
    called = (
        "run(x.data_ptr(), static_cast<float>(alpha), y.data_ptr(), x.size(0), x.size(1), "
        "c10::cuda::getCurrentCUDAStream())"
    )
    assert declared in text and called in text


def test_an_output_updated_in_place_gets_the_input_copied_into_its_own_tensor() -> None:
    """flashinfer-bench passes every input, then every output (a fresh tensor each), so the
    binding copies `residual` into `residual_out` and runs our kernel in place on that."""
    text = binding_source(load_problem(REPO / "expert_kernels" / "fused_add_rmsnorm").definition)
    wrapper = (
        "void klineage_run(at::Tensor x, at::Tensor residual, at::Tensor weight, "
        "double eps, at::Tensor y, at::Tensor residual_out) {"
    )
    declared = (
        'extern "C" int run(const void* x, void* residual, const void* weight, float eps, '
        "void* y, int64_t tokens, int64_t hidden, cudaStream_t stream);"
    )
    called = (
        "run(x.data_ptr(), residual_out.data_ptr(), weight.data_ptr(), static_cast<float>(eps), "
        "y.data_ptr(), x.size(0), x.size(1), c10::cuda::getCurrentCUDAStream())"
    )
    assert wrapper in text and declared in text and called in text
    assert text.index("residual_out.copy_(residual);") < text.index(called)


@pytest.mark.nvcc
def test_the_binding_compiles_against_torch_headers(tmp_path: Path) -> None:
    import torch.utils.cpp_extension as ext

    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("needs g++")
    if not any(
        (Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in ext.include_paths()
    ):
        pytest.skip("needs a CUDA build of torch (its c10/cuda headers)")
    source = tmp_path / BINDING_FILE
    source.write_text(binding_source(load_problem(PROBLEM).definition))
    includes = [*ext.include_paths(), *_nvcc_includes(), sysconfig.get_paths()["include"]]
    command = [compiler, "-std=c++17", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=binding"]
    command += [f"-I{p}" for p in includes] + [str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def _nvcc_includes() -> list[str]:
    """The CUDA headers' folders, as nvcc itself passes them (its dry run prints them)."""
    dry = subprocess.run(
        ["nvcc", "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return re.findall(r'INCLUDES="-I([^"]+)"', dry.stderr)


def test_a_solution_in_our_abi_becomes_a_problem_with_its_compile_options(tmp_path: Path) -> None:
    data = _ours(compile_options={"ld_flags": ["-lcuda"]})
    path = _write(tmp_path / "solution.json", data)
    problem = import_solution(
        path,
        tmp_path / "p",
        definition_path=PROBLEM / "definition.json",
        workloads_path=PROBLEM / "workloads.jsonl",
    )
    assert (problem.root / "kernel.cu").read_text() == KERNEL.read_text()
    assert json.loads((problem.root / OPTIONS_FILE).read_text()) == {"ld_flags": ["-lcuda"]}
    assert problem.compile_options.ld_flags == ("-lcuda",)
    # and out again: the solution carries the folder's flags, and reads back the same
    exported = export_solution(problem, problem.kernel_source(), name="scale_rows_linked")
    options = exported.spec.compile_options
    assert options is not None and options.ld_flags == ("-lcuda",)
    out = _write(tmp_path / "exported.json", exported.model_dump(mode="json", exclude_none=True))
    assert load_solution(out).spec.compile_options == problem.compile_options


def test_a_solution_without_compile_options_exports_none(tmp_path: Path) -> None:
    solution = export_solution(
        load_problem(PROBLEM), KernelSource.from_file(KERNEL), name="scale_rows_plain"
    )
    assert solution.spec.compile_options is None


@pytest.mark.parametrize(
    ("options", "phrase"),
    [
        ({"ldflags": ["-lcuda"]}, "ldflags"),
        ({"cuda_cflags": ["-arch=sm_80"]}, "chooses the target"),
    ],
)
def test_bad_compile_options_in_a_solution_name_the_file(
    tmp_path: Path, options: dict, phrase: str
) -> None:
    path = _write(tmp_path / "solution.json", _ours(compile_options=options))
    with pytest.raises(SolutionError, match=rf"solution.json: spec.compile_options.*{phrase}"):
        import_solution(path, tmp_path / "p", definition_path=PROBLEM / "definition.json")
    assert not (tmp_path / "p").exists()  # nothing written


def test_a_kernel_goes_into_an_existing_problem_folder(tmp_path: Path) -> None:
    folder = tmp_path / "existing"
    shutil.copytree(PROBLEM, folder)
    path = _write(tmp_path / "solution.json", _ours())
    problem = import_solution(path, folder)
    assert problem.kernel_path is not None and problem.kernel_path.read_text() == KERNEL.read_text()


def test_sol_execbench_spells_language_as_a_list(tmp_path: Path) -> None:
    data = _ours()
    data["spec"]["languages"] = [data["spec"].pop("language")]
    assert load_solution(_write(tmp_path / "s.json", data)).spec.language == "cuda"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"definition": "softmax_rows_f32"}, "implements 'softmax_rows_f32'"),
        ({"spec": {"binding": "tvm-ffi"}}, "spec.binding is 'tvm-ffi'"),
        ({"spec": {"entry_point": "kernel.cu::launch"}}, "must name 'run'"),
    ],
)
def test_a_solution_klineage_cannot_gate_says_why_and_what_it_expects(
    tmp_path: Path, change: dict, message: str
) -> None:
    data = _ours()
    for key, value in change.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    path = _write(tmp_path / "s.json", data)
    with pytest.raises(SolutionError, match=message) as info:
        import_solution(
            path,
            tmp_path / "p",
            definition_path=PROBLEM / "definition.json",
            workloads_path=PROBLEM / "workloads.jsonl",
        )
    if "definition" not in change:
        assert EXPECTED_LINE in str(info.value)


def test_a_malformed_solution_names_the_file_and_field(tmp_path: Path) -> None:
    data = _ours()
    data["spec"]["entry_point"] = "kernel.cu"
    with pytest.raises(SolutionError, match=r"s\.json: spec: .*'<file>::<symbol>'"):
        load_solution(_write(tmp_path / "s.json", data))
