"""Problems: a folder in the FlashInfer-Trace format, loaded and validated with helpful errors.

A problem folder holds:

- ``definition.json``: axes, input/output tensor specs, a PyTorch reference ``run(...)``,
  constraints, and our extensions (``tolerance``, and ``range`` on a tensor spec);
- ``workloads.jsonl``: the concrete sizes the kernel must pass (at least one);
- ``probes.jsonl`` (optional): extra sizes that are tried but not required to pass;
- ``kernel.cu`` (optional): the kernel source.

Every problem in a file is reported as a :class:`ProblemError` naming the file, the line, the
field and what was expected. torch is imported only by :func:`torch_dtype`, so loading is fast
and works without a GPU.
"""

from __future__ import annotations

import ast
import bisect
import json
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, Union, get_args, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from klineage.kernel import KernelSource

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFINITION_FILE",
    "KERNEL_FILE",
    "PROBES_FILE",
    "SUPPORTED_DTYPES",
    "WORKLOADS_FILE",
    "ConstAxis",
    "Definition",
    "Problem",
    "ProblemError",
    "RandomInput",
    "ScalarInput",
    "TensorSpec",
    "Tolerance",
    "VarAxis",
    "Workload",
    "dtype_itemsize",
    "dump_definition",
    "dump_workloads",
    "is_float_dtype",
    "load_definition",
    "load_problem",
    "load_workloads",
    "torch_dtype",
]

DEFINITION_FILE = "definition.json"
WORKLOADS_FILE = "workloads.jsonl"
PROBES_FILE = "probes.jsonl"
KERNEL_FILE = "kernel.cu"

_FOLDER_LAYOUT = (
    f"a problem folder holding {DEFINITION_FILE} and {WORKLOADS_FILE} "
    f"({PROBES_FILE} and {KERNEL_FILE} are optional)"
)

# ---------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------

_DTYPE_ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
SUPPORTED_DTYPES: tuple[str, ...] = tuple(_DTYPE_ITEMSIZE)
_FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})


def _check_dtype_name(name: str) -> None:
    if name not in _DTYPE_ITEMSIZE:
        raise ValueError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}")


def dtype_itemsize(name: str) -> int:
    """Bytes per element of a supported dtype name (no torch needed)."""
    _check_dtype_name(name)
    return _DTYPE_ITEMSIZE[name]


def is_float_dtype(name: str) -> bool:
    """Whether a supported dtype name is a floating-point type."""
    _check_dtype_name(name)
    return name in _FLOAT_DTYPES


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a supported dtype name; imports torch on first use only."""
    _check_dtype_name(name)
    import torch  # lazy: loading problems must not pay for (or require) torch

    return getattr(torch, name)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

JsonPath = tuple[str | int, ...]


def _format_path(path: Iterable[str | int]) -> str:
    """Render ("inputs", "x", "shape", 1) as inputs.x.shape[1]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _display_path(path: Path) -> str:
    # Relative to the working directory when possible: shorter and clickable in terminals.
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


class ProblemError(ValueError):
    """A problem folder is missing something or holds an invalid value.

    ``str(err)`` reads like
    ``expert_kernels/softmax/definition.json:14: inputs.x.shape[1]: unknown axis 'colz';
    expected one of the axes: rows, cols``.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path,
        line: int | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        self.message = message
        self.file = Path(file)
        self.line = line
        self.field = field
        self.expected = expected
        super().__init__(str(self))

    def __str__(self) -> str:
        where = _display_path(self.file)
        if self.line is not None:
            where += f":{self.line}"
        text = f"{where}: "
        if self.field:
            text += f"{self.field}: "
        text += self.message
        if self.expected:
            text += f"; expected {self.expected}"
        return text


def _fail(path: JsonPath, message: str, expected: str) -> NoReturn:
    """Raise from inside a validator; the loader turns this into a ProblemError.

    `path` is relative to the model being validated; pydantic adds the model's own location.
    """
    where = f"{_format_path(path)}: " if path else ""
    raise PydanticCustomError(
        "problem",
        "{where}{message}; expected {expected}",
        {"where": where, "message": message, "expected": expected, "path": path},
    )


def _names(items: Iterable[str]) -> str:
    listed = ", ".join(items)
    return listed or "(none)"


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class _Model(BaseModel):
    # extra="forbid": a typo in a key must be an error, not silently ignored.
    model_config = ConfigDict(extra="forbid")


class _Tagged(_Model):
    """A member of a union discriminated on ``type``; ``type`` is always written out."""

    @model_serializer(mode="wrap")
    def _keep_type(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        # Dumps use exclude_defaults, which would drop the defaulted tag the union needs.
        return {"type": getattr(self, "type"), **handler(self)}  # noqa: B009


class ConstAxis(_Tagged):
    """An axis whose size is fixed by the definition."""

    type: Literal["const"] = Field(default="const", description="always 'const'")
    value: StrictInt = Field(gt=0, description="the axis size, a positive integer")
    description: str = Field(default="", description="what the axis means")


class VarAxis(_Tagged):
    """An axis whose size each workload chooses."""

    type: Literal["var"] = Field(default="var", description="always 'var'")
    parent: str | None = Field(
        default=None, description="an axis this one is nested in (FlashInfer-Trace), if any"
    )
    description: str = Field(default="", description="what the axis means")


Axis = Annotated[ConstAxis | VarAxis, Field(discriminator="type")]

Bound = StrictInt | StrictFloat | str


class IndicesOf(_Model):
    """Checks an index output by what it points at, so ties and order do not matter (top-k,
    argmax): every index in range, unique along the last dimension, and
    ``source.gather(-1, indices)`` bitwise equal to the kernel's own ``values`` output."""

    kind: Literal["indices_of"] = Field(default="indices_of", description="always 'indices_of'")
    source: str = Field(description="the input tensor the indices select from")
    values: str = Field(description="the output holding the selected values")


