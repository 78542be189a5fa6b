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
be initialized to a zero literal and not written before its loop; ``max``/``min`` are
idempotent and start anywhere.

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
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from klineage.conditions import evaluate_size
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import PRIMARY, fold_int, precedence, to_size_expr, wrap_at
from klineage.cuda.constexpr_branches import emptied_branches
from klineage.cuda.edit import Edit
from klineage.cuda.facts import launch_names, template_bindings, template_values
from klineage.cuda.source import Function, Launch, Loop, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import (
    FMA_CALLS,
    WARP_SIZE,
    declaration_names,
    statement_before,
    walk,
)
from klineage.mechanisms._block_rows_helper import HelperRowsError, helper_rows, outside
from klineage.mechanisms._block_unrolled import (
    STORE_INTRINSICS,
    UnrolledFormError,
    UnrolledLoop,
    clamped_element,
    thread_unrolled_loop,
    unrolled_loop,
)
from klineage.mechanisms._reductions_exchange import exchange_steps, shuffle_steps
from klineage.mechanisms._reductions_scratch import ScratchRun, scratch_runs
from klineage.mechanisms._reductions_serial import (
    SerialFormError,
    SerialRun,
    early_exit,
    scratch_pointers,
    serial_runs,
)
from klineage.mechanisms._reductions_util import (
    arguments_of,
    builtin_uses,
    cached,
    call_name,
    fold,
    fresh_name,
    graph,
    inside,
    is_builtin,
    is_zero_literal,
    line_deletion,
    local_splice,
    named_statements,
    plain_type,
    strip_casts,
    strip_parens,
    within,
)
from klineage.mechanisms._thread_row_steps import (
    StepFormError,
    packed_deref,
    packed_step,
    pointer_offset,
    split_start,
    steps_down,
    vector_access,
    walk_back,
)
from klineage.mechanisms._tiles_util import orphaned_declarations
from klineage.mechanisms._warp_rows_2d import (
    THREAD_ROW_2D,
    block_threads_2d,
    block_width_asserts,
    is_row_of_2d_warps,
    is_thread_x,
    lane_is_thread_x,
    row_of_thread_2d,
)
from klineage.mechanisms._warp_rows_cg import is_warp_query, tile_calls_left, warp_reduces

__all__ = [
    "HELPERS",
    "GroupRows",
    "MergeReduction",
    "NotCanonical",
    "ThreadRows",
    "block_reduce_functions",
    "group_rows",
    "helper_text",
    "is_block_per_row",
    "is_warp_per_row",
    "merge_reductions",
    "spread_rows",
    "thread_row_walk",
    "thread_rows",
    "thread_rows_shape",
    "warp_reduce_functions",
]

