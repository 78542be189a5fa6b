"""`mine`: expert kernel -> lineage -> conditions -> skills -> round trip -> skills_out/.

    from klineage import mine
    report = mine("expert_kernels/softmax", out="skills_out")

Every gate verdict goes through an append-only log under `out/gatelog/`, so a killed run
resumes (`resume=True`) without repeating finished work.

With `llm=provider`, the walk also gates one LLM-proposed removal per state (see
:mod:`klineage.mining.walk`). Skill extraction is :mod:`klineage.mining.extract`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from klineage.executors import Executor, LocalExecutor
from klineage.gate.log import GateLike, GateLog
from klineage.lineage import (
    AttemptStatus,
    LineageGraph,
    is_llm_origin,
)
from klineage.llm.base import Provider
from klineage.mining.extract import extract_skills
from klineage.mining.recall import skill_recall
from klineage.mining.walk import MiningBudget, Simplifier, WalkEvent
from klineage.problem import load_problem
from klineage.skills import (
    SkillLibrary,
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
    executor: Executor | None = None,
    gate_options: Mapping[str, Any] | None = None,
) -> MineReport:
    """Mine one expert problem folder into `out`. Without `gate`, one gate is opened per GPU
    by `executor` (default: a :class:`~klineage.executors.LocalExecutor` on `devices`, every
    visible GPU unless given; a Dask executor gates on the cluster's GPU workers, the gate log
    staying here). With several `gates`, each state's attempts are
    gated in parallel, one per GPU. With `llm`, each state also gets an LLM-proposed removal
    (same gate, same budget). With `skip_no_ops` (the default), a removal that changes no
    machine code is refused before the gate; a verdict on the same machine code as an earlier
    one (this run's, or one logged before whose source the previous lineage holds) is shared.
    With `reuse_unaudited`, verdicts logged before the timing audits are served too (to
    re-derive old results without a GPU; a run that measures leaves it off). `gate_options` go
    to the gates opened here (`profile=ProfileConfig()`: every state is profiled and each
    skill records its counter deltas and the bottleneck it relieved)."""
    if gate is None:
        chosen = executor if executor is not None else LocalExecutor(devices)
        # mining pairs every timed verdict with its parent state: the reference is timed only
        # for the expert's own verdict
        options = {"time_reference": "unpaired", **(gate_options or {})}
        with chosen.gates(**options) as opened:
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
    expert = problem.kernel_source()
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

    skills, probe_runs, trip_runs = extract_skills(problem, lineage, simplifier.removals, log)
    lineage.save(root / "lineages" / f"{problem.name}.json")
    SkillLibrary.update_problem(root, problem.name, skills)

    attempts = lineage.attempts()
    recall, missed = skill_recall(problem, skills)
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
        refusals=len(lineage.meta.refusals),
        remaining=list(lineage.meta.remaining or []),
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
