"""Skills from a lineage: each accepted removal, reversed, with its conditions (static and
learned from probes), risks, effect, machine-code evidence and round trip.

An LLM-origin attempt gets the conditions learned from probes; static conditions and a round
trip need a rule, so they come only when the mechanism the LLM named is in the catalog (else
`verified` stays None, and the note says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import networkx as nx

from klineage.conditions import Prose, conditions_to_json, merge_conditions, parse_condition
from klineage.gate.build import specific_arch_for
from klineage.gate.log import GateLog
from klineage.gate.result import GateVerdict
from klineage.gate.sass import (
    delta,
    feature_counts,
    render_delta,
    short_name,
    signature_shown,
)
from klineage.kernel import KernelSource
from klineage.limits import DEFAULT_ARCH, RISK_MESSAGE_KEPT, ROUND_TRIP_REASON_KEPT
from klineage.lineage import (
    Attempt,
    AttemptStatus,
    LineageGraph,
    StateInfo,
    catalog_mechanism,
    is_llm_origin,
    slug,
)
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, Site
from klineage.mining.inference import infer_condition, why_no_condition
from klineage.mining.profiles import state_profile
from klineage.mining.removal import Removal, apply_everywhere, reapply, restore
from klineage.problem import Problem
from klineage.skills import (
    Anchor,
    Evidence,
    KernelResourceChange,
    MachineCodeEvidence,
    Risk,
    Scope,
    Skill,
    anchor_of,
    effect_of,
    profile_evidence,
    unified_diff,
)


def extract_skills(
    problem: Problem, lineage: LineageGraph, removals: Mapping[str, Removal], log: GateLog
) -> tuple[list[Skill], int, int]:
    """One skill per mechanism the walk removed: each main-path attempt, then the first accepted
    attempt off the path of a mechanism the path lacks; each skill's probes gated, then its
    round trip. Returns the skills and the gate runs spent on probes and on round trips.
    `removals` maps an attempt id to the removal behind it (rule attempts)."""
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
        skill = skill_of(problem, lineage, removals.get(attempt.id), attempt, log)
        skill.evidence.other_edges = [
            e for e in others.get(attempt.mechanism, []) if e != attempt.id
        ]
        skills.append(skill)
    probe_runs = log.runs - runs_before
    trip_start = log.runs
    for skill, attempt in zip(skills, chosen, strict=True):
        round_trip(problem, lineage, removals.get(attempt.id), skill, log)
    return skills, probe_runs, log.runs - trip_start


BUILD_ARCH = DEFAULT_ARCH
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


def _rejected_elsewhere(lineage: LineageGraph, attempt: Attempt) -> list[Risk]:
    """The gate's rejections of this mechanism's removal from other states, each with what
    the walk had removed on the way there: a removal that is correct from the expert can be
    wrong once another step is gone (an expert's fault that one removal alone hides)."""
    graph = lineage.graph
    accepted = graph.edge_subgraph(
        (u, v)
        for u, v, status in graph.edges(data="status")
        if status == AttemptStatus.ACCEPTED.value
    )
    found = []
    for other in lineage.attempts():
        if (
            other.status is not AttemptStatus.REJECTED
            or other.mechanism != attempt.mechanism
            or other.parent == attempt.parent
        ):
            continue
        try:
            path = nx.shortest_path(accepted, attempt.parent, other.parent)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            path = []
        gone = [graph.edges[u, v]["mechanism"] for u, v in pairwise(path)]
        where = f"after {', '.join(gone)} went" if gone else f"from state {other.parent[:10]}"
        found.append(
            Risk(
                kind="rejected_elsewhere",
                mechanism=other.mechanism,
                status=other.gate_status,
                message=f"removing it {where}: {other.message}"[:RISK_MESSAGE_KEPT],
            )
        )
    return found


def skill_of(
    problem: Problem,
    lineage: LineageGraph,
    removal: Removal | None,
    attempt: Attempt,
    log: GateLog,
) -> Skill:
    """The skill of one accepted attempt: its conditions (static, and learned from the probes,
    which are gated here), risks, effect, evidence and machine code. `removal` is the rule's
    removal behind it (None for an LLM-origin attempt)."""
    mechanism = removal.mechanism if removal is not None else catalog_mechanism(attempt.mechanism)
    parent = lineage.state(attempt.parent)
    child = lineage.state(attempt.child)
    optimized = problem.kernel_state(parent.source)
    simplified = problem.kernel_state(child.source)
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
                    message=(where + sibling.message)[:RISK_MESSAGE_KEPT],
                )
            )
    risks += _rejected_elsewhere(lineage, attempt)
    first: Site | None = removal.sites[0] if removal is not None and removal.sites else None
    before, after = anchor_of(child.source, parent.source, None)
    effect = effect_of(
        [w.model_dump() for w in attempt.workloads], child.resources, parent.resources
    )
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
        effect=effect,
        risks=risks,
        evidence=Evidence(
            problem=problem.name,
            edge=attempt.id,
            optimized=attempt.parent,
            simplified=attempt.child,
            sites=attempt.sites,
            gate_status=attempt.gate_status,
            hardware=lineage.meta.hardware or "",
        ),
        scope=scope_of(problem, optimized),
        requires=list(mechanism.requires) if mechanism is not None else [],
        conflicts=list(mechanism.conflicts) if mechanism is not None else [],
        diff=unified_diff(child.source, parent.source, f"{problem.name}/kernel.cu"),
        machine_code=machine_code_evidence(attempt.mechanism, parent, child),
        profile=profile_evidence(
            state_profile(problem, lineage, attempt.child, log.gate),
            state_profile(problem, lineage, attempt.parent, log.gate),
            effect.measured,
        ),
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


