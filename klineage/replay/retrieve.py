"""Ranking skills for a target kernel, and dropping the ones whose conditions fail.

A skill is ranked by four signals:
- scope: the same op_type, overlapping dtypes, an architecture the target can run;
- sites: its mechanism has candidate sites in the target (a skill with none cannot apply and is
  dropped with that reason);
- text: BM25 (bm25s) between the target (its definition and code identifiers) and the skill
  (intent, conditions, before/after code);
- gain: the speedup it measured on its source kernel (none for a step within the timing
  noise; a step that measured slower counts against it), scaled by its mechanism's track
  record: the share of the library's skills of that mechanism (mined from other problems)
  that measured a gain. One expert's 1.23x from `__restrict__`, beside eight experts where
  it changed nothing, is not a 1.23x prior for the next kernel; a mechanism that gained
  on every expert keeps its whole gain: the expected gain of a gate run spent on it;
- bottleneck: given the target's bottleneck class (the profile stage's), a skill that relieved
  the same bottleneck on its expert (its card's `relieves`) ranks higher.
Given the target's profile, a skill with nothing to relieve there (no bank conflicts for a
padding, a busy GPU for a step that filled an idle one: :mod:`klineage.replay.relief`) ranks
after all the others, with the reason; so, profile or not, does a block or warp per row on a
target whose launch already gives every workload more threads than the GPU holds at once.
Before any gate run, a skill is dropped when a condition fails on one of the target's
workloads: the mechanism's static conditions computed on the target itself (its axes, its
launch), plus the skill's learned conditions over axes the target shares. The reason names
the condition and the workload. A skill mined from the target's own problem is never used.
Given the target's machine code, a skill is also dropped when the target already shows what
the skill adds in SASS (its mechanism's signature: the wide loads, the shuffles, the async
copies it brought are there, and what it took away is not), e.g. a vector-width skill on a
kernel that already moves 16 bytes per load and no fewer.

A skill mined in a form no forward rule writes (`transferable` False: its round trip restored
the expert's source from the lineage edge) is dropped: it is evidence of a gain, not a
rewrite replay can make.

A skill whose mechanism the catalog does not know (one an LLM proposed while mining) has no
rule to apply it: it is dropped, unless `keep_unknown` (replay with an LLM, which applies it
from its card); then only its learned conditions are checked and it counts no sites.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from klineage.conditions import Condition, EvalContext, parse_condition
from klineage.cuda.facts import eval_context
from klineage.gate.bottleneck import Bottleneck
from klineage.gate.profile import Profile
from klineage.gate.sass import MachineCode, signature_present
from klineage.kernel import KernelSource
from klineage.limits import DEFAULT_ARCH
from klineage.mechanisms import Carrier, Mechanism, Site, UnknownMechanism, get
from klineage.problem import Problem
from klineage.replay.relief import enough_threads, nothing_to_relieve
from klineage.skills import Measured, Skill

# Measured gain leads (a 10% faster source kernel is worth ~1 point); scope and text relevance
# order skills of similar gain.
# A skill that relieved the target's bottleneck gains a point: as much as a 10% faster
# source kernel.
WEIGHTS = {"scope": 1.0, "text": 0.5, "gain": 10.0, "bottleneck": 1.0}
_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+")


class Dropped(BaseModel):
    """A skill retrieval set aside, and why."""

    skill: str = Field(description="the skill id")
    mechanism: str = Field(description="its mechanism")
    reason: str = Field(description="why it was dropped")
    condition: str = Field(default="", description="the failing condition, in prose")
    workload: str = Field(default="", description="the workload it fails on")


class Ranked(BaseModel):
    """A usable skill with its score and the sites it applies to."""

    skill: str = Field(description="the skill id")
    mechanism: str = Field(description="its mechanism")
    source_problem: str = Field(description="the expert problem it was mined from")
    score: float = Field(description="the combined score (higher first)")
    scope: float = Field(description="scope match, 0..1")
    text: float = Field(description="BM25 relevance, normalized 0..1 over the library")
    gain: float = Field(
        description="log of the skill's measured geometric-mean speedup, times `track_record` "
        "when positive; 0 when it measured no gain beyond the timing noise (negative when it "
        "measured slower)"
    )
    track_record: float = Field(
        default=1.0,
        description="share of the library's skills of its mechanism, mined from other "
        "problems, that measured a gain (0..1)",
    )
    measured: str = Field(description="what the skill measured: gain, no measurable gain, slower")
    bottleneck: float = Field(
        default=0.0,
        description="1 when the skill relieved the target's bottleneck on its expert, else 0",
    )
    relieves: str | None = Field(
        default=None, description="the bottleneck the skill relieved on its expert, if known"
    )
    sites: int = Field(description="candidate sites of its mechanism in the target")
    unrelieved: str = Field(
        default="",
        description="why the target (its profile, or its launch: enough threads already) "
        "leaves it nothing to relieve (it ranks after every skill without such a reason); "
        "empty when it may relieve something",
    )
    carrier: dict[str, Any] = Field(
        default_factory=dict,
        description="choices every application here needs, whatever the skill's carrier: "
        "the rule handles at run time a condition some workload breaks (check=peeled: a "
        "loop's rows peeled to alignment, then vectors; check=aligned: vectors where the "
        "pointers are aligned, the scalar loop elsewhere)",
    )
    checked: str = Field(
        default="", description="the conditions tested at run time instead, in prose"
    )


class Retrieval(BaseModel):
    """Ranked usable skills and the dropped ones, with reasons."""

    ranked: list[Ranked] = Field(default_factory=list, description="best first")
    dropped: list[Dropped] = Field(default_factory=list, description="with reasons")


def tokens(text: str) -> list[str]:
    """Identifiers and numbers, with snake_case and camelCase parts as extra tokens."""
    found = []
    for word in _WORDS.findall(text):
        lower = word.lower()
        found.append(lower)
        parts = [p for p in re.split(r"_|(?<=[a-z])(?=[A-Z])", word) if p]
        if len(parts) > 1:
            found.extend(p.lower() for p in parts)
    return found


def skill_text(skill: Skill) -> str:
    """The words a skill is found by: intent, mechanism, family, anchor code, conditions."""
    return "\n".join(
        [
            skill.intent,
            skill.mechanism,
            skill.family,
            *skill.condition_prose,
            skill.anchor.before,
            skill.anchor.after,
        ]
    )


def target_text(problem: Problem, kernel: KernelSource) -> str:
    """The words a target is searched with: the definition's names and the kernel's source."""
    d = problem.definition
    return "\n".join([d.name, d.op_type, d.description, " ".join(d.tags), kernel.text])


def bm25_scores(query: str, documents: Sequence[str]) -> list[float]:
    """BM25 score of each document for the query (bm25s), normalized to 0..1."""
    if not documents:
        return []
    import bm25s

    corpus = [" ".join(tokens(doc)) or "empty" for doc in documents]
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize(corpus, stopwords=None, show_progress=False), show_progress=False
    )
    vocabulary = set(" ".join(corpus).split())
    query_tokens = [t for t in tokens(query) if t in vocabulary] or ["empty"]
    scores = [float(s) for s in retriever.get_scores(query_tokens)]
    top = max(scores) if scores else 0.0
    return [s / top if top > 0 else 0.0 for s in scores]


def scope_score(skill: Skill, problem: Problem, arch: str) -> float:
    """How well the skill's scope fits the target: op type, dtypes, architecture (0 to 1)."""
    d = problem.definition
    dtypes = {s.dtype for s in [*d.inputs.values(), *d.outputs.values()]}
    op = 1.0 if skill.scope.op_type == d.op_type else 0.0
    overlap = len(dtypes & set(skill.scope.dtypes)) / max(1, len(dtypes | set(skill.scope.dtypes)))
    same_arch = 1.0 if skill.scope.arch.rstrip("a") == arch.rstrip("a") else 0.5
    return (op + overlap + same_arch) / 3.0


