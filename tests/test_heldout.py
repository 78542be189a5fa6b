"""The held-out problems: each loads, its naive kernel builds without shared memory and keeps to
the naive rules, and its reference runs on the CPU. No GPU needed; the build tests need nvcc."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from klineage.gate.build import Builder, BuildResult
from klineage.gate.inputs import check_reference_outputs, make_inputs, run_reference
from klineage.problem import Problem, Workload, dtype_itemsize, load_problem
from klineage.problem.abi import KernelAbi
from tests.conftest import REPO

HELDOUT = REPO / "heldout"
FOLDERS = sorted(p for p in HELDOUT.iterdir() if p.is_dir()) if HELDOUT.is_dir() else []
EXPECTED_COUNT = 22
MAX_TENSOR_BYTES = 512 * 2**20

# Source text a naive kernel must not contain: shared memory, warp shuffles, read-only cache
# loads, aliasing hints, unrolling and occupancy hints, vector types, fast-math intrinsics.
FORBIDDEN = {
    "shared memory": r"__shared__",
    "warp shuffle": r"__shfl",
    "read-only load": r"__ldg",
    "restrict": r"__restrict__",
    "unroll pragma": r"#\s*pragma\s+unroll",
    "launch bounds": r"__launch_bounds__",
    "vector type": r"\b(?:float[234]|double[234]|int[234]|half2|__half2|__nv_bfloat162)\b",
    "fast exp": r"__expf",
    "rsqrt": r"\brsqrtf?\b",
}

by_folder = pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])


def _problem(folder: Path) -> Problem:
    return load_problem(folder)


def _bytes(problem: Problem, workload: Workload) -> dict[str, int]:
    d = problem.definition
    values = d.axis_values(workload)
    specs = {**d.inputs, **d.outputs}
    return {
        name: math.prod(d.shape_of(spec, values)) * dtype_itemsize(spec.dtype)
        for name, spec in specs.items()
        if not spec.is_scalar
    }


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", "", source, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", source)


@by_folder
def test_the_folder_names_the_problem_it_holds(folder: Path) -> None:
    # `heldout/gelu` holds gelu_tanh_f32; a folder naming another operation misleads
    assert _problem(folder).name.split("_")[0] == folder.name.split("_")[0]


def test_there_are_22_heldout_problems() -> None:
    assert len(FOLDERS) == EXPECTED_COUNT, [p.name for p in FOLDERS]
    names = [_problem(f).name for f in FOLDERS]
    assert len(set(names)) == len(names), "definition names must be unique"


@by_folder
def test_problem_loads_with_workloads_probes_and_kernel(folder: Path) -> None:
    problem = _problem(folder)
    assert problem.kernel_path is not None, "every held-out problem has a kernel.cu"
    assert 3 <= len(problem.workloads) <= 5
    assert 3 <= len(problem.probes) <= 5
    for workload in problem.all_workloads():
        for name, size in _bytes(problem, workload).items():
            assert size <= MAX_TENSOR_BYTES, f"{workload.uuid}: {name} is {size / 2**20:.0f} MiB"


@by_folder
def test_kernel_keeps_to_the_naive_rules(folder: Path) -> None:
    problem = _problem(folder)
    code = _strip_comments(problem.kernel_source().text)
    found = [what for what, pattern in FORBIDDEN.items() if re.search(pattern, code)]
    assert not found, f"{folder.name}/kernel.cu uses: {', '.join(found)}"
    assert re.search(r"<<<\s*\(unsigned\)\s*\(?blocks", code) or "+ 255) / 256" in code
    assert re.search(r",\s*256\s*,\s*0\s*,\s*stream\s*>>>", code), "256-thread blocks on stream"


@by_folder
def test_kernel_exports_the_abi_prototype(folder: Path) -> None:
    problem = _problem(folder)
    want = KernelAbi.from_definition(problem.definition).prototype
    code = " ".join(_strip_comments(problem.kernel_source().text).split())
    got = re.sub(r"\s*([(),*])\s*", r"\1", code)
    assert re.sub(r"\s*([(),*])\s*", r"\1", want) in got, f"expected {want}"


@by_folder
def test_reference_runs_on_the_cpu_on_the_smallest_probe(folder: Path) -> None:
    problem = _problem(folder)
    smallest = min(problem.probes, key=lambda w: sum(_bytes(problem, w).values()))
    inputs = make_inputs(problem.definition, smallest, seed=0, device="cpu")
    outputs = run_reference(problem.definition, inputs)
    check_reference_outputs(problem.definition, smallest, outputs)


@pytest.fixture(scope="module")
def builds(device_builder: Builder) -> dict[str, BuildResult]:
    # compiled and read by ptxas, never run on the CPU: device-only builds suffice
    builder = device_builder
    sources = [(_problem(f).kernel_source().text, f"{f.name}/kernel.cu") for f in FOLDERS]
    results = builder.build_many(sources)
    return {f.name: r for f, r in zip(FOLDERS, results, strict=True)}


@pytest.mark.nvcc
@by_folder
def test_kernel_builds_without_shared_memory(folder: Path, builds: dict[str, BuildResult]) -> None:
    result = builds[folder.name]
    assert result.ok, result.message
    assert result.report is not None and result.report.kernels, "ptxas reported no kernels"
    for kernel in result.report.kernels:
        assert kernel.shared_bytes == 0, f"{kernel.name} uses {kernel.shared_bytes} B of smem"
        assert kernel.spill_bytes == 0, f"{kernel.name} spills {kernel.spill_bytes} B"
