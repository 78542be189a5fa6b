"""Tests for klineage.problem: loading, round-trips, defaults, and errors that point at the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from klineage.problem import (
    SUPPORTED_DTYPES,
    ConstAxis,
    Definition,
    ProblemError,
    RandomInput,
    ScalarInput,
    TensorSpec,
    Tolerance,
    VarAxis,
    Workload,
    dtype_itemsize,
    dump_definition,
    dump_workloads,
    load_definition,
    load_problem,
    load_workloads,
    torch_dtype,
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURE = TESTS / "fixtures" / "problems" / "scale_rows"
SOFTMAX = REPO / "expert_kernels" / "softmax"

Json = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Helpers: copy the fixture, break one thing, and find the line the error should point at
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh copy of the valid scale_rows problem."""
    dest = tmp_path / "scale_rows"
    shutil.copytree(FIXTURE, dest)
    return dest


def edit_definition(root: Path, edit: Callable[[Json], None]) -> str:
    """Apply `edit` to definition.json, write it back pretty-printed, return the new text."""
    path = root / "definition.json"
    data = json.loads(path.read_text())
    edit(data)
    text = json.dumps(data, indent=2) + "\n"
    path.write_text(text)
    return text


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing `needle`."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in text")


def workload(uuid: str = "w1", **axes: int) -> Json:
    """A valid scale_rows workload record (rows=8, cols=16 unless given)."""
    return {
        "uuid": uuid,
        "axes": axes or {"rows": 8, "cols": 16},
        "inputs": {"x": {"type": "random"}, "alpha": {"type": "scalar", "value": 2.0}},
    }


def write_jsonl(path: Path, records: list[Json], *, blank_first: bool = False) -> None:
    lines = [json.dumps(r) for r in records]
    if blank_first:
        lines.insert(0, "")  # blank lines are skipped but still count for line numbers
    path.write_text("\n".join(lines) + "\n")


def load_error(root: Path) -> ProblemError:
    with pytest.raises(ProblemError) as info:
        load_problem(root)
    return info.value


# ---------------------------------------------------------------------------------------------
# Valid problems
# ---------------------------------------------------------------------------------------------


def test_fixture_loads() -> None:
    problem = load_problem(FIXTURE)
    assert problem.name == "scale_rows_f32"
    assert problem.root == FIXTURE
    assert problem.kernel_path is None
    assert len(problem.workloads) == 3
    assert len(problem.probes) == 2
    assert problem.all_workloads() == [*problem.workloads, *problem.probes]
    assert problem.workloads[0].label == "rows=128,cols=256"
    defn = problem.definition
    assert defn.op_type == "elementwise"
    assert defn.inputs["alpha"].is_scalar
    assert not defn.inputs["x"].is_scalar
    assert isinstance(problem.workloads[0].inputs["x"], RandomInput)
    assert problem.workloads[0].inputs["alpha"] == ScalarInput(value=0.5)


def test_expert_softmax_loads() -> None:
    problem = load_problem(SOFTMAX)
    defn = problem.definition
    assert problem.name == "softmax_rows_f32"
    assert defn.op_type == "softmax"
    assert defn.var_axes() == ["rows", "cols"]
    assert list(defn.inputs) == ["x"] and list(defn.outputs) == ["y"]
    assert len(problem.workloads) == 5
    assert len(problem.probes) == 5
    for wl in problem.all_workloads():
        shape = defn.shape_of("x", defn.axis_values(wl))
        nbytes = shape[0] * shape[1] * dtype_itemsize("float32")
        assert nbytes < 1 << 30, wl.label  # each tensor stays under 1 GiB
    probe_cols = {wl.axes["cols"] for wl in problem.probes}
    assert {1, 3, 33, 1000, 4097} <= probe_cols


def test_definition_helpers() -> None:
    defn = load_definition(FIXTURE)
    assert defn.var_axes() == ["rows", "cols"]
    assert defn.const_axes() == {}
    wl = Workload.model_validate(workload(rows=3, cols=5))
    values = defn.axis_values(wl)
    assert values == {"rows": 3, "cols": 5}
    assert defn.shape_of("x", values) == (3, 5)
    assert defn.shape_of(defn.outputs["y"], values) == (3, 5)
    assert defn.shape_of("alpha", values) == ()


