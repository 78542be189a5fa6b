"""The lineage DAG and the Simplifier that walks an expert kernel backward.

A node is a kernel state keyed by fingerprint; an edge (optimized -> simplified) is one
attempt to remove one mechanism (every removable site of it), accepted when the simplified
kernel is correct on every workload, rejected otherwise, with the gate's evidence on the
edge. Attempts the rules could not even write (refusals) are kept in the graph's `refusals`.

The walk's policy, at each state:
1. try to remove every mechanism the catalog detects, each as one attempt (built in parallel,
   then gated: correct on every workload, timed interleaved against the current state);
   Sites in functions no workload runs (klineage.reachability: the entry's branches followed
   with each workload's axes) are refused: a removal there changes no measurement, and would
   make a ~1.00x skill out of code no timing covered. When removing a mechanism everywhere
   is rejected and it had several sites, each site is then tried alone (its attempt id ends
   `-site-<site id>`): the gate may need one site and not the others (gemm_bf16 needs its
   K split at K = 28672 for accuracy, and not on the M <= 16 path);
2. among the accepted removals, first those that leave no kernel holding other mechanisms
   unlaunched (a dispatch goes after the removals inside the path it drops, which can only be
   measured while that path runs); then mechanisms that no other mechanism still present
   `requires` (dependents go before their prerequisites); among those, peel the one that costs
   least speed first (highest current/simplified latency ratio); ties by name;
3. go on from that state until nothing removable is detected (`complete`), nothing removable
   passes the gate (`stuck`), or the budget of gate runs or wall time is spent (`budget`).

Before any gate run, a removal whose simplified state compiles to the same device SASS and
host code as the current state is recorded as `no_machine_code_change` with the reason
(:mod:`klineage.noop`): it costs no gate run and yields no skill. An accepted removal whose
machine-code delta does not show its mechanism's declared `signature` is flagged on its edge
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

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import networkx as nx
from pydantic import BaseModel, Field

from klineage.gate.result import GateVerdict
from klineage.gate.sass import MachineCode, delta, render_delta, signature_shown
from klineage.gatelog import GateLike, GateLog
from klineage.kernel import KernelSource
from klineage.llm.base import Provider, ProviderError
from klineage.llm.proposals import Proposal, Rejection, propose_removal
from klineage.mechanisms import Mechanism, Site, UnknownMechanism, all_mechanisms, get
from klineage.mechanisms.base import FILE_SCOPE
from klineage.noop import no_machine_code_change
from klineage.problem import Problem
from klineage.reachability import reached_from_each, run_by_workloads
from klineage.removal import Removal, remove_each_site, remove_mechanism

RULE_ORIGIN = "rule"
LLM_PREFIX = "llm:"
ANSWER_KEPT = 2000
"""Characters of a rejected LLM answer kept in the lineage (the response cache has it all)."""


def is_llm_origin(origin: str) -> bool:
    return origin.startswith(LLM_PREFIX)


def catalog_mechanism(name: str) -> Mechanism | None:
    """The catalog mechanism registered as `name`, or None (an LLM-proposed mechanism)."""
    try:
        return get(name)
    except UnknownMechanism:
        return None


def llm_mechanism_name(name: str) -> str:
    """The name an LLM gave a mechanism, as the lineage records it: snake_case, and prefixed
    `llm:` unless the catalog has a mechanism of that name."""
    slug = re.sub(r"[^a-z0-9_.]+", "_", name.strip().lower()).strip("_.") or "unnamed"
    return slug if catalog_mechanism(slug) is not None else LLM_PREFIX + slug


def slug(name: str) -> str:
    """`name` fit for a file name and an id (`llm:tiling` -> `llm-tiling`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "unnamed"


class AttemptStatus(str, Enum):
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    NO_MACHINE_CODE_CHANGE = "no_machine_code_change"
    """Refused before the gate: the same device SASS and host code as the parent."""


class Termination(str, Enum):
    COMPLETE = "complete"
    BUDGET = "budget"
    STUCK = "stuck"


class MiningBudget(BaseModel):
    """When the walk stops even if mechanisms remain."""

    gate_runs: int = Field(default=300, ge=1, description="gate runs the walk may spend")
    wall_seconds: float = Field(default=3600.0, gt=0, description="wall time for the walk")


class WorkloadRatio(BaseModel):
    """Paired timing of a parent state against a child state on one workload."""

    label: str = Field(description="the workload's axis values")
    parent_ms: float = Field(description="the parent (more optimized) state's latency")
    child_ms: float = Field(description="the child (simpler) state's latency")
    ratio: float = Field(description="parent_ms / child_ms: below 1 when the child is slower")
    trial_ratios: list[float] = Field(description="the same ratio per trial")


class Attempt(BaseModel):
    """One removal attempt: an edge of the lineage."""

    id: str = Field(description="stable id: parent fingerprint and mechanism")
    parent: str = Field(description="fingerprint of the state the mechanism was removed from")
    child: str = Field(description="fingerprint of the simplified state")
    mechanism: str = Field(
        description="registry name of the removed mechanism ('llm:<name>' for one the catalog "
        "does not know, named by the LLM that proposed it)"
    )
    origin: str = Field(default="rule", description="'rule' (the catalog) or 'llm:...'")
    intent: str = Field(
        default="", description="what the change does, in the LLM's words (LLM-origin only)"
    )
    sites: list[dict[str, Any]] = Field(description="the removed sites, in removal order")
    carriers: list[dict[str, Any]] = Field(description="the instance choices of each site")
    refused_sites: list[dict[str, Any]] = Field(
        default_factory=list, description="sites detected but not removable, with reasons"
    )
    status: AttemptStatus = Field(description="accepted: correct on every workload")
    gate_status: str = Field(description="the gate's overall status of the simplified kernel")
    message: str = Field(default="", description="why it was rejected, from the gate")
    ratio: float | None = Field(
        default=None, description="pooled parent/child latency ratio (geometric mean)"
    )
    trial_ratios: list[float] = Field(default_factory=list, description="pooled, per trial")
    workloads: list[WorkloadRatio] = Field(default_factory=list, description="per workload")
    step: int = Field(description="the walk step at which it was tried")
    chosen: bool = Field(default=False, description="whether the walk continued from it")
    no_op: dict[str, Any] | None = Field(
        default=None,
        description="for no_machine_code_change: the reason (klineage.noop.NoMachineCodeChange)",
    )
    sass_delta: list[str] = Field(
        default_factory=list,
        description="the removal's machine-code delta, parent -> child, one line per kernel "
        "whose SASS changed (klineage.gate.sass.render_delta)",
    )
    host_changed: bool | None = Field(
        default=None, description="whether the host code changed (None: not known)"
    )
    signature_shown: bool | None = Field(
        default=None,
        description="whether the delta shows the mechanism's declared signature (None: no "
        "machine code or no declared signature)",
    )


class StateInfo(BaseModel):
    """A kernel state: a node of the lineage."""

    fingerprint: str = Field(description="the kernel's fingerprint (node key)")
    source: str = Field(description="the kernel's full source")
    depth: int = Field(description="removals from the expert along the walk")
    status: str = Field(description="the gate's overall status on the workloads")
    latency_ms: dict[str, float] = Field(
        default_factory=dict, description="workload label -> latency, when timed"
    )
    reference_ms: dict[str, float] = Field(
        default_factory=dict,
        description="workload label -> PyTorch reference latency (mining times the reference "
        "for the expert's own verdict only, so later states usually have none)",
    )
    resources: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="kernel name -> registers, shared_bytes, spill_bytes, stack_bytes",
    )
    detected: list[str] = Field(default_factory=list, description="mechanisms detected here")
    machine_code: dict[str, Any] | None = Field(
        default=None,
        description="fingerprints and instruction histograms of its build "
        "(klineage.gate.sass.MachineCode); None when not known",
    )

    @property
    def code(self) -> MachineCode | None:
        """`machine_code` as the model."""
        return MachineCode.model_validate(self.machine_code) if self.machine_code else None


