"""Conditions: what must hold for a mechanism to be valid, checked without running anything.

A :class:`Condition` is a small frozen pydantic model with a ``kind`` tag, so lists of them
round-trip through JSON (skills store them). Each one

- evaluates against a problem's definition and one workload: ``True``, ``False``, or ``None``
  when it cannot tell (a :class:`Prose` condition, an unknown block size);
- prints as prose, e.g. "cols must be divisible by 4 (float4 loads read 4 elements at a
  time)";
- merges with others: :func:`merge_conditions` drops duplicates and keeps the strictest of
  conditions on the same thing (``cols % 4`` and ``cols % 8`` become ``cols % 8``).

Facts about the kernel itself (its launch block size, its shared memory, the target
architecture) come from an :class:`EvalContext`, or are stored on the condition when a
mechanism knows them. Sizes that depend on the workload are stored as *size expressions*:
small Python expressions over axis names such as ``"min(cols, 1024)"``, evaluated by
:func:`evaluate_size` (a whitelist interpreter, never ``eval``).

To add a condition kind, subclass :class:`Condition` with a ``kind: Literal["..."]`` field and
implement ``evaluate`` and ``prose``; the subclass registers itself for :func:`parse_condition`.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    TypeAdapter,
    field_validator,
)

from klineage.limits import DEFAULT_ARCH, HARNESS_ALIGNMENT
from klineage.problem import Definition, Problem, Workload, dtype_itemsize

__all__ = [
    "AnyCondition",
    "ArchAtLeast",
    "AxisAtLeast",
    "AxisAtMost",
    "AxisDivisible",
    "BlockSizeAtMost",
    "BlockSizeMultiple",
    "Condition",
    "DtypeIn",
    "EvalContext",
    "PointerAlignment",
    "Prose",
    "SharedMemoryAtMost",
    "ToleranceAtLeast",
    "Violation",
    "check_all",
    "conditions_from_json",
    "conditions_to_json",
    "element_alignment_divisor",
    "evaluate_size",
    "merge_conditions",
    "parse_arch",
    "parse_condition",
]

Target = Problem | Definition
"""What conditions evaluate against: a loaded problem, or just its definition."""

"""Bytes: the harness hands kernels fresh ``cudaMalloc`` buffers, aligned to at least this."""


# ---------------------------------------------------------------------------------------------
# Size expressions
# ---------------------------------------------------------------------------------------------

_BINOPS: dict[type, Any] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitXor: lambda a, b: a ^ b,
}
_COMPARE: dict[type, Any] = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}


class _Unknown(Exception):
    pass


def _size(node: ast.AST, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Expression):
        return _size(node.body, values)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):  # bool is an int
        return int(node.value)
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise _Unknown(node.id)
        return int(values[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _size(node.left, values), _size(node.right, values)
        if isinstance(node.op, ast.FloorDiv | ast.Mod) and right == 0:
            raise _Unknown("division by zero")
        if isinstance(node.op, ast.LShift) and right > 64:
            raise _Unknown("shift too large")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _size(node.operand, values)
        if isinstance(node.op, ast.USub):
            return -operand
        if isinstance(node.op, ast.UAdd):
            return operand
        if isinstance(node.op, ast.Invert):
            return ~operand
        if isinstance(node.op, ast.Not):
            return int(not operand)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _size(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _size(comparator, values)
            if not _COMPARE[type(op)](left, right):
                return 0
            left = right
        return 1
    if isinstance(node, ast.BoolOp):
        results = [_size(v, values) for v in node.values]
        return int(all(results) if isinstance(node.op, ast.And) else any(results))
    if isinstance(node, ast.IfExp):
        return _size(node.body if _size(node.test, values) else node.orelse, values)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("min", "max")
        and node.args
        and not node.keywords
    ):
        args = [_size(a, values) for a in node.args]
        return min(args) if node.func.id == "min" else max(args)
    raise _Unknown(ast.dump(node)[:40])


def evaluate_size(expr: str | int | None, values: Mapping[str, int] | None = None) -> int | None:
    """The value of a size expression over axis names, or None when it cannot be evaluated.

    The expression language is integer arithmetic (``+ - * // % << >> & | ^``), comparisons,
    ``and``/``or``/``not``, ``a if c else b``, ``min``/``max``, integer literals and names
    looked up in ``values``. Anything else, or an unknown name, gives None.
    """
    if expr is None:
        return None
    if isinstance(expr, int):
        return expr
    try:
        return _size(ast.parse(expr.strip(), mode="eval"), values or {})
    except (_Unknown, SyntaxError, RecursionError, ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------------------------
# Architectures and context
# ---------------------------------------------------------------------------------------------

_ARCH = re.compile(r"^(?:sm_|compute_)?(\d+)([a-z]?)$")


def parse_arch(arch: str | int) -> tuple[int, str]:
    """``"sm_90a"`` -> ``(90, "a")``; ``"sm_80"`` or ``80`` -> ``(80, "")``."""
    if isinstance(arch, int):
        return arch, ""
    match = _ARCH.match(arch.strip())
    if match is None:
        raise ValueError(f"unknown architecture {arch!r}; expected e.g. 'sm_90' or 'sm_90a'")
    return int(match.group(1)), match.group(2)


class EvalContext(BaseModel):
    """What a condition may need to know beyond the problem: the target and kernel facts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arch: str = Field(default=DEFAULT_ARCH, description="target architecture, e.g. 'sm_90a'")
    block_size: str | None = Field(
        default=None,
        description="threads per block of the kernel's launch, as a size expression over axes "
        "('256', 'min(cols, 1024)'); None when unknown",
    )
    shared_memory_bytes: str | None = Field(
        default=None,
        description="shared memory per block (static + dynamic), as a size expression",
    )


# ---------------------------------------------------------------------------------------------
# The base class and its registry
# ---------------------------------------------------------------------------------------------

_KINDS: dict[str, type[Condition]] = {}


def _join_why(*whys: str) -> str:
    seen: list[str] = []
    for why in whys:
        for part in why.split("; "):
            if part and part not in seen:
                seen.append(part)
    return "; ".join(seen)


class Condition(BaseModel):
    """A static predicate over a problem's workloads (and the kernel's facts)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: str = Field(description="the condition's type tag, used to read it back from JSON")
    why: str = Field(default="", description="the reason, in prose, shown in parentheses")

    per_workload: ClassVar[bool] = True
    """Whether the answer can differ between workloads (False: checked once)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        default = cls.model_fields["kind"].default
        if isinstance(default, str):
            if default in _KINDS and _KINDS[default].__qualname__ != cls.__qualname__:
                raise TypeError(f"condition kind {default!r} is already taken")
            _KINDS[default] = cls

    # -- to implement -------------------------------------------------------------------------

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        """True when the condition holds for this workload, False when it fails, None when
        it cannot tell."""
        raise NotImplementedError

    @property
    def statement(self) -> str:
        """The condition itself, in prose, without the reason."""
        raise NotImplementedError

    # -- shared behaviour ---------------------------------------------------------------------

    @property
    def prose(self) -> str:
        """The condition in prose, with its reason in parentheses."""
        return f"{self.statement} ({self.why})" if self.why else self.statement

    def __str__(self) -> str:
        return self.prose

    def slot(self) -> tuple[Any, ...] | None:
        """Conditions with the same slot constrain the same thing and can be combined."""
        return None

    def combine(self, other: Condition) -> Condition:
        """The strictest condition implied by ``self`` and ``other`` (same slot)."""
        return self

    def check(
        self, problem: Problem, context: EvalContext | None = None, *, probes: bool = False
    ) -> list[Violation]:
        """The workloads (and, with ``probes``, the probes) this condition fails on."""
        return check_all([self], problem, context, probes=probes)

    @staticmethod
    def _definition(target: Target) -> Definition:
        return target.definition if isinstance(target, Problem) else target

    def _axis_values(self, target: Target, workload: Workload | None) -> dict[str, int]:
        """Const axes and the workload's var axes; without a workload, const axes only."""
        values = dict(self._definition(target).const_axes())
        if workload is not None:
            values.update(workload.axes)
        return values


def parse_condition(data: Condition | Mapping[str, Any]) -> Condition:
    """A condition from its JSON form (``{"kind": "axis_divisible", ...}``)."""
    if isinstance(data, Condition):
        return data
    if not isinstance(data, Mapping) or "kind" not in data:
        raise ValueError(f"a condition is a JSON object with a 'kind'; got {data!r}")
    kind = data["kind"]
    if kind not in _KINDS:
        raise ValueError(f"unknown condition kind {kind!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[kind].model_validate(dict(data))


AnyCondition = Annotated[
    Condition,
    PlainValidator(parse_condition),
    PlainSerializer(lambda c: c.model_dump(mode="json"), return_type=dict),
]
"""Use in other models (skills) to hold any condition and read it back by its ``kind``."""

_LIST = TypeAdapter(list[AnyCondition])


def conditions_to_json(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    """Conditions as JSON data, each tagged with its `kind`."""
    return _LIST.dump_python(list(conditions), mode="json")


def conditions_from_json(data: Iterable[Mapping[str, Any]]) -> list[Condition]:
    """Conditions read back from JSON data (by their `kind`)."""
    return _LIST.validate_python(list(data))


# ---------------------------------------------------------------------------------------------
# Conditions on axes and tensors
# ---------------------------------------------------------------------------------------------


class AxisDivisible(Condition):
    """An axis must be a multiple of ``k`` (vector widths, tile sizes)."""

    kind: Literal["axis_divisible"] = "axis_divisible"
    """Always 'axis_divisible': the tag JSON reads it back by."""
    axis: str = Field(description="the axis name")
    k: int = Field(gt=0, description="the divisor")

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        value = self._axis_values(target, workload).get(self.axis)
        return None if value is None else value % self.k == 0

    @property
    def statement(self) -> str:
        return f"{self.axis} must be divisible by {self.k}"

    def slot(self) -> tuple[Any, ...]:
        return ("axis_divisible", self.axis)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, AxisDivisible)
        k = self.k * other.k // math.gcd(self.k, other.k)
        return AxisDivisible(axis=self.axis, k=k, why=_join_why(self.why, other.why))


class AxisAtMost(Condition):
    """An axis must not exceed ``n`` (one block per row holding the row, a register tile)."""

    kind: Literal["axis_at_most"] = "axis_at_most"
    """Always 'axis_at_most': the tag JSON reads it back by."""
    axis: str = Field(description="the axis name")
    n: int = Field(description="the largest allowed value")

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        value = self._axis_values(target, workload).get(self.axis)
        return None if value is None else value <= self.n

    @property
    def statement(self) -> str:
        return f"{self.axis} must be at most {self.n}"

    def slot(self) -> tuple[Any, ...]:
        return ("axis_at_most", self.axis)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, AxisAtMost)
        return AxisAtMost(
            axis=self.axis, n=min(self.n, other.n), why=_join_why(self.why, other.why)
        )


class AxisAtLeast(Condition):
    """An axis must be at least ``n`` (enough work per thread, a full tile)."""

    kind: Literal["axis_at_least"] = "axis_at_least"
    """Always 'axis_at_least': the tag JSON reads it back by."""
    axis: str = Field(description="the axis name")
    n: int = Field(description="the smallest allowed value")

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        value = self._axis_values(target, workload).get(self.axis)
        return None if value is None else value >= self.n

    @property
    def statement(self) -> str:
        return f"{self.axis} must be at least {self.n}"

    def slot(self) -> tuple[Any, ...]:
        return ("axis_at_least", self.axis)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, AxisAtLeast)
        return AxisAtLeast(
            axis=self.axis, n=max(self.n, other.n), why=_join_why(self.why, other.why)
        )