def applicable_conditions(
    skill: Skill, problem: Problem, kernel: KernelSource, sites: Sequence[Site]
) -> list[tuple[Condition, Carrier | None]]:
    """The mechanism's static conditions at the target's sites, and the skill's learned ones
    over axes the target has (conditions over other axes cannot be judged here), each with the
    carrier under which the rule tests it at run time instead (None: it must hold). A learned
    condition must always hold: it is what the expert measured under."""
    found: list[tuple[Condition, Carrier | None]] = []
    if sites:
        mechanism = get(skill.mechanism)
        for site in sites:
            for condition in mechanism.conditions(kernel, site, problem):
                found.append((condition, mechanism.run_time_check(kernel, site, condition)))
    axes = set(problem.definition.axes)
    for data in skill.conditions:
        axis = data.get("axis")
        if axis is None or axis in axes:
            found.append((parse_condition(data), None))
    return found


def checked_violation(
    conditions: Sequence[tuple[Condition, Carrier | None]],
    problem: Problem,
    context: EvalContext,
) -> tuple[tuple[Condition, str] | None, Carrier, list[Condition]]:
    """The first condition that fails and must hold (with its workload), or None; the carrier
    that tests the failing ones a rule can test at run time instead; and those, by prose."""
    carrier: Carrier = Carrier()
    checked: list[Condition] = []
    for condition, check in conditions:
        violation = first_violation([condition], problem, context)
        if violation is None:
            continue
        if check is None:
            return violation, Carrier(), []
        carrier, checked = carrier.merged(check), [*checked, condition]
    return None, carrier, checked


