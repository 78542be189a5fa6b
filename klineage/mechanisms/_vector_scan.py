"""Vectorized warp scans: a warp that scans a row 32 floats a turn, one per lane, scans it
``32 * W`` a turn instead, each lane loading ``W`` consecutive floats as one vector.

The form it takes (a chunked warp scan, as warp-per-row scans are written)::

    for (IT base = 0; base < N; base += 32) {
      const IT c = base + LANE;                      // LANE: the lane, however spelled
      float v = c < N ? (IN[c]) : 0.0f;
      ...statements that scan v across the warp with __shfl_up_sync...
      if (c < N) OUT[c] = carry + v;
      carry += __shfl_sync(MASK, v, 31);             // the chunk's total, for the next
    }

and what it writes: the same loop behind a check that the row can be read as vectors (``N``
a multiple of ``W``, both pointers aligned to the vector's bytes), and in front of it the
vector loop, where each lane adds up its own ``W`` floats in order, the warp scans the lanes'
totals with the loop's own scan statements, and each lane adds what the lanes below it hold
(one more ``__shfl_up_sync``) and the carry::

    if (N % W == 0 && reinterpret_cast<unsigned long long>(IN) % BYTES == 0 && ...OUT...) {
      for (IT base = 0; base < N; base += 32 * W) {
        const IT c = base + W * (LANE);
        VT v_vec = make_VT(0.0f, ...);
        if (c < N) v_vec = *reinterpret_cast<const VT*>(&IN[c]);
        ...the lane's running sums, v = its total, the scan statements...
        float v_below = __shfl_up_sync(MASK, v, 1);
        if ((LANE) == 0) v_below = 0.0f;
        if (c < N) { ...each element += carry + v_below...; store v_vec to &OUT[c]... }
        carry += __shfl_sync(MASK, v, 31);
      }
    } else {
      the scalar loop
    }

The check runs on the device, so the rewrite is correct for every row length and offset: the
rows that cannot be read as vectors take the scalar loop. Sums are added in another order
than the scalar loop's (within float rounding). Removal keeps the scalar loop; a vector form
is recognized by writing it again from that loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Node, ParsedSource, call_name, plain_assignment
from klineage.cuda.tree import NotInForm, assigned_names, call_arguments, fresh_name
from klineage.mechanisms._local_util import (
    binary,
    expr_type,
    identifiers,
    index_declaration,
    is_side_effect_free,
    names_in_function,
    shift,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._scan_rows import _added

ZEROS = frozenset({"0", "0.0", "0.0f", "0.f", "0.0F", "0.F"})
VECTORS = {2: "float2", 4: "float4"}
"""Vectors of floats by width: 8 and 16 bytes."""


@dataclass(frozen=True)
class WarpScanLoop:
    """A chunked warp scan: one float per lane a turn, the chunk's total carried."""

    loop: Node
    base: str
    index_type: str
    bound: str
    """``N`` in ``base < N``."""
    element: str
    """``c`` in ``const IT c = base + LANE;``."""
    lane: str
    value: str
    """``v``, the lane's float."""
    source_pointer: str
    target_pointer: str
    scan: list[Node]
    """The statements between the load and the store: the scan of ``v`` across the warp."""
    carry: str
    mask: str


def _texts(source: ParsedSource, node: Node) -> set[str]:
    return {source.text_of(n) for n in identifiers(source, node)}


def _is_lane(source: ParsedSource, function: Function, node: Node) -> bool:
    """Whether ``node`` is the thread's lane in its warp, however it is spelled."""
    form = analysis(source).indices(function).form(node)
    return form == IndexForm.atom("lane")


def _subscript_at(source: ParsedSource, node: Node, index: str) -> str | None:
    """``P`` of ``P[index]`` (or ``__ldg(&P[index])``), when ``P`` is side-effect free."""
    node = strip_parens(node)
    if node.type == "call_expression" and call_name(source, node) == "__ldg":
        arguments = call_arguments(node)
        inner = strip_parens(arguments[0]) if len(arguments) == 1 else None
        if inner is None or inner.type != "pointer_expression" or inner.child(0) is None:
            return None
        operand = inner.child_by_field_name("argument")
        if source.text_of(inner)[:1] != "&" or operand is None:
            return None
        node = strip_parens(operand)
    if node.type != "subscript_expression":
        return None
    base = node.child_by_field_name("argument")
    indices = node.child_by_field_name("indices")
    inner_index = statements(indices)[0] if indices is not None and indices.named_children else None
    if base is None or inner_index is None or source.text_of(inner_index) != index:
        return None
    return source.text_of(base) if is_side_effect_free(source, base) else None


