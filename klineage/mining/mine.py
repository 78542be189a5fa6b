"""`mine`: expert kernel -> lineage -> conditions -> skills -> round trip -> skills_out/.

    from klineage import mine
    report = mine("expert_kernels/softmax", out="skills_out")

Every gate verdict goes through an append-only log under `out/gatelog/`, so a killed run
resumes (`resume=True`) without repeating finished work.

With `llm=provider`, the walk also gates one LLM-proposed removal per state (see
:mod:`klineage.lineage`). A skill from an accepted LLM-origin edge gets the conditions learned
from probes; static conditions and a round trip need a rule, so they come only when the
mechanism the LLM named is in the catalog (else `verified` stays None, and the note says why).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from klineage.conditions import Prose, conditions_to_json, merge_conditions, parse_condition
from klineage.gate.build import specific_arch_for
from klineage.gate.log import GateLike, GateLog
from klineage.gate.result import GateVerdict
from klineage.gate.sass import (
    delta,
    feature_counts,
    render_delta,
    short_name,
    signature_shown,
)
from klineage.kernel import KernelSource
from klineage.lineage import (
    Attempt,
    AttemptStatus,
    LineageGraph,
    MiningBudget,
    Simplifier,
    StateInfo,
    WalkEvent,
    catalog_mechanism,
    is_llm_origin,
    slug,
)
from klineage.llm.base import Provider
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, Site
from klineage.mechanisms.recall import MECHANISMS_FILE
from klineage.mining.inference import infer_condition, why_no_condition
from klineage.mining.removal import Removal, reapply
from klineage.problem import Problem, load_problem
from klineage.replay.methods import apply_everywhere
from klineage.skills import (
    Anchor,
    Evidence,
    KernelResourceChange,
    MachineCodeEvidence,
    Risk,
    Scope,
    Skill,
    SkillLibrary,
    anchor_of,
    effect_of,
    unified_diff,
)


class MineReport(BaseModel):
    """What mining one problem did."""

    problem: str = Field(description="definition name")
    folder: str = Field(description="the problem folder")
    termination: str = Field(description="complete, budget or stuck")
    walk_gate_runs: int = Field(description="gate runs spent by the walk")
    probe_gate_runs: int = Field(description="gate runs spent checking probes")
    round_trip_gate_runs: int = Field(description="gate runs spent on round trips")
    cached_verdicts: int = Field(description="verdicts served from the log (resume)")
    wall_seconds: float = Field(description="wall time of the whole mining")
    accepted: int = Field(description="accepted attempts")
    rejected: int = Field(description="rejected attempts")
    refusals: int = Field(description="sites the rules could not rewrite")
    remaining: list[str] = Field(
        default_factory=list,
        description="mechanisms still in code the workloads run when the walk ended, every "
        "site refused by its rule (the reason the walk is stuck rather than complete)",
    )
    steps: int = Field(description="removals on the main path")
    skills: int = Field(description="skills written")
    verified: int = Field(
        description="skills whose round trip reproduced a measured gain (Skill.verified)"
    )
    recall: float | None = Field(description="share of mechanisms.json entries that became skills")
    missed: list[str] = Field(default_factory=list, description="listed mechanisms with no skill")
    llm_attempts: int = Field(default=0, description="attempts proposed by the LLM (gated)")
    llm_accepted: int = Field(default=0, description="of those, accepted by the gate")
    llm_rejections: int = Field(
        default=0, description="LLM answers never gated (provider, parse, duplicate)"
    )
    no_machine_code_change: int = Field(
        default=0,
        description="attempts refused before the gate: the same device SASS and host code as "
        "their parent (each a gate run saved)",
    )
    shared_verdicts: int = Field(
        default=0,
        description="verdicts taken from an earlier one on the same machine code (gate runs saved)",
    )
    signature_missing: list[str] = Field(
        default_factory=list,
        description="skills whose SASS delta does not show their mechanism's declared signature",
    )


def mine(
    problem_dir: str | Path,
    out: str | Path = "skills_out",
    *,
    gate: GateLike | None = None,
    budget: MiningBudget | None = None,
    resume: bool = True,
    on_event: Callable[[WalkEvent], None] | None = None,
    llm: Provider | None = None,
    gates: Sequence[GateLike] = (),
    devices: Sequence[int] | None = None,
    skip_no_ops: bool = True,
    reuse_unaudited: bool = False,
) -> MineReport:
    """Mine one expert problem folder into `out`. Without `gate`, one gate is opened per GPU
    in `devices` (default: every visible GPU). With several `gates`, each state's attempts are
    gated in parallel, one per GPU. With `llm`, each state also gets an LLM-proposed removal
    (same gate, same budget). With `skip_no_ops` (the default), a removal that changes no
    machine code is refused before the gate; a verdict on the same machine code as an earlier
    one (this run's, or one logged before whose source the previous lineage holds) is shared.
    With `reuse_unaudited`, verdicts logged before the timing audits are served too (to
    re-derive old results without a GPU; a run that measures leaves it off)."""
    if gate is None:
        from klineage.gate.pool import open_gates

        # mining pairs every timed verdict with its parent state: the reference is timed only
        # for the expert's own verdict
        with open_gates(devices, time_reference="unpaired") as opened:
            return mine(
                problem_dir,
                out,
                gate=opened[0],
                budget=budget,
                resume=resume,
                on_event=on_event,
                llm=llm,
                gates=opened,
                skip_no_ops=skip_no_ops,
                reuse_unaudited=reuse_unaudited,
            )
    started = time.monotonic()
    problem = load_problem(problem_dir)
    if problem.kernel_path is None:
        raise FileNotFoundError(f"{problem.root}: no kernel.cu to mine")
    expert = KernelSource.from_file(problem.kernel_path)
    root = Path(out)
    log = GateLog(
        root / "gatelog" / f"{problem.name}.jsonl",
        gate,
        resume=resume,
        share=skip_no_ops,
        accept_older=reuse_unaudited,
    )
    previous = root / "lineages" / f"{problem.name}.json"
    if resume and skip_no_ops and previous.is_file():
        # the old verdicts' sources, so a state with the same machine code can reuse them
        old = LineageGraph.load(previous)
        log.learn_sources({fp: old.state(fp).source for fp in old.graph.nodes})
    simplifier = Simplifier(log, on_event=on_event, llm=llm, gates=gates, skip_no_ops=skip_no_ops)
    lineage = simplifier.walk(problem, expert, budget)
    walk_runs = log.runs

    skills, probe_runs, trip_runs = _skills(problem, lineage, simplifier, log)
    lineage.save(root / "lineages" / f"{problem.name}.json")
    SkillLibrary.update_problem(root, problem.name, skills)

    attempts = lineage.attempts()
    recall, missed = _recall(problem, skills)
    return MineReport(
        problem=problem.name,
        folder=str(problem_dir),
        termination=lineage.termination.value if lineage.termination else "unknown",
        walk_gate_runs=walk_runs,
        probe_gate_runs=probe_runs,
        round_trip_gate_runs=trip_runs,
        cached_verdicts=log.hits,
        wall_seconds=time.monotonic() - started,
        accepted=sum(a.status is AttemptStatus.ACCEPTED for a in attempts),
        rejected=sum(a.status is AttemptStatus.REJECTED for a in attempts),
        refusals=len(lineage.graph.graph["refusals"]),
        remaining=list(lineage.graph.graph.get("remaining", [])),
        steps=len(lineage.main_path()),
        skills=len(skills),
        verified=sum(bool(s.verified) for s in skills),
        recall=recall,
        missed=missed,
        llm_attempts=sum(is_llm_origin(a.origin) for a in attempts),
        llm_accepted=sum(
            is_llm_origin(a.origin) and a.status is AttemptStatus.ACCEPTED for a in attempts
        ),
        llm_rejections=len(lineage.llm_rejections),
        no_machine_code_change=sum(
            a.status is AttemptStatus.NO_MACHINE_CODE_CHANGE for a in attempts
        ),
        shared_verdicts=log.shared,
        signature_missing=[
            s.id for s in skills if s.machine_code and s.machine_code.signature_shown is False
        ],
    )


def _recall(problem: Problem, skills: list[Skill]) -> tuple[float | None, list[str]]:
    listed_path = problem.root / MECHANISMS_FILE
    if not listed_path.is_file():
        return None, []
    listed = {entry["mechanism"] for entry in json.loads(listed_path.read_text())}
    found = {s.mechanism for s in skills}
    missed = sorted(listed - found)
    return (len(listed) - len(missed)) / len(listed) if listed else None, missed


def _skills(
    problem: Problem, lineage: LineageGraph, simplifier: Simplifier, log: GateLog
) -> tuple[list[Skill], int, int]:
    runs_before = log.runs
    main = lineage.main_path()
    on_path = {a.mechanism for a in main}
    extra: dict[str, Attempt] = {}
    others: dict[str, list[str]] = {}
    for attempt in lineage.attempts():
        if attempt.status is not AttemptStatus.ACCEPTED or attempt.chosen:
            continue
        others.setdefault(attempt.mechanism, []).append(attempt.id)
        if attempt.mechanism not in on_path:
            extra.setdefault(attempt.mechanism, attempt)
    chosen = main + sorted(extra.values(), key=lambda a: a.step)
    skills = []
    for attempt in chosen:
        skill = _skill_of(problem, lineage, simplifier.removals.get(attempt.id), attempt, log)
        skill.evidence.other_edges = [
            e for e in others.get(attempt.mechanism, []) if e != attempt.id
        ]
        skills.append(skill)
    probe_runs = log.runs - runs_before
    trip_start = log.runs
    for skill, attempt in zip(skills, chosen, strict=True):
        _round_trip(problem, lineage, simplifier.removals.get(attempt.id), skill, log)
    return skills, probe_runs, log.runs - trip_start


BUILD_ARCH = "sm_90"
"""What mining's gates build for (the Builder's default); wgmma states need its `a` form."""

NO_LLM_ROUND_TRIP = "no rule can re-apply an LLM-proposed removal"


def _sites_in(mechanism: Mechanism, kernel: KernelSource) -> list[Site]:
    return [s for s in mechanism.detect(kernel) if s.supported]


def _static_conditions(
    removal: Removal | None, mechanism: Mechanism | None, optimized: KernelSource, problem: Problem
) -> list[Any]:
    """The mechanism's own conditions at each removed site. An LLM-origin removal has no
    recorded sites: the catalog's mechanism (when it knows the name) is asked at the sites it
    detects in the optimized state; an unknown mechanism states none."""
    if removal is not None:
        pairs = list(zip(removal.states, removal.sites, strict=False))
        mechanism = removal.mechanism
    elif mechanism is not None:
        pairs = [(optimized, site) for site in _sites_in(mechanism, optimized)]
    else:
        return []
    return merge_conditions(*(mechanism.conditions(state, site, problem) for state, site in pairs))


def skill_id(attempt: Attempt, problem: Problem) -> str:
    """Stable and fit for a folder name; an LLM-origin skill's id starts with `llm-`."""
    name = slug(attempt.mechanism)
    if is_llm_origin(attempt.origin) and not name.startswith("llm-"):
        name = f"llm-{name}"
    return f"{name}--{problem.name}--{attempt.parent[:8]}"


