"""Warp shuffles <-> warp exchanges through shared memory (both directions, any shuffle kind).

A shuffle loop such as::

    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);

is, step by step, an exchange: every lane publishes ``v``, then reads its partner's. The same
step through shared memory is::

    for (int offset = 16; offset > 0; offset >>= 1) {
      xchg[xchg_warp][xchg_lane] = v;
      __syncwarp();
      v += xchg[xchg_warp][xchg_lane ^ offset];
      __syncwarp();
    }

with one 32-slot row per warp of a ``__shared__`` array declared once at the top of the
function (a static ``__shared__`` array in a ``__device__`` function is legal CUDA: one per
block), sized for 32 warps, the most a block has. Lane and warp come from the linear thread
index, as the hardware forms warps. The partner's index is exactly the shuffle's source lane:
``lane ^ off`` (xor), ``lane + off`` when below 32 else the lane's own value (down), ``lane -
off`` when not negative else its own (up). The first ``__syncwarp`` makes the writes visible;
the second keeps a fast lane from overwriting its slot before a slow partner has read it, so
every lane gets bit for bit what the shuffle gave it.

A width argument ``w`` (a constant power of two up to 32) cuts the warp in segments of ``w``
lanes, and a shuffle reads only inside the lane's segment (the PTX ISA's ``shfl.sync``, whose
segment mask CUDA sets to ``32 - w``): ``down`` reads ``lane + off`` when ``lane % w + off <
w``, else its own value; ``up`` reads ``lane - off`` when ``lane % w >= off``, else its own;
``xor`` reads ``lane ^ off``, which stays in the segment when ``off < w`` (written ``lane ^
(off % w)``, so the width comes back with the shuffle). Those are the indices written; an xor
by an offset of at least ``w`` reads a lower segment for some lanes and its own value for
others, and is refused.

A step may shuffle in several statements, as long as they lead the loop body (``__syncwarp()``
calls before them stay where they are)::

    for (int offset = 16; offset > 0; offset >>= 1) {
      __syncwarp();
      m_off = __shfl_down_sync(kFullMask, m, offset);
      s_off = __shfl_down_sync(kFullMask, s, offset);
      ...
    }

Every lane then publishes every shuffled value (one row per value), one ``__syncwarp``, each
statement reads its partner's slots, and one ``__syncwarp`` closes the step. That is exact
when each shuffle would have read the value published at the top of the step: no leading
statement may assign a value that a shuffle of a later statement reads (checked; a statement
assigning what its own shuffles read is fine, they read first).

The rewrite is exact, hence safe, only for a canonical step, checked here before anything is
rewritten: a full mask (a constant, or a helper's parameter every caller passes one:
:mod:`klineage.mechanisms._shuffle_masks`), no width or a constant power-of-two one, an offset
known to stay in 0..31 (the loop variable of a loop whose trip can be simulated, ``warpSize``
read as 32, template parameters as each instantiation in the file binds them, or a constant),
values that are plain variables or fields (``v``, ``a.m``) whose type is known, and every
shuffle in the leading statements of the step, each of which assigns at most at its top level.
A shuffle by an offset that does not follow the enclosing loop's variable (``for (k ...) { v +=
__shfl_down_sync(m, v, 1, 4); v += ...(m, v, 2, 4); }``) is a step of its own, its statement.
Anything else is reported with a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from klineage.conditions import ArchAtLeast, BlockSizeMultiple, Condition
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_of, never_instantiated, template_values
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import WARP_SIZE
from klineage.kernel import KernelSource
from klineage.mechanisms._reductions_util import (
    arguments_of,
    cached,
    call_name,
    fold,
    graph,
    inside,
    line_deletion,
    local_splice,
    named_statements,
    plain_type,
    strip_parens,
    struct_fields,
    within,
)
from klineage.mechanisms._shuffle_masks import mask_refusal
from klineage.mechanisms.base import Carrier, Mechanism, Site
from klineage.problem import Problem

__all__ = [
    "EXCHANGE_KINDS",
    "SHUFFLE_KINDS",
    "ExchangeMechanism",
    "ExchangeStep",
    "ShuffleStep",
    "exchange_steps",
    "exchange_to_shuffle",
    "partner_index",
    "shuffle_steps",
    "shuffle_to_exchange",
]

SHUFFLE_KINDS: dict[str, str] = {
    "__shfl_xor_sync": "xor",
    "__shfl_down_sync": "down",
    "__shfl_up_sync": "up",
}
EXCHANGE_KINDS = frozenset(SHUFFLE_KINDS.values())
DEFAULT_MASK = "0xffffffffu"
TID, LANE, WARP, BUFFER = "xchg_tid", "xchg_lane", "xchg_warp", "xchg"
HEADER_COMMENT = (
    "// Warp exchange through shared memory: one 32-value row per warp (32 warps at most)."
)
HEADER_LINES = (
    HEADER_COMMENT,
    f"const int {TID} = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * "
    "threadIdx.z));",
    f"const int {LANE} = {TID} & 31;",
    f"const int {WARP} = {TID} >> 5;",
)
_BUFFER_NAME = re.compile(rf"^{BUFFER}\d*$")
_MAX_TRIP = 64


class _Refused(Exception):
    """The step is not canonical; the message says why."""


# ---------------------------------------------------------------------------------------------
# Shuffle steps (the optimized form)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shuffle:
    """One ``__shfl_*_sync(mask, value, offset)`` call of a step."""

    call: Node
    kind: str
    mask: str
    value: str
    offset: str
    width: str | None = None
    """The width argument's text (a power of two up to 32), None when there is none."""


