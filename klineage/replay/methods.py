"""The three replay methods: move sources of the one search loop (:mod:`klineage.search`).

Three methods share the same gate, the same budget and the same keep rule (correct on every
workload, and faster than the current state overall and in every trial, timed interleaved):

- `skills`: retrieved skills in rank order (conditions checked before any gate run; a
  measured gain counts as often as its mechanism gained on the library's other experts), the
  skills whose candidate sites another's rewrite would close moved just before it
  (:mod:`klineage.replay.ordering`), and a mechanism whose latest evidence on the way is a
  failure (at the nearest earlier state where it was gated, rejected or measurably slower)
  moved after the rest,
  each mechanism applied at every candidate site with the carrier its evidence supports (a
  vector width keeps its bytes on the target's element size); when one carrier passes the
  keep rule, the skill's other carriers, and the rule's default choice for the target, are
  gated from the same state and the fastest is kept (the others are recorded as `outranked`;
  a carrier that writes a kernel already gated there costs no run);
- `blind`: every catalog mechanism at every candidate site, one site per run, no conditions,
  no ordering beyond the catalog's;
- `memory`: past before/after edits (the skills' anchors) retrieved by text similarity to the
  current kernel and applied without conditions.

A fourth, `tree`, is the `skills` method's moves under a beam search (:class:`TreeMethod`):
at each state of a level it gates skills until `beam_width` of them are kept (each with its
carriers), and the `beam_width` fastest children of the whole level, by speedup over the start,
form the next level; it ends at the fastest state any level held. Same budget, keep rule and
gate log as the others; with a width of 1 it makes the `skills` method's runs.

Every gate run is recorded, in a forward lineage of the same format as mining's, and counted
against the budget, whether or not the log served it from an earlier method's run. Each method
is a small class over :class:`ForwardSearch`, which holds what the three share: the keep rule,
writing a move's kernel (building ahead, skipping no-ops), and the records.

With an LLM provider (`Materializer(..., llm=provider)`), the `skills` method asks it to apply
a retrieved skill when no rule can: the rule application was refused at every carrier, or the
skill's mechanism is not in the catalog (one an LLM proposed while mining). The model gets the
skill's card (SKILL.md) and the current kernel (:func:`klineage.llm.materialize_skill`); its
kernel is gated like any move, from the same budget, and recorded with the origin
`llm:<kind>:<model>:skill:<id>`. An answer that cannot be used goes to the result's
`llm_rejections` and costs no gate run.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from klineage.gate.log import GateLog, VerdictMissing
from klineage.gate.noop import same_machine_code
from klineage.gate.profile import Profile
from klineage.gate.result import GateVerdict
from klineage.gate.sass import MachineCode
from klineage.kernel import KernelSource
from klineage.limits import DEFAULT_ARCH, RUN_MESSAGE_KEPT
from klineage.lineage import (
    LLM_PREFIX,
    Attempt,
    AttemptStatus,
    LineageGraph,
    LlmRejection,
    catalog_mechanism,
    llm_rejection,
    state_info,
)
from klineage.llm.base import Provider, ProviderError
from klineage.llm.proposals import Rejection, materialize_skill
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, Refusal, all_mechanisms
from klineage.mining.removal import apply_everywhere
from klineage.problem import Problem
from klineage.replay.coalescing import spread_first, stage_first
from klineage.replay.dispatch import DispatchRefused, best_split, write_dispatch
from klineage.replay.ordering import (
    closes,
    keep_options_open,
    transfer_carrier,
    without_foreign_names,
)
from klineage.replay.register_cap import lift_register_cap
from klineage.replay.results import (
    GateRunRecord,
    MethodResult,
    ReplayBudget,
    SkillUse,
    method_result,
    verdict_seconds,
)
from klineage.replay.retrieve import bm25_scores, retrieve
from klineage.search import Beam, Ending, Frontier, Tried, VerdictBudget, search
from klineage.skills import Skill, render_skill_md

FAILED, IDLE, GAINED = "failed", "idle", "gained"
"""What a mechanism's runs at a state came to: every one rejected or measurably slower; none
kept, some within noise; one kept."""
NO_CHANGE = "no machine code change (the same SASS and host code as the current state)"
SAME_AS_GATED = "the same SASS and host code as a kernel already gated from this state"
"""A move whose verdict is known: timing it would time a binary this state's runs timed."""
METHODS = ("skills", "blind", "memory")
"""The experiment's methods: the skills, greedily, and the two baselines."""
TREE = "tree"
"""The skills method under a beam search (:class:`TreeMethod`), run on request."""
PROFILED = "profiled"
"""The skills method ranking by the current state's bottleneck (:class:`ProfiledMethod`),
run on request beside the greedy skills method, which then ranks without profiles."""
ALL_METHODS = (*METHODS, TREE, PROFILED)
BEAM_WIDTH = 2
"""The tree method's default beam width: two states a level, two kept skills a state."""
KEEP_RATIO = 1.01
"""A change is kept when current/new latency exceeds this overall, and exceeds 1 per trial."""
CARRIERS_FIRST = 2
"""Gate runs a mechanism's skills get at a state, none kept, before its other carriers wait
for every later move. In the audited replay (chunks 1-10), `launch_bounds` took 65 of the
skills method's 244 gate runs, four to six carriers at each state, and was kept 3 times: its
first carrier passed once (a sibling then measured faster), its second once, its third once."""

SLOWER = 0.98
"""A run whose ratio falls below this measured the move slower than its state, past timing
noise. Only such a run (or a rejected one) counts against the move at the next states: on
l2_normalize's warp-per-row state, `__restrict__` measured 1.006 (not kept, within noise) and,
one state later, after fast math, 1.233."""

MoveKey = tuple[str, str, str, str | None]
"""A move at a state: (state fingerprint, mechanism or 'llm:<skill>', carrier JSON, site)."""