def test_const_axes_merge_into_axis_values(root: Path) -> None:
    edit_definition(root, lambda d: d["axes"].__setitem__("cols", {"type": "const", "value": 64}))
    write_jsonl(root / "workloads.jsonl", [workload(rows=4)])
    (root / "probes.jsonl").unlink()
    problem = load_problem(root)
    defn = problem.definition
    assert defn.var_axes() == ["rows"]
    assert defn.const_axes() == {"cols": 64}
    assert defn.axis_values(problem.workloads[0]) == {"rows": 4, "cols": 64}
    assert problem.workloads[0].label == "rows=4"


def test_op_type_accepts_older_key_type(root: Path) -> None:
    edit_definition(root, lambda d: d.__setitem__("type", d.pop("op_type")))
    assert load_definition(root).op_type == "elementwise"


def test_load_definition_accepts_folder_or_file() -> None:
    assert load_definition(FIXTURE) == load_definition(FIXTURE / "definition.json")


def test_blank_workload_lines_are_skipped(root: Path) -> None:
    write_jsonl(root / "workloads.jsonl", [workload("a"), workload("b")], blank_first=True)
    assert [wl.uuid for wl in load_problem(root).workloads] == ["a", "b"]


def test_probes_are_optional(root: Path) -> None:
    (root / "probes.jsonl").unlink()
    assert load_problem(root).probes == []


def test_run_may_take_extra_parameters_with_defaults(root: Path) -> None:
    src = "def run(x, alpha, scale=1.0, *, out=None):\n    return x * alpha * scale\n"
    edit_definition(root, lambda d: d.__setitem__("reference", src))
    assert load_definition(root).reference == src


def test_range_with_axis_bound_loads(root: Path) -> None:
    edit_definition(root, lambda d: d["inputs"]["x"].__setitem__("range", [0, "cols"]))
    assert load_definition(root).inputs["x"].range == (0, "cols")


def test_kernel_source(root: Path) -> None:
    with pytest.raises(ProblemError) as info:
        load_problem(root).kernel_source()
    err = info.value
    assert err.file == root / "kernel.cu"
    assert "no kernel.cu" in err.message
    assert "kernel.cu" in (err.expected or "")
    (root / "kernel.cu").write_text("__global__ void k() {}\n")
    problem = load_problem(root)
    assert problem.kernel_path == root / "kernel.cu"
    source = problem.kernel_source()
    assert source.text == "__global__ void k() {}\n"
    assert (source.name, source.path) == ("kernel.cu", root / "kernel.cu")


def test_loading_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from klineage.problem import load_problem\n"
        f"load_problem({str(FIXTURE)!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)


# ---------------------------------------------------------------------------------------------
# dtypes and tolerances
# ---------------------------------------------------------------------------------------------


def test_dtype_helpers() -> None:
    import torch

    assert dtype_itemsize("bfloat16") == 2
    assert dtype_itemsize("int64") == 8
    assert dtype_itemsize("bool") == 1
    for name in SUPPORTED_DTYPES:
        dtype = torch_dtype(name)
        assert dtype.itemsize == dtype_itemsize(name)
    assert torch_dtype("float16") is torch.float16
    with pytest.raises(ValueError, match="float8"):
        dtype_itemsize("float8")
    with pytest.raises(ValueError, match="supported"):
        torch_dtype("complex64")


def _definition_with_outputs(tolerance: Any = None) -> Definition:
    data: Json = {
        "name": "many",
        "op_type": "test",
        "axes": {"n": {"type": "var"}},
        "inputs": {"x": {"shape": ["n"], "dtype": "float32"}},
        "outputs": {
            name: {"shape": ["n"], "dtype": dtype}
            for name, dtype in [
                ("h", "float16"),
                ("b", "bfloat16"),
                ("f", "float32"),
                ("d", "float64"),
                ("i", "int32"),
                ("u", "uint8"),
                ("m", "bool"),
            ]
        },
        "reference": "def run(x):\n    return x\n",
    }
    if tolerance is not None:
        data["tolerance"] = tolerance
    return Definition.model_validate(data)


