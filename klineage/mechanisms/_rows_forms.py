"""Rows per thread, per warp and per block: the analyses and rewrites behind ``block_per_row``
and ``warp_per_row``.

**Thread per row** (the naive form, :class:`ThreadRows`) is a kernel that starts::

    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;

(after any compile-time constants, ``const int U = 8;``; for a warp the index may also be the
thread's linear index in a 32 x y block, :func:`row_of_thread_2d`) and then walks its row with
plain loops ``for (int64_t c = 0; c < n; ++c)``, loops unrolled by hand
(:mod:`klineage.mechanisms._block_unrolled`), or packed steps and walks back
(:mod:`klineage.mechanisms._thread_row_steps`). Each loop either
*reduces* into scalars declared before it (``acc += e``, ``m = fmaxf(m, e)``, ``fminf``) or
*maps* (stores ``p[... c ...] = e``), or both; everything else is scalar code on values
every thread of a row agrees on. Such a kernel is spread over a group of threads (a block or
a warp) per row by three local changes: the row index drops the thread part; each loop starts
at the thread's rank in the group and strides by the group size; after a loop, each of its
accumulators is reduced over the group (:data:`HELPERS`, every thread gets the result), and
stores outside loops are done by the group's first thread only. The launch gives each group
one row. Splitting a sum needs every thread to start from zero, so a sum's accumulator must
be initialized to a zero literal and not written before its loop, or set to one again right
before it (``sum = 0.0f;`` in a block the loop is in, a sum reused for a second walk of the
row); ``max``/``min`` are idempotent and start anywhere.

**Group per row** (:class:`GroupRows`) is the reverse: a kernel whose row index comes from
``blockIdx.x`` (block) or from the warp number (warp), whose group-strided loops, group
reductions (a call to a reduction helper, or the inline "warp reduce, publish per warp,
``__syncthreads()``, reload, warp reduce" sequence) and first-thread guards are recognized.
Each becomes its thread-per-row equivalent: full loops, the reduction the identity (one
thread's partial *is* the row's value), unguarded stores, a thread row index with a bound
check (a row-count parameter is added when the kernel has none), and a launch of
``ceil(rows / block)`` blocks of the same block size (so ``__launch_bounds__`` still holds).
Anything else tied to the thread layout (``threadIdx`` outside those forms, such as a row
held in registers across strided slots, shared memory beyond the reductions' scratch,
barriers, shuffles left over) is refused with the line it is on.

This module holds what the row layouts share: the canonical forms' names and messages,
:class:`RowLoop`, and small readers of statements and indices. The analyses and rewrites are
split by layout and direction: :mod:`._rows_helpers` (the emitted reduction helpers and the
recognition of user ones), :mod:`._rows_thread` and :mod:`._rows_thread_walker` (thread per
row), :mod:`._rows_spread` (thread per row -> group per row), :mod:`._rows_group_reductions`,
:mod:`._rows_group_walker` and :mod:`._rows_index` (group per row), :mod:`._rows_removal`
(group per row -> thread per row).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.mechanisms._block_unrolled import UnrolledLoop
from klineage.mechanisms._online_pair_form import Fold
from klineage.mechanisms._reductions_util import (
    call_name,
    inside,
    is_builtin,
    local_splice,
    named_statements,
    strip_casts,
    strip_parens,
)

Group = Literal["block", "warp"]

Op = Literal["sum", "max", "min", "merge"]
"""``merge``: ``acc = f(acc, e)`` with a user type (a running max with its rescaled sum), spread
only with a carried block reduction (:func:`merge_reductions`), i.e. in a round trip."""

SYNC_CALLS = frozenset(
    {"__syncthreads", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count"}
)

WARP_INTRINSICS = frozenset(
    {"__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
     "__ballot_sync", "__any_sync", "__all_sync", "__match_any_sync", "__reduce_add_sync",
     "__activemask"}
)  # fmt: skip

SERIAL_FORM = (
    "this rule takes the block reduction finished by thread 0: `v = warp_reduce(v); if (lane "
    "== 0) s[warp] = v; __syncthreads(); if (tid == 0) { a = s[0]; for (w = 1; w < warps; "
    "w++) a = max(a, s[w]); s[0] = a; } __syncthreads(); r = s[0];`"
)

UNROLLED_FORM = (
    "this rule takes the unrolled block-strided loop `for (i = tid; i < n; i += blockDim.x * "
    "U) for (u = 0; u < U; u++) ... i + u * blockDim.x ...`, writes past n guarded"
)

THREAD_UNROLLED_FORM = (
    "this rule takes a row loop unrolled by hand as `for (i = 0; i < n; i += U) for (u = 0; "
    "u < U; u++) ... i + u ...`, U a constant, writes past n guarded by `if (i + u < n)`"
)


class NotCanonical(Exception):
    """A kernel is not in the canonical form a rewrite needs; the message says why."""


@dataclass
class RowLoop:
    """A canonical loop over a row: ``for (T c = 0; c < n; ++c)``."""

    node: Node
    variable: str
    start: Node
    """The ``0``."""
    update: Node
    accumulators: dict[str, Op] = field(default_factory=dict)
    """Scalars the loop reduces into, in order of appearance, with the operation."""
    unrolled: UnrolledLoop | None = None
    """Unrolled by hand: ``i += U`` with ``i + u`` inside, ``u`` an inner loop over ``0 ..
    U - 1`` (:mod:`klineage.mechanisms._block_unrolled`)."""
    unit: Node | None = None
    """A packed step ``c += V``: the ``V`` (:mod:`klineage.mechanisms._thread_row_steps`)."""
    down: bool = False
    """A walk back down the row, ``c -= s; for (; c >= 0; c -= s)``; ``start`` is then the
    ``c -= s`` before the loop."""
    pairs: list[Fold] = field(default_factory=list)
    """Running (max, sum of exp) pairs the loop folds in one pass, combined over the
    group after it (:mod:`klineage.mechanisms._online_pair_form`)."""


def global_thread_index(source: ParsedSource, node: Node) -> Node | None:
    """For ``blockIdx.x * blockDim.x + threadIdx.x`` (any order, casts allowed), the
    ``blockIdx.x`` operand (with its cast); None for anything else."""
    node = strip_parens(node)
    if node.type != "binary_expression" or operator_of(node) != "+":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None:
        return None
    for product, thread in ((left, right), (right, left)):
        product = strip_parens(product)
        if not is_builtin(source, thread, "threadIdx") or product.type != "binary_expression":
            continue
        if operator_of(product) != "*":
            continue
        a, b = product.child_by_field_name("left"), product.child_by_field_name("right")
        for block, dim in ((a, b), (b, a)):
            if is_builtin(source, block, "blockIdx") and is_builtin(source, dim, "blockDim"):
                return block
    return None


def operator_of(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def single_init(source: ParsedSource, node: Node) -> tuple[str, Node] | None:
    """``T name = value;`` -> (name, value) for a declaration of one initialized name."""
    if node.type != "declaration":
        return None
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    name = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if name is None or value is None or name.type != "identifier":
        return None
    return source.text_of(name), value


def bound_check(source: ParsedSource, node: Node | None, index: str, op: str = ">=") -> Node | None:
    """For ``if (index >= bound) return;`` (``op`` another comparison), the ``bound`` node."""
    if node is None or node.type != "if_statement":
        return None
    if node.child_by_field_name("alternative") is not None:
        return None
    condition = node.child_by_field_name("condition")
    consequence = node.child_by_field_name("consequence")
    if condition is None or consequence is None:
        return None
    value = condition.child_by_field_name("value")
    test = strip_parens(value) if value is not None else None
    if test is None or test.type != "binary_expression" or operator_of(test) != op:
        return None
    left = test.child_by_field_name("left")
    if left is None or source.text_of(strip_parens(left)) != index:
        return None
    if consequence.type == "compound_statement":
        inner = named_statements(consequence)
        consequence = inner[0] if len(inner) == 1 else consequence
    if " ".join(source.text_of(consequence).split()) != "return;":
        return None
    return test.child_by_field_name("right")


SUM_OPS = frozenset({"+="})


MAX_FUNCS: dict[str, Op] = {
    "fmaxf": "max",
    "max": "max",
    "fmax": "max",
    "fminf": "min",
    "min": "min",
    "fmin": "min",
}


def expression_of(statement: Node) -> Node | None:
    """The expression of an expression statement."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    return statement.named_children[0]