Group = Literal["block", "warp"]
Op = Literal["sum", "max", "min", "merge"]
"""``merge``: ``acc = f(acc, e)`` with a user type (online softmax's max-and-sum), spread only
with a carried block reduction (:func:`merge_reductions`), i.e. in a round trip."""
_SYNC = frozenset({"__syncthreads", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count"})
_WARP_INTRINSICS = frozenset(
    {"__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__shfl_up_sync",
     "__ballot_sync", "__any_sync", "__all_sync", "__match_any_sync", "__reduce_add_sync",
     "__activemask"}
)  # fmt: skip


_SERIAL_FORM = (
    "this rule takes the block reduction finished by thread 0: `v = warp_reduce(v); if (lane "
    "== 0) s[warp] = v; __syncthreads(); if (tid == 0) { a = s[0]; for (w = 1; w < warps; "
    "w++) a = max(a, s[w]); s[0] = a; } __syncthreads(); r = s[0];`"
)
_UNROLLED_FORM = (
    "this rule takes the unrolled block-strided loop `for (i = tid; i < n; i += blockDim.x * "
    "U) for (u = 0; u < U; u++) ... i + u * blockDim.x ...`, writes past n guarded"
)
_THREAD_UNROLLED_FORM = (
    "this rule takes a row loop unrolled by hand as `for (i = 0; i < n; i += U) for (u = 0; "
    "u < U; u++) ... i + u ...`, U a constant, writes past n guarded by `if (i + u < n)`"
)


class NotCanonical(Exception):
    """A kernel is not in the canonical form a rewrite needs; the message says why."""


# ---------------------------------------------------------------------------------------------
# Emitted helpers: float reductions over a warp or a block, every thread gets the result
# ---------------------------------------------------------------------------------------------

_COMBINE: dict[str, str] = {
    "sum": "v += __shfl_xor_sync(0xffffffffu, v, offset);",
    "max": "v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));",
    "min": "v = fminf(v, __shfl_xor_sync(0xffffffffu, v, offset));",
}
_IDENTITY: dict[str, str] = {
    "sum": "0.0f",
    "max": "__int_as_float(0xff800000)",  # -inf, without needing math.h
    "min": "__int_as_float(0x7f800000)",  # +inf
}
HELPERS: tuple[str, ...] = tuple(
    f"{group}_reduce_{op}" for group in ("warp", "block") for op in ("sum", "max", "min")
)


def helper_text(name: str) -> str:
    """The source of one emitted helper (``warp_reduce_max``...), with its comment line and a
    blank line after it."""
    group, _, op = name.split("_")
    if group == "warp":
        return (
            f"// The {op} of v over the warp; every lane gets it.\n"
            f"__device__ __forceinline__ float warp_reduce_{op}(float v) {{\n"
            f"  for (int offset = 16; offset > 0; offset >>= 1) {_COMBINE[op]}\n"
            "  return v;\n"
            "}\n\n"
        )
    return (
        f"// The {op} of v over the block (a multiple of 32 threads); every thread gets it.\n"
        f"__device__ __forceinline__ float block_reduce_{op}(float v) {{\n"
        "  __shared__ float partial[32];\n"
        "  const int lane = threadIdx.x & 31;\n"
        "  const int warp = threadIdx.x >> 5;\n"
        f"  v = warp_reduce_{op}(v);\n"
        "  if (lane == 0) partial[warp] = v;\n"
        "  __syncthreads();\n"
        f"  v = lane < (int)(blockDim.x >> 5) ? partial[lane] : {_IDENTITY[op]};\n"
        f"  v = warp_reduce_{op}(v);\n"
        "  __syncthreads();  // partial is reused by the next reduction\n"
        "  return v;\n"
        "}\n\n"
    )


def _helpers_needed(group: Group, ops: list[str]) -> list[str]:
    names = [f"warp_reduce_{op}" for op in ops]
    if group == "block":
        names += [f"block_reduce_{op}" for op in ops]
    return list(dict.fromkeys(names))


def _insertion_point(source: ParsedSource, kernel: Function) -> int:
    """Where helpers go: before the kernel and the comment lines directly above it."""
    start = kernel.outer.start_byte
    node = kernel.outer.prev_sibling
    while node is not None and node.type == "comment":
        if source.line_of(node.end_byte - 1) + 1 < source.line_of(start):
            break
        start = node.start_byte
        node = node.prev_sibling
    return source.line_start(start)


def helper_insertions(
    source: ParsedSource, kernel: Function, group: Group, ops: list[str]
) -> list[Edit]:
    """Insert the helpers a rewrite calls that the file does not define yet."""
    text = ""
    for name in _helpers_needed(group, ops):
        existing = source.function(name)
        if existing is None:
            text += helper_text(name)
        elif helper_text(name).encode() not in source.data:
            raise NotCanonical(f"the file defines its own {name}; it is not klineage's helper")
    return [Edit.insert(_insertion_point(source, kernel), text)] if text else []


def helper_deletions(source: ParsedSource, removed: list[tuple[int, int]]) -> list[Edit]:
    """Delete emitted helpers nothing calls once the ``removed`` byte ranges are gone."""
    spans: dict[str, tuple[int, int]] = {}
    for name in HELPERS:
        text = helper_text(name).encode()
        at = source.data.find(text)
        if at >= 0 and source.function(name) is not None:
            spans[name] = (at, at + len(text))
    if not spans:
        return []
    gone = list(removed)
    deleted: list[str] = []
    changed = True
    while changed:
        changed = False
        for name, span in spans.items():
            if name in deleted:
                continue
            calls = [
                c
                for c in source.calls_named(name)
                if not any(a <= c.node.start_byte and c.node.end_byte <= b for a, b in gone)
            ]
            if not calls:
                deleted.append(name)
                gone.append(span)
                changed = True
    return [Edit(*spans[name], "") for name in deleted]


# ---------------------------------------------------------------------------------------------
# Classifying helper functions
# ---------------------------------------------------------------------------------------------


def _value_function(source: ParsedSource, function: Function) -> bool:
    """A device function ``T f(T v, ...)``: the shape of a reduction helper."""
    if function.is_kernel or not function.runs_on_device or not function.params:
        return False
    first = function.params[0]
    return_type = function.node.child_by_field_name("type")
    return (
        not first.is_pointer
        and "&" not in first.type
        and return_type is not None
        and plain_type(source.text_of(return_type)) == plain_type(first.type)
    )


def _returns(source: ParsedSource, function: Function) -> list[Node]:
    """The returned expressions of a function."""
    assert function.body is not None
    found = []
    for node in inside(source, function.body, "return_statement"):
        if node.named_children:
            found.append(node.named_children[0])
    return found


def _returns_loop_result(source: ParsedSource, function: Function, loops: list[Node]) -> bool:
    """Whether every return gives back a variable the reduction loops assign (``return v;``
    after ``v += shfl(v)``, not ``return v / 32;``)."""
    assigned = set()
    for loop in loops:
        for node in inside(source, loop, "assignment_expression"):
            left = node.child_by_field_name("left")
            if left is not None and left.type == "identifier":
                assigned.add(source.text_of(left))
    returns = _returns(source, function)
    return bool(returns) and all(
        strip_parens(r).type == "identifier" and source.text_of(strip_parens(r)) in assigned
        for r in returns
    )


def _is_warp_call(source: ParsedSource, node: Node, warp: set[str]) -> bool:
    """``w(x)`` or ``c ? w1(x) : w2(x)`` with warp-reduction helpers."""
    node = strip_parens(node)
    if node.type == "conditional_expression":
        branches = [node.child_by_field_name(f) for f in ("consequence", "alternative")]
        return all(b is not None and _is_warp_call(source, b, warp) for b in branches)
    return node.type == "call_expression" and call_name(source, node) in warp


def _returns_warp_result(source: ParsedSource, function: Function, warp: set[str]) -> bool:
    """Whether every return gives back a warp reduction's result: ``return warp_sum(v);``,
    or ``return r;`` where the last top-level write of ``r`` is ``r = warp_sum(...)``."""
    assert function.body is not None
    statements = named_statements(function.body)
    for returned in _returns(source, function):
        returned = strip_parens(returned)
        if _is_warp_call(source, returned, warp):
            continue
        if returned.type != "identifier":
            return False
        name = source.text_of(returned)
        last: Node | None = None
        for statement in statements:
            if statement.start_byte >= returned.start_byte:
                break
            for node in inside(source, statement, "assignment_expression"):
                left = node.child_by_field_name("left")
                if left is not None and source.text_of(left) == name:
                    last = node.child_by_field_name("right")
            declared = _single_init(source, statement)
            if declared is not None and declared[0] == name:
                last = declared[1]
        if last is None or not _is_warp_call(source, last, warp):
            return False
    return bool(_returns(source, function))


def warp_reduce_functions(source: ParsedSource) -> set[str]:
    """Device functions ``T f(T v)`` that reduce over a warp with xor/down shuffles (or the
    shared-memory exchange of :mod:`._reductions_exchange`), with no block barrier, returning
    the reduced variable itself."""
    return set(cached(source, "warp_reducers", lambda: frozenset(_warp_reducers(source))))


def _warp_reducers(source: ParsedSource) -> set[str]:
    found: set[str] = set()
    steps = [s for s in shuffle_steps(source) if s.kinds <= {"xor", "down"}]
    exchanges = [s for s in exchange_steps(source) if s.kinds <= {"xor", "down"}]
    for function in source.functions:
        if not _value_function(source, function) or _calls_any(source, function, _SYNC):
            continue
        loops = [s.node for s in [*steps, *exchanges] if s.function.node == function.node]
        if loops and _returns_loop_result(source, function, loops):
            found.add(function.name)
    return found


def block_reduce_functions(source: ParsedSource) -> set[str]:
    """Device functions ``T f(T v, ...)`` that reduce over a block: a ``__syncthreads()``, and
    every return gives back the result of a warp-reduction helper."""
    return set(cached(source, "block_reducers", lambda: frozenset(_block_reducers(source))))


def _block_reducers(source: ParsedSource) -> set[str]:
    warp = warp_reduce_functions(source)
    found: set[str] = set()
    for function in source.functions:
        if not _value_function(source, function) or function.name in warp:
            continue
        if not _calls_any(source, function, _SYNC):
            continue
        bound = warp | _warp_template_params(source, function, warp)
        if _returns_warp_result(source, function, bound):
            found.add(function.name)
    return found


def _warp_template_params(source: ParsedSource, function: Function, warp: set[str]) -> set[str]:
    """The template parameters of ``function`` that stand for a warp reduction: every call
    that names one (``block_reduce<warp_max>(v)``) passes a warp-reduction helper there, or
    forwards a template parameter of its own caller (an overload with default arguments)."""
    bound = set()
    calls = analysis(source).call_graph.call_sites(function.name)
    for position, name in enumerate(function.template_params):
        passed = []
        for caller, call in calls:
            arguments = _template_arguments(source, call)
            if arguments is None or position >= len(arguments):
                passed = []
                break
            definition = source.function(caller)
            if definition is None or arguments[position] not in definition.template_params:
                passed.append(arguments[position])
        if passed and all(argument in warp for argument in passed):
            bound.add(name)
    return bound


def _template_arguments(source: ParsedSource, call: Node) -> list[str] | None:
    """The template arguments of ``f<a, b>(...)`` as written; None without any."""
    callee = call.child_by_field_name("function")
    if callee is None or callee.type != "template_function":
        return None
    arguments = callee.child_by_field_name("arguments")
    return [source.text_of(a) for a in arguments.named_children] if arguments else None


def _calls_any(source: ParsedSource, function: Function, names: frozenset[str]) -> bool:
    if function.body is None:
        return False
    return any(
        call_name(source, n) in names for n in inside(source, function.body, "call_expression")
    )


def _layout_bound(source: ParsedSource, function: Function) -> str | None:
    """Why a function depends on the thread layout (built-ins, barriers, shuffles, shared
    memory), or None."""
    if function.body is None:
        return None
    uses = builtin_uses(source, function.body)
    if uses:
        return f"uses {source.text_of(uses[0])} (line {source.line_of(uses[0].start_byte)})"
    for node in inside(source, function.body, "call_expression"):
        name = call_name(source, node)
        if name in _SYNC or name in _WARP_INTRINSICS:
            return f"calls {name} (line {source.line_of(node.start_byte)})"
    for declaration in source.shared_declarations:
        if within(declaration.node, function.body):
            return f"declares __shared__ {', '.join(declaration.names)}"
    return None


# ---------------------------------------------------------------------------------------------
# Thread per row (the naive form)
# ---------------------------------------------------------------------------------------------


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


@dataclass
class ThreadRows:
    """A thread-per-row kernel in canonical form, ready to be spread over a group."""

    kernel: Function
    index: Node
    """The row index's initial value, ``(int64_t)blockIdx.x * blockDim.x + threadIdx.x``."""
    block_part: Node
    """The ``(int64_t)blockIdx.x`` operand in it."""
    bound: Node
    """The row count in the bound check ``if (r >= bound) return;``."""
    loops: list[RowLoop]
    stores: list[Node]
    """Statements outside loops that write memory (to be done by one thread per group)."""
    warps_2d: bool = False
    """The index is the thread's linear index in a 32 x y block (``block_part`` its row of
    warps): spread to a warp per row, the lanes are ``threadIdx.x`` and the block keeps its
    shape."""


def _global_thread_index(source: ParsedSource, node: Node) -> Node | None:
    """For ``blockIdx.x * blockDim.x + threadIdx.x`` (any order, casts allowed), the
    ``blockIdx.x`` operand (with its cast); None for anything else."""
    node = strip_parens(node)
    if node.type != "binary_expression" or _op(node) != "+":
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None:
        return None
    for product, thread in ((left, right), (right, left)):
        product = strip_parens(product)
        if not is_builtin(source, thread, "threadIdx") or product.type != "binary_expression":
            continue
        if _op(product) != "*":
            continue
        a, b = product.child_by_field_name("left"), product.child_by_field_name("right")
        for block, dim in ((a, b), (b, a)):
            if is_builtin(source, block, "blockIdx") and is_builtin(source, dim, "blockDim"):
                return block
    return None


def _op(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def _single_init(source: ParsedSource, node: Node) -> tuple[str, Node] | None:
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


def _bound_check(
    source: ParsedSource, node: Node | None, index: str, op: str = ">="
) -> Node | None:
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
    if test is None or test.type != "binary_expression" or _op(test) != op:
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


def _leading_constants(source: ParsedSource, statements: list[Node]) -> int:
    """How many statements at the start of a body only name compile-time integers (``const
    int U = 8;``, ``constexpr int kWarps = 4;``) or types (``using V = Packed128<float>;``),
    or assert the block's width (``assert(blockDim.x == 32)``, which the row layout checks):
    what may precede the row index."""
    constants: dict[str, int | str] = dict(source.integer_constants)
    count = 0
    for statement in statements:
        if statement.type in ("comment", "alias_declaration", "type_definition"):
            count += 1
            continue
        if _is_width_assert(source, statement):
            count += 1
            continue
        declared = _single_init(source, statement)
        qualifiers = {
            source.text_of(c)
            for c in statement.children
            if c.type in ("type_qualifier", "storage_class_specifier")
        }
        value = fold_int(source, declared[1], constants) if declared is not None else None
        if declared is None or value is None or not qualifiers & {"const", "constexpr"}:
            break
        constants[declared[0]] = value
        count += 1
    return count


def _is_width_assert(source: ParsedSource, statement: Node) -> bool:
    """``assert(blockDim.x == 32);`` as a statement of its own."""
    expression = _expression_of(statement)
    return expression is not None and block_width_asserts(source, statement) == [expression]


def thread_rows_shape(
    source: ParsedSource, kernel: Function
) -> tuple[str, Node, Node, Node] | None:
    """(index name, index value, blockIdx operand, bound) when a kernel starts like a
    thread-per-row kernel, after any compile-time constants; None otherwise (it is then no
    candidate at all). The index may be the thread's linear index in a 2-D block, whose
    "blockIdx operand" is then its row of warps (:func:`row_of_thread_2d`)."""
    if kernel.body is None:
        return None
    statements = named_statements(kernel.body)
    statements = statements[_leading_constants(source, statements) :]
    if len(statements) < 2:
        return None
    declared = _single_init(source, statements[0])
    if declared is None:
        return None
    name, value = declared
    block = _global_thread_index(source, value) or row_of_thread_2d(source, value)
    bound = _bound_check(source, statements[1], name)
    if block is None or bound is None:
        return None
    return name, value, block, bound


def thread_row_start(
    source: ParsedSource, kernel: Function, warps_2d: bool = False
) -> tuple[Node, Node, Node, list[Node]]:
    """(index value, blockIdx operand, bound, body statements from the row index on) of a
    kernel that starts like a thread-per-row kernel and ties nothing else to the thread
    layout; :class:`NotCanonical` otherwise. ``warps_2d``: the caller writes a warp per row
    back into a 32 x y block, so the thread's linear index in such a block is taken too."""
    shape = thread_rows_shape(source, kernel)
    if shape is None or kernel.body is None:
        raise NotCanonical(f"{kernel.name} does not start with a thread row index and its check")
    _, value, block, bound = shape
    statements = named_statements(kernel.body)
    first = _leading_constants(source, statements)
    exempt: list[Node] = []
    if row_of_thread_2d(source, value) is not None:
        if not warps_2d:
            raise NotCanonical(
                f"the row index of {kernel.name} is the thread's linear index in a 2-D block, "
                "which only a warp per row (lanes threadIdx.x) writes back; this rule needs "
                "blockIdx.x * blockDim.x + threadIdx.x"
            )
        # the block keeps its 32 x y shape, so an assert on its width still holds
        exempt = block_width_asserts(source, kernel.body)
    _check_thread_local(source, kernel, [statements[first], *exempt])
    return value, block, bound, statements[first:]


def thread_rows(source: ParsedSource, kernel: Function, group: Group = "block") -> ThreadRows:
    """The canonical thread-per-row analysis of a kernel, to be spread over ``group``;
    :class:`NotCanonical` says why not."""
    value, block, bound, statements = thread_row_start(source, kernel, group == "warp")
    warps_2d = row_of_thread_2d(source, value) is not None
    if warps_2d:
        _check_blocks_2d(source, kernel)
    walker = _ThreadWalker(source, kernel, group)
    for statement in statements[2:]:
        walker.statement(statement)
    if not any(loop.accumulators for loop in walker.loops):
        raise NotCanonical(f"{kernel.name} has no loop that reduces its row")
    walker.check_memory()
    return ThreadRows(kernel, value, block, bound, walker.loops, walker.stores, warps_2d)


def thread_row_walk(
    source: ParsedSource, kernel: Function, statements: list[Node], allowed: list[Node]
) -> tuple[list[RowLoop], list[Node]]:
    """(row loops, stores outside loops) of ``statements``, a thread-per-row kernel's code
    whose row index is spelled otherwise (the nodes ``allowed`` may use the thread layout);
    its loops may also run while ``c <= n`` (a causal row up to its diagonal). For forms
    that write a block per row back in another spelling; :class:`NotCanonical` says why not."""
    _check_thread_local(source, kernel, allowed)
    walker = _ThreadWalker(source, kernel, "block", inclusive=True)
    for statement in statements:
        walker.statement(statement)
    walker.check_memory()
    return walker.loops, walker.stores


def _check_blocks_2d(source: ParsedSource, kernel: Function) -> None:
    """A thread's linear index in a 2-D block becomes a warp's row only where every launch
    has a constant 32 x y block (the grid then shrinks by the 32 lanes of a row)."""
    launches = source.launches_of(kernel)
    if not launches:
        raise NotCanonical(f"no launch of {kernel.name} in this file to give a warp per row")
    for launch in launches:
        if block_threads_2d(source, launch) is None:
            text = source.text_of(launch.block) if launch.block is not None else "none"
            raise NotCanonical(
                f"the row index of {kernel.name} is the thread's linear index in a 2-D block, "
                f"but the launch at line {source.line_of(launch.node.start_byte)} has block "
                f"{text}; this rule needs a constant 32 x y block (lanes threadIdx.x)"
            )


def _check_thread_local(source: ParsedSource, kernel: Function, allowed: list[Node]) -> None:
    """Nothing but the row index (and the ``allowed`` statements) may depend on the thread
    layout."""
    assert kernel.body is not None
    for use in builtin_uses(source, kernel.body):
        if not any(within(use, node) for node in allowed):
            raise NotCanonical(
                f"{source.text_of(use)} is used outside the row index "
                f"(line {source.line_of(use.start_byte)})"
            )
    for declaration in source.shared_declarations:
        if within(declaration.node, kernel.body):
            raise NotCanonical(f"{kernel.name} already uses shared memory")
    calls = graph(source)
    for callee in sorted(calls.reachable(kernel.name)):
        for function in calls.functions(callee):
            why = _layout_bound(source, function)
            if why is not None:
                raise NotCanonical(f"{kernel.name} calls {callee}, which {why}")
    for node in inside(source, kernel.body, "call_expression"):
        called = call_name(source, node)
        if called in _SYNC or called in _WARP_INTRINSICS:
            raise NotCanonical(f"{kernel.name} calls {called}")


_SUM_OPS = frozenset({"+="})
_MAX_FUNCS: dict[str, Op] = {
    "fmaxf": "max",
    "max": "max",
    "fmax": "max",
    "fminf": "min",
    "min": "min",
    "fmin": "min",
}


class _ThreadWalker:
    """Walks a thread-per-row kernel's statements after the bound check."""

    def __init__(
        self, source: ParsedSource, kernel: Function, group: Group, *, inclusive: bool = False
    ) -> None:
        self.source = source
        self.kernel = kernel
        self.group = group
        self.inclusive = inclusive
        """Whether row loops may also run while ``c <= n``."""
        self.loops: list[RowLoop] = []
        self.stores: list[Node] = []
        self.store_targets: list[tuple[str, str, Node]] = []  # (base, index, node)
        self.loads: list[tuple[str, str, Node, bool]] = []  # (base, index, node, in loop)
        self.types = source.local_types(kernel)
        # locals of a loop body pointing into the loop's element (float* e = (float*)&o[c])
        self.element_pointers: set[str] = set()
        # loops that walk a split loop's row back: their start -> (variable, `c -= s`, V)
        self.walks_back: dict[int, tuple[str, Node, Node | None]] = {}

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    # -- scalar code ------------------------------------------------------------------------

    def statement(self, node: Node) -> None:
        kind = node.type
        if kind in ("comment",) or kind.startswith("preproc"):
            return
        if kind == "compound_statement":
            for child in named_statements(node):
                self.statement(child)
        elif kind == "declaration":
            self.reads(node, in_loop=False)
        elif kind == "expression_statement":
            self.scalar_expression(node)
        elif kind == "if_statement":
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=False)
            for branch in ("consequence", "alternative"):
                child = node.child_by_field_name(branch)
                if child is not None:
                    self.statement(
                        child.named_children[0] if child.type == "else_clause" else child
                    )
        elif kind == "return_statement":
            if node.named_children:
                raise NotCanonical(f"a kernel returns no value (line {self.line(node)})")
        elif kind == "for_statement":
            self.loop(node)
        else:
            raise NotCanonical(f"a {kind.replace('_', ' ')} at line {self.line(node)}")

    def scalar_expression(self, node: Node) -> None:
        if not node.named_children:
            return
        expression = node.named_children[0]
        if expression.type == "assignment_expression":
            left = expression.child_by_field_name("left")
            right = expression.child_by_field_name("right")
            assert left is not None and right is not None
            if left.type == "identifier":
                self.reads(right, in_loop=False)
                return
            self.store(node, left, loop=None)
            self.reads(right, in_loop=False)
            return
        if expression.type == "update_expression":
            argument = expression.child_by_field_name("argument")
            if argument is not None and argument.type == "identifier":
                return
        stored = _intrinsic_store(self.source, expression)
        if stored is not None:  # __stcs(mean + row, m): a store through a cache hint
            self.store(node, stored[0], loop=None)
            self.reads(stored[1], in_loop=False)
            return
        raise NotCanonical(
            f"the statement at line {self.line(node)} is not an assignment, so every thread "
            "of a group would repeat its effect"
        )

    def store(self, statement: Node, target: Node, loop: RowLoop | None) -> None:
        base, index = self._address(target)
        if loop is None:
            parent = statement.parent
            if parent is not None and parent.type == "if_statement":
                if parent.child_by_field_name("alternative") is not None:
                    raise NotCanonical(
                        f"the store at line {self.line(statement)} is a branch of an if/else; "
                        "brace it first"
                    )
            elif parent is None or parent.type != "compound_statement":
                raise NotCanonical(f"the store at line {self.line(statement)} is not in a block")
            self.stores.append(statement)
        elif (
            not _offset_by(self.source, target, loop.variable)
            and not self._element_store(target)
            and not self._clamped_store(target, loop)
        ):
            raise NotCanonical(
                f"the store at line {self.line(statement)} is not p[... + {loop.variable}], so two "
                "threads of a group could write one element"
            )
        self.store_targets.append((base, index, target))

    def _clamped_store(self, target: Node, loop: RowLoop) -> bool:
        """``p[min(n - 1, i + u)]`` in an unrolled loop (its guard makes the clamp a no-op)."""
        target = strip_parens(target)
        indices = target.child_by_field_name("indices")
        if loop.unrolled is None or target.type != "subscript_expression" or indices is None:
            return False
        return len(indices.named_children) == 1 and clamped_element(
            self.source, indices.named_children[0], loop.unrolled
        )

    def _points_into_element(self, declaration: Node, variable: str) -> bool:
        """``T* e = (T*)&out[c];``: the address of the loop's element, nothing else."""
        addresses = [
            n
            for n in inside(self.source, declaration, "pointer_expression")
            if self.source.text_of(n).startswith("&")
        ]
        for address in addresses:
            argument = strip_parens(address.child_by_field_name("argument") or address)
            if argument.type == "subscript_expression" and _offset_by(
                self.source, argument, variable
            ):
                return len(addresses) == 1
        return False

    def _element_store(self, target: Node) -> bool:
        """``e[2] = v`` through a pointer into this thread's element: a constant index."""
        target = strip_parens(target)
        base = target.child_by_field_name("argument")
        indices = target.child_by_field_name("indices")
        if target.type != "subscript_expression" or base is None or indices is None:
            return False
        return (
            self.source.text_of(base) in self.element_pointers
            and bool(indices.named_children)
            and fold_int(self.source, indices.named_children[0]) is not None
        )

    def _address(self, target: Node) -> tuple[str, str]:
        target = strip_parens(target)
        packed = packed_deref(self.source, target)
        if packed is not None:  # *reinterpret_cast<float4*>(p + c): p[c] a vector wide
            return packed.pointer, " ".join(self.source.text_of(packed.index).split())
        if target.type == "subscript_expression":
            base = target.child_by_field_name("argument")
            indices = target.child_by_field_name("indices")
            if base is not None and base.type == "identifier" and indices is not None:
                return self.source.text_of(base), " ".join(self.source.text_of(indices).split())
        if target.type == "pointer_expression":
            return "*", " ".join(self.source.text_of(target).split())
        offset = pointer_offset(self.source, target)
        if offset is not None:
            return offset[0], " ".join(self.source.text_of(offset[1]).split())
        raise NotCanonical(
            f"the store to {self.source.text_of(target)} (line {self.line(target)}) is not p[index]"
        )

    def reads(self, node: Node, in_loop: bool) -> None:
        for call in inside(self.source, node, "call_expression"):
            access = vector_access(self.source, call)
            if access is not None and access.kind == "load":  # load128(x + c): a packed load
                index = " ".join(self.source.text_of(access.index).split())
                self.loads.append((access.pointer, index, call, in_loop))
                continue
            arguments = arguments_of(call)
            if call_name(self.source, call) in _LOAD_INTRINSICS and len(arguments) == 1:
                offset = pointer_offset(self.source, strip_parens(arguments[0]))
                if offset is not None:  # __ldcs(x + c): a load through a cache hint
                    index = " ".join(self.source.text_of(offset[1]).split())
                    self.loads.append((offset[0], index, call, in_loop))
        for read in inside(self.source, node, "subscript_expression", "pointer_expression"):
            if read.type == "pointer_expression" and not self.source.text_of(read).startswith("*"):
                continue
            try:
                base, index = self._address(read)
            except NotCanonical:
                continue
            self.loads.append((base, index, read, in_loop))

    # -- loops ------------------------------------------------------------------------------

    def loop(self, node: Node) -> None:
        found = self.source.loop_at(node)
        if found is not None and found.initializer is None and node.start_byte in self.walks_back:
            variable, move, _ = self.walks_back[node.start_byte]
            self.row_loop(node, found, variable, move, down=True)
            return
        start = self.split_start(node, found) if found is not None else None
        if found is None or (found.variable is None and start is None):
            raise NotCanonical(f"the loop at line {self.line(node)} is not for (T c = 0; ...)")
        if start is None:
            assert found.initializer is not None
            declared = _single_init(self.source, found.initializer)
            start = declared[1] if declared is not None else None
        variable = found.variable or self.source.text_of(_below_name(found.condition))
        if start is None or not is_zero_literal(self.source, start):
            raise NotCanonical(f"the loop at line {self.line(node)} does not start at 0")
        if not _below(self.source, found.condition, variable, self.inclusive):
            bounds = f"{variable} < n" + (f" or {variable} <= n" if self.inclusive else "")
            raise NotCanonical(f"the loop at line {self.line(node)} does not run while {bounds}")
        self.row_loop(node, found, variable, start)

    def split_start(self, node: Node, found: Loop) -> Node | None:
        """The start of ``T c = 0; for (; c < n; ...)``, declared right before the loop."""
        if found.initializer is not None or found.condition is None:
            return None
        name = _below_name(found.condition)
        return split_start(self.source, node, self.source.text_of(name)) if name else None

    def row_loop(
        self, node: Node, found: Loop, variable: str, start: Node, down: bool = False
    ) -> None:
        unrolled, unit = None, None
        if down:
            unit = self.walks_back[node.start_byte][2]
            if unit is not None:  # its packed accesses move as many elements as its step
                self.packed_step(found, variable, "-=")
        elif not _unit_step(self.source, found.update, variable):
            unit = self.packed_step(found, variable, "+=")
            if unit is None and found.variable is None:
                raise NotCanonical(
                    f"the loop at line {self.line(node)} declares {variable} before it and steps "
                    "by neither 1 nor a packed vector (a constant V, with the loop's every use "
                    f"of {variable} the address of a packed load or store of V elements)"
                )
            if unit is None:
                unrolled = self.unrolled(found, start)
        if node.parent is None or node.parent.type != "compound_statement":
            raise NotCanonical(f"the loop at line {self.line(node)} is not directly in a block")
        if found.initializer is None and not down:
            if self.group == "block":  # the block's removal reads no split walk back
                raise NotCanonical(
                    f"the loop at line {self.line(node)} declares {variable} before it; this "
                    f"rule writes that form back for a warp per row only (for (T {variable} = "
                    "0; ...) for a block)"
                )
            step = self.source.text_of(unit) if unit is not None else "1"
            try:
                back = walk_back(
                    self.source,
                    node,
                    variable,
                    lambda m: steps_down(self.source, m, variable, step),
                    step,
                )
            except StepFormError as why:
                raise NotCanonical(str(why)) from None
            if back is not None:
                self.walks_back[back[1].start_byte] = (variable, back[0], unit)
        assert found.update is not None and found.body is not None
        loop = RowLoop(node, variable, start, found.update, unrolled=unrolled, unit=unit, down=down)
        local: set[str] = {variable}
        self_reads: set[tuple[int, int]] = set()
        self.loop_body(found.body, loop, local, self_reads)
        self.check_accumulators(loop, self_reads)
        self.loops.append(loop)

    def packed_step(self, found: Loop, variable: str, op: str) -> Node | None:
        try:
            return packed_step(self.source, self.kernel, found, variable, op)
        except StepFormError as why:
            raise NotCanonical(f"the loop at line {self.line(found.node)}: {why}") from None

    def unrolled(self, found: Loop, start: Node) -> UnrolledLoop:
        """A row loop stepping by more than 1: the hand-unrolled form, else refused."""
        line = self.line(found.node)
        try:
            indices = analysis(self.source).indices(self.kernel)
            unrolled = thread_unrolled_loop(self.source, found, start, indices)
        except UnrolledFormError as why:
            raise NotCanonical(
                f"the loop at line {line} is not {found.variable} < n with a step of 1, nor "
                f"unrolled by hand: {why}; {_THREAD_UNROLLED_FORM}"
            ) from None
        if unrolled is None:
            raise NotCanonical(
                f"the loop at line {line} is not {found.variable} < n with a step of 1, and its "
                f"step is not a constant; {_THREAD_UNROLLED_FORM}"
            )
        return unrolled

    def loop_body(
        self, node: Node, loop: RowLoop, local: set[str], self_reads: set[tuple[int, int]]
    ) -> None:
        kind = node.type
        if kind == "compound_statement":
            for child in named_statements(node):
                self.loop_body(child, loop, local, self_reads)
        elif kind == "for_statement" and loop.unrolled is not None and node in loop.unrolled.inner:
            inner = self.source.loop_at(node)  # the loop over u: its variable is the slot
            assert inner is not None and inner.body is not None
            local.add(inner.variable or "")
            self.loop_body(inner.body, loop, local, self_reads)
        elif kind == "for_statement" and self.inner_loop(node, local):
            inner = self.source.loop_at(node)  # over a packed vector's elements, say
            assert inner is not None and inner.body is not None
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=True)
            self.loop_body(inner.body, loop, local, self_reads)
        elif kind == "preproc_call" and self.source.text_of(node).split()[:2] == [
            "#pragma",
            "unroll",
        ]:
            return
        elif kind == "declaration":
            local.update(n for n in declaration_names(self.source, node))
            if self._points_into_element(node, loop.variable):
                self.element_pointers.update(declaration_names(self.source, node))
            self.reads(node, in_loop=True)
        elif kind == "expression_statement":
            self.loop_expression(node, loop, local, self_reads)
        elif kind == "if_statement":
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=True)
            for branch in ("consequence", "alternative"):
                child = node.child_by_field_name(branch)
                if child is not None:
                    inner = child.named_children[0] if child.type == "else_clause" else child
                    self.loop_body(inner, loop, local, self_reads)
        elif kind == "comment":
            return
        else:
            raise NotCanonical(
                f"the {kind.replace('_', ' ')} at line {self.line(node)} inside a row loop"
            )

    def loop_expression(
        self, node: Node, loop: RowLoop, local: set[str], self_reads: set[tuple[int, int]]
    ) -> None:
        expression = node.named_children[0] if node.named_children else None
        if expression is not None and expression.type == "update_expression":
            argument = expression.child_by_field_name("argument")
            if argument is not None and self.source.text_of(argument) in local:
                return
        stored = _intrinsic_store(self.source, expression) if expression is not None else None
        if stored is not None:  # __stcs(o + c, v): the loop's element through a cache hint
            self.store(node, stored[0], loop)
            self.reads(stored[1], in_loop=True)
            return
        if expression is None or expression.type != "assignment_expression":
            raise NotCanonical(f"the statement at line {self.line(node)} in a row loop")
        left = expression.child_by_field_name("left")
        right = expression.child_by_field_name("right")
        assert left is not None and right is not None
        if left.type != "identifier" and not self._local_array(left, local):
            self.store(node, left, loop)
            self.reads(right, in_loop=True)
            return
        name = self.source.text_of(left)
        if name in local or left.type != "identifier":
            self.reads(right, in_loop=True)
            return
        op, self_read = self.accumulation(expression, name)
        if loop.accumulators.get(name, op) != op:
            raise NotCanonical(f"{name} is reduced with two operations in one loop")
        loop.accumulators[name] = op
        if self_read is not None:
            self_reads.add((self_read.start_byte, self_read.end_byte))
        self.reads(right, in_loop=True)

    def inner_loop(self, node: Node, local: set[str]) -> bool:
        """``for (int k = 0; k < m; ++k)`` inside a row loop: its variable declared in its
        header and the only name its update writes (it then joins the loop's locals)."""
        inner = self.source.loop_at(node)
        if inner is None or inner.variable is None or inner.body is None:
            return False
        if inner.initializer is None or inner.initializer.type != "declaration":
            return False
        update = strip_parens(inner.update) if inner.update is not None else None
        target = None
        if update is not None:
            target = update.child_by_field_name("left") or update.child_by_field_name("argument")
        if target is None or self.source.text_of(target) != inner.variable:
            return False
        local.add(inner.variable)
        return True

    def _local_array(self, target: Node, local: set[str]) -> bool:
        """``a[k]`` with ``a`` an array (or ``v[k]``, ``v.x`` with ``v`` a packed vector,
        ``float4 v``) the loop body declares: registers of this thread."""
        target = strip_parens(target)
        base = target.child_by_field_name("argument")
        operator = target.child_by_field_name("operator")
        member = target.type == "field_expression" and operator is not None and operator.type == "."
        if target.type != "subscript_expression" and not member:
            return False
        if base is None or base.type != "identifier":
            return False
        kind = self.types.get(self.source.text_of(base), "")
        if self.source.text_of(base) not in local or "*" in kind:
            return False
        return kind.endswith("[]") or analysis(self.source).vectors.packed(kind) is not None

    def accumulation(self, expression: Node, name: str) -> tuple[Op, Node | None]:
        """(operation, the node reading the accumulator itself) of ``acc op= e``."""
        right = expression.child_by_field_name("right")
        assert right is not None
        operator = _op(expression)
        if operator in _SUM_OPS:
            return "sum", None
        value = strip_parens(right)
        if operator == "=" and value.type == "binary_expression" and _op(value) == "+":
            for side in ("left", "right"):
                operand = value.child_by_field_name(side)
                if operand is not None and self.source.text_of(strip_parens(operand)) == name:
                    return "sum", operand
        if operator == "=" and value.type == "call_expression":
            function = call_name(self.source, value)
            args = arguments_of(value)
            if function in FMA_CALLS and len(args) == 3:
                # acc = fmaf(a, b, acc): a sum of products, acc read only as the addend
                own = [
                    n
                    for arg in args[:2]
                    for n in inside(self.source, arg, "identifier")
                    if self.source.text_of(n) == name
                ]
                if self.source.text_of(strip_parens(args[2])) == name and not own:
                    return "sum", args[2]
            if function in _MAX_FUNCS and len(args) == 2:
                for arg in args:
                    if self.source.text_of(strip_parens(arg)) == name:
                        return _MAX_FUNCS[function], arg
            if plain_type(self.types.get(name, "")) != "float":
                own = [
                    n
                    for n in inside(self.source, value, "identifier")
                    if self.source.text_of(n) == name
                ]
                if len(own) == 1:  # acc = push(push(acc, v.x), v.y): a merge of a user type
                    return "merge", own[0]
        raise NotCanonical(
            f"the loop assigns {name} at line {self.line(expression)}, which is not a sum, a "
            "max or a min of it"
        )

    def check_accumulators(self, loop: RowLoop, self_reads: set[tuple[int, int]]) -> None:
        body = loop.node.child_by_field_name("body")
        assert body is not None
        for node in inside(self.source, body, "identifier"):
            name = self.source.text_of(node)
            if name not in loop.accumulators:
                continue
            parent = node.parent
            is_target = (
                parent is not None
                and parent.type == "assignment_expression"
                and parent.child_by_field_name("left") == node
            )
            if is_target or (node.start_byte, node.end_byte) in self_reads:
                continue
            raise NotCanonical(
                f"the loop at line {self.line(loop.node)} reads {name} while reducing into it "
                f"(line {self.line(node)}): a running value, not a reduction"
            )
        for name, op in loop.accumulators.items():
            if op == "merge":
                continue  # its merge and identity come with the carried reduction
            if plain_type(self.types.get(name, "")) != "float":
                raise NotCanonical(f"{name} is not a float (only float reductions are emitted)")
            if op == "sum":
                self.check_starts_at_zero(name, loop.node)

    def check_starts_at_zero(self, name: str, loop: Node) -> None:
        """A sum split over threads is right only when every thread starts from zero."""
        assert self.kernel.body is not None
        declaration = None
        for node in inside(self.source, self.kernel.body, "declaration"):
            declared = _single_init(self.source, node)
            if declared is not None and declared[0] == name and node.end_byte <= loop.start_byte:
                declaration = (node, declared[1])
        if declaration is None or not is_zero_literal(self.source, declaration[1]):
            raise NotCanonical(
                f"the sum {name} does not start from a zero literal, so each thread of a group "
                "would add its start value"
            )
        start = declaration[0].end_byte
        for node in self.source.iter_nodes("assignment_expression", "update_expression"):
            if not (start <= node.start_byte < loop.start_byte):
                continue
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and self.source.text_of(target) == name:
                raise NotCanonical(f"{name} is written before its loop (line {self.line(node)})")

    def check_memory(self) -> None:
        """Threads of a group see each other's stores only at the same index in the same
        pattern of loops, so memory that is written is read back only that way."""
        stored = {(base, index) for base, index, _ in self.store_targets}
        bases = {base for base, _ in stored}
        for base, index, node, in_loop in self.loads:
            if base not in bases:
                continue
            if not in_loop or (base, index) not in stored:
                raise NotCanonical(
                    f"{base}[{index}] is read at line {self.line(node)} but written elsewhere "
                    "in the kernel, by another thread of the group"
                )
            self.check_clamped_read(base, index, node)

    def check_clamped_read(self, base: str, index: str, node: Node) -> None:
        """``p[min(n - 1, i + u)]`` read back in an unrolled loop: past the row's end every
        thread reads ``p[n - 1]``, which another thread of the group wrote; that is the value
        a thread per row reads only when a group reduction (a barrier) lies between the
        store and the read."""
        reader = next((i for i, loop in enumerate(self.loops) if within(node, loop.node)), None)
        subscript = strip_parens(node)
        inner = subscript.child_by_field_name("indices")
        unrolled = self.loops[reader].unrolled if reader is not None else None
        if unrolled is None or inner is None or len(inner.named_children) != 1:
            return
        if not clamped_element(self.source, inner.named_children[0], unrolled):
            return
        for stored_base, stored_index, target in self.store_targets:
            if (stored_base, stored_index) != (base, index):
                continue
            writer = next(
                (i for i, loop in enumerate(self.loops) if within(target, loop.node)), None
            )
            assert reader is not None
            if self.group != "block":
                raise NotCanonical(
                    f"{self.source.text_of(node)} at line {self.line(node)} reads the row's last "
                    f"element past its end, which another lane writes at line {self.line(target)}; "
                    "shuffles are no memory barrier, so this rule needs a block"
                )
            if writer is None or not any(loop.accumulators for loop in self.loops[writer:reader]):
                raise NotCanonical(
                    f"{self.source.text_of(node)} at line {self.line(node)} reads the row's last "
                    "element past its end, which another thread of the group writes at line "
                    f"{self.line(target)} with no group reduction (barrier) in between"
                )


