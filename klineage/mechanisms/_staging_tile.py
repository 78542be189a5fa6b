"""Removing a tile of several dimensions staged once: the shared-memory transpose.

A block that reads a tile of its input in another order than it loads it (a transpose reads
columns of what it loaded as rows) stages the tile once, row by row, waits at a barrier, and
reads it transposed::

    __shared__ float S[T][T + 1];
    int in = (by * T + threadIdx.y) * n + bx * T + threadIdx.x;
    for (int i = 0; i < T; i += R) S[threadIdx.y + i][threadIdx.x] = g[in + i * n];
    __syncthreads();
    for (int i = 0; i < T; i += R) out[...] = S[threadIdx.x][threadIdx.y + i];

Removing the staging reads global memory where the tile was read: slot ``[a][b]`` was filled
by the thread with ``threadIdx.x = b`` and ``threadIdx.y + i = a``, so each read ``S[a][b]``
becomes the stored value with ``threadIdx.x := b``, ``threadIdx.y := a`` and ``i := 0`` (its
``+ i * n`` terms dropped). That is valid when the analysis shows the stored value's global
index depends on ``threadIdx.y`` and ``i`` only through their sum (and on no thread index
that no slot index names), so every thread and iteration that fills a slot stores the same
value. Each index of the tile is a thread index, one of them possibly plus the loop variable,
or a loop variable that starts at a thread index (``for (r = threadIdx.y; ...) S[r][...]``).

The stored value is rewritten in terms the reading thread can evaluate: locals that differ
between threads are replaced by their definitions as they reach the store (a local
reassigned after the index was computed keeps its first value there), while locals that are
the same for the whole block and not written once the tile is staged keep their names
(block coordinates computed in branches). The staging statement, the tile's declaration,
the barrier (when no shared memory is left) and declarations nothing uses any more go.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.analysis.indices import MEMORY, THREAD_ATOMS, is_loop_atom
from klineage.cuda.cexpr import PRIMARY, precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import NotInForm, binary_operands, builtin_of, statements, strip_parens
from klineage.mechanisms._staging_once import is_written, no_shared_left, orphan_deletions
from klineage.mechanisms._tiles_util import Locals, name_of, statement_deletion, substitute

__all__ = ["Slot", "SlotRewriter", "TileStore", "check_index", "stores_tile", "tile_once_removal"]

_NEEDED = (
    "a loop (or one statement) that only stores `S[threadIdx.y + i][threadIdx.x] = G[...]` "
    "(each index a thread index, one possibly plus the loop variable), the stored value built "
    "from thread indices, the loop variable, block-uniform locals and arguments the kernel "
    "never writes; then one barrier, and reads `S[a][b]` after it"
)
_UNIFORM_BUILTINS = ("blockIdx", "blockDim", "gridDim")
_LOOPS = ("for_statement", "while_statement", "do_statement")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class Slot:
    """How the staging fills one index of the tile: ``threadIdx.<thread>``, plus the loop
    variable when ``plus_loop``; or the loop variable alone (started at the thread index)
    when ``loop_only``."""

    thread: str
    plus_loop: bool = False
    loop_only: bool = False


@dataclass(frozen=True)
class TileStore:
    """``S[i0][i1]... = value;`` in the staging statement."""

    statement: Node
    tile: str
    indices: tuple[Node, ...]
    """The index expressions, outermost first."""
    value: Node


def _subscripts(node: Node) -> tuple[Node, list[Node]]:
    """``S[a][b]`` -> (``S``, [a, b])."""
    indices: list[Node] = []
    base = strip_parens(node)
    while base.type == "subscript_expression":
        index_list = base.child_by_field_name("indices")
        index = base.child_by_field_name("index")
        if index is None and index_list is not None and index_list.named_children:
            index = index_list.named_children[0]
        argument = base.child_by_field_name("argument")
        if index is None or argument is None:
            break
        indices.append(index)
        base = strip_parens(argument)
    indices.reverse()
    return base, indices


def _staging_statements(statement: Node) -> list[Node]:
    """The statements a staging statement runs: a loop's body, or itself."""
    if statement.type == "for_statement":
        return statements(statement.child_by_field_name("body"))
    return [statement]


