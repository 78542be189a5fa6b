"""The Materializer: walk a naive kernel forward, one mechanism at a time, under a gate budget.

Three methods share the same gate, the same budget and the same keep rule (correct on every
workload, and faster than the current state overall and in every trial, timed interleaved):

- `skills`: retrieved skills in rank order (conditions checked before any gate run), a skill
  whose rewrite would close another's candidate sites moved after it
  (:mod:`klineage.replay.ordering`),
  each mechanism applied at every candidate site with the carrier its evidence supports (a
  vector width keeps its bytes on the target's element size); when one carrier passes the
  keep rule, the skill's other carriers, and the rule's default choice for the target, are
  gated from the same state and the fastest is kept (the others are recorded as `outranked`;
  a carrier that writes a kernel already gated there costs no run);
- `blind`: every catalog mechanism at every candidate site, one site per run, no conditions,
  no ordering beyond the catalog's;
- `memory`: past before/after edits (the skills' anchors) retrieved by text similarity to the
  current kernel and applied without conditions.

Every gate run is recorded, in a forward lineage of the same format as mining's, and counted
against the budget, whether or not the log served it from an earlier method's run.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from klineage.gate.log import GateLog
from klineage.gate.noop import same_machine_code
from klineage.gate.result import GateVerdict, geomean
from klineage.gate.sass import MachineCode
from klineage.kernel import KernelSource
from klineage.lineage import (
    LLM_PREFIX,
    Attempt,
    AttemptStatus,
    LineageGraph,
    catalog_mechanism,
    llm_rejection,
    state_info,
)
from klineage.llm.base import Provider, ProviderError
from klineage.llm.proposals import Rejection, materialize_skill
from klineage.mechanisms import (
    Carrier,
    Mechanism,
    MechanismRefused,
    Refusal,
    all_mechanisms,
)
from klineage.mining.removal import apply_everywhere
from klineage.problem import Problem
from klineage.replay.ordering import (
    closes,
    keep_options_open,
    transfer_carrier,
    without_foreign_names,
)
from klineage.replay.retrieve import bm25_scores, retrieve
from klineage.skills import Skill, render_skill_md

NO_CHANGE = "no machine code change (the same SASS and host code as the current state)"
METHODS = ("skills", "blind", "memory")
KEEP_RATIO = 1.01
"""A change is kept when current/new latency exceeds this overall, and exceeds 1 per trial."""


class ReplayBudget(BaseModel):
    """How much each method may spend on one problem."""

    gate_runs: int = Field(default=30, ge=1, description="gate runs (the start excluded)")
    wall_seconds: float = Field(default=1800.0, gt=0, description="wall time per method")


class GateRunRecord(BaseModel):
    """One gate run of a method."""

    index: int = Field(description="1-based position in the method's budget")
    action: str = Field(description="the mechanism applied")
    origin: str = Field(
        description="'skill:<id>', 'llm:<kind>:<model>:skill:<id>' (the LLM applied the "
        "skill), 'memory:<id>' or 'blind'"
    )
    carrier: dict[str, Any] = Field(default_factory=dict, description="instance choices")
    outcome: str = Field(
        description="kept, slower (correct, not faster), rejected, or outranked (kept-worthy, "
        "but another carrier of the same skill was faster from the same state)"
    )
    gate_status: str = Field(description="the gate's status")
    ratio: float | None = Field(default=None, description="current / new latency (pooled)")
    speedup: float = Field(description="speedup over the start after this run")
    message: str = Field(default="", description="the gate's message when rejected")
    gate_seconds: float = Field(
        default=0.0,
        description="what the verdict cost when it was made: nvcc plus check and time "
        "(the same whether this run made it or the log served it)",
    )


def verdict_seconds(verdict: GateVerdict) -> float:
    """The build's compile time plus every workload's check and time stages."""
    return verdict.build.compile_seconds + sum(w.seconds for w in verdict.workloads)


class MethodResult(BaseModel):
    """What one method reached on one problem."""

    method: str = Field(description="skills, blind or memory")
    problem: str = Field(description="definition name")
    runs: list[GateRunRecord] = Field(default_factory=list, description="every gate run")
    refusals: list[str] = Field(default_factory=list, description="rewrites the rules refused")
    llm_rejections: list[dict[str, Any]] = Field(
        default_factory=list,
        description="LLM answers that were never gated: state, skill, stage, reason",
    )
    start_ms: dict[str, float] = Field(description="naive kernel latency per workload")
    best_ms: dict[str, float] = Field(description="best state's latency per workload")
    reference_ms: dict[str, float] = Field(description="PyTorch reference per workload")
    speedup: float = Field(description="geometric-mean speedup over the naive kernel")
    speedup_vs_reference: float = Field(description="geometric mean of reference / best")
    runs_to_90: int = Field(description="gate runs to reach 90% of the final speedup")
    wasted: int = Field(description="gate runs rejected or not faster")
    skills_used: list[dict[str, str]] = Field(
        default_factory=list, description="kept skills and the expert each came from"
    )
    final: str = Field(description="fingerprint of the best state")
    seconds: float = Field(description="wall time of this call (short when the log served it)")
    gate_seconds: float = Field(
        default=0.0, description="what the method's verdicts cost to make, the start's included"
    )


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
    """What the LLM says it changed."""

    @property
    def name(self) -> str:
        return self.mechanism.name if self.mechanism is not None else self.action


def move_key(current: KernelSource, move: Move) -> MoveKey:
    return (
        current.fingerprint,
        f"llm:{move.skill}" if move.ask_llm else move.name,
        move.carrier.model_dump_json(),
        move.site,
    )


class Materializer:
    """Runs one method on one problem from its naive kernel."""

    def __init__(
        self,
        log: GateLog,
        skills: Sequence[Skill],
        budget: ReplayBudget | None = None,
        *,
        arch: str = "sm_90",
        on_run: Callable[[str, GateRunRecord], None] | None = None,
        llm: Provider | None = None,
        skip_no_ops: bool = True,
    ) -> None:
        self.log = log
        self.skip_no_ops = skip_no_ops
        """Never gate a move whose kernel runs the current state's machine code, and pass
        the current state's machine code to retrieval (which drops a skill whose signature
        the state already shows); False: no machine-code check at all."""
        self.skills = {s.id: s for s in skills}
        self.budget = budget or ReplayBudget()
        self.arch = arch
        self.on_run = on_run or (lambda method, record: None)
        self.llm = llm
        """Asked to apply a skill no rule can apply (the `skills` method); None: rules only."""
        self.llm_off: str | None = None
        """Why the LLM is no longer asked (a failure every later call would repeat)."""

    def run(
        self, problem: Problem, naive: KernelSource, method: str
    ) -> tuple[MethodResult, LineageGraph]:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
        started = time.monotonic()
        start = self.log.run(problem, naive)
        if not start.passed:
            raise ValueError(f"{problem.name}: the starting kernel fails its gate")
        lineage = LineageGraph(problem.name)
        lineage.add_state(state_info(naive, start, 0), root=True)
        lineage.graph.graph["method"] = method
        asks_llm = self.llm is not None and method == "skills"
        if asks_llm:
            lineage.graph.graph["llm"] = self._llm_origin()
        current, speedup, best_verdict = naive, 1.0, start
        records: list[GateRunRecord] = []
        refusals: list[str] = []
        rejections: list[dict[str, Any]] = []
        tried: set[MoveKey] = set()
        applied: set[tuple[str, str]] = set()  # (state, skill) a rule could apply
        used: list[dict[str, str]] = []
        prepared: dict[MoveKey, KernelSource | MechanismRefused] = {}
        improved = True
        while improved and len(records) < self.budget.gate_runs:
            improved = False
            moves = list(self._moves(method, problem, current, asks_llm))
            self._prebuild(current, moves, tried, self.budget.gate_runs - len(records), prepared)
            for planned in moves:
                if len(records) >= self.budget.gate_runs:
                    break
                if time.monotonic() - started > self.budget.wall_seconds:
                    break
                key = move_key(current, planned)
                if key in tried:
                    continue
                tried.add(key)
                move: Move | None = planned
                if planned.ask_llm:
                    if (current.fingerprint, planned.skill or "") in applied:
                        continue  # a rule applied this skill here: no need to ask
                    move = self._ask_llm(problem, current, planned, rejections, len(records))
                    if move is None or move.source is None:
                        continue
                    new = move.source
                else:
                    try:
                        new = self._prepared(current, planned, key, prepared)
                    except MechanismRefused as err:
                        refusals.append(f"{planned.origin} {planned.name}: {err.reason}")
                        continue
                    if planned.skill is not None:
                        applied.add((current.fingerprint, planned.skill))
                if self._no_machine_code_change(current, new):
                    # timing it would time the current binary twice: no gate run, any method
                    refusals.append(f"{planned.origin} {planned.name}: {NO_CHANGE}")
                    continue
                verdict = self.log.run(problem, new, against=current)
                tries = [(move, new, verdict)]
                if method == "skills" and move.source is None and self._keeps(verdict):
                    # the skill's other carriers, from the same state: keep the fastest
                    left = self.budget.gate_runs - len(records) - 1
                    tries += self._other_carriers(
                        problem, current, new, moves, planned, tried, prepared, refusals, left
                    )
                chosen = self._fastest_kept(tries)
                for offset, (tried_move, tried_new, tried_verdict) in enumerate(tries):
                    is_chosen = offset == chosen
                    record, kept = self._record(
                        len(records) + 1, tried_move, tried_verdict, speedup
                    )
                    if kept and not is_chosen:
                        record.outcome, record.speedup = "outranked", speedup
                    self._add_edge(
                        lineage,
                        current,
                        tried_new,
                        tried_verdict,
                        tried_move,
                        is_chosen,
                        len(records),
                    )
                    records.append(record)
                    self.on_run(method, record)
                if chosen is not None:
                    best_move, best_new, best_verdict = tries[chosen]
                    speedup = records[len(records) - len(tries) + chosen].speedup
                    current = best_new
                    if best_move.skill is not None:
                        skill = self.skills[best_move.skill]
                        used.append(
                            {
                                "skill": skill.id,
                                "source": skill.evidence.problem,
                                "origin": best_move.origin,
                            }
                        )
                    improved = True
                    break  # re-rank from the new state
        lineage.graph.graph["final"] = current.fingerprint
        if asks_llm:
            lineage.graph.graph["llm_rejections"] = rejections
        result = self._result(
            method,
            problem,
            start,
            best_verdict,
            records,
            refusals,
            used,
            current,
            time.monotonic() - started,
        )
        result.llm_rejections = rejections
        return result, lineage

    # ---- carriers -------------------------------------------------------------------------------

    @staticmethod
    def _keeps(verdict: GateVerdict) -> bool:
        """The keep rule: correct, faster overall by KEEP_RATIO and faster in every trial."""
        comparison = verdict.comparison
        return bool(
            verdict.passed
            and comparison is not None
            and comparison.ratio > KEEP_RATIO
            and all(r > 1.0 for r in comparison.trial_ratios)
        )

    @staticmethod
    def _fastest_kept(tries: list[tuple[Move, KernelSource, GateVerdict]]) -> int | None:
        kept = [i for i, (_, _, verdict) in enumerate(tries) if Materializer._keeps(verdict)]
        if not kept:
            return None
        return max(kept, key=lambda i: tries[i][2].comparison.ratio)  # type: ignore[union-attr]

    def _other_carriers(
        self,
        problem: Problem,
        current: KernelSource,
        first: KernelSource,
        moves: Sequence[Move],
        planned: Move,
        tried: set[MoveKey],
        prepared: dict[MoveKey, KernelSource | MechanismRefused],
        refusals: list[str],
        left: int,
    ) -> list[tuple[Move, KernelSource, GateVerdict]]:
        """Gate the skill's remaining carriers at `current` (the skill's evidence supports each),
        within `left` gate runs; the caller keeps the fastest. A carrier that writes the same
        kernel as one already gated here (`first`, the passing one) costs no run."""
        out: list[tuple[Move, KernelSource, GateVerdict]] = []
        written = {first.text}
        later = moves[moves.index(planned) + 1 :]
        for sibling in later:
            if len(out) >= left:
                break
            if sibling.skill != planned.skill or sibling.ask_llm or sibling.source is not None:
                continue
            key = move_key(current, sibling)
            if key in tried:
                continue
            tried.add(key)
            try:
                new = self._prepared(current, sibling, key, prepared)
            except MechanismRefused as err:
                refusals.append(f"{sibling.origin} {sibling.name}: {err.reason}")
                continue
            if new.text in written:
                continue
            written.add(new.text)
            out.append((sibling, new, self.log.run(problem, new, against=current)))
        return out

    # ---- building ahead -------------------------------------------------------------------------

    @staticmethod
    def _prepared(
        current: KernelSource,
        move: Move,
        key: MoveKey,
        prepared: dict[MoveKey, KernelSource | MechanismRefused],
    ) -> KernelSource:
        """The move applied to `current`, from the prebuild's work when it got there first."""
        outcome = prepared.pop(key, None)
        if outcome is None:
            return Materializer._apply(current, move)
        if isinstance(outcome, MechanismRefused):
            raise outcome
        return outcome

    def _prebuild(
        self,
        current: KernelSource,
        moves: Sequence[Move],
        tried: set[MoveKey],
        remaining: int,
        prepared: dict[MoveKey, KernelSource | MechanismRefused],
    ) -> None:
        """Apply the next rule moves the budget can still pay for and compile them all in
        parallel, so the gate runs that follow find their builds cached: nvcc, not the GPU,
        is the slow part of a gate run on a fast kernel."""
        builder = getattr(self.log.gate, "builder", None)
        if builder is None or remaining <= 0:
            return
        sources: dict[str, KernelSource] = {}
        for move in moves:
            if len(sources) >= remaining:
                break
            key = move_key(current, move)
            if move.ask_llm or key in tried:
                continue
            try:
                new = self._apply(current, move)
            except MechanismRefused as err:
                prepared[key] = err
                continue
            prepared[key] = new
            sources.setdefault(new.fingerprint, new)
        kernels = [current, *sources.values()]
        if len(kernels) > 1:
            builder.build_many([(k.text, k.name) for k in kernels])

    # ---- the three methods --------------------------------------------------------------------

    def _moves(
        self, method: str, problem: Problem, current: KernelSource, asks_llm: bool = False
    ) -> Iterator[Move]:
        if method == "skills":
            yield from self._skill_moves(problem, current, asks_llm)
        elif method == "blind":
            yield from self._blind_moves(current)
        else:
            yield from self._memory_moves(problem, current)

    def _carriers(self, skill: Skill, problem: Problem) -> list[Carrier]:
        """The skill's own carrier, then the others its mechanism was seen with; each first
        as it transfers to the target (vector widths keep their bytes), then as learned; choices
        written as expressions over names the target lacks are left out. Last, the rule's own
        default for the target: a choice tuned on one expert (a 512-thread block) must not hide
        a better one for this kernel, and it is gated only once a learned carrier has passed."""
        seen, carriers = set(), []
        same = [skill] + [s for s in self.skills.values() if s.mechanism == skill.mechanism]
        target = problem.kernel_path.read_text(encoding="utf-8") if problem.kernel_path else ""
        for candidate in same:
            learned = Carrier.model_validate(candidate.carrier or {})
            if target:
                learned = without_foreign_names(learned, target)
            moved = transfer_carrier(learned, candidate.scope.dtypes, problem)
            for carrier in (moved, learned):
                key = carrier.model_dump_json()
                if key not in seen:
                    seen.add(key)
                    carriers.append(carrier)
        if Carrier().model_dump_json() not in seen:
            carriers.append(Carrier())
        return carriers

    def _no_machine_code_change(self, current: KernelSource, new: KernelSource) -> bool:
        builder = getattr(self.log.gate, "builder", None)
        if builder is None or not self.skip_no_ops:
            return False
        before = builder.build(current.text, current.name).machine_code
        return same_machine_code(before, builder.build(new.text, new.name).machine_code)

    def _machine_code(self, kernel: KernelSource) -> MachineCode | None:
        """The target state's machine code with histograms (a cached build), for retrieval."""
        builder = getattr(self.log.gate, "builder", None)
        if builder is None or not self.skip_no_ops:
            return None
        return builder.build(kernel.text, kernel.name, disassemble=True).machine_code

    def _skill_moves(
        self, problem: Problem, current: KernelSource, asks_llm: bool = False
    ) -> Iterator[Move]:
        """Each retrieved skill by rule, at each carrier; with an LLM, then the LLM for it
        (asked only when no rule application of the skill went through)."""
        ranking = retrieve(
            list(self.skills.values()),
            problem,
            current,
            arch=self.arch,
            keep_unknown=asks_llm,
            machine_code=self._machine_code(current),
        )
        mechanisms = [r.mechanism for r in ranking.ranked]
        closed = closes(mechanisms, current, apply_everywhere)
        for ranked in keep_options_open(ranking.ranked, lambda r: r.mechanism, closed):
            skill = self.skills[ranked.skill]
            origin = f"skill:{skill.id}"
            mechanism = catalog_mechanism(skill.mechanism)
            if mechanism is not None:
                for carrier in self._carriers(skill, problem):
                    yield Move(mechanism, carrier, origin, skill=skill.id)
            if asks_llm:
                yield Move(
                    None, Carrier(), origin, skill=skill.id, action=skill.mechanism, ask_llm=True
                )

    def _blind_moves(self, current: KernelSource) -> Iterator[Move]:
        for mechanism in all_mechanisms():
            for site in mechanism.candidates(current):
                if site.supported:
                    yield Move(mechanism, Carrier(), "blind", site=site.id)

    def _memory_moves(self, problem: Problem, current: KernelSource) -> Iterator[Move]:
        # an edit is replayed by its mechanism's rule: one the catalog lacks cannot be
        examples = [
            s
            for s in self.skills.values()
            if s.evidence.problem != problem.name and catalog_mechanism(s.mechanism) is not None
        ]
        scores = bm25_scores(current.text, [s.anchor.before for s in examples])
        ordered = sorted(zip(scores, examples, strict=True), key=lambda p: (-p[0], p[1].id))
        for _, skill in ordered:
            yield Move(
                catalog_mechanism(skill.mechanism),
                Carrier.model_validate(skill.carrier or {}),
                f"memory:{skill.id}",
            )

    # ---- the LLM --------------------------------------------------------------------------------

    def _llm_origin(self) -> str:
        return f"{LLM_PREFIX}{self.llm.kind}:{self.llm.model}" if self.llm is not None else ""

    def _ask_llm(
        self,
        problem: Problem,
        current: KernelSource,
        move: Move,
        rejections: list[dict[str, Any]],
        step: int,
    ) -> Move | None:
        """The LLM's application of `move.skill` to `current`, as a move carrying the new
        kernel; None (and a rejection recorded) when there is no usable answer. `step` is
        the number of gate runs spent so far."""
        if self.llm is None or self.llm_off is not None or move.skill is None:
            return None
        skill = self.skills[move.skill]
        origin = self._llm_origin()
        try:
            outcome = materialize_skill(self.llm, render_skill_md(skill), current, problem)
        except ProviderError as err:  # fatal: every later call would fail the same way
            self.llm_off = err.message
            entry = llm_rejection(
                err,
                parent=current.fingerprint,
                step=step,
                origin=origin,
                reason=f"{err.message} (the LLM is not asked again on this problem)",
            )
            rejections.append({**entry, "skill": skill.id})
            return None
        if isinstance(outcome, Rejection):
            entry = llm_rejection(outcome, parent=current.fingerprint, step=step, origin=origin)
            rejections.append({**entry, "skill": skill.id})
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

    # ---- bookkeeping ----------------------------------------------------------------------------

    @staticmethod
    def _apply(current: KernelSource, move: Move) -> KernelSource:
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

    @staticmethod
    def _record(
        index: int, move: Move, verdict: GateVerdict, speedup: float
    ) -> tuple[GateRunRecord, bool]:
        comparison = verdict.comparison
        kept = Materializer._keeps(verdict)
        failing = [w for w in verdict.workloads if not w.passed]
        message = (
            failing[0].message if failing else ("" if verdict.build.ok else verdict.build.message)
        )
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
            message=message[:600],
            gate_seconds=verdict_seconds(verdict),
        ), kept

    @staticmethod
    def _add_edge(
        lineage: LineageGraph,
        current: KernelSource,
        new: KernelSource,
        verdict: GateVerdict,
        move: Move,
        kept: bool,
        step: int,
    ) -> None:
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

    @staticmethod
    def _result(
        method: str,
        problem: Problem,
        start: GateVerdict,
        best: GateVerdict,
        records: list[GateRunRecord],
        refusals: list[str],
        used: list[dict[str, str]],
        final: KernelSource,
        seconds: float,
    ) -> MethodResult:
        start_ms = {w.label: w.latency_ms for w in start.workloads if w.latency_ms}
        best_ms = {w.label: w.latency_ms for w in best.workloads if w.latency_ms}
        reference_ms = {
            w.label: w.reference_latency_ms for w in best.workloads if w.reference_latency_ms
        }
        speedup = records[-1].speedup if records else 1.0
        if records:
            speedup = max(r.speedup for r in records)
        vs_reference = geomean([reference_ms[k] / best_ms[k] for k in best_ms if k in reference_ms])
        target = 1.0 + 0.9 * (speedup - 1.0)
        runs_to_90 = next((r.index for r in records if r.speedup >= target), 0)
        return MethodResult(
            method=method,
            problem=problem.name,
            runs=records,
            refusals=refusals,
            start_ms=start_ms,
            best_ms=best_ms,
            reference_ms=reference_ms,
            speedup=speedup,
            speedup_vs_reference=vs_reference,
            runs_to_90=runs_to_90 if speedup > 1.0 else 0,
            wasted=sum(r.outcome != "kept" for r in records),
            skills_used=used,
            final=final.fingerprint,
            seconds=seconds,
            gate_seconds=verdict_seconds(start) + sum(r.gate_seconds for r in records),
        )
