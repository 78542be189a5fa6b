"""KernelBench-style files (written here, in KernelBench's idiom) become problem folders whose
reference computes what the file's Model computes, with its weights as inputs."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from klineage.formats.kernelbench import KernelBenchError, import_kernelbench
from klineage.gate.inputs import make_inputs, run_reference
from klineage.problem import VarAxis, load_problem
from tests.conftest import FIXTURES

FILES = FIXTURES / "kernelbench"


def _same_as_the_model(source: Path, folder: Path) -> None:
    """The imported reference on random inputs equals the file's own Model with those weights."""
    problem = load_problem(folder)
    definition, workload = problem.definition, problem.workloads[0]
    inputs = make_inputs(definition, workload, 0, "cpu")
    got = run_reference(definition, inputs, definition.axis_values(workload))
    namespace = runpy.run_path(str(source))
    model = namespace["Model"](*namespace["get_init_inputs"]())
    weights = {p: inputs[p.replace(".", "_")] for p, _ in model.named_parameters()}
    forward_args = [v for k, v in inputs.items() if k not in {n.replace(".", "_") for n in weights}]
    with torch.no_grad():
        want = functional_call(model, weights, tuple(forward_args))
    torch.testing.assert_close(got["out"], want)


def test_a_matmul_names_its_axes_after_get_inputs_arguments(tmp_path: Path) -> None:
    imported = import_kernelbench(FILES / "matmul.py", tmp_path / "matmul")
    definition = imported.definition
    assert list(definition.inputs) == ["A", "B"]
    assert definition.inputs["A"].shape == ["M", "K"] and definition.inputs["B"].shape == ["K", "N"]
    assert definition.outputs["out"].shape == ["M", "N"]
    assert all(isinstance(definition.axes[a], VarAxis) for a in ("M", "K", "N"))
    assert load_problem(tmp_path / "matmul").workloads[0].axes == {"M": 256, "K": 128, "N": 192}
    _same_as_the_model(FILES / "matmul.py", tmp_path / "matmul")


def test_init_inputs_are_kept_and_a_main_block_is_dropped(tmp_path: Path) -> None:
    imported = import_kernelbench(FILES / "softmax.py", tmp_path / "softmax", name="softmax_kb")
    assert imported.definition.name == "softmax_kb"
    assert "__main__" not in imported.definition.reference
    assert "_INIT_INPUTS = [-1]" in imported.definition.reference
    _same_as_the_model(FILES / "softmax.py", tmp_path / "softmax")


def test_weights_become_inputs_and_their_axes_are_fixed(tmp_path: Path) -> None:
    imported = import_kernelbench(FILES / "linear_scale.py", tmp_path / "linear")
    definition = imported.definition
    assert list(definition.inputs) == ["x", "scale", "fc_weight", "fc_bias"]
    assert definition.inputs["fc_weight"].shape == ["out_features", "in_features"]
    assert definition.inputs["scale"].shape is None
    assert isinstance(definition.axes["batch_size"], VarAxis)
    assert not isinstance(definition.axes["in_features"], VarAxis)
    assert any("size the weights" in note for note in imported.notes)
    workload = load_problem(tmp_path / "linear").workloads[0]
    assert workload.inputs["scale"].value == 0.5  # type: ignore[union-attr]
    _same_as_the_model(FILES / "linear_scale.py", tmp_path / "linear")


def test_a_convolution_is_a_fixed_shape_problem_and_says_why(tmp_path: Path) -> None:
    imported = import_kernelbench(FILES / "conv2d.py", tmp_path / "conv")
    definition = imported.definition
    assert not definition.var_axes()
    assert definition.outputs["out"].shape[:2] == ["batch_size", "out_channels"]
    assert any("convolution" in note for note in imported.notes)
    _same_as_the_model(FILES / "conv2d.py", tmp_path / "conv")


def test_a_file_that_is_not_kernelbench_says_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("import torch\n\ndef f(x):\n    return x\n")
    with pytest.raises(
        KernelBenchError, match=r"no a class Model, def get_inputs\(\), def get_init_inputs\(\)"
    ):
        import_kernelbench(path, tmp_path / "out")