def stores_tile(source: ParsedSource, statement: Node) -> bool:
    """Whether a statement staging a tile once stores into an array of several dimensions
    (``S[a][b] = ...``), the form :func:`tile_once_removal` reads."""
    for inner in _staging_statements(statement):
        pair = plain_assignment(inner)
        if pair is not None and len(_subscripts(pair[0])[1]) > 1:
            return True
    return False


def _tile_store(source: ParsedSource, statement: Node) -> TileStore:
    pair = plain_assignment(statement)
    if pair is None:
        raise _refuse(f"a staging loop holding `{source.snippet(statement, 60)}`")
    base, indices = _subscripts(pair[0])
    if base.type != "identifier" or len(indices) < 2:
        raise _refuse(f"a staging loop storing `{source.snippet(pair[0], 60)}`, not a 2-D tile")
    return TileStore(statement, source.text_of(base), tuple(indices), pair[1])


def _slots(
    source: ParsedSource, indices: FunctionIndices, store: TileStore, loop_atom: str | None
) -> list[Slot]:
    """How each index of the tile is filled; NotInForm when one is not a thread index (plus
    the loop variable)."""
    slots: list[Slot] = []
    for index in store.indices:
        form = indices.form(index)
        slot = None
        for thread in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
            if form == IndexForm.atom(thread):
                slot = Slot(thread)
            elif loop_atom is not None and form == IndexForm.atom(thread) + IndexForm.atom(
                loop_atom
            ):
                slot = Slot(thread, plus_loop=True)
        if slot is None and loop_atom is not None and form == IndexForm.atom(loop_atom):
            variable = indices.loop(loop_atom)
            start = variable.init if variable is not None else IndexForm()
            thread = next(
                (t for t in ("x", "y", "z") if start == IndexForm.atom(f"threadIdx.{t}")), None
            )
            slot = Slot(f"threadIdx.{thread}", loop_only=True) if thread else None
        if slot is None:
            raise _refuse(
                f"a tile stored at `{source.snippet(store.statement, 60)}`, whose index "
                f"`{source.text_of(index)}` is not a thread index (plus the loop variable)"
            )
        slots.append(slot)
    threads = [s.thread for s in slots]
    if len(set(threads)) != len(threads) or sum(s.plus_loop or s.loop_only for s in slots) > 1:
        raise _refuse(
            f"a tile stored at `{source.snippet(store.statement, 60)}`, whose indices repeat "
            "a thread index or the loop variable"
        )
    return slots


def check_index(
    source: ParsedSource,
    indices: FunctionIndices,
    store: TileStore,
    slots: list[Slot],
    loop_atom: str | None,
    offset: IndexForm,
) -> None:
    """A global load's index in the stored value must be the same for every thread and
    iteration that fills one slot: only the slots' thread indices, the loop variable along
    its slot's thread index only through their sum, nothing read from memory."""
    value = source.snippet(store.value, 60)
    named = {s.thread for s in slots}
    others = {a for a in indices.thread_atoms(offset) if a not in named}
    # a loop variable started at a thread index stands for it: the index may not use both
    others |= {s.thread for s in slots if s.loop_only and offset.depends_on(s.thread)}
    if others or MEMORY in offset.base_atoms():
        why = ", ".join(sorted(others)) if others else "a value read from memory"
        raise _refuse(f"a staged value `{value}` whose index depends on {why}")
    loops = {a for a in offset.base_atoms() if is_loop_atom(a) and a != loop_atom}
    if loops:
        raise _refuse(f"a staged value `{value}` whose index depends on {', '.join(sorted(loops))}")
    if loop_atom is None or not offset.depends_on(loop_atom):
        return
    along = next((s for s in slots if s.plus_loop or s.loop_only), None)
    if along is None:
        raise _refuse(f"a staged value `{value}` that varies with the loop, not its slot")
    if along.plus_loop:
        moved = IndexForm.atom(along.thread) - IndexForm.atom(loop_atom)
        if offset.substitute({along.thread: moved}).depends_on(loop_atom):
            raise _refuse(
                f"a staged value `{value}` whose index depends on {along.thread} and the "
                "loop variable other than through their sum"
            )