_LOAD_INTRINSICS = frozenset({"__ldg", "__ldcs", "__ldcg", "__ldca", "__ldlu", "__ldcv"})
"""Loads through a cache hint (the stores are :data:`STORE_INTRINSICS`)."""


def _intrinsic_store(source: ParsedSource, expression: Node) -> tuple[Node, Node] | None:
    """(address, value) of ``__stcs(address, value)`` and its kin (or a packed store helper
    of the file) whose address is ``p + index``; None for anything else."""
    access = vector_access(source, expression)
    if access is not None and access.kind == "store" and access.value is not None:
        return access.address, access.value  # store128(p + i, v): a packed store helper
    if expression.type != "call_expression" or call_name(source, expression) not in (
        STORE_INTRINSICS
    ):
        return None
    arguments = arguments_of(expression)
    if len(arguments) != 2 or pointer_offset(source, strip_parens(arguments[0])) is None:
        return None
    return strip_parens(arguments[0]), arguments[1]


def _offset_by(source: ParsedSource, target: Node, variable: str) -> bool:
    """Whether a store ``p[index]`` has ``index = variable`` or ``... + variable + ...`` with
    the variable nowhere else: each iteration then writes its own element."""
    target = strip_parens(target)
    packed = packed_deref(source, target)
    if packed is not None:  # *reinterpret_cast<float4*>(p + index)
        target = packed.address
    indices = (
        target.child_by_field_name("indices") if target.type == "subscript_expression" else None
    )
    offset = pointer_offset(source, target) if indices is None else None
    if offset is not None:
        terms = [offset[1]]
    elif indices is None or len(indices.named_children) != 1:
        return False
    else:
        terms = [indices.named_children[0]]
    found = 0
    while terms:
        term = strip_parens(terms.pop())
        if term.type == "binary_expression" and _op(term) == "+":
            terms += [
                c
                for c in (term.child_by_field_name("left"), term.child_by_field_name("right"))
                if c
            ]
            continue
        if term.type == "identifier" and source.text_of(term) == variable:
            found += 1
        elif any(source.text_of(n) == variable for n in inside(source, term, "identifier")):
            return False
    return found == 1


