"""Vectorization plans: which pointers of some element code can be read or written as vectors
(every use ``p[c]`` at the element's own index, outside any condition, never written), and the
names and lanes a vector rewrite of that code declares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.mechanisms._local_util import (
    ELEMENT_SIZES,
    Refused,
    assigned_names,
    binary,
    collective_in,
    identifiers,
    local_types,
    loop_bound_jumps,
    names_in_function,
    normalize_type,
    shift,
    statements,
    strip_parens,
    vector_for,
    walk,
)

MAX_BYTES = 16
"""The widest access a thread can make."""

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
class VectorPlan:
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


def classify_access(subscript: Node) -> Literal["load", "store", "both", "other"]:
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
) -> VectorPlan:
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
            kind = classify_access(subscript)
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
    return VectorPlan(function, index, chosen, used)


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


def vector_names(plan: VectorPlan, width: int) -> dict[str, str]:
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


def default_width(plan: VectorPlan) -> int:
    """The widest width every vectorized pointer supports: 16 bytes of the largest element."""
    return max(1, min(MAX_BYTES // p.size for p in plan.pointers))


def check_names(
    source: ParsedSource, plan: VectorPlan, index: str, scope: Node | None = None
) -> None:
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


def vector_lines(
    plan: VectorPlan, vectors: dict[str, str], vec: str, offset: str | None = None
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


def plan_lanes(
    plan: VectorPlan,
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