@dataclass(frozen=True)
class ShuffleStep:
    """Shuffles grouped by the loop (or the statement) that performs one exchange per trip."""

    function: Function
    node: Node
    """The loop, or the statement for a shuffle outside any loop."""
    kinds: frozenset[str]
    refusal: str | None = None
    statements: tuple[Node, ...] = ()
    """The statements holding every shuffle: the leading ones of the loop body (after any
    ``__syncwarp()``), or the one statement outside a loop."""
    shuffles: tuple[Shuffle, ...] = ()
    types: dict[str, str] = field(default_factory=dict)
    """Value text -> its plain C type."""


def _nearest_loop(call: Node, body: Node) -> Node | None:
    current = call.parent
    while current is not None and current != body:
        if current.type in ("for_statement", "while_statement", "do_statement"):
            return current
        if current.type == "lambda_expression":
            return None
        current = current.parent
    return None


def _in_lambda(node: Node, body: Node) -> bool:
    current = node.parent
    while current is not None and current != body:
        if current.type == "lambda_expression":
            return True
        current = current.parent
    return False


def shuffle_steps(source: ParsedSource) -> tuple[ShuffleStep, ...]:
    """Every group of ``__shfl_{xor,down,up}_sync`` calls, analysed (refusal set when the
    group is not a canonical exchange step); computed once per source."""
    return cached(source, "shuffle_steps", lambda: tuple(_shuffle_steps(source)))


def _shuffle_steps(source: ParsedSource) -> Iterator[ShuffleStep]:
    for function in source.functions:
        if function.body is None or not function.runs_on_device:
            continue
        groups: dict[tuple[int, int], tuple[Node, list[Node]]] = {}
        for node in inside(source, function.body, "call_expression"):
            if call_name(source, node) not in SHUFFLE_KINDS:
                continue
            if source.enclosing_function(node) != function:
                continue
            owner = _step_owner(source, node, function.body)
            key = (owner.start_byte, owner.end_byte)
            groups.setdefault(key, (owner, []))[1].append(node)
        for owner, calls in groups.values():
            yield _analyse(source, function, owner, calls)


def _step_owner(source: ParsedSource, call: Node, body: Node) -> Node:
    """The loop whose trips are the steps, or the statement that is one step: a shuffle by a
    fixed offset inside a loop over something else (``for (k ...) { v += __shfl_down_sync(m,
    v, 1, 4); v += ...(m, v, 2, 4); }``) is an unrolled step of its own."""
    loop = _nearest_loop(call, body)
    if loop is not None and _offset_follows_loop(source, call, loop):
        return loop
    return _statement_of(call) or call


def _offset_follows_loop(source: ParsedSource, call: Node, loop: Node) -> bool:
    """Whether the shuffle's offset depends on the loop's variable (or the loop's variable is
    unknown, so it might)."""
    args = arguments_of(call)
    if len(args) < 3:
        return True
    variable = _loop_variable(source, loop)
    if variable is None:
        return fold(source, args[2]) is None
    return any(source.text_of(n) == variable for n in inside(source, args[2], "identifier"))


def _statement_of(node: Node) -> Node | None:
    current: Node | None = node
    while current is not None and current.parent is not None:
        if current.type.endswith("statement") or current.type == "declaration":
            return current
        current = current.parent
    return None


def _analyse(
    source: ParsedSource, function: Function, owner: Node, calls: list[Node]
) -> ShuffleStep:
    kinds = frozenset(SHUFFLE_KINDS[call_name(source, c) or ""] for c in calls)
    try:
        statements, shuffles, types = _canonical(source, function, owner, calls)
    except _Refused as why:
        return ShuffleStep(function, owner, kinds, refusal=str(why))
    return ShuffleStep(function, owner, kinds, None, statements, shuffles, types)


def _canonical(
    source: ParsedSource, function: Function, owner: Node, calls: list[Node]
) -> tuple[tuple[Node, ...], tuple[Shuffle, ...], dict[str, str]]:
    if not function.device_only:
        raise _Refused(
            f"{function.name} also compiles for the host, where a __shared__ array is not allowed"
        )
    assert function.body is not None
    if any(_in_lambda(c, function.body) for c in calls):
        raise _Refused("the shuffles are inside a lambda")
    if _header(source, function) is None:
        taken = sorted(
            n
            for n in _names_used(source, function)
            if n in (TID, LANE, WARP) or _BUFFER_NAME.match(n)
        )
        if taken:
            raise _Refused(f"{function.name} already uses the name {taken[0]}")
    loop = owner if owner.type in ("for_statement", "while_statement", "do_statement") else None
    if loop is not None:
        statements = _leading_statements(source, loop, calls)
        offsets = _loop_offsets(source, loop)
    else:
        statements = (owner,)
        offsets = None
        if owner.parent is None or owner.parent.type not in _STATEMENT_HOLDERS:
            raise _Refused("the shuffle statement is not directly inside a block or an if")
    if not statements or not all(any(within(c, s) for s in statements) for c in calls):
        raise _Refused("the shuffles are not all in the leading statements of the loop body")
    for statement in statements:
        _check_assignments(source, statement)
    if any(c != o and within(c, o) for c in calls for o in calls):
        raise _Refused("a shuffle is nested inside another shuffle's arguments")
    shuffles = tuple(_shuffle(source, function, c, loop, offsets) for c in calls)
    _check_published_values_stay(source, statements, shuffles)
    types = {s.value: _value_type(source, function, s.value) for s in shuffles}
    return statements, shuffles, types


