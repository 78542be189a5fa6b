"""Vectorized block scans: a block that scans a row ``blockDim.x`` floats a turn, one per
thread, scans it ``blockDim.x * W`` a turn instead, each thread loading ``W`` consecutive
floats as one vector.

The form it takes (a chunked block scan, as block-per-row scans are written, block_per_row's
own ``form=scan`` at its default ``items_per_thread=1`` among them; its runs of several
consecutive elements a thread are coarsened already)::

    for (IT base = 0; base < N; base += blockDim.x) {
      const IT c = base + threadIdx.x;
      float v = c < N ? (IN[c]) : 0.0f;
      ...statements that scan v across the block: a warp scan with __shfl_up_sync, the warps'
         totals through shared memory and __syncthreads, the totals below (BELOW) and of the
         turn (TURN) added up...
      if (c < N) OUT[c] = carry + BELOW + v;         // v and per-thread terms, in any order
      carry += TURN;
      __syncthreads();
    }

and what it writes: the same loop behind a check that the row can be read as vectors (``N``
a multiple of ``W``, both pointers aligned to the vector's bytes), and in front of it the
vector loop, where each thread adds up its own ``W`` floats in order, the block scans the
threads' totals with the loop's own scan statements, and each thread adds what the lanes
below it in its warp hold (one more ``__shfl_up_sync``), the other terms and the carry::

    if (N % W == 0 && reinterpret_cast<unsigned long long>(IN) % BYTES == 0 && ...OUT...) {
      for (IT base = 0; base < N; base += blockDim.x * W) {
        const IT c = base + W * threadIdx.x;
        VT v_vec = make_VT(0.0f, ...);
        if (c < N) v_vec = *reinterpret_cast<const VT*>(&IN[c]);
        ...the thread's running sums, v = its total, the scan statements...
        float v_below = __shfl_up_sync(0xffffffffu, v, 1);
        if ((threadIdx.x & 31) == 0) v_below = 0.0f;
        if (c < N) { ...each element += carry + BELOW + v_below...; store v_vec to &OUT[c]... }
        carry += TURN;
        __syncthreads();
      }
    } else {
      the scalar loop
    }

A turn's statements run once a thread either way, so the scan of the threads' totals is the
scan the loop did of their elements. The check runs on the device: rows that cannot be read
as vectors take the scalar loop. Sums are added in another order (within float rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.source import Function, Node, ParsedSource, call_name
from klineage.cuda.tree import NotInForm, assigned_names
from klineage.mechanisms._local_util import (
    binary,
    expr_type,
    index_declaration,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._reductions_tree import _is_syncthreads
from klineage.mechanisms._scan_rows import _added
from klineage.mechanisms._vector_scan import (
    ScanTurn,
    _guarded_load,
    _subscript_at,
    chunk_header,
    chunked_vector_text,
    guarded_assignment,
    only_scans,
)

BLOCK_SCAN_CALLS = frozenset({"__shfl_up_sync", "__shfl_sync", "__syncwarp", "__syncthreads"})
"""What a block scan's statements may call: run once a turn by every thread either way."""
FULL_MASK = "0xffffffffu"
OTHER_DIMENSIONS = ("threadIdx.y", "threadIdx.z", "blockDim.y", "blockDim.z")
"""A block of more than one dimension would group its warps other than by ``threadIdx.x``."""


@dataclass(frozen=True)
class BlockScanLoop:
    """A chunked block scan: one float per thread a turn, the turn's total carried."""

    loop: Node
    base: str
    index_type: str
    bound: str
    """``N`` in ``base < N``."""
    element: str
    """``c`` in ``const IT c = base + threadIdx.x;``."""
    value: str
    """``v``, the thread's float."""
    source_pointer: str
    target_pointer: str
    scan: list[Node]
    """The statements between the load and the store: the scan of ``v`` across the block."""
    added: list[str]
    """The terms the store adds to ``v`` (the carry among them), in their order."""
    carry: str
    turn: str
    """What the carry grows by each turn: the block's total of the turn."""


def _is_thread(source: ParsedSource, function: Function, node: Node) -> bool:
    return analysis(source).indices(function).form(node) == IndexForm.atom("threadIdx.x")


def _sum_terms(source: ParsedSource, node: Node) -> list[str] | None:
    """The identifiers a sum adds (``a + b + c`` -> a, b, c), or None for anything else."""
    node = strip_parens(node)
    if node.type == "identifier":
        return [source.text_of(node)]
    sides = binary(node, "+")
    if sides is None:
        return None
    left, right = _sum_terms(source, sides[0]), _sum_terms(source, sides[1])
    return None if left is None or right is None else left + right


