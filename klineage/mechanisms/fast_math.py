"""Fast-math intrinsics: ``__expf``, ``__logf``, ``__fdividef``, ``rsqrtf``...

The ``__`` intrinsics map to the SFU's approximate instructions (a few instructions instead of
a few dozen), trading a few ulp of accuracy; ``rsqrtf`` replaces a square root and a
division by one approximate reciprocal square root.

=====================  ===========================
fast                   accurate
=====================  ===========================
``__expf(x)``          ``expf(x)`` (also exp10, log, log2, log10, sin, cos, tan, pow)
``__fdividef(a, b)``   ``a / b``
``rsqrtf(x)``          ``1.0f / sqrtf(x)``
=====================  ===========================

Both directions keep the grouping of the surrounding code: ``y * rsqrtf(v)`` becomes
``y * (1.0f / sqrtf(v))``. Forward candidates are the accurate calls, and divisions whose
operands are known to be float (one float operand, the other float or integer; never a
double) in device-only code, since the intrinsics do not exist on the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from klineage.conditions import Condition, Prose, ToleranceAtLeast
from klineage.cuda.cexpr import MULTIPLICATIVE, PRIMARY, operand, replacement_target, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import struct_fields
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

# intrinsic -> accurate function with the same arguments
RENAMED: dict[str, str] = {
    "__expf": "expf",
    "__exp10f": "exp10f",
    "__logf": "logf",
    "__log2f": "log2f",
    "__log10f": "log10f",
    "__sinf": "sinf",
    "__cosf": "cosf",
    "__tanf": "tanf",
    "__powf": "powf",
}
ACCURATE: dict[str, str] = {v: k for k, v in RENAMED.items()}
DIVIDE = "__fdividef"
RSQRT = "rsqrtf"
INTRINSICS = (*RENAMED, DIVIDE, RSQRT)
_ARITY = {**dict.fromkeys(RENAMED, 1), "__powf": 2, DIVIDE: 2, RSQRT: 1}

# What each intrinsic costs in accuracy (CUDA C++ Programming Guide, intrinsic functions).
_RTOL: dict[str, float] = {"__expf": 1e-5, "__exp10f": 1e-5, "__powf": 1e-5, DIVIDE: 1e-6}
_PROSE: dict[str, str] = {
    "__sinf": "arguments of __sinf should stay within [-pi, pi], where its error is 2^-21.4",
    "__cosf": "arguments of __cosf should stay within [-pi, pi], where its error is 2^-21.4",
    "__tanf": "arguments of __tanf should stay within [-pi, pi]; it is __sinf / __cosf",
    "__logf": "arguments of __logf should stay within [0.5, 2] for a 2^-21.4 absolute error",
    DIVIDE: "the divisor must stay below 2^126 in magnitude (__fdividef returns 0 beyond it)",
}
_FLOAT_FUNCTIONS = frozenset(
    {*RENAMED, *ACCURATE, DIVIDE, RSQRT, "sqrtf", "fmaxf", "fminf", "fabsf", "fmaf", "rcbrtf",
     "__frcp_rn", "__fsqrt_rn", "__fmul_rn", "__fadd_rn", "__int2float_rn", "__half2float",
     "__bfloat162float", "tanhf", "erff", "floorf", "ceilf", "truncf", "roundf", "copysignf",
     "__saturatef", "exp2f", "__exp2f"}
)  # fmt: skip
_FLOAT_TYPES = frozenset({"float", "const float"})
_FLOAT_VECTORS = frozenset({"float2", "float3", "float4"})
_INT_TYPES = frozenset(
    {"int", "unsigned", "unsigned int", "int64_t", "int32_t", "uint32_t", "long", "long long"}
)
_FLOAT_LITERAL = re.compile(r"^(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?[fF]$")
_INT_LITERAL = re.compile(r"^\d+[uUlL]*$")
_ONE = re.compile(r"^1(\.0*)?[fF]$")


def _strip_type(type_text: str) -> str:
    return " ".join(w for w in type_text.split() if w not in ("const", "volatile", "__shared__"))


class _Types:
    """Which expressions of one function are float (or integer), as far as we can tell."""

    def __init__(self, source: ParsedSource, function: Function) -> None:
        self.source = source
        self.types = source.local_types(function)

    def kind(self, node: Node) -> str | None:
        """``"float"``, ``"int"``, or None when unknown (or double, or anything else)."""
        source, kind = self.source, node.type
        if kind == "number_literal":
            text = source.text_of(node)
            if _FLOAT_LITERAL.match(text):
                return "float"
            return "int" if _INT_LITERAL.match(text) else None
        if kind == "identifier":
            declared = _strip_type(self.types.get(source.text_of(node), ""))
            if declared == "float":
                return "float"
            return "int" if declared in _INT_TYPES else None
        if kind == "parenthesized_expression" and node.named_children:
            return self.kind(node.named_children[0])
        if kind == "unary_expression":
            argument = node.child_by_field_name("argument")
            return self.kind(argument) if argument is not None else None
        if kind == "cast_expression":
            type_node = node.child_by_field_name("type")
            text = source.text_of(type_node) if type_node is not None else ""
            return "float" if text == "float" else ("int" if text in _INT_TYPES else None)
        if kind == "call_expression":
            function = node.child_by_field_name("function")
            name = source.text_of(function) if function is not None else ""
            return "float" if name in _FLOAT_FUNCTIONS else None
        if kind == "subscript_expression":
            base = node.child_by_field_name("argument")
            if base is None or base.type != "identifier":
                return None
            declared = _strip_type(self.types.get(source.text_of(base), ""))
            return "float" if declared in ("float*", "float[]", "float[][]") else None
        if kind == "field_expression":
            base = node.child_by_field_name("argument")
            if base is None:
                return None
            if base.type == "identifier":
                declared = _strip_type(self.types.get(source.text_of(base), ""))
                if declared.rstrip("[]") in _FLOAT_VECTORS:
                    return "float"
                return self._field_kind(declared, node)
            if base.type == "subscript_expression":
                inner = base.child_by_field_name("argument")
                if inner is not None and inner.type == "identifier":
                    declared = _strip_type(self.types.get(source.text_of(inner), ""))
                    element = declared.rstrip("*[]")
                    return "float" if element in _FLOAT_VECTORS else None
            return None
        if kind == "binary_expression":
            op = node.child_by_field_name("operator")
            if op is None or op.type not in ("+", "-", "*", "/"):
                return None
            left, right = (node.child_by_field_name(f) for f in ("left", "right"))
            kinds = {self.kind(left) if left else None, self.kind(right) if right else None}
            if None in kinds:
                return None
            return "float" if "float" in kinds else "int"
        return None

    def _field_kind(self, declared: str, node: Node) -> str | None:
        """The kind of ``s.f`` for a local ``s`` of a struct of the file (``MD m; m.d``)."""
        field = node.child_by_field_name("field")
        name = declared.removeprefix("struct ").strip()
        fields = struct_fields(self.source).get(name, {})
        type_text = fields.get(self.source.text_of(field), "") if field is not None else ""
        if type_text == "float":
            return "float"
        return "int" if type_text in _INT_TYPES else None

    def float_division(self, node: Node) -> bool:
        """A ``/`` computed in float: one float operand, the other float or integer."""
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            return False
        kinds = {self.kind(left), self.kind(right)}
        return "float" in kinds and kinds <= {"float", "int"}


def _is_rsqrt_pattern(source: ParsedSource, node: Node) -> Node | None:
    """For ``1.0f / sqrtf(x)``, the ``x`` node."""
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None or right.type != "call_expression":
        return None
    if left.type != "number_literal" or not _ONE.match(source.text_of(left)):
        return None
    function = right.child_by_field_name("function")
    arguments = right.child_by_field_name("arguments")
    if function is None or arguments is None or source.text_of(function) != "sqrtf":
        return None
    args = [a for a in arguments.named_children if a.type != "comment"]
    return args[0] if len(args) == 1 else None


def _unparenthesized(source: ParsedSource, node: Node) -> str:
    """An operand's text for use as a call argument: one level of parentheses dropped."""
    if node.type == "parenthesized_expression" and node.named_children:
        inner = node.named_children[0]
        if inner.type != "comma_expression":
            return source.text_of(inner)
    return source.text_of(node)