def first_violation(
    conditions: Sequence[Condition], problem: Problem, context: EvalContext
) -> tuple[Condition, str] | None:
    """The first (condition, workload label) that fails, or None."""
    for condition in conditions:
        if not condition.per_workload:
            if condition.evaluate(problem, None, context) is False:
                return condition, "every workload"
            continue
        for workload in problem.workloads:
            if condition.evaluate(problem, workload, context) is False:
                return condition, workload.label
    return None


def retrieve(
    skills: Iterable[Skill],
    problem: Problem,
    kernel: KernelSource | str | None = None,
    *,
    arch: str = DEFAULT_ARCH,
    use_conditions: bool = True,
    keep_unknown: bool = False,
    machine_code: MachineCode | None = None,
    bottleneck: Bottleneck | None = None,
    profile: Profile | None = None,
    weigh_track_record: bool = True,
) -> Retrieval:
    """Rank `skills` (a list, or a :class:`SkillLibrary`) for the target `problem`; drop those
    that cannot apply or whose conditions fail, each with its reason.

        library = SkillLibrary.load("skills_out")
        problem = load_problem("heldout/gelu")
        for ranked in retrieve(library, problem).ranked:
            print(ranked.skill, ranked.score)

    `kernel` is the target kernel (default: the problem's kernel.cu; source text works too).
    With `keep_unknown`, skills whose mechanism is not in the catalog are kept (for an LLM).
    `bottleneck` is the target's bottleneck class (from a profiled verdict), if known;
    `profile` the target's profile, which puts last the skills it leaves nothing to relieve;
    `weigh_track_record` False counts a skill's whole gain, as replays before 2026-12-06 did."""
    if kernel is None:
        kernel = problem.kernel_source()
    elif isinstance(kernel, str):
        kernel = KernelSource(kernel, name=f"{problem.name}.cu")
    skills = list(skills)
    record = track_record(skills, problem.name) if weigh_track_record else {}
    result = Retrieval()
    usable: list[tuple[Skill, Mechanism | None, list[Site], Carrier, list[Condition]]] = []
    context = eval_context(kernel, arch=arch)
    for skill in skills:
        if skill.evidence.problem == problem.name:
            result.dropped.append(_drop(skill, "mined from this same problem (leakage guard)"))
            continue
        if skill.transferable is False:
            result.dropped.append(_drop(skill, "no forward rule applies the form it was mined in"))
            continue
        try:
            mechanism = get(skill.mechanism)
        except UnknownMechanism:
            if not keep_unknown:
                result.dropped.append(_drop(skill, "its mechanism is not in this catalog"))
                continue
            mechanism = None
        sites = [s for s in mechanism.candidates(kernel) if s.supported] if mechanism else []
        if mechanism is not None and not sites:
            result.dropped.append(_drop(skill, "its mechanism has no candidate site here"))
            continue
        if _shows_already(skill, machine_code):
            result.dropped.append(
                _drop(skill, "the target's SASS already shows what it adds (its signature)")
            )
            continue
        carrier: Carrier = Carrier()
        checked: list[Condition] = []
        if use_conditions:
            violation, carrier, checked = checked_violation(
                applicable_conditions(skill, problem, kernel, sites), problem, context
            )
            if violation is not None:
                condition, workload = violation
                result.dropped.append(_drop(skill, "a condition fails", condition.prose, workload))
                continue
        usable.append((skill, mechanism, sites, carrier, checked))
    texts = bm25_scores(target_text(problem, kernel), [skill_text(s) for s, *_ in usable])
    for (skill, mechanism, sites, carrier, checked), text in zip(usable, texts, strict=True):
        scope = scope_score(skill, problem, arch)
        measured = skill.effect.measured
        geo = skill.effect.geomean_speedup or 1.0
        # a step within the timing noise gained nothing: it must not rank as a gain
        gain = 0.0 if measured is Measured.NO_GAIN else math.log(max(geo, 1e-6))
        if gain > 0:
            gain *= record.get(skill.mechanism, 1.0)
        relieves = skill.profile.relieves if skill.profile else None
        same = 1.0 if bottleneck is not None and relieves == bottleneck.value else 0.0
        score = (
            WEIGHTS["scope"] * scope
            + WEIGHTS["text"] * text
            + WEIGHTS["gain"] * gain
            + WEIGHTS["bottleneck"] * same
        )
        result.ranked.append(
            Ranked(
                skill=skill.id,
                mechanism=skill.mechanism,
                source_problem=skill.evidence.problem,
                score=score,
                scope=scope,
                text=text,
                gain=gain,
                track_record=record.get(skill.mechanism, 1.0),
                measured=measured.value,
                bottleneck=same,
                relieves=relieves,
                sites=len(sites),
                unrelieved=nothing_to_relieve(skill, mechanism, profile)
                or enough_threads(mechanism, kernel, problem)
                or "",
                carrier=carrier.model_dump(exclude_none=True),
                checked="; ".join(dict.fromkeys(c.prose for c in checked)),
            )
        )
    result.ranked.sort(key=lambda r: (bool(r.unrelieved), -r.score, r.skill))
    return result


def track_record(skills: Sequence[Skill], problem: str) -> dict[str, float]:
    """Per mechanism, the share of its skills in `skills` that measured a gain beyond the
    timing noise, counting only those mined from other problems than `problem`."""
    tried: dict[str, int] = {}
    gained: dict[str, int] = {}
    for skill in skills:
        if skill.evidence.problem == problem:
            continue
        tried[skill.mechanism] = tried.get(skill.mechanism, 0) + 1
        if skill.effect.measured is Measured.GAIN:
            gained[skill.mechanism] = gained.get(skill.mechanism, 0) + 1
    return {mechanism: gained.get(mechanism, 0) / n for mechanism, n in tried.items()}


def _drop(skill: Skill, reason: str, condition: str = "", workload: str = "") -> Dropped:
    return Dropped(
        skill=skill.id,
        mechanism=skill.mechanism,
        reason=reason,
        condition=condition,
        workload=workload,
    )


def _shows_already(skill: Skill, target: MachineCode | None) -> bool:
    evidence = skill.machine_code
    if target is None or evidence is None or not evidence.signature:
        return False
    return signature_present(tuple(evidence.signature), evidence.gained, evidence.lost, target)
