"""Coarsening by rows per block, forward: ``K`` rows a block instead of one.

The inverse of :mod:`klineage.mechanisms._coarsening_rows`, on a kernel whose block handles
the row ``t = a + s * blockIdx.x`` (``s`` is +1 or -1), declared at the top of its body and
followed at once by the guard later rows would also take::

    int t = T - 1 - blockIdx.x;          // or: int t0 = ...; int t = t0;
    if (t < 0) return;                   // rows walked downwards (upwards: `t >= rows`)
    ...row code...

becomes, with the one ``blockIdx.x`` of the kernel scaled by ``K`` and every launch's grid
along x divided by ``K`` (rounded up; ``G * K`` loses its factor)::

    int t = T - 1 - 4 * blockIdx.x;
    for (int r = 0; r < 4; ++r) {
      int t_r = t - r;  // the row code reads the row under its old name
      if (t_r < 0) return;
      ...row code...
      __syncthreads();                     // only where the row code writes shared memory
    }

The result must be in the form the removal reads, with turns that carry nothing from one row
to the next: the removal is run on it, and its row must come back as the old one, or the
application is refused with the removal's reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.callgraph import BLOCK_BARRIERS
from klineage.cuda.cexpr import precedence
from klineage.cuda.edit import Edit, apply_edits
from klineage.cuda.source import Function, Node, ParsedSource, call_name
from klineage.cuda.tree import (
    NotInForm,
    builtin_of,
    fresh_name,
    operator_of,
    strip_parens,
    walk,
)
from klineage.mechanisms._coarsening_rows import grid_along_x, rows_loop_removal
from klineage.mechanisms._local_util import index_declaration, shift, statements

__all__ = ["BlockRows", "block_rows_of", "rows_per_block_edits"]

_NEEDED = (
    "a block per row: `int t = a +/- blockIdx.x;` at the top of the kernel (blockIdx.x read "
    "nowhere else, gridDim.x not at all), followed by `if (t < e) return;` (rows walked "
    "downwards) or `if (t >= e) return;` (upwards), and a launch whose grid along x is an "
    "expression"
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class BlockRows:
    """A kernel that gives each block one row."""

    function: Function
    row: Node
    """The row's declaration, a statement of the kernel's body."""
    name: str
    """The row variable."""
    block: Node
    """The one ``blockIdx.x`` of the kernel."""
    down: bool
    """Rows walked downwards (``t = a - blockIdx.x``)."""


def block_rows_of(source: ParsedSource, function: Function) -> BlockRows | None:
    """The block-per-row form of ``function``; None where no statement declares a row
    ``a +/- blockIdx.x`` (no candidate at all), NotInForm naming what else differs."""
    body = function.body
    if body is None:
        raise _refuse(f"{function.name} without a body")
    blocks = [
        n
        for n in walk(body)
        if n.type == "field_expression" and builtin_of(source, n) == "blockIdx.x"
    ]
    if not blocks:
        return None
    reads_grid = any(
        n.type == "field_expression" and builtin_of(source, n) == "gridDim.x" for n in walk(body)
    )
    indices = analysis(source).indices(function)
    top = statements(body)
    unguarded = []
    for position, statement in enumerate(top[:-1]):
        declared = index_declaration(source, statement)
        if declared is None:
            continue
        name, _, value = declared
        form = indices.form(value)
        sign = form.coefficient("blockIdx.x").value
        if sign not in (1, -1) or indices.thread_atoms(form) - {"blockIdx.x"}:
            continue
        if len(blocks) != 1:
            raise _refuse(f"{function.name} reading blockIdx.x {len(blocks)} times, not once")
        if reads_grid:
            raise _refuse(f"{function.name} reading gridDim.x, which fewer blocks would change")
        if _guard(source, top[position + 1], name, down=sign == -1):
            return BlockRows(function, statement, name, blocks[0], down=sign == -1)
        unguarded.append((name, sign))
    if unguarded:
        name, sign = unguarded[-1]
        raise _refuse(
            f"the row {name} of {function.name} without the guard `if ({name} "
            f"{'<' if sign == -1 else '>='} e) return;` right after it"
        )
    return None


def _guard(source: ParsedSource, statement: Node, row: str, *, down: bool) -> bool:
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return False
    condition = statement.child_by_field_name("condition")
    values = [c for c in condition.named_children if c.type != "comment"] if condition else []
    test = strip_parens(values[0]) if len(values) == 1 else None
    wanted = ("<", "<=") if down else (">", ">=")
    if test is None or test.type != "binary_expression" or operator_of(test) not in wanted:
        return False
    left = test.child_by_field_name("left")
    consequence = statement.child_by_field_name("consequence")
    inner = (
        statements(consequence)
        if consequence is not None and consequence.type == "compound_statement"
        else [consequence]
    )
    return (
        left is not None
        and source.text_of(strip_parens(left)) == row
        and len(inner) == 1
        and inner[0] is not None
        and " ".join(source.text_of(inner[0]).split()) == "return;"
    )


def _touches_shared(source: ParsedSource, function: Function, start: int) -> bool:
    """Whether the code from byte ``start`` on writes shared memory, or calls a function of
    the file that declares shared memory (a block reduction's scratch): a next turn could
    then overwrite what a slow thread of this one still reads."""
    accesses = analysis(source).indices(function).accesses()
    if any(
        a.buffer.space == "shared" and a.direction == "store" and a.node.start_byte >= start
        for a in accesses
    ):
        return True
    assert function.body is not None
    body = function.body
    graph = analysis(source).call_graph
    called = {
        name
        for call in source.calls
        if start <= call.node.start_byte < body.end_byte
        for name in (call.name, *graph.reachable(call.name))
    }
    return any(
        helper.body is not None and "__shared__" in source.text_of(helper.body)
        for name in called
        for helper in graph.functions_named(name)
    )


def _grid_edit(source: ParsedSource, grid: Node, rows: int) -> Edit:
    target = grid_along_x(source, grid)
    text = " ".join(source.text_of(target).split())
    inner = strip_parens(target)
    if inner.type == "binary_expression" and operator_of(inner) == "*":
        right = inner.child_by_field_name("right")
        left = inner.child_by_field_name("left")
        if right is not None and left is not None and source.text_of(right).strip() == str(rows):
            return Edit.replace(target, source.text_of(left))  # `G * K` was K rows' blocks
    numerator = text if precedence(target) >= 12 else f"({text})"  # 12: additive
    return Edit.replace(target, f"({numerator} + {rows - 1}) / {rows}")


def rows_per_block_edits(source: ParsedSource, form: BlockRows, rows: int) -> list[Edit]:
    """``rows`` rows a block: the edits, checked by removing them again."""
    function, body = form.function, form.function.body
    assert body is not None
    launches = source.launches_of(function)
    if not launches:
        raise _refuse(f"no launch of {function.name} in this file")
    grids = [launch.grid for launch in launches]
    if any(grid is None for grid in grids):
        raise _refuse(f"a launch of {function.name} without a grid")
    taken = {source.text_of(n) for n in walk(function.node) if n.type == "identifier"}
    turn = fresh_name(taken, "row_turn")
    declared = index_declaration(source, form.row)
    assert declared is not None
    name, specifiers, value = declared
    kind = f"{specifiers} "  # the row keeps its type and qualifiers (`const int64_t r`)
    scaled = f"{rows} * {source.text_of(form.block)}"
    edits: list[Edit] = []
    indent = source.indent_of(form.row.start_byte)
    lines = []
    if value.start_byte <= form.block.start_byte < value.end_byte:
        # the block's first row gets a local of its own, outside the turns
        first_row = fresh_name(taken | {turn}, f"{name}_first")
        value_text = (
            source.text_of((value.start_byte, form.block.start_byte))
            + (scaled if value == form.block else f"({scaled})")
            + source.text_of((form.block.end_byte, value.end_byte))
        )
        lines.append(f"{kind}{first_row} = {value_text};")
    else:
        first_row = source.text_of(value)
        if precedence(value) < 12:  # 12: additive, so `first - turn` keeps its meaning
            first_row = f"({first_row})"
        edits.append(Edit.replace(form.block, f"({scaled})"))
    top = statements(body)
    last = top[-1]
    code = source.text_of((top[top.index(form.row) + 1].start_byte, last.end_byte))
    step = indent[len(source.indent_of(function.node.start_byte)) :] or "  "  # the file's unit
    lines += [
        f"{indent if lines else ''}for (int {turn} = 0; {turn} < {rows}; ++{turn}) {{",
        f"{indent}{step}{kind}{name} = {first_row} {'-' if form.down else '+'} {turn};",
        f"{indent}{step}{shift(code, len(step))}",
    ]
    if _touches_shared(source, function, form.row.end_byte) and not _is_barrier(source, last):
        lines.append(f"{indent}{step}__syncthreads();  // the next row writes what this one read")
    lines.append(f"{indent}}}")
    edits.append(Edit(form.row.start_byte, last.end_byte, "\n".join(lines)))
    edits += [_grid_edit(source, grid, rows) for grid in grids if grid is not None]
    _check(source, function, edits, name)
    return edits


def _is_barrier(source: ParsedSource, statement: Node) -> bool:
    """Whether ``statement`` is itself a block barrier (``__syncthreads();``, ``block.sync();``).
    A loop or a helper that holds one does not count: shared memory written after its barrier
    is still being read when the next row starts writing."""
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    call = strip_parens(statement.named_children[0])
    if call.type != "call_expression":
        return False
    barrier = analysis(source).cooperative_groups.barrier_at(call)
    block_barrier = barrier is not None and barrier.scope == "block"
    return block_barrier or (call_name(source, call) or "") in BLOCK_BARRIERS


def _check(source: ParsedSource, function: Function, edits: list[Edit], row: str) -> None:
    """The result is rows per block as the removal reads it, and removing it gives the old
    row back."""
    before = analysis(source).indices(function).form(_row_value(source, function, row))
    coarsened = apply_edits(source, edits).parsed
    again = coarsened.function(function.name)
    loops = (
        [s for s in statements(again.body) if s.type == "for_statement"]
        if again is not None and again.body is not None
        else []
    )
    if again is None or not loops:
        raise _refuse(f"a kernel {function.name} the rewrite lost")
    removal = rows_loop_removal(coarsened, again, loops[-1])
    back = apply_edits(coarsened, removal).parsed
    function_back = back.function(function.name)
    assert function_back is not None
    after = analysis(back).indices(function_back).form(_row_value(back, function_back, row))
    if str(after) != str(before):
        raise _refuse(f"a row {row} = {before} the rewrite cannot keep ({after})")


def _row_value(source: ParsedSource, function: Function, row: str) -> Node:
    assert function.body is not None
    for statement in walk(function.body):
        declared = index_declaration(source, statement)
        if declared is not None and declared[0] == row:
            return declared[2]
    raise _refuse(f"a row {row} the rewrite lost")
