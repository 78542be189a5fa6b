"""A thread-per-row running sum rewritten as one warp per row that scans the row 32 elements
at a time with ``__shfl_up_sync``: the forward rule of warp_shuffle_scan on naive row scans.

The form it takes (a cumulative sum, one thread walking its row)::

    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    ...declarations that read no accumulator...
    float acc = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      acc += VALUE(c);
      TARGET(c) = acc;
    }

and what it writes: the row index becomes ``(global thread) >> 5`` (a warp per row, the launch
giving ``block / 32`` rows a block), and the loop a chunked warp scan::

    for (int64_t c_base = 0; c_base < cols; c_base += 32) {
      const int64_t c = c_base + lane;
      float acc_part = c < cols ? (VALUE(c)) : 0.0f;
      #pragma unroll
      for (int acc_offset = 1; acc_offset < 32; acc_offset <<= 1) {  // Hillis-Steele
        const float acc_up = __shfl_up_sync(MASK, acc_part, acc_offset);
        if (lane >= acc_offset) acc_part += acc_up;
      }
      if (c < cols) TARGET(c) = acc + acc_part;
      acc += __shfl_sync(MASK, acc_part, 31);  // the chunk's total, carried to the next
    }

The row check returns whole warps (every lane of a warp has the same row when the block is a
multiple of 32), so the full-mask shuffles always have all 32 lanes. Sums are added in another
order than the serial loop's, as any parallel scan does.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import fresh_name
from klineage.mechanisms._local_util import (
    binary,
    identifiers,
    index_declaration,
    names_in_function,
    strip_parens,
)
from klineage.mechanisms._reductions_util import named_statements
from klineage.mechanisms._rows_forms import NotCanonical, expression_of
from klineage.mechanisms._rows_spread import check_launch_bounds, launch_edits_to_groups
from klineage.mechanisms._rows_thread import ThreadRows, thread_row_start
from klineage.mechanisms._rows_thread_walker import unit_step

ZERO = {"0", "0.0", "0.0f", "0.f", "0.0F", "0.F"}


@dataclass(frozen=True)
class RowScan:
    """A thread-per-row kernel whose one loop writes the running sum of its row."""

    rows: ThreadRows
    guard: Node
    """The ``if (r >= rows) return;`` statement."""
    loop: Node
    variable: str
    """The loop's variable (``c``), declared with ``index_type``."""
    index_type: str
    bound: Node
    """``cols`` in ``c < cols``."""
    accumulator: str
    value: Node
    """``VALUE(c)`` in ``acc += VALUE(c);``."""
    target: Node
    """``TARGET(c)`` in ``TARGET(c) = acc;``."""


def _uses(source: ParsedSource, node: Node, name: str) -> bool:
    return any(source.text_of(n) == name for n in identifiers(source, node))


def _added(statement: Node) -> tuple[Node, Node] | None:
    """``(left, right)`` of the statement ``left += right;``; None for any other."""
    node = expression_of(statement)
    if node is None or node.type != "assignment_expression":
        return None
    operator = node.child_by_field_name("operator")
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if operator is None or operator.type != "+=" or left is None or right is None:
        return None
    return left, right