def test_tolerance_defaults_by_dtype() -> None:
    defn = _definition_with_outputs()
    loose = Tolerance(atol=1e-2, rtol=1e-2)
    tight = Tolerance(atol=1e-4, rtol=1e-4)
    exact = Tolerance(atol=0, rtol=0)
    assert defn.tolerance_for("h") == loose
    assert defn.tolerance_for("b") == loose
    assert defn.tolerance_for("f") == tight
    assert defn.tolerance_for("d") == tight
    for name in ("i", "u", "m"):
        assert defn.tolerance_for(name) == exact
    with pytest.raises(KeyError, match="no output 'zzz'"):
        defn.tolerance_for("zzz")


def test_single_tolerance_overrides_float_outputs_only() -> None:
    defn = _definition_with_outputs({"atol": 0.5, "rtol": 0.25})
    assert defn.tolerance == Tolerance(atol=0.5, rtol=0.25)
    for name in ("h", "b", "f", "d"):
        assert defn.tolerance_for(name) == Tolerance(atol=0.5, rtol=0.25)
    assert defn.tolerance_for("i") == Tolerance(atol=0, rtol=0)


def test_per_output_tolerance() -> None:
    defn = _definition_with_outputs({"f": {"atol": 1e-3, "rtol": 0}, "i": {"atol": 1, "rtol": 0}})
    assert defn.tolerance_for("f") == Tolerance(atol=1e-3, rtol=0)
    assert defn.tolerance_for("i") == Tolerance(atol=1, rtol=0)
    assert defn.tolerance_for("h") == Tolerance(atol=1e-2, rtol=1e-2)  # default still applies


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [FIXTURE, SOFTMAX], ids=["scale_rows", "softmax"])
def test_round_trip_problem_files(source: Path, tmp_path: Path) -> None:
    problem = load_problem(source)
    dest = tmp_path / "copy"
    dest.mkdir()
    dump_definition(problem.definition, dest)
    dump_workloads(problem.workloads, dest / "workloads.jsonl")
    dump_workloads(problem.probes, dest / "probes.jsonl")
    again = load_problem(dest)
    assert again.definition == problem.definition
    assert again.workloads == problem.workloads
    assert again.probes == problem.probes


def test_round_trip_all_features(tmp_path: Path) -> None:
    defn = Definition(
        name="gather_rows",
        op_type="gather",
        description="y[i, :] = table[idx[i], :] * scale",
        tags=["gather"],
        axes={
            "n": VarAxis(description="lookups"),
            "vocab": ConstAxis(value=32000),
            "dim": ConstAxis(value=128),
        },
        constraints=["n % 2 == 0"],
        inputs={
            "table": TensorSpec(shape=["vocab", "dim"], dtype="bfloat16"),
            "idx": TensorSpec(shape=["n"], dtype="int64", range=(0, "vocab")),
            "scale": TensorSpec(shape=None, dtype="float32"),
        },
        outputs={"y": TensorSpec(shape=["n", "dim"], dtype="bfloat16")},
        tolerance={"y": Tolerance(atol=2e-2, rtol=1e-2)},
        reference="def run(table, idx, scale):\n    return table[idx] * scale\n",
    )
    wls = [
        Workload(
            uuid="g1",
            axes={"n": 4},
            inputs={"table": RandomInput(), "idx": RandomInput(), "scale": ScalarInput(value=0.5)},
        ),
        Workload(
            uuid="g2",
            axes={"n": 1024},
            inputs={"table": RandomInput(), "idx": RandomInput(), "scale": ScalarInput(value=True)},
        ),
    ]
    path = dump_definition(defn, tmp_path / "definition.json")
    dump_workloads(wls, tmp_path / "workloads.jsonl")
    raw = json.loads(path.read_text())
    assert raw["op_type"] == "gather"
    assert raw["axes"]["vocab"] == {"type": "const", "value": 32000}
    assert raw["axes"]["n"] == {"type": "var", "description": "lookups"}
    assert raw["inputs"]["scale"]["shape"] is None
    assert raw["inputs"]["idx"]["range"] == [0, "vocab"]
    assert load_definition(path) == defn
    assert load_workloads(tmp_path / "workloads.jsonl", required=True, definition=defn) == wls
    problem = load_problem(tmp_path)
    assert problem.definition == defn and problem.workloads == wls


# ---------------------------------------------------------------------------------------------
# Errors: each names the file, the line, the field, and what to do
# ---------------------------------------------------------------------------------------------


