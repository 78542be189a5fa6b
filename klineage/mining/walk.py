"""The Simplifier: walk an expert kernel backward through the gate, one mechanism at a time.

The walk is the search loop of :mod:`klineage.search` with the Simplifier as its move source.
It records a lineage (:mod:`klineage.lineage`): an edge (optimized -> simplified) is one
attempt to remove one mechanism (every removable site of it), accepted when the simplified
kernel is correct on every workload, rejected otherwise, with the gate's evidence on the
edge. Attempts the rules could not even write (refusals) are kept in the lineage's `refusals`.

The walk's policy, at each state:
1. try to remove every mechanism the catalog detects, each as one attempt (built in parallel,
   then gated: correct on every workload, timed interleaved against the current state);
   Sites in functions no workload runs (klineage.cuda.reachability: the entry's branches
   followed with each workload's axes) are refused: a removal there changes no measurement,
   and would make a ~1.00x skill out of code no timing covered. When removing a mechanism everywhere
   is rejected and it had several sites, each site is then tried alone (its attempt id ends
   `-site-<site id>`): the gate may need one site and not the others (a GEMM may need its
   K split at its largest K for accuracy, and not on its small-M path);
2. among the accepted removals, first those that leave no kernel holding other mechanisms
   unlaunched (a dispatch goes after the removals inside the path it drops, which can only be
   measured while that path runs); then mechanisms that no other mechanism still present
   `requires` (dependents go before their prerequisites); among those, peel the one that costs
   least speed first (highest current/simplified latency ratio); ties by name;
3. go on from that state until nothing removable is detected (`complete`), nothing removable
   passes the gate (`stuck`), or the budget of gate runs or wall time is spent (`budget`).

Before any gate run, a removal whose simplified state compiles to the same device SASS and
host code as the current state is recorded as `no_machine_code_change` with the reason
(:mod:`klineage.gate.noop`): it costs no gate run and yields no skill. An accepted removal
whose machine-code delta does not show its mechanism's declared `signature` is flagged on its edge
(`signature_shown: false`). A walk whose every remaining removal is such a no-op ends as if
nothing were left to remove.

With an LLM provider (`Simplifier(..., llm=provider)`), each state also gets one LLM-proposed
removal after the catalog's (:func:`klineage.llm.propose_removal`): it is gated like a rule
attempt, from the same budget, and recorded as an edge whose `origin` is `llm:<kind>:<model>`
(its mechanism is the name the model gave, prefixed `llm:` unless the catalog knows it). An
answer that cannot be used (a provider failure, a malformed answer, the same kernel a rule
already produced) is kept in the graph's `llm_rejections`, and the walk goes on without it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
from pydantic import BaseModel, Field

from klineage.cuda.reachability import reached_from_each, run_by_workloads
from klineage.gate.log import GateLike, GateLog
from klineage.gate.noop import no_machine_code_change
from klineage.gate.result import GateVerdict
from klineage.gate.sass import MachineCode, delta, render_delta, signature_shown
from klineage.kernel import KernelSource
from klineage.limits import EVENT_MESSAGE_SHOWN, EXPERT_FAILURE_SHOWN, GATE_MESSAGE_KEPT
from klineage.lineage import (
    LLM_PREFIX,
    RULE_ORIGIN,
    Attempt,
    AttemptStatus,
    LineageGraph,
    LlmRejection,
    StateInfo,
    WorkloadRatio,
    catalog_mechanism,
    is_llm_origin,
    llm_mechanism_name,
    llm_rejection,
    slug,
    state_info,
)
from klineage.llm.base import Provider, ProviderError
from klineage.llm.proposals import Proposal, Rejection, propose_removal
from klineage.mechanisms import Mechanism, Site, all_mechanisms
from klineage.mechanisms.base import FILE_SCOPE
from klineage.mining.removal import Removal, remove_each_site, remove_mechanism
from klineage.problem import Problem
from klineage.search import Ending, GateRunBudget, Tried, search

logger = logging.getLogger(__name__)


class MiningBudget(BaseModel):
    """When the walk stops even if mechanisms remain."""

    gate_runs: int = Field(default=300, ge=1, description="gate runs the walk may spend")
    wall_seconds: float = Field(default=3600.0, gt=0, description="wall time for the walk")


@dataclass(frozen=True)
class WalkEvent:
    """Progress of the walk, for live displays."""

    kind: str  # state, attempt, llm_rejection, done
    step: int
    gate_runs: int
    state: str = ""
    attempt: Attempt | None = None
    message: str = ""


def _pooled(verdict: GateVerdict) -> tuple[float | None, list[float], list[WorkloadRatio]]:
    rows = []
    for w in verdict.workloads:
        c = w.comparison
        if c is None:
            continue
        rows.append(
            WorkloadRatio(
                label=w.label,
                parent_ms=c.baseline_ms,
                child_ms=c.candidate_ms,
                ratio=c.ratio,
                trial_ratios=c.trial_ratios,
            )
        )
    pooled = verdict.comparison
    if pooled is None:
        return None, [], rows
    return pooled.ratio, pooled.trial_ratios, rows


class Simplifier:
    """Walks an expert kernel backward through the gate, one mechanism at a time."""

    def __init__(
        self,
        log: GateLog,
        mechanisms: Sequence[Mechanism] | None = None,
        *,
        on_event: Callable[[WalkEvent], None] | None = None,
        llm: Provider | None = None,
        gates: Sequence[GateLike] = (),
        skip_no_ops: bool = True,
    ) -> None:
        self.log = log
        self.skip_no_ops = skip_no_ops
        """Refuse, before any gate run, a removal that changes no machine code."""
        self.gates = list(gates)
        """With two or more (one per GPU), each state's attempts are gated in parallel."""
        self.mechanisms = list(mechanisms) if mechanisms is not None else all_mechanisms()
        self.rule_faults: dict[tuple[str, str], str] = {}
        """(mechanism, state fingerprint) -> the fault of a rule that failed on that state."""
        self.on_event = on_event or (lambda event: None)
        self.llm = llm
        """Asked for one more removal at each state, after the catalog's; None: rules only."""
        self.llm_off: str | None = None
        """Why the LLM is no longer asked (a failure every later call would repeat)."""
        self._workload_axes: list[dict[str, int]] = []
        """The axis values of the walked problem's workloads (set by `walk`)."""
        self.removals: dict[str, Removal] = {}
        """Attempt id -> its removal record (sites, carriers, states), for skills."""
        self.proposals: dict[str, Proposal] = {}
        """Attempt id -> the LLM proposal behind it (LLM-origin attempts)."""
        # the walk under way (set by `walk`), read by the move source's methods
        self._problem: Problem | None = None
        self._lineage = LineageGraph("")
        self._budget = GateRunBudget(log, 1, 1.0)

    @property
    def llm_origin(self) -> str | None:
        """`llm:<kind>:<model>` of the LLM asked, or None."""
        return f"{LLM_PREFIX}{self.llm.kind}:{self.llm.model}" if self.llm is not None else None

    def _walked(self) -> Problem:
        assert self._problem is not None, "the move source is asked during walk() only"
        return self._problem

    def _builder(self) -> Any:
        """The gate's builder under the walked problem's compile options (None without one)."""
        builder = getattr(self.log.gate, "builder", None)
        if builder is None or self._problem is None:
            return builder
        return builder.with_options(self._problem.build_options)

    def _machine_code(self, kernel: KernelSource) -> MachineCode | None:
        """The kernel's machine code with histograms (a cached build); None without a builder."""
        builder = self._builder()
        if builder is None:
            return None
        return builder.build(kernel.text, kernel.name, disassemble=True).machine_code

    def _refuse_no_ops(
        self,
        lineage: LineageGraph,
        current: KernelSource,
        tries: list[Removal | Proposal],
        step: int,
    ) -> list[Removal | Proposal]:
        """Record each try whose child runs the same machine code as `current` as a
        no_machine_code_change attempt (no gate run); the others, to be gated."""
        builder = self._builder()
        if not self.skip_no_ops or builder is None or not tries:
            return tries
        self._prebuild([_child_of(t) for t in tries])
        kept: list[Removal | Proposal] = []
        for item in tries:
            refusal = no_machine_code_change(builder, current.text, _child_of(item).text)
            if refusal is None:
                kept.append(item)
                continue
            fields = self._fields(current, item)
            child = _child_of(item)
            attempt = Attempt(
                parent=current.fingerprint,
                child=child.fingerprint,
                status=AttemptStatus.NO_MACHINE_CODE_CHANGE,
                gate_status="",
                message=refusal.message,
                step=step,
                no_op=refusal.model_dump(mode="json"),
                host_changed=False,
                **fields,
            )
            if child.fingerprint not in lineage.graph:
                depth = lineage.state(current.fingerprint).depth + 1
                code = self._machine_code(child)
                lineage.add_state(
                    StateInfo(
                        fingerprint=child.fingerprint,
                        source=child.text,
                        depth=depth,
                        status=AttemptStatus.NO_MACHINE_CODE_CHANGE.value,
                        machine_code=code.model_dump(mode="json") if code else None,
                    )
                )
            lineage.add_attempt(attempt)
            self._remember(attempt, item)
            self.on_event(WalkEvent("attempt", step, self.log.runs, current.fingerprint, attempt))
        return kept

    def _fields(self, current: KernelSource, item: Removal | Proposal) -> dict[str, Any]:
        """The edge fields that name what a try removes (id, mechanism, origin, sites)."""
        if isinstance(item, Removal):
            return {
                "id": f"{current.fingerprint[:8]}-{item.mechanism.name}"
                + (f"-site-{item.sites[0].id}" if item.alone else ""),
                "mechanism": item.mechanism.name,
                "origin": RULE_ORIGIN,
                "sites": [s.model_dump(mode="json") for s in item.sites],
                "carriers": [c.model_dump(mode="json") for c in item.carriers],
                "refused_sites": [
                    {"site": s.model_dump(mode="json"), "reason": r} for s, r in item.refused
                ],
            }
        mechanism = llm_mechanism_name(item.mechanism)
        return {
            "id": f"{current.fingerprint[:8]}-llm-{slug(mechanism.removeprefix(LLM_PREFIX))}",
            "mechanism": mechanism,
            "origin": item.origin,
            "intent": item.intent,
            "sites": [],
            "carriers": [],
        }

    def _remember(self, attempt: Attempt, item: Removal | Proposal) -> None:
        if isinstance(item, Removal):
            self.removals[attempt.id] = item
        else:
            self.proposals[attempt.id] = item

    def walk(
        self, problem: Problem, expert: KernelSource, budget: MiningBudget | None = None
    ) -> LineageGraph:
        """Walk `expert` backward until nothing removable is left, nothing removable passes
        the gate, or `budget` is spent; the lineage of every attempt."""
        limits = budget or MiningBudget()
        self._budget = GateRunBudget(self.log, limits.gate_runs, limits.wall_seconds)
        self._problem = problem
        self._lineage = lineage = LineageGraph(problem.name)
        self._workload_axes = [dict(w.axes) for w in problem.workloads]
        verdict = self.log.run(problem, expert)
        expert_code = self._machine_code(expert)
        if not verdict.passed:
            raise ValueError(
                f"{problem.name}: the expert kernel does not pass its own gate "
                f"({verdict.status.value}): "
                + "; ".join(w.message for w in verdict.workloads if not w.passed)[
                    :EXPERT_FAILURE_SHOWN
                ]
                + (verdict.build.message if not verdict.build.ok else "")
            )
        lineage.meta.hardware = verdict.hardware
        if self.llm is not None:
            lineage.meta.llm = self.llm_origin
            lineage.meta.llm_rejections = []
        info = state_info(expert, verdict, 0, expert_code)
        info.detected = self._detected(expert)
        lineage.add_state(info, root=True)
        end = search(problem, expert, self, self.log, self._budget, observers=[self])
        lineage.meta.termination = end.ending
        lineage.meta.gate_runs = self._budget.used()
        lineage.meta.wall_seconds = self._budget.elapsed()
        lineage.meta.final = end.state.fingerprint
        self.on_event(WalkEvent("done", end.steps, self.log.runs, end.state.fingerprint))
        return lineage

    # ---- the move source the search loop asks (klineage.search.MoveSource) ------------------

    def moves(
        self, step: int, state: KernelSource, tried: Sequence[Try]
    ) -> Iterator[Removal | Proposal]:
        """Every removal the catalog can write at `state` (and the LLM's, if asked), no-ops
        recorded and left out; then, for each mechanism whose removal everywhere was rejected,
        its sites one at a time: the gate may need one site and not the others."""
        lineage, problem = self._lineage, self._walked()
        removals = self._removals(lineage, state, step)
        proposal = self._propose(lineage, problem, state, removals, step)
        tries = self._refuse_no_ops(
            lineage, state, [*removals, *([proposal] if proposal else [])], step
        )
        if not tries:
            return
        self._gate_ahead(state, tries)
        yield from tries
        singles: list[Removal | Proposal] = [
            single
            for item in tries
            if isinstance(item, Removal)
            and len(item.sites) > 1
            and self._rejected_removal(lineage, state, item)
            for single in remove_each_site(state, item)
        ]
        singles = self._refuse_no_ops(lineage, state, singles, step)
        if singles and not self._budget.spent():
            self._gate_ahead(state, singles)
        yield from singles

    def realize(
        self, state: KernelSource, move: Removal | Proposal
    ) -> tuple[Removal | Proposal, KernelSource]:
        """The simplified kernel, already written by the removal or the LLM."""
        return move, _child_of(move)

    def accepts(self, verdict: GateVerdict) -> bool:
        """A removal is accepted when the simpler kernel is correct on every workload."""
        return verdict.passed

    def gated(self, step: int, state: KernelSource, tried: Try) -> Attempt:
        """Record the attempt as an edge of the lineage, with its child state."""
        attempt = self._attempt_of(state, tried.child, tried.verdict, step, tried.move)
        self._remember(attempt, tried.move)
        self.on_event(WalkEvent("attempt", step, self.log.runs, state.fingerprint, attempt))
        return attempt

    def choose(self, state: KernelSource, accepted: Sequence[Try]) -> Try:
        """The removal to walk on from (see :meth:`_choose`)."""
        pairs = [(_attempt(one), one.child) for one in accepted]
        chosen, _ = self._choose(pairs, state)
        return next(one for one in accepted if one.record is chosen)

    def settled(self, step: int, state: KernelSource, tried: Sequence[Try], chosen: Try) -> None:
        """Mark the chosen attempt on the main path."""
        attempt = _attempt(chosen)
        self._lineage.graph.edges[attempt.parent, attempt.child]["chosen"] = True

    def nothing_to_try(self, state: KernelSource) -> Ending:
        """Complete when no live mechanism is left; stuck when every rule refuses one."""
        remaining = sorted(self._live_status(state, refused_only=True))
        self._lineage.meta.remaining = remaining
        return Ending.STUCK if remaining else Ending.COMPLETE

    def on_state(self, step: int, state: KernelSource) -> None:
        """Tell the live display the walk is at a new state."""
        self.on_event(WalkEvent("state", step, self.log.runs, state.fingerprint))

    def on_end(self, step: int, state: KernelSource, ending: Ending) -> None:
        """Nothing to do: :meth:`walk` says `done` once the lineage is complete."""

    def _gate_ahead(self, state: KernelSource, tries: Sequence[Removal | Proposal]) -> None:
        """Build the tries' kernels in parallel, and with several gates make their verdicts
        side by side (as many as the budget allows); the loop then reads them from the log."""
        children = [_child_of(t) for t in tries]
        self._prebuild(children)
        if len(self.gates) > 1:
            pairs = [(child, state) for child in children[: max(0, self._budget.left())]]
            self.log.run_many(self._walked(), pairs, self.gates)

    def _rejected_removal(
        self, lineage: LineageGraph, current: KernelSource, removal: Removal
    ) -> bool:
        """Whether the gate rejected `removal` as a whole at `current`."""
        edge = (current.fingerprint, removal.simplified.fingerprint)
        if not lineage.graph.has_edge(*edge):
            return False
        return lineage.graph.edges[edge]["status"] == AttemptStatus.REJECTED.value

    # ---- one step ---------------------------------------------------------------------------

    def _running(self, kernel: KernelSource) -> set[str] | None:
        """The functions some workload of the problem being walked runs (None: unknown)."""
        return run_by_workloads(kernel, self._workload_axes)

    def _kernels_with_sites(self, kernel: KernelSource, sites: Sequence[Site]) -> set[str]:
        """The running `__global__` functions that hold, themselves or in what they call, one
        of the removable `sites`. Kernels, not helpers: a rewrite may inline a helper away,
        but a kernel left unlaunched is a dropped path."""
        holding = {site.function for site in sites if site.supported}
        running = self._running(kernel)
        kernels = [f.name for f in kernel.parsed.kernels if running is None or f.name in running]
        reach = reached_from_each(kernel, kernels)
        return {name for name in kernels if reach[name] & holding}

    def _detected(self, kernel: KernelSource) -> list[str]:
        return [m.name for m in self.mechanisms if any(s.supported for s in self._sites(m, kernel))]

    def _sites(self, mechanism: Mechanism, kernel: KernelSource) -> list[Site]:
        """`mechanism.detect(kernel)`; a rule that fails on this code is skipped, not fatal: a
        walk on someone else's kernel goes on without it (the fault is kept and logged)."""
        try:
            return mechanism.detect(kernel)
        except Exception as err:
            self._fault(mechanism, kernel, "detect", err)
            return []

    def _fault(
        self, mechanism: Mechanism, kernel: KernelSource, action: str, err: Exception
    ) -> str:
        reason = (
            f"internal error in the rule's {action} ({type(err).__name__}: {err}); the walk "
            "went on without it at this state (please report it with the kernel)"
        )
        key = (mechanism.name, kernel.fingerprint)
        if key not in self.rule_faults:
            self.rule_faults[key] = reason
            logger.warning("%s at %s: %s", mechanism.name, kernel.fingerprint[:10], reason)
        return reason

    def _removals(self, lineage: LineageGraph, current: KernelSource, step: int) -> list[Removal]:
        removals = []
        live = self._running(current)
        for mechanism in self.mechanisms:
            try:
                removal = remove_mechanism(current, mechanism, live)
            except Exception as err:
                reason = self._fault(mechanism, current, "removal", err)
                lineage.add_refusal(current.fingerprint, mechanism.name, reason, step)
                continue
            for site, reason in removal.refused:
                lineage.add_refusal(current.fingerprint, mechanism.name, f"{site}: {reason}", step)
            if removal.changed:
                removals.append(removal)
        return removals

    def _prebuild(self, kernels: list[KernelSource]) -> None:
        builder = self._builder()
        if builder is not None and len(kernels) > 1:
            builder.build_many([(k.text, k.name) for k in kernels], disassemble=True)

    def _propose(
        self,
        lineage: LineageGraph,
        problem: Problem,
        current: KernelSource,
        removals: list[Removal],
        step: int,
    ) -> Proposal | None:
        """Ask the LLM for one more removal; None when there is no usable answer (recorded)."""
        if self.llm is None or self.llm_off is not None:
            return None
        origin = self.llm_origin or ""
        detected = [
            {
                "name": m.name,
                "intent": m.intent,
                "snippet": site.snippet,
                "start_line": site.start_line,
                "function": site.function,
            }
            for m in self.mechanisms
            for site in self._sites(m, current)
        ]
        try:
            outcome = propose_removal(self.llm, current, problem, detected)
        except ProviderError as err:  # fatal: every later call would fail the same way
            self.llm_off = err.message
            entry = llm_rejection(
                err,
                parent=current.fingerprint,
                step=step,
                origin=origin,
                reason=f"{err.message} (the LLM is not asked again in this walk)",
            )
            lineage.meta.llm_disabled = err.message
            self._rejected(lineage, entry, step, current)
            return None
        if isinstance(outcome, Rejection):
            entry = llm_rejection(outcome, parent=current.fingerprint, step=step, origin=origin)
            self._rejected(lineage, entry, step, current)
            return None
        child = outcome.source.fingerprint
        same = next((r for r in removals if r.simplified.fingerprint == child), None)
        reason = ""
        if same is not None:
            reason = f"the same kernel as the catalog's removal of {same.mechanism.name}"
        elif child in lineage.graph and nx.has_path(lineage.graph, child, current.fingerprint):
            reason = "the kernel of an earlier state of this walk (the lineage would loop)"
        if reason:
            entry = llm_rejection(
                outcome, parent=current.fingerprint, step=step, origin=origin, reason=reason
            )
            self._rejected(lineage, entry, step, current)
            return None
        return outcome

    def _rejected(
        self, lineage: LineageGraph, entry: LlmRejection, step: int, current: KernelSource
    ) -> None:
        lineage.add_llm_rejection(entry)
        self.on_event(
            WalkEvent(
                "llm_rejection",
                step,
                self.log.runs,
                current.fingerprint,
                message=f"{entry.stage}: {entry.reason[:EVENT_MESSAGE_SHOWN]}",
            )
        )

    def _attempt_of(
        self,
        current: KernelSource,
        child: KernelSource,
        verdict: GateVerdict,
        step: int,
        item: Removal | Proposal,
    ) -> Attempt:
        """The edge for a gated try (any origin), recorded with its child state."""
        lineage = self._lineage
        fields = self._fields(current, item)
        ratio, trials, rows = _pooled(verdict)
        accepted = verdict.passed
        parent = lineage.state(current.fingerprint)
        code = self._machine_code(child) if verdict.build.ok else None
        info = state_info(child, verdict, parent.depth + 1, code)
        if accepted:
            info.detected = self._detected(child)
        lineage.add_state(info)
        fields.update(_machine_code_evidence(fields["mechanism"], parent.code, code))
        failing = [w for w in verdict.workloads if not w.passed]
        message = verdict.build.message if not verdict.build.ok else ""
        if failing:
            message = f"{failing[0].label}: {failing[0].message}"
        attempt = Attempt(
            parent=current.fingerprint,
            child=child.fingerprint,
            status=AttemptStatus.ACCEPTED if accepted else AttemptStatus.REJECTED,
            gate_status=verdict.status.value,
            message=message[:GATE_MESSAGE_KEPT],
            ratio=ratio,
            trial_ratios=trials,
            workloads=rows,
            step=step,
            **fields,
        )
        lineage.add_attempt(attempt)
        return attempt

    def _choose(
        self, accepted: list[tuple[Attempt, KernelSource]], current: KernelSource
    ) -> tuple[Attempt, KernelSource]:
        detected = {m.name: self._sites(m, current) for m in self.mechanisms}
        present = {name for name, sites in detected.items() if sites}
        required = {need for m in self.mechanisms if m.name in present for need in m.requires}
        holding = self._kernels_with_sites(
            current, [site for sites in detected.values() for site in sites]
        )
        removable = self._live_status(current, refused_only=False)

        def rank(pair: tuple[Attempt, KernelSource]) -> tuple[int, int, int, float, int, str]:
            attempt, child = pair
            is_prerequisite = 1 if attempt.mechanism in required else 0
            # a removal that leaves a kernel holding other mechanisms unlaunched goes after the
            # removals inside that kernel: their effect can only be measured while it runs
            live = self._running(child)
            kills = 1 if live is not None and holding - live else 0
            # a removal after which another mechanism's live sites are still there but every
            # rule refuses them goes after that mechanism: taking it first strands the walk
            closes = 1 if self._closes(attempt.mechanism, removable, child) else 0
            cost = -(attempt.ratio if attempt.ratio is not None else 0.0)
            # on a tie, a rule's removal (reproducible without the LLM) goes first
            origin = int(is_llm_origin(attempt.origin))
            return (kills, closes, is_prerequisite, cost, origin, attempt.mechanism)

        return min(accepted, key=rank)

    def _live_status(self, kernel: KernelSource, *, refused_only: bool) -> set[str]:
        """Mechanisms with sites in code some workload runs: those with a removable site, or
        (`refused_only`) those whose every live site is refused."""
        running = self._running(kernel)
        found = set()
        for mechanism in self.mechanisms:
            sites = [
                s
                for s in self._sites(mechanism, kernel)
                if running is None or s.function == FILE_SCOPE or s.function in running
            ]
            if not sites:
                continue
            removable = any(s.supported for s in sites)
            if removable != refused_only:
                found.add(mechanism.name)
        return found

    def _closes(self, mechanism: str, removable: set[str], child: KernelSource) -> set[str]:
        """The mechanisms removable before this removal whose live sites are all refused after
        it (a mechanism gone from the child is not closed: the removal took it along)."""
        stranded = self._live_status(child, refused_only=True)
        return (removable - {mechanism}) & stranded


Try = Tried[Removal | Proposal, Attempt]
"""A removal (rule or LLM) the walk gated, with its lineage edge."""


def _child_of(item: Removal | Proposal) -> KernelSource:
    return item.simplified if isinstance(item, Removal) else item.source


def _attempt(tried: Try) -> Attempt:
    assert tried.record is not None, "gated() records every try"
    return tried.record


def _machine_code_evidence(
    mechanism: str, parent: MachineCode | None, child: MachineCode | None
) -> dict[str, Any]:
    """An edge's machine-code fields: the SASS delta, host change, signature shown."""
    if parent is None or child is None:
        return {}
    known = catalog_mechanism(mechanism)
    declared = known.signature if known is not None else ()
    shown = signature_shown(declared, parent, child) if declared else None
    return {
        "sass_delta": render_delta(delta(parent, child)),
        "host_changed": not parent.same_host(child),
        "signature_shown": shown if parent.disassembled and child.disassembled else None,
    }