_STATEMENT_HOLDERS = ("compound_statement", "if_statement", "else_clause")
"""Where a shuffle statement outside a loop may sit: a block, or the branch of an ``if``
without braces (``if (kSize >= 32) v += __shfl_down_sync(...);``), which gets them."""


def _leading_statements(source: ParsedSource, loop: Node, calls: list[Node]) -> tuple[Node, ...]:
    """The statements of the loop body that hold shuffles, one after another from its start
    (``__syncwarp()`` calls and declarations without a value before them skipped, such as the
    ``T other;`` whose fields the shuffles fill: the exchange keeps them where they are)."""
    body = loop.child_by_field_name("body")
    if body is None:
        return ()
    if body.type != "compound_statement":
        return (body,)
    statements = named_statements(body)
    while statements and (
        _is_syncwarp(source, statements[0]) or _declares_without_value(statements[0])
    ):
        statements = statements[1:]
    leading: list[Node] = []
    for statement in statements:
        if not any(within(c, statement) for c in calls):
            break
        leading.append(statement)
    return tuple(leading)


def _declares_without_value(statement: Node) -> bool:
    """``T a;`` or ``T a, b;``: names declared, nothing evaluated."""
    return statement.type == "declaration" and all(
        d.type == "identifier" for d in statement.children_by_field_name("declarator")
    )


def _check_assignments(source: ParsedSource, statement: Node) -> None:
    """Values published before the statement equal what its shuffles read only when the
    statement writes nothing before they run: allow one top-level assignment (or a
    declaration's initializer)."""
    if statement.type not in ("expression_statement", "declaration"):
        raise _Refused(f"the shuffle sits in a {statement.type.replace('_', ' ')}")
    top = statement.named_children[0] if statement.type == "expression_statement" else None
    for node in inside(source, statement, "assignment_expression", "update_expression"):
        if node != top:
            raise _Refused("the shuffle statement writes a variable inside an expression")


def _check_published_values_stay(
    source: ParsedSource, statements: tuple[Node, ...], shuffles: tuple[Shuffle, ...]
) -> None:
    """Every lane publishes every shuffled value before the first statement runs, so no
    statement may assign a value that a shuffle of a later statement reads."""
    for index, statement in enumerate(statements):
        later = [
            s.value
            for s in shuffles
            if any(within(s.call, after) for after in statements[index + 1 :])
        ]
        for target in _assigned(source, statement):
            clash = next((v for v in later if _overlaps(target, v)), None)
            if clash is not None:
                raise _Refused(
                    f"the statement at line {statement.start_point[0] + 1} assigns {target}, "
                    f"which a later shuffle of the step publishes ({clash})"
                )


def _assigned(source: ParsedSource, statement: Node) -> list[str]:
    """What a statement of the step writes: its top-level assignment's target (its access
    path, or its base variable when it is indexed) or the names it declares."""
    if statement.type == "declaration":
        names = []
        for declarator in statement.children_by_field_name("declarator"):
            name = declarator.child_by_field_name("declarator") or declarator
            names.append(source.text_of(name))
        return names
    top = statement.named_children[0] if statement.named_children else None
    if top is None or top.type != "assignment_expression":
        return []
    left = top.child_by_field_name("left")
    if left is None:
        return []
    left = strip_parens(left)
    if _plain_value(left):
        return [source.text_of(left).replace(" ", "")]
    base = next(iter(inside(source, left, "identifier")), None)
    return [source.text_of(base)] if base is not None else [source.text_of(left)]


def _overlaps(target: str, value: str) -> bool:
    """Whether writing ``target`` changes ``value``: one access path starts the other
    (``a`` and ``a.m``), component by component."""
    written, read = target.split("."), value.replace(" ", "").split(".")
    shorter = min(len(written), len(read))
    return written[:shorter] == read[:shorter]


def _shuffle(
    source: ParsedSource,
    function: Function,
    call: Node,
    loop: Node | None,
    offsets: list[int] | None,
) -> Shuffle:
    name = call_name(source, call) or ""
    args = arguments_of(call)
    if len(args) not in (3, 4):
        raise _Refused(f"{name} with {len(args)} arguments")
    width = _width(source, name, args[3]) if len(args) == 4 else None
    # a full-warp constant, or a helper's parameter every caller passes one
    refusal = mask_refusal(source, function, args[0])
    if refusal is not None:
        raise _Refused(refusal)
    value = strip_parens(args[1])
    if not _plain_value(value):
        raise _Refused(f"the shuffled value {source.text_of(value)} is not a variable or a field")
    offset = strip_parens(args[2])
    if loop is not None:
        variable = _loop_variable(source, loop)
        if offset.type != "identifier" or source.text_of(offset) != variable:
            raise _Refused(f"the offset {source.text_of(offset)} is not the loop variable")
        if offsets is None:
            unused = never_instantiated(source, function)
            raise _Refused(
                "the loop's offsets cannot be worked out statically"
                + (f": nothing in the file instantiates {function.name}" if unused else "")
            )
        bad = [o for o in offsets if not 0 <= o < 32]
        if bad:
            raise _Refused(f"the loop reaches offset {bad[0]}, outside 0..31")
        known = offsets
    else:
        constant = fold(source, offset)
        if (
            constant is None
            or not 0 <= constant < 32
            or offset.type
            not in (
                "number_literal",
                "identifier",
            )
        ):
            raise _Refused(f"the offset {source.text_of(offset)} is not a constant in 0..31")
        known = [constant]
    kind = SHUFFLE_KINDS[name]
    if width is not None and kind == "xor":
        _check_butterfly_in_segment(source, args[3], known)
    return Shuffle(
        call=call,
        kind=kind,
        mask=" ".join(source.text_of(args[0]).split()),
        value=source.text_of(value),
        offset=source.text_of(offset),
        width=width,
    )