@register
class FastMath(Mechanism):
    name = "fast_math"
    category = "compute"
    family = "fast math intrinsics"
    intent = (
        "Compute exponentials, logarithms, trigonometry, divisions and reciprocal square "
        "roots with the hardware's approximate instructions, trading a few ulp for speed."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for call in source.calls_named(*INTRINSICS):
            refusal = None
            if len(call.args) != _ARITY[call.name]:
                refusal = f"{call.name} with {len(call.args)} arguments is not the intrinsic"
            yield self.site(source, call.node, detail={"intrinsic": call.name}, refusal=refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.functions:
            if not function.device_only or function.body is None:
                continue
            for call in source.calls:
                if call.name not in ACCURATE or not _within(call.node, function.body):
                    continue
                if len(call.args) == _ARITY[ACCURATE[call.name]]:
                    yield self.site(source, call.node, detail={"intrinsic": ACCURATE[call.name]})
            types: _Types | None = None
            for node in source.iter_nodes("binary_expression", within=function.body):
                op = node.child_by_field_name("operator")
                if op is None or op.type != "/":
                    continue
                if _is_rsqrt_pattern(source, node) is not None:
                    yield self.site(source, node, detail={"intrinsic": RSQRT})
                    continue
                types = types or _Types(source, function)
                if types.float_division(node):
                    yield self.site(source, node, detail={"intrinsic": DIVIDE})

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        call = self.node_at(source, site, "call_expression")
        function = call.child_by_field_name("function")
        arguments = call.child_by_field_name("arguments")
        assert function is not None and arguments is not None
        args = [a for a in arguments.named_children if a.type != "comment"]
        name = source.text_of(function)
        if name in RENAMED:
            return [Edit.replace(function, RENAMED[name])]
        if name == DIVIDE:
            a, b = args
            text = (
                f"{operand(source, a, MULTIPLICATIVE)} / {operand(source, b, MULTIPLICATIVE + 1)}"
            )
        else:  # rsqrtf(x)
            text = f"1.0f / sqrtf({source.text_of(args[0])})"
        return [Edit.replace(call, wrap_at(call, text, MULTIPLICATIVE))]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        intrinsic = str(site.detail.get("intrinsic", ""))
        if intrinsic in RENAMED:
            call = self.node_at(source, site, "call_expression")
            function = call.child_by_field_name("function")
            assert function is not None
            return [Edit.replace(function, intrinsic)]
        division = self.node_at(source, site, "binary_expression")
        if intrinsic == RSQRT:
            argument = _is_rsqrt_pattern(source, division)
            assert argument is not None
            text = f"rsqrtf({source.text_of(argument)})"
        else:
            left = division.child_by_field_name("left")
            right = division.child_by_field_name("right")
            assert left is not None and right is not None
            text = (
                f"__fdividef({_unparenthesized(source, left)}, {_unparenthesized(source, right)})"
            )
        return [Edit.replace(replacement_target(division, PRIMARY), text)]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        intrinsic = str(site.detail.get("intrinsic", ""))
        found: list[Condition] = []
        rtol = _RTOL.get(intrinsic)
        if rtol is not None:
            found.append(
                ToleranceAtLeast(rtol=rtol, why=f"{intrinsic} is accurate to a few ulp only")
            )
        if intrinsic in _PROSE:
            found.append(Prose(text=_PROSE[intrinsic]))
        return found


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte
