"""What klineage writes in the FlashInfer-Trace format, read by flashinfer-bench's own models
(`flashinfer_bench.data`, 0.1.2): every problem's definition and workloads, every problem's
kernel exported as a solution, and the traces of a kept H200 verdict. The models are
flashinfer-bench's, so a field it renames or a value it stops accepting fails here, not in a
user's flashinfer-bench run. `.ci/run` installs the package without its GPU dependencies
(flashinfer-python, tvm-ffi), which its data models do not import."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.formats.solution import (
    BINDING_FILE,
    export_solution,
    import_solution,
    kernel_of_exported,
)
from klineage.formats.solution import Solution as OurSolution
from klineage.gate.result import GateVerdict
from klineage.gate.trace import verdict_to_traces
from klineage.problem import dump_definition, load_problem
from tests.conftest import FIXTURES, REPO

fib = pytest.importorskip(
    "flashinfer_bench.data",
    reason="needs flashinfer-bench (pip install --no-deps "
    "flashinfer-bench safetensors, as .ci/run does)",
)

PROBLEMS = sorted(
    p.parent
    for folder in ("expert_kernels", "heldout")
    for p in (REPO / folder).glob("*/definition.json")
)
TMA = FIXTURES / "problems" / "tma_copy"
KEPT_VERDICT = REPO / "bench" / "results" / "gemm_wgmma_verdict.json"


def test_the_problem_folders_are_the_ones_the_repo_holds() -> None:
    names = {p.name for p in PROBLEMS}
    assert {"softmax", "gemm_bf16", "sgemm", "transpose_2d"} <= names and len(names) >= 30


@pytest.mark.parametrize("folder", PROBLEMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_definition_workloads_and_exported_solution_read_in_flashinfer_bench(
    folder: Path, tmp_path: Path
) -> None:
    problem = load_problem(folder)
    written = dump_definition(problem.definition, tmp_path / "definition.json")
    definition = fib.Definition.model_validate_json(written.read_text(encoding="utf-8"))
    assert definition.name == problem.definition.name
    assert set(definition.inputs) == set(problem.definition.inputs)
    assert set(definition.outputs) == set(problem.definition.outputs)
    for workload in problem.all_workloads():
        theirs = fib.Workload.model_validate(workload.model_dump(mode="json"))
        assert theirs.uuid == workload.uuid and dict(theirs.axes) == dict(workload.axes)

    kernel = problem.kernel_source()
    solution = export_solution(problem, kernel, name=f"{problem.name}_klineage")
    theirs_solution = fib.Solution.model_validate_json(solution.model_dump_json())
    assert theirs_solution.definition == definition.name
    assert theirs_solution.spec.language == fib.SupportedLanguages.CUDA
    assert theirs_solution.spec.binding == fib.SupportedBindings.TORCH
    assert theirs_solution.get_entry_path() == Path(BINDING_FILE)
    assert theirs_solution.get_entry_symbol() == "run"
    # what flashinfer-bench writes back (its own dump) is still ours to import
    back = OurSolution.model_validate_json(theirs_solution.model_dump_json())
    assert kernel_of_exported(back).text == kernel.text


def test_a_solution_with_link_flags_keeps_them_through_flashinfer_bench(tmp_path: Path) -> None:
    """flashinfer-bench 0.1.2 has no compile_options field (SOL-ExecBench's); it keeps unknown
    fields on read, and an import of its dump gets the flags back."""
    problem = load_problem(TMA)
    assert not problem.compile_options.empty
    solution = export_solution(problem, problem.kernel_source(), name="tma_copy_klineage")
    theirs = fib.Solution.model_validate_json(solution.model_dump_json())
    dumped = tmp_path / "solution.json"
    dumped.write_text(json.dumps(json.loads(solution.model_dump_json())), encoding="utf-8")
    assert theirs.name == "tma_copy_klineage"
    out = tmp_path / "imported"
    import_solution(
        dumped,
        out,
        definition_path=TMA / "definition.json",
        workloads_path=TMA / "workloads.jsonl",
    )
    assert load_problem(out).compile_options == problem.compile_options


def test_the_traces_of_a_kept_h200_verdict_read_as_flashinfer_bench_traces() -> None:
    verdict = GateVerdict.model_validate_json(KEPT_VERDICT.read_text())
    problem = load_problem(REPO / "expert_kernels" / "gemm_bf16")
    traces = verdict_to_traces(verdict, problem, solution="gemm_bf16_wgmma")
    assert len(traces) == len(verdict.workloads) > 0
    for trace in traces:
        theirs = fib.Trace.model_validate(trace)
        assert not theirs.is_workload_trace()
        assert theirs.evaluation is not None
        assert theirs.evaluation.status.value == trace["evaluation"]["status"]
        if theirs.is_successful():
            assert theirs.evaluation.performance is not None
            assert theirs.evaluation.performance.latency_ms > 0
    assert any(fib.Trace.model_validate(t).is_successful() for t in traces)
