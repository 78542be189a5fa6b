"""Packed half-precision math: ``__hadd2``/``__hsub2``/``__hmul2``/``__hfma2`` on
``__nv_bfloat162`` and ``__half2`` pairs, and the paired conversions to and from ``float2``.

One packed instruction (``add.bf16x2``, ``fma.rn.f16x2``) does the work of two scalar ones on
the two 16-bit halves of a 32-bit register, and the paired conversions
(``__bfloat1622float2``, ``__floats2bfloat162_rn``) move both halves at once.

- remove: the same operation on each half, with the scalar intrinsic::

      __hadd2(a, b)              -> __halves2bfloat162(__hadd(a.x, b.x), __hadd(a.y, b.y))
      __bfloat1622float2(v)      -> make_float2(__low2float(v), __high2float(v))
      __floats2bfloat162_rn(p, q) -> __halves2bfloat162(__float2bfloat16_rn(p),
                                                       __float2bfloat16_rn(q))

  Each half is rounded once, as the packed instruction rounds it, so the result is bit for
  bit the same (``__half2`` uses ``__halves2half2`` and the ``half`` conversions). The
  operands are evaluated twice afterwards, so they must be free of side effects, and their
  type must be known (a ``__nv_bfloat162`` or a ``__half2``: parameters, locals, struct and
  union fields such as ``Pack16::pair``); otherwise the site is reported with the reason.
  An operation whose operands hold another packed operation waits until that one is
  removed (the inner one would be duplicated).
- apply: the reverse on those canonical pairs, and on two adjacent statements that compute
  the halves of one pair with the same scalar operation::

      r.x = __hmul(a.x, b.x);
      r.y = __hmul(a.y, b.y);    ->  r = __hmul2(a, b);

  And on the naive row loop that converts one element a turn (``_packed_loops.py``): the
  reads ``__half2float(p[c])`` of elements ``c`` and ``c + 1`` become one ``__half2`` read
  converted by ``__half22float2`` (``__bfloat1622float2``), the body run for each half, while
  the pair is 4-byte aligned (checked at run time) and complete; the original loop finishes
  the row::

      for (int64_t c = 0; c < n; ++c) acc += __half2float(p[c]);
      ->
      int64_t c_pair = 0;
      if (reinterpret_cast<size_t>(p + c_pair) % 4 == 0) {
        for (; c_pair + 1 < n; c_pair += 2) {
          const float2 p_pair = __half22float2(*reinterpret_cast<const __half2*>(p + c_pair));
          acc += p_pair.x;
          acc += p_pair.y;
        }
      }
      for (int64_t c = c_pair; c < n; ++c) acc += __half2float(p[c]);

  Every float operation is the one it was, in the same order. Refused (with the reason) where
  a read is conditional, the body stores where a paired read comes from, leaves a turn early
  or calls something with unknown effects. One element per thread (no loop) is not paired:
  that needs two elements per thread, a coarsening first.

Conditions: packed bf16 arithmetic needs sm_80, packed half arithmetic sm_53.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from klineage.conditions import ArchAtLeast, Condition
from klineage.cuda.cexpr import PRIMARY, operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    expr_type,
    is_side_effect_free,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._packed_loops import paired_loop_text, paired_loops
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

Precision = Literal["bf16", "half"]

ARITHMETIC: dict[str, tuple[str, int]] = {
    "__hadd2": ("__hadd", 2),
    "__hsub2": ("__hsub", 2),
    "__hmul2": ("__hmul", 2),
    "__hfma2": ("__hfma", 3),
}
"""Packed operation -> (the scalar operation on one half, operand count)."""
_PACKED_OF = {scalar: packed for packed, (scalar, _) in ARITHMETIC.items()}

PAIRS: dict[str, Precision] = {
    "__nv_bfloat162": "bf16",
    "nv_bfloat162": "bf16",
    "__half2": "half",
    "half2": "half",
}
MAKE_PAIR: dict[Precision, str] = {"bf16": "__halves2bfloat162", "half": "__halves2half2"}
TO_PAIR: dict[Precision, str] = {"bf16": "__floats2bfloat162_rn", "half": "__floats2half2_rn"}
FLOAT2_TO_PAIR: dict[Precision, str] = {
    "bf16": "__float22bfloat162_rn",
    "half": "__float22half2_rn",
}
FROM_PAIR: dict[Precision, str] = {"bf16": "__bfloat1622float2", "half": "__half22float2"}
TO_HALF: dict[Precision, str] = {"bf16": "__float2bfloat16_rn", "half": "__float2half_rn"}
ARCH: dict[Precision, int] = {"bf16": 80, "half": 53}

Kind = Literal["arithmetic", "from_pair", "to_pair", "float2_to_pair"]
_CONVERSIONS: dict[str, tuple[Kind, Precision]] = {
    **{name: ("from_pair", p) for p, name in FROM_PAIR.items()},
    **{name: ("to_pair", p) for p, name in TO_PAIR.items()},
    **{name: ("float2_to_pair", p) for p, name in FLOAT2_TO_PAIR.items()},
}
_ARITY = {"from_pair": 1, "to_pair": 2, "float2_to_pair": 1}


def _args(call: Node) -> list[Node]:
    arguments = call.child_by_field_name("arguments")
    return statements(arguments) if arguments is not None else []


def _name(source: ParsedSource, call: Node) -> str:
    callee = call.child_by_field_name("function")
    return source.text_of(callee) if callee is not None else ""


def _precision(source: ParsedSource, function: Function, nodes: list[Node]) -> Precision | None:
    """bf16 or half, from the first of ``nodes`` whose type is a known pair type."""
    for node in nodes:
        precision = PAIRS.get(expr_type(source, function, node) or "")
        if precision is not None:
            return precision
    return None


def _context_precision(source: ParsedSource, function: Function, call: Node) -> Precision | None:
    """The pair type the result of ``call`` is assigned to or declared as."""
    parent = call.parent
    if parent is None:
        return None
    if parent.type == "assignment_expression":
        left = parent.child_by_field_name("left")
        return _precision(source, function, [left]) if left is not None else None
    if parent.type == "init_declarator" and parent.parent is not None:
        declared = parent.parent.child_by_field_name("type")
        return PAIRS.get(source.text_of(declared)) if declared is not None else None
    return None


@dataclass(frozen=True)
class _Packed:
    """A packed operation or conversion found in device code."""

    call: Node
    name: str
    kind: Kind
    precision: Precision | None
    refusal: str | None


def _packed_ops(source: ParsedSource) -> Iterator[_Packed]:
    names = set(ARITHMETIC) | set(_CONVERSIONS)
    for call in source.calls:
        if call.name not in names:
            continue
        function = source.enclosing_function(call.node)
        if function is None or not function.runs_on_device:
            continue
        yield _describe(source, function, call.node, call.name)


def _describe(source: ParsedSource, function: Function, call: Node, name: str) -> _Packed:
    args = _args(call)
    if name in ARITHMETIC:
        kind: Kind = "arithmetic"
        arity = ARITHMETIC[name][1]
        precision = _precision(source, function, args) or _context_precision(source, function, call)
    else:
        kind, precision = _CONVERSIONS[name]
        arity = _ARITY[kind]
    refusal = None
    if len(args) != arity:
        refusal = f"{name} with {len(args)} arguments is not the intrinsic"
    elif kind == "arithmetic" and precision is None:
        refusal = (
            "the operands' type is unknown here, so it is unclear whether the halves are "
            "bf16 or half"
        )
    elif kind != "to_pair" and not all(is_side_effect_free(source, a) for a in args):
        refusal = "an operand has side effects and would be evaluated once per half"
    elif kind != "to_pair" and _holds_packed(source, args):
        refusal = "an operand holds another packed operation; remove that one first"
    return _Packed(call, name, kind, precision, refusal)


def _holds_packed(source: ParsedSource, args: list[Node]) -> bool:
    wanted = set(ARITHMETIC) | set(_CONVERSIONS)
    return any(
        n.type == "call_expression" and _name(source, n) in wanted
        for arg in args
        for n in walk(arg)
    )


def _member(source: ParsedSource, node: Node, field: str) -> str:
    return f"{operand(source, node, PRIMARY)}.{field}"


def removal_text(source: ParsedSource, packed: _Packed) -> str:
    """The scalar form of one packed operation or conversion."""
    args = _args(packed.call)
    texts = [source.text_of(a) for a in args]
    if packed.kind == "arithmetic":
        assert packed.precision is not None
        scalar = ARITHMETIC[packed.name][0]
        halves = [
            f"{scalar}({', '.join(_member(source, a, field) for a in args)})"
            for field in ("x", "y")
        ]
        return f"{MAKE_PAIR[packed.precision]}({', '.join(halves)})"
    assert packed.precision is not None
    if packed.kind == "from_pair":
        return f"make_float2(__low2float({texts[0]}), __high2float({texts[0]}))"
    to_half = TO_HALF[packed.precision]
    if packed.kind == "to_pair":
        parts = [f"{to_half}({t})" for t in texts]
    else:
        parts = [f"{to_half}({_member(source, args[0], f)})" for f in ("x", "y")]
    return f"{MAKE_PAIR[packed.precision]}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------------
# Candidates: the canonical scalar pairs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pairable:
    """Scalar work on the two halves of a pair that one packed operation can do."""

    node: Node
    """The expression to replace, or the first of two statements."""
    end: Node
    """The last node replaced (the second statement, or ``node`` itself)."""
    text: str
    """The packed form."""
    precision: Precision
    kind: Literal["arithmetic", "conversion"]


def _member_base(source: ParsedSource, node: Node, field: str) -> Node | None:
    """``a`` of ``a.field``."""
    node = strip_parens(node)
    if node.type != "field_expression":
        return None
    name = node.child_by_field_name("field")
    base = node.child_by_field_name("argument")
    if name is None or base is None or source.text_of(name) != field:
        return None
    if source.text_of(node)[len(source.text_of(base)) :].lstrip().startswith("->"):
        return None
    return base


def _same(source: ParsedSource, nodes: list[Node]) -> bool:
    return len({" ".join(source.text_of(n).split()) for n in nodes}) == 1


def _scalar_halves(
    source: ParsedSource, function: Function, low: Node, high: Node
) -> tuple[str, list[Node], Precision] | None:
    """(packed op, operands, precision) when ``low``/``high`` are ``op(a.x, b.x)`` and
    ``op(a.y, b.y)`` on pairs of one known type."""
    low, high = strip_parens(low), strip_parens(high)
    if low.type != "call_expression" or high.type != "call_expression":
        return None
    scalar = _name(source, low)
    if scalar not in _PACKED_OF or _name(source, high) != scalar:
        return None
    low_args, high_args = _args(low), _args(high)
    packed = _PACKED_OF[scalar]
    if len(low_args) != ARITHMETIC[packed][1] or len(high_args) != len(low_args):
        return None
    operands = []
    for a, b in zip(low_args, high_args, strict=True):
        base_low, base_high = _member_base(source, a, "x"), _member_base(source, b, "y")
        if base_low is None or base_high is None or not _same(source, [base_low, base_high]):
            return None
        if not is_side_effect_free(source, base_low):
            return None
        operands.append(base_low)
    precisions = {PAIRS.get(expr_type(source, function, n) or "") for n in operands}
    if len(precisions) != 1 or None in precisions:
        return None
    precision = precisions.pop()
    assert precision is not None
    return packed, operands, precision


def _pairable_call(source: ParsedSource, function: Function, call: Node) -> _Pairable | None:
    name = _name(source, call)
    args = _args(call)
    if name == "make_float2" and len(args) == 2:
        lows, highs = strip_parens(args[0]), strip_parens(args[1])
        if _name(source, lows) != "__low2float" or _name(source, highs) != "__high2float":
            return None
        values = _args(lows) + _args(highs)
        if len(values) != 2 or not _same(source, values):
            return None
        precision = PAIRS.get(expr_type(source, function, values[0]) or "")
        if precision is None or not is_side_effect_free(source, values[0]):
            return None
        text = f"{FROM_PAIR[precision]}({source.text_of(values[0])})"
        return _Pairable(call, call, text, precision, "conversion")
    precision_of = {v: k for k, v in MAKE_PAIR.items()}
    if name not in precision_of or len(args) != 2:
        return None
    precision = precision_of[name]
    to_half = [strip_parens(a) for a in args]
    if all(_name(source, a) == TO_HALF[precision] and len(_args(a)) == 1 for a in to_half):
        values = [source.text_of(_args(a)[0]) for a in to_half]
        return _Pairable(
            call, call, f"{TO_PAIR[precision]}({', '.join(values)})", precision, "conversion"
        )
    found = _scalar_halves(source, function, args[0], args[1])
    if found is None or found[2] != precision:
        return None
    packed, operands, _ = found
    text = f"{packed}({', '.join(source.text_of(o) for o in operands)})"
    return _Pairable(call, call, text, precision, "arithmetic")


def _assignment(source: ParsedSource, statement: Node, field: str) -> tuple[Node, Node] | None:
    """(r, value) of the statement ``r.field = value;``."""
    found = plain_assignment(statement)
    if found is None:
        return None
    left, right = found
    base = _member_base(source, left, field)
    return None if base is None else (base, right)


def _pairable_statements(
    source: ParsedSource, function: Function, first: Node, second: Node
) -> _Pairable | None:
    low, high = _assignment(source, first, "x"), _assignment(source, second, "y")
    if low is None or high is None or not _same(source, [low[0], high[0]]):
        return None
    found = _scalar_halves(source, function, low[1], high[1])
    if found is None or not is_side_effect_free(source, low[0]):
        return None
    packed, operands, precision = found
    if PAIRS.get(expr_type(source, function, low[0]) or "") != precision:
        return None
    text = f"{source.text_of(low[0])} = {packed}({', '.join(source.text_of(o) for o in operands)});"
    return _Pairable(first, second, text, precision, "arithmetic")


def _pairables(source: ParsedSource) -> Iterator[_Pairable]:
    for function in source.functions:
        if not function.runs_on_device or function.body is None:
            continue
        for node in source.iter_nodes("call_expression", within=function.body):
            found = _pairable_call(source, function, node)
            if found is not None:
                yield found
        for block in source.iter_nodes("compound_statement", within=function.body):
            body = statements(block)
            for first, second in itertools.pairwise(body):
                found = _pairable_statements(source, function, first, second)
                if found is not None:
                    yield found


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


@register
class PackedHalf2Math(Mechanism):
    name = "packed_half2_math"
    category = "compute"
    family = "vectorized loads and stores"
    intent = (
        "Do bf16/half arithmetic and float conversions two values at a time with the packed "
        "bf16x2/f16x2 instructions, halving the instruction count for the same results."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for packed in _packed_ops(source):
            detail: dict[str, str | int] = {"intrinsic": packed.name, "kind": packed.kind}
            if packed.precision is not None:
                detail["precision"] = packed.precision
            yield self.site(source, packed.call, detail=detail, refusal=packed.refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for pairable in _pairables(source):
            yield self.site(
                source,
                pairable.node,
                span=(pairable.node.start_byte, pairable.end.end_byte),
                detail={"precision": pairable.precision, "kind": pairable.kind},
            )
        for node, loop in paired_loops(source):
            if isinstance(loop, NotInForm):
                yield self.site(source, node, detail={"kind": "loop"}, refusal=str(loop))
                continue
            precisions = sorted(set(loop.precision.values()))
            detail: dict[str, str | int] = {
                "kind": "loop",
                "precision": "/".join(precisions),
                "pointers": ",".join(loop.reads),
            }
            yield self.site(source, node, detail=detail)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        call = self.node_at(source, site, "call_expression")
        function = source.enclosing_function(call)
        assert function is not None
        packed = _describe(source, function, call, _name(source, call))
        return [Edit.replace(call, removal_text(source, packed))]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("kind") == "loop":
            for node, loop in paired_loops(source):
                if node.start_byte == site.start_byte and not isinstance(loop, NotInForm):
                    return [Edit.replace(node, paired_loop_text(source, loop))]
            raise self.refuse(f"no pairable loop at line {site.start_line}", site, "apply")
        pairable = next(
            p
            for p in _pairables(source)
            if (p.node.start_byte, p.end.end_byte) == (site.start_byte, site.end_byte)
        )
        return [Edit(pairable.node.start_byte, pairable.end.end_byte, pairable.text)]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        precision = site.detail.get("precision")
        if site.detail.get("kind") != "arithmetic" or precision not in ("bf16", "half"):
            return []
        sm = ARCH["bf16" if precision == "bf16" else "half"]
        what = "bfloat162" if precision == "bf16" else "half2"
        return [ArchAtLeast(sm=sm, why=f"packed {what} arithmetic needs sm_{sm}")]