Compare = Literal["elementwise", "sorted"] | IndicesOf


class TensorSpec(_Model):
    """Shape and dtype of one input or output."""

    shape: list[str] | None = Field(
        description="axis names, one per dimension; null for a scalar",
    )
    dtype: str = Field(description=f"element type, one of: {', '.join(SUPPORTED_DTYPES)}")
    description: str = Field(default="", description="what the tensor holds")
    range: tuple[Bound, Bound] | None = Field(
        default=None,
        description="[low, high) for random generation; each bound a number or an axis name",
    )

    inplace_of: str | None = Field(
        default=None,
        description="outputs only: the input whose buffer the kernel overwrites with this "
        "output (run() then gets no pointer of its own for it)",
    )
    compare: Compare = Field(
        default="elementwise",
        description="outputs only: 'elementwise' (the element rule), 'sorted' (sort both "
        "along the last dimension first: order-insensitive), or an indices_of check",
    )

    @property
    def is_scalar(self) -> bool:
        """Whether this is a scalar (``shape`` is null), not a tensor."""
        return self.shape is None

    @field_validator("range", mode="before")
    @classmethod
    def _range_bounds(cls, value: Any) -> Any:
        # Checked before pydantic so a bad bound gets one clear message, not one per union arm.
        if value is None:
            return value
        if not isinstance(value, list | tuple) or len(value) != 2:
            _fail((), f"range {value!r} is not a pair", "[low, high]: numbers or axis names")
        for i, bound in enumerate(value):
            if not isinstance(bound, int | float | str) or isinstance(bound, bool):
                _fail(
                    (i,),
                    f"range bound {bound!r} is not a number or an axis name",
                    "a number or an axis name",
                )
        return value

    @field_validator("dtype")
    @classmethod
    def _supported_dtype(cls, value: str) -> str:
        if value not in _DTYPE_ITEMSIZE:
            _fail(
                (),
                f"unsupported dtype {value!r}",
                f"one of the supported dtypes: {', '.join(SUPPORTED_DTYPES)}",
            )
        return value


class Tolerance(_Model):
    """Allowed error of a float output: |got - want| <= atol + rtol * |want|."""

    atol: float = Field(ge=0, description="absolute tolerance, >= 0")
    rtol: float = Field(ge=0, description="relative tolerance, >= 0")


class FloorSetting(_Model):
    """The least work one workload needs, for the gate's physical latency floor (a latency
    below it is flagged IMPOSSIBLE). Each is a Python expression over axis names. Without
    ``bytes`` the gate counts every input read once (and outputs that do not fit in the L2):
    declare it where a kernel need not read all of an input (a gather reads a few rows)."""

    bytes: str | None = Field(
        default=None, description="bytes that must move through device memory, e.g. 'rows*8'"
    )
    flops: str | None = Field(default=None, description="floating-point operations, e.g. '2*M*N*K'")


def _tolerance_kind(value: Any) -> str:
    # Only atol/rtol keys: one tolerance for all float outputs; any other keys: per output.
    if isinstance(value, Mapping) and (not value or not set(value) <= {"atol", "rtol"}):
        return "per_output"
    return "single"


ToleranceSetting = Annotated[
    Annotated[Tolerance, Tag("single")] | Annotated[dict[str, Tolerance], Tag("per_output")],
    Discriminator(_tolerance_kind),
]

