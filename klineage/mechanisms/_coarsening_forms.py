"""Thread coarsening recognized by what the indices do.

A thread (or a block) handles several elements when an access's offset advances with a
counted loop ``k < K`` by ``c`` while the thread's (or block's) own index is scaled by ``K *
c``: the thread's elements are its own chunk of ``K`` (register tiling, ``threadRow * TM +
resIdxM``; rows per block, ``T - 1 - 4 * blockIdx.x - to``; elements per thread, ``blockIdx.x *
blockSize * N + iter * blockSize``). Without a loop, the same holds for ``n`` loads of one
buffer at offsets ``d`` apart in one grid-stride loop whose start advances by ``n * d`` per
block (``x[i]`` and ``x[i + blockSize]`` with ``i = blockIdx.x * blockSize * 2 + tid``).

The canonical rewrite (:mod:`klineage.mechanisms.thread_coarsening`) takes a one-thread-per-
element kernel coarsened in its own form; these sites are refused with the form they are in.
"""

from __future__ import annotations

from klineage.cuda.analysis import Access, FunctionIndices, IndexForm, LoopVariable, analysis
from klineage.cuda.analysis.indices import BLOCK_ATOMS, THREAD_ATOMS, is_loop_atom
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import call_arguments
from klineage.mechanisms._forms import FoundForm

__all__ = ["coarsening_forms"]

_CANONICAL = (
    "the canonical form of coarsening: `i_first = blockIdx.x * blockDim.x * K + threadIdx.x` and "
    "`for (i_step < K) { i = i_first + i_step * blockDim.x; ... }` over one-element code"
)


def _owner(atom: str) -> str | None:
    """``thread``, ``warp`` or ``block`` for an atom that identifies one, else None."""
    if atom in BLOCK_ATOMS:
        return "block"
    if atom == "warp":
        return "warp"
    return "thread" if atom in THREAD_ATOMS else None


def _owners(indices: FunctionIndices, offset: IndexForm) -> dict[str, str]:
    """Atoms of ``offset`` that are a thread's or a block's index -> which."""
    found = {}
    deps = dict(offset.opaque)
    for atom in offset.atoms():
        owner = _owner(atom)
        if owner is None and atom in deps:
            base = deps[atom]
            if base & BLOCK_ATOMS and not base & THREAD_ATOMS:
                owner = "block"
            elif base & THREAD_ATOMS and not any(is_loop_atom(a) for a in base):
                owner = "thread"
        if owner is not None:
            found[atom] = owner
    return found


def _trip(indices: FunctionIndices, access: Access, loop: LoopVariable) -> IndexForm | None:
    """``bound - init`` of a loop, in the terms of ``indices``' function (a helper's loop
    through the call's binding)."""
    assert loop.bound is not None
    source = indices.source
    owner = source.enclosing_function(loop.loop)
    if owner is None:
        return None
    if owner.node == indices.function.node:
        return indices.form(loop.bound) - loop.init
    helper = analysis(source).indices(owner)
    values = analysis(source).binding(indices, owner, access.node, call_arguments(access.node))
    return (helper.form(loop.bound) - loop.init).substitute(values)


def _compile_time(indices: FunctionIndices, form: IndexForm) -> bool:
    """Whether a trip count is fixed when the kernel is compiled (a constant or template
    arguments), not a problem size: a thread walking a whole row is not coarsening."""
    templates = set(indices.function.template_params)
    return all(atom in templates for atom in form.base_atoms())


def _chunk(indices: FunctionIndices, access: Access, loop: LoopVariable) -> str | None:
    """Who owns a chunk of ``loop``'s trip in ``access``: ``thread`` or ``block``."""
    if loop.bound is None or not loop.counted:
        return None
    step = access.offset.coefficient(loop.atom)
    if not step.terms or not indices.is_uniform(step):
        return None
    trip = _trip(indices, access, loop)
    if trip is None or not _compile_time(indices, trip):
        return None
    if loop.step is not None and loop.step.value not in (None, 1):
        exact = trip.exact_division(loop.step.value or 1)
        if exact is None:
            return None
        trip = exact
    if trip.value is not None and trip.value < 2:
        return None
    for atom, owner in _owners(indices, access.offset).items():
        if access.direction == "load" and access.offset.is_opaque(atom):
            continue  # a load by a derived index (`weight[(i % C) * K + j]`) may be shared
        if access.offset.coefficient(atom) == trip * step:
            return owner
    return None