class DtypeIn(Condition):
    """A tensor's dtype must be one of a set (a ``float4`` load assumes float32)."""

    kind: Literal["dtype_in"] = "dtype_in"
    """Always 'dtype_in': the tag JSON reads it back by."""
    tensor: str = Field(description="an input or output name")
    dtypes: tuple[str, ...] = Field(description="the allowed dtypes, sorted")
    per_workload: ClassVar[bool] = False

    @field_validator("dtypes", mode="before")
    @classmethod
    def _sorted(cls, value: Any) -> Any:
        # Sorted and unique, so equal sets compare (and de-duplicate) as equal conditions.
        if isinstance(value, str):
            value = [value]
        return tuple(sorted(set(value))) if isinstance(value, Iterable) else value

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        definition = self._definition(target)
        try:
            spec = definition.spec(self.tensor)
        except KeyError:
            return None
        return spec.dtype in self.dtypes

    @property
    def statement(self) -> str:
        if len(self.dtypes) == 1:
            return f"{self.tensor} must be {self.dtypes[0]}"
        return f"{self.tensor} must be one of {', '.join(self.dtypes)}"

    def slot(self) -> tuple[Any, ...]:
        return ("dtype_in", self.tensor)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, DtypeIn)
        both = tuple(sorted(set(self.dtypes) & set(other.dtypes)))
        return DtypeIn(tensor=self.tensor, dtypes=both, why=_join_why(self.why, other.why))