def _unit_step(source: ParsedSource, update: Node | None, variable: str) -> bool:
    if update is None:
        return False
    text = source.text_of(update).replace(" ", "")
    return text in (f"++{variable}", f"{variable}++", f"{variable}+=1")


def _expression_of(statement: Node) -> Node | None:
    """The expression of an expression statement."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    return statement.named_children[0]


def _below_name(condition: Node | None) -> Node | None:
    """The ``c`` of a loop condition ``c < n``."""
    if condition is None:
        return None
    condition = strip_parens(condition)
    return condition.child_by_field_name("left") if condition.type == "binary_expression" else None


def _below(
    source: ParsedSource, condition: Node | None, variable: str, inclusive: bool = False
) -> bool:
    """``variable < n`` (or ``variable <= n`` when ``inclusive``)."""
    if condition is None:
        return False
    condition = strip_parens(condition)
    left = condition.child_by_field_name("left")
    return (
        condition.type == "binary_expression"
        and _op(condition) in (("<", "<=") if inclusive else ("<",))
        and left is not None
        and source.text_of(left) == variable
    )


# ---------------------------------------------------------------------------------------------
# Thread per row -> group per row (application)
# ---------------------------------------------------------------------------------------------

_RANK = {"block": "threadIdx.x", "warp": "threadIdx.x & 31"}
_SIZE = {"block": "blockDim.x", "warp": "32"}
_FIRST = {"block": "threadIdx.x == 0", "warp": "(threadIdx.x & 31) == 0"}


def _group_stride(source: ParsedSource, kernel: str, group: Group, block_size: int) -> str:
    """What a row loop strides by: a template parameter that equals ``block_size`` in every
    instantiation (``kThreads``) when the kernel has one, so the stride stays a compile-time
    constant as an expert writes it; else ``blockDim.x`` (or 32 for a warp)."""
    if group != "block":
        return _SIZE[group]
    bindings = template_values(source, kernel) or [{}]
    names = [n for n in bindings[0] if all(b.get(n) == block_size for b in bindings)]
    names.sort(key=lambda n: not re.search("thread|block", n, re.IGNORECASE))
    return names[0] if names else _SIZE[group]


@dataclass(frozen=True)
class MergeReduction:
    """An inline block reduction of a user-typed accumulator, as written in a group-per-row
    kernel: what a round trip carries to spread that accumulator again."""

    variable: str
    text: str
    """The statements from the first warp merge to the last, their common indentation removed."""
    scratch: str
    """The ``__shared__`` declaration they publish through."""


def merge_reductions(source: ParsedSource, kernel: Function) -> list[MergeReduction]:
    """The inline block reductions of ``kernel`` over accumulators that are not floats."""
    if kernel.body is None:
        return []
    finder = _InlineReductions(source, kernel.body)
    types = source.local_types(kernel)
    shared = [d for d in source.shared_declarations if within(d.node, kernel.body)]
    found: list[MergeReduction] = []
    for block in inside(source, kernel.body, "compound_statement"):
        statements = named_statements(block)
        for index, first in enumerate(statements):
            try:
                end = finder.run_end(statements, index)
            except NotCanonical:
                continue
            variable = finder.warp_step(first)
            if end is None or variable is None or plain_type(types.get(variable, "")) == "float":
                continue
            lines = source.text_of((first.start_byte, statements[end].end_byte)).split("\n")
            base = first.start_byte - source.line_start(first.start_byte)
            text = "\n".join(
                [
                    lines[0],
                    *(line[base:] if not line[:base].strip() else line for line in lines[1:]),
                ]
            )
            used = [d for d in shared if any(re.search(rf"\b{n}\b", text) for n in d.names)]
            if len(used) == 1:
                found.append(MergeReduction(variable, text, source.text_of(used[0].node)))
    return found


def _merge_point(source: ParsedSource, rows: ThreadRows, loops: list[RowLoop], name: str) -> Node:
    """Where the carried reduction of ``name`` goes: after its one loop, or after the one
    statement of the kernel body that holds all its loops (the branches of ``if (kAligned)``),
    provided nothing in that statement reads ``name`` after a loop."""
    assert rows.kernel.body is not None
    if len(loops) == 1:
        return loops[0].node
    tops: dict[tuple[int, int], Node] = {}
    for loop in loops:
        node = loop.node
        while node.parent is not None and node.parent != rows.kernel.body:
            node = node.parent
        tops[(node.start_byte, node.end_byte)] = node
    if len(tops) != 1:
        raise NotCanonical(f"the loops that accumulate {name} are not in one statement")
    (top,) = tops.values()
    covered = [(loop.node.start_byte, loop.node.end_byte) for loop in loops]
    for node in inside(source, top, "identifier"):
        outside = not any(a <= node.start_byte < b for a, b in covered)
        if (
            source.text_of(node) == name
            and outside
            and any(node.start_byte >= b for _, b in covered)
        ):
            raise NotCanonical(
                f"{name} is read at line {source.line_of(node.start_byte)}, after a loop "
                "that accumulates it and before the statement ends"
            )
    return top


def _merge_edits(
    source: ParsedSource, rows: ThreadRows, after: Node, name: str, merges: list[MergeReduction]
) -> list[Edit]:
    """The carried reduction of ``name`` after ``after`` (its loop, or the statement holding
    its loops), checked to start from the identity the accumulator is initialized with."""
    carried = next((m for m in merges if m.variable == name), None)
    if carried is None:
        raise NotCanonical(
            f"the loop at line {source.line_of(after.start_byte)} accumulates {name} with a "
            "call, not a sum, a max or a min: combining the threads' values needs its merge, "
            "which only a carried block reduction gives (a round trip)"
        )
    assert rows.kernel.body is not None
    for node in inside(source, rows.kernel.body, "declaration"):
        if node.end_byte > after.start_byte:
            break
        initialized = _single_init(source, node)
        if initialized is not None and initialized[0] == name:
            start = source.text_of(initialized[1])
            if " ".join(start.split()) not in " ".join(carried.text.split()):
                raise NotCanonical(
                    f"{name} starts from {start}, which the carried reduction does not use as its "
                    "identity, so each thread of a group would add its start value"
                )
    indent = source.indent_of(after.start_byte)
    body = carried.text.replace("\n", "\n" + indent)
    return [Edit.insert(after.end_byte, f"\n{indent}{body}")]


def spread_rows(
    source: ParsedSource,
    rows: ThreadRows,
    group: Group,
    block_size: int,
    merges: list[MergeReduction] | None = None,
) -> list[Edit]:
    """The edits that give each row of a canonical thread-per-row kernel to a block (or a
    warp) of ``block_size`` threads. User-typed accumulators (``merge``) need their block
    reduction in ``merges``."""
    edits: list[Edit] = []
    rank, first = _RANK[group], _FIRST[group]
    if rows.warps_2d:  # back to the row of the thread's warp; the lanes are threadIdx.x
        edits.append(Edit.replace(rows.index, source.text_of(rows.block_part)))
        rank, first = "threadIdx.x", "threadIdx.x == 0"
        block_size = max(_blocks_2d(source, rows))
    elif group == "block":
        edits.append(Edit.replace(rows.index, source.text_of(rows.block_part)))
    else:
        edits.append(Edit.replace(rows.index, f"({source.text_of(rows.index)}) >> 5"))
    ops: list[str] = []
    stride = _group_stride(source, rows.kernel.name, group, block_size)
    for loop in rows.loops:
        if loop.down:  # `c -= s` before the walk back and its step: by the group's s
            step = f"{loop.variable} -= {_scaled(source, stride, loop.unit)}"
            edits += [Edit.replace(loop.start, step), Edit.replace(loop.update, step)]
        else:
            edits.append(Edit.replace(loop.start, _scaled(source, rank, loop.unit)))
            edits += _strided_update(source, loop, stride)
        indent = source.indent_of(loop.node.start_byte)
        lines = "".join(
            f"\n{indent}{name} = {group}_reduce_{op}({name});"
            for name, op in loop.accumulators.items()
            if op != "merge"
        )
        if lines:
            edits.append(Edit.insert(loop.node.end_byte, lines))
        ops += [op for op in loop.accumulators.values() if op not in ops and op != "merge"]
    merged = {n for loop in rows.loops for n, op in loop.accumulators.items() if op == "merge"}
    for name in sorted(merged):
        if group != "block":
            raise NotCanonical(f"{name} is a user-typed merge; only a block carries one")
        loops = [loop for loop in rows.loops if loop.accumulators.get(name) == "merge"]
        edits += _merge_edits(
            source, rows, _merge_point(source, rows, loops, name), name, merges or []
        )
    assert rows.kernel.body is not None
    inner = source.indent_of(named_statements(rows.kernel.body)[0].start_byte)
    for scratch in sorted({m.scratch for m in merges or [] if m.variable in merged}):
        edits.append(Edit.insert(rows.kernel.body.start_byte + 1, f"\n{inner}{scratch}"))
    for store in rows.stores:
        edits.append(Edit.insert(store.start_byte, f"if ({first}) "))
    _check_launch_bounds(source, rows.kernel, block_size)
    edits += _launch_edits_to_groups(source, rows, group, block_size)
    edits += helper_insertions(source, rows.kernel, group, ops)
    return edits


def _scaled(source: ParsedSource, text: str, unit: Node | None) -> str:
    """``text * V`` for a packed step ``V`` (``text`` alone without one)."""
    if unit is None:
        return text
    left = text if re.match(r"^[\w.:]+$", text) else f"({text})"
    right = source.text_of(unit)
    return f"{left} * {right if precedence(strip_parens(unit)) >= PRIMARY else f'({right})'}"


def _blocks_2d(source: ParsedSource, rows: ThreadRows) -> list[int]:
    """The threads of each launch's 32 x y block (:func:`_check_blocks_2d` checked them)."""
    found = [block_threads_2d(source, la) for la in source.launches_of(rows.kernel)]
    return [threads for threads in found if threads is not None]


def _strided_update(source: ParsedSource, loop: RowLoop, stride: str) -> list[Edit]:
    """The step of a loop spread over the group: the group's size (times a packed step), or
    for a loop unrolled by hand ``stride * U`` with each ``i + u`` now ``i + u * stride`` (the
    group's threads take turns inside each run of ``U`` group-sized slots)."""
    if loop.unrolled is None:
        return [
            Edit.replace(loop.update, f"{loop.variable} += {_scaled(source, stride, loop.unit)}")
        ]
    step = loop.unrolled.update.child_by_field_name("right")
    factor = loop.unrolled.factor
    if step is None or precedence(strip_parens(step)) < PRIMARY:
        factor = f"({factor})"
    edits = [Edit.replace(loop.update, f"{loop.variable} += {stride} * {factor}")]
    for slot, _ in loop.unrolled.slots:
        edits.append(Edit.replace(slot, f"{source.text_of(slot)} * {stride}"))
    return edits


def _check_launch_bounds(source: ParsedSource, kernel: Function, block_size: int) -> None:
    """A launch larger than the kernel's ``__launch_bounds__`` would fail."""
    if kernel.launch_bounds is None:
        return
    args = [a for a in kernel.launch_bounds.named_children if a.type != "comment"]
    # a template kernel's bound (``kThreads``) is checked in every instantiation
    bindings = template_values(source, kernel.name) or [{}]
    values = [
        fold_int(source, args[0], {**source.integer_constants, **b}) if args else None
        for b in bindings
    ]
    bound = None if None in values else min(v for v in values if v is not None)
    if bound is None:
        raise NotCanonical(
            f"{kernel.name} has __launch_bounds__ that do not fold to a number; the new block "
            "size could break them"
        )
    if block_size > bound:
        raise NotCanonical(f"block_size={block_size} exceeds __launch_bounds__({bound})")