def _guarded_load(
    source: ParsedSource, statement: Node, element: str, bound: str
) -> tuple[str, str] | None:
    """``(v, P)`` of ``float v = element < bound ? (P[element]) : 0.0f;``."""
    declared = index_declaration(source, statement)
    if declared is None or declared[1].split()[-1] != "float":
        return None
    value = strip_parens(declared[2])
    if value.type != "conditional_expression":
        return None
    condition = value.child_by_field_name("condition")
    then, other = value.child_by_field_name("consequence"), value.child_by_field_name("alternative")
    sides = binary(strip_parens(condition), "<") if condition is not None else None
    if sides is None or then is None or other is None:
        return None
    if (source.text_of(sides[0]), source.text_of(sides[1])) != (element, bound):
        return None
    if source.text_of(strip_parens(other)) not in ZEROS:
        return None
    pointer = _subscript_at(source, then, element)
    return (declared[0], pointer) if pointer is not None else None


def guarded_assignment(
    source: ParsedSource, statement: Node, element: str, bound: str
) -> tuple[Node, Node] | None:
    """``(target, value)`` of ``if (element < bound) target = value;`` (braced or not)."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return None
    condition = statement.child_by_field_name("condition")
    body = statement.child_by_field_name("consequence")
    inner = condition.named_children[-1] if condition is not None else None
    sides = binary(strip_parens(inner), "<") if inner is not None else None
    if sides is None or (source.text_of(sides[0]), source.text_of(sides[1])) != (element, bound):
        return None
    if body is not None and body.type == "compound_statement":
        inside = statements(body)
        body = inside[0] if len(inside) == 1 else None
    return plain_assignment(body)


def _guarded_store(
    source: ParsedSource, statement: Node, element: str, bound: str, value: str
) -> tuple[str, str] | None:
    """``(P, carry)`` of ``if (element < bound) P[element] = carry + value;``."""
    stored = guarded_assignment(source, statement, element, bound)
    if stored is None:
        return None
    pointer = _subscript_at(source, stored[0], element)
    added = binary(strip_parens(stored[1]), "+")
    if pointer is None or added is None:
        return None
    left, right = (source.text_of(strip_parens(s)) for s in added)
    if value not in (left, right) or left == right:
        return None
    carry = right if left == value else left
    return (pointer, carry) if carry.isidentifier() else None


def _carried(source: ParsedSource, statement: Node, value: str) -> tuple[str, str] | None:
    """``(carry, MASK)`` of ``carry += __shfl_sync(MASK, value, 31);``."""
    adds = _added(statement)
    if adds is None:
        return None
    left, right = adds[0], strip_parens(adds[1])
    if right.type != "call_expression" or call_name(source, right) != "__shfl_sync":
        return None
    arguments = call_arguments(right)
    if len(arguments) != 3 or source.text_of(arguments[1]) != value:
        return None
    if fold_int(source, arguments[2]) != 31:
        return None
    return source.text_of(left), source.text_of(arguments[0])


SCAN_CALLS = frozenset({"__shfl_up_sync", "__shfl_sync", "__syncwarp"})
"""What a warp scan's statements may call: run once a turn either way, they read and write
registers only."""


def _declares(node: Node) -> bool:
    """Whether `node` is the name a declaration declares (``float t;``, ``int o = 1``)."""
    parent = node.parent
    if node.type != "identifier" or parent is None:
        return False
    if parent.type == "declaration":
        return True
    return parent.type == "init_declarator" and parent.child_by_field_name("declarator") == node


def only_scans(
    source: ParsedSource,
    scan: list[Node],
    value: str,
    calls: frozenset[str] = SCAN_CALLS,
    shared: frozenset[str] = frozenset(),
) -> bool:
    """Whether `scan` writes only `value`, its own locals and elements of the `shared` arrays,
    and calls only `calls`: run once a turn in both forms, it then does the same on the lanes'
    (or threads') totals."""
    local = {source.text_of(n) for s in scan for n in walk(s) if _declares(n)}
    for node in (n for s in scan for n in walk(s)):
        if node.type == "call_expression" and call_name(source, node) not in calls:
            return False
        if node.type in ("assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            target = strip_parens(target) if target is not None else None
            if target is None:
                return False
            if target.type == "identifier" and source.text_of(target) in local | {value}:
                continue
            array = target.child_by_field_name("argument")
            if target.type != "subscript_expression" or array is None:
                return False
            if source.text_of(array) not in shared:
                return False  # a store to global memory would run once a turn for W elements
    return True


def chunk_header(source: ParsedSource, loop: Node, step: str) -> tuple[str, str, Node, Node]:
    """``(base, its type, N, K)`` of a chunk loop ``for (T base = 0; base < N; base += K)``;
    :class:`NotInForm` (naming `step`, the turn the form needs) otherwise."""
    init = loop.child_by_field_name("initializer")
    header = index_declaration(source, init) if init is not None else None
    if header is None or source.text_of(header[2]) != "0":
        raise NotInForm("a loop that does not start at 0", "a chunk loop from 0")
    base, index_type = header[0], " ".join(header[1].replace("const", "").split())
    condition = loop.child_by_field_name("condition")
    sides = binary(strip_parens(condition), "<") if condition is not None else None
    if sides is None or source.text_of(sides[0]) != base:
        raise NotInForm(f"a loop not bounded by {base} < N", "a chunk loop to a bound")
    update = loop.child_by_field_name("update")
    assigned = update if update is not None and update.type == "assignment_expression" else None
    step_by = assigned.child_by_field_name("right") if assigned is not None else None
    step_op = assigned.child_by_field_name("operator") if assigned is not None else None
    if step_op is None or step_op.type != "+=" or step_by is None:
        raise NotInForm(f"a loop that does not add to {base}", f"a loop stepping {step}")
    return base, index_type, sides[1], step_by


def warp_scan_loop(source: ParsedSource, loop: Node) -> WarpScanLoop:
    """The chunked warp scan ``loop`` is; :class:`NotInForm` says what differs."""
    function = source.enclosing_function(loop)
    if function is None or not function.runs_on_device:
        raise NotInForm("a loop outside device code", "a loop of a kernel")
    base, index_type, bound_node, step_by = chunk_header(source, loop, "32")
    bound = source.text_of(bound_node)
    if fold_int(source, step_by) != 32:
        raise NotInForm("a loop that does not step by 32", "one element per lane a turn")
    body = loop.child_by_field_name("body")
    inside = statements(body) if body is not None and body.type == "compound_statement" else []
    if len(inside) < 5:
        raise NotInForm("a loop body of fewer than five statements", "load, scan, store, carry")
    index = index_declaration(source, inside[0])
    offset = binary(strip_parens(index[2]), "+") if index is not None else None
    if index is None or offset is None:
        raise NotInForm("a loop whose first statement is no index", "c = base + lane")
    parts = [strip_parens(offset[0]), strip_parens(offset[1])]
    if source.text_of(parts[1]) == base:
        parts.reverse()
    if source.text_of(parts[0]) != base or not _is_lane(source, function, parts[1]):
        raise NotInForm("an index that is not the chunk's start plus the lane", "c = base + lane")
    element, lane = index[0], source.text_of(parts[1])
    loaded = _guarded_load(source, inside[1], element, bound)
    if loaded is None:
        raise NotInForm("a loop that does not load one float a lane", "v = c < N ? in[c] : 0")
    value, source_pointer = loaded
    carried = _carried(source, inside[-1], value)
    stored = _guarded_store(source, inside[-2], element, bound, value)
    if carried is None or stored is None or stored[1] != carried[0]:
        raise NotInForm("a loop that does not end store, then carry", "out[c] = carry + v")
    carry, mask = carried
    scan = inside[2:-2]
    names = set().union(*(_texts(source, s) for s in scan))
    if names & {element, carry, base} or not any(
        n.type == "call_expression" and call_name(source, n) == "__shfl_up_sync"
        for s in scan
        for n in walk(s)
    ):
        raise NotInForm("statements between load and store that are no warp scan", "a scan")
    if not only_scans(source, scan, value):
        raise NotInForm("statements between load and store that do more than scan", "a scan")
    written = assigned_names(source, [*scan, inside[0], inside[1]])
    used = _texts(source, bound_node) | {source_pointer, stored[0]}
    if written & used or lane in written:
        raise NotInForm("a loop that changes its bound or pointers", "fixed pointers")
    for pointer in (source_pointer, stored[0]):
        node = next(n for n in walk(inside[1] if pointer == source_pointer else inside[-2])
                    if n.type == "subscript_expression")  # fmt: skip
        if expr_type(source, function, node) != "float":
            raise NotInForm(f"{pointer} of another type than float", "float rows")
    return WarpScanLoop(
        loop, base, index_type, bound, element, lane, value, source_pointer, stored[0],
        scan, carry, mask,
    )  # fmt: skip


class ChunkedScan(Protocol):
    """What writing the vector form reads of a chunked scan loop, a warp's or a block's."""

    @property
    def loop(self) -> Node: ...
    @property
    def base(self) -> str: ...
    @property
    def index_type(self) -> str: ...
    @property
    def bound(self) -> str: ...
    @property
    def element(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def source_pointer(self) -> str: ...
    @property
    def target_pointer(self) -> str: ...
    @property
    def scan(self) -> list[Node]: ...


@dataclass(frozen=True)
class ScanTurn:
    """How one kind of chunked scan spells a turn in its vector form: a warp's or a block's."""

    step: str
    """What a scalar turn covers (``32``, ``blockDim.x``): the vector turn covers W of it."""
    index: str
    """Whose W floats a turn (the lane, ``threadIdx.x``)."""
    first_lane: str
    """The test for lane 0 of a warp, which has no lanes below it."""
    mask: str
    added: list[str]
    """What each element adds besides the lanes below (the carry, the warps below)."""
    tail: list[str]
    """The statements after the store (the carry grows; a block's barrier)."""


def chunked_vector_text(
    source: ParsedSource,
    scan: ChunkedScan,
    width: int,
    turn: ScanTurn,
    pragma: bool = False,
) -> str:
    """The vector loop of a chunked scan behind its check, and the scalar loop as the
    fallback (each after a ``#pragma unroll`` where the loop had one: `pragma`)."""
    vector = VECTORS.get(width)
    if vector is None:
        raise NotInForm(f"vector_width={width}", "a width of 2 or 4 floats")
    function = source.enclosing_function(scan.loop)
    assert function is not None
    taken = names_in_function(source, function)
    v = scan.value
    packed, lanes, below, i = (fresh_name(taken, n) for n in (
        f"{v}_vec", f"{v}_lane", f"{v}_below", f"{v}_i"
    ))  # fmt: skip
    at = source.indent_of(scan.loop.start_byte)
    body, inner = at + "  ", at + "    "
    scalar = source.text_of(scan.loop)
    n, src, dst = scan.bound, scan.source_pointer, scan.target_pointer
    bytes_ = 4 * width
    zero = f"make_{vector}({', '.join(['0.0f'] * width)})"
    unroll = [f"{body}#pragma unroll"] if pragma else []
    scan_lines = [
        inner + line.strip() if k == 0 else line
        for s in scan.scan
        for k, line in enumerate(shift(source.text_of(s).rstrip(), 2).split("\n"))
    ]
    added = " + ".join([*turn.added, below])
    return "\n".join([
        f"if ({n} % {width} == 0 && reinterpret_cast<unsigned long long>({src}) % {bytes_} == 0 &&",
        f"{at}    reinterpret_cast<unsigned long long>({dst}) % {bytes_} == 0) {{",
        *unroll,
        f"{body}for ({scan.index_type} {scan.base} = 0; {scan.base} < {n}; "
        f"{scan.base} += {turn.step} * {width}) {{",
        f"{inner}const {scan.index_type} {scan.element} = {scan.base} + {width} * {turn.index};",
        f"{inner}{vector} {packed} = {zero};",
        f"{inner}if ({scan.element} < {n}) "
        f"{packed} = *reinterpret_cast<const {vector}*>(&{src}[{scan.element}]);",
        f"{inner}float* {lanes} = reinterpret_cast<float*>(&{packed});",
        f"{inner}#pragma unroll",
        f"{inner}for (int {i} = 1; {i} < {width}; ++{i}) {lanes}[{i}] += {lanes}[{i} - 1];",
        f"{inner}float {v} = {lanes}[{width - 1}];",
        *scan_lines,
        f"{inner}float {below} = __shfl_up_sync({turn.mask}, {v}, 1);",
        f"{inner}if ({turn.first_lane}) {below} = 0.0f;",
        f"{inner}if ({scan.element} < {n}) {{",
        f"{inner}  #pragma unroll",
        f"{inner}  for (int {i} = 0; {i} < {width}; ++{i}) {lanes}[{i}] += {added};",
        f"{inner}  *reinterpret_cast<{vector}*>(&{dst}[{scan.element}]) = {packed};",
        f"{inner}}}",
        *[f"{inner}{line}" for line in turn.tail],
        f"{body}}}",
        f"{at}}} else {{",
        *unroll,
        f"{body}{shift(scalar, 2)}",
        f"{at}}}",
    ])  # fmt: skip


def vector_scan_text(
    source: ParsedSource, scan: WarpScanLoop, width: int, pragma: bool = False
) -> str:
    """The vector loop behind its check, and the scalar loop as the fallback."""
    lane = scan.lane if scan.lane.isidentifier() else f"({scan.lane})"
    carry = f"{scan.carry} += __shfl_sync({scan.mask}, {scan.value}, 31);"
    turn = ScanTurn("32", lane, f"{lane} == 0", scan.mask, [scan.carry], [carry])
    return chunked_vector_text(source, scan, width, turn, pragma)