def _check_loads(
    source: ParsedSource,
    indices: FunctionIndices,
    store: TileStore,
    slots: list[Slot],
    loop_atom: str | None,
) -> None:
    """The stored value reads global memory the kernel never writes, at indices
    :func:`check_index` accepts."""
    written = {
        a.buffer.name
        for a in indices.accesses()
        if a.direction != "load" and a.buffer.space == "global"
    }
    start, end = store.value.start_byte, store.value.end_byte
    for access in indices.accesses():
        if not start <= access.node.start_byte < end:
            continue
        name = access.buffer.name
        if access.direction != "load" or access.buffer.space != "global" or name in written:
            raise _refuse(
                f"a staged value `{source.snippet(store.value, 60)}` read from {name}, "
                "which the kernel writes or which is not global memory"
            )
        check_index(source, indices, store, slots, loop_atom, access.offset)


def _check_outside_loads(source: ParsedSource, indices: FunctionIndices, store: TileStore) -> None:
    """Outside its loads' indices the stored value may not differ between the threads and
    iterations that fill one slot: no thread index, loop variable or value read elsewhere."""
    loads = [
        a.node
        for a in indices.accesses()
        if store.value.start_byte <= a.node.start_byte < store.value.end_byte
    ]
    stack = [store.value]
    while stack:
        node = stack.pop()
        if any(
            load.start_byte <= node.start_byte and node.end_byte <= load.end_byte for load in loads
        ):
            continue
        if node.type in ("identifier", "field_expression") and not _is_name_part(node):
            atoms = indices.form(node).base_atoms()
            varying = atoms & THREAD_ATOMS or {a for a in atoms if is_loop_atom(a)}
            if varying or MEMORY in atoms:
                raise _refuse(
                    f"a staged value `{source.snippet(store.value, 60)}` that uses "
                    f"{source.text_of(node)} outside a load's index"
                )
            continue
        stack.extend(node.named_children)


