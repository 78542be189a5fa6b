"""The one search loop: from a start state, gate moves, keep one, go on from it.

Mining walks an expert kernel backward with it (a move removes a mechanism:
:mod:`klineage.mining.walk`); replay walks a naive kernel forward (a move applies a skill, a
catalog rule or a remembered edit: :mod:`klineage.replay.methods`). What differs between them
is a :class:`MoveSource`, a small strategy object; the loop owns the current state, the gate
call, the budget and the reason it stopped.

At each state the loop pulls the source's moves one at a time (the source is a generator and
may look at what was gated so far: replay stops offering after the first keep, mining offers
single sites once removing a mechanism everywhere was rejected), asks the source to write each
move's kernel, gates it against the current state, and hands the verdict back. When the moves
run out, the source chooses among the accepted ones, and the loop goes on from there. A move
offered after the budget is spent is passed over without a gate run; the source still sees it
(so what it records for free, a refusal or a no-op, is recorded as before).

Which states the loop expands is a :class:`Frontier`'s choice. :class:`Greedy` (the default)
goes on from the one move the source chooses. :class:`Beam` expands a level of states, each
from the same budget, and goes on from the `width` best children of the whole level (the
source, a :class:`BranchingSource`, names one child per distinct kept change at each state and
values them); it ends at the best state any level held. A beam of width 1 walks greedy's path.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, Protocol, TypeVar

from klineage.gate.log import GateLog
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem

M = TypeVar("M")
"""What a move source offers (a removal, a skill application, ...)."""
R = TypeVar("R")
"""What a move source makes of a gated move (a lineage edge, a run record, ...)."""


class Ending(str, Enum):
    """Why a search stopped."""

    COMPLETE = "complete"
    """Nothing was left to try."""
    BUDGET = "budget"
    """The budget of gate runs or wall time ran out."""
    STUCK = "stuck"
    """Moves were tried and none was accepted (or the source says it is stuck)."""


class Budget(ABC):
    """How many gate runs and how much wall time a search may spend, counted from its start."""

    def __init__(self, gate_runs: int, wall_seconds: float) -> None:
        self.gate_runs = gate_runs
        self.wall_seconds = wall_seconds
        self.started = time.monotonic()

    @abstractmethod
    def used(self) -> int:
        """Gate runs spent so far."""

    def charge(self) -> None:  # noqa: B027 (a budget that counts runs elsewhere needs nothing)
        """Count one verdict the loop asked for."""

    def left(self) -> int:
        """Gate runs still allowed (0 or less: none)."""
        return self.gate_runs - self.used()

    def elapsed(self) -> float:
        """Seconds since the search started."""
        return time.monotonic() - self.started

    def spent(self) -> bool:
        """Whether the runs or the wall time are used up."""
        return self.left() <= 0 or self.elapsed() >= self.wall_seconds


class GateRunBudget(Budget):
    """Counts the gate runs made through a log: a verdict the log already held is free.
    Mining's budget (a resumed walk spends only what it has not run before)."""

    def __init__(self, log: GateLog, gate_runs: int, wall_seconds: float) -> None:
        super().__init__(gate_runs, wall_seconds)
        self.log = log
        self.at_start = log.runs

    def used(self) -> int:
        return self.log.runs - self.at_start


class VerdictBudget(Budget):
    """Counts every verdict the loop asks for, whether the log served it or not. Replay's
    budget: methods compared at the same budget must pay the same for the same question."""

    def __init__(self, gate_runs: int, wall_seconds: float) -> None:
        super().__init__(gate_runs, wall_seconds)
        self.count = 0

    def charge(self) -> None:
        self.count += 1

    def used(self) -> int:
        return self.count


@dataclass
class Tried(Generic[M, R]):
    """A move the loop gated at a state."""

    move: M
    """The move, as the source wrote it."""
    child: KernelSource
    """The kernel the move gave."""
    verdict: GateVerdict
    """The gate's verdict on `child`, timed against the state it came from."""
    accepted: bool
    """Whether the source accepts the verdict (correct; for replay also faster)."""
    record: R | None = None
    """What the source made of it (its lineage edge, its run record)."""


