"""The one search loop (klineage.search) with a toy move source: states are strings, a move
appends a letter, and a stand-in log says which kernels pass. No gate, no nvcc. Greedy and a
beam over the same source."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from klineage.kernel import KernelSource
from klineage.search import Beam, Ending, SearchEnd, Tried, VerdictBudget, search

Step = Tried[str, str]


@dataclass
class StandInLog:
    """Answers `run` with whether the kernel's text is one of `good` (no GPU)."""

    good: set[str]
    asked: list[tuple[str, str]] = field(default_factory=list)

    def run(self, problem: Any, kernel: KernelSource, *, against: KernelSource) -> bool:
        self.asked.append((against.text, kernel.text))
        return kernel.text in self.good


@dataclass
class Letters:
    """Offers `offers[state]` at each state; a move starting with '-' is refused (no run);
    with `first_keep`, stops offering after the first accepted move (as replay does)."""

    offers: dict[str, list[str]]
    first_keep: bool = False
    pulled: list[str] = field(default_factory=list)
    chosen: list[str] = field(default_factory=list)

    def moves(self, step: int, state: KernelSource, tried: Sequence[Step]) -> Iterator[str]:
        for move in self.offers.get(state.text, []):
            self.pulled.append(state.text + move)
            before = len(tried)
            yield move
            if self.first_keep and len(tried) > before and tried[-1].accepted:
                return

    def realize(self, state: KernelSource, move: str) -> tuple[str, KernelSource] | None:
        return None if move.startswith("-") else (move, KernelSource(state.text + move))

    def accepts(self, verdict: Any) -> bool:
        return bool(verdict)

    def gated(self, step: int, state: KernelSource, tried: Step) -> str:
        return f"{step}:{tried.child.text}"

    def choose(self, state: KernelSource, accepted: Sequence[Step]) -> Step:
        return max(accepted, key=lambda one: one.move)

    def settled(self, step: int, state: KernelSource, tried: Sequence[Step], chosen: Step) -> None:
        self.chosen.append(chosen.record or "")

    def nothing_to_try(self, state: KernelSource) -> Ending:
        return Ending.COMPLETE


@dataclass
class Recorder:
    events: list[str] = field(default_factory=list)

    def on_state(self, step: int, state: KernelSource) -> None:
        self.events.append(f"state {step} {state.text}")

    def on_end(self, step: int, state: KernelSource, ending: Ending) -> None:
        self.events.append(f"end {step} {state.text} {ending.value}")


@dataclass
class Scored(Letters):
    """Letters a beam can search: a kernel's value is `scores[text]` (the greedy choice is the
    highest too); every accepted move is a branch of its own."""

    scores: dict[str, float] = field(default_factory=dict)
    went_on: list[str] = field(default_factory=list)

    def choose(self, state: KernelSource, accepted: Sequence[Step]) -> Step:
        return max(accepted, key=lambda one: self.scores[one.child.text])

    def branches(self, state: KernelSource, accepted: Sequence[Step]) -> list[Step]:
        return list(accepted)

    def value(self, state: KernelSource, child: Step) -> float:
        return self.scores[child.child.text]

    def settled(self, step: int, state: KernelSource, tried: Sequence[Step], chosen: Step) -> None:
        self.settled_several(step, state, tried, [chosen])

    def settled_several(
        self, step: int, state: KernelSource, tried: Sequence[Step], chosen: Sequence[Step]
    ) -> None:
        self.went_on += [one.child.text for one in chosen]


def _search(
    source: Letters,
    log: StandInLog,
    runs: int = 100,
    observers: Sequence[Recorder] = (),
    width: int | None = None,
) -> SearchEnd:
    budget = VerdictBudget(runs, wall_seconds=600.0)
    frontier: Beam[str, str] | None = None
    if width is not None:
        assert isinstance(source, Scored)
        frontier = Beam(source, width)
    return search(None, KernelSource("s"), source, log, budget, observers, frontier)  # type: ignore[arg-type]


def test_it_goes_on_from_the_chosen_move_until_nothing_is_offered() -> None:
    source = Letters({"s": ["a", "b"], "sb": ["c"]})
    log = StandInLog(good={"sa", "sb", "sbc"})
    recorder = Recorder()
    end = _search(source, log, observers=[recorder])
    assert (end.state.text, end.steps, end.ending) == ("sbc", 2, Ending.COMPLETE)
    assert source.chosen == ["0:sb", "1:sbc"]  # the source's choice, with its own record
    assert recorder.events == ["state 0 s", "state 1 sb", "state 2 sbc", "end 2 sbc complete"]


def test_no_accepted_move_is_stuck() -> None:
    end = _search(Letters({"s": ["a", "b"]}), StandInLog(good=set()))
    assert (end.state.text, end.steps, end.ending) == ("s", 0, Ending.STUCK)