def test_error_str_reads_file_line_field_message_expected(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = edit_definition(root, lambda d: d["inputs"]["x"]["shape"].__setitem__(1, "colz"))
    monkeypatch.chdir(root.parent)
    err = load_error(root)
    line = line_of(text, '"colz"')
    assert str(err) == (
        f"scale_rows/definition.json:{line}: inputs.x.shape[1]: unknown axis 'colz'; "
        "expected one of the axes: rows, cols"
    )


# 1. Missing folder or definition.json


def test_problem_folder_missing(tmp_path: Path) -> None:
    err = load_error(tmp_path / "nope")
    assert err.file == tmp_path / "nope"
    assert err.line is None and err.field is None
    assert err.message == "problem folder not found"
    assert "definition.json" in (err.expected or "") and "workloads.jsonl" in (err.expected or "")


def test_problem_path_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "definition.json"
    path.write_text("{}")
    err = load_error(path)
    assert err.file == path
    assert err.message == "problem folder is a file, not a folder"


def test_definition_missing(root: Path) -> None:
    (root / "definition.json").unlink()
    err = load_error(root)
    assert err.file == root / "definition.json"
    assert err.line is None and err.field is None
    assert err.message == "definition.json not found"
    assert "a problem folder holding definition.json and workloads.jsonl" in str(err)


# 2. Invalid JSON


def test_definition_invalid_json(root: Path) -> None:
    (root / "definition.json").write_text('{\n  "name": "x",\n  "op_type" "y"\n}\n')
    err = load_error(root)
    assert err.file == root / "definition.json"
    assert err.line == 3
    assert err.field is None
    assert err.message.startswith("invalid JSON: Expecting ':' delimiter")


def test_definition_top_level_not_object(root: Path) -> None:
    (root / "definition.json").write_text("[1, 2]\n")
    err = load_error(root)
    assert err.line == 1
    assert err.message == "the top level is a JSON list"


# 3. Missing required fields


@pytest.mark.parametrize("key", ["name", "op_type", "axes", "inputs", "outputs", "reference"])
def test_missing_required_field(root: Path, key: str) -> None:
    edit_definition(root, lambda d: d.pop(key))
    err = load_error(root)
    assert err.file == root / "definition.json"
    assert err.line == 1  # the object that lacks it
    assert err.field == key
    assert err.message == f"missing required field {key!r}"
    assert f"key {key!r}" in (err.expected or "")


def test_missing_nested_field_points_at_parent(root: Path) -> None:
    text = edit_definition(root, lambda d: d["inputs"]["x"].pop("dtype"))
    err = load_error(root)
    assert err.field == "inputs.x.dtype"
    assert err.line == line_of(text, '"x": {')
    assert err.message == "missing required field 'dtype'"


# 4. Unknown axis in a shape


@pytest.mark.parametrize("group, name", [("inputs", "x"), ("outputs", "y")])
def test_unknown_axis_in_shape(root: Path, group: str, name: str) -> None:
    text = edit_definition(root, lambda d: d[group][name]["shape"].__setitem__(1, "colz"))
    err = load_error(root)
    assert err.file == root / "definition.json"
    assert err.line == line_of(text, '"colz"')
    assert err.field == f"{group}.{name}.shape[1]"
    assert err.message == "unknown axis 'colz'"
    assert err.expected == "one of the axes: rows, cols"


# 5. Unsupported dtype


def test_unsupported_dtype(root: Path) -> None:
    text = edit_definition(root, lambda d: d["outputs"]["y"].__setitem__("dtype", "float8_e4m3"))
    err = load_error(root)
    assert err.line == line_of(text, '"float8_e4m3"')
    assert err.field == "outputs.y.dtype"
    assert err.message == "unsupported dtype 'float8_e4m3'"
    assert err.expected == "one of the supported dtypes: " + ", ".join(SUPPORTED_DTYPES)


# 6. Const axis with a non-positive value


@pytest.mark.parametrize("value", [0, -4])
def test_const_axis_non_positive(root: Path, value: int) -> None:
    text = edit_definition(
        root, lambda d: d["axes"].__setitem__("cols", {"type": "const", "value": value})
    )
    err = load_error(root)
    assert err.line == line_of(text, f'"value": {value}')
    assert err.field == "axes.cols.value"
    assert err.message == f"must be > 0, got {value}"
    assert "positive integer" in (err.expected or "")


def test_const_axis_value_must_be_integer(root: Path) -> None:
    edit_definition(root, lambda d: d["axes"].__setitem__("cols", {"type": "const", "value": "8"}))
    err = load_error(root)
    assert err.field == "axes.cols.value"
    assert err.message == "invalid value '8'"
    assert (err.expected or "").startswith("a valid integer")


def test_unknown_axis_type(root: Path) -> None:
    text = edit_definition(root, lambda d: d["axes"].__setitem__("cols", {"type": "constant"}))
    err = load_error(root)
    assert err.line == line_of(text, '"cols": {')
    assert err.field == "axes.cols"
    assert err.message == "unknown type 'constant'"
    assert err.expected == "'type' one of: 'const', 'var'"


# 7. Reference problems


def test_reference_does_not_parse(root: Path) -> None:
    src = "import torch\n\ndef run(x, alpha):\n    return x *\n"
    text = edit_definition(root, lambda d: d.__setitem__("reference", src))
    err = load_error(root)
    assert err.line == line_of(text, '"reference"')
    assert err.field == "reference"
    assert err.message.startswith("reference does not parse: ")
    assert err.message.endswith("(reference line 4)")


def test_reference_without_top_level_run(root: Path) -> None:
    src = "class K:\n    def run(self, x, alpha):\n        return x\n"
    edit_definition(root, lambda d: d.__setitem__("reference", src))
    err = load_error(root)
    assert err.field == "reference"
    assert err.message == "reference must define a top-level function run(...)"
    assert err.expected == "a top-level 'def run(x, alpha):'"


@pytest.mark.parametrize(
    "signature", ["run(alpha, x)", "run(x)", "run(x, alpha, beta)", "run(x, alpha, *, out)"]
)
def test_reference_run_parameters_mismatch(root: Path, signature: str) -> None:
    src = f"def {signature}:\n    return x\n"
    text = edit_definition(root, lambda d: d.__setitem__("reference", src))
    err = load_error(root)
    assert err.line == line_of(text, '"reference"')
    assert err.field == "reference"
    assert err.message.endswith("parameters do not match the inputs")
    assert err.expected == "run(x, alpha): the input names in definition order"


# 8. workloads.jsonl missing or empty


def test_workloads_missing(root: Path) -> None:
    (root / "workloads.jsonl").unlink()
    err = load_error(root)
    assert err.file == root / "workloads.jsonl"
    assert err.line is None and err.field is None
    assert err.message == "workloads.jsonl not found"
    assert "at least one workload" in (err.expected or "")


def test_workloads_empty(root: Path) -> None:
    (root / "workloads.jsonl").write_text("\n   \n")
    err = load_error(root)
    assert err.file == root / "workloads.jsonl"
    assert err.line is None
    assert err.message == "no workloads (the file has no records)"
    assert "must pass at least one" in (err.expected or "")


def test_load_workloads_not_required(tmp_path: Path) -> None:
    assert load_workloads(tmp_path / "probes.jsonl", required=False) == []
    (tmp_path / "probes.jsonl").write_text("")
    assert load_workloads(tmp_path / "probes.jsonl", required=False) == []


def test_workload_invalid_json(root: Path) -> None:
    (root / "workloads.jsonl").write_text(json.dumps(workload()) + '\n{"uuid": \n')
    err = load_error(root)
    assert err.file == root / "workloads.jsonl"
    assert err.line == 2
    assert err.message.startswith("invalid JSON: ")


# 9. Workload axes


def _bad_workload(
    root: Path, record: Json, *, file: str = "workloads.jsonl", good: Json | None = None
) -> ProblemError:
    """Write a valid record, a blank line and `record` (line 3) and return the load error."""
    path = root / file
    good = good or workload("ok")
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(record) + "\n")
    err = load_error(root)
    assert err.file == path
    assert err.line == 3
    return err