@dataclass(frozen=True)
class Move:
    """One thing a method can try: a mechanism, where, with which choices, and why."""

    mechanism: Mechanism | None
    """The catalog's rule to apply; None when there is none (an LLM applies the skill)."""
    carrier: Carrier
    origin: str
    site: str | None = None
    """Apply at this one candidate site (blind); None applies at every candidate."""
    skill: str | None = None
    """The skill behind the move (the `skills` method)."""
    action: str = ""
    """The mechanism's name, when `mechanism` is None."""
    ask_llm: bool = False
    """Ask the LLM to apply `skill`, if no rule application of it went through here."""
    source: KernelSource | None = None
    """The new kernel, already written (the LLM's answer)."""
    intent: str = ""
    """What the LLM says it changed, or what replay wrote beside the rule's rewrite (a launch
    bound's register cap lifted)."""
    sibling: bool = False
    """Gated at the state where a move was just kept, the fastest of them kept: another
    carrier of the kept skill, or a rival mechanism whose sites and the kept one's close each
    other's."""
    default: bool = False
    """The rule's own choices for the target (no learned carrier): preferred among kept
    carriers within timing noise of the fastest (:meth:`ForwardSearch.choose`)."""
    combines: tuple[str, ...] = ()
    """Skills whose kernels this move's kernel holds besides its own skill's (a dispatch's
    two rivals), listed before it among the skills used."""

    @property
    def name(self) -> str:
        """The mechanism applied."""
        return self.mechanism.name if self.mechanism is not None else self.action


def move_key(current: KernelSource, move: Move) -> MoveKey:
    """What makes a move the same move at the same state (it is tried once)."""
    return (
        current.fingerprint,
        f"llm:{move.skill}" if move.ask_llm else move.name,
        move.carrier.model_dump_json(),
        move.site,
    )


def keeps(verdict: GateVerdict) -> bool:
    """The keep rule: correct, faster overall by KEEP_RATIO and faster in every trial."""
    comparison = verdict.comparison
    return bool(
        verdict.passed
        and comparison is not None
        and comparison.ratio > KEEP_RATIO
        and all(r > 1.0 for r in comparison.trial_ratios)
    )


def apply_move(current: KernelSource, move: Move) -> KernelSource:
    """The kernel `move` writes from `current`; MechanismRefused when its rule cannot."""
    if move.source is not None:
        return move.source
    if move.mechanism is None:
        raise MechanismRefused(
            Refusal(
                mechanism=move.name,
                action="apply",
                reason="the mechanism is not in this catalog (no rule applies it)",
            )
        )
    if move.site is None:
        return apply_everywhere(current, move.mechanism, move.carrier)
    site = next((s for s in move.mechanism.candidates(current) if s.id == move.site), None)
    if site is None:
        raise MechanismRefused(
            Refusal(
                mechanism=move.mechanism.name,
                action="apply",
                site=move.site,
                reason="the site is no longer a candidate",
            )
        )
    return move.mechanism.apply(current, site, move.carrier)


Step = Tried[Move, GateRunRecord]
"""A move a method gated, with its run record (None until the state's choice is made)."""


