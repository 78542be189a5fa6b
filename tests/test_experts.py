"""The expert problems: they validate, build, run their references on the CPU (CI), and pass
their gate on every workload (GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.gate.inputs import check_reference_outputs, make_inputs, run_reference
from klineage.kernel import KernelSource
from klineage.problem import Problem, load_problem
from tests.conftest import REPO

EXPERTS = sorted(
    p for p in (REPO / "expert_kernels").iterdir() if (p / "definition.json").is_file()
)


def _smallest_probe(problem: Problem):
    def size(workload) -> int:
        total = 1
        for value in problem.definition.axis_values(workload).values():
            total *= value
        return total

    return min(problem.probes or problem.workloads, key=size)


def test_the_three_memory_bound_experts_exist() -> None:
    names = {p.name for p in EXPERTS}
    assert {"softmax", "fused_add_rmsnorm", "topk"} <= names


# Experts for the idioms the held-out set needs (issue 18), each on an op no held-out problem
# has: a SIMT GEMM, a padded tiled transpose, a column reduction, a vectorized gather, a
# warp-per-row pooling, thread coarsening.
IDIOM_EXPERTS = [
    "linear_relu",
    "batched_transpose_scale",
    "column_max",
    "embedding_bag_sum",
    "l2_pool",
    "dropout_apply",
]
MAX_TENSOR_BYTES = 512 * 2**20


def test_the_idiom_experts_exist_on_ops_no_heldout_problem_has() -> None:
    heldout = [load_problem(p) for p in sorted((REPO / "heldout").iterdir()) if p.is_dir()]
    names = {p.name for p in heldout}
    references = {p.definition.reference.strip() for p in heldout}
    for folder in IDIOM_EXPERTS:
        problem = load_problem(REPO / "expert_kernels" / folder)
        assert problem.name not in names, folder
        assert problem.definition.reference.strip() not in references, folder
        assert (problem.root / "mechanisms.json").is_file(), folder


@pytest.mark.parametrize("folder", IDIOM_EXPERTS)
def test_the_idiom_experts_tensors_fit_the_gate(folder: str) -> None:
    problem = load_problem(REPO / "expert_kernels" / folder)
    d = problem.definition
    for workload in problem.all_workloads():
        values = d.axis_values(workload)
        for name, spec in {**d.inputs, **d.outputs}.items():
            if not spec.is_scalar:
                assert d.nbytes(spec, values) <= MAX_TENSOR_BYTES, (workload.uuid, name)


@pytest.mark.parametrize("folder", EXPERTS, ids=lambda p: p.name)
def test_expert_validates_and_reference_runs_on_cpu(folder: Path) -> None:
    problem = load_problem(folder)
    assert problem.kernel_path is not None and problem.probes
    workload = _smallest_probe(problem)
    axis_values = problem.definition.axis_values(workload)
    inputs = make_inputs(problem.definition, workload, seed=0, device="cpu")
    outputs = run_reference(problem.definition, inputs, axis_values)
    check_reference_outputs(problem.definition, workload, outputs)


@pytest.mark.nvcc
def test_every_expert_builds_without_spills(shared_builder: Builder) -> None:
    results = shared_builder.build_many([((p / "kernel.cu").read_text(), p.name) for p in EXPERTS])
    for folder, result in zip(EXPERTS, results, strict=True):
        assert result.ok, f"{folder.name}: {result.message}"
        assert result.report is not None and result.report.kernels
        assert result.report.total_spills == 0, folder.name


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.parametrize("folder", EXPERTS, ids=lambda p: p.name)
def test_expert_passes_its_gate_on_every_workload(folder: Path, tmp_path: Path) -> None:
    from klineage.gate.gate import Gate

    problem = load_problem(folder)
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        verdict = gate.run(problem, KernelSource.from_file(problem.kernel_path), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


def test_the_coarsening_expert_is_written_in_the_form_the_forward_rule_writes() -> None:
    """dropout_apply teaches thread coarsening: its removal re-applies by rule to the same
    source (so the skill transfers), and the rule offers sites on naive held-out kernels."""
    from klineage.kernel import KernelSource
    from klineage.mechanisms import get
    from klineage.mining.removal import reapply, remove_mechanism

    expert = KernelSource.from_file(REPO / "expert_kernels" / "dropout_apply" / "kernel.cu")
    removal = remove_mechanism(expert, get("thread_coarsening"))
    assert "i_step" not in removal.simplified.text
    assert reapply(removal).text == expert.text
    for folder in ("gelu", "embedding_gather", "cast_f32_to_bf16"):
        naive = KernelSource.from_file(REPO / "heldout" / folder / "kernel.cu")
        assert list(get("thread_coarsening").candidates(naive)), folder