class PointerAlignment(Condition):
    """A tensor's base pointer must be aligned to ``bytes``.

    The harness passes fresh ``cudaMalloc`` buffers (256-byte aligned), so this holds for any
    alignment up to 256. Whether each *row* start is aligned depends on the row length: state
    that with :class:`AxisDivisible` (``float4`` loads of float32 rows need ``cols % 4 == 0``).
    """

    kind: Literal["pointer_alignment"] = "pointer_alignment"
    """Always 'pointer_alignment': the tag JSON reads it back by."""
    tensor: str = Field(description="an input or output name")
    bytes: int = Field(gt=0, description="the required alignment in bytes")
    per_workload: ClassVar[bool] = False

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        if HARNESS_ALIGNMENT % self.bytes == 0:
            return True
        return None

    @property
    def statement(self) -> str:
        return f"the pointer to {self.tensor} must be {self.bytes}-byte aligned"

    def slot(self) -> tuple[Any, ...]:
        return ("pointer_alignment", self.tensor)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, PointerAlignment)
        return PointerAlignment(
            tensor=self.tensor,
            bytes=max(self.bytes, other.bytes),
            why=_join_why(self.why, other.why),
        )


class ToleranceAtLeast(Condition):
    """Every float output must be checked with a relative tolerance of at least ``rtol``
    (fast-math intrinsics trade a few ulp for speed)."""

    kind: Literal["tolerance_at_least"] = "tolerance_at_least"
    """Always 'tolerance_at_least': the tag JSON reads it back by."""
    rtol: float = Field(ge=0, description="the smallest acceptable relative tolerance")
    per_workload: ClassVar[bool] = False

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        definition = self._definition(target)
        floats = [
            name
            for name, spec in definition.outputs.items()
            if spec.dtype.startswith(("float", "bfloat"))
        ]
        return all(definition.tolerance_for(name).rtol >= self.rtol for name in floats)

    @property
    def statement(self) -> str:
        return f"float outputs must be checked with rtol >= {self.rtol:g}"

    def slot(self) -> tuple[Any, ...]:
        return ("tolerance_at_least",)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, ToleranceAtLeast)
        return ToleranceAtLeast(rtol=max(self.rtol, other.rtol), why=_join_why(self.why, other.why))