def _expanded(indices: FunctionIndices, offset: IndexForm) -> IndexForm:
    """``offset`` with grid-stride loop variables replaced by their start."""
    values = {}
    for atom in offset.atoms():
        variable = indices.loop(atom) if is_loop_atom(atom) else None
        if variable is not None and not variable.counted:
            values[atom] = variable.init
    return offset.substitute(values) if values else offset


def unrolled_pairs(indices: FunctionIndices, accesses: list[Access]) -> list[tuple[Access, int]]:
    """Loads ``x[o]``, ``x[o + d]``... in one loop whose start advances by ``n * d`` per block:
    the first with ``n``."""
    found = []
    by_buffer: dict[str, list[Access]] = {}
    for access in accesses:
        if access.direction == "load" and access.buffer.space == "global":
            by_buffer.setdefault(access.buffer.name, []).append(access)
    for group in by_buffer.values():
        offsets = {str(a.offset): a for a in group}
        for base in group:
            for other in group:
                delta = other.offset - base.offset
                if not delta.terms or not indices.is_uniform(delta) or delta.constant_term < 0:
                    continue
                count = 1
                while str(base.offset + delta * count) in offsets:
                    count += 1
                start = _expanded(indices, base.offset)
                if count > 1 and start.coefficient("blockIdx.x") == delta * count:
                    found.append((base, count))
    return found


def enclosing(node: Node, function: Function, kinds: tuple[str, ...]) -> Node | None:
    current = node.parent
    while current is not None and current != function.body:
        if current.type in kinds:
            return current
        current = current.parent
    return None


def coarsening_forms(source: ParsedSource, skip: list[tuple[int, int]]) -> list[FoundForm]:
    """Coarsened accesses of device code outside the byte ranges in ``skip`` (sites the
    mechanism reports already), one site per loop."""
    found: list[FoundForm] = []
    seen: set[int] = set()

    def add(node: Node, function: Function, form: str, kind: str = "") -> None:
        if node.start_byte in seen or any(s <= node.start_byte < e for s, e in skip):
            return
        seen.add(node.start_byte)
        found.append(FoundForm(node, function, form, _CANONICAL, kind))

    for function in source.kernels:
        indices = analysis(source).indices(function)
        accesses = [
            a for a in indices.accesses() if a.buffer.space == "global" and a.direction != "address"
        ]
        for access in accesses:
            for atom in sorted(access.offset.atoms()):
                variable = indices.loop(atom) if is_loop_atom(atom) else None
                owner = _chunk(indices, access, variable) if variable is not None else None
                if owner is None or variable is None:
                    continue
                where = f" in {access.helper}" if access.helper else ""
                bound = source.text_of(variable.bound) if variable.bound is not None else "?"
                step = access.offset.coefficient(atom)
                spacing = "consecutive elements" if step.value == 1 else f"elements {step} apart"
                form = (
                    f"each {owner} handling {bound} {spacing} of {access.buffer.name} through "
                    f"the loop over {variable.name}{where}"
                )
                node = variable.loop if access.helper is None else access.node
                # a block's chunk read by a counted loop: the multi-pass removal may take it
                chunk = (
                    owner == "block"
                    and access.helper is None
                    and variable.loop.type == ("for_statement")
                )
                add(node, function, form, "chunk" if chunk else "")
        for access, count in unrolled_pairs(indices, accesses):
            loop = enclosing(access.node, function, ("for_statement", "while_statement"))
            form = (
                f"each thread reading {count} elements of {access.buffer.name} per iteration, "
                "written out one by one"
            )
            add(loop if loop is not None else access.node, function, form, "pairs")
    return found