class ForwardSearch(ABC):
    """One method on one problem, as the search loop's move source: the moves come from the
    subclass, the rest (writing a move's kernel, the keep rule, the records) is shared."""

    name: ClassVar[str]
    """The method's name in reports: skills, blind or memory."""
    breadth_first: ClassVar[bool] = False
    """Whether a mechanism's carriers wait after `Materializer.carriers_first` gate runs at a
    state (the skills methods; blind search's moves are one a site, not carriers)."""

    def __init__(self, materializer: Materializer, problem: Problem) -> None:
        self.materializer = materializer
        self.problem = problem
        self.skills = materializer.skills
        self.budget = VerdictBudget(materializer.budget.gate_runs, materializer.budget.wall_seconds)
        self.lineage = LineageGraph(problem.name)
        self.lineage.meta.method = self.name
        self.records: list[GateRunRecord] = []
        """Every gate run, in order."""
        self.refusals: list[str] = []
        """Moves the rules could not write, and moves that changed no machine code."""
        self.rejections: list[LlmRejection] = []
        """LLM answers that were never gated."""
        self.used: list[SkillUse] = []
        """The kept skills on the way to the best state, and the experts they came from."""
        self.best: GateVerdict | None = None
        """The verdict of the best state (set when the search ends)."""
        self.branching = 1
        """Distinct kept moves to gate at a state before moving on (greedy: the first)."""
        self._verdicts: dict[str, GateVerdict] = {}  # a state reached, by fingerprint
        self._speedups: dict[str, float] = {}  # its speedup over the start
        self._came_from: dict[str, tuple[str, list[SkillUse]]] = {}  # its parent, the skills
        self._tried: set[MoveKey] = set()
        self._applied: set[tuple[str, str]] = set()  # (state, skill) a rule could apply
        self._prepared: dict[MoveKey, KernelSource | MechanismRefused] = {}
        self._written: set[str] = set()  # kernels gated for the kept skill's carriers
        self._defaults: dict[str, set[str]] = {}  # at a state: kernels the rules' defaults wrote
        # at a state: the machine code of each kernel gated from it, and the move that wrote it
        self._gated_code: dict[str, list[tuple[str, MachineCode]]] = {}
        # at a state: each kept move and the carriers gated after it, with their gate-run numbers
        self._waiting: dict[str, list[tuple[Step, int]]] = {}
        # at a state: each mechanism gated there, and whether it failed there (no run of it
        # kept-worthy, and each either rejected or measurably slower)
        self._outcomes: dict[str, dict[str, bool]] = {}
        # at a state: the mechanisms a run of which passed the keep rule there
        self._kept_at: dict[str, set[str]] = {}

    @abstractmethod
    def candidates(self, current: KernelSource) -> Iterator[Move]:
        """The moves this method would try from `current`, best first."""

    def siblings(self, later: Sequence[Move], kept: Move, state: KernelSource) -> Iterator[Move]:
        """Moves to gate from `state` after `kept` passed the keep rule there (none)."""
        return iter(())

    def dispatches(self, state: KernelSource) -> Iterator[Move]:
        """Moves to gate from `state` once a kept move's siblings are gated there (none)."""
        return iter(())

    def ask_llm(self, current: KernelSource, move: Move) -> Move | None:
        """The LLM's application of a skill; None: this method never asks one."""
        return None

    def frontier(self) -> Frontier[Move, GateRunRecord] | None:
        """The states the search expands; None: greedy, on from the one kept move."""
        return None

    def run(self, naive: KernelSource) -> MethodResult:
        """Search forward from `naive` (gated first: it must pass), within the budget."""
        started = time.monotonic()
        start = self.materializer.log.run(self.problem, naive)
        if not start.passed:
            raise ValueError(f"{self.problem.name}: the starting kernel fails its gate")
        start = self.profiled(naive, start)
        self._verdicts[naive.fingerprint], self._speedups[naive.fingerprint] = start, 1.0
        self.lineage.add_state(state_info(naive, start, 0), root=True)
        end = search(
            self.problem, naive, self, self.materializer.log, self.budget, frontier=self.frontier()
        )
        self.lineage.meta.final = end.state.fingerprint
        self.best = self.profiled(end.state, self._verdicts[end.state.fingerprint])
        self.records.sort(key=lambda record: record.index)  # a beam settles out of gate order
        self.used = self._uses_to(end.state)
        result = method_result(
            self.name,
            self.problem,
            start,
            self.best,
            self.records,
            self.refusals,
            self.used,
            end.state,
            time.monotonic() - started,
        )
        result.llm_rejections = self.rejections
        return result

    def profiled(
        self, kernel: KernelSource, verdict: GateVerdict, *, ranks: bool = False
    ) -> GateVerdict:
        """`verdict` with `kernel`'s profile, when the gate profiles on request and the
        verdict has none (the gate log serves a profile taken before, in this run or one it
        resumes); kept in the lineage too, where the kernel is a state of it. Without a GPU,
        a profile the log lacks stops the run only where it `ranks` moves; the start's and
        the end's, which the report shows, are then left out."""
        log = self.materializer.log
        if verdict.profile is not None or not hasattr(log.gate, "profile_kernel"):
            return verdict
        if not verdict.passed:
            return verdict
        latency = {w.label: w.latency_ms for w in verdict.workloads if w.latency_ms}
        try:
            profile = log.profile_kernel(self.problem, kernel, latency)
        except VerdictMissing:
            if ranks:
                raise
            return verdict
        if not profile:
            return verdict
        if kernel.fingerprint in self.lineage.graph:
            self.lineage.set_profile(kernel.fingerprint, profile)
        return verdict.model_copy(update={"profile": profile})

    # ---- the move source the search loop asks (klineage.search.MoveSource) ------------------

    def moves(self, step: int, state: KernelSource, tried: Sequence[Step]) -> Iterator[Move]:
        """The method's moves in order, built ahead; after each one kept, the moves `siblings`
        names; after `branching` kept, no more (then the loop re-ranks from the new state).
        In the skills methods, a mechanism whose skills' carriers have had the materializer's
        `carriers_first` gate runs here, none kept, waits with its other carriers until every
        move after them has had its turn."""
        moves = list(self.candidates(state))
        self._prebuild(state, moves, self.budget.left())
        kept = 0
        waiting: list[Move] = []
        runs: dict[str, int] = {}
        for turn, queue in enumerate((moves, waiting)):
            for index, planned in enumerate(queue):
                if turn == 0 and self._waits(planned, runs):
                    waiting.append(planned)
                    continue
                gated = len(tried)
                yield planned
                if len(tried) == gated:
                    continue  # no gate run: tried here before, refused, or no new machine code
                runs[planned.name] = runs.get(planned.name, 0) + 1
                if tried[-1].accepted:
                    if tried[-1].move.source is None:  # a rule wrote it: its other carriers too
                        later = [*queue[index + 1 :], *(waiting if turn == 0 else ())]
                        yield from self.siblings(later, planned, state)
                        yield from self.dispatches(state)
                    kept += 1
                    if kept >= self.branching:
                        return

    def _waits(self, move: Move, runs: dict[str, int]) -> bool:
        """Whether a skill's carrier goes to the back of the state's moves: its mechanism has
        had `carriers_first` gate runs here already (none kept, or the search would have
        moved on)."""
        first = self.materializer.carriers_first
        if not self.breadth_first or first is None or move.skill is None or move.ask_llm:
            return False
        return move.source is None and runs.get(move.name, 0) >= first

    def realize(self, state: KernelSource, move: Move) -> tuple[Move, KernelSource] | None:
        """The move's kernel, or None (recorded as a refusal where one is due) when it costs no
        gate run: tried before at this state, refused by its rule, no machine-code change."""
        key = move_key(state, move)
        if key in self._tried:
            return None
        self._tried.add(key)
        if move.sibling:
            try:
                new = self._prepared_kernel(state, move, key)
            except MechanismRefused as err:
                self.refusals.append(f"{move.origin} {move.name}: {err.reason}")
                return None
            move, new = self._under_register_cap(state, move, new)
            self._note_default(state, move, new)
            if new.text in self._written:  # the same kernel as a carrier gated here: free
                return None
            self._written.add(new.text)
            if self._no_machine_code_change(state, new):
                self.refusals.append(f"{move.origin} {move.name}: {NO_CHANGE}")
                return None
            if self._gated_before(state, move, new):
                return None
            return move, new
        realized = move
        if move.ask_llm:
            if (state.fingerprint, move.skill or "") in self._applied:
                return None  # a rule applied this skill here: no need to ask
            answer = self.ask_llm(state, move)
            if answer is None or answer.source is None:
                return None
            realized, new = answer, answer.source
        else:
            try:
                new = self._prepared_kernel(state, move, key)
            except MechanismRefused as err:
                self.refusals.append(f"{move.origin} {move.name}: {err.reason}")
                return None
            if move.skill is not None:
                self._applied.add((state.fingerprint, move.skill))
            realized, new = self._under_register_cap(state, move, new)
            self._note_default(state, move, new)
        if self._no_machine_code_change(state, new):
            # timing it would time the current binary twice: no gate run, any method
            self.refusals.append(f"{move.origin} {move.name}: {NO_CHANGE}")
            return None
        if self._gated_before(state, realized, new):
            return None
        self._written = {new.text}
        return realized, new

    def accepts(self, verdict: GateVerdict) -> bool:
        """The keep rule (:func:`keeps`)."""
        return keeps(verdict)

    def gated(self, step: int, state: KernelSource, tried: Step) -> GateRunRecord | None:
        """Record a run not kept at once; a kept one, and the carriers gated after it, wait
        for the choice among them (the others are `outranked`)."""
        number = self.budget.used()  # the loop charged this run just before
        if tried.accepted or tried.move.sibling:
            self._waiting.setdefault(state.fingerprint, []).append((tried, number))
            return None
        return self._record_run(state, tried, number, chosen=False)

    def choose(self, state: KernelSource, accepted: Sequence[Step]) -> Step:
        """The fastest of the kept carriers (the first on a tie); but within timing noise of
        it (`SLOWER`), the kernel its rule's own default writes for this target. An edge
        smaller than the noise is no evidence for a carrier learned on another expert, and
        the choice shapes the next steps: on rotary, 8-byte vectors measured 1.048x and the
        default 16-byte ones 1.032x, and the rows form kept after the 8-byte kernel kept its
        width (1.39x) where blind search's, after the 16-byte one, gained 1.61x."""
        best = max(accepted, key=lambda one: _ratio(one.verdict))
        defaults = self._defaults.get(state.fingerprint, set())
        for one in accepted:
            if (
                one.move.name == best.move.name
                and one.child.text in defaults
                and _ratio(one.verdict) >= _ratio(best.verdict) * SLOWER
            ):
                return one
        return best

    def _under_register_cap(
        self, state: KernelSource, move: Move, new: KernelSource
    ) -> tuple[Move, KernelSource]:
        """`move` and its kernel; where the kernel spills under a launch bound's register cap
        that `state` did not need, the kernel without the cap's minimum blocks, the move saying
        so (:func:`klineage.replay.register_cap.lift_register_cap`)."""
        builder = self._builder()
        lifted = None if builder is None else lift_register_cap(builder, state, new)
        if lifted is None:
            return move, new
        kernel, why = lifted
        return replace(move, intent="; ".join(filter(None, (move.intent, why)))), kernel

    def _note_default(self, state: KernelSource, move: Move, new: KernelSource) -> None:
        """Remember the kernel a rule's default choices wrote at `state` (gated, or the same
        as a carrier gated there)."""
        if move.default:
            self._defaults.setdefault(state.fingerprint, set()).add(new.text)

    def settled(self, step: int, state: KernelSource, tried: Sequence[Step], chosen: Step) -> None:
        """Record the kept move and its carriers, and go on from the chosen one."""
        self.settled_several(step, state, tried, [chosen])

    # ---- what a beam asks besides (klineage.search.BranchingSource) ----------------------------

    def branches(self, state: KernelSource, accepted: Sequence[Step]) -> list[Step]:
        """The fastest carrier of each kept move (a kept move and the carriers gated after it
        are one change), in the order the kept moves were gated."""
        groups: list[list[Step]] = []
        for one in accepted:
            if one.move.sibling and groups:
                groups[-1].append(one)
            else:
                groups.append([one])
        return [self.choose(state, group) for group in groups]

    def value(self, state: KernelSource, child: Step) -> float:
        """The speedup over the start of the kernel `child` reached from `state`."""
        return self._speedups[state.fingerprint] * _ratio(child.verdict)

    def settled_several(
        self, step: int, state: KernelSource, tried: Sequence[Step], chosen: Sequence[Step]
    ) -> None:
        """Record the kept moves and their carriers at `state`; the search goes on from
        `chosen` (a kept move it does not go on from is `outranked`)."""
        for one, number in self._waiting.pop(state.fingerprint, []):
            went_on = any(one is other for other in chosen)
            one.record = self._record_run(state, one, number, chosen=went_on)
            if went_on:
                self._reached(state, one)

    def _reached(self, parent: KernelSource, chosen: Step) -> None:
        """Note a state the search goes on from: its verdict, speedup, and the skill on the
        way to it."""
        child = chosen.child.fingerprint
        assert chosen.record is not None, "a chosen move is recorded before the search goes on"
        if self._speedups.get(child, 0.0) >= chosen.record.speedup:
            return  # reached before, by a path at least as fast
        self._verdicts[child], self._speedups[child] = chosen.verdict, chosen.record.speedup
        move = chosen.move
        uses = [
            SkillUse(
                skill=self.skills[skill].id,
                source=self.skills[skill].evidence.problem,
                folder=self.materializer.skill_folders.get(skill, ""),
                origin=move.origin if skill == move.skill else f"skill:{skill}",
            )
            for skill in dict.fromkeys([*move.combines, *filter(None, [move.skill])])
        ]
        self._came_from[child] = (parent.fingerprint, uses)

    def _uses_to(self, state: KernelSource) -> list[SkillUse]:
        """The skills kept on the way from the start to `state`, in order."""
        uses: list[SkillUse] = []
        at = state.fingerprint
        while at in self._came_from:
            at, kept = self._came_from[at]
            uses.extend(reversed(kept))
        return uses[::-1]

    def failed_before(self, state: KernelSource) -> set[str]:
        """Mechanisms whose latest evidence on the way to `state` is a failure: at the nearest
        earlier state where they were gated, every run of theirs was rejected or measurably
        slower (below `SLOWER`; a run within noise of the state is no evidence)."""
        return {m for m, evidence in self._latest_evidence(state).items() if evidence == FAILED}

    def idle_before(self, state: KernelSource) -> set[str]:
        """Mechanisms whose latest evidence on the way to `state` is no change: at the nearest
        earlier state where they were gated, none was kept and some run was within noise."""
        return {m for m, evidence in self._latest_evidence(state).items() if evidence == IDLE}

    def _latest_evidence(self, state: KernelSource) -> dict[str, str]:
        """Per mechanism gated on the way to `state`: what its runs at the nearest earlier state
        where it was gated came to (:data:`FAILED`, :data:`IDLE` or :data:`GAINED`)."""
        latest: dict[str, str] = {}
        at = state.fingerprint
        while at in self._came_from:
            at = self._came_from[at][0]
            for mechanism, failed_there in self._outcomes.get(at, {}).items():
                if mechanism in latest:
                    continue
                if failed_there:
                    latest[mechanism] = FAILED
                elif mechanism in self._kept_at.get(at, set()):
                    latest[mechanism] = GAINED
                else:
                    latest[mechanism] = IDLE
        return latest

    def nothing_to_try(self, state: KernelSource) -> Ending:
        """No candidate move: the method has nothing more to offer."""
        return Ending.COMPLETE

    # ---- writing and recording moves ----------------------------------------------------------

    def _builder(self) -> Any:
        """The gate's builder under this problem's compile options (None without one)."""
        builder = getattr(self.materializer.log.gate, "builder", None)
        if builder is None:
            return None
        return builder.with_options(self.problem.build_options)

    def _no_machine_code_change(self, current: KernelSource, new: KernelSource) -> bool:
        builder = self._builder()
        if builder is None or not self.materializer.skip_no_ops:
            return False
        before = builder.build(current.text, current.name).machine_code
        return same_machine_code(before, builder.build(new.text, new.name).machine_code)

    def _gated_before(self, state: KernelSource, move: Move, new: KernelSource) -> bool:
        """Whether `new` runs the machine code of a kernel already gated from `state` (its
        verdict would be that one's: the gate shares verdicts by machine code), recorded as a
        refusal that costs no gate run; otherwise `new` is remembered as gated there."""
        builder = self._builder()
        materializer = self.materializer
        if builder is None or not (materializer.skip_no_ops and materializer.skip_same_as_gated):
            return False
        code = builder.build(new.text, new.name).machine_code
        if code is None:
            return False
        gated = self._gated_code.setdefault(state.fingerprint, [])
        for label, earlier in gated:
            if same_machine_code(earlier, code):
                self.refusals.append(f"{move.origin} {move.name}: {SAME_AS_GATED} ({label})")
                return True
        gated.append((f"{move.origin} {move.name}", code))
        return False

    def _machine_code(self, kernel: KernelSource) -> MachineCode | None:
        """The target state's machine code with histograms (a cached build), for retrieval."""
        builder = self._builder()
        if builder is None or not self.materializer.skip_no_ops:
            return None
        return builder.build(kernel.text, kernel.name, disassemble=True).machine_code

    def _prepared_kernel(self, current: KernelSource, move: Move, key: MoveKey) -> KernelSource:
        """The move applied to `current`, from the prebuild's work when it got there first."""
        outcome = self._prepared.pop(key, None)
        if outcome is None:
            return apply_move(current, move)
        if isinstance(outcome, MechanismRefused):
            raise outcome
        return outcome

    def _prebuild(self, current: KernelSource, moves: Sequence[Move], remaining: int) -> None:
        """Apply the next rule moves the budget can still pay for and compile them all in
        parallel, so the gate runs that follow find their builds cached: nvcc, not the GPU,
        is the slow part of a gate run on a fast kernel."""
        builder = self._builder()
        if builder is None or remaining <= 0:
            return
        sources: dict[str, KernelSource] = {}
        for move in moves:
            if len(sources) >= remaining:
                break
            key = move_key(current, move)
            if move.ask_llm or key in self._tried:
                continue
            try:
                new = apply_move(current, move)
            except MechanismRefused as err:
                self._prepared[key] = err
                continue
            self._prepared[key] = new
            sources.setdefault(new.fingerprint, new)
        kernels = [current, *sources.values()]
        if len(kernels) > 1:
            builder.build_many([(k.text, k.name) for k in kernels])

    def _record_run(
        self, current: KernelSource, tried: Step, number: int, *, chosen: bool
    ) -> GateRunRecord:
        """The record and lineage edge of gate run `number`, appended; a kept run not chosen
        is `outranked`."""
        speedup = self._speedups[current.fingerprint]
        record = run_record(number, tried.move, tried.verdict, speedup, kept=tried.accepted)
        outcomes = self._outcomes.setdefault(current.fingerprint, {})
        comparison = tried.verdict.comparison
        failed = not tried.accepted and (
            not tried.verdict.passed or (comparison is not None and comparison.ratio < SLOWER)
        )
        outcomes[tried.move.name] = outcomes.get(tried.move.name, True) and failed
        if tried.accepted:
            self._kept_at.setdefault(current.fingerprint, set()).add(tried.move.name)
        if tried.accepted and not chosen:
            record.outcome, record.speedup = "outranked", speedup
        add_edge(self.lineage, current, tried.child, tried.verdict, tried.move, chosen, number - 1)
        self.records.append(record)
        self.materializer.on_run(self.name, record)
        return record


