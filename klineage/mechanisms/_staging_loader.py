"""Removing tiles a block stages through a loader loop, in a kernel or in the body it calls.

The form: a tile loop whose turn stages 2-D ``__shared__`` tiles between two barriers, each
tile written by one store ``S[i0][i1] = P[g];``, directly or in a loop that spreads the rows
over the block (``for (int r = threadIdx.y / 2; r < ROWS; r += STEP) { int c = ...; S[r][c] =
P[r * ld + k0 + c]; }``), then reads of the tiles::

    for (int k0 = 0; k0 < K; k0 += KT) {
      __syncthreads();
      <loader: stores into the tiles>
      __syncthreads();
      ... S[row][(kk + threadIdx.x) % KT] ...
    }

The global offset of each store is a sum over its subscripts: ``g = a0·i0 + a1·i1 + rest``
(``r * ld + k0 + c`` is ``ld·i0 + 1·i1 + k0``), where ``rest`` is the same for every thread
and every turn of the loader (the index analysis checks it). A read ``S[r0][r1]`` then reads
``P[rest + a0·r0 + a1·r1]``: the element the store put at that slot. That holds for every slot
the loader covers, and a correct kernel reads only those; the gate checks the result.

A second offset the tile loop's header steps (``for (int a = a0, b = b0; a < a_end; a +=
a_step, b += b_step)``, tiles declared in the turn) is in the analysis its start plus the
loop's advance; ``rest`` names it again (``B[b + ld * k + tx]``).

The removal rewrites every read, deletes the loader, the tiles and, when the function has no
shared memory left, the tile loop's barriers. Refused, with the form found: a store whose
value is not one global read, an offset that is not such a sum, a tile used outside the
reads, a name of the offset assigned again in the function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.analysis.indices import BLOCK_ATOMS, MEMORY, FunctionIndices, is_loop_atom
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    declared_names,
    identifier_names,
    one_line,
    statements,
    strip_parens,
)
from klineage.mechanisms._staging import (
    SYNC,
    is_write_target,
    outer_subscript,
    shared_arrays,
    subscript_chain,
)
from klineage.mechanisms._staging_once import orphan_deletions
from klineage.mechanisms._staging_vector_copy import VectorCopy, vector_copy
from klineage.mechanisms._tiles_util import is_call_statement

NEEDED = (
    "a tile loop whose turn stores 2-D shared tiles `S[i0][i1] = P[g]` (directly or in a loop "
    "spreading the rows over the block) between two barriers, g a sum of the subscripts "
    "scaled plus a part the same for every thread, and reads of the tiles after them"
)
_LOOP_SUFFIX = re.compile(r"@\d+$")
_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass
class _Tile:
    """One staged tile and how a slot maps back to global memory."""

    name: str
    declaration: Node
    store: Node
    """The store's expression statement."""
    target: Node
    """The slot the store writes (``S[i0][i1]``; the first lane of a vector copy)."""
    value: Node
    """The global element it reads (``P[g]``)."""
    pointer: str
    scales: tuple[IndexForm, IndexForm]
    rest: IndexForm
    element: str
    reads: list[Node]
    by_name: frozenset[str] = frozenset()
    """Variables the tile loop's header steps, which ``rest`` holds as themselves."""
    more: list[Node] = field(default_factory=list)
    """The slots of the tile's other stores (a tile two vector copies a thread fill)."""