def _width(source: ParsedSource, name: str, node: Node) -> str:
    """The text of a width argument that is a constant power of two up to 32 (a literal or a
    name, ``warpSize`` included, so the exchange can write it as it is)."""
    node = strip_parens(node)
    value = _fold_with_warp_size(source, node)
    if (
        value is None
        or node.type not in ("number_literal", "identifier")
        or not 0 < value <= WARP_SIZE
        or value & (value - 1)
    ):
        raise _Refused(
            f"{name} with width {source.text_of(node)}, not a constant power of two up to 32"
        )
    return source.text_of(node)


def _check_butterfly_in_segment(source: ParsedSource, width: Node, offsets: list[int]) -> None:
    """An xor by an offset below the width stays in the lane's segment (``lane ^ off``); past
    it, the hardware reads a lower segment for some lanes and the lane's own value for others,
    which the exchange does not write."""
    value = _fold_with_warp_size(source, strip_parens(width))
    assert value is not None
    beyond = [o for o in offsets if o >= value]
    if beyond:
        raise _Refused(f"the xor offset {beyond[0]} is not below the width {value}")


def _plain_value(node: Node) -> bool:
    if node.type == "identifier":
        return True
    if node.type == "field_expression":
        argument = node.child_by_field_name("argument")
        operator = node.child_by_field_name("operator")
        return (
            argument is not None
            and operator is not None
            and operator.type == "."
            and _plain_value(argument)
        )
    return False


def _loop_variable(source: ParsedSource, loop: Node) -> str | None:
    found = source.loop_at(loop)
    return found.variable if found is not None else None


def _loop_offsets(source: ParsedSource, loop: Node) -> list[int] | None:
    """The values the loop variable takes, by simulating the loop; None when unknown. In a
    template helper (``for (int m = kWarpSize >> 1; m >= 1; m >>= 1)`` with ``template <int
    kWarpSize>``), every value it takes under each binding of the parameters that the file
    instantiates (``f<32>`` and ``f<NUM_WARPS>``, followed out through enclosing templates)."""
    function = source.enclosing_function(loop)
    bindings: list[dict[str, int]] | None = [{}]
    if function is not None and function.template_params:
        bindings = template_values(source, function.name, skip_types=True)
    offsets: list[int] = []
    for binding in bindings or [{}]:
        values = _simulated_offsets(source, loop, binding)
        if values is None:
            return None
        offsets += [v for v in values if v not in offsets]
    return offsets


def _simulated_offsets(
    source: ParsedSource, loop: Node, binding: dict[str, int]
) -> list[int] | None:
    """The loop variable's values with the template parameters in ``binding``."""
    found = source.loop_at(loop)
    if found is None or found.kind != "for" or found.variable is None:
        return None
    variable = found.variable
    init = found.initializer
    start = None
    if init is not None and init.type == "declaration":
        declarators = init.children_by_field_name("declarator")
        if len(declarators) == 1 and declarators[0].type == "init_declarator":
            value = declarators[0].child_by_field_name("value")
            start = _fold_with_warp_size(source, value, binding)
    condition = found.condition
    update = found.update
    if start is None or condition is None or update is None:
        return None
    test = _condition(source, condition, variable, binding)
    step = _update(source, update, variable)
    if test is None or step is None:
        return None
    values = []
    value = start
    for _ in range(_MAX_TRIP):
        if not test(value):
            return values
        values.append(value)
        value = step(value)
    return None


def _condition(
    source: ParsedSource, node: Node, variable: str, binding: dict[str, int]
) -> Callable[[int], bool] | None:
    """``variable < bound`` (and the other comparisons) as a test of the variable's value."""
    node = strip_parens(node)
    if node.type != "binary_expression":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    op = node.child_by_field_name("operator")
    if left is None or right is None or op is None or source.text_of(left) != variable:
        return None
    bound = _fold_with_warp_size(source, right, binding)
    if bound is None:
        return None
    tests = {
        "<": lambda v: v < bound,
        "<=": lambda v: v <= bound,
        ">": lambda v: v > bound,
        ">=": lambda v: v >= bound,
        "!=": lambda v: v != bound,
    }
    return tests.get(op.type)


def _fold_with_warp_size(
    source: ParsedSource, node: Node | None, binding: dict[str, int] | None = None
) -> int | None:
    """A constant with ``warpSize`` read as 32 (``for (offset = warpSize / 2; ...)``): the
    only value it has on NVIDIA GPUs; template parameters as ``binding`` gives them."""
    if node is None:
        return None
    constants = {**source.integer_constants, "warpSize": WARP_SIZE, **(binding or {})}
    return fold_int(source, node, constants)


