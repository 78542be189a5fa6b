"""KernelBench problems in: a `Model` class, `get_inputs()` and `get_init_inputs()` become a
problem folder (definition.json with a PyTorch reference, workloads.jsonl).

The Python source is read and rewritten with libcst: the tensor constructors in `get_inputs()`
name the axes (``torch.randn(batch_size, dim)`` gives axes ``batch_size`` and ``dim``), the
parameters of ``Model.forward`` name the inputs, and the reference is the file itself with its
input makers dropped and a ``run(...)`` added that calls ``Model.forward`` through
``torch.func.functional_call``, so the weights made in ``__init__`` become inputs too. Shapes and
dtypes come from running the file once (on the meta device where it can, so large problems
cost nothing). An axis that sizes a weight is fixed (const): the weights are made once from the
init inputs. When an output dimension is not one of the axes (a convolution's output size) the
problem is fixed-shape: every axis is const, and the import says so.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libcst as cst

from klineage.problem import (
    Definition,
    ProblemError,
    Workload,
    dump_definition,
    dump_workloads,
    load_problem,
)

INPUT_MAKERS = ("get_inputs", "get_init_inputs")
TORCH_DTYPES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float64": "float64",
    "torch.int64": "int64",
    "torch.int32": "int32",
    "torch.int16": "int16",
    "torch.int8": "int8",
    "torch.uint8": "uint8",
    "torch.bool": "bool",
}


class KernelBenchError(ValueError):
    """The file is not in KernelBench's form; the message says what is missing."""


@dataclass
class Imported:
    """What an import wrote and what the user should still look at."""

    folder: Path
    definition: Definition
    notes: list[str] = field(default_factory=list)
    """Choices the import made that a user may want to change (fixed axes, guessed names)."""


# ---- reading the source with libcst ------------------------------------------------------------


class _SourceFacts(cst.CSTVisitor):
    """Names of forward's parameters, and the axis names each get_inputs() tensor is built with."""

    def __init__(self) -> None:
        self.forward_params: list[str] | None = None
        self.functions: set[str] = set()
        self.has_model = False
        self._class: list[str] = []
        self._function: list[str] = []
        self.assigned: dict[str, cst.BaseExpression] = {}
        """Variables assigned inside get_inputs, by name."""
        self.returned: list[cst.BaseExpression] = []
        """The elements get_inputs returns."""
        self.constants: list[str] = []
        """Names assigned at module level (sizes such as batch_size)."""

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class.append(node.name.value)
        if node.name.value == "Model" and len(self._class) == 1:
            self.has_model = True

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._class.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = node.name.value
        if self._class == ["Model"] and name == "forward" and not self._function:
            self.forward_params = [p.name.value for p in node.params.params][1:]  # drop self
        if not self._class and not self._function:
            self.functions.add(name)
        self._function.append(name)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._function.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        if not self._function and not self._class:
            self.constants.extend(
                t.target.value for t in node.targets if isinstance(t.target, cst.Name)
            )
        if self._function == ["get_inputs"] and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name):
                self.assigned[target.value] = node.value

    def visit_Return(self, node: cst.Return) -> None:
        if self._function == ["get_inputs"] and node.value is not None:
            value = node.value
            if isinstance(value, (cst.List, cst.Tuple)):
                self.returned = [e.value for e in value.elements]
            else:
                self.returned = [value]


def _dim_names(
    expression: cst.BaseExpression, assigned: dict[str, cst.BaseExpression]
) -> list[str | None]:
    """The axis name of each dimension a tensor constructor is given (None where a dimension is
    not a plain name: a literal or an expression)."""
    if isinstance(expression, cst.Name) and expression.value in assigned:
        expression = assigned[expression.value]
    while isinstance(expression, cst.Call) and isinstance(expression.func, cst.Attribute):
        # torch.randn(...).cuda(), torch.rand(...).to(dtype): look through the method chain
        if expression.func.attr.value in ("cuda", "to", "half", "float", "bfloat16", "contiguous"):
            expression = expression.func.value
            continue
        break
    if not isinstance(expression, cst.Call):
        return []
    dims: list[cst.BaseExpression] = []
    for arg in expression.args:
        if arg.keyword is not None or arg.star:
            continue
        if isinstance(arg.value, (cst.Tuple, cst.List)):  # torch.randn((a, b))
            dims.extend(e.value for e in arg.value.elements)
        else:
            dims.append(arg.value)
    return [d.value if isinstance(d, cst.Name) else None for d in dims]


