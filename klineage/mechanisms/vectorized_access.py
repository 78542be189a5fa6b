"""Vectorized loads and stores: one 16-, 8- or 4-byte access instead of several scalar ones.

A ``float4`` load moves four floats in one instruction (``LDG.128``), so a warp issues a
quarter of the memory instructions for the same bytes; ``uint4`` does the same for eight
bf16 or half values. The mechanism has two shapes.

**Single accesses** through a pointer to a vector type (``float4``, ``float2``, ``uint4``,
``uint2``, ``int4``, ``int2``, ``double2``, ``__half2``, ``__nv_bfloat162``), as expert
kernels write them: ``v = __ldg(row4 + c)``, ``a.raw = x16[c]``, ``out4[c] = make_float4(...)``,
and through the cache-hinted intrinsics public helpers use (``__ldcs(reinterpret_cast<const
int4*>(p))``, ``__stcs(reinterpret_cast<int4*>(p), bits)``; :data:`LOAD_INTRINSICS`,
:data:`STORE_INTRINSICS`).

- remove: the access becomes one scalar access per element, with the register value kept
  as it was, so the code around it does not change::

      __ldg(in4 + c)  ->  make_float4(__ldg(reinterpret_cast<const float*>(in4 + c)),
                                      __ldg(reinterpret_cast<const float*>(in4 + c) + 1), ...)
      out4[c] = v;    ->  { const float4 packed = v; float* elems =
                            reinterpret_cast<float*>(&out4[c]); elems[0] = packed.x; ... }
      __stcs(out4, v);  ->  { ...; __stcs(&elems[0], packed.x); ... }   (the hint kept)

  The same bytes are read and written, so the result is identical and no alignment is
  needed any more. Refused, with the reason, when the address has side effects (it is
  evaluated once per element), a load binds to a reference, or a store's value is used.
- apply: the reverse, on exactly those split forms.

**Elementwise code** in its canonical vectorized form (what ``apply`` writes):

- a loop ``for (int64_t c = S; c < n; c += K) body`` becomes a loop over ``n / W``
  vectors (same start and step) that loads each pointer accessed as ``p[c]`` once as a
  vector, runs the body for each of the ``W`` lanes on the lane's element, and stores the
  written pointers once; then the original loop over the tail ``n / W * W + S ..< n``.
  The names it declares (``c_vec``, ``c_lane``, ``p_vec``) live in the loops it writes, so
  every loop of a kernel takes the form (each pass over a row). With the carrier
  ``check=aligned`` the two loops sit behind a run-time test that every vectorized pointer
  is aligned to a vector, the original loop in the other branch: a row that starts
  misaligned (a row length not a multiple of the width) takes the scalar loop, so no
  alignment condition is needed. With ``check=peeled`` (pointers of one element size) the
  loop first runs the scalar elements before the first pointer's first aligned vector, then
  the vectors from there and the tail, behind a test that the other pointers share that
  misalignment (the loop as it was in the other branch): misaligned rows take vectors too.
  Retrieval asks for one of the two where a workload breaks alignment
  (:meth:`run_time_check`);
- a one-thread-per-element kernel (``i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n)
  return; ...``) gives each thread ``W`` consecutive elements: a vector path for full
  vectors and a scalar loop for the last partial one, and every launch's grid shrinks by
  ``W`` to match.

  remove turns the canonical form back into the scalar loop (or kernel and grid); it checks
  that the form is canonical by writing it again from the result and comparing, so a
  vector form it did not write is refused rather than guessed at.
- a lane loop of that kernel form whose lanes split their index into a row and a column
  (``t = i / D; h = i - t * D``) splits it once per vector when ``D % W == 0`` (``form=rows``,
  :mod:`klineage.mechanisms._vector_rows`): a vector's lanes then share one row.

Pointers are vectorized only when every use in the element code is ``p[c]`` at the
element's own index, outside any condition, and the pointer is not written; the others stay
scalar in each lane, which is always correct. Conditions: each vectorized pointer aligned to
the vector's bytes (the harness's buffers are; row offsets need the row length divisible by
the width: :class:`~klineage.conditions.AxisDivisible`), and for a loop, that its start
values across threads are ``0..K-1`` (prose, when not recognizable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from klineage.conditions import (
    AxisDivisible,
    Condition,
    PointerAlignment,
    Prose,
    merge_conditions,
)
from klineage.cuda.cexpr import MULTIPLICATIVE, PRIMARY, operand, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    ELEMENT_SIZES,
    VECTOR_TYPES,
    ElementKernel,
    Refused,
    VectorType,
    alignment_conditions,
    alignment_of_sum,
    assigned_names,
    binary,
    builtin_of,
    collective_in,
    element_kernels,
    element_refusal,
    element_returns,
    element_text,
    expr_type,
    form_text,
    global_index,
    grid_edits,
    identifiers,
    index_declaration,
    is_block_size,
    is_side_effect_free,
    leaving_jumps,
    local_types,
    loop_bound_jumps,
    names_in_function,
    normalize_type,
    shift,
    splice,
    statements,
    strip_parens,
    unshift,
    vector_for,
    walk,
)
from klineage.mechanisms._vector_lanes import split_lanes
from klineage.mechanisms._vector_rows import RowsForm, rows_forms, rows_text
from klineage.mechanisms._vector_scan import VECTORS
from klineage.mechanisms._vector_scan_forms import (
    VectorScan,
    scan_loop,
    vector_scan_edit,
    vector_scans,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

MAX_BYTES = 16
"""The widest access a thread can make."""
SCAN = "scan"
"""The form of a chunked warp scan (:mod:`klineage.mechanisms._vector_scan`)."""
ROWS = "rows"
"""The form of lanes split by row once a vector (:mod:`klineage.mechanisms._vector_rows`)."""


# ---------------------------------------------------------------------------------------------
# Plans: which pointers of some element code can be accessed as vectors
# ---------------------------------------------------------------------------------------------


CHECK_ALIGNED = "aligned"
"""The ``check`` carrier's value: test vectorized pointers' alignment at run time."""
CHECK_PEELED = "peeled"
"""The ``check`` carrier's value: peel scalar elements until the pointers are aligned."""
CHECKS = (CHECK_ALIGNED, CHECK_PEELED)


@dataclass
class _Pointer:
    name: str
    element: str
    size: int
    loads: list[Node] = field(default_factory=list)
    stores: list[Node] = field(default_factory=list)

    @property
    def stored(self) -> bool:
        return bool(self.stores)

    def accesses(self) -> list[Node]:
        return sorted({*self.loads, *self.stores}, key=lambda n: n.start_byte)


@dataclass
class _Plan:
    """The pointers to vectorize in some element code, and whether the index is used
    otherwise (then each lane declares it)."""

    function: Function
    index: str
    pointers: list[_Pointer]
    index_used: bool

    def replacements(self, lane: str) -> list[tuple[Node, str]]:
        """Each vectorized ``p[i]`` -> the lane's element of ``p_vec``."""
        found = []
        for pointer in self.pointers:
            const = "" if pointer.stored else "const "
            text = f"reinterpret_cast<{const}{pointer.element}*>(&{pointer.name}_vec)[{lane}]"
            found += [(node, text) for node in pointer.accesses()]
        return found


_CONDITIONAL = frozenset(
    {
        "for_statement",
        "for_range_loop",
        "while_statement",
        "do_statement",
        "switch_statement",
        "lambda_expression",
    }
)


def _unconditional(node: Node, stop: set[int]) -> bool:
    """Whether ``node`` is evaluated every time the statement holding it runs."""
    child, parent = node, node.parent
    while parent is not None and child.id not in stop:
        if parent.type in _CONDITIONAL:
            return False
        if parent.type in ("if_statement", "conditional_expression"):
            condition = parent.child_by_field_name("condition")
            if condition is None or condition.id != child.id:
                return False
        if parent.type == "binary_expression" and binary(parent, "&&", "||") is not None:
            left = parent.child_by_field_name("left")
            if left is None or left.id != child.id:
                return False
        child, parent = parent, parent.parent
    return True


def _classify(subscript: Node) -> Literal["load", "store", "both", "other"]:
    parent = subscript.parent
    if parent is None:
        return "other"
    if parent.type == "assignment_expression":
        left = parent.child_by_field_name("left")
        if left is not None and left.id == subscript.id:
            operator = parent.child_by_field_name("operator")
            return "store" if operator is not None and operator.type == "=" else "both"
    if parent.type == "update_expression":
        return "both"
    if parent.type in ("pointer_expression", "field_expression", "sizeof_expression"):
        return "other"
    return "load"