def below_name(condition: Node | None) -> Node | None:
    """The ``c`` of a loop condition ``c < n``."""
    if condition is None:
        return None
    condition = strip_parens(condition)
    return condition.child_by_field_name("left") if condition.type == "binary_expression" else None


def below(
    source: ParsedSource, condition: Node | None, variable: str, inclusive: bool = False
) -> bool:
    """``variable < n`` (or ``variable <= n`` when ``inclusive``)."""
    if condition is None:
        return False
    condition = strip_parens(condition)
    left = condition.child_by_field_name("left")
    return (
        condition.type == "binary_expression"
        and operator_of(condition) in (("<", "<=") if inclusive else ("<",))
        and left is not None
        and source.text_of(left) == variable
    )


def primary_text(text: str) -> bool:
    return re.match(r"^[A-Za-z_]\w*$", text) is not None


def count_numerator(count: str) -> str:
    """``count`` ready to have a number added: parenthesized unless it is names joined by
    ``*`` and ``+``."""
    return count if re.match(r"^[\w\s*+]+$", count) else f"({count})"


def row_count(source: ParsedSource, kernel: Function, launch: Launch, bound: Node) -> str:
    """The kernel's row count written at a launch: its bound with the kernel's parameters
    replaced by the launch's arguments."""
    params = [p.name for p in kernel.params]
    if len(launch.args) != len(params):
        raise NotCanonical(
            f"the launch at line {source.line_of(launch.node.start_byte)} "
            "does not pass every parameter"
        )
    values = dict(zip(params, launch.args, strict=True))
    edits = []
    for node in inside(source, bound, "identifier"):
        name = source.text_of(node)
        if name not in values and name not in source.integer_constants:
            raise NotCanonical(f"the row bound uses {name}, which the launch cannot see")
        if name in values:
            arg = values[name]
            text = source.text_of(arg)
            edits.append(Edit.replace(node, text if precedence(arg) >= PRIMARY else f"({text})"))
    if any(inside(source, bound, "call_expression", "field_expression")):
        raise NotCanonical(f"the row bound {source.text_of(bound)} is not a parameter expression")
    text = local_splice(source, bound.start_byte, bound.end_byte, edits)
    return " ".join(text.split())