def _update(source: ParsedSource, node: Node, variable: str) -> Callable[[int], int] | None:
    """``variable >>= 1`` (and ``/= 2``, ``<<= 1``, ``++``...) as a step of its value."""
    node = strip_parens(node)
    if node.type == "update_expression":
        argument = node.child_by_field_name("argument")
        if argument is None or source.text_of(argument) != variable:
            return None
        return (lambda v: v + 1) if "++" in source.text_of(node) else (lambda v: v - 1)
    if node.type != "assignment_expression":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    op = node.child_by_field_name("operator")
    if left is None or right is None or op is None or source.text_of(left) != variable:
        return None
    operator = op.type
    if operator == "=":
        right = strip_parens(right)
        inner_op = right.child_by_field_name("operator")
        inner_left = right.child_by_field_name("left")
        if right.type != "binary_expression" or inner_op is None or inner_left is None:
            return None
        if source.text_of(inner_left) != variable:
            return None
        operator = inner_op.type + "="
        right = right.child_by_field_name("right")
    amount = fold(source, right)
    if amount is None:
        return None
    steps = {
        ">>=": lambda v: v >> amount,
        "<<=": lambda v: v << amount,
        "/=": lambda v: int(v / amount) if amount else v,
        "*=": lambda v: v * amount,
        "+=": lambda v: v + amount,
        "-=": lambda v: v - amount,
    }
    return steps.get(operator)


def _value_type(source: ParsedSource, function: Function, value: str) -> str:
    parts = value.replace(" ", "").split(".")
    types = source.local_types(function)
    if parts[0] not in types:
        raise _Refused(f"the type of {parts[0]} is not known")
    current = plain_type(types[parts[0]])
    if "*" in current or "[" in current:
        raise _Refused(f"{parts[0]} is a pointer or an array")
    for name in parts[1:]:
        fields = struct_fields(source, current)
        if name not in fields:
            raise _Refused(f"the type of the field {name} of {current} is not known")
        current = plain_type(fields[name])
    return current


def _names_used(source: ParsedSource, function: Function) -> set[str]:
    """The parameter names and identifiers of a function."""
    names = {p.name for p in function.params if p.name}
    if function.body is not None:
        names |= {source.text_of(n) for n in inside(source, function.body, "identifier")}
    return names


# ---------------------------------------------------------------------------------------------
# The exchange header: declared once per function, shared by its steps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """The exchange declarations at the top of a function body."""

    lines: tuple[Node, ...]
    """The comment and the tid, lane and warp declarations."""
    buffers: dict[str, tuple[str, Node]]
    """Buffer name -> (element type, declaration)."""


def _header(source: ParsedSource, function: Function) -> Header | None:
    body = function.body
    if body is None:
        return None
    children = [c for c in body.named_children]
    wanted = [" ".join(line.split()) for line in HEADER_LINES]
    if len(children) < len(wanted):
        return None
    first = children[: len(wanted)]
    if [" ".join(source.text_of(c).split()) for c in first] != wanted:
        return None
    buffers: dict[str, tuple[str, Node]] = {}
    for node in children[len(wanted) :]:
        parsed = _buffer(source, node)
        if parsed is None:
            break
        buffers[parsed[0]] = (parsed[1], node)
    if not buffers:
        return None
    return Header(tuple(first), buffers)


def _buffer(source: ParsedSource, node: Node) -> tuple[str, str] | None:
    """``__shared__ T xchgN[32][32];`` -> (name, T)."""
    if node.type != "declaration":
        return None
    text = " ".join(source.text_of(node).split())
    match = re.match(r"^__shared__ (.+?) (xchg\d*)\[32\]\[32\];$", text)
    if match is None:
        return None
    return match.group(2), match.group(1)


def _buffer_line(type_name: str, name: str) -> str:
    return f"__shared__ {type_name} {name}[32][32];"


def _body_indent(source: ParsedSource, function: Function) -> str:
    assert function.body is not None
    for statement in named_statements(function.body):
        if statement.type.startswith("preproc"):
            continue
        if source.starts_line(statement.start_byte):
            return source.indent_of(statement.start_byte)
        break
    return source.indent_of(function.node.start_byte) + "  "


# ---------------------------------------------------------------------------------------------
# Shuffle -> exchange (removal)
# ---------------------------------------------------------------------------------------------


def partner_index(kind: str, offset: str, width: str | None = None, lane: str = LANE) -> str:
    """The C expression of the lane a shuffle reads from, given the reading lane: the
    shuffle's source lane, or the lane itself where the shuffle gives a lane its own value.
    With a width, the warp is cut in segments of that many lanes (a power of two) and a
    shuffle stays inside the lane's segment."""
    if width is None:
        indices = {
            "xor": f"{lane} ^ {offset}",
            "down": f"{lane} + {offset} < 32 ? {lane} + {offset} : {lane}",
            "up": f"{lane} >= {offset} ? {lane} - {offset} : {lane}",
        }
    else:
        # xor offsets are checked below the width, where `off % width` is `off`
        indices = {
            "xor": f"{lane} ^ ({offset} % {width})",
            "down": f"{lane} % {width} + {offset} < {width} ? {lane} + {offset} : {lane}",
            "up": f"{lane} % {width} >= {offset} ? {lane} - {offset} : {lane}",
        }
    return indices[kind]


def _read(shuffle: Shuffle, buffer: str) -> str:
    return f"{buffer}[{WARP}][{partner_index(shuffle.kind, shuffle.offset, shuffle.width)}]"


