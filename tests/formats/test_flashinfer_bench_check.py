"""bench/flashinfer_bench_check.py: its dry run writes a dataset folder that flashinfer-bench's
own TraceSet reads back with the right names and uuids; the call flashinfer-bench makes (its
inputs, then the outputs it allocates) is the one the generated binding declares, and its
reference runs on those inputs (both on the CPU); and, on a GPU, one real Benchmark run passes."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from klineage.formats.solution import BINDING_FILE, export_solution
from klineage.problem import dump_definition, load_problem
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

fib = pytest.importorskip(
    "flashinfer_bench",
    reason="needs flashinfer-bench (pip install --no-deps flashinfer-bench safetensors)",
)
torch = pytest.importorskip("torch")

SCRIPT = load_bench_script("flashinfer_bench_check")
RUNNABLE = [f for f in SCRIPT.DEFAULT_PROBLEMS if not f.endswith("/topk")]


def test_the_dry_run_writes_a_dataset_flashinfer_bench_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "unused"))  # main() sets it; restored
    out = tmp_path / "report.json"
    code = SCRIPT.main(["--dry-run", "--work", str(tmp_path / "work"), "--out", str(out)])
    assert code == 0

    trace_set = fib.TraceSet.from_path(str(tmp_path / "work" / "dataset"))
    names = set()
    for folder in RUNNABLE:
        problem = load_problem(REPO / folder)
        name = problem.definition.name
        names.add(name)
        assert trace_set.definitions[name].op_type == problem.definition.op_type
        assert [s.name for s in trace_set.solutions[name]] == [f"{name}_klineage"]
        solution = trace_set.get_solution(f"{name}_klineage")
        assert solution.definition == name and solution.spec.binding.value == "torch"
        assert [t.workload.uuid for t in trace_set.workloads[name]] == [
            w.uuid for w in problem.workloads
        ]
        assert all(t.is_workload_trace() for t in trace_set.workloads[name])
    assert set(trace_set.definitions) == names  # topk is not written
    assert trace_set.traces == {}

    report = json.loads(out.read_text())
    assert report["dry_run"] and report["ok"]
    assert report["command"].startswith("python bench/flashinfer_bench_check.py --dry-run")
    assert report["flashinfer_bench_version"] == fib.__version__
    status = {e["problem"]: e["status"] for e in report["problems"]}
    assert status == {f: ("SKIPPED" if f.endswith("/topk") else "EXPORTED") for f in status}
    topk = next(e for e in report["problems"] if e["problem"].endswith("/topk"))
    assert "'k'" in topk["reason"]


def test_a_problem_that_fails_to_export_is_reported_and_the_others_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "unused"))
    out = tmp_path / "report.json"
    missing = str(tmp_path / "no_such_problem")
    work = str(tmp_path / "work")
    code = SCRIPT.main([missing, RUNNABLE[0], "--dry-run", "--work", work, "--out", str(out)])
    assert code == 1
    first, second = json.loads(out.read_text())["problems"]
    assert first["status"] == "EXPORT_ERROR" and first["error"]
    assert second["status"] == "EXPORTED"


def _wrapper_params(binding: str) -> list[tuple[str, str]]:
    found = re.search(r"void klineage_run\((.*?)\) \{", binding)
    assert found is not None
    return [tuple(p.rsplit(" ", 1)) for p in found.group(1).split(", ")]  # type: ignore[misc]


@pytest.mark.parametrize("folder", RUNNABLE)
def test_flashinfer_bench_calls_the_binding_as_it_is_declared(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashinfer_bench.bench.evaluators.utils import allocate_outputs, normalize_result
    from flashinfer_bench.bench.utils import gen_inputs
    from flashinfer_bench.compile import BuilderRegistry

    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "cache"))
    problem = load_problem(REPO / folder)
    assert SCRIPT.flashinfer_bench_gap(problem) is None
    written = dump_definition(problem.definition, tmp_path / "definition.json")
    definition = fib.Definition.model_validate_json(written.read_text())
    smallest = min(
        problem.workloads, key=lambda w: math.prod(problem.definition.axis_values(w).values())
    )
    workload = fib.Workload.model_validate(smallest.model_dump(mode="json"))
    inputs = gen_inputs(definition, workload, device="cpu")
    outputs = allocate_outputs(definition, inputs, "cpu")

    solution = export_solution(problem, problem.kernel_source(), name="x")
    params = _wrapper_params(solution.source(BINDING_FILE).content)
    assert [name for _, name in params] == [*definition.inputs, *definition.outputs]
    for (kind, name), value in zip(params, [*inputs, *outputs], strict=True):
        assert (kind == "at::Tensor") == isinstance(value, torch.Tensor), name

    # the reference as flashinfer-bench builds and calls it: inputs alone, outputs it compares
    reference = BuilderRegistry.get_instance().build_reference(definition)
    with torch.no_grad():
        result = normalize_result(definition, reference(*inputs), "cpu")
    assert [(t.shape, t.dtype) for t in result] == [(t.shape, t.dtype) for t in outputs]


@pytest.mark.gpu
@pytest.mark.nvcc
def test_flashinfer_bench_passes_the_exported_softmax_on_the_gpu(tmp_path: Path) -> None:
    from torch.utils.cpp_extension import is_ninja_available

    if not is_ninja_available() and not (Path(sys.executable).parent / "ninja").exists():
        pytest.skip("needs ninja (torch's extension builder)")
    out = tmp_path / "report.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "flashinfer_bench_check.py"),
        str(REPO / "expert_kernels" / "softmax"),
        "--max-workloads",
        "2",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    report = json.loads(out.read_text())
    (entry,) = report["problems"]
    assert entry["status"] == "PASSED"
    rows = entry["workload_results"]
    assert [r["workload"] for r in rows] == [
        w.uuid for w in load_problem(REPO / "expert_kernels" / "softmax").workloads[:2]
    ]
    for row in rows:
        assert row["status"] == "PASSED"
        assert row["latency_ms"] > 0 and row["reference_latency_ms"] > 0 and row["speedup"] > 0
    assert report["trace_set"]["traces_written"] == 2
