"""`replay`: the experiment. Each held-out problem's naive kernel, each method, one budget.

    from klineage import replay
    report = replay(["heldout/gelu", "heldout/row_sum"], skills="skills_out", out="replay_out")

Writes `out/replay.json` (per problem and method: start and best latency, speedups over the
naive kernel and the PyTorch reference, gate runs to 90% of the final gain, wasted runs, the
skills used and the expert each came from; a summary with geometric means and fast_p), the
forward lineages under `out/lineages/`, and a PNG chart.

With `llm=provider`, the `skills` method asks the LLM to apply a retrieved skill no rule can
apply (see :mod:`klineage.replay.methods`); the baselines never ask it. `methods=[..., "tree"]`
adds the skills method under a beam search of `beam_width` (the same budget; its final speedup
and `runs_to_best` beside the greedy `skills` method's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator

from klineage.executors import Executor, LocalExecutor
from klineage.gate.log import GateLike, GateLog
from klineage.gate.pool import spread
from klineage.gate.result import geomean
from klineage.llm.base import Provider
from klineage.problem import Problem, load_problem
from klineage.replay.methods import (
    ALL_METHODS,
    BEAM_WIDTH,
    CARRIERS_FIRST,
    NO_CHANGE,
    PROFILED,
    SAME_AS_GATED,
    TREE,
    Materializer,
)
from klineage.replay.misses import Miss, explain_misses
from klineage.replay.results import (
    GateRunRecord,
    MethodResult,
    ReplayBudget,
    against_reference,
)
from klineage.replay.sources import SkillSources

FAST_P = (1.0, 1.5)
SKILLED = ("skills", TREE, PROFILED)
"""The methods that replay skills (and may ask the LLM to apply one)."""


class MethodSummary(BaseModel):
    """One method over all problems."""

    method: str = Field(description="skills, blind, memory, tree or profiled")
    geomean_speedup: float = Field(description="over the naive kernels")
    geomean_vs_reference: float = Field(description="reference latency / best latency")
    fast_p: dict[str, float] = Field(
        description="share of problems faster than the reference by p (keys '1.0', '1.5')"
    )
    mean_runs_to_90: float = Field(description="mean gate runs to 90% of the final gain")
    mean_runs_to_best: float = Field(
        default=0.0, description="mean gate runs to the final gain (older reports: 0)"
    )
    total_wasted: int = Field(description="gate runs rejected or not faster, all problems")
    no_machine_code_change: int = Field(
        default=0,
        description="moves not gated because they left the machine code as it was (the same "
        "SASS and host code as the state they apply to), all problems: gate runs the "
        "machine-code check saved (older reports: 0)",
    )
    same_as_gated: int = Field(
        default=0,
        description="moves not gated because they wrote the machine code of a kernel already "
        "gated from the same state (its verdict known), all problems (older reports: 0)",
    )


class MatchedRuns(BaseModel):
    """Gate runs a method and blind search each spent to reach the same speed: on each problem
    where both gained, the lower of their two final speedups."""

    method: str = Field(description="skills, tree, profiled or memory")
    problems: int = Field(description="problems where both this method and blind gained")
    runs: int = Field(description="this method's gate runs to that speed, summed")
    blind_runs: int = Field(description="blind search's gate runs to that speed, summed")


def runs_to_reach(result: MethodResult, speedup: float) -> int:
    """The first gate run after which `result` was at least `speedup` (0 if it starts there)."""
    if speedup <= 1.0:
        return 0
    return next(
        (r.index for r in result.runs if r.speedup >= speedup * (1 - 1e-3)), len(result.runs)
    )


def matched_runs(results: Sequence[MethodResult]) -> list[MatchedRuns]:
    """For skills, tree, profiled and memory: the gate runs each and blind search spent to
    reach the same speed."""
    blind = {r.problem: r for r in results if r.method == "blind"}
    out = []
    for method in ("skills", TREE, PROFILED, "memory"):
        rows = [r for r in results if r.method == method and r.problem in blind]
        pairs = [(r, blind[r.problem]) for r in rows]
        pairs = [(a, b) for a, b in pairs if min(a.speedup, b.speedup) > 1.01]
        if not pairs:
            continue
        out.append(
            MatchedRuns(
                method=method,
                problems=len(pairs),
                runs=sum(runs_to_reach(a, min(a.speedup, b.speedup)) for a, b in pairs),
                blind_runs=sum(runs_to_reach(b, min(a.speedup, b.speedup)) for a, b in pairs),
            )
        )
    return out


class ReplayReport(BaseModel):
    """The whole experiment."""

    budget: ReplayBudget = Field(description="per problem and method")
    skills: list[str] = Field(
        description="the skills folders used, in the order given (older reports name one)"
    )
    results: list[MethodResult] = Field(description="one per problem and method")
    summary: list[MethodSummary] = Field(description="one per method")
    llm: str | None = Field(
        default=None, description="'llm:<kind>:<model>' the skills method asked, if any"
    )
    beam_width: int | None = Field(
        default=None, description="the tree method's beam width (None: the tree was not run)"
    )
    carriers_first: int | None = Field(
        default=None,
        description="gate runs a mechanism's carriers got at a state, none kept, before the "
        "rest waited behind later skills (None: each skill's carriers in a row, as every "
        "report before 2026-12-04)",
    )
    llm_usage: dict[str, Any] | None = Field(
        default=None, description="the LLM's calls, tokens and estimated cost (this run)"
    )
    versus_blind: list[MatchedRuns] = Field(
        default_factory=list, description="gate runs to the same speed as blind search"
    )
    misses: list[Miss] = Field(
        default_factory=list,
        description="why the skills method fell short where a baseline ended faster",
    )

    @field_validator("skills", mode="before")
    @classmethod
    def _one_folder_as_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @classmethod
    def load(cls, path: str | Path) -> ReplayReport:
        """The report `replay` wrote at `path` (`replay_out/replay.json`, or the kept H200 run
        `bench/results/replay.json`); a file that is not one raises ValueError naming it."""
        file = Path(path)
        try:
            return cls.model_validate_json(file.read_text(encoding="utf-8"))
        except ValueError as err:  # pydantic's ValidationError is one
            raise ValueError(f"{file}: not a report written by `klineage replay` ({err})") from err


def summarize(results: Sequence[MethodResult]) -> list[MethodSummary]:
    """One summary per method over all problems: geometric means, fast_p, runs to 90%, waste."""
    methods = sorted({r.method for r in results}, key=ALL_METHODS.index)
    summaries = []
    for method in methods:
        rows = [r for r in results if r.method == method]
        summaries.append(
            MethodSummary(
                method=method,
                geomean_speedup=geomean([r.speedup for r in rows]),
                geomean_vs_reference=geomean([r.speedup_vs_reference for r in rows]),
                fast_p={
                    str(p): sum(r.speedup_vs_reference > p for r in rows) / len(rows)
                    for p in FAST_P
                },
                mean_runs_to_90=sum(r.runs_to_90 for r in rows) / len(rows),
                mean_runs_to_best=sum(r.runs_to_best for r in rows) / len(rows),
                total_wasted=sum(r.wasted for r in rows),
                no_machine_code_change=sum(
                    reason.endswith(NO_CHANGE) for r in rows for reason in r.refusals
                ),
                same_as_gated=sum(SAME_AS_GATED in reason for r in rows for reason in r.refusals),
            )
        )
    return summaries


def replay(
    problems: Sequence[str | Path],
    skills: str | Path | Sequence[str | Path] | SkillSources = "skills_out",
    out: str | Path = "replay_out",
    *,
    gate: GateLike | None = None,
    gates: Sequence[GateLike] | None = None,
    devices: Sequence[int] | None = None,
    methods: Sequence[str] = ("skills", "blind", "memory"),
    budget: ReplayBudget | None = None,
    resume: bool = True,
    on_run: Callable[[str, str, GateRunRecord], None] | None = None,
    llm: Provider | None = None,
    skip_no_ops: bool = True,
    executor: Executor | None = None,
    gate_options: Mapping[str, Any] | None = None,
    beam_width: int = BEAM_WIDTH,
    carriers_first: int | None = CARRIERS_FIRST,
) -> ReplayReport:
    """Run every method on every problem; write the report, lineages and chart to `out`.
    `skills` is one mined folder or several (:class:`SkillSources`); the report names the
    folder each used skill came from. With `llm`, the skills method asks it to apply skills
    no rule can apply.

    Problems are spread over `gates` (one per GPU), one problem per gate at a time: a
    problem's methods share one gate, so their verdicts are timed on the same device.
    Without `gate` or `gates`, one gate is opened per GPU by `executor` (default: a
    :class:`~klineage.executors.LocalExecutor` on `devices`, every visible GPU unless given;
    a Dask executor gates on the cluster's GPU workers, the gate logs staying here). With
    `skip_no_ops` (the default), a move that changes no machine code is not gated, and a
    verdict on machine code already judged is shared. `gate_options` go to the gates opened
    here (`profile=ProfileConfig()`: the skills method ranks by the current kernel's
    bottleneck, or, with the `profiled` method among `methods`, that method does and `skills`
    ranks without profiles, so the two compare the ranking alone; `energy=EnergyConfig()`:
    energy per call in the report). `beam_width` is the tree method's (states a level, kept
    skills gated at each); `carriers_first` the gate runs the skills methods give a mechanism's
    carriers at a state before the rest wait behind later skills (None: all in a row)."""
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; expected one of {', '.join(ALL_METHODS)}")
    if (
        PROFILED in methods
        and gate is None
        and not gates
        and not (gate_options or {}).get("profile")
    ):
        raise ValueError(
            "the profiled method ranks by profiles: open the gates with "
            "gate_options={'profile': ProfileConfig()} (klineage replay --profile)"
        )
    if beam_width < 1:
        raise ValueError(f"the tree method's beam width must be at least 1, not {beam_width}")
    if carriers_first is not None and carriers_first < 1:
        raise ValueError(
            f"carriers_first must be at least 1 (or None: no waiting), not {carriers_first}"
        )
    sources = skills if isinstance(skills, SkillSources) else SkillSources.load(skills)
    if not len(sources):
        raise FileNotFoundError(
            f"{', '.join(sources.folders)}: no skills in skills.jsonl; run `klineage mine` first"
        )
    if gate is not None:
        gates = [gate]
    if not gates:
        chosen = executor if executor is not None else LocalExecutor(devices)
        with chosen.gates(**(gate_options or {})) as opened:
            return replay(
                problems,
                sources,
                out,
                gates=opened,
                methods=methods,
                budget=budget,
                resume=resume,
                on_run=on_run,
                llm=llm,
                skip_no_ops=skip_no_ops,
                beam_width=beam_width,
                carriers_first=carriers_first,
            )
    limits = budget or ReplayBudget()
    root = Path(out)
    loaded = []
    for folder in problems:  # every problem is checked before the first gate run
        problem = load_problem(folder)
        if problem.kernel_path is None:
            raise FileNotFoundError(f"{problem.root}: no kernel.cu to start from")
        loaded.append(problem)

    def one_problem(problem: Problem, on: GateLike) -> list[MethodResult]:
        naive = problem.kernel_source()
        log = GateLog(
            root / "gatelog" / f"{problem.name}.jsonl", on, resume=resume, share=skip_no_ops
        )
        results = []
        for method in methods:

            def report_run(m: str, record: GateRunRecord, name: str = problem.name) -> None:
                if on_run is not None:
                    on_run(name, m, record)

            materializer = Materializer(
                log,
                sources.skills,
                limits,
                on_run=report_run,
                llm=llm if method in SKILLED else None,
                skip_no_ops=skip_no_ops,
                skill_folders=sources.folder_of,
                beam_width=beam_width,
                skills_rank_by_profile=PROFILED not in methods,
                carriers_first=carriers_first,
            )
            result, lineage = materializer.run(problem, naive, method)
            lineage.save(root / "lineages" / f"{problem.name}.{method}.json")
            results.append(result)
        references = log.reference_medians(problem.name)
        return [against_reference(result, references) for result in results]

    per_problem = spread(list(gates), len(loaded), lambda i, on: one_problem(loaded[i], on))
    results = [r for rows in per_problem for r in rows]
    report = ReplayReport(
        budget=limits,
        skills=sources.folders,
        results=results,
        summary=summarize(results),
        llm=f"llm:{llm.kind}:{llm.model}" if llm is not None else None,
        llm_usage=llm.accounting.summary() if llm is not None else None,
        beam_width=beam_width if TREE in methods else None,
        carriers_first=carriers_first,
        versus_blind=matched_runs(results),
        misses=explain_misses(results, loaded, sources.skills, root / "lineages"),
    )
    root.mkdir(parents=True, exist_ok=True)
    (root / "replay.json").write_text(report.model_dump_json(indent=1) + "\n")
    with contextlib.suppress(RuntimeError):  # without matplotlib the JSON report stands alone
        draw_chart(report, root / "replay.png")
    return report


def draw_chart(report: ReplayReport, path: str | Path) -> Path:
    """Grouped bars: speedup over the naive kernel per problem and method (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("the chart needs matplotlib: pip install 'klineage[viz]'") from err
    problems = sorted({r.problem for r in report.results})
    methods = [s.method for s in report.summary]
    width = 0.8 / max(1, len(methods))
    figure, axes = plt.subplots(figsize=(max(8, 0.6 * len(problems) + 3), 5))
    for i, method in enumerate(methods):
        values = []
        for problem in problems:
            match = [r for r in report.results if r.problem == problem and r.method == method]
            values.append(match[0].speedup if match else 0.0)
        positions = [p + i * width for p in range(len(problems))]
        axes.bar(positions, values, width=width, label=method)
    axes.set_xticks([p + width * (len(methods) - 1) / 2 for p in range(len(problems))])
    axes.set_xticklabels(problems, rotation=60, ha="right", fontsize=8)
    axes.set_yscale("log")
    axes.set_ylabel("speedup over the naive kernel")
    axes.axhline(1.0, color="gray", linewidth=0.8)
    axes.legend()
    axes.set_title(f"replay at a budget of {report.budget.gate_runs} gate runs")
    target = Path(path)
    figure.savefig(target, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return target


def load_replay(path: str | Path) -> ReplayReport:
    """The report at `path` (:meth:`ReplayReport.load`)."""
    return ReplayReport.load(path)