def test_workload_missing_var_axis(root: Path) -> None:
    err = _bad_workload(root, workload(rows=8))
    assert err.field == "axes.cols"
    assert err.message == "missing value for var axis 'cols'"
    assert err.expected == "a value for every var axis: rows, cols"


def test_workload_unknown_axis(root: Path) -> None:
    err = _bad_workload(root, workload(rows=8, cols=16, colz=3))
    assert err.field == "axes.colz"
    assert err.message == "unknown axis 'colz'"
    assert err.expected == "one of the var axes: rows, cols"


def test_workload_sets_const_axis(root: Path) -> None:
    edit_definition(root, lambda d: d["axes"].__setitem__("cols", {"type": "const", "value": 64}))
    (root / "probes.jsonl").unlink()
    err = _bad_workload(root, workload(rows=8, cols=64), good=workload("ok", rows=8))
    assert err.field == "axes.cols"
    assert err.message == "axis 'cols' is const (64) in the definition"
    assert err.expected == "values only for the var axes: rows"


@pytest.mark.parametrize("value", [0, -1])
def test_workload_non_positive_axis(root: Path, value: int) -> None:
    err = _bad_workload(root, workload(rows=value, cols=16))
    assert err.field == "axes.rows"
    assert err.message == f"must be > 0, got {value}"