class SkillsMethod(ForwardSearch):
    """Retrieved skills in rank order, each at every carrier its evidence supports; with an LLM,
    the LLM applies a skill no rule could apply here."""

    name = "skills"
    breadth_first = True

    def __init__(self, materializer: Materializer, problem: Problem) -> None:
        super().__init__(materializer, problem)
        self.asks_llm = materializer.llm is not None
        self._closed: dict[str, dict[str, set[str]]] = {}
        """Per state, which mechanisms each retrieved one's rewrite leaves without a site."""
        self._unrelieved: dict[str, set[str]] = {}
        """Per state, the mechanisms ranked last for having nothing to relieve there."""
        if self.asks_llm:
            self.lineage.meta.llm = materializer.llm_origin()

    def run(self, naive: KernelSource) -> MethodResult:
        """The search, and the LLM's unused answers kept in the lineage when it was asked."""
        result = super().run(naive)
        if self.asks_llm:
            self.lineage.meta.llm_rejections = self.rejections
        return result

    def candidates(self, current: KernelSource) -> Iterator[Move]:
        """Each retrieved skill by rule, at each carrier; with an LLM, then the LLM for it
        (asked only when no rule application of the skill went through)."""
        profile = self._profile(current)
        call = profile.bottleneck if profile is not None else None
        ranking = retrieve(
            list(self.skills.values()),
            self.problem,
            current,
            arch=self.materializer.arch,
            keep_unknown=self.asks_llm,
            machine_code=self._machine_code(current),
            bottleneck=call.kind if call is not None else None,
            profile=profile,
            weigh_track_record=self.materializer.weigh_track_record,
        )
        mechanisms = [r.mechanism for r in ranking.ranked]
        closed = closes(mechanisms, current, apply_everywhere)
        self._closed[current.fingerprint] = closed
        # what the profile (or the launch) leaves nothing to relieve goes last, whatever it
        # would close, and is not raced against a kept rival
        hopeful = [r for r in ranking.ranked if not r.unrelieved]
        last = [r for r in ranking.ranked if r.unrelieved]
        self._unrelieved[current.fingerprint] = {r.mechanism for r in last}
        pull = self.materializer.pull_closed_first
        ordered = [
            *keep_options_open(hopeful, lambda r: r.mechanism, closed, pull=pull),
            *keep_options_open(last, lambda r: r.mechanism, closed, pull=pull),
        ]
        if self.materializer.spread_first:
            # rival layouts of a loop (a warp or block per row, a split) raced in the order
            # the target's loads favor: the race is the same, its winner is reached sooner
            ordered = spread_first(ordered, lambda r: r.mechanism, closed, current)
        if self.materializer.stage_first:
            # where the loads are reused across threads or strided across lanes, staging
            # goes first: the gain measured on its expert says nothing of that here
            held_back = self._unrelieved[current.fingerprint]
            ordered = stage_first(ordered, lambda r: r.mechanism, current, held_back)
        # what changed nothing at an earlier state on the way here is tried after the rest,
        # and what measured slower there after that
        failed = self.failed_before(current)
        idle = self.idle_before(current) if self.materializer.idle_last else set()
        ordered = [
            *(r for r in ordered if r.mechanism not in failed | idle),
            *(r for r in ordered if r.mechanism in idle),
            *(r for r in ordered if r.mechanism in failed),
        ]
        for ranked in ordered:
            skill = self.skills[ranked.skill]
            origin = f"skill:{skill.id}"
            mechanism = catalog_mechanism(skill.mechanism)
            if mechanism is not None:
                # a condition the rule tests at run time here is part of every carrier
                needed = Carrier.model_validate(ranked.carrier)
                for carrier in self.carriers(skill, current):
                    yield Move(
                        mechanism,
                        carrier.merged(needed),
                        origin,
                        skill=skill.id,
                        default=carrier == Carrier(),
                    )
            if self.asks_llm:
                yield Move(
                    None, Carrier(), origin, skill=skill.id, action=skill.mechanism, ask_llm=True
                )

    def _profile(self, current: KernelSource) -> Profile | None:
        """The current state's profile, profiling it when the gate does so on request (None
        when it does not profile, or when the profiled method runs beside this one and the
        ranking by profiles is its to compare)."""
        if self.name == "skills" and not self.materializer.skills_rank_by_profile:
            return None
        verdict = self._verdicts.get(current.fingerprint)
        if verdict is None:
            return None
        verdict = self._verdicts[current.fingerprint] = self.profiled(current, verdict, ranks=True)
        return verdict.profile

    def siblings(self, later: Sequence[Move], kept: Move, state: KernelSource) -> Iterator[Move]:
        """From the same state, the fastest is kept among: the kept skill's other carriers,
        then each mechanism that `kept` and that close each other's sites (vectorizing a
        GEMM's loads leaves no tile to stage, and staging leaves no load to vectorize), at
        its best-ranked move. Whichever of such a pair goes first, the other is lost; rank
        cannot tell which gains more on this kernel, one gate run per alternative can.

        With the materializer's `race_before_carriers`, the rivals are raced first, and then
        only the mechanisms whose best run is within timing noise of the fastest get their
        other carriers: a carrier refines its mechanism by less than the race separates
        rivals, so refining one that lost past noise spends a run on a lost choice."""
        closed = self._closed.get(state.fingerprint, {})
        rivals = {m for m in closed.get(kept.name, set()) if kept.name in closed.get(m, set())}
        rivals -= self._unrelieved.get(state.fingerprint, set())  # nothing to relieve: no race
        if not self.materializer.race_before_carriers:
            yield from self._carriers_of({kept.skill}, later)
        for move in later:
            if move.name in rivals and not move.ask_llm and move.source is None:
                rivals.discard(move.name)
                yield replace(move, sibling=True)
        if self.materializer.race_before_carriers:
            yield from self._carriers_of(self._in_the_race(state), later)

    @staticmethod
    def _carriers_of(skills: set[str | None], later: Sequence[Move]) -> Iterator[Move]:
        """The rule moves of `skills` among `later`, as siblings."""
        for move in later:
            if move.skill in skills and not move.ask_llm and move.source is None:
                yield replace(move, sibling=True)

    def _in_the_race(self, state: KernelSource) -> set[str | None]:
        """The skills kept at `state` whose run is within timing noise (`SLOWER`) of the
        fastest kept there."""
        kept = [step for step, _ in self._waiting.get(state.fingerprint, []) if step.accepted]
        if not kept:
            return set()
        fastest = max(_ratio(step.verdict) for step in kept)
        return {step.move.skill for step in kept if _ratio(step.verdict) >= fastest * SLOWER}

    def dispatches(self, state: KernelSource) -> Iterator[Move]:
        """A launch-size dispatch (the library's `launch_size_dispatch` skill, applied by
        :mod:`klineage.replay.dispatch`) between the fastest kernel kept at `state` and the
        first other kept one that is faster on some workloads, by the var axis that separates
        them, where the verdicts predict it beats the fastest alone past noise. One a state."""
        skill = self._dispatch_skill()
        mechanism = catalog_mechanism("launch_size_dispatch")
        kept = [step for step, _ in self._waiting.get(state.fingerprint, []) if step.accepted]
        if skill is None or mechanism is None or len(kept) < 2:
            return
        kept.sort(key=lambda one: _ratio(one.verdict), reverse=True)
        fastest = kept[0]
        for other in kept[1:]:
            split = best_split(self.problem, [_latencies(fastest), _latencies(other)])
            if split is None:
                continue
            pair = (fastest.child, other.child)
            try:
                kernel = write_dispatch(pair, split, self.problem.definition.var_axes())
            except DispatchRefused as err:
                self.refusals.append(f"skill:{skill.id} {mechanism.name}: {err}")
                continue
            names = (fastest.move.name, other.move.name)
            low, high = names[split.low], names[1 - split.low]
            rivals = (fastest.move.skill, other.move.skill)
            yield Move(
                mechanism,
                Carrier(axis=split.axis, threshold=split.threshold),
                f"skill:{skill.id}",
                skill=skill.id,
                source=kernel,
                sibling=True,
                combines=tuple(s for s in rivals if s is not None),
                intent=(
                    f"{low} where {split.axis} <= {split.threshold}, {high} above "
                    f"(predicted {split.gain:.2f}x over {fastest.move.name} alone)"
                ),
            )
            return

    def _dispatch_skill(self) -> Skill | None:
        """The library's launch-size dispatch skill that gained most on its expert (never one
        mined from this problem); None without one."""
        found = [
            s
            for s in self.skills.values()
            if s.mechanism == "launch_size_dispatch" and s.evidence.problem != self.problem.name
        ]
        return max(found, key=lambda s: s.effect.geomean_speedup or 1.0, default=None)

    def carriers(self, skill: Skill, state: KernelSource | None = None) -> list[Carrier]:
        """The skill's own carrier, then the others its mechanism was seen with; each first
        as it transfers to the target (vector widths keep their bytes), then as learned; choices
        written as expressions over names the target lacks are left out. Last, the rule's own
        default for the target: a choice tuned on one expert (a 512-thread block) must not hide
        a better one for this kernel, and it is gated only once a learned carrier has passed;
        then the alternatives the rule names for `state` (an 8 x 8 register tile beside 4 x 4),
        raced like the others once one is kept."""
        seen, carriers = set(), []
        same = [skill] + [s for s in self.skills.values() if s.mechanism == skill.mechanism]
        path = self.problem.kernel_path
        target = path.read_text(encoding="utf-8") if path else ""
        for candidate in same:
            learned = Carrier.model_validate(candidate.carrier or {})
            if target:
                learned = without_foreign_names(learned, target)
            moved = transfer_carrier(learned, candidate.scope.dtypes, self.problem)
            for carrier in (moved, learned):
                key = carrier.model_dump_json()
                if key not in seen:
                    seen.add(key)
                    carriers.append(carrier)
        if Carrier().model_dump_json() not in seen:
            seen.add(Carrier().model_dump_json())
            carriers.append(Carrier())
        mechanism = catalog_mechanism(skill.mechanism)
        if state is not None and mechanism is not None:
            for carrier in mechanism.alternative_carriers(state):
                if carrier.model_dump_json() not in seen:
                    seen.add(carrier.model_dump_json())
                    carriers.append(carrier)
        return carriers

    def ask_llm(self, current: KernelSource, move: Move) -> Move | None:
        """The LLM's application of `move.skill` to `current`, as a move carrying the new
        kernel; None (and a rejection recorded) when there is no usable answer."""
        llm, step = self.materializer.llm, len(self.records)  # gate runs spent so far
        if llm is None or self.materializer.llm_off is not None or move.skill is None:
            return None
        skill = self.skills[move.skill]
        origin = self.materializer.llm_origin()
        try:
            outcome = materialize_skill(llm, render_skill_md(skill), current, self.problem)
        except ProviderError as err:  # fatal: every later call would fail the same way
            self.materializer.llm_off = err.message
            entry = llm_rejection(
                err,
                parent=current.fingerprint,
                step=step,
                origin=origin,
                reason=f"{err.message} (the LLM is not asked again on this problem)",
            )
            entry.skill = skill.id
            self.rejections.append(entry)
            return None
        if isinstance(outcome, Rejection):
            entry = llm_rejection(outcome, parent=current.fingerprint, step=step, origin=origin)
            entry.skill = skill.id
            self.rejections.append(entry)
            return None
        return Move(
            catalog_mechanism(skill.mechanism),
            Carrier(),
            f"{outcome.origin}:skill:{skill.id}",
            skill=skill.id,
            action=skill.mechanism,
            source=outcome.source,
            intent=outcome.intent,
        )


