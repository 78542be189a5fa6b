"""Group per row -> thread per row (the removal): the walker's edits, a thread row index
with its bound check, and a launch of ``ceil(rows / block)`` blocks of the same size."""

from __future__ import annotations

import re

from klineage.cuda.cexpr import PRIMARY, precedence, to_size_expr
from klineage.cuda.constexpr_branches import emptied_branches
from klineage.cuda.edit import Edit
from klineage.cuda.facts import launch_names
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.mechanisms._block_rows_helper import HelperRowsError, helper_rows, outside
from klineage.mechanisms._reductions_util import (
    fold,
    fresh_name,
    inside,
    is_builtin,
    named_statements,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    Group,
    NotCanonical,
    bound_check,
    count_numerator,
    is_lane,
    row_count,
    single_init,
    spread_reason,
)
from klineage.mechanisms._rows_group_walker import GroupRows, GroupWalker
from klineage.mechanisms._rows_helpers import helper_deletions
from klineage.mechanisms._rows_index import (
    RowIndex,
    block_row_uses,
    helper_block_reductions,
    warp_row_index,
)
from klineage.mechanisms._tiles_util import orphaned_declarations
from klineage.mechanisms._warp_rows_2d import (
    THREAD_ROW_2D,
    block_width_asserts,
)


def group_rows(source: ParsedSource, kernel: Function, group: Group) -> GroupRows:
    """The edits that turn a block- (or warp-) per-row kernel into a thread-per-row one;
    :class:`NotCanonical` says why not."""
    helpers = helper_block_reductions(source, kernel) if group == "block" else []
    if helpers:
        return _helper_group_rows(source, kernel, helpers)
    emptied, untaken = emptied_branches(source, kernel)
    walker = GroupWalker(source, kernel, group, untaken)
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
    walker = GroupWalker(source, kernel, "block", [])
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


def _block_layout(walker: GroupWalker) -> RowIndex:
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


def _warp_layout(walker: GroupWalker) -> RowIndex:
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
    declared = single_init(source, statement)
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
    return RowIndex(statement, declared[0], value, replacement, bound)


def _loose_bound_check(
    source: ParsedSource, kernel: Function, statement: Node
) -> tuple[Node, Node] | None:
    """For a check written ``if (row > rows) return;`` right after the row index, its test
    and ``rows``; None for any other statement."""
    assert kernel.body is not None
    statements = named_statements(kernel.body)
    declared = single_init(source, statement)
    position = statements.index(statement) if statement in statements else -1
    if declared is None or position < 0 or position + 1 >= len(statements):
        return None
    bound = bound_check(source, statements[position + 1], declared[0], op=">")
    if bound is None or bound.parent is None:
        return None
    return bound.parent, bound


def _bound_after(source: ParsedSource, kernel: Function, statement: Node) -> Node | None:
    assert kernel.body is not None
    statements = named_statements(kernel.body)
    position = statements.index(statement) if statement in statements else -1
    if position < 0 or position + 1 >= len(statements):
        return None
    declared = single_init(source, statement)
    return bound_check(source, statements[position + 1], declared[0]) if declared else None


def _block_index(source: ParsedSource, walker: GroupWalker) -> RowIndex:
    """Rewrite the block row index into a thread row index."""
    kernel = walker.kernel
    uses = block_row_uses(source, kernel)
    if uses is None:
        raise NotCanonical(f"{kernel.name} does not index its rows by blockIdx.x alone")
    assert kernel.body is not None
    for statement in named_statements(kernel.body):
        declared = single_init(source, statement)
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
        return RowIndex(
            statement, declared[0], value, replacement, _bound_after(source, kernel, statement)
        )
    taken = {p.name or "" for p in kernel.params} | {
        source.text_of(n) for n in inside(source, kernel.body, "identifier")
    }
    name = fresh_name(taken, "row")
    for use in uses:
        walker.edits.append(Edit.replace(use, name))
        walker.handled.append(use)
    return RowIndex(None, name, None, None, None)


def _lane_variable(source: ParsedSource, kernel: Function) -> tuple[str | None, Node | None]:
    assert kernel.body is not None
    for statement in named_statements(kernel.body):
        declared = single_init(source, statement)
        if declared is not None and is_lane(source, declared[1]):
            return declared[0], statement
    return None, None


def _drop_lane(source: ParsedSource, walker: GroupWalker, statement: Node, name: str) -> None:
    """The lane variable goes once nothing but handled code uses it."""
    assert walker.kernel.body is not None
    for node in inside(source, walker.kernel.body, "identifier"):
        if source.text_of(node) != name or within(node, statement):
            continue
        if any(within(node, h) for h in walker.handled):
            continue
        if any(a <= node.start_byte and node.end_byte <= b for a, b in walker.removed):
            continue
        raise NotCanonical(
            spread_reason(f"the lane variable {name}", source.line_of(node.start_byte))
        )
    walker.delete(statement)


def _thread_launches(source: ParsedSource, walker: GroupWalker, index: RowIndex) -> list[Edit]:
    """The bound check (and a row-count parameter when there is none) and launches of
    ceil(rows / block) blocks."""
    kernel = walker.kernel
    assert kernel.body is not None
    edits: list[Edit] = []
    bound_text: str | None = None
    if index.bound is not None:
        bound = index.bound
        counts = [row_count(source, kernel, launch, bound) for launch in walker.launches]
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


def _no_dynamic_shared(source: ParsedSource, walker: GroupWalker) -> list[Edit]:
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
    numerator = count_numerator(count)
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