class MoveSource(Protocol[M, R]):
    """A search strategy: what to try from a state, and what to keep."""

    def moves(self, step: int, state: KernelSource, tried: Sequence[Tried[M, R]]) -> Iterator[M]:
        """The moves to try from `state`, reached after `step` moves, best first. `tried` grows
        as the loop gates them."""
        ...

    def realize(self, state: KernelSource, move: M) -> tuple[M, KernelSource] | None:
        """The move's kernel (and the move as it was realized); None when it costs no gate
        run: refused, already tried, no change to the machine code."""
        ...

    def accepts(self, verdict: GateVerdict) -> bool:
        """Whether a verdict makes its move a candidate for the next state."""
        ...

    def gated(self, step: int, state: KernelSource, tried: Tried[M, R]) -> R | None:
        """Record a gated move; the result is kept as `tried.record`."""
        ...

    def choose(self, state: KernelSource, accepted: Sequence[Tried[M, R]]) -> Tried[M, R]:
        """The accepted move to go on from."""
        ...

    def settled(
        self,
        step: int,
        state: KernelSource,
        tried: Sequence[Tried[M, R]],
        chosen: Tried[M, R],
    ) -> None:
        """Record the choice made at `state`."""
        ...

    def nothing_to_try(self, state: KernelSource) -> Ending:
        """Why the search ends at a state where no move was offered."""
        ...


class SearchObserver(Protocol):
    """Progress of a search, for live displays."""

    def on_state(self, step: int, state: KernelSource) -> None:
        """The search is at `state` after `step` moves."""
        ...

    def on_end(self, step: int, state: KernelSource, ending: Ending) -> None:
        """The search stopped at `state`."""
        ...


@dataclass(frozen=True)
class SearchEnd:
    """Where a search stopped, and why."""

    state: KernelSource
    """The best state reached (greedy: the last, every step was a kept move)."""
    steps: int
    """Moves taken from the start to `state`."""
    ending: Ending


@dataclass
class Expansion(Generic[M, R]):
    """A state of one level, expanded: the moves the loop gated there."""

    state: KernelSource
    tried: list[Tried[M, R]]
    """Every move gated at `state`, in order."""
    offered: bool
    """Whether the source offered any move (gated or not)."""

    @property
    def accepted(self) -> list[Tried[M, R]]:
        """The gated moves the source accepts."""
        return [one for one in self.tried if one.accepted]


class Frontier(Protocol[M, R]):
    """Which states the loop expands next: from one level's expanded states, the kept moves
    whose children form the next level."""

    def go_on(self, step: int, level: Sequence[Expansion[M, R]]) -> list[Tried[M, R]]:
        """The accepted moves to go on from, best first (at least one: the level accepted
        some); the choice at every expanded state is settled with the source here."""
        ...

    def improves(self, state: KernelSource, best: KernelSource) -> bool:
        """Whether `state`, the first of a new level, is better than the best state so far."""
        ...


class Greedy(Generic[M, R]):
    """One state a level: the source's own choice among the accepted moves."""

    def __init__(self, source: MoveSource[M, R]) -> None:
        self.source = source

    def go_on(self, step: int, level: Sequence[Expansion[M, R]]) -> list[Tried[M, R]]:
        """The source's choice at the one expanded state, settled with it."""
        [expanded] = level
        chosen = self.source.choose(expanded.state, expanded.accepted)
        self.source.settled(step, expanded.state, expanded.tried, chosen)
        return [chosen]

    def improves(self, state: KernelSource, best: KernelSource) -> bool:
        """Always: every step is a kept move, so the latest state is the best."""
        return True


class BranchingSource(MoveSource[M, R], Protocol):
    """A move source a beam can search: several children of a state, and their values."""

    def branches(self, state: KernelSource, accepted: Sequence[Tried[M, R]]) -> list[Tried[M, R]]:
        """The accepted moves worth going on from at `state`: one per distinct change (the
        source's choice among its variants), in the order they were gated."""
        ...

    def value(self, state: KernelSource, child: Tried[M, R]) -> float:
        """How good the kernel `child` (a move from `state`) is; the beam keeps the highest."""
        ...

    def settled_several(
        self,
        step: int,
        state: KernelSource,
        tried: Sequence[Tried[M, R]],
        chosen: Sequence[Tried[M, R]],
    ) -> None:
        """Record the choices made at `state`: the search goes on from `chosen` (maybe none:
        the beam held better states)."""
        ...


