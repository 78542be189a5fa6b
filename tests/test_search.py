"""The one search loop (klineage.search) with a toy move source: states are strings, a move
appends a letter, and a stand-in log says which kernels pass. No gate, no nvcc."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from klineage.kernel import KernelSource
from klineage.search import Ending, SearchEnd, Tried, VerdictBudget, search

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


def _search(
    source: Letters, log: StandInLog, runs: int = 100, observers: Sequence[Recorder] = ()
) -> SearchEnd:
    budget = VerdictBudget(runs, wall_seconds=600.0)
    return search(None, KernelSource("s"), source, log, budget, observers)  # type: ignore[arg-type]


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