def _launch_edits_to_groups(
    source: ParsedSource, rows: ThreadRows, group: Group, block_size: int
) -> list[Edit]:
    launches = source.launches_of(rows.kernel)
    if not launches:
        raise NotCanonical(f"no launch of {rows.kernel.name} in this file to give a group per row")
    edits = []
    for launch in launches:
        grid, block = launch.grid, launch.block
        if grid is None or block is None:
            raise NotCanonical(f"the launch at line {source.line_of(launch.node.start_byte)}")
        count = _row_count(source, rows.kernel, launch, rows.bound)
        # a 32 x y block keeps its shape: a row for each of its y warps
        threads = block_threads_2d(source, launch) if rows.warps_2d else None
        if group == "block":
            text = f"(unsigned){count}" if _primary_text(count) else f"(unsigned)({count})"
        else:
            warps = (threads or block_size) // WARP_SIZE
            text = f"(unsigned)(({_numerator(count)} + {warps - 1}) / {warps})"
        edits.append(Edit.replace(grid, text))
        if threads is None:
            edits.append(Edit.replace(block, str(block_size)))
    # a grid size computed only for the old launch (`blocks`) would be left unused
    return edits + orphaned_declarations(
        source, [launch.grid for launch in launches if launch.grid]
    )


def _primary_text(text: str) -> bool:
    return re.match(r"^[A-Za-z_]\w*$", text) is not None


def _numerator(count: str) -> str:
    """``count`` ready to have a number added: parenthesized unless it is names joined by
    ``*`` and ``+``."""
    return count if re.match(r"^[\w\s*+]+$", count) else f"({count})"


def _row_count(source: ParsedSource, kernel: Function, launch: Launch, bound: Node) -> str:
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


# ---------------------------------------------------------------------------------------------
# Group per row (block or warp): the optimized form, and its removal
# ---------------------------------------------------------------------------------------------


@dataclass
class GroupRows:
    """A group-per-row kernel, analysed for the rewrite to thread per row."""

    kernel: Function
    group: Group
    edits: list[Edit]
    removed: list[tuple[int, int]]
    """Byte ranges the rewrite deletes (to tell which helpers become unused)."""


class _InlineReductions:
    """Recognizes a group reduction written inline::

    v = warp_sum(v);                        // a warp-reduction helper, every lane
    const int lane = threadIdx.x & 31;      // rank variables (unused afterwards)
    if (lane == 0) scratch[warp] = v;       // publish one value per warp
    __syncthreads();
    v = lane < kWarps ? scratch[lane] : 0;  // reload
    v = warp_sum(v);                        // reduce the warps' values
    __syncthreads();                        // (optional: scratch reused)
    """

    def __init__(self, source: ParsedSource, body: Node) -> None:
        self.source = source
        self.body = body
        self.warp_reducers = warp_reduce_functions(source)
        self.shared = {
            name for d in source.shared_declarations if within(d.node, body) for name in d.names
        }

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    def any_run(self) -> bool:
        """Whether the body holds such a run anywhere (detection)."""
        for block in inside(self.source, self.body, "compound_statement"):
            statements = named_statements(block)
            for index in range(len(statements)):
                try:
                    if self.run_end(statements, index) is not None:
                        return True
                except NotCanonical:
                    return True
        return False

    def run_end(self, statements: list[Node], start: int) -> int | None:
        """The index of the last statement of a reduction run starting at ``start``."""
        variable = self.warp_step(statements[start])
        if variable is None:
            return None
        synced = False
        declared: list[str] = []
        for index in range(start + 1, len(statements)):
            statement = statements[index]
            if self.warp_step(statement) == variable:
                if not synced:
                    return None
                following = statements[index + 1 :]
                if following and _is_call_statement(self.source, following[0], _SYNC):
                    index += 1
                self.check_unused_after(declared, statements[index + 1 :])
                return index
            if _is_call_statement(self.source, statement, _SYNC):
                synced = True
                continue
            if statement.type == "declaration" and builtin_uses(self.source, statement):
                declared += declaration_names(self.source, statement)
                continue
            if self.publishes(statement, variable) or self.reloads(statement, variable):
                continue
            return None
        return None

    def warp_step(self, statement: Node) -> str | None:
        """``v = warp_fn(v);`` -> ``v``."""
        if statement.type != "expression_statement" or not statement.named_children:
            return None
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression" or _op(assignment) != "=":
            return None
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        if left is None or right is None or right.type != "call_expression":
            return None
        if call_name(self.source, right) not in self.warp_reducers:
            return None
        args = arguments_of(right)
        name = self.source.text_of(left)
        return name if len(args) == 1 and self.source.text_of(args[0]) == name else None

    def publishes(self, statement: Node, variable: str) -> bool:
        """``if (lane == 0) scratch[warp] = v;``: one thread per warp stores ``v``."""
        if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
            return False
        found = plain_assignment(statement.child_by_field_name("consequence"))
        if found is None:
            return False
        left, right = found
        base = left.child_by_field_name("argument")
        return (
            base is not None
            and self.source.text_of(base) in self.shared
            and self.source.text_of(right) == variable
        )

    def reloads(self, statement: Node, variable: str) -> bool:
        """``v = lane < n ? scratch[lane] : identity;``."""
        if statement.type != "expression_statement" or not statement.named_children:
            return False
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression":
            return False
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return False
        shared = self.shared
        return any(
            self.source.text_of(n) in shared for n in inside(self.source, right, "identifier")
        )

    def check_unused_after(self, names: list[str], rest: list[Node]) -> None:
        for statement in rest:
            for node in inside(self.source, statement, "identifier"):
                if self.source.text_of(node) in names:
                    raise NotCanonical(
                        f"{self.source.text_of(node)} from the block reduction is used again "
                        f"at line {self.line(node)}"
                    )