class SlotRewriter:
    """The stored value as text the reading thread can evaluate for one slot."""

    def __init__(
        self,
        source: ParsedSource,
        function: Function,
        staging: Node,
        variable: str | None,
        slots: list[Slot],
    ) -> None:
        self.source = source
        self.function = function
        self.staging = staging
        self.variable = variable
        self.slots = slots
        self.locals = Locals(source, function)
        self.read: list[Node] = []
        self._uniform: dict[str, bool] = {}

    # -- text ------------------------------------------------------------------------------

    def value_at(self, value: Node, read_indices: list[Node]) -> tuple[str, int]:
        """The stored value for the slot a read at ``read_indices`` reads, with its
        precedence."""
        self.read = read_indices
        return self._expression(value)

    def _expression(self, node: Node) -> tuple[str, int]:
        top = self._replacement(node)
        if top is not None:
            return top

        def replace(current: Node) -> str | None:
            found = self._replacement(current) if current is not node else None
            return None if found is None else wrap_at(current, *found)

        return substitute(self.source, node, replace), precedence(node)

    def _replacement(self, node: Node) -> tuple[str, int] | None:
        """The text standing for ``node`` when it is not its own text."""
        source = self.source
        if node.type == "parenthesized_expression" and len(node.named_children) == 1:
            # `(threadIdx.y + i)` standing for one name needs no parentheses
            found = self._replacement(node.named_children[0])
            if found is not None and found[1] == PRIMARY:
                return found
        if node.type == "binary_expression":
            return self._without_loop_term(node)
        builtin = builtin_of(source, node) if node.type == "field_expression" else None
        if builtin is not None and builtin.startswith("threadIdx"):
            return self._thread(builtin)
        if node.type != "identifier" or _is_name_part(node):
            return None
        name = source.text_of(node)
        if self._is_loop_variable(node):
            slot = next((s for s in self.slots if s.loop_only), None)
            if slot is not None:
                return self._read_index(slot)
            return "0", PRIMARY
        return self._name(name, node)

    def _is_loop_variable(self, node: Node) -> bool:
        inside = self.staging.start_byte <= node.start_byte < self.staging.end_byte
        return inside and self.source.text_of(node) == self.variable

    def _without_loop_term(self, node: Node) -> tuple[str, int] | None:
        """``x + i * n`` -> ``x`` where ``i`` (the loop variable) stands for 0."""
        if any(s.loop_only for s in self.slots):
            return None
        operator = node.child_by_field_name("operator")
        sides = binary_operands(node, "+", "-")
        if sides is None or operator is None:
            return None
        left, right = sides
        if self._loop_term(right):
            kept = left
        elif operator.type == "+" and self._loop_term(left):
            kept = right
        else:
            return None
        text, strength = self._expression(kept)
        wrapped = wrap_at(kept, text, strength)
        return wrapped, PRIMARY if wrapped != text else strength

    def _loop_term(self, node: Node) -> bool:
        """``i``, ``i * n`` or ``n * i`` with ``i`` the loop variable (and only there)."""
        node = strip_parens(node)
        if node.type == "identifier":
            return self._is_loop_variable(node)
        factors = binary_operands(node, "*")
        if factors is None:
            return False
        left, right = (strip_parens(f) for f in factors)
        own = [f for f in (left, right) if f.type == "identifier" and self._is_loop_variable(f)]
        rest = [f for f in (left, right) if f not in own]
        return len(own) == 1 and not any(self._mentions_variable(f) for f in rest)

    def _mentions_variable(self, node: Node) -> bool:
        stack = [node]
        while stack:
            current = stack.pop()
            if current.type == "identifier" and self._is_loop_variable(current):
                return True
            stack.extend(current.named_children)
        return False

    def _thread(self, builtin: str) -> tuple[str, int]:
        position = next((k for k, s in enumerate(self.slots) if s.thread == builtin), None)
        if position is None or self.slots[position].loop_only:
            raise _refuse(f"a staged value that uses {builtin}, which no slot index names")
        return self._read_index(self.slots[position])

    def _read_index(self, slot: Slot) -> tuple[str, int]:
        index = self.read[self.slots.index(slot)]
        return self.source.text_of(index), precedence(index)

    def _name(self, name: str, node: Node) -> tuple[str, int] | None:
        """A kept name (None), the read's index for a thread-index local, or the definition
        that reaches ``node``."""
        locals_ = self.locals
        if name in locals_.params:
            if name in locals_.assigned or name in locals_.declared:
                raise _refuse(f"a staged value read through {name}, which the kernel writes")
            return None
        if name not in locals_.declared:
            return None  # a constant, a macro, a function
        component = locals_.thread_component(node)
        if component is not None:
            return self._thread(f"threadIdx.{component}")
        if self._keeps(name, node):
            return None
        definition = _reaching_definition(self.source, self.locals, name, node)
        if definition is None:
            raise _refuse(
                f"a staged value that uses {name}, which differs between threads or is written "
                "once the tile is staged, and has no one definition reaching the store"
            )
        return self._expression(definition)

    # -- uniform locals ---------------------------------------------------------------------

    def _keeps(self, name: str, use: Node) -> bool:
        """Whether a local may stay a name in the read: declared once in the kernel's body,
        the same for every thread of the block, and not written after ``use`` (so the read
        sees its value)."""
        declarations = self.locals.declared.get(name, [])
        if len(declarations) != 1 or declarations[0][0].parent != self.function.body:
            return False  # declared in a block, it may be out of scope at the read
        writes = _writes(self.source, self.function, name)
        if any(w.end_byte > use.start_byte for w in writes):
            return False
        return self._is_uniform(name)

    def _is_uniform(self, name: str) -> bool:
        if name not in self._uniform:
            self._uniform[name] = True  # a cycle (x = x + 1) adds no thread dependence
            self._uniform[name] = self._definitions_uniform(name)
        return self._uniform[name]

    def _definitions_uniform(self, name: str) -> bool:
        definitions = [v for _, v in self.locals.declared.get(name, []) if v is not None]
        for write in _writes(self.source, self.function, name):
            right = write.child_by_field_name("right")
            definitions.append(right if right is not None else write)
        return all(self._uniform_expression(d) and self._uniform_control(d) for d in definitions)

    def _uniform_expression(self, node: Node) -> bool:
        """Built from block indices, sizes, unwritten arguments, constants and uniform locals;
        nothing read from memory or returned by a call."""
        stack = [node]
        while stack:
            current = stack.pop()
            if current.type in ("subscript_expression", "call_expression", "pointer_expression"):
                return False
            name = name_of(self.source, current)
            if current.type == "field_expression":
                if name is None or name.split(".")[0] not in _UNIFORM_BUILTINS:
                    return False
                continue
            if current.type == "identifier" and name is not None and not _is_name_part(current):
                if name in self.locals.params and name in self.locals.assigned:
                    return False
                if name in self.locals.declared and not self._is_uniform(name):
                    return False
            stack.extend(current.named_children)
        return True

    def _uniform_control(self, node: Node) -> bool:
        """Whether every condition that decides whether ``node`` runs is uniform."""
        current = node.parent
        while current is not None and current != self.function.body:
            if current.type in ("if_statement", *_LOOPS):
                for part in ("condition", "initializer", "update"):
                    child = current.child_by_field_name(part)
                    if child is not None and not self._uniform_expression(child):
                        return False
            current = current.parent
        return True


