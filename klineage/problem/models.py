"""The problem models: a definition, its workloads, and the folder that holds them.

A problem folder holds:

- ``definition.json``: axes, input/output tensor specs, a PyTorch reference ``run(...)``,
  constraints, and our extensions (``tolerance``, and ``range`` on a tensor spec);
- ``workloads.jsonl``: the concrete sizes the kernel must pass (at least one);
- ``probes.jsonl`` (optional): extra sizes that are tried but not required to pass;
- ``kernel.cu`` (optional): the kernel source;
- ``compile_options.json`` (optional): extra compiler and linker flags
  (:mod:`.compile_options`).

The models hold the data and every check that needs more than one field; reading the files
and turning pydantic's errors into a :class:`ProblemError` with a line is :mod:`.load`'s job.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

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
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from klineage.headers import included_names, local_headers
from klineage.kernel import KernelSource
from klineage.problem.compile_options import COMPILE_OPTIONS_FILE, CompileOptions
from klineage.problem.dtypes import FLOAT_DTYPES, SUPPORTED_DTYPES, dtype_itemsize
from klineage.problem.errors import JsonPath, ProblemError, fail, listed

DEFINITION_FILE = "definition.json"
WORKLOADS_FILE = "workloads.jsonl"
PROBES_FILE = "probes.jsonl"
KERNEL_FILE = "kernel.cu"

FOLDER_LAYOUT = (
    f"a problem folder holding {DEFINITION_FILE} and {WORKLOADS_FILE} "
    f"({PROBES_FILE}, {KERNEL_FILE} and {COMPILE_OPTIONS_FILE} are optional)"
)

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
            fail((), f"range {value!r} is not a pair", "[low, high]: numbers or axis names")
        for i, bound in enumerate(value):
            if not isinstance(bound, int | float | str) or isinstance(bound, bool):
                fail(
                    (i,),
                    f"range bound {bound!r} is not a number or an axis name",
                    "a number or an axis name",
                )
        return value

    @field_validator("dtype")
    @classmethod
    def _supported_dtype(cls, value: str) -> str:
        if value not in SUPPORTED_DTYPES:
            fail(
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
            fail((), f"{value!r} is not a number or bool", "a JSON number, true or false")
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
                fail(
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
                fail(
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
                    fail(
                        ("outputs", name, "inplace_of"),
                        f"inplace_of names {target!r}, which is not an input tensor",
                        f"one of the input tensors: {listed(self.inputs)}",
                    )
                if (source.shape, source.dtype) != (spec.shape, spec.dtype) or target in taken:
                    fail(
                        ("outputs", name, "inplace_of"),
                        f"output {name!r} cannot live in input {target!r}",
                        "an input of the same shape and dtype, used by one output only",
                    )
                taken.add(target)
            if isinstance(spec.compare, IndicesOf):
                check = spec.compare
                if check.source not in self.inputs or check.values not in self.outputs:
                    fail(
                        ("outputs", name, "compare"),
                        f"indices_of needs an input {check.source!r} and an output "
                        f"{check.values!r}",
                        f"inputs: {listed(self.inputs)}; outputs: {listed(self.outputs)}",
                    )
                if spec.dtype not in ("int64", "int32"):
                    fail(
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
                fail(
                    ("axes", name, "parent"),
                    f"unknown parent axis {axis.parent!r}",
                    f"another of the axes: {listed(self.axes)}",
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
            fail(path, f"{what} {text!r} does not parse: {err.msg}", expected)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id not in self.axes:
                fail(
                    path,
                    f"{what} {text!r} uses unknown name {node.id!r}",
                    f"only axis names: {listed(self.axes)}",
                )

    def _check_spec(self, path: JsonPath, spec: TensorSpec) -> None:
        for i, axis in enumerate(spec.shape or []):
            if axis not in self.axes:
                fail(
                    (*path, "shape", i),
                    f"unknown axis {axis!r}",
                    f"one of the axes: {listed(self.axes)}",
                )
        if spec.range is None:
            return
        for i, bound in enumerate(spec.range):
            if isinstance(bound, str) and bound not in self.axes:
                fail(
                    (*path, "range", i),
                    f"range bound {bound!r} is not a defined axis",
                    f"a number or one of the axes: {listed(self.axes)}",
                )
        low, high = spec.range
        if not isinstance(low, str) and not isinstance(high, str) and low >= high:
            fail((*path, "range"), f"empty range [{low}, {high})", "low < high")

    def _check_tolerance(self) -> None:
        if not isinstance(self.tolerance, dict):
            return
        for name in self.tolerance:
            if name not in self.outputs:
                fail(
                    ("tolerance", name),
                    f"no output named {name!r}",
                    f"one of the outputs: {listed(self.outputs)} (or a single atol/rtol)",
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
        have = listed([*self.inputs, *self.outputs])
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
            raise KeyError(f"no output {output_name!r}; have: {listed(self.outputs)}")
        dtype = self.outputs[output_name].dtype
        if isinstance(self.tolerance, dict):
            if output_name in self.tolerance:
                return self.tolerance[output_name]
        elif self.tolerance is not None and dtype in FLOAT_DTYPES:
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
    compile_options: CompileOptions = Field(
        default_factory=CompileOptions,
        description="extra compiler and linker flags from compile_options.json (none without one)",
    )

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
        return KernelSource.from_file(self.kernel_path, self.compile_options.include_dirs)

    def headers(self) -> tuple[KernelSource, ...]:
        """The local headers kernel.cu includes (next to it, or in a ``-I`` folder of its
        compile options); none without a kernel."""
        if self.kernel_path is None or not self.kernel_path.is_file():
            return ()
        text = self.kernel_path.read_text(encoding="utf-8", errors="replace")
        return local_headers(self.kernel_state(text))

    @property
    def build_options(self) -> CompileOptions:
        """The compile options a build uses: compile_options.json's, plus the problem folder
        as an include folder where kernel.cu includes a header kept in it (nvcc compiles a
        copy of the source in a temporary folder, where the header is not)."""
        if self.kernel_path is None or not self.kernel_path.is_file():
            return self.compile_options
        text = self.kernel_path.read_text(encoding="utf-8", errors="replace")
        if not any((self.root / name).is_file() for name in included_names(text)):
            return self.compile_options
        here = f"-I{self.root.resolve()}"
        flags = self.compile_options.cuda_cflags
        if here in flags:
            return self.compile_options
        return self.compile_options.model_copy(update={"cuda_cflags": (*flags, here)})

    def kernel_state(self, text: str) -> KernelSource:
        """Another state of the problem's kernel (a lineage's, a candidate's): ``text`` read
        with the same local headers as kernel.cu (next to it, or in a ``-I`` folder)."""
        return KernelSource(
            text,
            name=f"{self.name}.cu",
            path=self.kernel_path,
            include_dirs=self.compile_options.include_dirs,
        )


# ---------------------------------------------------------------------------------------------
# Semantic checks that need more than one field
# ---------------------------------------------------------------------------------------------


def _check_reference(source: str, input_names: list[str], axis_names: list[str]) -> None:
    try:
        tree = ast.parse(source, filename="<reference>")
    except SyntaxError as err:
        fail(
            ("reference",),
            f"reference does not parse: {err.msg} (reference line {err.lineno})",
            "valid Python source defining run(...)",
        )
    run = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"), None)
    want = f"run({', '.join(input_names)})"
    if run is None:
        fail(
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
        fail(
            ("reference",),
            f"run({got}) parameters do not match the inputs",
            f"{want}: the input names in definition order",
        )


def _check_workload(defn: Definition, wl: Workload) -> None:
    var_axes = defn.var_axes()
    const_axes = defn.const_axes()
    for name in wl.axes:
        if name in const_axes:
            fail(
                ("axes", name),
                f"axis {name!r} is const ({const_axes[name]}) in the definition",
                f"values only for the var axes: {listed(var_axes)}",
            )
        if name not in defn.axes:
            fail(
                ("axes", name), f"unknown axis {name!r}", f"one of the var axes: {listed(var_axes)}"
            )
    for name in var_axes:
        if name not in wl.axes:
            fail(
                ("axes", name),
                f"missing value for var axis {name!r}",
                f"a value for every var axis: {listed(var_axes)}",
            )
    _check_workload_inputs(defn, wl)
    _check_workload_constraints(defn, wl)


def _check_workload_inputs(defn: Definition, wl: Workload) -> None:
    for name in wl.inputs:
        if name not in defn.inputs:
            fail(
                ("inputs", name),
                f"unknown input {name!r}",
                f"one of the inputs: {listed(defn.inputs)}",
            )
    for name, spec in defn.inputs.items():
        given = wl.inputs.get(name)
        if given is None:
            fail(
                ("inputs", name),
                f"missing input {name!r}",
                f"an entry for every input: {listed(defn.inputs)}",
            )
        if spec.is_scalar and not isinstance(given, ScalarInput):
            fail(
                ("inputs", name),
                f"input {name!r} is a scalar but is given {given.type!r}",
                '{"type": "scalar", "value": <number>}',
            )
        if not spec.is_scalar and not isinstance(given, RandomInput):
            fail(
                ("inputs", name),
                f"input {name!r} is a tensor but is given {given.type!r}",
                '{"type": "random"}',
            )
        if isinstance(given, ScalarInput):
            _check_scalar_value(name, spec.dtype, given.value)


def _check_scalar_value(name: str, dtype: str, value: bool | float) -> None:
    if dtype == "bool" and not isinstance(value, bool):
        fail(("inputs", name, "value"), f"{value!r} for a bool input", "true or false")
    if dtype not in FLOAT_DTYPES and isinstance(value, float) and not value.is_integer():
        fail(("inputs", name, "value"), f"{value!r} for a {dtype} input", "an integer")


def _check_workload_constraints(defn: Definition, wl: Workload) -> None:
    values = defn.axis_values(wl)
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    for text in defn.constraints:
        try:
            # Axis values only, no builtins: a constraint is arithmetic over sizes.
            ok = eval(text, {"__builtins__": {}}, dict(values))
        except Exception as err:
            fail(
                ("axes",),
                f"constraint {text!r} raised {type(err).__name__}: {err} ({shown})",
                "constraints that evaluate over the axis values",
            )
        if not ok:
            fail(
                ("axes",),
                f"constraint {text!r} fails for {shown}",
                "axis values satisfying every constraint in the definition",
            )