_DEFAULT_TOLERANCE: dict[str, Tolerance] = {
    "float16": Tolerance(atol=1e-2, rtol=1e-2),
    "bfloat16": Tolerance(atol=1e-2, rtol=1e-2),
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
    "float64": Tolerance(atol=1e-4, rtol=1e-4),
}
_EXACT = Tolerance(atol=0.0, rtol=0.0)


class RandomInput(_Tagged):
    """A tensor input filled with random values."""

    type: Literal["random"] = Field(default="random", description="always 'random'")


class ScalarInput(_Tagged):
    """A scalar input with a fixed value."""

    type: Literal["scalar"] = Field(default="scalar", description="always 'scalar'")
    value: StrictBool | StrictInt | StrictFloat = Field(description="the value, a number or bool")

    @field_validator("value", mode="before")
    @classmethod
    def _number_or_bool(cls, value: Any) -> Any:
        # One clear message instead of pydantic's per-union-arm errors.
        if not isinstance(value, int | float):  # bool is an int
            _fail((), f"{value!r} is not a number or bool", "a JSON number, true or false")
        return value


InputSpec = Annotated[RandomInput | ScalarInput, Field(discriminator="type")]


class Workload(_Model):
    """One concrete instance of a definition: sizes for the var axes and how to fill inputs.

    Validate with ``Workload.model_validate(data, context={"definition": defn})`` to also
    check it against a definition (axes, inputs, constraints).
    """

    uuid: str = Field(min_length=1, description="a unique id of this workload")
    axes: dict[str, Annotated[StrictInt, Field(gt=0)]] = Field(
        description="a positive size for every var axis of the definition"
    )
    inputs: dict[str, InputSpec] = Field(
        description='how to fill each input: {"type": "random"} or {"type": "scalar", "value": v}'
    )

    @property
    def label(self) -> str:
        """A short readable label such as ``rows=4096,cols=1024``."""
        if not self.axes:
            return self.uuid
        return ",".join(f"{name}={value}" for name, value in self.axes.items())

    @model_validator(mode="after")
    def _matches_definition(self, info: ValidationInfo) -> Workload:
        defn = (info.context or {}).get("definition")
        if defn is not None:
            _check_workload(defn, self)
        return self