def _is_name_part(node: Node) -> bool:
    """Whether an identifier names the function a call calls (not a value)."""
    parent = node.parent
    return (
        parent is not None
        and parent.type == "call_expression"
        and parent.child_by_field_name("function") == node
    )


def _writes(source: ParsedSource, function: Function, name: str) -> list[Node]:
    """The assignments and updates of a local."""
    assert function.body is not None
    found = []
    for node in source.iter_nodes(
        "assignment_expression", "update_expression", within=function.body
    ):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and source.text_of(strip_parens(target)) == name:
            found.append(node)
    return found


def _reaching_definition(
    source: ParsedSource, locals_: Locals, name: str, use: Node
) -> Node | None:
    """The value of the last definition of ``name`` before ``use`` (a declaration's
    initializer or a plain ``=``) when every path to ``use`` passes it and no loop around
    ``use`` writes ``name``; else None."""
    candidates: list[tuple[Node, Node | None]] = list(locals_.declared.get(name, []))
    writes = _writes(source, locals_.function, name)
    for write in writes:
        operator = write.child_by_field_name("operator")
        plain = (
            write.type == "assignment_expression" and operator is not None and operator.type == "="
        )
        candidates.append((write, write.child_by_field_name("right") if plain else None))
    before = [c for c in candidates if c[0].end_byte <= use.start_byte]
    if not before:
        return None
    where, value = max(before, key=lambda c: c[0].start_byte)
    if value is None or not _dominates(where, use):
        return None
    for write in writes:
        loop = _loop_around(write)
        if loop is not None and loop.start_byte <= use.start_byte < loop.end_byte:
            return None
    return value


def _loop_around(node: Node) -> Node | None:
    current = node.parent
    while current is not None and current.type != "function_definition":
        if current.type in _LOOPS:
            return current
        current = current.parent
    return None


def _dominates(definition: Node, use: Node) -> bool:
    """Whether the statement holding ``definition`` sits directly in a block (or a ``for``
    header) that holds ``use``: no branch lies between them."""
    statement = definition
    while statement.parent is not None and not (
        statement.type.endswith("statement") or statement.type == "declaration"
    ):
        statement = statement.parent
    block = statement.parent
    return (
        block is not None
        and block.type in ("compound_statement", "for_statement")
        and block.start_byte <= use.start_byte < block.end_byte
    )


def _reads(
    source: ParsedSource, function: Function, store: TileStore, staging: Node, barrier: Node
) -> list[tuple[Node, list[Node]]]:
    """The reads ``S[a][b]`` of the tile (with their indices) after the barrier;
    NotInForm for any other use."""
    assert function.body is not None
    reads = []
    for node in source.iter_nodes("identifier", within=function.body):
        if source.text_of(node) != store.tile:
            continue
        if staging.start_byte <= node.start_byte < staging.end_byte:
            continue
        parent = node.parent
        if parent is not None and parent.type in ("init_declarator", "array_declarator"):
            continue  # its declaration
        line = source.line_of(node.start_byte)
        outer = node
        while outer.parent is not None and outer.parent.type == "subscript_expression":
            if outer.parent.child_by_field_name("argument") != outer:
                break
            outer = outer.parent
        base, indices = _subscripts(outer)
        if base != node or len(indices) != len(store.indices):
            raise _refuse(
                f"{store.tile} used as `{source.snippet(outer, 50)}` (line {line}), not read "
                "element by element"
            )
        if is_written(outer):
            raise _refuse(f"{store.tile} written again at line {line}")
        if node.start_byte < barrier.end_byte:
            raise _refuse(f"{store.tile} read before the barrier (line {line})")
        reads.append((outer, indices))
    if not reads:
        raise _refuse(f"{store.tile} staged but never read")
    return reads