class BlindMethod(ForwardSearch):
    """Blind search: every catalog mechanism at every candidate site, no conditions."""

    name = "blind"

    def candidates(self, current: KernelSource) -> Iterator[Move]:
        """Every catalog mechanism at every supported candidate site, one site a move."""
        for mechanism in all_mechanisms():
            for site in mechanism.candidates(current):
                if site.supported:
                    yield Move(mechanism, Carrier(), "blind", site=site.id)


class MemoryMethod(ForwardSearch):
    """Example memory: past before/after edits retrieved by text similarity, no conditions."""

    name = "memory"

    def candidates(self, current: KernelSource) -> Iterator[Move]:
        """The skills' before/after edits, most similar to the current kernel first."""
        # an edit is replayed by its mechanism's rule: one the catalog lacks cannot be
        examples = [
            s
            for s in self.skills.values()
            if s.evidence.problem != self.problem.name
            and catalog_mechanism(s.mechanism) is not None
        ]
        scores = bm25_scores(current.text, [s.anchor.before for s in examples])
        ordered = sorted(zip(scores, examples, strict=True), key=lambda p: (-p[0], p[1].id))
        for _, skill in ordered:
            yield Move(
                catalog_mechanism(skill.mechanism),
                Carrier.model_validate(skill.carrier or {}),
                f"memory:{skill.id}",
            )