class Beam(Generic[M, R]):
    """A level of up to `width` states: the best children of the last level, by the source's
    value (a kernel reached twice in a level is held once)."""

    def __init__(self, source: BranchingSource[M, R], width: int) -> None:
        if width < 1:
            raise ValueError(f"a beam holds at least one state, not {width}")
        self.source = source
        self.width = width
        self.values: dict[str, float] = {}
        """The value of every state a level held, by fingerprint."""

    def go_on(self, step: int, level: Sequence[Expansion[M, R]]) -> list[Tried[M, R]]:
        """The `width` highest-valued distinct children of the whole level; each expanded
        state's choices are settled with the source."""
        offers = [(one, self.source.branches(one.state, one.accepted)) for one in level]
        valued = [
            (self.source.value(one.state, child), child)
            for one, children in offers
            for child in children
        ]
        valued.sort(key=lambda pair: -pair[0])  # stable: a tie keeps the order gated
        held: list[Tried[M, R]] = []
        for value, child in valued:
            if len(held) == self.width:
                break
            if all(child.child.fingerprint != other.child.fingerprint for other in held):
                held.append(child)
                self.values[child.child.fingerprint] = value
        for one, children in offers:
            chosen = [child for child in children if any(child is other for other in held)]
            self.source.settled_several(step, one.state, one.tried, chosen)
        return held

    def improves(self, state: KernelSource, best: KernelSource) -> bool:
        """Whether `state` is valued above `best` (every kept child beats the start)."""
        if best.fingerprint not in self.values:  # the start: every kept child beats it
            return True
        return self.values[state.fingerprint] > self.values[best.fingerprint]


def search(
    problem: Problem,
    start: KernelSource,
    source: MoveSource[M, R],
    log: GateLog,
    budget: Budget,
    observers: Sequence[SearchObserver] = (),
    frontier: Frontier[M, R] | None = None,
) -> SearchEnd:
    """Search from `start` (already gated by the caller) with the moves `source` offers, every
    verdict through `log`, until no move is offered, none is accepted, or `budget` is spent.
    `frontier` picks the states to expand (default: :class:`Greedy`); the search ends at the
    best state it reached."""
    policy: Frontier[M, R] = frontier if frontier is not None else Greedy(source)
    level, step = [start], 0
    best, best_step = start, 0
    while True:
        expanded: list[Expansion[M, R]] = []
        ran_out = False
        for state in level:
            if expanded and budget.spent():  # a beam's later states wait for no run
                ran_out = True
                break
            for observer in observers:
                observer.on_state(step, state)
            one, out = _expand(problem, step, state, source, log, budget)
            expanded.append(one)
            ran_out = ran_out or out
        if not any(one.offered for one in expanded):
            ending = source.nothing_to_try(expanded[-1].state)
            break
        if not any(one.accepted for one in expanded):
            ending = Ending.BUDGET if ran_out else Ending.STUCK
            break
        level, step = [one.child for one in policy.go_on(step, expanded)], step + 1
        if policy.improves(level[0], best):
            best, best_step = level[0], step
        if ran_out or budget.spent():
            ending = Ending.BUDGET
            break
    for observer in observers:
        observer.on_end(best_step, best, ending)
    return SearchEnd(best, best_step, ending)


def _expand(
    problem: Problem,
    step: int,
    state: KernelSource,
    source: MoveSource[M, R],
    log: GateLog,
    budget: Budget,
) -> tuple[Expansion[M, R], bool]:
    """Gate the moves `source` offers at `state`; also whether one was offered after the
    budget was spent."""
    tried: list[Tried[M, R]] = []
    offered = ran_out = False
    for move in source.moves(step, state, tried):
        offered = True
        if ran_out or budget.spent():
            ran_out = True
            continue
        realized = source.realize(state, move)
        if realized is None:
            continue
        written, child = realized
        verdict = log.run(problem, child, against=state)
        budget.charge()
        one: Tried[M, R] = Tried(written, child, verdict, source.accepts(verdict))
        tried.append(one)
        one.record = source.gated(step, state, one)
    return Expansion(state, tried, offered), ran_out