def shuffle_to_exchange(source: ParsedSource, step: ShuffleStep) -> list[Edit]:
    """The edits that turn a canonical shuffle step into a shared-memory exchange."""
    assert step.refusal is None and step.statements
    function = step.function
    header = _header(source, function)
    slots = _assign_buffers(step, header)
    edits = _header_edits(source, function, header, slots)
    reads = [Edit.replace(s.call, _read(s, slots[s.value].buffer)) for s in step.shuffles]
    first, last = step.statements[0], step.statements[-1]
    statement_text = local_splice(source, first.start_byte, last.end_byte, reads)
    writes = [f"{slots[v].buffer}[{WARP}][{LANE}] = {v};" for v in _ordered_values(step)]
    loop = step.node if step.node != first else None
    body = loop.child_by_field_name("body") if loop is not None else None
    if body is not None and body.type != "compound_statement":
        indent = source.indent_of(loop.start_byte) if loop is not None else ""
        inner = indent + "  "
        before = body.prev_sibling
        start = before.end_byte if before is not None else body.start_byte
        lines = [*writes, "__syncwarp();", statement_text, "__syncwarp();"]
        text = " {\n" + "\n".join(inner + line for line in lines) + f"\n{indent}}}"
        edits.append(Edit(start, body.end_byte, text))
        return edits
    holder = first.parent
    if holder is not None and holder.type != "compound_statement":  # an if's branch
        indent = source.indent_of(holder.start_byte)
        inner = indent + "  "
        lines = [*writes, "__syncwarp();", statement_text, "__syncwarp();"]
        text = "{\n" + "\n".join(inner + line for line in lines) + f"\n{indent}}}"
        if source.data[first.start_byte - 1 : first.start_byte] not in b" \t\n":
            text = " " + text
        edits.append(Edit(first.start_byte, first.end_byte, text))
        return edits
    # every value published, one barrier, then the statements read their partners' slots
    indent = source.indent_of(first.start_byte)
    lead = "".join(f"{w}\n{indent}" for w in writes) + f"__syncwarp();\n{indent}"
    edits.append(
        Edit(first.start_byte, last.end_byte, lead + statement_text + f"\n{indent}__syncwarp();")
    )
    return edits


def _ordered_values(step: ShuffleStep) -> list[str]:
    seen: list[str] = []
    for shuffle in step.shuffles:
        if shuffle.value not in seen:
            seen.append(shuffle.value)
    return seen


@dataclass(frozen=True)
class _Slot:
    """Where one shuffled value goes: a buffer, its element type, whether it is new."""

    buffer: str
    type: str
    new: bool


def _assign_buffers(step: ShuffleStep, header: Header | None) -> dict[str, _Slot]:
    """Value -> its buffer: existing buffers of the right type first, new ones after."""
    existing = dict(header.buffers) if header is not None else {}
    taken: set[str] = set()
    chosen: dict[str, _Slot] = {}
    for value in _ordered_values(step):
        type_name = step.types[value]
        reuse = next(
            (n for n, (t, _) in existing.items() if t == type_name and n not in taken), None
        )
        if reuse is not None:
            taken.add(reuse)
            chosen[value] = _Slot(reuse, type_name, False)
            continue
        index = 0
        names = set(existing) | taken
        while (BUFFER if index == 0 else f"{BUFFER}{index}") in names:
            index += 1
        name = BUFFER if index == 0 else f"{BUFFER}{index}"
        taken.add(name)
        chosen[value] = _Slot(name, type_name, True)
    return chosen


def _header_edits(
    source: ParsedSource, function: Function, header: Header | None, slots: dict[str, _Slot]
) -> list[Edit]:
    """Declare the new buffers (and the header, the first time)."""
    assert function.body is not None
    new_lines = [_buffer_line(s.type, s.buffer) for s in slots.values() if s.new]
    if not new_lines:
        return []
    indent = _body_indent(source, function)
    if header is None:
        lines = [*HEADER_LINES, *new_lines]
        return [Edit.insert(function.body.start_byte + 1, "".join(f"\n{indent}{x}" for x in lines))]
    last = list(header.buffers.values())[-1][1]
    return [Edit.insert(last.end_byte, "".join(f"\n{indent}{x}" for x in new_lines))]


# ---------------------------------------------------------------------------------------------
# Exchange steps (the shared-memory form) and exchange -> shuffle (application)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """One read of a partner's slot, ``xchgN[xchg_warp][<partner index>]``."""

    node: Node
    buffer: str
    kind: str
    offset: str
    width: str | None = None


@dataclass(frozen=True)
class ExchangeStep:
    """A step in the form :func:`shuffle_to_exchange` writes."""

    function: Function
    node: Node
    """The loop (or the first write statement, outside loops)."""
    kinds: frozenset[str]
    writes: tuple[Node, ...]
    """``xchgN[xchg_warp][xchg_lane] = value;`` statements."""
    values: dict[str, str]
    """Buffer -> the value written to it."""
    syncs: tuple[Node, Node]
    statements: tuple[Node, ...]
    """The statements between the two barriers, each reading partners' slots."""
    reads: tuple[Read, ...]