# 10. Workload inputs


def test_workload_input_missing(root: Path) -> None:
    record = workload()
    del record["inputs"]["alpha"]
    err = _bad_workload(root, record)
    assert err.field == "inputs.alpha"
    assert err.message == "missing input 'alpha'"
    assert err.expected == "an entry for every input: x, alpha"


def test_workload_input_unknown(root: Path) -> None:
    record = workload()
    record["inputs"]["beta"] = {"type": "random"}
    err = _bad_workload(root, record)
    assert err.field == "inputs.beta"
    assert err.message == "unknown input 'beta'"
    assert err.expected == "one of the inputs: x, alpha"


def test_workload_scalar_input_given_random(root: Path) -> None:
    record = workload()
    record["inputs"]["alpha"] = {"type": "random"}
    err = _bad_workload(root, record)
    assert err.field == "inputs.alpha"
    assert err.message == "input 'alpha' is a scalar but is given 'random'"
    assert err.expected == '{"type": "scalar", "value": <number>}'


def test_workload_tensor_input_given_scalar(root: Path) -> None:
    record = workload()
    record["inputs"]["x"] = {"type": "scalar", "value": 1.0}
    err = _bad_workload(root, record)
    assert err.field == "inputs.x"
    assert err.message == "input 'x' is a tensor but is given 'scalar'"
    assert err.expected == '{"type": "random"}'


def test_workload_scalar_value_not_a_number(root: Path) -> None:
    record = workload()
    record["inputs"]["alpha"] = {"type": "scalar", "value": "2"}
    err = _bad_workload(root, record)
    assert err.field == "inputs.alpha.value"
    assert err.message == "'2' is not a number or bool"


def test_workload_unknown_input_type(root: Path) -> None:
    record = workload()
    record["inputs"]["x"] = {"type": "safetensors", "path": "x.st"}
    err = _bad_workload(root, record)
    assert err.field == "inputs.x"
    assert err.message == "unknown type 'safetensors'"
    assert err.expected == "'type' one of: 'random', 'scalar'"


# 11. Constraints


def test_workload_fails_constraint(root: Path) -> None:
    edit_definition(root, lambda d: d.__setitem__("constraints", ["cols % 4 == 0"]))
    err = _bad_workload(root, workload(rows=7, cols=30))
    assert err.field == "axes"
    assert err.message == "constraint 'cols % 4 == 0' fails for rows=7, cols=30"
    assert err.expected == "axis values satisfying every constraint in the definition"


def test_probe_fails_constraint(root: Path) -> None:
    edit_definition(root, lambda d: d.__setitem__("constraints", ["cols % 4 == 0"]))
    write_jsonl(root / "workloads.jsonl", [workload("w")])
    err = _bad_workload(root, workload("p", rows=1, cols=33), file="probes.jsonl")
    assert err.message == "constraint 'cols % 4 == 0' fails for rows=1, cols=33"


def test_constraint_with_unknown_name(root: Path) -> None:
    text = edit_definition(root, lambda d: d.__setitem__("constraints", ["colz % 4 == 0"]))
    err = load_error(root)
    assert err.file == root / "definition.json"
    assert err.line == line_of(text, "colz % 4")
    assert err.field == "constraints[0]"
    assert err.message == "constraint 'colz % 4 == 0' uses unknown name 'colz'"
    assert err.expected == "only axis names: rows, cols"