class _Reference(cst.CSTTransformer):
    """The file without its input makers (and without code that runs at import beyond plain
    assignments), so it can serve as a definition's reference."""

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef | cst.RemovalSentinel:
        if original_node.name.value in INPUT_MAKERS:
            return cst.RemoveFromParent()
        return updated_node

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If | cst.RemovalSentinel:
        # an `if __name__ == "__main__":` block would run benchmarks inside the reference
        test = original_node.test
        if (
            isinstance(test, cst.Comparison)
            and isinstance(test.left, cst.Name)
            and test.left.value == "__name__"
        ):
            return cst.RemoveFromParent()
        return updated_node


# ---- running the source once -------------------------------------------------------------------


def _execute(source: str, path: Path) -> dict[str, Any]:
    module = types.ModuleType(f"klineage_kernelbench_{path.stem}")
    module.__dict__["__name__"] = module.__name__
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except Exception as err:
        raise KernelBenchError(
            f"{path}: running the file raised {type(err).__name__}: {err}"
        ) from err
    return module.__dict__


def _dtype_name(value: Any) -> str:
    name = TORCH_DTYPES.get(str(value))
    if name is None:
        raise KernelBenchError(
            f"dtype {value} is not supported; supported: {', '.join(TORCH_DTYPES.values())}"
        )
    return name


def _forward_shapes(model: Any, params: dict[str, Any], inputs: Sequence[Any]) -> list[Any]:
    """The outputs' shapes and dtypes: on the meta device when every op supports it."""
    import torch
    from torch.func import functional_call

    def call(device: str) -> Any:
        moved = {k: v.to(device) for k, v in params.items()}
        args = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            return functional_call(model.to(device), moved, tuple(args))

    try:
        result = call("meta")
    except Exception:
        result = call("cpu")
    outputs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [(tuple(o.shape), o.dtype) for o in outputs]


# ---- the import ----------------------------------------------------------------------------------