def loader_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """The edits that read global memory where the tiles a loader loop staged were read."""
    body = loop.child_by_field_name("body")
    if loop.type != "for_statement" or body is None or body.type != "compound_statement":
        raise NotInForm("a tile loop that is not a for loop with a braced body", NEEDED)
    items = statements(body)
    barriers = [s for s in items if is_call_statement(source, s, SYNC)]
    loader, compute = _split(source, items)
    indices = analysis(source).indices(function)
    shared = shared_arrays(source, function)
    _check_loader_locals(source, [s for s in loader if s not in shared.values()], compute)
    tiles = [
        _tile(source, function, indices, shared, store, loop)
        for store in _stores(source, loader, shared)
    ]
    if not tiles:
        raise NotInForm("a tile loop whose loader stores no 2-D shared tile", NEEDED)
    for tile in tiles:
        _check_unchanged(source, function, loop, tile)
    tiles = _merged(source, tiles)
    for tile in tiles:
        _collect_reads(source, function, tile, compute)
    edits: list[Edit] = []
    written: set[str] = set()
    for tile in tiles:
        for read in tile.reads:
            text = _global_read(source, tile, read)
            written |= set(_NAME.findall(text))
            edits.append(Edit.replace(read, text))
        edits.append(source.deletion(tile.declaration, whole_line=True, comment=True))
    declared = {t.declaration.start_byte for t in tiles}
    kept = [s for s in loader if s.start_byte not in declared]
    if any(s.type == "declaration" and s in shared.values() for s in kept):
        raise NotInForm("a turn that declares a shared array its loader does not store", NEEDED)
    edits += [source.deletion(s, whole_line=True, comment=True) for s in kept]
    if set(shared) <= {t.name for t in tiles} and not _dynamic_shared(source, function):
        edits += [source.deletion(b, whole_line=True) for b in barriers]
    gone = [*kept, *(t.declaration for t in tiles)]
    return edits + _unused_offsets(source, function, gone, written, edits)


def _unused_offsets(
    source: ParsedSource, function: Function, gone: list[Node], written: set[str], edits: list[Edit]
) -> list[Edit]:
    """Deletions of the function's locals only the loader used (the slots' row and column of
    the thread), keeping any the rewritten reads name and any another edit already deletes."""
    assert function.body is not None
    taken = {e.start_byte for e in edits} | {g.start_byte for g in gone}
    found = []
    top = statements(function.body)
    for edit in orphan_deletions(source, function, gone):
        statement = next((s for s in top if edit.start_byte <= s.start_byte < edit.end_byte), None)
        if statement is None or {statement.start_byte, edit.start_byte} & taken:
            continue
        if declared_names(source, statement) & written:
            continue
        found.append(source.deletion(statement, whole_line=True, comment=True))
    return found


def _split(source: ParsedSource, items: list[Node]) -> tuple[list[Node], list[Node]]:
    """(loader statements, compute statements) of a turn: ``[sync] loader sync compute
    [sync]``."""
    start = 1 if items and is_call_statement(source, items[0], SYNC) else 0
    barrier = next(
        (i for i in range(start, len(items)) if is_call_statement(source, items[i], SYNC)), None
    )
    if barrier is None or barrier == start:
        raise NotInForm("a tile loop without a barrier between its loader and its reads", NEEDED)
    compute = items[barrier + 1 :]
    if compute and is_call_statement(source, compute[-1], SYNC):
        compute = compute[:-1]
    if any(is_call_statement(source, s, SYNC) for s in compute) or not compute:
        raise NotInForm("a tile loop with more than one staging phase a turn", NEEDED)
    return items[start:barrier], compute


def _stores(source: ParsedSource, loader: list[Node], shared: dict[str, Node]) -> list[Node]:
    """The store statements of the loader: each statement is a store or a loop whose body
    holds only declarations and stores into the shared tiles."""
    found: list[Node] = []
    for statement in loader:
        if statement.type == "declaration":
            continue  # a tile declared in the turn goes with it; a local, with the loader
        if statement.type == "for_statement":
            inner = statements(statement.child_by_field_name("body"))
            for s in inner:
                if s.type == "declaration":
                    continue
                if not _is_shared_store(source, s, shared):
                    raise NotInForm(
                        f"a loader loop holding `{one_line(source, s, 70)}` (line "
                        f"{source.line_of(s.start_byte)}) besides its stores",
                        NEEDED,
                    )
                found.append(s)
        elif _is_shared_store(source, statement, shared):
            found.append(statement)
        else:
            raise NotInForm(
                f"a turn that also runs `{one_line(source, statement, 70)}` (line "
                f"{source.line_of(statement.start_byte)}) before its barrier",
                NEEDED,
            )
    return found