class TreeMethod(SkillsMethod):
    """The skills method's moves under a beam: `beam_width` kept skills gated at each state,
    the `beam_width` fastest children of a level expanded next."""

    name = TREE

    def __init__(self, materializer: Materializer, problem: Problem) -> None:
        super().__init__(materializer, problem)
        self.branching = materializer.beam_width

    def frontier(self) -> Frontier[Move, GateRunRecord]:
        """A beam of the materializer's width over this method's moves."""
        return Beam(self, self.branching)


class ProfiledMethod(SkillsMethod):
    """The skills method, greedily, retrieval ranking first the skills that relieved the
    current state's bottleneck on their expert and last those its profile leaves nothing to
    relieve (:mod:`klineage.replay.relief`; the gate must profile on request): run beside
    `skills` on the same budget, it measures what the profiles add to the ranking."""

    name = PROFILED


METHOD_CLASSES: dict[str, type[ForwardSearch]] = {
    m.name: m for m in (SkillsMethod, BlindMethod, MemoryMethod, TreeMethod, ProfiledMethod)
}


class Materializer:
    """Runs one method on one problem from its naive kernel."""

    def __init__(
        self,
        log: GateLog,
        skills: Sequence[Skill],
        budget: ReplayBudget | None = None,
        *,
        arch: str = DEFAULT_ARCH,
        on_run: Callable[[str, GateRunRecord], None] | None = None,
        llm: Provider | None = None,
        skip_no_ops: bool = True,
        skill_folders: Mapping[str, str] | None = None,
        beam_width: int = BEAM_WIDTH,
        skills_rank_by_profile: bool = True,
        carriers_first: int | None = CARRIERS_FIRST,
        skip_same_as_gated: bool = True,
        idle_last: bool = True,
        spread_first: bool = True,
        stage_first: bool = True,
        pull_closed_first: bool = True,
        weigh_track_record: bool = True,
        race_before_carriers: bool = True,
    ) -> None:
        if beam_width < 1:
            raise ValueError(f"the tree method's beam width must be at least 1, not {beam_width}")
        self.log = log
        self.carriers_first = carriers_first
        """Gate runs a mechanism's skill moves get at a state, none kept, before its other
        carriers wait for every later move (None: each skill's carriers in a row, as replays
        before 2026-12-04 ran)."""
        self.skills_rank_by_profile = skills_rank_by_profile
        """Whether the `skills` method ranks by the current state's bottleneck where the gate
        profiles (off when the `profiled` method runs beside it, so the two differ in that
        alone)."""
        self.beam_width = beam_width
        """States a level of the tree method holds, and kept skills it gates at each."""
        self.skill_folders: Mapping[str, str] = skill_folders or {}
        """Skill id -> the folder it was read from, for the report ('' where not given)."""
        self.skip_no_ops = skip_no_ops
        """Never gate a move whose kernel runs the current state's machine code, and pass
        the current state's machine code to retrieval (which drops a skill whose signature
        the state already shows); False: no machine-code check at all."""
        self.skip_same_as_gated = skip_same_as_gated
        """With `skip_no_ops`: never gate a move whose kernel runs the machine code of one
        already gated from the same state either (False: gate it, its verdict shared, as
        replays before 2026-12-05 did)."""
        self.idle_last = idle_last
        """The skills methods try a mechanism whose runs changed nothing (within noise) at
        the nearest earlier state where it was gated after the untried ones (False: in rank
        order, as replays before 2026-12-05 did); one that measured slower goes last either
        way."""
        self.spread_first = spread_first
        """Whether rival loop layouts are raced in the order the target's loads favor
        (:mod:`klineage.replay.coalescing`; False: retrieval's order, as replays before
        2026-12-05 ran)."""
        self.stage_first = stage_first
        """Whether staging in shared memory goes first where the target's loads call for it
        (:func:`klineage.replay.coalescing.calls_for_staging`; False: in rank order, as
        replays before 2026-12-06 ran)."""
        self.pull_closed_first = pull_closed_first
        """Whether the skills a retrieved skill's rewrite would close are tried just before it
        (False: it waits behind every skill that closes nothing, as replays before 2026-12-06
        ran; :func:`klineage.replay.ordering.keep_options_open`)."""
        self.weigh_track_record = weigh_track_record
        """Whether retrieval scales a skill's measured gain by its mechanism's track record
        (False: the whole gain, as replays before 2026-12-06 ranked;
        :func:`klineage.replay.retrieve.track_record`)."""
        self.race_before_carriers = race_before_carriers
        """Whether a kept skill's rivals are raced before its other carriers, which then go
        only to the mechanisms within noise of the race's fastest (False: the kept skill's
        carriers first, then the rivals, as replays before the eighth session, 2026-12-06, ran)."""
        self.skills = {s.id: s for s in skills}
        self.budget = budget or ReplayBudget()
        self.arch = arch
        self.on_run = on_run or (lambda method, record: None)
        self.llm = llm
        """Asked to apply a skill no rule can apply (the `skills` method); None: rules only."""
        self.llm_off: str | None = None
        """Why the LLM is no longer asked (a failure every later call would repeat)."""

    def method(self, name: str, problem: Problem) -> ForwardSearch:
        """The move source of method `name` on `problem` (ValueError for an unknown name)."""
        if name not in METHOD_CLASSES:
            raise ValueError(f"unknown method {name!r}; expected one of {', '.join(ALL_METHODS)}")
        return METHOD_CLASSES[name](self, problem)

    def run(
        self, problem: Problem, naive: KernelSource, method: str
    ) -> tuple[MethodResult, LineageGraph]:
        """Run `method` on `problem` from `naive`: what it reached, and its forward lineage."""
        strategy = self.method(method, problem)
        return strategy.run(naive), strategy.lineage

    def llm_origin(self) -> str:
        """`llm:<kind>:<model>` of the LLM asked, or '' without one."""
        return f"{LLM_PREFIX}{self.llm.kind}:{self.llm.model}" if self.llm is not None else ""