def _pointer_type(types: dict[str, str], name: str) -> tuple[str, int] | None:
    declared = types.get(name)
    if declared is None:
        return None
    normalized = normalize_type(declared)
    if not normalized.endswith("*") or normalized.count("*") != 1:
        return None
    element = normalized[:-1]
    size = ELEMENT_SIZES.get(element)
    return None if size is None else (element, size)


def _declared_in(source: ParsedSource, nodes: list[Node]) -> set[str]:
    """Names declared inside the element code (they are new for every element)."""
    names: set[str] = set()
    for node in nodes:
        for decl in walk(node):
            if decl.type != "declaration":
                continue
            for declarator in decl.children_by_field_name("declarator"):
                current: Node | None = declarator
                while current is not None and current.type != "identifier":
                    inner = current.child_by_field_name("declarator")
                    if inner is None:
                        inner = next(
                            (
                                c
                                for c in current.named_children
                                if c.type == "identifier" or c.type.endswith("declarator")
                            ),
                            None,
                        )
                    current = inner
                if current is not None:
                    names.add(source.text_of(current))
    return names


def plan_vectorization(
    source: ParsedSource,
    function: Function,
    index: str,
    nodes: list[Node],
    *,
    exits: list[Node] | None = None,
) -> _Plan:
    """Which pointers of the element code ``nodes`` (run for element ``index``) to access
    as vectors. Raises :class:`Refused` when the code cannot be split into lanes.

    ``exits`` are returns that leave the element early (``if (id >= vocab) { y[i] = NAN;
    return; }``): they become ``continue`` of the lane loop. A pointer is then stored as a
    vector only when every path through the element code stores its element, at the top
    level or at the top of an exit's block, or a lane would store what it never wrote."""
    allowed = {e.id for e in exits or []}
    jumps = [
        j
        for node in nodes
        for j in loop_bound_jumps(node, ("break_statement", "continue_statement"))
        + [n for n in walk(node) if n.type in ("return_statement", "goto_statement")]
        if j.id not in allowed
    ]
    if jumps:
        return_or_jump = source.snippet(jumps[0], 30)
        raise Refused(f"the element code leaves early ({return_or_jump}), so lanes would differ")
    barrier = collective_in(source, nodes)
    if barrier is not None:
        raise Refused(f"the element code holds {barrier}, which lanes cannot reorder")
    types = local_types(source, function)
    found: dict[str, _Pointer] = {}
    other: set[str] = set()
    index_uses: list[Node] = []
    stop = {n.id for n in nodes}
    blocks = [b for b in (_exit_block(n, allowed) for n in nodes) if b is not None]
    exit_stores = {t.id for b in blocks for t in map(_top_store, b) if t is not None}
    for node in nodes:
        for ident in identifiers(source, node):
            name = source.text_of(ident)
            if name == index:
                index_uses.append(ident)
                continue
            pointer = _pointer_type(types, name)
            if pointer is None:
                continue
            subscript = ident.parent
            if (
                subscript is None
                or subscript.type != "subscript_expression"
                or subscript.child_by_field_name("argument") != ident
                or not _is_index(source, subscript, index)
            ):
                other.add(name)
                continue
            kind = _classify(subscript)
            exit_store = kind != "load" and subscript.id in exit_stores
            if kind == "other" or not (_unconditional(subscript, stop) or exit_store):
                other.add(name)
                continue
            entry = found.setdefault(name, _Pointer(name, pointer[0], pointer[1]))
            if kind in ("load", "both"):
                entry.loads.append(subscript)
            if kind in ("store", "both"):
                entry.stores.append(subscript)
    excluded = other | _declared_in(source, nodes)
    for node in nodes:
        excluded |= assigned_names(source, node)
    chosen = [p for name, p in found.items() if name not in excluded]
    if blocks:  # a lane may leave early: its stored elements must be written on every path
        chosen = [
            p
            for p in chosen
            if not p.stored or _stored_on_every_path(nodes, allowed, {n.id for n in p.stores})
        ]
    vectorized = {a.id for p in chosen for a in p.accesses()}
    used = any(_subscript_of(use) not in vectorized for use in index_uses)
    return _Plan(function, index, chosen, used)


def _exit_block(node: Node, exits: set[int]) -> list[Node] | None:
    """The statements of ``if (c) { ...; return; }`` (no else) whose return is an allowed
    exit, or None."""
    if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
        return None
    block = node.child_by_field_name("consequence")
    if block is None:
        return None
    inner = statements(block) if block.type == "compound_statement" else [block]
    if not inner or inner[-1].id not in exits:
        return None
    return inner[:-1]


def _top_store(statement: Node) -> Node | None:
    """The subscript a statement ``p[i] = v;`` stores to, or None."""
    assignment = plain_assignment(statement)
    left = assignment[0] if assignment is not None else None
    return left if left is not None and left.type == "subscript_expression" else None


def _stored_on_every_path(nodes: list[Node], exits: set[int], stores: set[int]) -> bool:
    """Whether every path through the element code ``nodes`` runs one of ``stores``: before
    the first exit that does not, at the top level of the code or of the exits' blocks."""
    for node in nodes:
        store = _top_store(node)
        if store is not None and store.id in stores:
            return True
        block = _exit_block(node, exits)
        if block is not None:
            tops = [_top_store(st) for st in block]
            if not any(t is not None and t.id in stores for t in tops):
                return False
    return False


def _subscript_of(use: Node) -> int | None:
    """The id of the ``p[i]`` node whose index is this use of ``i`` (parentheses allowed)."""
    node = use
    while node.parent is not None and node.parent.type == "parenthesized_expression":
        node = node.parent
    indices = node.parent
    if indices is None or indices.type != "subscript_argument_list" or indices.parent is None:
        return None
    return indices.parent.id


def _is_index(source: ParsedSource, subscript: Node, index: str) -> bool:
    indices = subscript.child_by_field_name("indices")
    inner = statements(indices) if indices is not None else []
    return (
        len(inner) == 1
        and strip_parens(inner[0]).type == "identifier"
        and source.text_of(strip_parens(inner[0])) == index
    )


def _vectors(plan: _Plan, width: int) -> dict[str, str]:
    """Pointer -> vector type name for ``width`` lanes; :class:`Refused` when one has none."""
    chosen = {}
    for pointer in plan.pointers:
        vector = vector_for(pointer.element, width)
        if vector is None:
            raise Refused(
                f"no {pointer.size * width}-byte vector holds {width} {pointer.element} values "
                f"(vectors are 4, 8 or 16 bytes)"
            )
        chosen[pointer.name] = vector
    return chosen


