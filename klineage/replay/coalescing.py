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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from klineage.cuda.analysis import analysis
from klineage.kernel import KernelSource
from klineage.mechanisms import UnknownMechanism, get

__all__ = ["loop_spread", "spread_first"]

T = TypeVar("T")
LANES, BLOCKS = "lanes", "blocks"


def loop_spread(kernel: KernelSource) -> str | None:
    """``lanes`` or ``blocks``: what the global loads in the kernels' loops favor; None when
    they disagree or say nothing."""
    source = kernel.parsed
    votes: set[str] = set()
    for function in source.kernels:
        indices = analysis(source).indices(function)
        loads = [
            a for a in indices.accesses() if a.direction == "load" and a.buffer.space == "global"
        ]
        for loop in indices.loops:
            if loop.step is None or any(a.startswith("gridDim") for a in loop.step.atoms()):
                continue  # a grid-stride loop hands out elements, it reduces nothing
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