def test_constraints_cannot_reach_builtins(root: Path) -> None:
    # Names other than axes are rejected up front, so builtins are never looked up.
    edit_definition(root, lambda d: d.__setitem__("constraints", ["len(str(cols)) > 0"]))
    err = load_error(root)
    assert err.field == "constraints[0]"
    assert "unknown name 'len'" in err.message


# 12. Duplicate uuids


def test_duplicate_workload_uuid(root: Path) -> None:
    err = _bad_workload(root, workload("ok", rows=2, cols=2))
    assert err.field == "uuid"
    assert err.message == "duplicate uuid 'ok' (first used on line 1)"
    assert err.expected == "a unique uuid per workload"


def test_probe_reuses_workload_uuid(root: Path) -> None:
    write_jsonl(root / "workloads.jsonl", [workload("same")])
    write_jsonl(root / "probes.jsonl", [workload("same", rows=1, cols=1)])
    err = load_error(root)
    assert err.file == root / "probes.jsonl"
    assert err.line == 1
    assert err.field == "uuid"
    assert err.message == "uuid 'same' is already used in workloads.jsonl"


# 13. Range bounds


def test_range_bound_unknown_axis(root: Path) -> None:
    text = edit_definition(root, lambda d: d["inputs"]["x"].__setitem__("range", [0, "vocab"]))
    err = load_error(root)
    assert err.line == line_of(text, '"vocab"')
    assert err.field == "inputs.x.range[1]"
    assert err.message == "range bound 'vocab' is not a defined axis"
    assert err.expected == "a number or one of the axes: rows, cols"


@pytest.mark.parametrize(
    "bad, field, message",
    [
        ([0, None], "inputs.x.range[1]", "range bound None is not a number or an axis name"),
        ([0], "inputs.x.range", "range [0] is not a pair"),
        ([5, 1], "inputs.x.range", "empty range [5, 1)"),
    ],
)
def test_range_malformed(root: Path, bad: list[Any], field: str, message: str) -> None:
    edit_definition(root, lambda d: d["inputs"]["x"].__setitem__("range", bad))
    err = load_error(root)
    assert err.field == field
    assert err.message == message


# Unknown keys


def test_unknown_top_level_key(root: Path) -> None:
    text = edit_definition(root, lambda d: d.__setitem__("refrence", "x"))
    err = load_error(root)
    assert err.line == line_of(text, '"refrence"')
    assert err.field == "refrence"
    assert err.message == "unknown key 'refrence'"
    assert err.expected == (
        "one of the keys: name, op_type, description, tags, axes, constraints, inputs, "
        "outputs, tolerance, reference, floor"
    )


def test_unknown_nested_key(root: Path) -> None:
    text = edit_definition(root, lambda d: d["inputs"]["x"].__setitem__("shap", ["rows"]))
    err = load_error(root)
    assert err.line == line_of(text, '"shap"')
    assert err.field == "inputs.x.shap"
    assert err.message == "unknown key 'shap'"
    assert err.expected == "one of the keys: shape, dtype, description, range, inplace_of, compare"


def test_unknown_key_in_axis(root: Path) -> None:
    text = edit_definition(
        root, lambda d: d["axes"].__setitem__("cols", {"type": "const", "valu": 8, "value": 8})
    )
    err = load_error(root)
    assert err.line == line_of(text, '"valu"')
    assert err.field == "axes.cols.valu"
    assert err.expected == "one of the keys: type, value, description"


def test_unknown_key_in_workload(root: Path) -> None:
    record = workload()
    record["axis"] = {}
    err = _bad_workload(root, record)
    assert err.field == "axis"
    assert err.message == "unknown key 'axis'"
    assert err.expected == "one of the keys: uuid, axes, inputs"


# Other definition checks


def test_tolerance_negative(root: Path) -> None:
    text = edit_definition(root, lambda d: d.__setitem__("tolerance", {"atol": -1e-3, "rtol": 0}))
    err = load_error(root)
    assert err.line == line_of(text, '"atol"')
    assert err.field == "tolerance.atol"
    assert err.message == "must be >= 0, got -0.001"