class _GroupWalker:
    """Recognizes the group-layout forms of one kernel and collects their thread-per-row
    rewrites; anything left tied to the layout is refused."""

    def __init__(
        self, source: ParsedSource, kernel: Function, group: Group, left_out: list[Node]
    ) -> None:
        if kernel.body is None:
            raise NotCanonical(f"{kernel.name} has no body")
        self.source = source
        self.kernel = kernel
        self.body: Node = kernel.body
        self.group = group
        self.graph = graph(source)
        self.launches = source.launches_of(kernel)
        self.edits: list[Edit] = []
        # nodes whose built-ins are accounted for; `if constexpr` branches no instantiation
        # takes are (they are emptied: their code never runs)
        self.handled: list[Node] = list(left_out)
        self.removed: list[tuple[int, int]] = [(n.start_byte, n.end_byte) for n in left_out]
        self.reduced: list[tuple[int, str]] = []  # (end of a reduction, the variable it sets)
        self.strided: list[Node] = []  # the group-strided loops
        self.inline = _InlineReductions(source, kernel.body)
        self.warp_reducers = self.inline.warp_reducers
        self.block_reducers = block_reduce_functions(source)
        self.lane_is_thread_x = False  # a warp per row of a 32 x y block
        # `const int tid = threadIdx.x;`: names of the block rank (a block per row only)
        self.rank_aliases = _rank_aliases(source, kernel.body) if group == "block" else set()
        self.scratch_ops: dict[str, str] = {}  # scratch of a serial reduction -> its op
        self.blocks_2d: dict[int, int] = {}  # launch start -> threads of its 32 x y block
        if not self.launches:
            raise NotCanonical(f"no launch of {kernel.name} in this file to rewrite")
        for launch in self.launches:
            self.check_launch(launch)

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    def check_launch(self, launch: Launch) -> None:
        line = self.line(launch.node)
        if launch.grid is None or launch.block is None:
            raise NotCanonical(f"the launch at line {line} has no block size")
        for part in (launch.grid, launch.block):
            threads = block_threads_2d(self.source, launch) if self.group == "warp" else None
            if part is launch.block and threads is not None and threads != WARP_SIZE:
                # a 32 x y block: checked against the row index's form by the layout
                self.blocks_2d[launch.node.start_byte] = threads
                continue
            text = self.source.text_of(part)
            if "dim3" in text or "," in text:
                raise NotCanonical(f"the launch at line {line} is not one-dimensional ({text})")
            host = self.source.enclosing_function(launch.node)
            types = self.source.local_types(host) if host is not None else {}
            if part.type == "identifier" and "dim3" in types.get(text, ""):
                raise NotCanonical(f"the launch at line {line} uses a dim3 {text}")

    def require_1d(self) -> None:
        """Refuse 32 x y blocks where the row index is not that of their warps."""
        for launch in self.launches:
            if launch.node.start_byte in self.blocks_2d:
                assert launch.block is not None
                text = self.source.text_of(launch.block)
                raise NotCanonical(
                    f"the launch at line {self.line(launch.node)} is not one-dimensional ({text})"
                )

    # -- the group size --------------------------------------------------------------------

    def names(self, launch: Launch) -> dict[str, int | str]:
        """Constants usable at a launch: the file's, the launching function's folded locals,
        and the kernel's template parameters bound to numbers."""
        names: dict[str, int | str] = dict(self.source.integer_constants)
        local = launch_names(self.source, self.source.enclosing_function(launch.node))
        for key, value in [*local.items(), *template_bindings(self.source, launch).items()]:
            folded = evaluate_size(str(value), {})
            if folded is not None:
                names[key] = folded
        return names

    def is_block_size(self, node: Node) -> bool:
        """Whether an expression equals the launch's block size at every launch."""
        if is_builtin(self.source, node, "blockDim"):
            return True
        text = " ".join(self.source.text_of(node).split())
        for launch in self.launches:
            assert launch.block is not None
            block_text = " ".join(self.source.text_of(launch.block).split())
            bindings = template_bindings(self.source, launch)
            if text == block_text:
                continue
            if text in bindings and " ".join(str(bindings[text]).split()) == block_text:
                continue
            names = self.names(launch)
            here = _fold_with(self.source, node, names)
            there = _fold_with(self.source, launch.block, names)
            if here is None or there is None or here != there:
                return False
        return True

    def is_warp_count(self, node: Node) -> bool:
        """Whether an expression times 32 is the launch's block size at every launch."""
        for launch in self.launches:
            assert launch.block is not None
            names = self.names(launch)
            here = _fold_with(self.source, node, names)
            there = _fold_with(self.source, launch.block, names)
            if here is None or there is None or here * 32 != there:
                return False
        return True

    # -- reductions ------------------------------------------------------------------------

    def reductions(self, reducers: set[str]) -> None:
        """Calls to group-reduction helpers become the identity."""
        for node in inside(self.source, self.body, "call_expression"):
            if call_name(self.source, node) not in reducers:
                continue
            args = arguments_of(node)
            if args:
                self.identity(node, args[0])

    def tile_reductions(self) -> None:
        """``cg::reduce(warp, v, op)`` over a 32-thread tile becomes the identity."""
        for reduce in warp_reduces(self.source, self.kernel):
            self.identity(reduce.node, reduce.value)

    def identity(self, node: Node, value: Node) -> None:
        """A reduction call of ``value`` becomes ``value``: one thread's partial is the row's
        (``v = reduce(v)`` goes)."""
        statement = node.parent.parent if node.parent is not None else None
        assignment = node.parent
        name = self.source.text_of(value)
        if (
            assignment is not None
            and assignment.type == "assignment_expression"
            and _op(assignment) == "="
            and statement is not None
            and statement.type == "expression_statement"
            and self.source.text_of(assignment.child_by_field_name("left") or node) == name
        ):
            self.delete(statement)
            self.reduced.append((statement.end_byte, name))
            return
        self.edits.append(Edit.replace(node, wrap_at(node, name, precedence(value))))
        self.handled.append(node)
        self.removed.append((node.start_byte, node.end_byte))
        # `v = reduce(v) / n`: the statement that combines v also sets it, target included
        around = node.parent
        while around is not None and around.type not in ("expression_statement", "declaration"):
            around = around.parent
        target = around.named_children[0] if around is not None and around.named_children else None
        if (
            target is not None
            and target.type == "assignment_expression"
            and _op(target) == "="
            and self.source.text_of(target.child_by_field_name("left") or node) == name
        ):
            self.reduced.append((target.start_byte, name))

    def delete(self, statement: Node) -> None:
        edit = line_deletion(self.source, statement)
        self.edits.append(edit)
        self.handled.append(statement)
        self.removed.append((statement.start_byte, statement.end_byte))

    def scratch_reductions(self) -> None:
        """Block reductions through per-warp scratch written value by value
        (:mod:`klineage.mechanisms._reductions_scratch`): the first warp reduction becomes
        its value, the publishes, barrier and reloads go, the second reduction becomes the
        published variable."""
        reduction = _warp_reduction_of(self.source, self.kernel, self.warp_reducers)
        for run in _scratch_runs(self.source, self.kernel, self.inline):
            nodes = [*run.first.values(), *run.deleted, *(call for call, _ in run.second)]
            if any(a < n.end_byte and n.start_byte < b for n in nodes for a, b in self.removed):
                continue  # another form's rewrite took these statements already
            for call in run.first.values():
                value = reduction(call)
                assert value is not None
                self.identity(call, value)
                self.reduced.append((call.end_byte, self.source.text_of(value)))
            for statement in run.deleted:
                self.delete(statement)
            for call, variable in run.second:
                self.edits.append(Edit.replace(call, variable))
                self.handled.append(call)
                self.removed.append((call.start_byte, call.end_byte))
                self.reduced.append((call.end_byte, variable))

    def serial_reductions(self) -> None:
        """Warp reduce / publish / barrier / thread-0 serial loop / barrier / broadcast runs
        (:mod:`klineage.mechanisms._reductions_serial`): the warp reduction and the run go,
        and the broadcast reads the thread's partial."""
        for run in _serial_runs(self.source, self.kernel, self):
            self.scratch_ops[run.scratch] = run.op
            self.delete(run.warp_step)
            self.reduced.append((run.warp_step.end_byte, run.variable))
            for statement in run.deleted:
                self.delete(statement)
            self.edits.append(Edit.replace(run.broadcast, run.variable))
            self.handled.append(run.broadcast)
            self.removed.append((run.broadcast.start_byte, run.broadcast.end_byte))

    def early_exits(self) -> None:
        """``if (rank >= n) { publish identities; return; }`` goes: a thread per row walks
        all ``n`` elements. Its ``n`` must bound every block-strided loop, or the block
        skipped elements the thread would not."""
        for statement in named_statements(self.body):
            bound = early_exit(self.source, statement, self.scratch_ops, self.is_block_rank)
            if bound is None:
                continue
            text = " ".join(self.source.text_of(bound).split())
            for loop in self.strided:
                found = self.source.loop_at(loop)
                condition = strip_parens(found.condition) if found and found.condition else None
                right = condition.child_by_field_name("right") if condition else None
                if right is None or " ".join(self.source.text_of(right).split()) != text:
                    raise NotCanonical(
                        f"the early exit at line {self.line(statement)} bounds the rank by "
                        f"{text}, but the loop at line {self.line(loop)} runs to another bound"
                    )
            self.delete(statement)

    def is_block_rank(self, node: Node) -> bool:
        """``threadIdx.x`` or a name for it."""
        return self.is_rank(node, None)

    def scratch_pointers(self) -> None:
        """Pointers into shared scratch (``float* s = &shared[k]``) that only deleted
        reductions read go; one read elsewhere is refused."""
        shared = self.inline.shared
        for name, statement in scratch_pointers(self.source, self.body, shared).items():
            for node in inside(self.source, self.body, "identifier"):
                if self.source.text_of(node) != name or within(node, statement):
                    continue
                if not self._removed(node):
                    raise NotCanonical(
                        f"the block shares {name} (shared memory) beyond a reduction "
                        f"(line {self.line(node)})"
                    )
            self.delete(statement)

    def unused_rank_declarations(self) -> None:
        """Declarations of thread ranks (``warp_id = threadIdx.x / 32``) and of cooperative
        groups (``cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);``) that
        only deleted code read go too, the groups' namespace alias with the last of them."""
        groups = analysis(self.source).cooperative_groups
        declared = {  # a tile's `T<32> warp = ...;` parses as an expression statement
            group.declaration.start_byte: name
            for (function, name), group in groups.groups.items()
            if function == self.kernel.name
        }
        deleted = True
        while deleted:  # the warp's declaration reads the block: the block goes after it
            deleted = False
            for statement in named_statements(self.body):
                if any(within(statement, h) or within(h, statement) for h in self.handled):
                    continue
                group_names = [
                    name
                    for start, name in declared.items()
                    if statement.start_byte <= start < statement.end_byte
                ]
                group = bool(group_names)
                if statement.type == "declaration":
                    names = declaration_names(self.source, statement) + group_names
                elif group:
                    names = group_names
                else:
                    continue
                if not group and not builtin_uses(self.source, statement):
                    continue
                reads = [
                    node
                    for node in inside(self.source, self.body, "identifier")
                    if self.source.text_of(node) in names and not within(node, statement)
                ]
                if (reads or group) and all(self._removed(n) for n in reads):
                    self.delete(statement)
                    deleted = True
        self._unused_namespace_alias()

    def _removed(self, node: Node) -> bool:
        """Whether a deletion made already covers ``node``."""
        return any(a <= node.start_byte and node.end_byte <= b for a, b in self.removed)

    def _unused_namespace_alias(self) -> None:
        """``namespace cg = cooperative_groups;`` once nothing left in the body names cg."""
        for statement in named_statements(self.body):
            if statement.type != "namespace_alias_definition":
                continue
            name = statement.child_by_field_name("name")
            alias = self.source.text_of(name) if name is not None else None
            used = [
                node
                for node in walk(self.body)
                if node.type == "namespace_identifier"
                and self.source.text_of(node) == alias
                and not within(node, statement)
                and not self._removed(node)
            ]
            if alias is not None and not used:
                self.delete(statement)

    def inline_reductions(self) -> None:
        """``v = warp(v); ... publish ...; __syncthreads(); ... reload ...; v = warp(v);`` ->
        nothing."""
        for block in inside(self.source, self.body, "compound_statement"):
            statements = named_statements(block)
            index = 0
            while index < len(statements):
                end = self.inline.run_end(statements, index)
                if end is None:
                    index += 1
                    continue
                for statement in statements[index : end + 1]:
                    self.delete(statement)
                variable = self.inline.warp_step(statements[index])
                self.reduced.append((statements[end].end_byte, variable or ""))
                index = end + 1

    # -- loops, guards, shared memory ------------------------------------------------------

    def strided_loops(self, lane_name: str | None) -> None:
        """``for (T c = rank; c < n; c += size)`` -> ``for (T c = 0; c < n; ++c)``, the rank
        being ``threadIdx.x`` (block) or the lane (warp: ``threadIdx.x & 31`` or its
        variable)."""
        for loop in self.source.loops:
            if not within(loop.node, self.body) or loop.kind != "for" or loop.variable is None:
                continue
            if loop.initializer is None or loop.update is None:
                continue
            declared = _single_init(self.source, loop.initializer)
            if declared is None or not _below(self.source, loop.condition, loop.variable):
                continue
            if self.is_rank(declared[1], lane_name):
                if self.stride(loop.update, loop.variable) is None:
                    self.unrolled_loop(loop, declared[1])
                    continue
                update = f"++{loop.variable}"
            else:
                # packed: ``c = rank * u`` by ``size * u`` walks the row u elements at a time
                unit = self.packed_rank(declared[1], lane_name)
                if unit is None or not self.packed_stride(loop.update, loop.variable, unit):
                    continue
                update = f"{loop.variable} += {unit}"
            self.edits.append(Edit.replace(declared[1], "0"))
            self.edits.append(Edit.replace(loop.update, update))
            self.handled += [declared[1], loop.update]
            # the group's rank and size these read are gone with them
            self.removed += [(n.start_byte, n.end_byte) for n in (declared[1], loop.update)]
            self.strided.append(loop.node)

    def split_strided_loops(self, lane_name: str | None) -> None:
        """The same walk with its start declared before the loop, ``T c = rank * u; for (;
        c < n; c += size * u)`` (or ``rank``, ``size``), and a walk back down from where it
        stopped, ``c -= size * u; for (; c >= 0; c -= size * u)`` (llm.c fused_residual k4):
        each thread walks the whole row, ``u`` elements at a time, up and then down."""
        for loop in self.source.loops:
            if not within(loop.node, self.body) or loop.kind != "for" or loop.initializer:
                continue
            condition = strip_parens(loop.condition) if loop.condition is not None else None
            left = condition.child_by_field_name("left") if condition is not None else None
            if left is None or not _below(self.source, condition, self.source.text_of(left)):
                continue
            name = self.source.text_of(left)
            start = statement_before(loop.node)
            declared = _single_init(self.source, start) if start is not None else None
            if declared is None or declared[0] != name or loop.update is None:
                continue
            unit = (
                None
                if self.is_rank(declared[1], lane_name)
                else (self.packed_rank(declared[1], lane_name))
            )
            if unit is None and not self.is_rank(declared[1], lane_name):
                continue
            if unit is None:
                if self.stride(loop.update, name) is None:
                    continue
                step = "1"
            elif self.packed_stride(loop.update, name, unit):
                step = unit
            else:
                continue
            self.edits += [
                Edit.replace(declared[1], "0"),
                Edit.replace(loop.update, f"{name} += {step}"),
            ]
            self.handled += [declared[1], loop.update]
            self.removed += [(n.start_byte, n.end_byte) for n in (declared[1], loop.update)]
            self.strided.append(loop.node)
            self._walk_back(loop.node, name, unit, step)

    def _walk_back(self, up: Node, name: str, unit: str | None, step: str) -> None:
        """After the loop ``up``, where the walk's variable stopped differs between a lane
        and a thread: the only later use allowed is ``c -= size * u; for (; c >= 0; c -=
        size * u)``, each then by ``u``; any other use is refused."""
        try:
            found = walk_back(
                self.source,
                up,
                name,
                lambda move: move is not None and self._steps_down(move, name, unit),
                "size * u",
            )
        except StepFormError as why:
            raise NotCanonical(str(why)) from None
        if found is None:
            return
        move, back = found
        moves = [move, back.child_by_field_name("update")]
        for move in moves:
            assert move is not None
            self.edits.append(Edit.replace(move, f"{name} -= {step}"))
            self.handled.append(move)
        self.strided.append(back)

    def _steps_down(self, node: Node, name: str, unit: str | None) -> bool:
        """``name -= size * unit`` (or ``name -= size``)."""
        if unit is None:
            return self.stride(node, name, "-=") is not None
        return self.packed_stride(node, name, unit, "-=")

    def block_strided_left(self) -> None:
        """A loop that starts at the thread's rank and steps by the block, in none of the
        forms the rewrite maps (a start off the rank, a step that is not a multiple of the
        block size), is refused with its form."""
        indices = analysis(self.source).indices(self.kernel)
        for variable in indices.loops:
            if variable.loop in self.strided or not within(variable.loop, self.body):
                continue
            step = variable.step
            if step is None or not step.coefficient("blockDim.x").terms:
                continue
            if "threadIdx.x" not in indices.thread_atoms(variable.init):
                continue
            raise NotCanonical(
                f"the loop at line {self.line(variable.loop)} starts at {variable.init} and steps "
                f"by {step}: this rule needs a loop that starts at the thread's rank (threadIdx.x) "
                "and steps by a multiple of the block size"
            )

    def unrolled_loop(self, loop: Loop, start: Node) -> None:
        """``for (i = rank; i < n; i += B * U)`` with ``i + u * B`` inside -> ``for (i = 0; i
        < n; i += U)`` with ``i + u`` (:mod:`klineage.mechanisms._block_unrolled`)."""
        indices = analysis(self.source).indices(self.kernel)
        try:
            if self.group == "block":
                found = unrolled_loop(self.source, loop, start, indices, self.is_block_size)
            else:  # the caller checked the start is the lane, which the analysis cannot name
                found = unrolled_loop(self.source, loop, start, indices, self.is_warp_size, None)
        except UnrolledFormError as why:
            raise NotCanonical(f"{why}; {_UNROLLED_FORM}") from None
        if found is None:
            return
        variable = loop.variable
        self.edits.append(Edit.replace(found.start, "0"))
        self.edits.append(Edit.replace(found.update, f"{variable} += {found.factor}"))
        for offset, slot in found.slots:
            self.edits.append(Edit.replace(offset, slot))
            self.handled.append(offset)
        self.handled += [found.start, found.update]
        self.removed.append((found.start.start_byte, found.start.end_byte))
        self.strided.append(loop.node)

    def is_rank_alias(self, node: Node) -> bool:
        """A name the kernel gives ``threadIdx.x`` (``const int tid = threadIdx.x;``)."""
        node = strip_parens(node)
        return node.type == "identifier" and self.source.text_of(node) in self.rank_aliases

    def packed_rank(self, node: Node, lane_name: str | None) -> str | None:
        """``u`` of ``rank * u`` (or ``u * rank``), ``u`` a positive integer constant."""
        node = strip_parens(strip_casts(node))
        if node.type != "binary_expression" or _op(node) != "*":
            return None
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        for rank, unit in ((left, right), (right, left)):
            if rank is None or unit is None or not self.is_rank(rank, lane_name):
                continue
            value = fold(self.source, unit)
            if value is None:  # a member constant (`x128::size`) the analysis knows
                value = analysis(self.source).indices(self.kernel).form(unit).value
            if value is not None and value > 0:
                return self.source.text_of(unit)
        return None

    def packed_stride(self, update: Node, variable: str, unit: str, op: str = "+=") -> bool:
        """``c += size * u`` (either order; ``op`` ``-=`` for a walk down), ``size`` the
        group's stride."""
        update = strip_parens(update)
        if update.type != "assignment_expression" or _op(update) != op:
            return False
        left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return False
        right = strip_parens(right)
        if right.type != "binary_expression" or _op(right) != "*":
            return False
        a, b = right.child_by_field_name("left"), right.child_by_field_name("right")
        for size, factor in ((a, b), (b, a)):
            if size is None or factor is None or self.source.text_of(factor) != unit:
                continue
            if self.group == "block" and self.is_block_size(size):
                return True
            if self.group == "warp" and self.is_warp_size(size):
                return True
        return False

    def stride(self, update: Node, variable: str, op: str = "+=") -> Node | None:
        update = strip_parens(update)
        if update.type != "assignment_expression" or _op(update) != op:
            return None
        left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return None
        if self.group == "block":
            return right if self.is_block_size(right) else None
        return right if self.is_warp_size(right) else None

    def is_warp_size(self, node: Node) -> bool:
        """32, ``warpSize``, a 32-thread tile's ``size()``, or ``blockDim.x`` where the lane
        is ``threadIdx.x`` (a 32 x y block)."""
        text = "".join(self.source.text_of(strip_parens(node)).split())
        return (
            text in ("32", "warpSize")
            or (self.lane_is_thread_x and text == "blockDim.x")
            or is_warp_query(self.source, node, "group_size")
            or (  # a local constant (`constexpr int WarpSize = 32;`)
                strip_parens(node).type == "identifier"
                and analysis(self.source).indices(self.kernel).form(node).value == 32
            )
        )

    def is_rank(self, node: Node, lane_name: str | None) -> bool:
        if self.group == "block":
            return is_builtin(self.source, node, "threadIdx") or self.is_rank_alias(node)
        node = strip_casts(node)
        if self.lane_is_thread_x and is_thread_x(self.source, node):
            return True
        if is_warp_query(self.source, node, "lane"):
            return True
        return _is_lane(self.source, node) or (
            lane_name is not None and self.source.text_of(node) == lane_name
        )

    def guards(self, lane_name: str | None) -> None:
        """``if (first) S`` -> ``S``, for the group's first thread."""
        for node in inside(self.source, self.body, "if_statement"):
            if node.child_by_field_name("alternative") is not None:
                continue
            condition = node.child_by_field_name("condition")
            consequence = node.child_by_field_name("consequence")
            value = condition.child_by_field_name("value") if condition is not None else None
            if value is None or consequence is None or any(within(node, h) for h in self.handled):
                continue
            if self.is_first(value, lane_name):
                self.edits.append(Edit(node.start_byte, consequence.start_byte, ""))
                self.handled.append(value)
                self.removed.append((value.start_byte, value.end_byte))
                continue
            # `if (first && other) S` -> `if (other) S`
            both = strip_parens(value)
            if both.type != "binary_expression" or _op(both) != "&&":
                continue
            first, other = both.child_by_field_name("left"), both.child_by_field_name("right")
            if first is None or other is None or not self.is_first(first, lane_name):
                continue
            self.edits.append(Edit(first.start_byte, other.start_byte, ""))
            self.handled.append(first)
            self.removed.append((first.start_byte, first.end_byte))

    def is_first(self, node: Node, lane_name: str | None) -> bool:
        node = strip_parens(node)
        if node.type != "binary_expression" or _op(node) != "==":
            return False
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None or not is_zero_literal(self.source, right):
            return False
        if self.group == "block":
            return is_builtin(self.source, left, "threadIdx") or self.is_rank_alias(left)
        left = strip_parens(left)
        if self.lane_is_thread_x and is_thread_x(self.source, left):
            return True
        if is_warp_query(self.source, left, "lane"):
            return True
        return _is_lane(self.source, left) or (
            lane_name is not None and self.source.text_of(left) == lane_name
        )

    def unused_shared(self) -> None:
        """``__shared__`` arrays only the deleted reductions used are deleted too."""
        for declaration in self.source.shared_declarations:
            if not within(declaration.node, self.body):
                continue
            names = set(declaration.names)
            for node in inside(self.source, self.body, "identifier"):
                if self.source.text_of(node) not in names or within(node, declaration.node):
                    continue
                if not self._removed(node):
                    raise NotCanonical(
                        f"the block shares {self.source.text_of(node)} in shared memory beyond "
                        f"a reduction (line {self.line(node)})"
                    )
            self.delete(declaration.node)

    def partials(self) -> None:
        """A value a group-strided loop accumulates is one thread's part of the row until a
        group reduction combines it: read before that, it would mean the whole row once the
        loop is a full loop, so such a read is refused."""
        for loop in self.strided:
            body = loop.child_by_field_name("body")
            if body is None:
                continue
            local = {
                name
                for node in inside(self.source, body, "declaration")
                for name in declaration_names(self.source, node)
            }
            written = set()
            for node in inside(self.source, body, "assignment_expression", "update_expression"):
                target = node.child_by_field_name("left") or node.child_by_field_name("argument")
                root = _lvalue_root(self.source, target) if target is not None else None
                if root is not None and root not in local:
                    written.add(root)
            for name in sorted(written):
                self.partial_reads(loop, name)

    def partial_reads(self, loop: Node, name: str) -> None:
        combined = min(
            (end for end, variable in self.reduced if variable == name and end > loop.end_byte),
            default=None,
        )
        for node in inside(self.source, self.body, "identifier"):
            if self.source.text_of(node) != name or node.start_byte < loop.end_byte:
                continue
            if combined is not None and node.start_byte >= combined:
                break
            if self._removed(node):
                continue
            if any(within(node, other) for other in self.strided):
                continue
            raise NotCanonical(
                f"{name}, accumulated by the {self.group}-strided loop at line {self.line(loop)}, "
                f"is read at line {self.line(node)} before a {self.group} reduction combines it"
            )

    def leftovers(self) -> None:
        """Refuse what is still tied to the thread layout."""
        for node in inside(self.source, self.body, "identifier"):
            if not self.is_rank_alias(node) or _declares(node):
                continue
            if any(within(node, h) for h in self.handled) or self._removed(node):
                continue
            raise NotCanonical(_spread(self.source.text_of(node), self.line(node)))
        for use in builtin_uses(self.source, self.body):
            if any(within(use, h) for h in self.handled):
                continue
            raise NotCanonical(_spread(self.source.text_of(use), self.line(use)))
        _, barriers = analysis(self.source).cooperative_groups.in_function(self.kernel)
        for barrier in barriers:  # `block.sync()`: a barrier, whatever its spelling
            if not any(within(barrier.node, h) for h in self.handled):
                text = self.source.text_of(barrier.node)
                raise NotCanonical(
                    f"{text} at line {self.line(barrier.node)} is not part of a reduction"
                )
        for call in tile_calls_left(self.source, self.kernel):
            if any(within(call, h) for h in self.handled):
                continue
            raise NotCanonical(_spread(self.source.text_of(call), self.line(call)))
        for node in inside(self.source, self.body, "call_expression"):
            if any(within(node, h) for h in self.handled):
                continue
            name = call_name(self.source, node)
            if name in _SYNC or name in _WARP_INTRINSICS:
                raise NotCanonical(f"{name} at line {self.line(node)} is not part of a reduction")
            for function in self.graph.functions(name or ""):
                why = _layout_bound(self.source, function)
                if why is None:
                    reached = [
                        g
                        for n in self.graph.reachable(function.name)
                        for g in self.graph.functions(n)
                    ]
                    why = next((w for g in reached if (w := _layout_bound(self.source, g))), None)
                if why is not None:
                    raise NotCanonical(f"{name} at line {self.line(node)} {why}")