def _latencies(step: Step) -> dict[str, float]:
    """A gated move's latency per workload, by label, relative to the state it was timed
    against in the same run (state latency / ratio): two moves gated from one state compare
    without the drift between their runs. Absolute latencies where a workload has no ratio."""
    workloads = step.verdict.workloads
    if all(w.comparison is not None and w.comparison.ratio > 0 for w in workloads):
        return {w.label: 1.0 / w.comparison.ratio for w in workloads if w.comparison}
    return {w.label: w.latency_ms for w in workloads if w.latency_ms}


def _ratio(verdict: GateVerdict) -> float:
    assert verdict.comparison is not None, "a kept verdict was timed against its state"
    return verdict.comparison.ratio


def run_record(
    index: int, move: Move, verdict: GateVerdict, speedup: float, *, kept: bool
) -> GateRunRecord:
    """The record of gate run `index` of a move, made at a state `speedup` over the start;
    `kept` is what the method's keep rule made of the verdict (the record says what the search
    did, so it does not judge the verdict again)."""
    comparison = verdict.comparison
    failing = [w for w in verdict.workloads if not w.passed]
    message = failing[0].message if failing else ("" if verdict.build.ok else verdict.build.message)
    outcome = "kept" if kept else ("slower" if verdict.passed else "rejected")
    new_speedup = speedup * comparison.ratio if kept and comparison else speedup
    return GateRunRecord(
        index=index,
        action=move.name,
        origin=move.origin,
        carrier=move.carrier.model_dump(mode="json", exclude_none=True),
        outcome=outcome,
        gate_status=verdict.status.value,
        ratio=comparison.ratio if comparison else None,
        speedup=new_speedup,
        message=message[:RUN_MESSAGE_KEPT],
        intent=move.intent,
        gate_seconds=verdict_seconds(verdict),
    )


def add_edge(
    lineage: LineageGraph,
    current: KernelSource,
    new: KernelSource,
    verdict: GateVerdict,
    move: Move,
    kept: bool,
    step: int,
) -> None:
    """Record a gated move as a forward edge of `lineage` (`kept`: the search went on from it)."""
    depth = lineage.state(current.fingerprint).depth + 1
    lineage.add_state(state_info(new, verdict, depth))
    comparison = verdict.comparison
    lineage.add_attempt(
        Attempt(
            id=f"{current.fingerprint[:8]}-{move.name}-{step}",
            parent=current.fingerprint,
            child=new.fingerprint,
            mechanism=move.name,
            origin=move.origin,
            intent=move.intent,
            sites=[],
            carriers=[move.carrier.model_dump(mode="json", exclude_none=True)],
            status=AttemptStatus.ACCEPTED if verdict.passed else AttemptStatus.REJECTED,
            gate_status=verdict.status.value,
            ratio=comparison.ratio if comparison else None,
            trial_ratios=comparison.trial_ratios if comparison else [],
            step=step,
            chosen=kept,
        )
    )