class Definition(_Model):
    """The operation: axes, tensor specs, reference implementation and checks."""

    name: str = Field(min_length=1, description="a unique name of the problem")
    op_type: str = Field(
        min_length=1,
        validation_alias=AliasChoices("op_type", "type"),
        description="the kind of operation, e.g. softmax; older files name this key 'type'",
    )
    description: str = Field(default="", description="what the operation computes")
    tags: list[str] = Field(default=[], description="free-form labels")
    axes: dict[str, Axis] = Field(
        description='the named axes: {"type": "const", "value": n} or {"type": "var"}'
    )
    constraints: list[str] = Field(
        default=[], description="Python expressions over axis names every workload must satisfy"
    )
    inputs: dict[str, TensorSpec] = Field(
        description="input tensor specs, in the order run(...) takes them"
    )
    outputs: dict[str, TensorSpec] = Field(
        min_length=1, description="output tensor specs, in the order run(...) returns them"
    )
    tolerance: ToleranceSetting | None = Field(
        default=None,
        description='{"atol": a, "rtol": r} for all float outputs, or a map output name -> that',
    )
    reference: str = Field(
        description="Python source defining a top-level run(<inputs>) that returns the outputs"
    )
    floor: FloorSetting | None = Field(
        default=None,
        description="ours: bytes and FLOPs a workload needs, for the latency floor audit",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Definition:
        self._check_axes()
        self._check_constraints()
        for group in ("inputs", "outputs"):
            for name, spec in getattr(self, group).items():
                self._check_spec((group, name), spec)
        for name in self.outputs:
            if name in self.inputs:
                _fail(
                    ("outputs", name),
                    f"output {name!r} has the name of an input",
                    "distinct input and output names",
                )
        self._check_tolerance()
        self._check_output_extensions()
        _check_reference(self.reference, list(self.inputs), list(self.axes))
        return self

    def _check_output_extensions(self) -> None:
        for name, spec in self.inputs.items():
            if spec.inplace_of is not None or spec.compare != "elementwise":
                _fail(
                    ("inputs", name),
                    "inplace_of and compare apply to outputs only",
                    "these keys on outputs",
                )
        taken: set[str] = set()
        for name, spec in self.outputs.items():
            target = spec.inplace_of
            if target is not None:
                source = self.inputs.get(target)
                if source is None or source.is_scalar:
                    _fail(
                        ("outputs", name, "inplace_of"),
                        f"inplace_of names {target!r}, which is not an input tensor",
                        f"one of the input tensors: {_names(self.inputs)}",
                    )
                if (source.shape, source.dtype) != (spec.shape, spec.dtype) or target in taken:
                    _fail(
                        ("outputs", name, "inplace_of"),
                        f"output {name!r} cannot live in input {target!r}",
                        "an input of the same shape and dtype, used by one output only",
                    )
                taken.add(target)
            if isinstance(spec.compare, IndicesOf):
                check = spec.compare
                if check.source not in self.inputs or check.values not in self.outputs:
                    _fail(
                        ("outputs", name, "compare"),
                        f"indices_of needs an input {check.source!r} and an output "
                        f"{check.values!r}",
                        f"inputs: {_names(self.inputs)}; outputs: {_names(self.outputs)}",
                    )
                if spec.dtype not in ("int64", "int32"):
                    _fail(
                        ("outputs", name, "dtype"),
                        f"indices_of output has dtype {spec.dtype}",
                        "int64 or int32",
                    )

    def inplace_outputs(self) -> dict[str, str]:
        """Output name -> the input it is written into, for outputs updated in place."""
        return {n: s.inplace_of for n, s in self.outputs.items() if s.inplace_of is not None}

    def _check_axes(self) -> None:
        for name, axis in self.axes.items():
            if (
                isinstance(axis, VarAxis)
                and axis.parent is not None
                and (axis.parent not in self.axes or axis.parent == name)
            ):
                _fail(
                    ("axes", name, "parent"),
                    f"unknown parent axis {axis.parent!r}",
                    f"another of the axes: {_names(self.axes)}",
                )

    def _check_constraints(self) -> None:
        floors = [
            (("floor", key), text)
            for key in ("bytes", "flops")
            if self.floor is not None and (text := getattr(self.floor, key)) is not None
        ]
        for i, text in enumerate(self.constraints):
            self._check_axis_expression(
                ("constraints", i),
                text,
                "a Python expression over axis names, e.g. 'cols % 4 == 0'",
            )
        for path, text in floors:
            self._check_axis_expression(
                path, text, "a Python expression over axis names, e.g. '2*M*N*K'"
            )

    def floor_values(self, workload: Workload) -> tuple[int | None, float | None]:
        """The declared floor bytes and FLOPs of a workload (None where not declared)."""
        if self.floor is None:
            return None, None
        values = dict(self.axis_values(workload))

        def evaluate(text: str | None) -> float | None:
            # axis values only, no builtins: a floor is arithmetic over sizes
            return None if text is None else float(eval(text, {"__builtins__": {}}, values))

        declared_bytes = evaluate(self.floor.bytes)
        return (
            int(declared_bytes) if declared_bytes is not None else None,
            evaluate(self.floor.flops),
        )

    def _check_axis_expression(self, path: JsonPath, text: str, expected: str) -> None:
        what = "constraint" if path[0] == "constraints" else f"floor {path[-1]}"
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as err:
            _fail(path, f"{what} {text!r} does not parse: {err.msg}", expected)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in self.axes:
                _fail(
                    path,
                    f"{what} {text!r} uses unknown name {node.id!r}",
                    f"only axis names: {_names(self.axes)}",
                )

    def _check_spec(self, path: JsonPath, spec: TensorSpec) -> None:
        for i, axis in enumerate(spec.shape or []):
            if axis not in self.axes:
                _fail(
                    (*path, "shape", i),
                    f"unknown axis {axis!r}",
                    f"one of the axes: {_names(self.axes)}",
                )
        if spec.range is None:
            return
        for i, bound in enumerate(spec.range):
            if isinstance(bound, str) and bound not in self.axes:
                _fail(
                    (*path, "range", i),
                    f"range bound {bound!r} is not a defined axis",
                    f"a number or one of the axes: {_names(self.axes)}",
                )
        low, high = spec.range
        if not isinstance(low, str) and not isinstance(high, str) and low >= high:
            _fail((*path, "range"), f"empty range [{low}, {high})", "low < high")

    def _check_tolerance(self) -> None:
        if not isinstance(self.tolerance, dict):
            return
        for name in self.tolerance:
            if name not in self.outputs:
                _fail(
                    ("tolerance", name),
                    f"no output named {name!r}",
                    f"one of the outputs: {_names(self.outputs)} (or a single atol/rtol)",
                )

    # -- queries ----------------------------------------------------------------------------

    def var_axes(self) -> list[str]:
        """Names of the var axes, in definition order."""
        return [name for name, axis in self.axes.items() if isinstance(axis, VarAxis)]

    def const_axes(self) -> dict[str, int]:
        """Const axis name -> its fixed value, in definition order."""
        return {name: axis.value for name, axis in self.axes.items() if isinstance(axis, ConstAxis)}

    def axis_values(self, workload: Workload) -> dict[str, int]:
        """Every axis -> its size in `workload` (const values merged with the workload's)."""
        values: dict[str, int] = {}
        for name, axis in self.axes.items():
            if isinstance(axis, ConstAxis):
                values[name] = axis.value
            elif name in workload.axes:
                values[name] = workload.axes[name]
            else:
                raise ValueError(f"workload {workload.uuid!r} has no value for var axis {name!r}")
        return values

    def spec(self, name: str) -> TensorSpec:
        """The spec of the input or output called `name`."""
        if name in self.inputs:
            return self.inputs[name]
        if name in self.outputs:
            return self.outputs[name]
        have = _names([*self.inputs, *self.outputs])
        raise KeyError(f"no input or output {name!r}; have: {have}")

    def shape_of(self, spec: TensorSpec | str, axis_values: Mapping[str, int]) -> tuple[int, ...]:
        """The concrete shape of a spec (or input/output name); () for a scalar."""
        if isinstance(spec, str):
            spec = self.spec(spec)
        return tuple(axis_values[axis] for axis in spec.shape or [])

    def nbytes(self, spec: TensorSpec, axis_values: Mapping[str, int]) -> int:
        """Bytes of one tensor of this spec (0 for a scalar)."""
        if spec.is_scalar:
            return 0
        count = 1
        for extent in self.shape_of(spec, axis_values):
            count *= extent
        return count * dtype_itemsize(spec.dtype)

    def tolerance_for(self, output_name: str) -> Tolerance:
        """The tolerance an output is checked with.

        A per-output entry wins; then a single definition tolerance (float outputs only);
        then the dtype default: 1e-2 for float16/bfloat16, 1e-4 for float32/float64,
        exact for integer and bool outputs.
        """
        if output_name not in self.outputs:
            raise KeyError(f"no output {output_name!r}; have: {_names(self.outputs)}")
        dtype = self.outputs[output_name].dtype
        if isinstance(self.tolerance, dict):
            if output_name in self.tolerance:
                return self.tolerance[output_name]
        elif self.tolerance is not None and dtype in _FLOAT_DTYPES:
            return self.tolerance
        return _DEFAULT_TOLERANCE.get(dtype, _EXACT)


class Problem(_Model):
    """A loaded problem folder."""

    root: Path = Field(description="the problem folder")
    definition: Definition = Field(description="the parsed definition.json")
    workloads: list[Workload] = Field(description="workloads the kernel must pass (>= 1)")
    probes: list[Workload] = Field(
        default=[], description="extra workloads that are tried but need not pass"
    )
    kernel_path: Path | None = Field(default=None, description="kernel.cu, if the folder has one")

    @property
    def name(self) -> str:
        """The definition's name."""
        return self.definition.name

    def all_workloads(self) -> list[Workload]:
        """The required workloads, then the probes."""
        return [*self.workloads, *self.probes]

    def kernel_source(self) -> KernelSource:
        """The problem's kernel.cu, ready for the gate, mining or `retrieve`; a ProblemError
        when the problem has none."""
        if self.kernel_path is None or not self.kernel_path.is_file():
            raise ProblemError(
                f"this problem has no {KERNEL_FILE}",
                file=self.kernel_path or self.root / KERNEL_FILE,
                expected=f"a {KERNEL_FILE} with the kernel source next to {DEFINITION_FILE}",
            )
        return KernelSource.from_file(self.kernel_path)


# ---------------------------------------------------------------------------------------------
# Semantic checks that need more than one field
# ---------------------------------------------------------------------------------------------


def _check_reference(source: str, input_names: list[str], axis_names: list[str]) -> None:
    try:
        tree = ast.parse(source, filename="<reference>")
    except SyntaxError as err:
        _fail(
            ("reference",),
            f"reference does not parse: {err.msg} (reference line {err.lineno})",
            "valid Python source defining run(...)",
        )
    run = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None)
    want = f"run({', '.join(input_names)})"
    if run is None:
        _fail(
            ("reference",),
            "reference must define a top-level function run(...)",
            f"a top-level 'def {want}:'",
        )
    params = [a.arg for a in (*run.args.posonlyargs, *run.args.args)]
    # Extra trailing parameters are fine when they have defaults (e.g. run(x, dim=-1)).
    n_required = len(params) - len(run.args.defaults)
    kw_pairs = zip(run.args.kwonlyargs, run.args.kw_defaults, strict=True)
    # keyword-only parameters named after axes receive the axis values (e.g. run(x, *, k))
    kw_required = [
        arg.arg for arg, default in kw_pairs if default is None and arg.arg not in axis_names
    ]
    if params[: len(input_names)] != input_names or n_required > len(input_names) or kw_required:
        got = ", ".join(params + [f"*, {name}" for name in kw_required])
        _fail(
            ("reference",),
            f"run({got}) parameters do not match the inputs",
            f"{want}: the input names in definition order",
        )