def _barrier(source: ParsedSource, function: Function, staging: Node) -> Node:
    """The one block barrier of the kernel, after the staging."""
    barriers = analysis(source).shared(function).barriers
    if len(barriers) != 1:
        raise _refuse(
            f"a tile staged once in a kernel with {len(barriers)} block barriers, not one"
        )
    if barriers[0].start_byte < staging.end_byte:
        raise _refuse("a tile staged after the kernel's barrier")
    return barriers[0]


def _barrier_statement(function: Function, barrier: Node) -> Node | None:
    statement = barrier.parent
    if statement is None or statement.type != "expression_statement":
        return None
    return statement if statement.parent == function.body else None


def tile_once_removal(source: ParsedSource, function: Function, staging: Node) -> list[Edit]:
    """The edits that remove a tile of several dimensions staged once by ``staging`` (a loop
    or one store); NotInForm when it is not in the form this rule reads (see the module
    docstring)."""
    indices = analysis(source).indices(function)
    variable = indices.loop_of(staging) if staging.type == "for_statement" else None
    if function.body is None or staging.parent != function.body:
        raise _refuse("a tile staged inside a branch or a loop")
    if staging.type == "for_statement" and (variable is None or variable.step is None):
        raise _refuse(f"a tile staged by `{source.snippet(staging, 60)}`, not a counted loop")
    stores = [_tile_store(source, s) for s in _staging_statements(staging)]
    if len({s.tile for s in stores}) != len(stores):
        raise _refuse("a staging loop storing one tile twice")
    barrier = _barrier(source, function, staging)
    loop_atom = variable.atom if variable is not None else None
    name = variable.name if variable is not None else None
    edits: list[Edit] = []
    removed: list[Node] = [staging]
    for store in stores:
        slots = _slots(source, indices, store, loop_atom)
        _check_loads(source, indices, store, slots, loop_atom)
        _check_outside_loads(source, indices, store)
        _check_tile_written_once(source, indices, store)
        rewriter = SlotRewriter(source, function, staging, name, slots)
        for read, read_indices in _reads(source, function, store, staging, barrier):
            text, strength = rewriter.value_at(store.value, read_indices)
            edits.append(Edit.replace(read, wrap_at(read, text, strength)))
            removed.append(read)
    edits.append(statement_deletion(source, staging))
    return edits + _deletions(source, function, stores, removed, barrier)


def _check_tile_written_once(
    source: ParsedSource, indices: FunctionIndices, store: TileStore
) -> None:
    for access in indices.accesses():
        if access.buffer.name != store.tile or access.direction == "load":
            continue
        inside = store.statement.start_byte <= access.node.start_byte < store.statement.end_byte
        if not inside:
            line = source.line_of(access.node.start_byte)
            raise _refuse(f"{store.tile} written again at line {line}")


def _deletions(
    source: ParsedSource,
    function: Function,
    stores: list[TileStore],
    removed: list[Node],
    barrier: Node,
) -> list[Edit]:
    """The declarations left unused, and the barrier when no shared memory is left (then
    what only the barrier used, a cooperative-groups handle, goes too)."""
    deletions = orphan_deletions(source, function, removed)
    deleted = [(e.start_byte, e.end_byte) for e in deletions]
    tiles = {s.tile for s in stores}
    statement = _barrier_statement(function, barrier)
    if statement is None or not no_shared_left(source, function, tiles, removed, deleted):
        return deletions
    # a member barrier's callee (`cta.sync`) names the group handle only the barrier used
    callee = barrier.child_by_field_name("function")
    gone = [*removed, statement, *([callee] if callee is not None else [])]
    return [statement_deletion(source, statement), *orphan_deletions(source, function, gone)]