def _merged(source: ParsedSource, tiles: list[_Tile]) -> list[_Tile]:
    """One tile per name: stores into the same tile (each thread copying two vectors of it)
    must map their slots to global memory the same way."""
    by_name: dict[str, _Tile] = {}
    for tile in tiles:
        first = by_name.setdefault(tile.name, tile)
        if first is tile:
            continue
        forms = zip((first.rest, *first.scales), (tile.rest, *tile.scales), strict=True)
        if first.pointer != tile.pointer or any((a - b).terms for a, b in forms):
            raise NotInForm(
                f"stores into {tile.name} at lines {source.line_of(first.store.start_byte)} and "
                f"{source.line_of(tile.store.start_byte)} whose slots map to global memory in "
                "different ways",
                NEEDED,
            )
        first.more.append(tile.target)
    return list(by_name.values())


def _check_loader_locals(source: ParsedSource, loader: list[Node], compute: list[Node]) -> None:
    """The locals the loader declares (the offsets of its stores; its tiles are not given)
    go with it: the reads after the barrier must not use them."""
    declared = {n for s in loader if s.type == "declaration" for n in declared_names(source, s)}
    used = {n for s in compute for n in identifier_names(source, s)} & declared
    if used:
        raise NotInForm(
            f"a loader whose local {', '.join(sorted(used))} the reads after the barrier use",
            NEEDED,
        )


def _is_shared_store(source: ParsedSource, statement: Node, shared: dict[str, Node]) -> bool:
    copy = vector_copy(source, statement)
    if copy is not None:
        chain = subscript_chain(copy.target)
        return chain is not None and source.text_of(chain[0]) in shared
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    assignment = statement.named_children[0]
    if assignment.type != "assignment_expression" or source.text_of(
        assignment.child_by_field_name("operator") or assignment
    ) not in ("=",):
        return False
    left = assignment.child_by_field_name("left")
    chain = None if left is None else subscript_chain(left)
    return chain is not None and source.text_of(chain[0]) in shared


def _tile(
    source: ParsedSource,
    function: Function,
    indices: FunctionIndices,
    shared: dict[str, Node],
    store: Node,
    loop: Node,
) -> _Tile:
    copy = vector_copy(source, store)
    if copy is not None:
        left, right = copy.target, copy.value
    else:
        assignment = store.named_children[0]
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
    assert left is not None and right is not None  # a shared store, checked by the caller
    chain = subscript_chain(left)
    assert chain is not None
    name = source.text_of(chain[0])
    value = strip_parens(right)
    read = subscript_chain(value)
    if len(chain[1]) != 2 or read is None or len(read[1]) != 1:
        raise NotInForm(
            f"a store into {name} of `{one_line(source, right, 70)}`, not one global element "
            "`P[g]` into a 2-D tile",
            NEEDED,
        )
    pointer = source.text_of(read[0])
    if read[0].type != "identifier" or pointer in shared:
        raise NotInForm(f"a store into {name} that reads {pointer}", NEEDED)
    subscripts = [indices.form(i) for i in chain[1]]
    offset = indices.form(read[1][0])
    scales = _scales(indices, subscripts, offset)
    if scales is None:
        raise NotInForm(
            f"a store into {name} whose global offset `{one_line(source, read[1][0], 70)}` is "
            "not its subscripts scaled plus a part the same for every thread",
            NEEDED,
        )
    rest = offset - scales[0] * subscripts[0] - scales[1] * subscripts[1]
    rest, by_name = _carried_names(source, indices, loop, rest)
    if _varies(indices, rest, loop) or any(_varies(indices, s, loop) for s in scales):
        raise NotInForm(
            f"a store into {name} whose global offset `{one_line(source, read[1][0], 70)}` has a "
            "part that differs between threads or turns of the loader",
            NEEDED,
        )
    declaration = shared[name]
    element = source.text_of(declaration.child_by_field_name("type") or declaration)
    if copy is not None:
        _check_lanes(source, function, copy, pointer, element, scales[1])
    return _Tile(name, declaration, store, left, value, pointer, scales, rest, element, [], by_name)