def import_kernelbench(path: str | Path, out: str | Path, *, name: str | None = None) -> Imported:
    """Write a problem folder at `out` from the KernelBench-style file at `path`."""
    import torch

    path, out = Path(path), Path(out)
    source = path.read_text(encoding="utf-8")
    try:
        tree = cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        raise KernelBenchError(f"{path}:{err.raw_line}: not valid Python: {err.message}") from err
    facts = _SourceFacts()
    tree.visit(facts)
    missing = [n for n in ("get_inputs", "get_init_inputs") if n not in facts.functions]
    if not facts.has_model or facts.forward_params is None or missing:
        what = (
            ([] if facts.has_model else ["a class Model"])
            + (["Model.forward"] if facts.has_model and facts.forward_params is None else [])
            + [f"def {n}()" for n in missing]
        )
        raise KernelBenchError(f"{path}: not a KernelBench problem: no {', '.join(what)}")

    namespace = _execute(source, path)
    init_inputs = list(namespace["get_init_inputs"]())
    sample = list(namespace["get_inputs"]())
    if len(sample) != len(facts.forward_params):
        raise KernelBenchError(
            f"{path}: get_inputs() returns {len(sample)} value(s); Model.forward takes "
            f"{len(facts.forward_params)}: {', '.join(facts.forward_params)}"
        )
    model = namespace["Model"](*init_inputs)
    params = dict(model.named_parameters())
    notes: list[str] = []

    # axes: named by get_inputs' constructor arguments, sized by the sample
    axes: dict[str, int] = {}
    fixed: set[str] = set()
    inputs: dict[str, dict[str, Any]] = {}
    scalars: dict[str, Any] = {}
    for index, (arg, value) in enumerate(zip(facts.forward_params, sample, strict=True)):
        if not isinstance(value, torch.Tensor):
            if not isinstance(value, (int, float, bool)):
                raise KernelBenchError(
                    f"{path}: input {arg} is a {type(value).__name__}, not a tensor or number"
                )
            scalars[arg] = value
            inputs[arg] = {
                "shape": None,
                "dtype": "float32" if isinstance(value, float) else "int64",
            }
            continue
        names = (
            _dim_names(facts.returned[index], facts.assigned) if index < len(facts.returned) else []
        )
        shape = []
        for d, extent in enumerate(value.shape):
            axis = names[d] if d < len(names) and names[d] else None
            if axis is None or (axis in axes and axes[axis] != extent):
                axis = f"{arg}_dim{d}"
                notes.append(
                    f"axis {axis}: dimension {d} of {arg} is not a plain name in get_inputs()"
                )
            axes[axis] = int(extent)
            shape.append(axis)
        inputs[arg] = {"shape": shape, "dtype": _dtype_name(value.dtype)}

    weight_names = {p: p.replace(".", "_") for p in params}
    clash = set(weight_names.values()) & set(inputs)
    if clash:
        raise KernelBenchError(
            f"{path}: weight names {sorted(clash)} collide with forward's inputs"
        )
    sizes = {c: v for c in facts.constants if isinstance(v := namespace.get(c), int) and v > 0}
    for param, tensor in params.items():
        shape = []
        for d, extent in enumerate(tensor.shape):
            axis = _named_size(axes, sizes, int(extent)) or f"{weight_names[param]}_dim{d}"
            axes.setdefault(axis, int(extent))
            fixed.add(axis)  # the weights are made once, at these sizes
            shape.append(axis)
        inputs[weight_names[param]] = {"shape": shape, "dtype": _dtype_name(tensor.dtype)}

    outputs: dict[str, dict[str, Any]] = {}
    fixed_shape = False
    for index, (shape, dtype) in enumerate(_forward_shapes(model, params, sample)):
        dims = []
        for d, extent in enumerate(shape):
            axis = _axis_for(axes, int(extent))
            if axis is None:
                axis = f"out{index}_dim{d}"
                axes[axis] = int(extent)
                fixed_shape = True
            dims.append(axis)
        outputs[f"out{index}" if index else "out"] = {"shape": dims, "dtype": _dtype_name(dtype)}
    if fixed_shape:
        fixed = set(axes)
        notes.append(
            "every axis is const: an output dimension is not one of the inputs' axes (it is "
            "computed from them, as a convolution's output size is)"
        )
    elif fixed:
        notes.append(f"axes {', '.join(sorted(fixed))} are const: they size the weights")

    reference = _reference_source(tree, facts.forward_params, weight_names, init_inputs)
    definition_json: dict[str, Any] = {
        "name": name or path.stem,
        "op_type": "kernelbench",
        "description": f"Imported from KernelBench-style {path.name}: Model.forward.",
        "tags": ["kernelbench"],
        "axes": {
            a: ({"type": "const", "value": v} if a in fixed else {"type": "var"})
            for a, v in axes.items()
        },
        "inputs": inputs,
        "outputs": outputs,
        "reference": reference,
    }
    workload = {
        "uuid": f"{definition_json['name']}-0001",
        "axes": {a: v for a, v in axes.items() if a not in fixed},
        "inputs": {
            n: ({"type": "scalar", "value": scalars[n]} if n in scalars else {"type": "random"})
            for n in inputs
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    try:
        definition = Definition.model_validate(definition_json)
        dump_definition(definition, out)
        dump_workloads(
            [Workload.model_validate(workload, context={"definition": definition})],
            out / "workloads.jsonl",
        )
        load_problem(out)
    except (ProblemError, ValueError) as err:
        raise KernelBenchError(
            f"{path}: the problem made from it does not validate: {err}"
        ) from err
    return Imported(folder=out, definition=definition, notes=notes)


def _named_size(axes: dict[str, int], sizes: dict[str, int], extent: int) -> str | None:
    """The one axis or module-level size of this extent (None when none or several are)."""
    names = {a for a, v in axes.items() if v == extent} | {
        c for c, v in sizes.items() if v == extent
    }
    return names.pop() if len(names) == 1 else None


def _axis_for(axes: dict[str, int], extent: int) -> str | None:
    """The one axis of this size, if exactly one has it."""
    matches = [a for a, v in axes.items() if v == extent]
    return matches[0] if len(matches) == 1 else None


def _reference_source(
    tree: cst.Module,
    forward_params: list[str],
    weight_names: dict[str, str],
    init_inputs: list[Any],
) -> str:
    body = tree.visit(_Reference()).code.rstrip() + "\n"
    args = ", ".join([*forward_params, *weight_names.values()])
    weights = ", ".join(f"{p!r}: {n}" for p, n in weight_names.items())
    call_args = ", ".join(forward_params) + ("," if len(forward_params) == 1 else "")
    first = forward_params[0] if forward_params else "None"
    lines = [
        "",
        "",
        "# klineage: Model.forward as the definition's reference; weights are inputs",
        "import torch as _torch",
        "from torch.func import functional_call as _functional_call",
        "",
        f"_INIT_INPUTS = {init_inputs!r}",
        "_MODEL = None",
        "",
        "",
        f"def run({args}):",
        "    global _MODEL",
        "    if _MODEL is None:",
        "        _MODEL = Model(*_INIT_INPUTS)",
        f"    device = getattr({first}, 'device', _torch.device('cpu'))",
        "    _MODEL = _MODEL.to(device)",
        f"    return _functional_call(_MODEL, {{{weights}}}, ({call_args}))",
    ]
    return body + "\n".join(lines) + "\n"