_READ_INDEX = {
    "xor": re.compile(rf"^{LANE}\^(?P<off>\w+)$"),
    "down": re.compile(rf"^{LANE}\+(?P<off>\w+)<32\?{LANE}\+(?P=off):{LANE}$"),
    "up": re.compile(rf"^{LANE}>=(?P<off>\w+)\?{LANE}-(?P=off):{LANE}$"),
}
_READ_INDEX_IN_SEGMENTS = {
    "xor": re.compile(rf"^{LANE}\^\((?P<off>\w+)%(?P<w>\w+)\)$"),
    "down": re.compile(rf"^{LANE}%(?P<w>\w+)\+(?P<off>\w+)<(?P=w)\?{LANE}\+(?P=off):{LANE}$"),
    "up": re.compile(rf"^{LANE}%(?P<w>\w+)>=(?P<off>\w+)\?{LANE}-(?P=off):{LANE}$"),
}
"""What :func:`partner_index` writes, spaces removed; with a width, the second table."""


def exchange_steps(source: ParsedSource) -> tuple[ExchangeStep, ...]:
    """Every exchange step of functions with an exchange header; computed once per source."""
    return cached(source, "exchange_steps", lambda: tuple(_exchange_steps(source)))


def _exchange_steps(source: ParsedSource) -> Iterator[ExchangeStep]:
    for function in source.functions:
        header = _header(source, function)
        if header is None or function.body is None:
            continue
        for block in inside(source, function.body, "compound_statement"):
            if source.enclosing_function(block) != function:
                continue
            yield from _exchanges_in_block(source, function, header, block)


def _exchanges_in_block(
    source: ParsedSource, function: Function, header: Header, block: Node
) -> Iterator[ExchangeStep]:
    """The exchange steps of one block, wherever they start in it: a straight-line sequence
    of steps (the removal of ``v += __shfl_xor_sync(m, v, 1); v += ...(v, 2);`` mid-function)
    gives one step each."""
    statements = named_statements(block)
    start = 0
    while start < len(statements):
        step = _exchange_at(source, function, header, block, statements, start)
        if step is None:
            start += 1
            continue
        yield step
        start = statements.index(step.syncs[1]) + 1


def _exchange_at(
    source: ParsedSource,
    function: Function,
    header: Header,
    block: Node,
    statements: list[Node],
    start: int,
) -> ExchangeStep | None:
    writes: list[Node] = []
    values: dict[str, str] = {}
    index = start
    while index < len(statements):
        parsed = _write(source, statements[index], header)
        if parsed is None:
            break
        writes.append(statements[index])
        values[parsed[0]] = parsed[1]
        index += 1
    if not writes or index >= len(statements) or not _is_syncwarp(source, statements[index]):
        return None
    first_sync = statements[index]
    end = next(
        (i for i in range(index + 1, len(statements)) if _is_syncwarp(source, statements[i])),
        None,
    )
    if end is None or end == index + 1:
        return None
    between = statements[index + 1 : end]
    per_statement = [_reads(source, s, header) for s in between]
    if not all(per_statement):
        return None
    reads = [r for found in per_statement for r in found]
    if {r.buffer for r in reads} != set(values):
        return None
    owner = block.parent if block.parent is not None else block
    return ExchangeStep(
        function=function,
        node=owner if _opens_offset_loop(source, owner, statements[:start], reads) else writes[0],
        kinds=frozenset(r.kind for r in reads),
        writes=tuple(writes),
        values=values,
        syncs=(first_sync, statements[end]),
        statements=tuple(between),
        reads=tuple(reads),
    )


def _opens_offset_loop(
    source: ParsedSource, owner: Node, before: list[Node], reads: list[Read]
) -> bool:
    """Whether the step is its loop's (``for (offset ...)``): it opens the loop's body, after
    ``__syncwarp()`` calls only, and reads by the loop's variable. Any other step (an
    unrolled one inside a loop over something else) is its writes."""
    if owner.type not in ("for_statement", "while_statement", "do_statement"):
        return False
    if not all(_is_syncwarp(source, s) for s in before):
        return False
    variable = _loop_variable(source, owner)
    return variable is None or all(r.offset == variable for r in reads)


def _write(source: ParsedSource, node: Node, header: Header) -> tuple[str, str] | None:
    if node.type != "expression_statement" or not node.named_children:
        return None
    assignment = node.named_children[0]
    if assignment.type != "assignment_expression":
        return None
    left = assignment.child_by_field_name("left")
    right = assignment.child_by_field_name("right")
    op = assignment.child_by_field_name("operator")
    if left is None or right is None or op is None or op.type != "=":
        return None
    text = source.text_of(left).replace(" ", "")
    match = re.match(rf"^(xchg\d*)\[{WARP}\]\[{LANE}\]$", text)
    if match is None or match.group(1) not in header.buffers:
        return None
    return match.group(1), source.text_of(right)


def _is_syncwarp(source: ParsedSource, node: Node) -> bool:
    return " ".join(source.text_of(node).split()) == "__syncwarp();"


def _reads(source: ParsedSource, statement: Node, header: Header) -> list[Read]:
    found = []
    for node in inside(source, statement, "subscript_expression"):
        outer = node.child_by_field_name("argument")
        if outer is None or outer.type != "subscript_expression":
            continue
        base = outer.child_by_field_name("argument")
        if base is None or source.text_of(base) not in header.buffers:
            continue
        if source.text_of(outer).replace(" ", "") != f"{source.text_of(base)}[{WARP}]":
            continue
        indices = node.child_by_field_name("indices")
        index = source.text_of(indices).replace(" ", "")[1:-1] if indices is not None else ""
        read = _read_of(index, node, source.text_of(base))
        if read is not None:
            found.append(read)
    return found