def test_a_refused_move_costs_no_gate_run() -> None:
    log = StandInLog(good={"sb"})
    end = _search(Letters({"s": ["-a", "b"]}), log, runs=1)
    assert log.asked == [("s", "sb")]
    assert end.state.text == "sb" and end.ending is Ending.BUDGET  # its one run went to `b`


def test_the_budget_stops_it_and_later_moves_are_still_pulled_but_not_gated() -> None:
    source = Letters({"s": ["a", "b", "c"]})
    log = StandInLog(good={"sc"})
    end = _search(source, log, runs=2)
    assert [child for _, child in log.asked] == ["sa", "sb"]
    assert source.pulled == ["sa", "sb", "sc"]  # what a source records for free still happens
    assert (end.state.text, end.ending) == ("s", Ending.BUDGET)


def test_a_source_may_stop_offering_after_its_first_keep() -> None:
    source = Letters({"s": ["a", "b", "c"]}, first_keep=True)
    log = StandInLog(good={"sa", "sb"})
    end = _search(source, log)
    assert [child for _, child in log.asked] == ["sa"]
    assert end.state.text == "sa" and end.ending is Ending.COMPLETE


# greedy keeps `sa` (the best first move) and is stuck there; `sb` leads on to `sbc`, faster
DEAD_END = {"s": ["a", "b"], "sa": ["x", "y"], "sb": ["c"], "sbc": ["d"]}
DEAD_END_GOOD = {"sa", "sb", "sbc"}
DEAD_END_SCORES = {"sa": 2.0, "sb": 1.5, "sbc": 3.0}


def test_greedy_stops_at_the_dead_end() -> None:
    source = Scored(DEAD_END, scores=DEAD_END_SCORES)
    end = _search(source, StandInLog(good=DEAD_END_GOOD))
    assert (end.state.text, end.steps, end.ending) == ("sa", 1, Ending.STUCK)


def test_a_beam_goes_on_from_a_second_kept_move_past_the_dead_end() -> None:
    source = Scored(DEAD_END, scores=DEAD_END_SCORES)
    log = StandInLog(good=DEAD_END_GOOD)
    recorder = Recorder()
    end = _search(source, log, width=2, observers=[recorder])
    assert (end.state.text, end.steps, end.ending) == ("sbc", 2, Ending.STUCK)
    assert [child for _, child in log.asked] == ["sa", "sb", "sax", "say", "sbc", "sbcd"]
    assert source.went_on == ["sa", "sb", "sbc"]
    assert recorder.events[:3] == ["state 0 s", "state 1 sa", "state 1 sb"]
    assert recorder.events[-1] == "end 2 sbc stuck"


def test_a_beam_ends_at_the_best_state_any_level_held() -> None:
    # `sbc` beats its parent but not `sa`, which a level before held
    scores = {**DEAD_END_SCORES, "sbc": 1.8}
    end = _search(Scored(DEAD_END, scores=scores), StandInLog(good=DEAD_END_GOOD), width=2)
    assert (end.state.text, end.steps) == ("sa", 1)


def test_a_beam_holds_only_its_width_of_the_best_children() -> None:
    offers = {"s": ["a", "b", "c"], "sa": ["x"], "sb": ["x"], "sc": ["x"]}
    scores = {"sa": 1.2, "sb": 1.5, "sc": 1.4, "sax": 2.0, "sbx": 2.0, "scx": 2.0}
    source = Scored(offers, scores=scores)
    log = StandInLog(good=set(scores))
    _search(source, log, width=2)
    assert source.went_on[:2] == ["sb", "sc"]  # `sa` outranked: never expanded
    assert ("sa", "sax") not in log.asked


@pytest.mark.parametrize("first_keep", [True, False])
def test_a_beam_of_width_one_makes_greedys_runs(first_keep: bool) -> None:
    offers = {"s": ["a", "b", "c"], "sb": ["a", "d"], "sba": ["e"], "sc": ["d"]}
    scores = {"sa": 1.1, "sb": 1.3, "sc": 1.2, "sba": 1.4, "sbd": 1.5, "scd": 1.3}
    runs = []
    for width in (None, 1):
        source = Scored(offers, first_keep=first_keep, scores=scores)
        log = StandInLog(good=set(scores))
        end = _search(source, log, width=width)
        runs.append((log.asked, source.went_on, end))
    assert runs[0] == runs[1]
    assert runs[0][0]  # something was gated


@pytest.mark.parametrize("runs", [1, 2, 3, 5])
def test_a_beam_spends_no_more_than_the_budget(runs: int) -> None:
    source = Scored(DEAD_END, scores=DEAD_END_SCORES)
    log = StandInLog(good=DEAD_END_GOOD)
    end = _search(source, log, runs=runs, width=3)
    assert len(log.asked) == runs
    assert end.ending is Ending.BUDGET


def test_a_beam_has_a_width() -> None:
    with pytest.raises(ValueError, match="at least one state"):
        Beam(Scored({}), 0)