def round_trip(
    problem: Problem, lineage: LineageGraph, removal: Removal | None, skill: Skill, log: GateLog
) -> None:
    """Re-apply the mechanism to the simplified state; it must recover the optimized speed.

    The forward rule (`apply`, what transfers to new code) is tried first; when it refuses the
    form the expert wrote, the removal is undone from the lineage edge instead (`restore`), and
    the skill is kept as evidence but not `transferable`. An LLM-origin removal is re-applied
    by the catalog's rule when its mechanism has one (the note says so); without a rule it is
    not tried (`verified` stays None)."""
    optimized = problem.kernel_state(lineage.state(skill.evidence.optimized).source)
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
            simplified = problem.kernel_state(lineage.state(skill.evidence.simplified).source)
            reapplied = _reapply_by_rule(mechanism, optimized, simplified)
        skill.transferable = True
    except MechanismRefused as err:
        skill.transferable = False
        if removal is None:
            skill.round_trip_reproduced = skill.verified = False
            skill.round_trip_note = f"{how}re-applying was refused: {err.reason}"
            return
        # no forward rule writes this form: undo the removal from the edge instead, which
        # checks the code and the gain, not the transfer (replay does not use the skill)
        reapplied = restore(removal)
        how = (
            f"no forward rule re-applies this form ({err.reason}); the round trip restored "
            "the source the lineage edge removed: "
        )
    skill.round_trip_exact = reapplied.fingerprint == optimized.fingerprint
    verdict = log.run(problem, reapplied, against=optimized)
    comparison = verdict.comparison
    if not verdict.passed or comparison is None:
        skill.round_trip_reproduced = skill.verified = False
        failing = [w for w in verdict.workloads if not w.passed]
        reason = failing[0].message if failing else verdict.build.message
        skill.round_trip_note = (
            f"{how}the re-applied kernel failed the gate: {reason[:ROUND_TRIP_REASON_KEPT]}"
        )
        return
    skill.round_trip_ratio = comparison.ratio
    skill.round_trip_trial_ratios = comparison.trial_ratios
    # an exact round trip rebuilt the optimized kernel itself, which cannot be slower than
    # itself: its ratio is this workload's timing noise, not the rule's result
    skill.round_trip_reproduced = skill.round_trip_exact or comparison.not_slower
    skill.settle_verified()
    notes = [how.rstrip(": ")] if how else []
    if not comparison.not_slower:
        notes.append(
            f"the same kernel timed twice read {comparison.ratio:.3f} (timing noise)"
            if skill.round_trip_exact
            else "the re-applied kernel is slower than the optimized one"
        )
    notes.append(
        "re-applying restored the optimized source exactly"
        if skill.round_trip_exact
        else "re-applying gave a different source than the optimized one"
    )
    skill.round_trip_note = "; ".join(notes) if how else " ".join(notes)
