"""Shared-memory staging in the forms public kernels write it.

The canonical form (:mod:`klineage.mechanisms._staging`) is a tile loop that stores a global
value into a ``__shared__`` array and holds ``__syncthreads()``. The shared-memory model of
the analysis layer (:class:`klineage.cuda.analysis.SharedMemory`) sees staging however it is
spelled: stores made by a helper that receives the shared arrays as parameters
(``loadFromGmem(..., As, Bs, ...)``), stores through a pointer cast from ``extern __shared__
char buf[]`` (``reinterpret_cast<x128*>(buf)[i] = load128(w + i)``), barriers written with
cooperative groups (``cg::sync(cta)``, ``block.sync()``), copies issued by ``cp.async`` or TMA
(inline, through a macro, or through a wrapper).

A staging site is the loop around the barrier that the copies happen in (a tile loop), or,
for a tile staged once, the statement that makes the copies (the kernel then waits at a
barrier and reads the tile). Each is reported with the form it is in and refused: removing it
means replacing every read of the tile by the global expression that filled it, which the
canonical rule does only for its own form, and :mod:`klineage.mechanisms._staging_once` for a
tile staged once by a loop of its own stores (marked ``kind="once"``; a tile of several
dimensions, as a transpose stages it, by :mod:`klineage.mechanisms._staging_tile`), and
:mod:`klineage.mechanisms._staging_helper` for a tile loop whose tiles a helper stages
(``kind="helper"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klineage.cuda.analysis import Access, analysis
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._forms import FoundForm
from klineage.mechanisms._staging_vector_copy import vector_view

__all__ = ["staging_forms"]

_LOOPS = ("for_statement", "while_statement", "do_statement")
_CANONICAL = (
    "the canonical staged tile loop: `S[..] = G[..]` stores in the kernel, `__syncthreads()` "
    "in the loop, and reads `S[..]` that a global expression can replace"
)


def _loop_around(node: Node, function: Function, barriers: list[Node]) -> Node | None:
    """The innermost loop around ``node`` that also holds a block barrier."""
    current = node.parent
    while current is not None and current != function.body:
        if current.type in _LOOPS and any(
            current.start_byte <= b.start_byte < current.end_byte for b in barriers
        ):
            return current
        current = current.parent
    return None


def _top_statement(node: Node, function: Function) -> Node:
    """The statement of the function body that holds ``node``."""
    current = node
    while current.parent is not None and current.parent != function.body:
        current = current.parent
    return current


def _through_alias(source: ParsedSource, store: Access) -> str:
    """How a store of the function's own reaches its shared buffer through another name: a
    vector view of a tile element (``FLOAT4(S[i][j]) = ...``), a pointer cast from a dynamic
    buffer, or another pointer cast; "" when it names the buffer."""
    if store.helper is not None:
        return ""
    text = source.text_of(store.node).lstrip("(*& ")
    name = store.buffer.name
    if text.startswith(name.split(".")[0]) or text.startswith(name.split("(")[0]):
        return ""
    if vector_view(source, store.node) is not None:
        return "stored through a vector view of its elements (a 16- or 8-byte cast)"
    dynamic = any(d.is_extern and name in d.names for d in source.shared_declarations)
    return (
        "stored through a pointer cast from a dynamic shared buffer"
        if dynamic
        else "stored through a pointer cast"
    )


@dataclass
class _Place:
    """Where copies of one kernel gather: a tile loop, or a statement staging a tile once."""

    node: Node
    in_loop: bool
    helpers: set[str] = field(default_factory=set)
    """Helpers that make the stores."""
    aliased: set[str] = field(default_factory=set)
    """How stores reach the buffer through a cast pointer, when some do."""
    asynchronous: set[str] = field(default_factory=set)
    """How asynchronous copies are issued (a macro, a wrapper, ``memcpy_async``)."""

    def merge(self, other: _Place) -> None:
        self.helpers |= other.helpers
        self.aliased |= other.aliased
        self.asynchronous |= other.asynchronous

    def describe(self) -> str:
        where = (
            "a tile loop with block barriers"
            if self.in_loop
            else "tiles staged once, then a barrier"
        )
        parts = []
        if self.helpers:
            names = ", ".join(sorted(self.helpers))
            parts.append(
                f"stored by the helper {names}, which gets the shared arrays as parameters"
            )
        parts += sorted(self.aliased)
        if self.asynchronous:
            parts.append(f"copied asynchronously ({', '.join(sorted(self.asynchronous))})")
        return f"{where}, the tile {'; '.join(parts) or 'stored directly'}"


def _scratch(source: ParsedSource, function: Function) -> set[str]:
    """Shared buffers the kernel updates in place (a tree reduction's `sdata[tid] +=
    sdata[tid + s]`: a compound assignment, or a store of a value read from the same buffer):
    scratch a computation works in, not a tile staged for reading."""
    shared = analysis(source).shared(function)
    loads = [a for a in shared.accesses if a.direction == "load"]
    found = set()
    for store in shared.accesses:
        if store.direction in ("load", "address") or store.helper is not None:
            continue
        assignment = store.node.parent
        while assignment is not None and assignment.type == "parenthesized_expression":
            assignment = assignment.parent
        if assignment is None or assignment.type != "assignment_expression":
            continue
        operator = assignment.child_by_field_name("operator")
        value = assignment.child_by_field_name("right")
        compound = operator is not None and operator.type != "="
        reads_itself = value is not None and any(
            load.buffer.name == store.buffer.name
            and value.start_byte <= load.node.start_byte < value.end_byte
            for load in loads
        )
        if compound or reads_itself:
            found.add(store.buffer.name)
    return found


def _places(source: ParsedSource, function: Function) -> list[_Place]:
    shared = analysis(source).shared(function)
    barriers = shared.barriers
    scratch = _scratch(source, function)
    copies: list[tuple[Node, _Place]] = []
    for copy in shared.copies:
        if (
            copy.store.buffer.name in scratch
            and _loop_around(copy.store.node, function, barriers) is None
        ):
            continue  # a value put into a reduction's scratch once, not a tile to read
        helpers = {copy.store.helper} if copy.store.helper is not None else set()
        alias = _through_alias(source, copy.store)
        aliased = {alias} if alias else set()
        copies.append((copy.store.node, _Place(copy.store.node, False, helpers, aliased)))
    for site in shared.async_copies:
        copies.append((site.node, _Place(site.node, False, asynchronous={site.name})))
    for call in shared.async_calls:
        copies.append((call, _Place(call, False, asynchronous={"memcpy_async"})))
    places: dict[int, _Place] = {}
    once: _Place | None = None
    for node, found in sorted(copies, key=lambda item: item[0].start_byte):
        loop = _loop_around(node, function, barriers)
        if loop is None and not any(b.start_byte > node.start_byte for b in barriers):
            continue  # no barrier after the copy: nothing waits for the tile
        if loop is None:  # tiles staged once (a pipeline's prologue too): one site, the first
            if once is None:
                once = _Place(_top_statement(node, function), False)
                places[once.node.start_byte] = once
            once.merge(found)
            continue
        place = places.setdefault(loop.start_byte, _Place(loop, True))
        place.merge(found)
    return [places[k] for k in sorted(places)]


def staging_forms(source: ParsedSource, skip: set[int]) -> list[FoundForm]:
    """Every staging site of the kernels not already reported (loop starts in ``skip``)."""
    found: list[FoundForm] = []
    for function in analysis(source).block_functions:
        if function.body is None or not analysis(source).shared(function).barriers:
            continue
        places = _places(source, function)
        body = function.body
        loops = any(p.in_loop for p in places) or any(
            body.start_byte <= start < body.end_byte for start in skip
        )
        for place in places:
            if place.node.start_byte in skip:
                continue
            if not place.in_loop and place.asynchronous and loops:
                continue  # a pipeline's prologue: part of the tile loop's staging
            skip.add(place.node.start_byte)
            once = not place.in_loop and not place.helpers and not place.asynchronous
            by_helper = place.in_loop and place.helpers and not place.asynchronous
            kind = "once" if once else "helper" if by_helper and not place.aliased else ""
            found.append(FoundForm(place.node, function, place.describe(), _CANONICAL, kind))
    return found
