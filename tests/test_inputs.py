"""Seeded inputs, poisoning and the reference, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from klineage.gate.inputs import (
    ReferenceFailure,
    allocate_outputs,
    check_reference_outputs,
    make_inputs,
    poison,
    refill_inputs,
    run_reference,
)
from klineage.problem import load_problem
from tests.conftest import FIXTURES, REPO


@pytest.fixture
def scale_rows():
    return load_problem(FIXTURES / "problems" / "scale_rows")


def test_inputs_are_deterministic_per_seed(scale_rows) -> None:
    d, w = scale_rows.definition, scale_rows.workloads[0]
    a = make_inputs(d, w, seed=1, device="cpu")
    b = make_inputs(d, w, seed=1, device="cpu")
    c = make_inputs(d, w, seed=2, device="cpu")
    assert torch.equal(a["x"], b["x"]) and not torch.equal(a["x"], c["x"])
    assert a["alpha"] == 0.5 and a["x"].shape == (128, 256) and a["x"].dtype == torch.float32


def test_refill_writes_fresh_values_at_the_same_address(scale_rows) -> None:
    d, w = scale_rows.definition, scale_rows.workloads[0]
    inputs = make_inputs(d, w, seed=0, device="cpu")
    address, old = inputs["x"].data_ptr(), inputs["x"].clone()
    refill_inputs(d, w, inputs, seed=1)
    assert inputs["x"].data_ptr() == address
    assert torch.equal(inputs["x"], make_inputs(d, w, seed=1, device="cpu")["x"])
    assert not torch.equal(inputs["x"], old)


def test_reference_runs_and_matches_the_definition(scale_rows) -> None:
    d, w = scale_rows.definition, scale_rows.workloads[0]
    inputs = make_inputs(d, w, seed=0, device="cpu")
    ref = run_reference(d, inputs)
    check_reference_outputs(d, w, ref)
    assert torch.allclose(ref["y"], inputs["x"] * 0.5)


def test_softmax_reference_runs_on_the_cpu() -> None:
    problem = load_problem(REPO / "expert_kernels" / "softmax")
    small = problem.probes[0]
    inputs = make_inputs(problem.definition, small, seed=0, device="cpu")
    ref = run_reference(problem.definition, inputs)
    check_reference_outputs(problem.definition, small, ref)
    assert torch.allclose(ref["y"].sum(dim=-1), torch.ones(ref["y"].shape[0]))


def test_a_reference_with_the_wrong_shape_is_a_reference_failure(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    for name in ("workloads.jsonl",):
        (folder / name).write_text((FIXTURES / "problems" / "scale_rows" / name).read_text())
    data = json.loads((FIXTURES / "problems" / "scale_rows" / "definition.json").read_text())
    data["reference"] = "def run(x, alpha):\n    return (x * alpha).t()\n"
    (folder / "definition.json").write_text(json.dumps(data))
    problem = load_problem(folder)
    w = problem.workloads[0]
    ref = run_reference(problem.definition, make_inputs(problem.definition, w, 0, "cpu"))
    with pytest.raises(ReferenceFailure, match="has shape"):
        check_reference_outputs(problem.definition, w, ref)


def test_poison_makes_outputs_unmistakable(scale_rows) -> None:
    outputs = allocate_outputs(scale_rows.definition, scale_rows.workloads[0], "cpu")
    poison(outputs["y"])
    assert bool(torch.isnan(outputs["y"]).all())
    ints = torch.zeros(4, dtype=torch.int32)
    poison(ints)
    assert bool((ints == torch.iinfo(torch.int32).min).all())


def test_fresh_values_respect_ranges_and_stay_in_their_buffers() -> None:
    from klineage.gate.inputs import refresh_inputs

    problem = load_problem(REPO / "heldout" / "embedding_gather")
    definition, workload = problem.definition, problem.workloads[0]
    inputs = make_inputs(definition, workload, 0, "cpu")
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    addresses = {k: inputs[k].data_ptr() for k in before}
    refresh_inputs(definition, workload, inputs, torch.Generator().manual_seed(5))
    values = definition.axis_values(workload)
    for name, spec in definition.inputs.items():
        value = inputs[name]
        if not isinstance(value, torch.Tensor):
            continue
        assert value.data_ptr() == addresses[name]  # same buffer, fresh values
        assert not torch.equal(value, before[name]), f"{name} kept its values"
        if spec.range is not None:
            low, high = (values[b] if isinstance(b, str) else b for b in spec.range)
            assert int(value.min()) >= low and int(value.max()) < high