def _declares(node: Node) -> bool:
    """Whether an identifier is the name a declarator declares."""
    parent = node.parent
    return (
        parent is not None
        and parent.type == "init_declarator"
        and (parent.child_by_field_name("declarator") == node)
    )


def _lvalue_root(source: ParsedSource, node: Node) -> str | None:
    """``acc.m`` -> ``acc``; ``v`` -> ``v``; memory stores (``p[i]``) -> None."""
    node = strip_parens(node)
    while node.type == "field_expression":
        operator = node.child_by_field_name("operator")
        inner = node.child_by_field_name("argument")
        if inner is None or operator is None or operator.type != ".":
            return None
        node = strip_parens(inner)
    return source.text_of(node) if node.type == "identifier" else None


def _spread(what: str, line: int) -> str:
    """Why a use of the thread's rank blocks the rewrite to thread per row."""
    return (
        f"{what} at line {line} is not a group-strided loop start, a first-thread guard or the "
        "row index: the row is spread over the group in a form a thread-per-row kernel cannot "
        "keep (a row held in registers across strided slots is one; see row_in_registers)"
    )


def _fold_with(source: ParsedSource, node: Node, names: dict[str, int | str]) -> int | None:
    return fold_int(source, node, names)


def _is_lane(source: ParsedSource, node: Node) -> bool:
    """``threadIdx.x & 31`` or ``threadIdx.x % 32`` (``warpSize`` forms too)."""
    node = strip_casts(node)
    if node.type != "binary_expression":
        return False
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if not is_builtin(source, left, "threadIdx") or right is None:
        return False
    text = source.text_of(strip_parens(right)).replace(" ", "")
    return (_op(node) == "&" and text in ("31", "warpSize-1", "0x1f")) or (
        _op(node) == "%" and text in ("32", "warpSize")
    )


def _is_call_statement(source: ParsedSource, node: Node, names: frozenset[str]) -> bool:
    if node.type != "expression_statement" or not node.named_children:
        return False
    call = node.named_children[0]
    return call.type == "call_expression" and call_name(source, call) in names


# ---------------------------------------------------------------------------------------------
# Row index forms of the group layouts
# ---------------------------------------------------------------------------------------------


@dataclass
class _RowIndex:
    statement: Node | None
    """The declaration of the row index; None when blockIdx.x is used in expressions."""
    name: str
    value: Node | None
    replacement: str | None
    """The thread-per-row initial value to write."""
    bound: Node | None
    """The bound of an existing check, if any."""


def block_row_uses(source: ParsedSource, kernel: Function) -> list[Node] | None:
    """The ``blockIdx.x`` uses of a block-per-row kernel (each in a statement without
    ``threadIdx``); None when the kernel does not index rows by block."""
    if kernel.body is None:
        return None
    uses = builtin_uses(source, kernel.body, "blockIdx")
    if not uses or any(source.text_of(u).replace(" ", "") != "blockIdx.x" for u in uses):
        return None
    for use in uses:
        statement = use
        while statement.parent is not None and not (
            statement.type.endswith("statement") or statement.type == "declaration"
        ):
            statement = statement.parent
        inner = statement
        if statement.type in ("for_statement", "if_statement"):
            inner = use.parent or use
        if builtin_uses(source, inner, "threadIdx", "blockDim"):
            return None
    return uses


def warp_row_index(
    source: ParsedSource, kernel: Function, walker: _GroupWalker | None = None
) -> tuple[Node, Node, str] | None:
    """(declaration, value, thread-per-row value) of a warp-per-row index: ``(tid) >> 5``,
    ``(tid) / 32``, ``blockIdx.x * warps + (threadIdx.x >> 5)``, or ``blockIdx.x * blockDim.y
    + threadIdx.y`` in a 32 x y block."""
    if kernel.body is None:
        return None
    for statement in named_statements(kernel.body):
        declared = _single_init(source, statement)
        if declared is None:
            continue
        value = strip_casts(declared[1])
        replacement = _warp_index_replacement(source, value, walker)
        if replacement is None and is_row_of_2d_warps(source, value):
            replacement = THREAD_ROW_2D if lane_is_thread_x(source, kernel) else None
        if replacement is not None:
            return statement, declared[1], replacement
    return None


def _warp_index_replacement(
    source: ParsedSource, value: Node, walker: _GroupWalker | None
) -> str | None:
    if value.type != "binary_expression":
        return None
    left, right = value.child_by_field_name("left"), value.child_by_field_name("right")
    if left is None or right is None:
        return None
    right_text = source.text_of(strip_parens(right))
    if (_op(value), right_text) in ((">>", "5"), ("/", "32")):
        inner = strip_parens(left)
        if _global_thread_index(source, inner) is not None:
            return source.text_of(inner)
        return None
    if _op(value) != "+":
        return None
    for product, warp in ((left, right), (right, left)):
        warp = strip_casts(warp)
        # the warp's index in the block: `threadIdx.x >> 5`, or the group API's
        tile = is_warp_query(source, warp, "warp_in_block")
        if not tile:
            if warp.type != "binary_expression" or not is_builtin(
                source, warp.child_by_field_name("left"), "threadIdx"
            ):
                continue
            shift = source.text_of(strip_parens(warp.child_by_field_name("right") or warp))
            if (_op(warp), shift) not in ((">>", "5"), ("/", "32")):
                continue
        product = strip_parens(product)
        if product.type != "binary_expression" or _op(product) != "*":
            continue
        a, b = product.child_by_field_name("left"), product.child_by_field_name("right")
        for block, count in ((a, b), (b, a)):
            if is_builtin(source, block, "blockIdx") and count is not None:
                counted = tile and is_warp_query(source, count, "warps_per_block")
                if walker is not None and not counted and not walker.is_warp_count(count):
                    return None
                return "(int64_t)blockIdx.x * blockDim.x + threadIdx.x"
    return None


def _warp_reduction_calls(source: ParsedSource, kernel: Function) -> bool:
    reducers = warp_reduce_functions(source)
    assert kernel.body is not None
    return bool(warp_reduces(source, kernel)) or any(
        call_name(source, n) in reducers for n in inside(source, kernel.body, "call_expression")
    )


def _warp_reduction_of(
    source: ParsedSource, kernel: Function, helpers: set[str]
) -> Callable[[Node], Node | None]:
    """The reduced value of a warp-reduction call in ``kernel`` (a helper of ``helpers`` or
    ``cg::reduce`` over a 32-thread tile), None for any other node."""
    tiles = {r.node.start_byte: r.value for r in warp_reduces(source, kernel)}

    def reduction(node: Node) -> Node | None:
        if node.type != "call_expression":
            return None
        if node.start_byte in tiles:
            return tiles[node.start_byte]
        args = arguments_of(node)
        return args[0] if call_name(source, node) in helpers and len(args) == 1 else None

    return reduction


def _scratch_runs(
    source: ParsedSource, kernel: Function, inline: _InlineReductions
) -> list[ScratchRun]:
    """The per-warp scratch block reductions of ``kernel``, in every block of statements."""
    reduction = _warp_reduction_of(source, kernel, inline.warp_reducers)

    def is_barrier(statement: Node) -> bool:
        if _is_call_statement(source, statement, _SYNC):
            return True
        call = statement.named_children[0] if statement.named_children else None
        barrier = analysis(source).cooperative_groups.barrier_at(call) if call else None
        return barrier is not None and barrier.scope == "block"

    assert kernel.body is not None
    return [
        run
        for block in inside(source, kernel.body, "compound_statement")
        for run in scratch_runs(
            source, named_statements(block), inline.shared, reduction, is_barrier
        )
    ]


def _serial_runs(
    source: ParsedSource, kernel: Function, walker: _GroupWalker | None = None
) -> list[SerialRun]:
    """The thread-0 serial block reductions of ``kernel``, in every block of statements;
    :class:`NotCanonical` when one starts as the form does and differs from it."""
    inline = walker.inline if walker is not None else _InlineReductions(source, kernel.body)
    reduction = _warp_reduction_of(source, kernel, inline.warp_reducers)
    assert kernel.body is not None
    scratch = inline.shared | set(scratch_pointers(source, kernel.body, inline.shared))
    aliases = walker.rank_aliases if walker is not None else _rank_aliases(source, kernel.body)

    def is_first(node: Node) -> bool:
        node = strip_parens(node)
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if node.type != "binary_expression" or _op(node) != "==" or left is None:
            return False
        rank = is_builtin(source, left, "threadIdx") or source.text_of(left) in aliases
        return rank and is_zero_literal(source, right)

    def is_barrier(statement: Node) -> bool:
        return _is_call_statement(source, statement, _SYNC)

    def is_warp_count(node: Node) -> bool:
        return _is_warp_count(source, kernel, node, walker)

    try:
        return [
            run
            for block in inside(source, kernel.body, "compound_statement")
            for run in serial_runs(
                source,
                named_statements(block),
                scratch,
                reduction,
                is_barrier,
                is_first,
                is_warp_count,
            )
        ]
    except SerialFormError as why:
        raise NotCanonical(f"{why}; {_SERIAL_FORM}") from None


def _is_warp_count(
    source: ParsedSource, kernel: Function, node: Node, walker: _GroupWalker | None
) -> bool:
    """``blockDim.x / 32`` (``>> 5``, ``/ warpSize``), a never-written local set to it, or a
    number that times 32 is the block size of every launch."""
    assert kernel.body is not None
    node = strip_parens(node)
    if node.type == "identifier":
        name = source.text_of(node)
        for statement in named_statements(kernel.body):
            declared = _single_init(source, statement)
            if declared is not None and declared[0] == name:
                node = strip_parens(declared[1])
                break
        written = [
            n
            for n in inside(source, kernel.body, "assignment_expression", "update_expression")
            if source.text_of(
                n.child_by_field_name("left") or n.child_by_field_name("argument") or n
            )
            == name
        ]
        if written:
            return False
    left = node.child_by_field_name("left")
    if node.type == "binary_expression" and left is not None and _is_thread_count(source, left):
        right = "".join(source.text_of(node.child_by_field_name("right") or node).split())
        return (_op(node), right) in (("/", "32"), (">>", "5"), ("/", "warpSize"))
    return walker is not None and walker.is_warp_count(node)


def _is_thread_count(source: ParsedSource, node: Node) -> bool:
    """``blockDim.x``."""
    return "".join(source.text_of(strip_parens(node)).split()) == "blockDim.x"


def _rank_aliases(source: ParsedSource, body: Node) -> set[str]:
    """Top-level ``T name = threadIdx.x;`` declarations whose name is never written again."""
    found = set()
    for statement in named_statements(body):
        declared = _single_init(source, statement)
        if declared is None or not is_builtin(source, declared[1], "threadIdx"):
            continue
        if source.text_of(strip_parens(declared[1])).replace(" ", "") != "threadIdx.x":
            continue
        written = any(
            source.text_of(t) == declared[0]
            for node in inside(source, body, "assignment_expression", "update_expression")
            if (t := node.child_by_field_name("left") or node.child_by_field_name("argument"))
        )
        if not written:
            found.add(declared[0])
    return found


def _block_reduction(source: ParsedSource, kernel: Function) -> bool:
    """Whether a kernel reduces over its block: a call to a block-reduction helper, or the
    inline warp-reduce / publish / barrier / reload sequence."""
    assert kernel.body is not None
    reducers = block_reduce_functions(source)
    if any(
        call_name(source, n) in reducers for n in inside(source, kernel.body, "call_expression")
    ):
        return True
    if helper_block_reductions(source, kernel):
        return True  # removed as a one-thread block, or refused naming the helper
    inline = _InlineReductions(source, kernel.body)
    if inline.any_run() or _scratch_runs(source, kernel, inline):
        return True
    try:
        return bool(_serial_runs(source, kernel))
    except NotCanonical:
        return True  # the form's start: refused by the removal with what differs