def is_declared_name(node: Node) -> bool:
    """Whether an identifier is the name a declarator declares."""
    parent = node.parent
    return (
        parent is not None
        and parent.type == "init_declarator"
        and (parent.child_by_field_name("declarator") == node)
    )


def spread_reason(what: str, line: int) -> str:
    """Why a use of the thread's rank blocks the rewrite to thread per row."""
    return (
        f"{what} at line {line} is not a group-strided loop start, a first-thread guard or the "
        "row index: the row is spread over the group in a form a thread-per-row kernel cannot "
        "keep (a row held in registers across strided slots is one; see row_in_registers)"
    )


def is_lane(source: ParsedSource, node: Node) -> bool:
    """``threadIdx.x & 31`` or ``threadIdx.x % 32`` (``warpSize`` forms too)."""
    node = strip_casts(node)
    if node.type != "binary_expression":
        return False
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if not is_builtin(source, left, "threadIdx") or right is None:
        return False
    text = source.text_of(strip_parens(right)).replace(" ", "")
    return (operator_of(node) == "&" and text in ("31", "warpSize-1", "0x1f")) or (
        operator_of(node) == "%" and text in ("32", "warpSize")
    )


def is_call_statement(source: ParsedSource, node: Node, names: frozenset[str]) -> bool:
    if node.type != "expression_statement" or not node.named_children:
        return False
    call = node.named_children[0]
    return call.type == "call_expression" and call_name(source, call) in names