# ---------------------------------------------------------------------------------------------
# Conditions on the target and the kernel's launch
# ---------------------------------------------------------------------------------------------


class ArchAtLeast(Condition):
    """The target architecture must be at least ``sm`` (``cp.async`` needs sm_80).

    With ``specific`` the feature is arch-specific (``wgmma`` needs ``sm_90a``): the target
    must be exactly that architecture with the ``a`` suffix, since arch-specific features do
    not carry forward to later architectures.
    """

    kind: Literal["arch_at_least"] = "arch_at_least"
    """Always 'arch_at_least': the tag JSON reads it back by."""
    sm: int = Field(description="the smallest architecture number, e.g. 80 for sm_80")
    specific: bool = Field(default=False, description="needs the arch-specific target (sm_90a)")
    per_workload: ClassVar[bool] = False

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        try:
            number, suffix = parse_arch((context or EvalContext()).arch)
        except ValueError:
            return None
        if self.specific:
            return number == self.sm and suffix == "a"
        return number >= self.sm

    @property
    def statement(self) -> str:
        if self.specific:
            return f"the target must be sm_{self.sm}a"
        return f"the target must be sm_{self.sm} or newer"

    def slot(self) -> tuple[Any, ...]:
        return ("arch_at_least",)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, ArchAtLeast)
        if self.specific != other.specific:
            pick = self if self.specific else other  # the specific one is stricter
        else:
            pick = self if self.sm >= other.sm else other
        return pick.model_copy(update={"why": _join_why(self.why, other.why)})