def state_info(
    kernel: KernelSource, verdict: GateVerdict, depth: int, code: MachineCode | None = None
) -> StateInfo:
    resources = {}
    if verdict.build.report is not None:
        for k in verdict.build.report.kernels:
            resources[k.name] = {
                "registers": k.registers,
                "shared_bytes": k.shared_bytes,
                "spill_bytes": k.spill_store_bytes + k.spill_load_bytes,
                "stack_bytes": k.stack_bytes,
            }
    return StateInfo(
        fingerprint=kernel.fingerprint,
        source=kernel.text,
        depth=depth,
        status=verdict.status.value,
        latency_ms={w.label: w.latency_ms for w in verdict.workloads if w.latency_ms},
        reference_ms={
            w.label: w.reference_latency_ms for w in verdict.workloads if w.reference_latency_ms
        },
        resources=resources,
        machine_code=code.model_dump(mode="json") if code is not None else None,
    )


class LineageGraph:
    """A networkx DiGraph of states and attempts, with JSON (node-link) persistence."""

    def __init__(self, problem: str, graph: nx.DiGraph | None = None) -> None:
        self.graph = graph if graph is not None else nx.DiGraph()
        self.graph.graph.setdefault("problem", problem)
        self.graph.graph.setdefault("refusals", [])
        self.graph.graph.setdefault("termination", None)

    # ---- building ---------------------------------------------------------------------------

    def add_state(self, info: StateInfo, *, root: bool = False) -> None:
        """Add a kernel state, keyed by its fingerprint (one already there is kept); `root`
        marks the state the walk starts from."""
        known = self.graph.nodes.get(info.fingerprint)
        # a state first met as a no-op's child and gated later keeps the gate's record
        if known is None or known["status"] == AttemptStatus.NO_MACHINE_CODE_CHANGE.value:
            self.graph.add_node(info.fingerprint, **info.model_dump(mode="json"))
        if root:
            self.graph.graph["root"] = info.fingerprint

    def add_attempt(self, attempt: Attempt) -> None:
        """Add an attempt as an edge from its parent state to its child state."""
        self.graph.add_edge(attempt.parent, attempt.child, **attempt.model_dump(mode="json"))

    def add_refusal(self, parent: str, mechanism: str, reason: str, step: int) -> None:
        """Record a site a rule refused to rewrite, with the reason."""
        entry = {"parent": parent, "mechanism": mechanism, "reason": reason, "step": step}
        self.graph.graph["refusals"].append(entry)

    def add_llm_rejection(self, entry: dict[str, Any]) -> None:
        """An LLM answer that never became an attempt (see :func:`llm_rejection`)."""
        self.graph.graph.setdefault("llm_rejections", []).append(entry)

    # ---- reading ----------------------------------------------------------------------------

    @property
    def problem(self) -> str:
        """The name of the problem this lineage was mined from."""
        return str(self.graph.graph["problem"])

    @property
    def root(self) -> str | None:
        """The fingerprint of the expert state the walk started from."""
        return self.graph.graph.get("root")

    @property
    def termination(self) -> Termination | None:
        """How the walk ended (complete, stuck, budget), None while it runs."""
        value = self.graph.graph.get("termination")
        return Termination(value) if value else None

    def state(self, fingerprint: str) -> StateInfo:
        """The kernel state with this fingerprint: its source, gate verdict and resources
        (KeyError when the lineage has no such state)."""
        return StateInfo.model_validate(self.graph.nodes[fingerprint])

    def attempts(self) -> list[Attempt]:
        """Every attempt (edge), accepted or rejected."""
        return [Attempt.model_validate(d) for _, _, d in self.graph.edges(data=True)]

    def attempts_from(self, fingerprint: str) -> list[Attempt]:
        """The attempts made from the state with this fingerprint."""
        return [
            Attempt.model_validate(d) for _, _, d in self.graph.out_edges(fingerprint, data=True)
        ]

    @property
    def refusals(self) -> list[dict[str, Any]]:
        """The sites a rule refused to rewrite, in walk order: each with its `parent` state,
        `mechanism`, `reason` and `step` (no gate run was spent on them)."""
        return list(self.graph.graph.get("refusals", []))

    @property
    def llm_rejections(self) -> list[dict[str, Any]]:
        """The LLM answers that never became an attempt, with why."""
        return list(self.graph.graph.get("llm_rejections", []))

    def main_path(self) -> list[Attempt]:
        """The chosen attempts from the expert down, in walk order."""
        chosen = [a for a in self.attempts() if a.chosen]
        return sorted(chosen, key=lambda a: a.step)

    # ---- persistence ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The lineage as node-link JSON data (what `save` writes)."""
        return nx.node_link_data(self.graph, edges="edges")

    def save(self, path: str | Path) -> Path:
        """Write the lineage as node-link JSON to `path`, atomically; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(target)
        return target

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LineageGraph:
        """The lineage in node-link JSON data (what `to_json` gives)."""
        graph = nx.node_link_graph(data, directed=True, edges="edges")
        return cls(str(graph.graph.get("problem", "")), graph)

    @classmethod
    def load(cls, path: str | Path) -> LineageGraph:
        """The lineage `mine` saved at `path` (`skills_out/lineages/<problem>.json`); a file
        that is not one raises ValueError naming it."""
        file = Path(path)
        try:
            return cls.from_json(json.loads(file.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, KeyError, TypeError, nx.NetworkXError) as err:
            raise ValueError(f"{file}: not a lineage written by `klineage mine` ({err})") from err


def llm_rejection(
    outcome: Rejection | ProviderError | Proposal,
    *,
    parent: str,
    step: int,
    origin: str,
    stage: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """Plain data for an LLM answer that never became an attempt: where, why, at which stage.

    Stages: `provider` (the call failed), `parse` (the answer is malformed or declined),
    `build`, or `duplicate` (a proposal giving the kernel a rule attempt already produced)."""
    entry: dict[str, Any] = {"parent": parent, "step": step, "origin": origin}
    if isinstance(outcome, ProviderError):
        entry.update(stage="provider", kind=outcome.kind, reason=outcome.message, mechanism=None)
        entry.update(answer="", input_tokens=0, output_tokens=0)
    else:
        entry.update(
            origin=outcome.origin,
            stage=outcome.stage if isinstance(outcome, Rejection) else "duplicate",
            reason=outcome.reason[:4000] if isinstance(outcome, Rejection) else "",
            mechanism=outcome.mechanism,
            answer=outcome.answer[:ANSWER_KEPT] if isinstance(outcome, Rejection) else "",
            input_tokens=outcome.usage.input_tokens,
            output_tokens=outcome.usage.output_tokens,
        )
    if stage is not None:
        entry["stage"] = stage
    if reason is not None:
        entry["reason"] = reason
    return entry


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

    @property
    def llm_origin(self) -> str | None:
        return f"{LLM_PREFIX}{self.llm.kind}:{self.llm.model}" if self.llm is not None else None

    def _builder(self) -> Any:
        return getattr(self.log.gate, "builder", None)

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
        limits = budget or MiningBudget()
        started = time.monotonic()
        lineage = LineageGraph(problem.name)
        self._workload_axes = [dict(w.axes) for w in problem.workloads]
        runs_at_start = self.log.runs
        verdict = self.log.run(problem, expert)
        expert_code = self._machine_code(expert)
        if not verdict.passed:
            raise ValueError(
                f"{problem.name}: the expert kernel does not pass its own gate "
                f"({verdict.status.value}): "
                + "; ".join(w.message for w in verdict.workloads if not w.passed)[:2000]
                + (verdict.build.message if not verdict.build.ok else "")
            )
        lineage.graph.graph["hardware"] = verdict.hardware
        if self.llm is not None:
            lineage.graph.graph["llm"] = self.llm_origin
            lineage.graph.graph.setdefault("llm_rejections", [])
        current = expert
        info = state_info(expert, verdict, 0, expert_code)
        info.detected = self._detected(expert)
        lineage.add_state(info, root=True)
        step = 0

        def spent() -> bool:
            return (
                self.log.runs - runs_at_start >= limits.gate_runs
                or time.monotonic() - started >= limits.wall_seconds
            )

        while True:
            self.on_event(WalkEvent("state", step, self.log.runs, current.fingerprint))
            removals = self._removals(lineage, current, step)
            proposal = self._propose(lineage, problem, current, removals, step)
            tries: list[Removal | Proposal] = [*removals, *([proposal] if proposal else [])]
            tries = self._refuse_no_ops(lineage, current, tries, step)
            if not tries:
                # naive only when nothing live is left; live sites every rule refuses: stuck
                remaining = sorted(self._live_status(current, refused_only=True))
                lineage.graph.graph["remaining"] = remaining
                finished = Termination.STUCK if remaining else Termination.COMPLETE
                lineage.graph.graph["termination"] = finished.value
                break
            accepted, out_of_budget = self._gate_tries(
                lineage,
                problem,
                current,
                tries,
                step,
                limits.gate_runs - (self.log.runs - runs_at_start),
                spent,
            )
            # a mechanism that cannot go everywhere may still go from some of its sites
            singles = [
                single
                for item in tries
                if isinstance(item, Removal)
                and len(item.sites) > 1
                and self._rejected_removal(lineage, current, item)
                for single in remove_each_site(current, item)
            ]
            singles = self._refuse_no_ops(lineage, current, list(singles), step)
            if singles and not out_of_budget:
                more, out_of_budget = self._gate_tries(
                    lineage,
                    problem,
                    current,
                    singles,
                    step,
                    limits.gate_runs - (self.log.runs - runs_at_start),
                    spent,
                )
                accepted += more
            if out_of_budget and not accepted:
                lineage.graph.graph["termination"] = Termination.BUDGET.value
                break
            if not accepted:
                lineage.graph.graph["termination"] = Termination.STUCK.value
                break
            chosen, current = self._choose(accepted, current)
            lineage.graph.edges[chosen.parent, chosen.child]["chosen"] = True
            step += 1
            if out_of_budget or spent():
                lineage.graph.graph["termination"] = Termination.BUDGET.value
                break
        lineage.graph.graph["gate_runs"] = self.log.runs - runs_at_start
        lineage.graph.graph["wall_seconds"] = time.monotonic() - started
        lineage.graph.graph["final"] = current.fingerprint
        self.on_event(WalkEvent("done", step, self.log.runs, current.fingerprint))
        return lineage

    def _gate_tries(
        self,
        lineage: LineageGraph,
        problem: Problem,
        current: KernelSource,
        tries: Sequence[Removal | Proposal],
        step: int,
        runs_left: int,
        spent: Callable[[], bool],
    ) -> tuple[list[tuple[Attempt, KernelSource]], bool]:
        """Gate each try against `current` (side by side first, with several gates); the
        accepted attempts with their children, and whether the budget ran out."""
        children = [_child_of(t) for t in tries]
        self._prebuild(children)
        if len(self.gates) > 1:  # verdicts made side by side, then read in order below
            pairs = [(child, current) for child in children[: max(0, runs_left)]]
            self.log.run_many(problem, pairs, self.gates)
        accepted: list[tuple[Attempt, KernelSource]] = []
        for item in tries:
            if spent():
                return accepted, True
            attempt = self._attempt(lineage, problem, current, item, step)
            if attempt.status is AttemptStatus.ACCEPTED:
                accepted.append((attempt, _child_of(item)))
        return accepted, False

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
        return [m.name for m in self.mechanisms if any(s.supported for s in m.detect(kernel))]

    def _removals(self, lineage: LineageGraph, current: KernelSource, step: int) -> list[Removal]:
        removals = []
        live = self._running(current)
        for mechanism in self.mechanisms:
            removal = remove_mechanism(current, mechanism, live)
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
            for site in m.detect(current)
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
            lineage.graph.graph["llm_disabled"] = err.message
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
        self, lineage: LineageGraph, entry: dict[str, Any], step: int, current: KernelSource
    ) -> None:
        lineage.add_llm_rejection(entry)
        self.on_event(
            WalkEvent(
                "llm_rejection",
                step,
                self.log.runs,
                current.fingerprint,
                message=f"{entry['stage']}: {entry['reason'][:200]}",
            )
        )

    def _attempt(
        self,
        lineage: LineageGraph,
        problem: Problem,
        current: KernelSource,
        item: Removal | Proposal,
        step: int,
    ) -> Attempt:
        attempt = self._gate_attempt(
            lineage, problem, current, _child_of(item), step, **self._fields(current, item)
        )
        self._remember(attempt, item)
        self.on_event(WalkEvent("attempt", step, self.log.runs, current.fingerprint, attempt))
        return attempt

    def _gate_attempt(
        self,
        lineage: LineageGraph,
        problem: Problem,
        current: KernelSource,
        child: KernelSource,
        step: int,
        **fields: Any,
    ) -> Attempt:
        """Gate `child` against `current` and record the edge (any origin)."""
        fields.setdefault("sites", [])
        fields.setdefault("carriers", [])
        verdict = self.log.run(problem, child, against=current)
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
            message=message[:4000],
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
        detected = {m.name: m.detect(current) for m in self.mechanisms}
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
                for s in mechanism.detect(kernel)
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


def _child_of(item: Removal | Proposal) -> KernelSource:
    return item.simplified if isinstance(item, Removal) else item.source


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