def _check_workload(defn: Definition, wl: Workload) -> None:
    var_axes = defn.var_axes()
    const_axes = defn.const_axes()
    for name in wl.axes:
        if name in const_axes:
            _fail(
                ("axes", name),
                f"axis {name!r} is const ({const_axes[name]}) in the definition",
                f"values only for the var axes: {_names(var_axes)}",
            )
        if name not in defn.axes:
            _fail(
                ("axes", name), f"unknown axis {name!r}", f"one of the var axes: {_names(var_axes)}"
            )
    for name in var_axes:
        if name not in wl.axes:
            _fail(
                ("axes", name),
                f"missing value for var axis {name!r}",
                f"a value for every var axis: {_names(var_axes)}",
            )
    _check_workload_inputs(defn, wl)
    _check_workload_constraints(defn, wl)


def _check_workload_inputs(defn: Definition, wl: Workload) -> None:
    for name in wl.inputs:
        if name not in defn.inputs:
            _fail(
                ("inputs", name),
                f"unknown input {name!r}",
                f"one of the inputs: {_names(defn.inputs)}",
            )
    for name, spec in defn.inputs.items():
        given = wl.inputs.get(name)
        if given is None:
            _fail(
                ("inputs", name),
                f"missing input {name!r}",
                f"an entry for every input: {_names(defn.inputs)}",
            )
        if spec.is_scalar and not isinstance(given, ScalarInput):
            _fail(
                ("inputs", name),
                f"input {name!r} is a scalar but is given {given.type!r}",
                '{"type": "scalar", "value": <number>}',
            )
        if not spec.is_scalar and not isinstance(given, RandomInput):
            _fail(
                ("inputs", name),
                f"input {name!r} is a tensor but is given {given.type!r}",
                '{"type": "random"}',
            )
        if isinstance(given, ScalarInput):
            _check_scalar_value(name, spec.dtype, given.value)