def _read_of(index: str, node: Node, buffer: str) -> Read | None:
    for kind, pattern in _READ_INDEX.items():
        match = pattern.match(index)
        if match is not None:
            return Read(node, buffer, kind, match.group("off"))
    for kind, pattern in _READ_INDEX_IN_SEGMENTS.items():
        match = pattern.match(index)
        if match is not None:
            return Read(node, buffer, kind, match.group("off"), match.group("w"))
    return None


_INTRINSIC = {kind: name for name, kind in SHUFFLE_KINDS.items()}


def exchange_to_shuffle(source: ParsedSource, step: ExchangeStep, mask: str) -> list[Edit]:
    """The edits that turn an exchange step back into shuffles (and drop the exchange
    declarations that nothing reads any more)."""
    edits = [line_deletion(source, w) for w in step.writes]
    edits += [line_deletion(source, s) for s in step.syncs]
    for read in step.reads:
        value = step.values[read.buffer]
        width = f", {read.width}" if read.width is not None else ""
        edits.append(
            Edit.replace(
                read.node, f"{_INTRINSIC[read.kind]}({mask}, {value}, {read.offset}{width})"
            )
        )
    header = _header(source, step.function)
    assert header is not None
    still_read = _buffers_read_elsewhere(source, step, header)
    for name, (_, node) in header.buffers.items():
        if name not in still_read:
            edits.append(line_deletion(source, node))
    if not still_read:
        edits += [line_deletion(source, line) for line in header.lines]
    return edits


def _buffers_read_elsewhere(source: ParsedSource, step: ExchangeStep, header: Header) -> set[str]:
    body = step.function.body
    assert body is not None
    used: set[str] = set()
    # a loop step is the whole loop; a straight-line step is its writes and its read
    skip = [step.node] if step.node not in step.writes else [*step.writes, *step.statements]
    declarations = [node for _, node in header.buffers.values()]
    for node in inside(source, body, "identifier"):
        name = source.text_of(node)
        if name not in header.buffers:
            continue
        if any(within(node, s) for s in [*skip, *declarations]):
            continue
        used.add(name)
    return used


# ---------------------------------------------------------------------------------------------
# The mechanism base shared by warp_shuffle_reduction and warp_shuffle_scan
# ---------------------------------------------------------------------------------------------


class ExchangeMechanism(Mechanism):
    """A warp-level exchange written with shuffles (present) or shared memory (absent).

    Subclasses set :attr:`kinds`, the shuffle kinds they own (``xor``/``down`` for
    reductions, ``up`` for scans).
    """

    kinds: ClassVar[frozenset[str]]
    carrier_keys: ClassVar[dict[str, str]] = {
        "mask": f"the lane mask written in the shuffles (default {DEFAULT_MASK})"
    }

    def _intrinsics(self) -> str:
        return "/".join(sorted(n for n, k in SHUFFLE_KINDS.items() if k in self.kinds))

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for step in shuffle_steps(source):
            mine = step.kinds & self.kinds
            if not mine:
                continue
            refusal = step.refusal
            if refusal is None and step.kinds - self.kinds:
                others = ", ".join(sorted(step.kinds - self.kinds))
                refusal = f"the step mixes {self._intrinsics()} with {others} shuffles"
            yield self.site(
                source,
                step.node,
                detail={"kind": ",".join(sorted(mine)), "function": step.function.name},
                refusal=refusal,
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for step in exchange_steps(source):
            if step.kinds <= self.kinds:
                yield self.site(
                    source,
                    step.node,
                    detail={"kind": ",".join(sorted(step.kinds))},
                )

    def _shuffle_step(self, source: ParsedSource, site: Site) -> ShuffleStep:
        for step in shuffle_steps(source):
            if (step.node.start_byte, step.node.end_byte) == (site.start_byte, site.end_byte):
                return step
        raise self.refuse(f"no shuffle step at line {site.start_line}", site)

    def _exchange_step(self, source: ParsedSource, site: Site) -> ExchangeStep:
        for step in exchange_steps(source):
            if (step.node.start_byte, step.node.end_byte) == (site.start_byte, site.end_byte):
                return step
        raise self.refuse(f"no exchange step at line {site.start_line}", site, "apply")

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        return shuffle_to_exchange(source, self._shuffle_step(source, site))

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        step = self._shuffle_step(kernel.parsed, site)
        masks = {s.mask for s in step.shuffles}
        return Carrier(mask=masks.pop()) if len(masks) == 1 else Carrier()

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        return Carrier(mask=DEFAULT_MASK)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        mask = carrier.get_str("mask") or DEFAULT_MASK
        if not re.match(r"^[\w:]+$", mask):
            raise self.refuse(f"mask={mask!r} is not a constant name or literal", site, "apply")
        return exchange_to_shuffle(source, self._exchange_step(source, site), mask)

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        kernels = graph(source).kernels_reaching(site.function)
        block = block_size_of(source, kernels[0]) if len(kernels) == 1 else None
        return [
            BlockSizeMultiple(
                k=32,
                block_size=block,
                why="full-mask shuffles need all 32 lanes of every warp",
            ),
            ArchAtLeast(sm=30, why=f"{self._intrinsics()} need sm_30 or newer"),
        ]