def row_scan(source: ParsedSource, kernel: Function) -> RowScan:
    """The running-sum form of ``kernel``; :class:`NotCanonical` says what differs."""
    value, block, bound, statements = thread_row_start(source, kernel)
    rest = [s for s in statements[2:] if s.type != "comment"]
    if len(rest) < 2 or rest[-1].type != "for_statement":
        raise NotCanonical(f"{kernel.name} does not end with its row's loop")
    loop, declared = rest[-1], index_declaration(source, rest[-2])
    if declared is None or source.text_of(declared[2]) not in ZERO:
        raise NotCanonical("the loop is not preceded by an accumulator set to zero")
    accumulator, specifiers, _ = declared
    if specifiers.split()[-1] != "float":
        raise NotCanonical(f"{accumulator} is not a float (the scan shuffles a float)")
    for statement in rest[:-2]:
        if statement.type != "declaration" or _uses(source, statement, accumulator):
            raise NotCanonical(f"line {source.line_of(statement.start_byte)} is not a declaration")
    init = loop.child_by_field_name("initializer")
    header = index_declaration(source, init) if init is not None else None
    if header is None or source.text_of(header[2]) != "0":
        raise NotCanonical("the row's loop does not start at 0")
    variable, index_type = header[0], header[1]
    condition = loop.child_by_field_name("condition")
    sides = binary(strip_parens(condition), "<") if condition is not None else None
    if sides is None or source.text_of(strip_parens(sides[0])) != variable:
        raise NotCanonical(f"the row's loop does not run while {variable} < a bound")
    if not unit_step(source, loop.child_by_field_name("update"), variable):
        raise NotCanonical(f"the row's loop does not step {variable} by 1")
    body = loop.child_by_field_name("body")
    inner = named_statements(body) if body is not None and body.type == "compound_statement" else []
    inner = [s for s in inner if s.type != "comment"]
    adds = _added(inner[0]) if len(inner) == 2 else None
    stores = plain_assignment(inner[1]) if len(inner) == 2 else None
    running = (
        adds is not None
        and stores is not None
        and source.text_of(adds[0]) == accumulator
        and not _uses(source, adds[1], accumulator)
        and source.text_of(stores[1]) == accumulator
    )
    if not running or adds is None or stores is None:
        raise NotCanonical(f"the loop's body is not `{accumulator} += v; out[] = {accumulator};`")
    if stores[0].type != "subscript_expression" or _uses(source, stores[0], accumulator):
        raise NotCanonical("the running sum is not stored through a subscript")
    if _uses(source, sides[1], variable) or _uses(source, sides[1], accumulator):
        raise NotCanonical(f"the bound {source.text_of(sides[1])} changes in the loop")
    rows = ThreadRows(kernel, value, block, bound, loops=[], stores=[])
    return RowScan(
        rows, statements[1], loop, variable, " ".join(index_type.split()), sides[1],
        accumulator, adds[1], stores[0],
    )  # fmt: skip


def chunk_start(
    source: ParsedSource, scan: RowScan, base: str, part: str, turn: tuple[str, str], step: str
) -> list[str]:
    """The head of a chunked scan loop: chunks of ``turn[0]`` elements from 0, the thread's
    element ``base + turn[1]``, its value (zero past the row's end) in ``part``."""
    c, n, value = scan.variable, source.text_of(scan.bound), source.text_of(scan.value)
    return [
        f"for ({scan.index_type} {base} = 0; {base} < {n}; {base} += {turn[0]}) {{",
        f"{step}const {scan.index_type} {c} = {base} + {turn[1]};",
        f"{step}float {part} = {c} < {n} ? ({value}) : 0.0f;",
    ]


def hillis_steele(at: str, part: str, lane: str, offset: str, up: str, mask: str) -> list[str]:
    """The lines of an inclusive scan of ``part`` across a warp by ``__shfl_up_sync``."""
    return [
        f"{at}#pragma unroll",
        f"{at}for (int {offset} = 1; {offset} < 32; {offset} <<= 1) {{",
        f"{at}  const float {up} = __shfl_up_sync({mask}, {part}, {offset});",
        f"{at}  if ({lane} >= {offset}) {part} += {up};",
        f"{at}}}",
    ]


def scan_edits(source: ParsedSource, scan: RowScan, block_size: int, mask: str) -> list[Edit]:
    """The edits that give each row a warp scanning it in chunks of 32."""
    if block_size % 32 or not 32 <= block_size <= 1024:
        raise NotCanonical(f"block_size={block_size} is not a multiple of 32 in 32..1024")
    taken = names_in_function(source, scan.rows.kernel)
    lane = fresh_name(taken, "lane")
    c, acc = scan.variable, scan.accumulator
    base, part, offset, up = (fresh_name(taken, n) for n in (
        f"{c}_base", f"{acc}_part", f"{acc}_offset", f"{acc}_up"
    ))  # fmt: skip
    n, target = source.text_of(scan.bound), source.text_of(scan.target)
    at = source.indent_of(scan.loop.start_byte)
    step = at + "  "
    loop = "\n".join([
        *chunk_start(source, scan, base, part, ("32", lane), step),
        *hillis_steele(step, part, lane, offset, up, mask),
        f"{step}if ({c} < {n}) {target} = {acc} + {part};",
        f"{step}{acc} += __shfl_sync({mask}, {part}, 31);",
        f"{at}}}",
    ])  # fmt: skip
    index = source.text_of(scan.rows.index)
    guard_indent = source.indent_of(scan.guard.start_byte)
    check_launch_bounds(source, scan.rows.kernel, block_size)
    return [
        Edit.replace(scan.rows.index, f"({index}) >> 5"),
        Edit.insert(scan.guard.end_byte, f"\n{guard_indent}const int {lane} = threadIdx.x & 31;"),
        Edit.replace(scan.loop, loop),
        *launch_edits_to_groups(source, scan.rows, "warp", block_size),
    ]
