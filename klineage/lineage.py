"""The lineage: a DAG of kernel states and the attempts between them, as node-link JSON.

A node is a kernel state keyed by fingerprint, with its source and gate verdict; an edge
(parent -> child) is one attempt: a mechanism removed (mining walks backward, optimized ->
simplified) or applied (replay walks forward), accepted or rejected, with the gate's evidence.
Attempts the rules could not even write (refusals) are kept in the graph's `refusals`, LLM
answers that never became an attempt in its `llm_rejections`. Mining's walk is
:mod:`klineage.mining.walk`; replay's methods are :mod:`klineage.replay.methods`.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from pathlib import Path
from typing import Any

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from klineage.gate.profile import Profile
from klineage.gate.result import GateVerdict
from klineage.gate.sass import MachineCode
from klineage.kernel import KernelSource
from klineage.limits import GATE_MESSAGE_KEPT, LLM_ANSWER_KEPT
from klineage.llm.base import ProviderError
from klineage.llm.proposals import Proposal, Rejection
from klineage.mechanisms import Mechanism, UnknownMechanism, get
from klineage.search import Ending

RULE_ORIGIN = "rule"
LLM_PREFIX = "llm:"


def is_llm_origin(origin: str) -> bool:
    """Whether an attempt's origin names an LLM (`llm:<kind>:<model>...`)."""
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
    """What became of an attempt."""

    ACCEPTED = "accepted"
    """The gate passed the simpler kernel on every workload."""
    REJECTED = "rejected"
    """The gate failed it (the message says where)."""
    NO_MACHINE_CODE_CHANGE = "no_machine_code_change"
    """Refused before the gate: the same device SASS and host code as the parent."""


Termination = Ending
"""How a walk ended: the search's :class:`~klineage.search.Ending` (complete, budget, stuck)."""


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
        description="for no_machine_code_change: the reason "
        "(klineage.gate.noop.NoMachineCodeChange)",
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

    profile: Profile | None = Field(
        default=None,
        description="the profile stage's counters and bottleneck class, when the gate "
        "profiled this state",
    )

    @property
    def code(self) -> MachineCode | None:
        """`machine_code` as the model."""
        return MachineCode.model_validate(self.machine_code) if self.machine_code else None


def state_info(
    kernel: KernelSource, verdict: GateVerdict, depth: int, code: MachineCode | None = None
) -> StateInfo:
    """The lineage node for a gated kernel: its source, verdict, latencies and resources."""
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
        profile=verdict.profile if verdict.profile and verdict.profile.profiled else None,
    )


class RefusedSite(BaseModel):
    """A site a rule refused to rewrite: where, which mechanism, why."""

    parent: str = Field(description="fingerprint of the state the rule was asked at")
    mechanism: str = Field(description="the mechanism whose rule refused")
    reason: str = Field(description="the site and the rule's reason")
    step: int = Field(description="the walk step at which it was asked")


class LlmRejection(BaseModel):
    """An LLM answer that never became an attempt: where, why, at which stage."""

    parent: str = Field(description="fingerprint of the state the LLM was asked at")
    step: int = Field(description="the walk step (replay: the gate runs spent so far)")
    origin: str = Field(description="'llm:<kind>:<model>' that answered")
    stage: str = Field(
        description="provider (the call failed), parse (the answer is malformed or declined), "
        "build, or duplicate (the kernel a rule attempt already produced)"
    )
    kind: str | None = Field(default=None, description="the provider failure's kind (provider)")
    reason: str = Field(description="why the answer was not used")
    mechanism: str | None = Field(description="the mechanism the answer named, if any")
    answer: str = Field(description="the answer's start (the response cache has it all)")
    input_tokens: int = Field(description="tokens of the prompt")
    output_tokens: int = Field(description="tokens of the answer")
    skill: str | None = Field(default=None, description="replay: the skill it was to apply")


class LineageMeta(BaseModel):
    """What a lineage says about itself: the graph attributes of its node-link JSON. A field
    is written once it is set (a mining lineage has no `method`, a replay lineage no
    `gate_runs`), so the files stay as small as they were."""

    model_config = ConfigDict(extra="forbid")

    problem: str = Field(description="the definition name of the problem walked")
    root: str | None = Field(default=None, description="fingerprint of the state walked from")
    method: str | None = Field(default=None, description="replay: skills, blind or memory")
    termination: Termination | None = Field(
        default=None, description="mining: how the walk ended (None while it runs)"
    )
    refusals: list[RefusedSite] = Field(
        default_factory=list, description="sites the rules refused to rewrite"
    )
    remaining: list[str] | None = Field(
        default=None,
        description="mining: mechanisms still live when nothing more was removable, every "
        "site refused (why the walk is stuck rather than complete)",
    )
    hardware: str | None = Field(default=None, description="mining: the GPU that judged it")
    llm: str | None = Field(default=None, description="'llm:<kind>:<model>' asked, if any")
    llm_disabled: str | None = Field(
        default=None, description="why the LLM was no longer asked (a fatal provider error)"
    )
    llm_rejections: list[LlmRejection] | None = Field(
        default=None, description="LLM answers that never became an attempt"
    )
    gate_runs: int | None = Field(default=None, description="mining: gate runs the walk spent")
    wall_seconds: float | None = Field(default=None, description="mining: the walk's wall time")
    final: str | None = Field(default=None, description="fingerprint of the last state reached")
    reextracted: str | None = Field(
        default=None,
        description="set when the skills were re-extracted on a CPU from this lineage "
        "(bench/reextract.py): what was relabelled",
    )