def _guarded_store(
    source: ParsedSource, statement: Node, element: str, bound: str, value: str
) -> tuple[str, list[str]] | None:
    """``(P, terms)`` of ``if (element < bound) P[element] = TERMS + value + TERMS;``."""
    stored = guarded_assignment(source, statement, element, bound)
    if stored is None:
        return None
    pointer = _subscript_at(source, stored[0], element)
    terms = _sum_terms(source, stored[1])
    if pointer is None or terms is None or terms.count(value) != 1 or len(terms) < 2:
        return None
    return pointer, [t for t in terms if t != value]


def block_scan_loop(source: ParsedSource, loop: Node) -> BlockScanLoop:
    """The chunked block scan ``loop`` is; :class:`NotInForm` says what differs."""
    function = source.enclosing_function(loop)
    if function is None or not function.runs_on_device:
        raise NotInForm("a loop outside device code", "a loop of a kernel")
    used = {source.text_of(n) for n in walk(function.node) if n.type == "field_expression"}
    if used & set(OTHER_DIMENSIONS):
        raise NotInForm("a kernel whose blocks have more than one dimension", "1-D blocks")
    base, index_type, bound_node, step_by = chunk_header(source, loop, "blockDim.x")
    bound = source.text_of(bound_node)
    if source.text_of(strip_parens(step_by)) != "blockDim.x":
        raise NotInForm("a loop that does not step by blockDim.x", "one element a thread a turn")
    body = loop.child_by_field_name("body")
    inside = statements(body) if body is not None and body.type == "compound_statement" else []
    if len(inside) < 6:
        raise NotInForm("a loop body of fewer than six statements", "load, scan, store, carry")
    index = index_declaration(source, inside[0])
    offset = binary(strip_parens(index[2]), "+") if index is not None else None
    if index is None or offset is None:
        raise NotInForm("a loop whose first statement is no index", "c = base + threadIdx.x")
    parts = [strip_parens(offset[0]), strip_parens(offset[1])]
    if source.text_of(parts[1]) == base:
        parts.reverse()
    if source.text_of(parts[0]) != base or not _is_thread(source, function, parts[1]):
        raise NotInForm(
            "an index that is not the chunk's start plus the thread", "c = base + threadIdx.x"
        )
    element = index[0]
    loaded = _guarded_load(source, inside[1], element, bound)
    if loaded is None:
        raise NotInForm("a loop that does not load one float a thread", "v = c < N ? in[c] : 0")
    value, source_pointer = loaded
    if not _is_syncthreads(source, inside[-1]):
        raise NotInForm("a loop that does not end on a barrier", "__syncthreads() last")
    carried = _added(inside[-2])
    stored = _guarded_store(source, inside[-3], element, bound, value)
    turn = strip_parens(carried[1]) if carried is not None else None
    if carried is None or stored is None or turn is None or turn.type != "identifier":
        raise NotInForm("a loop that does not end store, then carry", "out[c] = carry + v")
    carry = source.text_of(carried[0])
    if carry not in stored[1]:
        raise NotInForm("a store that does not add the carry", "out[c] = carry + below + v")
    scan = inside[2:-3]
    calls = {call_name(source, n) for s in scan for n in walk(s) if n.type == "call_expression"}
    if not {"__shfl_up_sync", "__syncthreads"} <= calls:
        raise NotInForm("statements between load and store that are no block scan", "a scan")
    names = {source.text_of(n) for s in scan for n in walk(s) if n.type == "identifier"}
    shared = frozenset(
        name
        for declaration in source.shared_declarations
        if function.node.start_byte <= declaration.node.start_byte < function.node.end_byte
        for name in declaration.names
    )
    if names & {element, carry, base} or not only_scans(
        source, scan, value, BLOCK_SCAN_CALLS, shared
    ):
        raise NotInForm("statements between load and store that do more than scan", "a scan")
    written = assigned_names(source, [*scan, inside[0], inside[1]])
    fixed = {source.text_of(n) for n in walk(bound_node) if n.type == "identifier"}
    if written & (fixed | {source_pointer, stored[0]}):
        raise NotInForm("a loop that changes its bound or pointers", "fixed pointers")
    for statement in (inside[1], inside[-3]):
        node = next(n for n in walk(statement) if n.type == "subscript_expression")
        if expr_type(source, function, node) != "float":
            raise NotInForm("rows of another type than float", "float rows")
    return BlockScanLoop(
        loop, base, index_type, bound, element, value, source_pointer, stored[0], scan,
        stored[1], carry, source.text_of(turn),
    )  # fmt: skip


def vector_block_scan_text(
    source: ParsedSource, scan: BlockScanLoop, width: int, pragma: bool = False
) -> str:
    """The vector loop behind its check, and the scalar loop as the fallback."""
    tail = [f"{scan.carry} += {scan.turn};", "__syncthreads();"]
    turn = ScanTurn(
        "blockDim.x", "threadIdx.x", "(threadIdx.x & 31) == 0", FULL_MASK, scan.added, tail
    )
    return chunked_vector_text(source, scan, width, turn, pragma)
