"""Why the skills method fell short of a baseline, mechanism by mechanism.

For each problem where a baseline (blind or memory) ended faster than the skills method, every
mechanism the baseline kept and the skills method never kept gets one reason, taken from the
evidence the run left behind, never guessed:

- `no_skill`: no mined skill has the mechanism (no expert used it, or its removal was refused
  or rejected while mining);
- `dropped`: retrieval set every such skill aside before any gate run (the failing condition and
  workload, or another reason);
- `tried`: the skills method gated it and the gate said slower or rejected;
- `refused`: the rule could not rewrite the skills method's kernel;
- `no_site`: it was never tried because no candidate site was left in the state the skills
  method reached (an earlier kept change rewrote the code the rule looks for);
- `not_tried`: candidate sites remain, but the method stopped first (budget, or its ranking
  ended at a pass without improvement);
- `carrier`: both kept it, but the baseline's instance (block size, vector width, ...) gained
  more than the skill's;
- `order`: both kept the same instance, but from different states (what each kept before).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from klineage.kernel import KernelSource
from klineage.limits import MISS_MESSAGE_SHOWN
from klineage.lineage import LineageGraph
from klineage.mechanisms import UnknownMechanism, get
from klineage.problem import Problem
from klineage.replay.results import MethodResult
from klineage.replay.retrieve import retrieve
from klineage.skills import Skill

BASELINES = ("blind", "memory")
"""The methods that do without skills."""
MARGIN = 1.05
"""A baseline counts as ahead when its speedup exceeds the skills method's by this factor."""


class Miss(BaseModel):
    """A mechanism a baseline kept on a problem and the skills method did not, and why."""

    problem: str = Field(description="definition name")
    mechanism: str = Field(description="the mechanism the baseline kept")
    baseline: str = Field(description="the baseline that kept it (blind or memory)")
    ratio: float = Field(description="the speedup the baseline measured when it kept it")
    reason: str = Field(
        description="no_skill, dropped, tried, refused, no_site, not_tried, carrier or order"
    )
    detail: str = Field(description="the evidence: condition and workload, gate verdict, ...")


def explain_misses(
    results: Sequence[MethodResult],
    problems: Sequence[Problem],
    skills: Sequence[Skill],
    lineages: str | Path,
) -> list[Miss]:
    """One `Miss` per mechanism behind each gap between a baseline and the skills method.
    `lineages` is the folder of forward lineages replay wrote (`<problem>.<method>.json`)."""
    by_name = {p.name: p for p in problems}
    misses: list[Miss] = []
    for problem_name in dict.fromkeys(r.problem for r in results):
        rows = {r.method: r for r in results if r.problem == problem_name}
        skilled = rows.get("skills")
        # the tree method replays the same skills: a gap to it is the search's, not a miss
        baselines = [r for m, r in rows.items() if m in BASELINES]
        if skilled is None or not baselines or problem_name not in by_name:
            continue
        best = max(baselines, key=lambda r: r.speedup)
        if best.speedup <= skilled.speedup * MARGIN:
            continue
        kept_by_skills = {r.action: r for r in skilled.runs if r.outcome == "kept"}
        seen: set[str] = set()
        for run in best.runs:
            if run.outcome != "kept" or run.action in seen:
                continue
            seen.add(run.action)
            mine = kept_by_skills.get(run.action)
            if mine is not None:
                if (run.ratio or 1.0) <= (mine.ratio or 1.0) * MARGIN:
                    continue
                reason = "carrier" if mine.carrier != run.carrier else "order"
                detail = (
                    f"skills: {mine.carrier or 'default'} at {mine.ratio or 1.0:.3f} after "
                    f"{_kept_before(skilled, mine.index)}; {best.method}: "
                    f"{run.carrier or 'default'} at {run.ratio or 1.0:.3f} after "
                    f"{_kept_before(best, run.index)}"
                )
            else:
                reason, detail = _reason(
                    run.action, by_name[problem_name], skilled, skills, Path(lineages)
                )
            misses.append(
                Miss(
                    problem=problem_name,
                    mechanism=run.action,
                    baseline=best.method,
                    ratio=run.ratio or 1.0,
                    reason=reason,
                    detail=detail,
                )
            )
    return misses


def _kept_before(result: MethodResult, index: int) -> str:
    kept = [r.action for r in result.runs if r.outcome == "kept" and r.index < index]
    return ", ".join(kept) if kept else "nothing"


def _reason(
    mechanism: str,
    problem: Problem,
    skilled: MethodResult,
    skills: Sequence[Skill],
    lineages: Path,
) -> tuple[str, str]:
    usable = [s for s in skills if s.mechanism == mechanism and s.evidence.problem != problem.name]
    if not usable:
        return "no_skill", "no skill mined from another problem has this mechanism"
    if problem.kernel_path is not None:
        naive = KernelSource.from_file(problem.kernel_path)
        ranking = retrieve(usable, problem, naive)
        if not ranking.ranked:
            drop = ranking.dropped[0]
            where = f" ({drop.condition}; fails on {drop.workload})" if drop.condition else ""
            return "dropped", f"{drop.skill}: {drop.reason}{where}"
    tries = [r for r in skilled.runs if r.action == mechanism]
    if tries:
        outcomes = ", ".join(
            f"{r.outcome}"
            + (f" at {r.ratio:.3f}" if r.ratio is not None else "")
            + (
                f" ({r.gate_status}: {r.message[:MISS_MESSAGE_SHOWN]})"
                if r.outcome == "rejected"
                else ""
            )
            for r in tries
        )
        return "tried", f"gated {len(tries)} time(s): {outcomes}"
    refusals = [f for f in skilled.refusals if f" {mechanism}: " in f]
    if refusals:
        return "refused", refusals[0]
    path = lineages / f"{problem.name}.skills.json"
    if path.is_file():
        lineage = LineageGraph.load(path)
        final = lineage.state(skilled.final)
        kernel = KernelSource(final.source, name=problem.name)
        try:
            candidates = [s for s in get(mechanism).candidates(kernel) if s.supported]
        except UnknownMechanism:
            candidates = []
        if not candidates:
            after = _kept_before(skilled, len(skilled.runs) + 1)
            return (
                "no_site",
                f"no candidate site left in the state the skills method reached (after {after})",
            )
    return "not_tried", "candidate sites remain; the method stopped before trying it"