def helper_block_reductions(source: ParsedSource, kernel: Function) -> list[str]:
    """The device helpers a kernel calls (directly or not) that make block-reduction calls
    themselves: a row handed to a helper that reduces it over the block (``stats =
    row_stats(row, ...)`` whose body calls ``block_reduce<warp_max>(m)``)."""
    reducers = block_reduce_functions(source)
    graph = analysis(source).call_graph
    found = []
    for name in sorted(graph.reachable(kernel.name) - reducers):
        helper = graph.definition(name)
        if helper is None or helper.body is None:
            continue
        if any(
            call_name(source, n) in reducers for n in inside(source, helper.body, "call_expression")
        ):
            found.append(name)
    return found


def is_block_per_row(source: ParsedSource, kernel: Function) -> bool:
    """Detection: rows indexed by ``blockIdx.x`` alone, reduced over the block."""
    return block_row_uses(source, kernel) is not None and _block_reduction(source, kernel)


def is_warp_per_row(source: ParsedSource, kernel: Function) -> bool:
    """Detection: rows indexed by the warp number, reduced over the warp."""
    return warp_row_index(source, kernel) is not None and _warp_reduction_calls(source, kernel)


# ---------------------------------------------------------------------------------------------
# Group per row -> thread per row (removal)
# ---------------------------------------------------------------------------------------------


def group_rows(source: ParsedSource, kernel: Function, group: Group) -> GroupRows:
    """The edits that turn a block- (or warp-) per-row kernel into a thread-per-row one;
    :class:`NotCanonical` says why not."""
    helpers = helper_block_reductions(source, kernel) if group == "block" else []
    if helpers:
        return _helper_group_rows(source, kernel, helpers)
    emptied, untaken = emptied_branches(source, kernel)
    walker = _GroupWalker(source, kernel, group, untaken)
    index = _block_layout(walker) if group == "block" else _warp_layout(walker)
    walker.leftovers()
    walker.partials()
    walker.edits += _thread_launches(source, walker, index)
    walker.edits += _no_dynamic_shared(source, walker)
    walker.edits += helper_deletions(source, walker.removed)
    kept = [e for e in walker.edits if not any(_inside_node(e, n) for n in untaken)]
    return GroupRows(kernel, group, kept + emptied, walker.removed)


def _helper_group_rows(source: ParsedSource, kernel: Function, helpers: list[str]) -> GroupRows:
    """A block per row whose row goes to helpers that block-reduce it: each thread runs the
    row code as a one-thread block (:mod:`klineage.mechanisms._block_rows_helper`)."""
    walker = _GroupWalker(source, kernel, "block", [])
    uses = block_row_uses(source, kernel) or []
    index = _block_index(source, walker)
    try:
        rows = helper_rows(source, kernel, walker.block_reducers, uses, walker.edits)
    except HelperRowsError as why:
        raise NotCanonical(
            f"{kernel.name} hands its row to {', '.join(helpers)}, which reduces it over the "
            f"block there, and {why}"
        ) from None
    edits = outside(walker.edits, rows) + rows
    edits += _thread_launches(source, walker, index)
    return GroupRows(kernel, "block", edits, walker.removed)


def _inside_node(edit: Edit, node: Node) -> bool:
    return node.start_byte <= edit.start_byte and edit.end_byte <= node.end_byte


def _block_layout(walker: _GroupWalker) -> _RowIndex:
    """Block reductions, the block row index, block-strided loops, thread-0 guards and the
    reductions' scratch arrays."""
    walker.require_1d()
    walker.reductions(walker.block_reducers)
    walker.inline_reductions()
    walker.scratch_reductions()
    walker.serial_reductions()
    index = _block_index(walker.source, walker)
    walker.strided_loops(None)
    walker.block_strided_left()
    walker.early_exits()
    walker.guards(None)
    walker.scratch_pointers()
    walker.unused_rank_declarations()
    walker.unused_shared()
    return index


def _warp_layout(walker: _GroupWalker) -> _RowIndex:
    """The warp row index (which must have a bound check), warp reductions, lane-strided
    loops, lane-0 guards and the lane variable."""
    source, kernel = walker.source, walker.kernel
    found = warp_row_index(source, kernel, walker)
    if found is None:
        raise NotCanonical(f"{kernel.name} has no warp row index the rewrite knows")
    statement, value, replacement = found
    if replacement == THREAD_ROW_2D:
        if len(walker.blocks_2d) != len(walker.launches):
            raise NotCanonical(
                f"the rows of {kernel.name} are warps of a 32 x y block, but not every launch "
                "has a constant 32 x y block"
            )
        walker.lane_is_thread_x = True
        # the block keeps its 32 x y shape, so an assert on its width still holds
        walker.handled += block_width_asserts(source, walker.body)
    else:
        walker.require_1d()
    declared = _single_init(source, statement)
    bound = _bound_after(source, kernel, statement)
    loose = _loose_bound_check(source, kernel, statement) if bound is None else None
    if loose is not None:
        # `if (row > rows) return;` lets a warp past the last row read and write row `rows`
        # (out of bounds) wherever the grid has spare warps; a thread per row would have
        # spare threads on every grid, so the rewrite returns at `>=` and keeps only the rows
        test, bound = loose
        operator = test.child_by_field_name("operator")
        assert operator is not None
        walker.edits.append(Edit.replace(operator, ">="))
    if declared is None or bound is None:
        raise NotCanonical(
            f"the warp row index at line {walker.line(statement)} has no bound check"
        )
    walker.edits.append(Edit.replace(value, replacement))
    walker.handled.append(value)
    walker.removed.append((value.start_byte, value.end_byte))
    walker.reductions(walker.warp_reducers)
    walker.tile_reductions()
    lane_name, lane_statement = _lane_variable(source, kernel)
    walker.strided_loops(lane_name)
    walker.split_strided_loops(lane_name)
    walker.guards(lane_name)
    if lane_statement is not None and lane_name is not None:
        _drop_lane(source, walker, lane_statement, lane_name)
    walker.unused_rank_declarations()
    return _RowIndex(statement, declared[0], value, replacement, bound)


def _loose_bound_check(
    source: ParsedSource, kernel: Function, statement: Node
) -> tuple[Node, Node] | None:
    """For a check written ``if (row > rows) return;`` right after the row index, its test
    and ``rows``; None for any other statement."""
    assert kernel.body is not None
    statements = named_statements(kernel.body)
    declared = _single_init(source, statement)
    position = statements.index(statement) if statement in statements else -1
    if declared is None or position < 0 or position + 1 >= len(statements):
        return None
    bound = _bound_check(source, statements[position + 1], declared[0], op=">")
    if bound is None or bound.parent is None:
        return None
    return bound.parent, bound


def _bound_after(source: ParsedSource, kernel: Function, statement: Node) -> Node | None:
    assert kernel.body is not None
    statements = named_statements(kernel.body)
    position = statements.index(statement) if statement in statements else -1
    if position < 0 or position + 1 >= len(statements):
        return None
    declared = _single_init(source, statement)
    return _bound_check(source, statements[position + 1], declared[0]) if declared else None


def _block_index(source: ParsedSource, walker: _GroupWalker) -> _RowIndex:
    """Rewrite the block row index into a thread row index."""
    kernel = walker.kernel
    uses = block_row_uses(source, kernel)
    if uses is None:
        raise NotCanonical(f"{kernel.name} does not index its rows by blockIdx.x alone")
    assert kernel.body is not None
    for statement in named_statements(kernel.body):
        declared = _single_init(source, statement)
        if declared is None or not is_builtin(source, declared[1], "blockIdx"):
            continue
        if any(not within(u, statement) for u in uses):
            break
        value = declared[1]
        text = source.text_of(value)
        if strip_parens(value).type != "cast_expression":
            text = "(int64_t)blockIdx.x"
        replacement = f"{text} * blockDim.x + threadIdx.x"
        walker.edits.append(Edit.replace(value, replacement))
        walker.handled.append(value)
        return _RowIndex(
            statement, declared[0], value, replacement, _bound_after(source, kernel, statement)
        )
    taken = {p.name or "" for p in kernel.params} | {
        source.text_of(n) for n in inside(source, kernel.body, "identifier")
    }
    name = fresh_name(taken, "row")
    for use in uses:
        walker.edits.append(Edit.replace(use, name))
        walker.handled.append(use)
    return _RowIndex(None, name, None, None, None)


def _lane_variable(source: ParsedSource, kernel: Function) -> tuple[str | None, Node | None]:
    assert kernel.body is not None
    for statement in named_statements(kernel.body):
        declared = _single_init(source, statement)
        if declared is not None and _is_lane(source, declared[1]):
            return declared[0], statement
    return None, None


def _drop_lane(source: ParsedSource, walker: _GroupWalker, statement: Node, name: str) -> None:
    """The lane variable goes once nothing but handled code uses it."""
    assert walker.kernel.body is not None
    for node in inside(source, walker.kernel.body, "identifier"):
        if source.text_of(node) != name or within(node, statement):
            continue
        if any(within(node, h) for h in walker.handled):
            continue
        if any(a <= node.start_byte and node.end_byte <= b for a, b in walker.removed):
            continue
        raise NotCanonical(_spread(f"the lane variable {name}", source.line_of(node.start_byte)))
    walker.delete(statement)


def _thread_launches(source: ParsedSource, walker: _GroupWalker, index: _RowIndex) -> list[Edit]:
    """The bound check (and a row-count parameter when there is none) and launches of
    ceil(rows / block) blocks."""
    kernel = walker.kernel
    assert kernel.body is not None
    edits: list[Edit] = []
    bound_text: str | None = None
    if index.bound is not None:
        bound = index.bound
        counts = [_row_count(source, kernel, launch, bound) for launch in walker.launches]
    else:
        counts = []
        for launch in walker.launches:
            assert launch.grid is not None
            counts.append(" ".join(source.text_of(_drop_unsigned(launch.grid)).split()))
        bound_text = _grid_parameter(source, kernel, walker.launches)
        if bound_text is None:  # no parameter counts the rows: add one
            taken = {p.name or "" for p in kernel.params} | {
                source.text_of(n) for n in inside(source, kernel.body, "identifier")
            }
            bound_text = fresh_name(taken, "rows")
            params = kernel.declarator.child_by_field_name("parameters")
            assert params is not None
            edits.append(Edit.insert(params.end_byte - 1, f", int64_t {bound_text}"))
            for launch, count in zip(walker.launches, counts, strict=True):
                arguments = launch.node.child_by_field_name("arguments")
                assert arguments is not None
                separator = ", " if launch.args else ""
                edits.append(Edit.insert(arguments.end_byte - 1, f"{separator}{count}"))
        indent = _indent(source, kernel)
        check = f"if ({index.name} >= {bound_text}) return;"
        if index.statement is None:
            lines = (
                f"\n{indent}const int64_t {index.name} = (int64_t)blockIdx.x * blockDim.x + "
                f"threadIdx.x;\n{indent}{check}"
            )
            edits.append(Edit.insert(kernel.body.start_byte + 1, lines))
        else:
            edits.append(
                Edit.insert(
                    index.statement.end_byte,
                    f"\n{source.indent_of(index.statement.start_byte)}{check}",
                )
            )
    for launch, count in zip(walker.launches, counts, strict=True):
        assert launch.grid is not None and launch.block is not None
        threads = walker.blocks_2d.get(launch.node.start_byte)
        edits.append(
            Edit.replace(
                launch.grid, f"(unsigned){_ceil_div(source, count, launch.block, threads)}"
            )
        )
    return edits


def _no_dynamic_shared(source: ParsedSource, walker: _GroupWalker) -> list[Edit]:
    """Launches pass no dynamic shared memory once the kernel's ``extern __shared__`` scratch
    is gone (a size computed only for it goes too)."""
    deleted = [
        d
        for d in source.shared_declarations
        if d.is_extern and within(d.node, walker.body) and d.node in walker.handled
    ]
    if not deleted:
        return []
    sizes = [
        launch.shared_memory
        for launch in walker.launches
        if launch.shared_memory is not None and fold(source, launch.shared_memory) != 0
    ]
    return [Edit.replace(size, "0") for size in sizes] + orphaned_declarations(source, sizes)


_INTEGER = re.compile(r"^(unsigned |signed )?(int|long|long long|short)$|^u?int\d+_t$|^size_t$")


def _grid_parameter(source: ParsedSource, kernel: Function, launches: list[Launch]) -> str | None:
    """The integer parameter every launch passes the grid size in (``grid = (int)N`` and the
    argument ``(int)N``): the kernel's row count, though it never checks it."""
    found = []
    for position, param in enumerate(kernel.params):
        if param.name is None or param.is_pointer or not _INTEGER.match(param.base_type):
            continue
        if all(_same_size(source, launch, position) for launch in launches):
            found.append(param.name)
    return found[0] if len(found) == 1 else None


def _same_size(source: ParsedSource, launch: Launch, position: int) -> bool:
    """Whether the launch's argument at ``position`` is its grid size, as size expressions."""
    if launch.grid is None or position >= len(launch.args):
        return False
    names = launch_names(source, source.enclosing_function(launch.node))
    grid = to_size_expr(source, launch.grid, names)
    argument = to_size_expr(source, launch.args[position], names)
    return grid is not None and argument is not None and _unwrapped(grid) == _unwrapped(argument)


def _unwrapped(text: str) -> str:
    """``((N))`` -> ``N``: outer parentheses that enclose the whole expression dropped."""
    text = "".join(text.split())
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for position, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0 and position < len(text) - 1:
                return text  # `(a)+(b)`: the first parenthesis closes early
        text = text[1:-1]
    return text


def _drop_unsigned(node: Node) -> Node:
    """``(unsigned)rows`` -> ``rows``."""
    inner = strip_parens(node)
    if inner.type == "cast_expression":
        value = inner.child_by_field_name("value")
        if value is not None:
            return value
    return node


def _ceil_div(source: ParsedSource, count: str, block: Node, threads: int | None = None) -> str:
    """``((count + 255) / 256)``, or ``((count + kThreads - 1) / kThreads)``; ``threads``: the
    block's thread count where the block is not one number (a 32 x y block)."""
    numerator = _numerator(count)
    if threads is not None:
        return f"(({numerator} + {threads - 1}) / {threads})"
    value = fold(source, block)
    if value is not None and source.text_of(block).strip().isdigit():
        return f"(({numerator} + {value - 1}) / {value})"
    size = source.text_of(block)
    size = size if precedence(block) >= PRIMARY else f"({size})"
    return f"(({numerator} + {size} - 1) / {size})"


def _indent(source: ParsedSource, kernel: Function) -> str:
    assert kernel.body is not None
    for statement in named_statements(kernel.body):
        if source.starts_line(statement.start_byte) and not statement.type.startswith("preproc"):
            return source.indent_of(statement.start_byte)
    return "  "
