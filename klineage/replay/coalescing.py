"""Which of two rival layouts a target's loads favor, so replay races the likelier first.

A warp or block per row and a split over blocks each give a thread's reduction loop to
several threads, and each rewrites away the other's sites, so replay gates both from the same
state and keeps the faster (:meth:`klineage.replay.methods.SkillsMethod.siblings`). Which one
goes first decides when the search reaches the winner's speed, not which one wins. The
target's loads predict it:

- where a thread's loop walks its own contiguous run (``x[row * cols + c]``: stride 1 along
  the loop, ``cols`` from one thread to the next), a warp's loads are scattered, and giving
  consecutive iterations to consecutive lanes (``lanes``) makes them contiguous;
- where the loads of one iteration are already contiguous across the threads
  (``x[r * cols + col]``: stride 1 from one thread to the next, ``cols`` along the loop),
  lanes would scatter them again, and splitting the loop over blocks (``blocks``) keeps them.

Loads that every thread makes at the same address (a vector all rows share) say nothing.
Where the loads disagree, or none is read this way, the retrieval's order stands.

The same loads say when staging through shared memory is what a kernel needs
(:func:`calls_for_staging`), which the gain its expert measured cannot say: a tile staged
once where it is read many times (a GEMM's operands) or a transposed read made coalesced.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TypeVar

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.indices import Access, LoopVariable
from klineage.kernel import KernelSource
from klineage.mechanisms import UnknownMechanism, get

__all__ = ["calls_for_staging", "loop_spread", "spread_first", "stage_first"]

T = TypeVar("T")
LANES, BLOCKS = "lanes", "blocks"
REUSED, STRIDED = "reused", "strided"


def _loads_and_loops(kernel: KernelSource) -> Iterator[tuple[list[Access], list[LoopVariable]]]:
    """Per kernel function, its global loads and the loops that are not grid-stride loops (a
    grid-stride loop hands out elements, it reduces nothing)."""
    source = kernel.parsed
    for function in source.kernels:
        indices = analysis(source).indices(function)
        loads = [
            a for a in indices.accesses() if a.direction == "load" and a.buffer.space == "global"
        ]
        loops = [
            loop
            for loop in indices.loops
            if loop.step is not None and not any(a.startswith("gridDim") for a in loop.step.atoms())
        ]
        yield loads, loops


def loop_spread(kernel: KernelSource) -> str | None:
    """``lanes`` or ``blocks``: what the global loads in the kernels' loops favor; None when
    they disagree or say nothing."""
    votes: set[str] = set()
    for loads, loops in _loads_and_loops(kernel):
        for loop in loops:
            for access in loads:
                if not loop.loop.start_byte <= access.node.start_byte < loop.loop.end_byte:
                    continue
                along = access.offset.coefficient(loop.atom)
                across = access.offset.coefficient("threadIdx.x")
                if not along.terms or not across.terms:
                    continue  # not walked by the loop, or the same address in every thread
                if across.value == 1 and along.value != 1:
                    votes.add(BLOCKS)
                elif along.value == 1 and across.value != 1:
                    votes.add(LANES)
    return votes.pop() if len(votes) == 1 else None


def _spread(name: str) -> str | None:
    try:
        return get(name).spreads_loop
    except UnknownMechanism:
        return None


def spread_first(
    ordered: Sequence[T],
    mechanism_of: Callable[[T], str],
    closed: dict[str, set[str]],
    kernel: KernelSource,
) -> list[T]:
    """``ordered`` with rival layouts (mechanisms spreading a loop that close each other's
    sites) in the order ``kernel``'s loads favor: the favored ones take the first of the
    rivals' places, in their own order, the others the places after; everything else keeps
    its place."""
    favored = loop_spread(kernel)
    if favored is None:
        return list(ordered)

    def rival(name: str) -> bool:
        spread = _spread(name)
        return spread is not None and any(
            _spread(other) not in (None, spread) and name in closed.get(other, set())
            for other in closed.get(name, set())
        )

    places = [i for i, item in enumerate(ordered) if rival(mechanism_of(item))]
    items = [ordered[i] for i in places]
    items.sort(key=lambda item: _spread(mechanism_of(item)) != favored)  # stable
    result = list(ordered)
    for place, item in zip(places, items, strict=True):
        result[place] = item
    return result


def _walks(access: Access, loop: LoopVariable) -> bool:
    return loop.loop.start_byte <= access.node.start_byte < loop.loop.end_byte and bool(
        access.offset.coefficient(loop.atom).terms
    )


def calls_for_staging(kernel: KernelSource) -> str | None:
    """``reused`` where one loop of a kernel walks a load every lane of a warp makes at the
    same address beside a load consecutive lanes make contiguous (an outer product: each
    element is read by a row or a column of threads), ``strided`` where a load outside any
    loop steps by more than one element from one lane to the next (a transposed read); None
    where neither (the retrieval's order stands)."""
    for loads, loops in _loads_and_loops(kernel):
        walked: set[int] = set()
        for loop in loops:
            inside = [a for a in loads if _walks(a, loop)]
            walked.update(id(a) for a in inside)
            lanes = [a.offset.coefficient("threadIdx.x") for a in inside]
            if any(not c.terms for c in lanes) and any(c.value == 1 for c in lanes):
                return REUSED
        for access in loads:
            across = access.offset.coefficient("threadIdx.x")
            if id(access) not in walked and across.terms and across.value not in (1, -1):
                return STRIDED
    return None


def _stages(name: str) -> bool:
    try:
        return get(name).stages_loads
    except UnknownMechanism:
        return False


def stage_first(
    ordered: Sequence[T],
    mechanism_of: Callable[[T], str],
    kernel: KernelSource,
    held_back: Collection[str] = (),
) -> list[T]:
    """``ordered`` with the mechanisms that stage loads in shared memory first, in their own
    order, where ``kernel``'s loads call for it (:func:`calls_for_staging`); else as given.
    A mechanism in ``held_back`` (nothing to relieve on the target) keeps its place."""
    if calls_for_staging(kernel) is None:
        return list(ordered)

    def later(item: T) -> bool:
        name = mechanism_of(item)
        return not _stages(name) or name in held_back

    return sorted(ordered, key=later)  # stable
