"""`klineage replay`: materialize skills on naive kernels, against two baselines."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from klineage.cli.executor import (
    ExecutorOption,
    SchedulerOption,
    WorkerProgress,
    check_problem_folders,
    open_cli_executor,
    refuse_profile_on_a_cluster,
)
from klineage.cli.gate_options import EnergyOption, ProfileOption, optional_stages
from klineage.cli.llm import LlmCacheOption, LlmOption, LlmReplayOnlyOption, open_llm, usage_line
from klineage.cli.tables import Column, print_rows
from klineage.executors import ExecutorError, ExecutorKind
from klineage.lineage import is_llm_origin
from klineage.replay.methods import ALL_METHODS, BEAM_WIDTH, CARRIERS_FIRST, PROFILED
from klineage.replay.results import GateRunRecord, ReplayBudget
from klineage.replay.run import ReplayReport, replay

console = Console()
errors = Console(stderr=True, soft_wrap=True)


def replay_command(
    problems: Annotated[
        list[Path],
        typer.Argument(metavar="PROBLEM_DIR", help="Problem folders with a naive kernel."),
    ],
    skills: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="DIR",
            help="A mined skills folder; repeat it to replay skills from several (the report "
            "names the folder each used skill came from). Default: skills_out.",
        ),
    ] = None,
    budget: Annotated[int, typer.Option(help="Gate runs per problem and method.")] = 30,
    baselines: Annotated[
        str,
        typer.Option(
            help="Comma-separated methods to run beside skills: blind,memory, tree (the "
            "skills under a beam search) and profiled (the skills ranked by the current "
            "kernel's bottleneck; needs --profile)."
        ),
    ] = "blind,memory",
    beam_width: Annotated[
        int,
        typer.Option(
            min=1, help="The tree method's beam: states a level, kept skills gated at each."
        ),
    ] = BEAM_WIDTH,
    carriers_first: Annotated[
        int,
        typer.Option(
            min=0,
            help="Gate runs the skills methods give a mechanism's carriers at a state, none "
            "kept, before its other carriers wait behind later skills (0: all in a row).",
        ),
    ] = CARRIERS_FIRST,
    out: Annotated[Path, typer.Option(help="Where the report goes.")] = Path("replay_out"),
    resume: Annotated[
        bool, typer.Option("--resume/--fresh", help="Reuse verdicts already in the gate log.")
    ] = True,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated GPU indexes of this host to spread the problems over, one "
            "problem per GPU at a time (default: every visible GPU)."
        ),
    ] = None,
    executor: ExecutorOption = ExecutorKind.LOCAL,
    scheduler: SchedulerOption = None,
    llm: LlmOption = None,
    llm_cache: LlmCacheOption = None,
    llm_replay_only: LlmReplayOnlyOption = False,
    profile: ProfileOption = False,
    energy: EnergyOption = False,
    offline: Annotated[
        bool,
        typer.Option(
            help="Time nothing: serve every verdict and profile from the gate logs in OUT (a "
            "run made on a GPU, resumed), building with nvcc for the machine-code check; "
            "stops at the first one the logs lack. Re-derives a report on a machine "
            "without a GPU."
        ),
    ] = False,
) -> None:
    """Replay mined skills on each problem's naive kernel, beside the baselines.

    With --llm, the skills method asks the LLM to apply a retrieved skill when no rule can
    (the rule refused, or the catalog lacks the skill's mechanism); the baselines never do.
    With --profile, the skills method ranks first the skills that relieved the current
    kernel's bottleneck on their expert; with --profile and --baselines ...,profiled, the
    profiled method does that and the skills method ranks without profiles, on the same
    budget, so the report compares the two rankings.

    With --baselines tree (say blind,memory,tree), the same skills are also replayed under a
    beam search on the same budget: --beam-width states a level, that many kept skills gated
    at each, the fastest children expanded next; the report gives its final speedup and the
    gate runs to reach it beside the greedy skills method's.

    With --executor dask, the problems' gate runs are tasks on a Dask cluster's GPU workers
    (as many problems under way as GPU workers), builds run on any worker, and the gate logs
    are written here, so a killed run resumes with no gate run repeated.

    \b
    On a cluster (pip install 'klineage[dask]'):
      klineage replay heldout/* --executor dask --scheduler tcp://HOST:8786
    On this host, one worker per GPU (dask-cuda's cluster where installed):
      klineage replay heldout/* --executor dask

    \b
    PROVIDER:MODEL for --llm, keys from the environment:
      anthropic:MODEL
      openai:MODEL
      openai-compatible:MODEL@http://HOST:PORT/v1"""
    from klineage.gate.build import Builder
    from klineage.gate.gate import GateSetupError
    from klineage.gate.log import LogOnlyGate, VerdictMissing

    chosen = ["skills"] + [b.strip() for b in baselines.split(",") if b.strip()]
    unknown = [m for m in chosen if m not in ALL_METHODS]
    if unknown:
        choices = ", ".join(m for m in ALL_METHODS if m != "skills")
        errors.print(Text(f"unknown baseline {unknown[0]!r}; choose from {choices}", "red"))
        raise typer.Exit(2)
    if PROFILED in chosen and not profile:
        errors.print(Text("--baselines profiled ranks by profiles: add --profile", "red"))
        raise typer.Exit(2)
    if offline and (executor != ExecutorKind.LOCAL or devices or llm or not resume):
        errors.print(
            Text("--offline serves the logs alone: no executor, devices, LLM or --fresh", "red")
        )
        raise typer.Exit(2)
    check_problem_folders(problems, "the naive kernel replay starts from", errors)
    provider = open_llm(llm, llm_cache, llm_replay_only, errors)  # before any gate run
    refuse_profile_on_a_cluster(executor, profile, errors)
    running = open_cli_executor(executor, scheduler, devices, errors)
    workers = WorkerProgress(running.tally, f"tasks per worker ({running.describe()})")

    def on_run(problem: str, method: str, record: GateRunRecord) -> None:
        ratio = f"{record.ratio:.3f}" if record.ratio is not None else "-"
        styles = {"kept": "green", "slower": "yellow", "outranked": "cyan"}
        style = styles.get(record.outcome, "red")
        by = " [LLM]" if is_llm_origin(record.origin) else ""
        console.print(
            Text(f"{problem} {method:6s} #{record.index:<3d} {record.action + by:24s} ")
            + Text(f"{record.outcome:8s}", style=style)
            + Text(f" ratio {ratio}  speedup {record.speedup:.2f}x")
        )

    try:
        # offline, no worker runs a task: no table of them
        live = nullcontext() if offline else Live(workers, console=console, refresh_per_second=2)
        with running, live:
            report = replay(
                problems,
                skills or [Path("skills_out")],
                out,
                methods=chosen,
                executor=running,
                budget=ReplayBudget(gate_runs=budget),
                resume=resume,
                on_run=on_run,
                llm=provider,
                gate_options=optional_stages(profile, energy, every_verdict=False),
                beam_width=beam_width,
                carriers_first=carriers_first or None,
                gate=LogOnlyGate(Builder(), profiles=profile) if offline else None,
            )
    except VerdictMissing as err:
        errors.print(Text(f"{err} (the logs in {out}/gatelog lack it)", "red"))
        raise typer.Exit(2) from err
    except GateSetupError as err:
        errors.print(Text(f"gate error: {err}", "red"))
        raise typer.Exit(2) from err
    except ExecutorError as err:
        errors.print(Text(f"executor error: {err}", "red"))
        raise typer.Exit(2) from err
    except (FileNotFoundError, ValueError) as err:
        errors.print(Text(str(err), "red"))
        raise typer.Exit(2) from err
    finally:
        if provider is not None:
            console.print(usage_line(provider))
    print_report(report)
    console.print(f"report: {out / 'replay.json'}, chart: {out / 'replay.png'}")


def print_report(report: ReplayReport, out: Console | None = None) -> None:
    """Print a replay report as a table: per problem and method, latencies, speedups and skills
    used."""
    show = out or console
    measured = any(r.best_joules for r in report.results)
    columns = [
        Column("problem", key=True),
        Column("method", key=True),
        Column.figure("start (ms)", optional=True),
        Column.figure("best (ms)", optional=True),
        Column.figure("vs naive"),
        Column.figure("vs PyTorch"),
        Column.figure("runs to 90%"),
        Column.figure("runs to best", optional=True),
        Column.figure("wasted"),
        *([Column.figure("best mJ/call", optional=True)] if measured else []),
        Column("skills used (from)", optional=True, min_width=24),
    ]
    several = len(report.skills) > 1  # then each skill also names its folder
    rows = []
    for r in report.results:
        used = ", ".join(
            f"{u.skill.split('--')[0]} ({u.source}"
            + (f" in {u.folder}" if several and u.folder else "")
            + (", by the LLM" if is_llm_origin(u.origin) else "")
            + ")"
            for u in r.skills_used
        )
        rows.append(
            [
                r.problem,
                r.method,
                f"{sum(r.start_ms.values()):.4f}",
                f"{sum(r.best_ms.values()):.4f}",
                f"{r.speedup:.2f}x",
                f"{r.speedup_vs_reference:.2f}x",
                str(r.runs_to_90),
                str(r.runs_to_best),
                str(r.wasted),
                *([f"{sum(r.best_joules.values()) * 1e3:.4g}"] if measured else []),
                used,
            ]
        )
    print_rows(show, columns, rows)
    summary = [
        Column("method", key=True),
        Column.figure("geomean vs naive"),
        Column.figure("geomean vs PyTorch"),
        Column.figure("fast_1.0"),
        Column.figure("fast_1.5"),
        Column.figure("mean runs to 90%", optional=True),
        Column.figure("mean runs to best", optional=True),
        Column.figure("wasted"),
        Column.figure("no-ops not gated", optional=True),
        Column.figure("repeats not gated", optional=True),
    ]
    print_rows(
        show,
        summary,
        [
            [
                s.method,
                f"{s.geomean_speedup:.2f}x",
                f"{s.geomean_vs_reference:.2f}x",
                f"{s.fast_p['1.0']:.0%}",
                f"{s.fast_p['1.5']:.0%}",
                f"{s.mean_runs_to_90:.1f}",
                f"{s.mean_runs_to_best:.1f}",
                str(s.total_wasted),
                str(s.no_machine_code_change),
                str(s.same_as_gated),
            ]
            for s in report.summary
        ],
    )
    if report.misses:
        misses = [
            Column("problem", key=True),
            Column("mechanism", key=True),
            Column("baseline kept it at", short=True),
            Column("why skills did not", min_width=30),
        ]
        rows = [
            [
                miss.problem,
                miss.mechanism,
                f"{miss.ratio:.2f}x ({miss.baseline})",
                f"{miss.reason}: {miss.detail}",
            ]
            for miss in report.misses
        ]
        print_rows(show, misses, rows)