def _skill_of(
    problem: Problem,
    lineage: LineageGraph,
    removal: Removal | None,
    attempt: Attempt,
    log: GateLog,
) -> Skill:
    mechanism = removal.mechanism if removal is not None else catalog_mechanism(attempt.mechanism)
    parent = lineage.state(attempt.parent)
    child = lineage.state(attempt.child)
    optimized = KernelSource(parent.source, name=f"{problem.name}.cu")
    simplified = KernelSource(child.source, name=f"{problem.name}.cu")
    conditions = _static_conditions(removal, mechanism, optimized, problem)
    risks: list[Risk] = []
    probe_evidence: list[dict[str, Any]] = []
    opt = simple = None
    if problem.probes:
        opt = log.run(problem, optimized, workloads=problem.probes, time_it=False)
        simple = log.run(problem, simplified, workloads=problem.probes, time_it=False)
        inferred = infer_condition(problem, opt, simple)
        if inferred is not None:
            conditions = merge_conditions(conditions, [parse_condition(inferred.condition)])
            probe_evidence = [p.model_dump() for p in inferred.supporting]
            risks += [
                Risk(
                    kind="failing_probe",
                    mechanism=attempt.mechanism,
                    workload=p.workload,
                    status=p.status,
                    message=p.message,
                )
                for p in inferred.supporting
            ]
    if not conditions:
        # say so rather than leave the card silent: a reader must know what was tried
        stated_by = (
            "the mechanism states none"
            if mechanism is not None
            else "no rule states conditions for this LLM-proposed change"
        )
        conditions = [no_condition(problem, opt, simple, stated_by)]
    for sibling in lineage.attempts_from(attempt.parent):
        if sibling.status is AttemptStatus.REJECTED:
            where = ""
            if sibling.mechanism == attempt.mechanism:  # which sites set it apart from this one
                where = (
                    "removing it at "
                    + ", ".join(
                        f"{s['function']}:{s['start_line']} ({s['snippet']})" for s in sibling.sites
                    )
                    + ": "
                )
            risks.append(
                Risk(
                    kind="rejected_sibling",
                    mechanism=sibling.mechanism,
                    status=sibling.gate_status,
                    message=(where + sibling.message)[:800],
                )
            )
    first: Site | None = removal.sites[0] if removal is not None and removal.sites else None
    before, after = anchor_of(child.source, parent.source, None)
    intent = attempt.intent if is_llm_origin(attempt.origin) and attempt.intent else ""
    return Skill(
        id=skill_id(attempt, problem),
        intent=intent or (mechanism.intent if mechanism is not None else attempt.mechanism),
        mechanism=attempt.mechanism,
        category=mechanism.category if mechanism is not None else "",
        family=mechanism.family if mechanism is not None else "",
        origin=attempt.origin,
        anchor=Anchor(
            function=first.function if first else "",
            node_kind=first.node_kind if first else "",
            lines=first.lines if first else "",
            before=before,
            after=after,
        ),
        carrier=attempt.carriers[0] if attempt.carriers else {},
        conditions=conditions_to_json(conditions),
        condition_prose=[c.prose for c in conditions],
        probe_evidence=probe_evidence,
        effect=effect_of(
            [w.model_dump() for w in attempt.workloads], child.resources, parent.resources
        ),
        risks=risks,
        evidence=Evidence(
            problem=problem.name,
            edge=attempt.id,
            optimized=attempt.parent,
            simplified=attempt.child,
            sites=attempt.sites,
            gate_status=attempt.gate_status,
            hardware=str(lineage.graph.graph.get("hardware", "")),
        ),
        scope=scope_of(problem, optimized),
        requires=list(mechanism.requires) if mechanism is not None else [],
        conflicts=list(mechanism.conflicts) if mechanism is not None else [],
        diff=unified_diff(child.source, parent.source, f"{problem.name}/kernel.cu"),
        machine_code=machine_code_evidence(attempt.mechanism, parent, child),
    )