def _check_lanes(
    source: ParsedSource,
    function: Function,
    copy: VectorCopy,
    pointer: str,
    element: str,
    inner_scale: IndexForm,
) -> None:
    """A vector copy is a copy per lane, ``S[i0][i1 + e] = P[g + e]``, read back as the scalar
    store when both arrays hold one element type and ``g`` steps by one where ``i1`` does."""
    vectors = analysis(source).vectors
    pointee = source.local_types(function).get(pointer, "").replace("*", " ")
    if vectors.resolve(pointee) != vectors.resolve(element):
        raise NotInForm(
            f"a {copy.vector} copy into a tile of {element} from {pointer}, a pointer to "
            f"{pointee.strip() or 'an unknown type'}: its lanes are not the tile's elements",
            NEEDED,
        )
    if inner_scale.value != 1:
        raise NotInForm(
            f"a {copy.vector} copy whose global offset steps by {_render(inner_scale)} where "
            "the tile's inner subscript steps by one: its lanes are not contiguous in both",
            NEEDED,
        )


def _scales(
    indices: FunctionIndices, subscripts: list[IndexForm], offset: IndexForm
) -> tuple[IndexForm, IndexForm] | None:
    """The factors ``a0, a1`` with ``offset - a0·i0 - a1·i1`` free of what makes the
    subscripts differ between stores (thread and loop atoms): each subscript's pivot is such
    an atom with a constant coefficient that the other subscript does not hold."""
    found: list[IndexForm] = []
    for k, subscript in enumerate(subscripts):
        other = subscripts[1 - k]
        scale = None
        for atom in sorted(subscript.atoms()):
            if not _position(indices, atom) or other.depends_on(atom):
                continue
            step = subscript.coefficient(atom).value
            if step is None or step == 0:
                continue
            scale = offset.coefficient(atom).exact_division(step)
            if scale is not None:
                break
        if scale is None:
            return None
        found.append(scale)
    return found[0], found[1]


def _position(indices: FunctionIndices, atom: str) -> bool:
    form = IndexForm.atom(atom)
    return bool(indices.thread_atoms(form)) or is_loop_atom(atom) or atom.startswith("[")


def _varies(indices: FunctionIndices, form: IndexForm, loop: Node) -> bool:
    """Whether a form may differ between the threads or between turns of the loader, or
    names what is out of scope at the reads: thread atoms, variables of loops inside the tile
    loop (the loader's), opaque parts, memory."""
    for atom in form.atoms():
        if form.is_opaque(atom) or atom == MEMORY or indices.thread_atoms(IndexForm.atom(atom)):
            return True
        variable = indices.loop(atom) if is_loop_atom(atom) else None
        if variable is not None and variable.loop != loop and within(variable.loop, loop):
            return True
    return False


def _check_unchanged(source: ParsedSource, function: Function, loop: Node, tile: _Tile) -> None:
    """The names a read's offset is written with keep one value in the whole function: the
    offset is rendered from the index analysis, which resolves a local to its definition, so
    a name assigned again (a parameter moved before the loop) would be read with another value
    at the read. Variables the tile loop's header steps change only between turns: its own
    and those rendered by name (`_carried_names`); the pointer changes only outside the loop."""
    assert function.body is not None
    update = loop.child_by_field_name("update")
    header = source.loop_at(loop)
    stepped = assigned_names(source, update) if update is not None else set()
    stepped -= {header.variable} if header is not None and header.variable else set()
    written = _written_outside(source, function.body, update)
    names = {n for n in identifier_names(source, tile.value) if n != tile.pointer}
    names |= {
        _LOOP_SUFFIX.sub("", a)
        for f in (tile.rest, *tile.scales)
        for a in f.atoms()
        if a not in BLOCK_ATOMS and not a.startswith("[")
    }
    names -= _loader_names(source, tile.store)
    changed = {n for n in names if n in written}
    changed |= {n for n in names & stepped if n not in tile.by_name}
    if tile.pointer in assigned_names(source, loop):
        changed.add(tile.pointer)
    if changed:
        raise NotInForm(
            f"a tile {tile.name} whose offset reads {', '.join(sorted(changed))}, "
            "assigned again in the function",
            NEEDED + ", with names assigned only where they are declared",
        )


def _written_outside(source: ParsedSource, body: Node, update: Node | None) -> set[str]:
    """Names assigned in ``body`` outside the tile loop's update clause."""
    written: set[str] = set()
    for node in source.iter_nodes("assignment_expression", "update_expression", within=body):
        if update is not None and within(node, update):
            continue
        written |= assigned_names(source, node)
    return written


