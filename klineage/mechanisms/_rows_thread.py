"""Thread per row, the naive form (:class:`ThreadRows`): the row index and bound check a
kernel starts with, and the walk of its row loops (:mod:`._rows_thread_walker`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import assigned_names, identifier_names
from klineage.mechanisms._reductions_util import (
    builtin_uses,
    call_name,
    graph,
    inside,
    named_statements,
    within,
)
from klineage.mechanisms._rows_forms import (
    SYNC_CALLS,
    WARP_INTRINSICS,
    Group,
    NotCanonical,
    RowLoop,
    bound_check,
    expression_of,
    global_thread_index,
    single_init,
)
from klineage.mechanisms._rows_helper_forward import HelperRows, helper_rows
from klineage.mechanisms._rows_helpers import layout_bound
from klineage.mechanisms._rows_thread_walker import ThreadWalker
from klineage.mechanisms._warp_rows_2d import (
    block_threads_2d,
    block_width_asserts,
    row_of_thread_2d,
)


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
    helpers: list[HelperRows] = field(default_factory=list)
    """Helpers holding the row's reduction, when the kernel's own loops fold nothing."""


def _leading_constants(source: ParsedSource, statements: list[Node]) -> int:
    """How many statements at the start of a body only name compile-time integers (``const
    int U = 8;``, ``constexpr int kWarps = 4;``), the same for every thread (``int BT = B *
    T;`` of parameters, never written again) or types (``using V = Packed128<float>;``), or
    assert the block's width (``assert(blockDim.x == 32)``, which the row layout checks):
    what may precede the row index."""
    constants: dict[str, int | str] = dict(source.integer_constants)
    function = source.enclosing_function(statements[0]) if statements else None
    params = {p.name for p in function.params if p.name} if function is not None else set()
    uniform = params | set(constants)
    body = function.body if function is not None else None
    count = 0
    for statement in statements:
        if statement.type in ("comment", "alias_declaration", "type_definition"):
            count += 1
            continue
        if _is_width_assert(source, statement):
            count += 1
            continue
        declared = single_init(source, statement)
        qualifiers = {
            source.text_of(c)
            for c in statement.children
            if c.type in ("type_qualifier", "storage_class_specifier")
        }
        value = fold_int(source, declared[1], constants) if declared is not None else None
        if declared is not None and value is not None and qualifiers & {"const", "constexpr"}:
            constants[declared[0]] = value
        elif not _uniform_local(source, declared, uniform, body):
            break
        uniform.add(declared[0])
        count += 1
    return count


def _uniform_local(
    source: ParsedSource, declared: tuple[str, Node] | None, uniform: set[str], body: Node | None
) -> bool:
    """``int BT = B * T;``: a local of the function ``body`` never written again, of
    arithmetic on names every thread holds alike (parameters, earlier such locals): no call,
    no field (``threadIdx.x``, a struct's member), no other name."""
    if declared is None or body is None:
        return False
    name, value = declared
    if inside(source, value, "call_expression", "field_expression"):
        return False
    names = {source.text_of(n) for n in inside(source, value, "identifier")}
    return bool(names) and names <= uniform and name not in assigned_names(source, body)


def _is_width_assert(source: ParsedSource, statement: Node) -> bool:
    """``assert(blockDim.x == 32);`` as a statement of its own."""
    expression = expression_of(statement)
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
    declared = single_init(source, statements[0])
    if declared is None:
        return None
    name, value = declared
    block = global_thread_index(source, value) or row_of_thread_2d(source, value)
    bound = bound_check(source, statements[1], name)
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
    walker = ThreadWalker(source, kernel, group)
    for statement in statements[2:]:
        walker.statement(statement)
    helpers: list[HelperRows] = []
    if not any(loop.accumulators or loop.pairs for loop in walker.loops):
        helpers = helper_rows(source, kernel, statements[2:])
        if not helpers:
            raise NotCanonical(f"{kernel.name} has no loop that reduces its row")
        _check_helper_inputs(source, kernel, helpers, {b for b, _, _ in walker.store_targets})
    walker.check_memory()
    return ThreadRows(kernel, value, block, bound, walker.loops, walker.stores, warps_2d, helpers)


def _check_helper_inputs(
    source: ParsedSource, kernel: Function, helpers: list[HelperRows], stored: set[str]
) -> None:
    """A helper's row is read before the kernel's threads store anything, but another thread
    of the group may store while a slower one still reads: no helper may read what the kernel
    writes."""
    for rows in helpers:
        for call in source.calls_named(rows.helper.name):
            read = {n for a in call.args for n in identifier_names(source, a)} & stored
            if read:
                raise NotCanonical(
                    f"{rows.helper.name} reads {sorted(read)[0]} (line "
                    f"{source.line_of(call.node.start_byte)}), which {kernel.name} writes"
                )


def thread_row_walk(
    source: ParsedSource, kernel: Function, statements: list[Node], allowed: list[Node]
) -> tuple[list[RowLoop], list[Node]]:
    """(row loops, stores outside loops) of ``statements``, a thread-per-row kernel's code
    whose row index is spelled otherwise (the nodes ``allowed`` may use the thread layout);
    its loops may also run while ``c <= n`` (a causal row up to its diagonal). For forms
    that write a block per row back in another spelling; :class:`NotCanonical` says why not."""
    _check_thread_local(source, kernel, allowed)
    walker = ThreadWalker(source, kernel, "block", inclusive=True)
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
            why = layout_bound(source, function)
            if why is not None:
                raise NotCanonical(f"{kernel.name} calls {callee}, which {why}")
    for node in inside(source, kernel.body, "call_expression"):
        called = call_name(source, node)
        if called in SYNC_CALLS or called in WARP_INTRINSICS:
            raise NotCanonical(f"{kernel.name} calls {called}")