def _check_scalar_value(name: str, dtype: str, value: bool | float) -> None:
    if dtype == "bool" and not isinstance(value, bool):
        _fail(("inputs", name, "value"), f"{value!r} for a bool input", "true or false")
    if dtype not in _FLOAT_DTYPES and isinstance(value, float) and not value.is_integer():
        _fail(("inputs", name, "value"), f"{value!r} for a {dtype} input", "an integer")


def _check_workload_constraints(defn: Definition, wl: Workload) -> None:
    values = defn.axis_values(wl)
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    for text in defn.constraints:
        try:
            # Axis values only, no builtins: a constraint is arithmetic over sizes.
            ok = eval(text, {"__builtins__": {}}, dict(values))
        except Exception as err:
            _fail(
                ("axes",),
                f"constraint {text!r} raised {type(err).__name__}: {err} ({shown})",
                "constraints that evaluate over the axis values",
            )
        if not ok:
            _fail(
                ("axes",),
                f"constraint {text!r} fails for {shown}",
                "axis values satisfying every constraint in the definition",
            )


# ---------------------------------------------------------------------------------------------
# Locating errors: JSON path -> line, pydantic loc -> JSON path
# ---------------------------------------------------------------------------------------------


def _json_lines(text: str) -> dict[JsonPath, int]:
    """Map each path in a JSON document to the 1-based line of its key (or list item).

    Only called on text that already parsed, so a small recursive scan is enough.
    """
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()
    found: dict[JsonPath, int] = {}

    def line(pos: int) -> int:
        return bisect.bisect_right(starts, pos)

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def value(pos: int, path: JsonPath) -> int:
        pos = skip(pos)
        if text[pos] not in "{[":
            return decoder.raw_decode(text, pos)[1]
        closing = "}" if text[pos] == "{" else "]"
        pos = skip(pos + 1)
        index = 0
        while text[pos] != closing:
            if closing == "}":
                key, after = decoder.raw_decode(text, pos)
                found[(*path, key)] = line(pos)
                pos = value(skip(after) + 1, (*path, key))
            else:
                found[(*path, index)] = line(pos)
                pos = value(pos, (*path, index))
                index += 1
            pos = skip(pos)
            if text[pos] == ",":
                pos = skip(pos + 1)
        return pos + 1

    try:
        found[()] = line(skip(0))
        value(0, ())
    except (ValueError, IndexError):
        pass  # best effort: missing entries fall back to a parent's line
    return found