def _carried_names(
    source: ParsedSource, indices: FunctionIndices, loop: Node, rest: IndexForm
) -> tuple[IndexForm, frozenset[str]]:
    """``rest`` with each variable the tile loop's header steps (``b`` of ``for (int a = ..,
    b = b0; ..; a += s, b += t)``), which the analysis writes as its start plus an opaque
    advance, written as the variable itself; and those names."""
    update = loop.child_by_field_name("update")
    initializer = loop.child_by_field_name("initializer")
    if update is None or initializer is None:
        return rest, frozenset()
    line = source.line_of(loop.start_byte)
    named: set[str] = set()
    for name in sorted(assigned_names(source, update)):
        advance = f"[{name} advanced@{line}]"
        if rest.coefficient(advance).value != 1:
            continue
        start = _initial_value(source, indices, initializer, name)
        if start is None:
            continue
        rest = rest - IndexForm.atom(advance) - start + IndexForm.atom(name)
        named.add(name)
    return rest, frozenset(named)


def _initial_value(
    source: ParsedSource, indices: FunctionIndices, initializer: Node, name: str
) -> IndexForm | None:
    for declarator in source.iter_nodes("init_declarator", within=initializer):
        target = declarator.child_by_field_name("declarator")
        value = declarator.child_by_field_name("value")
        if target is not None and value is not None and source.text_of(target) == name:
            return indices.form(value)
    return None


def _loader_names(source: ParsedSource, store: Node) -> set[str]:
    """The loader loop's variable and the locals its body declares: the store's positions."""
    names: set[str] = set()
    current = store.parent
    while current is not None and current.type != "for_statement":
        current = current.parent
    if current is None:
        return names
    header = source.loop_at(current)
    if header is not None and header.variable:
        names.add(header.variable)
    body = current.child_by_field_name("body")
    for declaration in statements(body):
        if declaration.type == "declaration":
            for declarator in declaration.children_by_field_name("declarator"):
                name = declarator.child_by_field_name("declarator") or declarator
                names.add(source.text_of(name))
    return names


def _collect_reads(
    source: ParsedSource, function: Function, tile: _Tile, compute: list[Node]
) -> None:
    assert function.body is not None
    stores = [tile.target, *tile.more]
    for node in source.iter_nodes("identifier", within=function.body):
        if source.text_of(node) != tile.name or node.parent is None:
            continue
        if node.parent.type == "array_declarator" or any(within(node, s) for s in stores):
            continue
        outer = outer_subscript(node)
        chain = subscript_chain(outer)
        inside = any(within(node, s) for s in compute)
        if chain is None or len(chain[1]) != 2 or not inside or is_write_target(outer):
            raise NotInForm(
                f"a tile {tile.name} used at line {source.line_of(node.start_byte)} other than "
                "read in full after the barrier",
                NEEDED,
            )
        tile.reads.append(outer)
    if not tile.reads:
        raise NotInForm(f"a tile {tile.name} stored but never read", NEEDED)


def _global_read(source: ParsedSource, tile: _Tile, read: Node) -> str:
    chain = subscript_chain(read)
    assert chain is not None
    terms = [_render(tile.rest)] if tile.rest.terms else []
    for scale, index in zip(tile.scales, chain[1], strict=True):
        text = f"({source.text_of(index)})"
        rendered = _render(scale)
        terms.append(text if rendered == "1" else f"({rendered}) * {text}")
    return f"{tile.pointer}[{' + '.join(terms) or '0'}]"


def _render(form: IndexForm) -> str:
    """C text of a form whose atoms are names in scope (loop atoms lose their ``@line``)."""
    parts = []
    for monomial, coefficient in sorted(form.terms):
        names = [_LOOP_SUFFIX.sub("", a) for a in monomial]
        factors = ([str(coefficient)] if coefficient != 1 or not names else []) + names
        parts.append(" * ".join(factors))
    return " + ".join(parts).replace("+ -", "- ") or "0"


def _dynamic_shared(source: ParsedSource, function: Function) -> bool:
    body = function.body
    return body is not None and any(
        d.is_extern and body.start_byte <= d.node.start_byte < body.end_byte
        for d in source.shared_declarations
    )