def machine_code_evidence(
    mechanism_name: str, optimized: StateInfo, simplified: StateInfo
) -> MachineCodeEvidence | None:
    """A skill's machine-code evidence from its two states (None when either has none)."""
    before, after = optimized.code, simplified.code
    if before is None or after is None:
        return None
    mechanism = catalog_mechanism(mechanism_name)
    declared = list(mechanism.signature) if mechanism is not None else []
    deltas = delta(before, after)
    opt, simple = feature_counts(before.kernels), feature_counts(after.kernels)
    # ptxas names come from whichever demangler the mining machine had: match by short name
    changed = {short_name(d.kernel) for d in deltas}
    opt_res = {short_name(k): v for k, v in optimized.resources.items()}
    simple_res = {short_name(k): v for k, v in simplified.resources.items()}
    resources = []
    for kernel in sorted(changed | set(opt_res) | set(simple_res)):
        a, b = opt_res.get(kernel, {}), simple_res.get(kernel, {})
        if kernel not in changed and a == b:
            continue
        resources.append(
            KernelResourceChange(
                kernel=kernel,
                registers_optimized=a.get("registers", 0),
                registers_simplified=b.get("registers", 0),
                spill_bytes_optimized=a.get("spill_bytes", 0),
                spill_bytes_simplified=b.get("spill_bytes", 0),
            )
        )
    known = before.disassembled and after.disassembled
    return MachineCodeEvidence(
        sass_delta=render_delta(deltas),
        host_changed=not before.same_host(after),
        signature=declared,
        signature_shown=signature_shown(tuple(declared), before, after)
        if declared and known
        else None,
        gained={k: v - simple.get(k, 0) for k, v in opt.items() if v > simple.get(k, 0)},
        lost={k: v - opt.get(k, 0) for k, v in simple.items() if v > opt.get(k, 0)},
        resources=resources,
    )


