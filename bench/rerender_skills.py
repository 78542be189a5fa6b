"""Re-judge and re-render a mined skills folder from what its mining recorded; no GPU.

    python bench/rerender_skills.py [--skills skills_out] [--gatelog DIR]

For every skill in `skills.jsonl`, with the lineages under `skills/lineages/` and (for the
probe verdicts) the mining gate log (`tar xJf bench/state/mine_gatelog.tar.xz` gives
`skills_out/gatelog/`):

- `verified` in its current meaning: the round trip reproduced a measured gain. A library
  written before `round_trip_reproduced` existed recorded that as `verified`; it is kept there
  and `verified` is settled again from it and the measured effect;
- the anchors again from the two states' sources (cut at whole lines);
- the scope's architecture from the optimized source (sm_90a for wgmma);
- a "no condition found" condition says what was probed, from the logged probe verdicts;
- every SKILL.md rendered again.

Nothing is measured: every figure on a card comes from the recorded verdicts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from klineage.conditions import Prose, conditions_to_json, parse_condition
from klineage.gate.log import GateLog
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.lineage import LineageGraph, catalog_mechanism
from klineage.mining.extract import no_condition, scope_of
from klineage.problem import Problem, load_problem
from klineage.skills import Skill, SkillLibrary, anchor_of

ROOT = Path(__file__).resolve().parents[1]
NO_CONDITION = "no condition found"


def _problems(folders: list[Path]) -> dict[str, Problem]:
    problems = {}
    for folder in folders:
        problem = load_problem(folder)
        problems[problem.name] = problem
    return problems


def _log(gatelog: Path | None, problem: Problem) -> GateLog | None:
    path = gatelog / f"{problem.name}.jsonl" if gatelog is not None else None
    if path is None or not path.is_file():
        return None
    return GateLog(path, gate=None, accept_older=True)  # recorded results, read as they are


def rejudge(skill: Skill, problem: Problem, lineage: LineageGraph, log: GateLog | None) -> Skill:
    """`skill` with its verdict, anchors, scope and empty conditions settled anew."""
    if skill.round_trip_reproduced is None and skill.verified is not None:
        skill.round_trip_reproduced = skill.verified  # what `verified` meant when it was mined
    skill.settle_verified()
    parent = lineage.state(skill.evidence.optimized)
    child = lineage.state(skill.evidence.simplified)
    optimized = KernelSource(parent.source, name=f"{problem.name}.cu")
    simplified = KernelSource(child.source, name=f"{problem.name}.cu")
    skill.anchor.before, skill.anchor.after = anchor_of(child.source, parent.source, None)
    skill.scope = scope_of(problem, optimized)
    conditions = [parse_condition(c) for c in skill.conditions]
    alone = conditions[0] if len(conditions) == 1 else None
    if isinstance(alone, Prose) and alone.text.startswith(NO_CONDITION):

        def verdict(kernel: KernelSource) -> GateVerdict | None:
            return log.logged(kernel, problem.probes, time_it=False) if log else None

        stated_by = (
            "the mechanism states none"
            if catalog_mechanism(skill.mechanism) is not None
            else "no rule states conditions for this LLM-proposed change"
        )
        conditions = [no_condition(problem, verdict(optimized), verdict(simplified), stated_by)]
        skill.conditions = conditions_to_json(conditions)
        skill.condition_prose = [c.prose for c in conditions]
    return skill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skills", type=Path, default=ROOT / "skills_out")
    parser.add_argument("--gatelog", type=Path, help="the mining gate log folder")
    parser.add_argument(
        "--problems",
        type=Path,
        nargs="*",
        default=sorted((ROOT / "expert_kernels").glob("*/")),
        help="the expert problem folders the skills were mined from",
    )
    args = parser.parse_args()
    library = SkillLibrary.load(args.skills)
    problems = _problems(args.problems)
    lineages: dict[str, LineageGraph] = {}
    logs: dict[str, GateLog | None] = {}
    for skill in library:
        name = skill.evidence.problem
        if name not in lineages:
            lineages[name] = LineageGraph.load(args.skills / "lineages" / f"{name}.json")
            logs[name] = _log(args.gatelog, problems[name])
        rejudge(skill, problems[name], lineages[name], logs[name])
    library.save()
    verified = sum(bool(s.verified) for s in library)
    reproduced = sum(bool(s.round_trip_reproduced) for s in library)
    print(f"{len(library)} skills: {verified} verified, {reproduced} round trips reproduced")


if __name__ == "__main__":
    main()