class _BlockCondition(Condition):
    block_size: str | None = Field(
        default=None,
        description="the launch's threads per block as a size expression over axes; "
        "None: take it from the evaluation context",
    )

    def _block(
        self, target: Target, workload: Workload | None, context: EvalContext | None
    ) -> int | None:
        expr = self.block_size
        if expr is None and context is not None:
            expr = context.block_size
        return evaluate_size(expr, self._axis_values(target, workload))


class BlockSizeMultiple(_BlockCondition):
    """Threads per block must be a multiple of ``k`` (full-mask warp shuffles need whole
    warps: 32)."""

    kind: Literal["block_size_multiple"] = "block_size_multiple"
    """Always 'block_size_multiple': the tag JSON reads it back by."""
    k: int = Field(gt=0, description="the divisor, usually 32")

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        block = self._block(target, workload, context)
        return None if block is None else block % self.k == 0

    @property
    def statement(self) -> str:
        return f"the block size must be a multiple of {self.k}"

    def slot(self) -> tuple[Any, ...]:
        return ("block_size_multiple", self.block_size)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, BlockSizeMultiple)
        k = self.k * other.k // math.gcd(self.k, other.k)
        return self.model_copy(update={"k": k, "why": _join_why(self.why, other.why)})


class BlockSizeAtMost(_BlockCondition):
    """Threads per block must not exceed ``n`` (the ``__launch_bounds__`` maximum, or 1024)."""

    kind: Literal["block_size_at_most"] = "block_size_at_most"
    """Always 'block_size_at_most': the tag JSON reads it back by."""
    n: int = Field(gt=0, description="the largest allowed block size")

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        block = self._block(target, workload, context)
        return None if block is None else block <= self.n

    @property
    def statement(self) -> str:
        return f"the block size must be at most {self.n}"

    def slot(self) -> tuple[Any, ...]:
        return ("block_size_at_most", self.block_size)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, BlockSizeAtMost)
        n = min(self.n, other.n)
        return self.model_copy(update={"n": n, "why": _join_why(self.why, other.why)})