def _line_for(lines: Mapping[JsonPath, int], path: JsonPath) -> int | None:
    """The line of `path`, or of its nearest parent present in the file."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional, leaving the type that validates the data."""
    while True:
        tp = _strip_annotated(tp)
        if not _is_union(tp):
            return tp
        members = [m for m in get_args(tp) if m is not type(None)]
        if len(members) != 1:
            return tp
        tp = members[0]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_tag(member: Any) -> str | None:
    """The name pydantic puts in an error location for a union member."""
    if get_origin(member) is Annotated:
        for meta in get_args(member)[1:]:
            if isinstance(meta, Tag):
                return meta.tag
    inner = _unwrap(member)
    if _is_model(inner) and "type" in inner.model_fields:
        literal = get_args(inner.model_fields["type"].annotation)
        if literal:
            return str(literal[0])
    return getattr(inner, "__name__", None)


def _model_field(model: type[BaseModel], key: str | int) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        aliases = info.validation_alias
        choices = aliases.choices if isinstance(aliases, AliasChoices) else [aliases]
        if key == name or key in choices:
            return info
    return None


def _resolve_loc(model: type[BaseModel], loc: Iterable[str | int]) -> tuple[JsonPath, Any, Any]:
    """Follow a pydantic error location through the model types.

    Returns the JSON path (union tags dropped), the type found at the end, and the FieldInfo
    of the innermost model field on the way (for its description).
    """
    tp: Any = model
    path: list[str | int] = []
    field: FieldInfo | None = None
    for part in loc:
        tp = _unwrap(tp)
        if _is_union(tp):
            member = next((m for m in get_args(tp) if _union_tag(m) == part), None)
            if member is not None:
                tp = member  # a union tag names the branch; it is not a key in the data
                continue
        path.append(part)
        if _is_model(tp):
            field = _model_field(tp, part)
            tp = field.annotation if field is not None else Any
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) in (list, tuple) and get_args(tp):
            args = [a for a in get_args(tp) if a is not Ellipsis]
            tp = args[min(part, len(args) - 1)] if isinstance(part, int) else Any
        else:
            tp = Any
    return tuple(path), _unwrap(tp), field


def _expected_from_msg(msg: str) -> str:
    # pydantic messages read "Input should be a valid list"; keep what follows "should be".
    for lead in ("Input should be ", "Value should be ", "Input should "):
        if msg.startswith(lead):
            return msg[len(lead) :]
    return msg[:1].lower() + msg[1:]


def _translate(
    err: ValidationError,
    model: type[BaseModel],
    *,
    file: Path,
    line_of: Callable[[JsonPath], int | None],
) -> ProblemError:
    """Turn the first error of a pydantic ValidationError into a ProblemError."""
    first = err.errors()[0]
    kind, loc, ctx = first["type"], first["loc"], first.get("ctx") or {}
    path, tp, field = _resolve_loc(model, loc)
    described = f" ({field.description})" if field is not None and field.description else ""
    if kind == "problem":
        path = (*path, *ctx["path"])
        message, expected = ctx["message"], ctx["expected"]
    elif kind == "missing":
        key = path[-1] if path else "?"
        message = f"missing required field {key!r}"
        expected = f"key {key!r}{described}"
    elif kind == "extra_forbidden":
        owner = _resolve_loc(model, loc[:-1])[1]
        allowed = list(owner.model_fields) if _is_model(owner) else []
        message = f"unknown key {path[-1]!r}"
        expected = f"one of the keys: {_names(allowed)}"
    elif kind == "union_tag_invalid":
        message = f"unknown type {ctx.get('tag')!r}"
        expected = f"'type' one of: {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        tags = [_union_tag(m) for m in get_args(tp)] if _is_union(tp) else []
        message = "missing key 'type'"
        expected = f"a 'type' key, one of: {_names(str(t) for t in tags)}"
    elif kind in ("greater_than", "greater_than_equal"):
        sign = ">" if kind == "greater_than" else ">="
        bound = ctx.get("gt", ctx.get("ge"))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # "must be >= 0", not ">= 0.0"
        message = f"must be {sign} {bound}, got {first['input']!r}"
        expected = (field.description if field is not None else None) or f"a value {sign} {bound}"
    else:
        message = f"invalid value {first['input']!r}"
        expected = _expected_from_msg(first["msg"]) + described
    return ProblemError(
        message, file=file, line=line_of(path), field=_format_path(path) or None, expected=expected
    )


# ---------------------------------------------------------------------------------------------
# Loading and dumping
# ---------------------------------------------------------------------------------------------


def _read_text(path: Path, *, missing: str, expected: str) -> str:
    if not path.is_file():
        raise ProblemError(missing, file=path, expected=expected)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ProblemError(
            f"cannot read the file: {err}", file=path, expected="a readable UTF-8 text file"
        ) from None