class LineageGraph:
    """A networkx DiGraph of states and attempts, with JSON (node-link) persistence."""

    def __init__(
        self, problem: str, graph: nx.DiGraph | None = None, meta: LineageMeta | None = None
    ) -> None:
        self.graph = graph if graph is not None else nx.DiGraph()
        """States (nodes, keyed by fingerprint) and attempts (edges), as plain data."""
        self.meta = meta or LineageMeta(problem=problem, refusals=[], termination=None)
        """What the lineage says about itself (written as the JSON's `graph`)."""

    # ---- building ---------------------------------------------------------------------------

    def add_state(self, info: StateInfo, *, root: bool = False) -> None:
        """Add a kernel state, keyed by its fingerprint (one already there is kept); `root`
        marks the state the walk starts from."""
        known = self.graph.nodes.get(info.fingerprint)
        # a state first met as a no-op's child and gated later keeps the gate's record
        if known is None or known["status"] == AttemptStatus.NO_MACHINE_CODE_CHANGE.value:
            self.graph.add_node(info.fingerprint, **info.model_dump(mode="json"))
        if root:
            self.meta.root = info.fingerprint

    def set_profile(self, fingerprint: str, profile: Profile) -> None:
        """Keep a state's profile (made after it was added) in the lineage."""
        self.graph.nodes[fingerprint]["profile"] = profile.model_dump(mode="json")

    def add_attempt(self, attempt: Attempt) -> None:
        """Add an attempt as an edge from its parent state to its child state."""
        self.graph.add_edge(attempt.parent, attempt.child, **attempt.model_dump(mode="json"))

    def add_refusal(self, parent: str, mechanism: str, reason: str, step: int) -> None:
        """Record a site a rule refused to rewrite, with the reason."""
        refused = RefusedSite(parent=parent, mechanism=mechanism, reason=reason, step=step)
        self.meta.refusals.append(refused)

    def add_llm_rejection(self, entry: LlmRejection) -> None:
        """An LLM answer that never became an attempt (see :func:`llm_rejection`)."""
        if self.meta.llm_rejections is None:
            self.meta.llm_rejections = []
        self.meta.llm_rejections.append(entry)

    # ---- reading ----------------------------------------------------------------------------

    @property
    def problem(self) -> str:
        """The name of the problem this lineage was mined from."""
        return self.meta.problem

    @property
    def root(self) -> str | None:
        """The fingerprint of the expert state the walk started from."""
        return self.meta.root

    @property
    def termination(self) -> Termination | None:
        """How the walk ended (complete, stuck, budget), None while it runs."""
        return self.meta.termination

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
    def refusals(self) -> list[RefusedSite]:
        """The sites a rule refused to rewrite, in walk order: each with its parent state,
        mechanism, reason and step (no gate run was spent on them)."""
        return list(self.meta.refusals or [])

    @property
    def llm_rejections(self) -> list[LlmRejection]:
        """The LLM answers that never became an attempt, with why."""
        return list(self.meta.llm_rejections or [])

    def main_path(self) -> list[Attempt]:
        """The chosen attempts from the expert down, in walk order."""
        chosen = [a for a in self.attempts() if a.chosen]
        return sorted(chosen, key=lambda a: a.step)

    # ---- persistence ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The lineage as node-link JSON data (what `save` writes)."""
        data: dict[str, Any] = nx.node_link_data(self.graph, edges="edges")
        data["graph"] = self.meta.model_dump(mode="json", exclude_unset=True)
        return data

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
        meta = LineageMeta.model_validate(graph.graph)
        graph.graph.clear()  # the typed `meta` is the one copy
        return cls(meta.problem, graph, meta)

    @classmethod
    def load(cls, path: str | Path) -> LineageGraph:
        """The lineage `mine` saved at `path` (`skills_out/lineages/<problem>.json`); a file
        that is not one raises ValueError naming it."""
        file = Path(path)
        try:
            return cls.from_json(json.loads(file.read_text(encoding="utf-8")))
        except (
            json.JSONDecodeError,
            KeyError,
            TypeError,
            ValidationError,
            nx.NetworkXError,
        ) as err:
            raise ValueError(f"{file}: not a lineage written by `klineage mine` ({err})") from err


def llm_rejection(
    outcome: Rejection | ProviderError | Proposal,
    *,
    parent: str,
    step: int,
    origin: str,
    stage: str | None = None,
    reason: str | None = None,
) -> LlmRejection:
    """An LLM answer that never became an attempt: where, why, at which stage.

    Stages: `provider` (the call failed), `parse` (the answer is malformed or declined),
    `build`, or `duplicate` (a proposal giving the kernel a rule attempt already produced)."""
    if isinstance(outcome, ProviderError):
        entry = LlmRejection(
            parent=parent,
            step=step,
            origin=origin,
            stage="provider",
            kind=outcome.kind,
            reason=outcome.message,
            mechanism=None,
            answer="",
            input_tokens=0,
            output_tokens=0,
        )
    else:
        entry = LlmRejection(
            parent=parent,
            step=step,
            origin=outcome.origin,
            stage=outcome.stage if isinstance(outcome, Rejection) else "duplicate",
            reason=outcome.reason[:GATE_MESSAGE_KEPT] if isinstance(outcome, Rejection) else "",
            mechanism=outcome.mechanism,
            answer=outcome.answer[:LLM_ANSWER_KEPT] if isinstance(outcome, Rejection) else "",
            input_tokens=outcome.usage.input_tokens,
            output_tokens=outcome.usage.output_tokens,
        )
    if stage is not None:
        entry.stage = stage
    if reason is not None:
        entry.reason = reason
    return entry