def test_tolerance_for_unknown_output(root: Path) -> None:
    edit_definition(root, lambda d: d.__setitem__("tolerance", {"z": {"atol": 0, "rtol": 0}}))
    err = load_error(root)
    assert err.field == "tolerance.z"
    assert err.message == "no output named 'z'"


def test_output_named_like_input(root: Path) -> None:
    def edit(d: Json) -> None:
        d["outputs"] = {"x": d["outputs"]["y"]}

    edit_definition(root, edit)
    err = load_error(root)
    assert err.field == "outputs.x"
    assert err.message == "output 'x' has the name of an input"


def test_wrong_type_uses_field_description(root: Path) -> None:
    edit_definition(root, lambda d: d["inputs"]["x"].__setitem__("shape", "rows"))
    err = load_error(root)
    assert err.field == "inputs.x.shape"
    assert err.message == "invalid value 'rows'"
    assert err.expected == "a valid list (axis names, one per dimension; null for a scalar)"


def _softmax_with_outputs(tmp_path, outputs, inputs=None):
    import json

    from tests.conftest import REPO

    data = json.loads((REPO / "expert_kernels" / "softmax" / "definition.json").read_text())
    data["outputs"] = outputs
    if inputs is not None:
        data["inputs"] = inputs
    (tmp_path / "definition.json").write_text(json.dumps(data))
    return tmp_path / "definition.json"


def test_inplace_of_must_name_a_matching_input(tmp_path) -> None:
    path = _softmax_with_outputs(
        tmp_path, {"y": {"shape": ["rows"], "dtype": "float32", "inplace_of": "x"}}
    )
    with pytest.raises(ProblemError) as info:
        load_definition(path)
    assert info.value.field == "outputs.y.inplace_of"
    assert "same shape and dtype" in str(info.value)
    path = _softmax_with_outputs(
        tmp_path, {"y": {"shape": ["rows", "cols"], "dtype": "float32", "inplace_of": "nope"}}
    )
    with pytest.raises(ProblemError, match="not an input tensor"):
        load_definition(path)


def test_indices_of_needs_its_source_and_values(tmp_path) -> None:
    path = _softmax_with_outputs(
        tmp_path,
        {
            "y": {"shape": ["rows", "cols"], "dtype": "float32"},
            "i": {
                "shape": ["rows", "cols"],
                "dtype": "int64",
                "compare": {"kind": "indices_of", "source": "x", "values": "missing"},
            },
        },
    )
    with pytest.raises(ProblemError) as info:
        load_definition(path)
    assert info.value.field == "outputs.i.compare"
    assert "indices_of needs" in str(info.value)


# The latency floor (our extension)


def test_a_declared_floor_is_evaluated_per_workload(root: Path) -> None:
    edit_definition(
        root, lambda d: d.__setitem__("floor", {"bytes": "rows*cols*8", "flops": "rows*cols"})
    )
    problem = load_problem(root)
    first = problem.workloads[0]
    rows, cols = first.axes["rows"], first.axes["cols"]
    assert problem.definition.floor_values(first) == (rows * cols * 8, float(rows * cols))


def test_a_floor_naming_an_unknown_axis_points_at_its_line(root: Path) -> None:
    text = edit_definition(root, lambda d: d.__setitem__("floor", {"bytes": "rows*colz*4"}))
    err = load_error(root)
    assert err.line == line_of(text, '"bytes"')
    assert err.field == "floor.bytes"
    assert err.message == "floor bytes 'rows*colz*4' uses unknown name 'colz'"


# ---------------------------------------------------------------------------------------------
# A folder that is not there: the folders beside it that the name may have meant
# ---------------------------------------------------------------------------------------------


def test_a_missing_folder_names_the_folder_whose_definition_has_that_name(root: Path) -> None:
    # held-out folders are named for the op, their definitions for the op and dtype
    renamed = root.with_name("scale")
    root.rename(renamed)
    name = json.loads((renamed / "definition.json").read_text())["name"]
    error = load_error(renamed.parent / name)
    assert f"did you mean {renamed}?" in str(error)


def test_a_missing_folder_names_close_folder_names_and_none_without_them(root: Path) -> None:
    assert f"did you mean {root}?" in str(load_error(root.with_name("scale_rowz")))
    unrelated = str(load_error(root.with_name("transpose")))
    assert "problem folder not found" in unrelated and "did you mean" not in unrelated