def _parse_json(text: str, file: Path, *, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ProblemError(
            f"invalid JSON: {err.msg} (column {err.colno})",
            file=file,
            line=err.lineno if line is None else line,
            expected="valid JSON (check commas, quotes and brackets)",
        ) from None


def load_definition(path: str | Path) -> Definition:
    """Load and validate a definition.json (or the one inside a problem folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFINITION_FILE
    text = _read_text(path, missing=f"{path.name} not found", expected=_FOLDER_LAYOUT)
    data = _parse_json(text, path)
    if not isinstance(data, dict):
        raise ProblemError(
            f"the top level is a JSON {type(data).__name__}",
            file=path,
            line=1,
            expected="a JSON object with the definition's fields",
        )
    try:
        return Definition.model_validate(data)
    except ValidationError as err:
        lines = _json_lines(text)
        raise _translate(
            err, Definition, file=path, line_of=lambda p: _line_for(lines, p)
        ) from None


def _parse_workload(text: str, *, file: Path, line: int, definition: Definition | None) -> Workload:
    data = _parse_json(text, file, line=line)
    if not isinstance(data, dict):
        raise ProblemError(
            f"record is a JSON {type(data).__name__}",
            file=file,
            line=line,
            expected='a JSON object {"uuid": ..., "axes": ..., "inputs": ...}',
        )
    try:
        return Workload.model_validate(data, context={"definition": definition})
    except ValidationError as err:
        raise _translate(err, Workload, file=file, line_of=lambda _: line) from None


def _read_workloads(path: Path, definition: Definition | None) -> list[tuple[int, Workload]]:
    text = _read_text(
        path,
        missing=f"{path.name} not found",
        expected=f"{_FOLDER_LAYOUT}; the kernel must pass at least one workload",
    )
    records: list[tuple[int, Workload]] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue  # blank lines are allowed
        wl = _parse_workload(raw, file=path, line=number, definition=definition)
        if wl.uuid in first_line:
            raise ProblemError(
                f"duplicate uuid {wl.uuid!r} (first used on line {first_line[wl.uuid]})",
                file=path,
                line=number,
                field="uuid",
                expected="a unique uuid per workload",
            )
        first_line[wl.uuid] = number
        records.append((number, wl))
    return records


def load_workloads(
    path: str | Path, *, required: bool, definition: Definition | None = None
) -> list[Workload]:
    """Load a .jsonl file of workloads, one JSON object per line (blank lines skipped).

    With `required`, a missing or empty file is an error (the kernel must pass at least one
    workload); otherwise a missing file gives []. With `definition`, every record is also
    checked against it (axes, inputs, constraints).
    """
    path = Path(path)
    if not required and not path.exists():
        return []
    records = _read_workloads(path, definition)
    if required and not records:
        raise ProblemError(
            "no workloads (the file has no records)",
            file=path,
            expected="at least one workload: the kernel must pass at least one",
        )
    return [wl for _, wl in records]


def _check_unique_across(
    workloads: list[Workload], probes_path: Path, definition: Definition
) -> list[Workload]:
    if not probes_path.exists():
        return []
    taken = {wl.uuid for wl in workloads}
    probes: list[Workload] = []
    for number, probe in _read_workloads(probes_path, definition):
        if probe.uuid in taken:
            raise ProblemError(
                f"uuid {probe.uuid!r} is already used in {WORKLOADS_FILE}",
                file=probes_path,
                line=number,
                field="uuid",
                expected="uuids unique across workloads and probes",
            )
        probes.append(probe)
    return probes


def load_problem(path: str | Path) -> Problem:
    """Load and validate a problem folder."""
    root = Path(path)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "not found"
        raise ProblemError(f"problem folder {what}", file=root, expected=_FOLDER_LAYOUT)
    definition = load_definition(root / DEFINITION_FILE)
    workloads = load_workloads(root / WORKLOADS_FILE, required=True, definition=definition)
    probes = _check_unique_across(workloads, root / PROBES_FILE, definition)
    kernel = root / KERNEL_FILE
    return Problem(
        root=root,
        definition=definition,
        workloads=workloads,
        probes=probes,
        kernel_path=kernel if kernel.is_file() else None,
    )


def _definition_json(defn: Definition) -> dict[str, Any]:
    # Defaults are left out so written files stay as small as hand-written ones.
    return defn.model_dump(mode="json", exclude_defaults=True)


def dump_definition(defn: Definition, path: str | Path) -> Path:
    """Write `defn` as definition.json (`path` is the file or its folder); returns the file."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFINITION_FILE
    text = json.dumps(_definition_json(defn), indent=2, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def dump_workloads(workloads: Iterable[Workload], path: str | Path) -> Path:
    """Write workloads as JSON lines, one record a line; returns the file."""
    path = Path(path)
    lines = [
        json.dumps(wl.model_dump(mode="json"), ensure_ascii=False, separators=(", ", ": "))
        for wl in workloads
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