class SharedMemoryAtMost(Condition):
    """Shared memory per block must fit: 48 KiB without opt-in, 227 KiB on sm_90 with it."""

    kind: Literal["shared_memory_at_most"] = "shared_memory_at_most"
    """Always 'shared_memory_at_most': the tag JSON reads it back by."""
    bytes: int = Field(gt=0, description="the capacity in bytes")
    usage: str | None = Field(
        default=None,
        description="bytes the kernel uses per block, as a size expression over axes; None: "
        "take it from the evaluation context",
    )

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        expr = self.usage
        if expr is None and context is not None:
            expr = context.shared_memory_bytes
        used = evaluate_size(expr, self._axis_values(target, workload))
        return None if used is None else used <= self.bytes

    @property
    def statement(self) -> str:
        return f"shared memory per block must be at most {self.bytes} bytes"

    def slot(self) -> tuple[Any, ...]:
        return ("shared_memory_at_most", self.usage)

    def combine(self, other: Condition) -> Condition:
        assert isinstance(other, SharedMemoryAtMost)
        n = min(self.bytes, other.bytes)
        return self.model_copy(update={"bytes": n, "why": _join_why(self.why, other.why)})


class Prose(Condition):
    """A condition that only a person (or an LLM) can check; it always evaluates to None."""

    kind: Literal["prose"] = "prose"
    """Always 'prose': the tag JSON reads it back by."""
    text: str = Field(min_length=1, description="the condition, in prose")
    per_workload: ClassVar[bool] = False

    def evaluate(
        self, target: Target, workload: Workload | None = None, context: EvalContext | None = None
    ) -> bool | None:
        return None

    @property
    def statement(self) -> str:
        return self.text


# ---------------------------------------------------------------------------------------------
# Checking and merging
# ---------------------------------------------------------------------------------------------


class Violation(BaseModel):
    """A condition that fails on a workload (or on the problem as a whole)."""

    model_config = ConfigDict(frozen=True)

    condition: AnyCondition = Field(description="the condition that failed")
    workload: str | None = Field(
        default=None, description="the failing workload's uuid; None when no workload matters"
    )
    label: str = Field(default="", description="the workload's axes, e.g. rows=4,cols=1001")
    probe: bool = Field(default=False, description="True when the workload is a probe")

    def __str__(self) -> str:
        where = f"{self.label or self.workload}: " if self.workload else ""
        kind = "probe " if self.probe else ""
        return f"{kind}{where}{self.condition.prose}"


def check_all(
    conditions: Iterable[Condition],
    problem: Problem,
    context: EvalContext | None = None,
    *,
    probes: bool = False,
) -> list[Violation]:
    """Every (condition, workload) pair that evaluates to False; unknowns are not violations.

    Conditions that do not depend on the workload are reported once, without a workload.
    """
    workloads = [(w, False) for w in problem.workloads]
    if probes:
        workloads += [(w, True) for w in problem.probes]
    found: list[Violation] = []
    for condition in conditions:
        if not condition.per_workload:
            if condition.evaluate(problem, None, context) is False:
                found.append(Violation(condition=condition))
            continue
        for workload, is_probe in workloads:
            if condition.evaluate(problem, workload, context) is False:
                found.append(
                    Violation(
                        condition=condition,
                        workload=workload.uuid,
                        label=workload.label,
                        probe=is_probe,
                    )
                )
    return found


def merge_conditions(*groups: Iterable[Condition]) -> list[Condition]:
    """One list from several: duplicates dropped, conditions on the same thing combined into
    the strictest (divisors by lcm, upper bounds by min, lower bounds by max), first-seen
    order kept."""
    merged: list[Condition] = []
    by_slot: dict[tuple[Any, ...], int] = {}
    for group in groups:
        for condition in group:
            slot = condition.slot()
            if slot is not None and slot in by_slot:
                index = by_slot[slot]
                merged[index] = merged[index].combine(condition)
                continue
            if condition in merged:
                continue
            if slot is not None:
                by_slot[slot] = len(merged)
            merged.append(condition)
    return merged


def element_alignment_divisor(dtype: str, alignment_bytes: int) -> int:
    """How many elements of ``dtype`` make ``alignment_bytes``: float32 and 16 bytes -> 4."""
    return max(1, alignment_bytes // dtype_itemsize(dtype))