def no_condition(
    problem: Problem,
    optimized: GateVerdict | None,
    simplified: GateVerdict | None,
    stated_by: str = "the mechanism states none",
) -> Prose:
    """The condition of a skill nothing constrains, saying what was probed."""
    return Prose(
        text="no condition found: no size tried separates it from the simpler kernel",
        why=why_no_condition(problem.probes, optimized, simplified, stated_by),
    )


def scope_of(problem: Problem, optimized: KernelSource) -> Scope:
    """Where the skill was learned: the op type, the tensors' dtypes, and the architecture
    the optimized state was built for (sm_90a where it issues wgmma)."""
    definition = problem.definition
    dtypes = sorted({s.dtype for s in [*definition.inputs.values(), *definition.outputs.values()]})
    arch = specific_arch_for(BUILD_ARCH, optimized.text) or BUILD_ARCH
    return Scope(op_type=definition.op_type, dtypes=dtypes, arch=arch)


def _reapply_by_rule(
    mechanism: Mechanism, optimized: KernelSource, simplified: KernelSource
) -> KernelSource:
    """The catalog's rule applied to an LLM-simplified state, at every candidate, with the
    carrier read from the first site it detects in the optimized state."""
    sites = _sites_in(mechanism, optimized)
    carrier = mechanism.carrier_of(optimized, sites[0]) if sites else Carrier()
    return apply_everywhere(simplified, mechanism, carrier)