def default_width(plan: _Plan) -> int:
    """The widest width every vectorized pointer supports: 16 bytes of the largest element."""
    return max(1, min(MAX_BYTES // p.size for p in plan.pointers))


def _check_names(source: ParsedSource, plan: _Plan, index: str, scope: Node | None = None) -> None:
    """Refuse names the rewrite declares that are already taken: anywhere in the function,
    or, for a loop (``scope``, whose rewrite declares them all inside the loops it writes),
    anywhere the loop reads, where a new declaration would hide an outer one; another loop of
    the function may use the same names, each in its own scope."""
    if scope is None:
        taken = names_in_function(source, plan.function)
    else:
        taken = {source.text_of(n) for n in identifiers(source, scope)}
    wanted = [f"{index}_vec", f"{index}_lane"] + [f"{p.name}_vec" for p in plan.pointers]
    clash = [name for name in wanted if name in taken]
    if clash:
        raise Refused(f"the names {', '.join(clash)} are already used in {plan.function.name}")


def _vector_lines(
    plan: _Plan, vectors: dict[str, str], vec: str, offset: str | None = None
) -> tuple[list[str], list[str]]:
    """The vector loads before the lanes and the vector stores after them (vectors counted
    from element `offset` of each pointer, when given)."""
    loads, stores = [], []
    for p in plan.pointers:
        vector = vectors[p.name]
        base = p.name if offset is None else f"{p.name} + {offset}"
        if p.loads:
            const = "" if p.stored else "const "
            source = f"reinterpret_cast<const {vector}*>({base})[{vec}]"
            loads.append(f"{const}{vector} {p.name}_vec = {source};")
        else:
            loads.append(f"{vector} {p.name}_vec;")
        if p.stored:
            stores.append(f"reinterpret_cast<{vector}*>({base})[{vec}] = {p.name}_vec;")
    return loads, stores


def _lanes(
    plan: _Plan,
    index_type: str,
    index: str,
    width: int,
    body: str,
    indent: str,
    offset: str | None = None,
) -> list[str]:
    """The lane loop at ``indent``: ``body`` (text at ``indent`` + 2) runs per lane."""
    vec, lane = f"{index}_vec", f"{index}_lane"
    declare = ""
    if plan.index_used:
        first = "" if offset is None else f"{offset} + "
        declare = f"\n{indent}  const {index_type} {index} = {first}{vec} * {width} + {lane};"
    return [
        f"{indent}#pragma unroll",
        f"{indent}for (int {lane} = 0; {lane} < {width}; ++{lane}) {{{declare}{shift(body, 2)}",
        f"{indent}}}",
    ]


# ---------------------------------------------------------------------------------------------
# Loops
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loop:
    node: Node
    var: str
    type: str
    start: Node
    bound: Node
    update: Node
    step: Node | None
    """``K`` of ``c += K``; None for ``++c``."""
    body: Node


def scalar_loop(source: ParsedSource, node: Node) -> _Loop | None:
    """``for (T c = S; c < N; ++c | c++ | c += K) body``, else None."""
    if node.type != "for_statement":
        return None
    init = node.child_by_field_name("initializer")
    condition = node.child_by_field_name("condition")
    update = node.child_by_field_name("update")
    body = node.child_by_field_name("body")
    if init is None or condition is None or update is None or body is None:
        return None
    parsed = index_declaration(source, init)
    if parsed is None:
        return None
    var, specifiers, start = parsed
    sides = binary(strip_parens(condition), "<")
    if sides is None or strip_parens(sides[0]).type != "identifier":
        return None
    if source.text_of(strip_parens(sides[0])) != var:
        return None
    step: Node | None = None
    if update.type == "update_expression":
        argument = update.child_by_field_name("argument")
        if (
            argument is None
            or source.text_of(argument) != var
            or "++" not in source.text_of(update)
        ):
            return None
    elif update.type == "assignment_expression":
        left = update.child_by_field_name("left")
        operator = update.child_by_field_name("operator")
        step = update.child_by_field_name("right")
        if left is None or operator is None or operator.type != "+=" or step is None:
            return None
        if source.text_of(left) != var:
            return None
    else:
        return None
    return _Loop(node, var, normalize_type(specifiers), start, sides[1], update, step, body)


def _loop_nodes(loop: _Loop) -> list[Node]:
    body = loop.body
    return statements(body) if body.type == "compound_statement" else [body]


def _loop_refusal(source: ParsedSource, loop: _Loop) -> str | None:
    parent = loop.node.parent
    if parent is None or parent.type != "compound_statement":
        return "the loop is not directly in a block, so it cannot become two loops"
    if not source.starts_line(loop.node.start_byte):
        return "the loop does not start its line"
    invariant = [loop.bound, loop.start] + ([loop.step] if loop.step is not None else [])
    written = assigned_names(source, loop.body)
    for node in invariant:
        if not is_side_effect_free(source, node):
            return f"{source.snippet(node)!r} has side effects"
        changed = {source.text_of(n) for n in identifiers(source, node)} & (written | {loop.var})
        if changed:
            return (
                f"{source.snippet(node)!r} uses {', '.join(sorted(changed))}, written in the loop"
            )
    return None


def _body_text(source: ParsedSource, body: Node, reps: list[tuple[Node, str]]) -> str:
    """The loop body's statements as text at the body's indentation plus 2 (the compound
    statement's braces left out), starting with a newline."""
    if body.type == "compound_statement":
        inner = body.named_children
        if not inner:
            return ""
        return splice(source, body.start_byte + 1, inner[-1].end_byte, reps)
    indent = source.indent_of(body.start_byte) if source.starts_line(body.start_byte) else None
    if indent is None:
        indent = source.indent_of(body.parent.start_byte if body.parent else 0) + "  "
    return f"\n{indent}" + splice(source, body.start_byte, body.end_byte, reps)


def alignment_check(plan: _Plan, width: int) -> str:
    """The run-time test that every vectorized pointer holds a whole vector's alignment."""
    return " && ".join(
        f"reinterpret_cast<unsigned long long>({pointer.name}) % {pointer.size * width} == 0"
        for pointer in plan.pointers
    )


def checked_loop_text(source: ParsedSource, loop: _Loop, plan: _Plan, width: int) -> str:
    """The vectorized form of ``loop`` behind a run-time alignment test, the loop as it was
    in the other branch: for rows whose alignment no static condition promises (a row length
    not a multiple of the width)."""
    indent = source.indent_of(loop.node.start_byte)
    vector = loop_text(source, loop, plan, width).replace("\n", "\n  ")
    scalar = source.text_of(loop.node).replace("\n", "\n  ")
    return "\n".join(
        [
            f"if ({alignment_check(plan, width)}) {{",
            f"{indent}  {vector}",
            f"{indent}}} else {{",
            f"{indent}  {scalar}",
            f"{indent}}}",
        ]
    )


def peeled_loop_text(source: ParsedSource, loop: _Loop, plan: _Plan, width: int) -> str:
    """``loop`` peeled to alignment: scalar elements up to the first pointer's first
    vector-aligned element, whole vectors from there, then the tail. The pointers must share
    one misalignment, which holds for rows of one length in buffers that start aligned;
    where they do not (tested at run time when there are several), the loop as it was."""
    sizes = {p.size for p in plan.pointers}
    if len(sizes) != 1:
        raise Refused(
            "its vectorized pointers have elements of different sizes, so no one count of "
            "scalar elements aligns them all"
        )
    vectors = width * sizes.pop()
    indent = source.indent_of(loop.node.start_byte)
    head, peel = f"{loop.var}_head", f"{loop.var}_peel"
    clash = sorted({head, peel} & {source.text_of(n) for n in identifiers(source, loop.node)})
    if clash:
        raise Refused(f"the loop reads {', '.join(clash)}, which the peel would declare")
    first = plan.pointers[0].name
    address = f"reinterpret_cast<unsigned long long>({first})"
    bound = operand(source, loop.bound, 12)
    head_loop = splice(source, loop.node.start_byte, loop.node.end_byte, [(loop.bound, head)])
    peeled = [
        f"const {loop.type} {peel} = ({loop.type})(({vectors} - {address} % {vectors}) % "
        f"{vectors} / {vectors // width});",
        f"const {loop.type} {head} = {peel} < {bound} ? {peel} : {bound};",
        head_loop,
        loop_text(source, loop, plan, width, offset=head),
    ]
    inner = indent + "  "
    block = "\n".join(inner + line.replace("\n", "\n  ") for line in peeled)
    if len(plan.pointers) == 1:
        return f"{{  // peeled to alignment\n{block}\n{indent}}}"
    same = " && ".join(
        f"(reinterpret_cast<unsigned long long>({p.name}) - {address}) % {vectors} == 0"
        for p in plan.pointers[1:]
    )
    scalar = source.text_of(loop.node).replace("\n", "\n  ")
    return "\n".join(
        [
            f"if ({same}) {{  // one peel aligns every pointer",
            block,
            f"{indent}}} else {{",
            f"{indent}  {scalar}",
            f"{indent}}}",
        ]
    )


def loop_text(
    source: ParsedSource, loop: _Loop, plan: _Plan, width: int, offset: str | None = None
) -> str:
    """The canonical vectorized form of ``loop`` (replacing its text); with `offset`, the
    vectors start at that element (the peeled form's aligned part) and the tail after them."""
    refusal = _loop_refusal(source, loop)
    if refusal is not None:
        raise Refused(refusal)
    if not plan.pointers:
        raise Refused("no pointer is accessed only as p[c] outside conditions")
    _check_names(source, plan, loop.var, loop.node)
    vectors = _vectors(plan, width)
    indent = source.indent_of(loop.node.start_byte)
    vec = f"{loop.var}_vec"
    bound = operand(source, loop.bound, MULTIPLICATIVE)
    start = source.text_of(loop.start)
    update = splice(
        source,
        loop.update.start_byte,
        loop.update.end_byte,
        [(n, vec) for n in identifiers(source, loop.update) if source.text_of(n) == loop.var],
    )
    loads, stores = _vector_lines(plan, vectors, vec, offset)
    body = _body_text(source, loop.body, plan.replacements(f"{loop.var}_lane"))
    if offset is not None:
        bound = f"({operand(source, loop.bound, 12)} - {offset})"
    lines = [f"for ({loop.type} {vec} = {start}; {vec} < {bound} / {width}; {update}) {{"]
    lines += [f"{indent}  {line}" for line in loads]
    lines += _lanes(plan, loop.type, loop.var, width, body, indent + "  ", offset)
    lines += [f"{indent}  {line}" for line in stores]
    lines.append(f"{indent}}}")
    tail_start = f"{bound} / {width} * {width}"
    if offset is not None:
        tail_start = f"{offset} + {tail_start}"
    if start != "0":
        tail_start += f" + {operand(source, loop.start, 12)}"
    tail = splice(source, loop.node.start_byte, loop.node.end_byte, [(loop.start, tail_start)])
    lines.append(f"{indent}{tail}")
    return "\n".join(lines)


def _partition_prose(source: ParsedSource, function: Function, loop: _Loop) -> list[Condition]:
    """Prose for a loop whose threads' start values are not recognizably 0..K-1."""
    start, step = loop.start, loop.step
    step_text = source.text_of(step) if step is not None else "1"
    if source.text_of(start) == "0" and step is None:
        return []
    if builtin_of(source, start) == "threadIdx.x" and (
        step is not None and is_block_size(source, function, step)
    ):
        return []
    if global_index(source, start) is not None and step is not None:
        factors = binary(strip_parens(step), "*")
        names = {builtin_of(source, f) for f in factors} if factors else set()
        if names == {"gridDim.x", "blockDim.x"}:
            return []
    return [
        Prose(
            text=f"the loop's start {source.snippet(start, 40)!r} must take each value "
            f"0..{step_text}-1 in exactly one of the threads that run it",
            why="the vector loop and the tail reuse the loop's split of the work",
        )
    ]


# ---------------------------------------------------------------------------------------------
# One-thread-per-element kernels
# ---------------------------------------------------------------------------------------------


def kernel_text(source: ParsedSource, element: ElementKernel, plan: _Plan, width: int) -> str:
    """The canonical vectorized form of a one-thread-per-element kernel: the text from the
    index declaration to the end of the element code."""
    if not plan.pointers:
        raise Refused("no pointer is accessed only as p[i] outside conditions")
    _check_names(source, plan, element.name)
    vectors = _vectors(plan, width)
    indent = source.indent_of(element.decl.start_byte)
    i, vec = element.name, f"{element.name}_vec"
    bound = operand(source, element.bound, 10)
    gid = source.text_of(element.index.node)
    loads, stores = _vector_lines(plan, vectors, vec)
    exits = [(n, "continue;") for n in element_returns(element)]  # leave the lane, not the thread
    lane_body = element_text(source, element, plan.replacements(f"{i}_lane") + exits)
    scalar_body = element_text(source, element, exits)
    lines = [
        f"{element.specifiers} {vec} = {gid};",
        f"{indent}if ({vec} * {width} >= {bound}) return;",
        f"{indent}if ({vec} * {width} + {width} <= {bound}) {{",
    ]
    lines += [f"{indent}  {line}" for line in loads]
    lines += _lanes(plan, element.index_type, i, width, shift(lane_body, 2), indent + "  ")
    lines += [f"{indent}  {line}" for line in stores]
    lines += [f"{indent}  return;", f"{indent}}}"]
    lines.append(
        f"{indent}for ({element.index_type} {i} = {vec} * {width}; {i} < {bound}; ++{i}) {{"
        f"{shift(scalar_body, 2)}\n{indent}}}"
    )
    return "\n".join(lines)


def _element_plan(source: ParsedSource, element: ElementKernel) -> _Plan:
    refusal = element_refusal(source, element, returns="nested")
    if refusal is None and not source.starts_line(element.decl.start_byte):
        refusal = "the index declaration does not start its line"
    if refusal is not None:
        raise Refused(refusal)
    return plan_vectorization(
        source, element.function, element.name, list(element.body), exits=element_returns(element)
    )


# ---------------------------------------------------------------------------------------------
# Canonical vector forms, recognized by writing them again
# ---------------------------------------------------------------------------------------------


def _regenerates(
    source: ParsedSource,
    region: tuple[int, int],
    scalar: str,
    write: Callable[[ParsedSource, int], str],
    expected: str | None = None,
) -> bool:
    """Whether putting ``scalar`` in ``region`` and vectorizing it again (``write`` on the
    new source, at the region's start) gives the region's text back (or ``expected``)."""
    start, end = region
    data = source.data
    text = (data[:start] + scalar.encode("utf-8") + data[end:]).decode("utf-8")
    temp = KernelSource(text, name=source.kernel.name).parsed
    if temp.errors and len(temp.errors) > len(source.errors):
        return False
    try:
        again = write(temp, start)
    except (Refused, AssertionError, StopIteration):
        return False
    return form_text(again) == form_text(source.text_of(region) if expected is None else expected)


@dataclass(frozen=True)
class _VectorLoop:
    """A canonical vectorized loop: the vector loop, its tail, the width, the scalar loop."""

    vector: Node
    tail: Node
    width: int
    scalar: str
    guard: Node | None = None
    """The ``if`` testing alignment at run time around them, the scalar loop in its else (or,
    peeled, the statement holding the peel, its head loop, them)."""
    check: str = CHECK_ALIGNED
    """How `guard` handles alignment (:data:`CHECKS`)."""

    @property
    def region(self) -> tuple[int, int]:
        """What the removal replaces by the scalar loop."""
        if self.guard is not None:
            return self.guard.start_byte, self.guard.end_byte
        return self.vector.start_byte, self.tail.end_byte


def _width_of(source: ParsedSource, node: Node) -> int | None:
    sides = binary(strip_parens(node), "/")
    if sides is None or sides[1].type != "number_literal":
        return None
    text = source.text_of(sides[1])
    return int(text) if text.isdigit() else None


def _write_loop(width: int, check: str = "") -> Callable[[ParsedSource, int], str]:
    def write(temp: ParsedSource, start: int) -> str:
        node = next(n for n in temp.nodes("for_statement") if n.start_byte == start)
        loop = scalar_loop(temp, node)
        function = temp.enclosing_function(node)
        if loop is None or function is None:
            raise Refused("no loop")
        plan = plan_vectorization(temp, function, loop.var, _loop_nodes(loop))
        if check == CHECK_ALIGNED:
            return checked_loop_text(temp, loop, plan, width)
        if check == CHECK_PEELED:
            return peeled_loop_text(temp, loop, plan, width)
        return loop_text(temp, loop, plan, width)

    return write


def _peel(source: ParsedSource, vector: Node, tail: Node, scalar: str, width: int) -> Node | None:
    """The statement holding a peeled loop (:func:`peeled_loop_text`): the block of the peel,
    the head loop, the vector loop and its tail, or the ``if`` whose first branch that block
    is and whose other branch is the scalar loop; and which writing it again gives back."""
    block = vector.parent
    if block is None or block.type != "compound_statement":
        return None
    held = statements(block)
    if len(held) != 5 or held[3:] != [vector, tail]:
        return None
    holder = block.parent
    statement = block
    if holder is not None and holder.type == "if_statement":
        if holder.child_by_field_name("consequence") != block:
            return None
        statement = holder
    region = (statement.start_byte, statement.end_byte)
    if not _regenerates(source, region, scalar, _write_loop(width, CHECK_PEELED)):
        return None
    return statement


def _alignment_guard(
    source: ParsedSource, vector: Node, tail: Node, scalar: str, width: int
) -> Node | None:
    """The ``if`` around a vector loop and its tail, alone in its first branch, whose other
    branch is the scalar loop, and which writing the checked form again gives back."""
    block = vector.parent
    guard = block.parent if block is not None else None
    if (
        block is None
        or guard is None
        or block.type != "compound_statement"
        or guard.type != "if_statement"
        or guard.child_by_field_name("consequence") != block
        or statements(block) != [vector, tail]
    ):
        return None
    region = (guard.start_byte, guard.end_byte)
    if not _regenerates(source, region, scalar, _write_loop(width, CHECK_ALIGNED)):
        return None
    return guard


def vector_loops(source: ParsedSource) -> list[_VectorLoop]:
    """The canonical vectorized loops of a kernel."""
    found = []
    for node in source.nodes("for_statement"):
        vector = scalar_loop(source, node)
        if vector is None or not vector.var.endswith("_vec"):
            continue
        tail_node = node.next_named_sibling
        tail = scalar_loop(source, tail_node) if tail_node is not None else None
        width = _width_of(source, vector.bound)
        if tail is None or tail_node is None or width is None or tail.var != vector.var[:-4]:
            continue
        scalar = splice(
            source,
            tail_node.start_byte,
            tail_node.end_byte,
            [(tail.start, source.text_of(vector.start))],
        )
        region = (node.start_byte, tail_node.end_byte)
        if _regenerates(source, region, scalar, _write_loop(width)):
            guard = _alignment_guard(source, node, tail_node, scalar, width)
            found.append(_VectorLoop(node, tail_node, width, scalar, guard))
            continue
        peel = _peel(source, node, tail_node, scalar, width)
        if peel is not None:
            found.append(_VectorLoop(node, tail_node, width, scalar, peel, CHECK_PEELED))
    return found


@dataclass(frozen=True)
class _VectorKernel:
    """A canonical vectorized one-thread-per-element kernel."""

    function: Function
    decl: Node
    end: Node
    width: int
    bound: Node
    scalar: str


def _write_kernel(width: int) -> Callable[[ParsedSource, int], str]:
    def write(temp: ParsedSource, start: int) -> str:
        element = next(e for e in element_kernels(temp) if e.start_byte == start)
        return kernel_text(temp, element, _element_plan(temp, element), width)

    return write


def _vector_guard(source: ParsedSource, node: Node, vec: str) -> tuple[int, Node] | None:
    """(W, N) of ``if (i_vec * W >= N) return;``."""
    if node.type != "if_statement":
        return None
    clause = node.child_by_field_name("condition")
    values = statements(clause) if clause is not None else []
    sides = binary(strip_parens(values[0]), ">=") if len(values) == 1 else None
    product = binary(strip_parens(sides[0]), "*") if sides is not None else None
    if sides is None or product is None or source.text_of(product[0]) != vec:
        return None
    width = source.text_of(product[1])
    return (int(width), sides[1]) if width.isdigit() else None


def _rows_undone(source: ParsedSource, region: tuple[int, int], rows: list[RowsForm]) -> str:
    """The text of ``region`` with its rows forms written back as the lane loops they were."""
    inside = [r for r in rows if region[0] <= r.node.start_byte < region[1]]
    return splice(source, region[0], region[1], [(r.node, r.original) for r in inside])


def vector_kernels(source: ParsedSource) -> list[_VectorKernel]:
    """The canonical vectorized one-thread-per-element kernels (their lane loops in the rows
    form or not)."""
    rows = rows_forms(source)
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        body = statements(function.body)
        for position, decl in enumerate(body[:-3]):
            parsed = index_declaration(source, decl)
            if parsed is None or not parsed[0].endswith("_vec"):
                continue
            name, specifiers, value = parsed
            guard = _vector_guard(source, body[position + 1], name)
            tail = scalar_loop(source, body[-1])
            if guard is None or tail is None or position + 3 != len(body) - 1:
                continue
            if global_index(source, value) is None or tail.var != name[:-4]:
                continue
            inner = tail.body.named_children if tail.body.type == "compound_statement" else []
            if not inner:
                continue
            # the tail's continues leave an element: in the scalar kernel they were returns
            exits = [(j, "return;") for j in leaving_jumps(inner, "continue_statement")]
            rest = unshift(splice(source, tail.body.start_byte + 1, inner[-1].end_byte, exits), 2)
            if rest is None:
                continue
            width, bound = guard
            indent = source.indent_of(decl.start_byte)
            base = name[:-4]
            scalar = (
                f"{specifiers} {base} = {source.text_of(value)};\n"
                f"{indent}if ({base} >= {source.text_of(bound)}) return;{rest}"
            )
            region = (decl.start_byte, body[-1].end_byte)
            expected = _rows_undone(source, region, rows)
            if _regenerates(source, region, scalar, _write_kernel(width), expected):
                found.append(_VectorKernel(function, decl, body[-1], width, bound, scalar))
    return found


# ---------------------------------------------------------------------------------------------
# Single vector accesses, and their split forms
# ---------------------------------------------------------------------------------------------

AccessForm = Literal["subscript", "deref", "ldg", "hinted"]
"""How a vector access is spelled: ``p[i]``, ``*A``, ``__ldg(A)``, or another load or store
intrinsic with a cache hint (``__ldcs(A)``, ``__stcs(A, v)``, ...)."""

LOAD_INTRINSICS = frozenset({"__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv"})
"""Loads through one pointer (read-only or cache-hinted); each has an overload for every scalar
and vector type, so a vector load splits into the same intrinsic on each element."""
STORE_INTRINSICS = frozenset({"__stwb", "__stcg", "__stcs", "__stwt"})
"""Cache-hinted stores ``__stcs(A, v)``, overloaded for every scalar and vector type too."""


@dataclass(frozen=True)
class _Access:
    """A load or store of a whole vector through a pointer to a vector type."""

    node: Node
    """The load expression, or the store's expression statement."""
    kind: Literal["load", "store"]
    form: AccessForm
    address: str
    """The address as text: ``&out4[c]``, ``in4 + c``."""
    address_node: Node | None
    """The node whose value is the address (deref and ``__ldg``); None for ``p[i]``."""
    subscript: Node | None
    """The ``p[i]`` node of the subscript form."""
    vector: VectorType
    value: Node | None
    """A store's value."""
    refusal: str | None
    intrinsic: str = ""
    """The load or store intrinsic the access goes through (``__ldg``, ``__stcs``), if any."""


def _vector_pointer(source: ParsedSource, function: Function, node: Node) -> VectorType | None:
    """The vector type ``node`` points to, when it is a pointer (not an array) to one."""
    type_text = expr_type(source, function, node)
    if type_text is None or not type_text.endswith("*"):
        return None
    return VECTOR_TYPES.get(type_text[:-1])


def _reference_binding(source: ParsedSource, node: Node) -> str | None:
    """Why a load's value cannot become a temporary (it binds to a non-const reference)."""
    child, parent = node, node.parent
    while parent is not None and parent.type in (
        "parenthesized_expression",
        "conditional_expression",
    ):
        child, parent = parent, parent.parent
    if parent is None:
        return None
    if parent.type == "init_declarator":
        declarator = parent.child_by_field_name("declarator")
        if declarator is not None and declarator.type == "reference_declarator":
            return "the loaded vector is bound to a reference"
    if parent.type == "argument_list" and parent.parent is not None:
        callee = parent.parent.child_by_field_name("function")
        if callee is not None and callee.type == "template_function":
            callee = callee.child_by_field_name("name")
        target = source.function(source.text_of(callee)) if callee is not None else None
        args = statements(parent)
        if target is not None and child in args:
            index = args.index(child)
            if index < len(target.params):
                param = target.params[index]
                if "&" in param.type and not param.is_const:
                    return f"the loaded vector is passed to {target.name} by reference"
    return None


def _access_at(source: ParsedSource, function: Function, node: Node) -> _Access | None:
    """The whole-vector access at ``node`` (a ``p[i]``, ``*A``, ``__ldg(A)`` or another load or
    store intrinsic), if it is one."""
    if node.type == "call_expression":
        return _intrinsic_access(source, function, node)
    form: AccessForm
    address_node: Node | None
    if node.type == "subscript_expression":
        base = node.child_by_field_name("argument")
        vector = _vector_pointer(source, function, base) if base is not None else None
        address, address_node, form = f"&{source.text_of(node)}", None, "subscript"
    elif node.type == "pointer_expression" and source.text_of(node).startswith("*"):
        argument = node.child_by_field_name("argument")
        vector = _vector_pointer(source, function, argument) if argument is not None else None
        address_node = strip_parens(argument) if argument is not None else None
        address = source.text_of(address_node) if address_node is not None else ""
        form = "deref"
    else:
        return None
    usage = _classify(node)
    if vector is None or usage in ("other", "both"):
        return None
    effects = None if is_side_effect_free(source, node) else "the address has side effects"
    subscript = node if form == "subscript" else None
    if usage == "load":
        refusal = effects or _reference_binding(source, node)
        return _Access(node, "load", form, address, address_node, subscript, vector, None, refusal)
    assignment = node.parent
    assert assignment is not None
    statement = assignment.parent
    value = assignment.child_by_field_name("right")
    if statement is None or statement.type != "expression_statement" or value is None:
        used = "the store's value is used in a larger expression"
        return _Access(node, "store", form, address, address_node, subscript, vector, value, used)
    return _Access(
        statement, "store", form, address, address_node, subscript, vector, value, effects
    )


def _intrinsic_access(source: ParsedSource, function: Function, call: Node) -> _Access | None:
    """``__ldcs(A)`` (any load intrinsic) or ``__stcs(A, v);`` (any store intrinsic) of a whole
    vector."""
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    name = source.text_of(callee) if callee is not None else ""
    if name in LOAD_INTRINSICS and len(args) == 1:
        kind: Literal["load", "store"] = "load"
    elif name in STORE_INTRINSICS and len(args) == 2:
        kind = "store"
    else:
        return None
    vector = _vector_pointer(source, function, args[0])
    if vector is None:
        return None
    refusal = None if is_side_effect_free(source, args[0]) else "the address has side effects"
    text = source.text_of(args[0])
    form: AccessForm = "ldg" if name == "__ldg" else "hinted"
    if kind == "load":
        return _Access(call, "load", form, text, args[0], None, vector, None, refusal, name)
    statement = call.parent
    if statement is None or statement.type != "expression_statement":
        used = "the store's value is used in a larger expression"
        return _Access(call, "store", form, text, args[0], None, vector, args[1], used, name)
    return _Access(statement, "store", form, text, args[0], None, vector, args[1], refusal, name)


def vector_accesses(source: ParsedSource, skip: list[tuple[int, int]]) -> list[_Access]:
    """Every whole-vector load and store in device code outside the ``skip`` regions."""
    found = []
    for node in source.iter_nodes("subscript_expression", "pointer_expression", "call_expression"):
        if any(start <= node.start_byte < end for start, end in skip):
            continue
        function = source.enclosing_function(node)
        if function is None or not function.runs_on_device:
            continue
        access = _access_at(source, function, node)
        if access is not None:
            found.append(access)
    return found


def split_text(source: ParsedSource, access: _Access, names: set[str]) -> str:
    """The access as one scalar access per element, laid out like the code around it."""
    vector = access.vector
    element = vector.element
    line_start = source.line_start(access.node.start_byte)
    column = len(source.data[line_start : access.node.start_byte].decode("utf-8"))
    if access.kind == "load":
        cast = f"reinterpret_cast<const {element}*>({access.address})"
        if access.intrinsic:
            hint = access.intrinsic
            parts = [f"{hint}({cast}{f' + {k}' if k else ''})" for k in range(vector.count)]
        else:
            parts = [f"{cast}[{k}]" for k in range(vector.count)]
        one_line = f"{vector.make}({', '.join(parts)})"
        if column + len(one_line) <= 100:
            return one_line
        separator = ",\n" + " " * (column + len(vector.make) + 1)
        return f"{vector.make}({separator.join(parts)})"
    assert access.value is not None
    packed, elems = _fresh("packed", names), _fresh("elems", names)
    indent = source.indent_of(access.node.start_byte)
    stores = [
        _element_store_text(access.intrinsic, elems, k, f"{packed}.{f}")
        for k, f in enumerate(vector.fields)
    ]
    inner = [
        f"const {vector.name} {packed} = {source.text_of(access.value)};",
        f"{element}* {elems} = reinterpret_cast<{element}*>({access.address});",
        *stores,
    ]
    return "{" + "".join(f"\n{indent}  {line}" for line in inner) + f"\n{indent}}}"


def _fresh(base: str, names: set[str]) -> str:
    name, n = base, 2
    while name in names:
        name, n = f"{base}{n}", n + 1
    return name


@dataclass(frozen=True)
class _Split:
    """The split form of a vector access (what ``remove`` writes), a candidate to merge."""

    node: Node
    kind: Literal["load", "store"]
    form: AccessForm
    address: Node
    vector: VectorType
    value: Node | None
    intrinsic: str = ""
    """The intrinsic every element access goes through (``__ldg``, ``__stcs``), if any."""


def _cast_target(source: ParsedSource, node: Node) -> tuple[str, Node] | None:
    """(element type, argument) of ``reinterpret_cast<[const] E*>(A)``."""
    node = strip_parens(node)
    if node.type != "call_expression":
        return None
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    if callee is None or callee.type != "template_function" or arguments is None:
        return None
    name = callee.child_by_field_name("name")
    targs = callee.child_by_field_name("arguments")
    args = statements(arguments)
    if name is None or source.text_of(name) != "reinterpret_cast" or len(args) != 1:
        return None
    target = normalize_type(source.text_of(targs).strip("<>")) if targs is not None else ""
    return (target[:-1], args[0]) if target.endswith("*") else None


def _element_ref(source: ParsedSource, node: Node) -> tuple[str, Node, int, str] | None:
    """(E, A, k, intrinsic) of ``reinterpret_cast<const E*>(A)[k]`` (intrinsic "") or
    ``__ldg(cast + k)`` (any load intrinsic)."""
    node = strip_parens(node)
    if node.type == "subscript_expression":
        base = node.child_by_field_name("argument")
        indices = node.child_by_field_name("indices")
        inner = statements(indices) if indices is not None else []
        cast = _cast_target(source, base) if base is not None else None
        if cast is None or len(inner) != 1 or not source.text_of(inner[0]).isdigit():
            return None
        return cast[0], cast[1], int(source.text_of(inner[0])), ""
    if node.type != "call_expression":
        return None
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    hint = source.text_of(callee) if callee is not None else ""
    if hint not in LOAD_INTRINSICS or len(args) != 1:
        return None
    sum_ = binary(strip_parens(args[0]), "+")
    if sum_ is not None and source.text_of(sum_[1]).isdigit():
        cast, k = _cast_target(source, sum_[0]), int(source.text_of(sum_[1]))
    else:
        cast, k = _cast_target(source, args[0]), 0
    return None if cast is None else (cast[0], cast[1], k, hint)


def _split_load(source: ParsedSource, function: Function, call: Node) -> _Split | None:
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    if callee is None or not args:
        return None
    refs = [_element_ref(source, a) for a in args]
    if any(r is None for r in refs):
        return None
    first = refs[0]
    assert first is not None
    address = first[1]
    vector = _vector_pointer(source, function, address)
    if vector is None or vector.make != source.text_of(callee) or vector.count != len(args):
        return None
    for k, ref in enumerate(refs):
        assert ref is not None
        element, node, index, hint = ref
        if (element, source.text_of(node), index, hint) != (
            vector.element,
            source.text_of(address),
            k,
            first[3],
        ):
            return None
    address_text = source.text_of(address)
    form = _split_form(first[3], address_text)
    return _Split(call, "load", form, address, vector, None, first[3])


def _split_form(intrinsic: str, address: str) -> AccessForm:
    """The access form a split access merges back into."""
    if intrinsic:
        return "ldg" if intrinsic == "__ldg" else "hinted"
    return "subscript" if address.startswith("&") else "deref"


def _element_store_text(intrinsic: str, elems: str, k: int, value: str) -> str:
    """One element's store of a split vector store: ``elems[k] = value;``, or through the
    vector store's intrinsic, ``__stcs(&elems[k], value);``."""
    return f"{intrinsic}(&{elems}[{k}], {value});" if intrinsic else f"{elems}[{k}] = {value};"


def _element_store(source: ParsedSource, statement: Node, elems: str) -> str | None:
    """The intrinsic of a split store's element statement: "" for ``elems[k] = ...;``, the
    name for ``__stcs(&elems[k], ...);``, None for anything else (the caller matches the rest)."""
    text = " ".join(source.text_of(statement).split())
    if text.startswith(f"{elems}["):
        return ""
    call = statement.named_children[0] if statement.named_children else None
    callee = call.child_by_field_name("function") if call is not None else None
    hint = source.text_of(callee) if callee is not None else None
    return hint if hint in STORE_INTRINSICS else None


def _split_store(source: ParsedSource, function: Function, block: Node) -> _Split | None:
    body = statements(block)
    if len(body) < 4:
        return None
    packed = index_declaration(source, body[0])
    pointer = body[1]
    declarators = (
        pointer.children_by_field_name("declarator") if pointer.type == "declaration" else []
    )
    if packed is None or len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    target = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if target is None or value is None or target.type != "pointer_declarator":
        return None
    elems_node = target.child_by_field_name("declarator")
    cast = _cast_target(source, value)
    if elems_node is None or cast is None:
        return None
    elems = source.text_of(elems_node)
    vector = _vector_pointer(source, function, cast[1])
    if vector is None or len(body) != vector.count + 2 or cast[0] != vector.element:
        return None
    if normalize_type(packed[1]) != vector.name:
        return None
    hint = _element_store(source, body[2], elems)
    if hint is None:
        return None
    for k, (statement, name) in enumerate(zip(body[2:], vector.fields, strict=True)):
        wanted = _element_store_text(hint, elems, k, f"{packed[0]}.{name}")
        if " ".join(source.text_of(statement).split()) != wanted:
            return None
    address = source.text_of(cast[1])
    return _Split(block, "store", _split_form(hint, address), cast[1], vector, packed[2], hint)


def split_forms(source: ParsedSource) -> list[_Split]:
    """The split accesses that ``remove`` writes, which ``apply`` merges back."""
    makes = {v.make for v in VECTOR_TYPES.values()}
    found = []
    for node in source.iter_nodes("call_expression", "compound_statement"):
        function = source.enclosing_function(node)
        if function is None or not function.runs_on_device:
            continue
        if node.type == "call_expression":
            callee = node.child_by_field_name("function")
            if callee is None or source.text_of(callee) not in makes:
                continue
            split = _split_load(source, function, node)
        else:
            split = _split_store(source, function, node)
        if split is not None:
            found.append(split)
    return found


def merged_text(source: ParsedSource, split: _Split) -> str:
    """The vector access a split form stands for."""
    address = split.address
    text = source.text_of(address)
    if split.kind == "store" and split.intrinsic:
        assert split.value is not None
        return f"{split.intrinsic}({text}, {source.text_of(split.value)});"
    if split.intrinsic:
        access = f"{split.intrinsic}({text})"
    elif split.form == "subscript":
        target = address.child_by_field_name("argument")
        access = source.text_of(target) if target is not None else f"*({text})"
    else:
        access = f"*{text}" if precedence(address) >= PRIMARY else f"*({text})"
    if split.kind == "load":
        return access
    assert split.value is not None
    return f"{access} = {source.text_of(split.value)};"


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------

Form = Literal["loop", "kernel", "load", "store"]


def _run_time_check(source: ParsedSource, site: Site) -> str:
    """``peeled`` for a scalar loop whose vectorized pointers share one element size (so one
    count of scalar elements aligns them all), else ``aligned``."""
    node = next((n for n in source.nodes("for_statement") if n.start_byte == site.start_byte), None)
    loop = scalar_loop(source, node) if node is not None else None
    function = source.enclosing_function(site.start_byte)
    if loop is None or function is None:
        return CHECK_ALIGNED
    try:
        plan = plan_vectorization(source, function, loop.var, _loop_nodes(loop))
    except Refused:
        return CHECK_ALIGNED
    return CHECK_PEELED if len({p.size for p in plan.pointers}) == 1 else CHECK_ALIGNED


@register
class VectorizedAccess(Mechanism):
    name = "vectorized_access"
    category = "memory"
    signature = ("global_width",)
    family = "vectorized loads and stores"
    intent = (
        "Move several elements per memory instruction (float4, uint4 of 8 bf16, half2) so a "
        "warp issues fewer, wider loads and stores for the same bytes."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "vector_width": "elements per access (2, 4, or 8 for 16-byte accesses of 2-byte "
        "types); default: 16 bytes of the widest element",
        "check": f"'{CHECK_ALIGNED}': a loop tests its pointers' alignment at run time and "
        f"keeps the scalar loop for the rest; '{CHECK_PEELED}': a loop runs scalar elements "
        "until its pointers are aligned, then vectors (either: no alignment condition); "
        "default: none",
    }

    # -- detection ------------------------------------------------------------------------------

    def _canonical(self, source: ParsedSource) -> tuple[list[_VectorLoop], list[_VectorKernel]]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "canonical" not in cache:
            cache["canonical"] = (vector_loops(source), vector_kernels(source))
        result: tuple[list[_VectorLoop], list[_VectorKernel]] = cache["canonical"]
        return result

    def _rows(self, source: ParsedSource) -> list[RowsForm]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "rows" not in cache:
            cache["rows"] = rows_forms(source)
        result: list[RowsForm] = cache["rows"]
        return result

    def _scans(self, source: ParsedSource) -> list[VectorScan]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "scans" not in cache:
            cache["scans"] = vector_scans(source)
        result: list[VectorScan] = cache["scans"]
        return result

    def _spans(self, source: ParsedSource) -> list[tuple[int, int]]:
        loops, kernels = self._canonical(source)
        return (
            [v.region for v in loops]
            + [(k.decl.start_byte, k.end.end_byte) for k in kernels]
            + [(s.node.start_byte, s.node.end_byte) for s in self._scans(source)]
        )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        loops, kernels = self._canonical(source)
        for loop in loops:
            detail: dict[str, str | int] = {"form": "loop", "width": loop.width}
            if loop.guard is not None:
                detail["check"] = loop.check
            yield self.site(source, loop.guard or loop.vector, span=loop.region, detail=detail)
        rows = self._rows(source)
        for found in kernels:
            span = (found.decl.start_byte, found.end.end_byte)
            split = any(span[0] <= r.node.start_byte < span[1] for r in rows)
            yield self.site(
                source,
                found.decl,
                span=span,
                detail={"form": "kernel", "width": found.width, "kernel": found.function.name},
                refusal="its lanes split their row once a vector (form rows): remove that first"
                if split
                else None,
            )
        for row in rows:
            yield self.site(source, row.node, detail={"form": ROWS, "width": row.width})
        for scan in self._scans(source):
            yield self.site(source, scan.node, detail={"form": SCAN, "width": scan.width})
        for access in vector_accesses(source, self._spans(source)):
            yield self.site(
                source,
                access.node,
                detail={
                    "form": access.kind,
                    "access": access.form,
                    "vector": access.vector.name,
                    "width": access.vector.count,
                },
                refusal=access.refusal,
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        spans = self._spans(source)
        for node in source.nodes("for_statement"):
            if any(start <= node.start_byte < end for start, end in spans):
                continue
            site = self._loop_candidate(source, node) or self._scan_candidate(source, node)
            if site is not None:
                yield site
        for element in element_kernels(source):
            if any(start <= element.start_byte < end for start, end in spans):
                continue
            site = self._kernel_candidate(source, element)
            if site is not None:
                yield site
        yield from self._rows_candidates(source)
        for split in split_forms(source):
            yield self.site(
                source,
                split.node,
                detail={"form": split.kind, "access": split.form, "vector": split.vector.name},
            )

    def _loop_candidate(self, source: ParsedSource, node: Node) -> Site | None:
        loop = scalar_loop(source, node)
        function = source.enclosing_function(node)
        if loop is None or function is None or not function.runs_on_device:
            return None
        try:
            plan = plan_vectorization(source, function, loop.var, _loop_nodes(loop))
        except Refused:
            return None
        if not plan.pointers:
            return None
        refusal = _loop_refusal(source, loop)
        header = source.snippet((node.start_byte, loop.body.start_byte)).rstrip(" {")
        detail: dict[str, str | int] = {
            "form": "loop",
            "pointers": ",".join(p.name for p in plan.pointers),
        }
        return self.site(source, node, snippet=header, detail=detail, refusal=refusal)

    def _rows_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Lane loops of canonical vector kernels whose lanes split their index by row."""
        _, kernels = self._canonical(source)
        rows = self._rows(source)
        for found in kernels:
            span = (found.decl.start_byte, found.end.end_byte)
            if any(span[0] <= r.node.start_byte < span[1] for r in rows):
                continue
            for node in source.nodes("for_statement"):
                if not span[0] <= node.start_byte < span[1]:
                    continue
                try:
                    lanes = split_lanes(source, node)
                except NotInForm:
                    continue
                header = source.snippet((node.start_byte, lanes.loop.end_byte), 60)
                yield self.site(
                    source, node, snippet=header, detail={"form": ROWS, "width": lanes.width}
                )

    def _scan_candidate(self, source: ParsedSource, node: Node) -> Site | None:
        try:
            scan = scan_loop(source, node)
        except NotInForm:
            return None
        header = source.snippet((node.start_byte, scan.loop.child_by_field_name("body").start_byte))
        pointers = f"{scan.source_pointer},{scan.target_pointer}"
        return self.site(
            source, node, snippet=header.rstrip(" {"), detail={"form": SCAN, "pointers": pointers}
        )

    def _kernel_candidate(self, source: ParsedSource, element: ElementKernel) -> Site | None:
        try:
            plan = _element_plan(source, element)
        except Refused:
            return None
        if not plan.pointers:
            return None
        detail: dict[str, str | int] = {
            "form": "kernel",
            "kernel": element.function.name,
            "pointers": ",".join(p.name for p in plan.pointers),
        }
        return self.site(
            source,
            element.decl,
            span=(element.start_byte, element.end_byte),
            snippet=f"{element.function.name}: {source.snippet(element.decl)}",
            detail=detail,
        )

    # -- removal ---------------------------------------------------------------------------

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        form = site.detail.get("form")
        span = (site.start_byte, site.end_byte)
        loops, kernels = self._canonical(source)
        if form == "loop":
            loop = next(v for v in loops if v.region == span)
            return [Edit(span[0], span[1], loop.scalar)]
        if form == "kernel":
            found = next(k for k in kernels if (k.decl.start_byte, k.end.end_byte) == span)
            try:
                grids = grid_edits(source, found.function, found.bound, 1)
            except Refused as refused:
                raise self.refuse(str(refused), site) from refused
            return [Edit(span[0], span[1], found.scalar)] + [Edit.replace(n, t) for n, t in grids]
        if form == SCAN:
            scan = next(s for s in self._scans(source) if s.node.start_byte == span[0])
            return [Edit(span[0], span[1], scan.scalar)]
        if form == ROWS:
            row = next(r for r in self._rows(source) if r.node.start_byte == span[0])
            return [Edit(span[0], span[1], row.original)]
        access = next(
            a
            for a in vector_accesses(source, self._spans(source))
            if (a.node.start_byte, a.node.end_byte) == span
        )
        function = source.enclosing_function(access.node)
        assert function is not None
        names = names_in_function(source, function)
        return [Edit.replace(access.node, split_text(source, access, names))]

    # -- application -----------------------------------------------------------------------

    def _width(self, carrier: Carrier, fallback: int, site: Site) -> int:
        width = carrier.get_int("vector_width", fallback)
        assert width is not None
        if width < 2:
            raise self.refuse(f"vector_width={width} is not a vector", site, "apply")
        return width

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        form = site.detail.get("form")
        try:
            if form == "loop":
                return self._apply_loop(source, site, carrier)
            if form == "kernel":
                return self._apply_kernel(source, site, carrier)
            if form == SCAN:
                node = self.node_at(source, site, "for_statement")
                width = self._width(carrier, max(VECTORS), site)
                return [vector_scan_edit(source, node, width)]
            if form == ROWS:
                lanes = split_lanes(source, self.node_at(source, site, "for_statement"))
                return [Edit(lanes.start, lanes.loop.end_byte, rows_text(source, lanes))]
        except (Refused, NotInForm) as refused:
            raise self.refuse(str(refused), site, "apply") from refused
        split = next(
            s for s in split_forms(source) if (s.node.start_byte, s.node.end_byte) == (
                site.start_byte, site.end_byte
            )
        )  # fmt: skip
        width = self._width(carrier, split.vector.count, site)
        if width != split.vector.count:
            raise self.refuse(
                f"this split {split.vector.name} access has {split.vector.count} elements, "
                f"not vector_width={width}",
                site,
                "apply",
            )
        return [Edit.replace(split.node, merged_text(source, split))]

    def _apply_loop(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        node = self.node_at(source, site, "for_statement")
        loop = scalar_loop(source, node)
        function = source.enclosing_function(node)
        assert loop is not None and function is not None
        plan = plan_vectorization(source, function, loop.var, _loop_nodes(loop))
        width = self._width(carrier, default_width(plan), site)
        check = carrier.get_str("check", "")
        if check not in ("", *CHECKS):
            raise self.refuse(f"check={check!r} is not one of {CHECKS}", site, "apply")
        if check == CHECK_ALIGNED:
            return [Edit.replace(node, checked_loop_text(source, loop, plan, width))]
        if check == CHECK_PEELED:
            return [Edit.replace(node, peeled_loop_text(source, loop, plan, width))]
        return [Edit.replace(node, loop_text(source, loop, plan, width))]

    def _apply_kernel(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        element = next(e for e in element_kernels(source) if e.start_byte == site.start_byte)
        plan = _element_plan(source, element)
        width = self._width(carrier, default_width(plan), site)
        text = kernel_text(source, element, plan, width)
        grids = grid_edits(source, element.function, element.bound, width)
        return [Edit(element.start_byte, element.end_byte, text)] + [
            Edit.replace(n, t) for n, t in grids
        ]

    # -- carriers and conditions -----------------------------------------------------------

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        width = site.detail.get("width")
        carrier = Carrier(vector_width=width) if isinstance(width, int) else Carrier()
        check = site.detail.get("check")
        if check in CHECKS:
            carrier = carrier.merged(Carrier(check=check))
        return carrier

    def run_time_check(
        self, kernel: KernelSource, site: Site, condition: Condition
    ) -> Carrier | None:
        """A loop's alignment (and the row length that keeps it) is handled at run time: a
        misaligned row is peeled to alignment (``check=peeled``) where one peel can align
        every vectorized pointer, else it takes the scalar loop (``check=aligned``)."""
        if site.detail.get("form") == "loop" and isinstance(
            condition, (PointerAlignment, AxisDivisible)
        ):
            return Carrier(check=_run_time_check(kernel.parsed, site))
        return None

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        form = site.detail.get("form")
        function = source.enclosing_function(site.start_byte)
        if function is None:
            return []
        if form in ("loop", "kernel"):
            return self._form_conditions(source, function, site)
        if form in (SCAN, ROWS):
            return []  # the vector path (the shared row) is checked on the device
        return self._access_conditions(source, function, site)

    def _form_conditions(
        self, source: ParsedSource, function: Function, site: Site
    ) -> list[Condition]:
        """Alignment of every vectorized pointer (and, for a loop, how it splits the work),
        read from the scalar form: the candidate itself, or what a detected site removes to."""
        form = site.detail.get("form")
        width = site.detail.get("width")
        span = (site.start_byte, site.end_byte)
        loops, kernels = self._canonical(source)
        scalars = [v.scalar for v in loops if v.region == span]
        scalars += [k.scalar for k in kernels if (k.decl.start_byte, k.end.end_byte) == span]
        if scalars:
            data = source.data
            text = data[: span[0]] + scalars[0].encode("utf-8") + data[span[1] :]
            source = KernelSource(text.decode("utf-8"), name=source.kernel.name).parsed
        function = source.enclosing_function(span[0]) or function
        found: list[Condition] = []
        try:
            if form == "loop":
                node = next(n for n in source.nodes("for_statement") if n.start_byte == span[0])
                loop = scalar_loop(source, node)
                assert loop is not None
                plan = plan_vectorization(source, function, loop.var, _loop_nodes(loop))
                found += _partition_prose(source, function, loop)
            else:
                element = next(e for e in element_kernels(source) if e.start_byte == span[0])
                plan = _element_plan(source, element)
        except (Refused, StopIteration):
            return []
        chosen = width if isinstance(width, int) else default_width(plan) if plan.pointers else 1
        if site.detail.get("check") in CHECKS:
            return merge_conditions(found)  # alignment is tested at run time
        for pointer in plan.pointers:
            first = pointer.accesses()[0].child_by_field_name("argument")
            assert first is not None
            found += alignment_conditions(source, function, first, pointer.size * chosen)
        return merge_conditions(found)

    def _access_conditions(
        self, source: ParsedSource, function: Function, site: Site
    ) -> list[Condition]:
        span = (site.start_byte, site.end_byte)
        accesses = [
            a
            for a in vector_accesses(source, self._spans(source))
            if (a.node.start_byte, a.node.end_byte) == span
        ]
        if accesses:
            access = accesses[0]
            vector, node, subscript = access.vector, access.address_node, access.subscript
        else:
            split = next(
                (s for s in split_forms(source) if (s.node.start_byte, s.node.end_byte) == span),
                None,
            )
            if split is None:
                return []
            vector, node, subscript = split.vector, split.address, None
        size = vector.count * ELEMENT_SIZES[vector.element]
        if subscript is not None:
            base = subscript.child_by_field_name("argument")
            indices = subscript.child_by_field_name("indices")
            offset = statements(indices)[0] if indices is not None else None
            if base is not None and offset is not None:
                return merge_conditions(alignment_of_sum(source, function, base, offset, size))
        assert node is not None
        return merge_conditions(alignment_conditions(source, function, node, size))