def _round_trip(
    problem: Problem, lineage: LineageGraph, removal: Removal | None, skill: Skill, log: GateLog
) -> None:
    """Re-apply the mechanism to the simplified state; it must recover the optimized speed.

    An LLM-origin removal is re-applied by the catalog's rule when its mechanism has one
    (the note says so); without a rule it is not tried (`verified` stays None)."""
    optimized = KernelSource(lineage.state(skill.evidence.optimized).source)
    mechanism = removal.mechanism if removal is not None else catalog_mechanism(skill.mechanism)
    if mechanism is None:
        skill.verified = None
        skill.round_trip_note = NO_LLM_ROUND_TRIP
        return
    how = "" if removal is not None else "the catalog's rule re-applied to the LLM's state: "
    try:
        if removal is not None:
            reapplied = reapply(removal)
        else:
            simplified = KernelSource(lineage.state(skill.evidence.simplified).source)
            reapplied = _reapply_by_rule(mechanism, optimized, simplified)
    except MechanismRefused as err:
        skill.round_trip_reproduced = skill.verified = False
        skill.round_trip_note = f"{how}re-applying was refused: {err.reason}"
        return
    skill.round_trip_exact = reapplied.fingerprint == optimized.fingerprint
    verdict = log.run(problem, reapplied, against=optimized)
    comparison = verdict.comparison
    if not verdict.passed or comparison is None:
        skill.round_trip_reproduced = skill.verified = False
        failing = [w for w in verdict.workloads if not w.passed]
        reason = failing[0].message if failing else verdict.build.message
        skill.round_trip_note = f"{how}the re-applied kernel failed the gate: {reason[:400]}"
        return
    skill.round_trip_ratio = comparison.ratio
    skill.round_trip_trial_ratios = comparison.trial_ratios
    skill.round_trip_reproduced = comparison.not_slower
    skill.settle_verified()
    notes = [how.rstrip(": ")] if how else []
    if not skill.round_trip_reproduced:
        notes.append("the re-applied kernel is slower than the optimized one")
    notes.append(
        "re-applying restored the optimized source exactly"
        if skill.round_trip_exact
        else "re-applying gave a different source than the optimized one"
    )
    skill.round_trip_note = "; ".join(notes) if how else " ".join(notes)
