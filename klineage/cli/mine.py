"""`klineage mine`, `klineage skills list|show`, `klineage lineage show`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

from klineage.cli.executor import (
    ExecutorOption,
    SchedulerOption,
    WorkerProgress,
    check_problem_folders,
    open_cli_executor,
    refuse_profile_on_a_cluster,
)
from klineage.cli.gate_options import ProfileOption, optional_stages
from klineage.cli.llm import LlmCacheOption, LlmOption, LlmReplayOnlyOption, open_llm, usage_line
from klineage.cli.tables import Column, print_rows
from klineage.executors import ExecutorError, ExecutorKind
from klineage.lineage import AttemptStatus, LineageGraph, is_llm_origin
from klineage.llm import Provider, ProviderError
from klineage.mining.mine import MineReport, mine
from klineage.mining.walk import MiningBudget, WalkEvent
from klineage.problem import ProblemError, load_problem
from klineage.skills import SkillLibrary, SkillLookupError, render_skill_md

console = Console()
errors = Console(stderr=True, soft_wrap=True)

skills_app = typer.Typer(help="Read mined skills.", no_args_is_help=True, rich_markup_mode=None)
lineage_app = typer.Typer(help="Read mined lineages.", no_args_is_help=True, rich_markup_mode=None)

OutOption = Annotated[Path, typer.Option("--out", help="The skills folder.")]


def _fail(message: str, code: int = 2) -> NoReturn:
    errors.print(Text(message, style="red"))
    raise typer.Exit(code)


class WalkView:
    """A live summary of the walk: state, attempts, accepted, rejected, ratios."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.step = 0
        self.state = ""
        self.runs = 0
        self.accepted = 0
        self.rejected = 0
        self.ratios: list[float] = []
        self.last = ""
        self.llm_attempts = 0
        self.llm_rejections = 0

    def update(self, event: WalkEvent) -> None:
        """Take in one event of the walk."""
        self.step, self.runs = event.step, event.gate_runs
        self.state = event.state[:10]
        if event.kind == "llm_rejection":
            self.llm_rejections += 1
            self.last = f"LLM answer not used: {event.message[:80]}"
        if event.attempt is not None:
            a = event.attempt
            if a.status is AttemptStatus.ACCEPTED:
                self.accepted += 1
                if a.ratio is not None:
                    self.ratios.append(a.ratio)
            else:
                self.rejected += 1
            ratio = f"{a.ratio:.3f}" if a.ratio is not None else "-"
            by = " [LLM]" if is_llm_origin(a.origin) else ""
            self.llm_attempts += bool(by)
            self.last = f"{a.mechanism}{by}: {a.status.value} (ratio {ratio})"

    def render(self) -> Table:
        """The live table: step, gate runs, state, best and worst ratio so far."""
        table = Table(title=f"mining {self.problem}", show_header=False)
        best = f"{max(self.ratios):.3f}" if self.ratios else "-"
        worst = f"{min(self.ratios):.3f}" if self.ratios else "-"
        rows = [
            ("step", str(self.step)),
            ("state", self.state),
            ("gate runs", str(self.runs)),
            ("accepted / rejected", f"{self.accepted} / {self.rejected}"),
            ("best / worst ratio", f"{best} / {worst}"),
            ("last attempt", self.last),
        ]
        if self.llm_attempts or self.llm_rejections:
            rows.insert(
                4, ("LLM attempts / unused answers", f"{self.llm_attempts} / {self.llm_rejections}")
            )
        for key, value in rows:
            table.add_row(key, value)
        return table


def mine_command(
    problems: Annotated[
        list[Path], typer.Argument(metavar="PROBLEM_DIR", help="Expert problem folders.")
    ],
    out: Annotated[Path, typer.Option(help="Where skills and lineages go.")] = Path("skills_out"),
    budget: Annotated[int, typer.Option(help="Gate runs the walk may spend per problem.")] = 300,
    wall: Annotated[float, typer.Option(help="Wall seconds per problem's walk.")] = 3600.0,
    resume: Annotated[
        bool, typer.Option("--resume/--fresh", help="Reuse verdicts already in the gate log.")
    ] = True,
    report: Annotated[
        Path | None, typer.Option(help="Write the per-problem report as JSON here.")
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated GPU indexes of this host; each state's attempts are gated "
            "side by side, one per GPU (default: every visible GPU)."
        ),
    ] = None,
    executor: ExecutorOption = ExecutorKind.LOCAL,
    scheduler: SchedulerOption = None,
    llm: LlmOption = None,
    llm_cache: LlmCacheOption = None,
    llm_replay_only: LlmReplayOnlyOption = False,
    profile: ProfileOption = False,
) -> None:
    """Walk each expert kernel backward through the gate and write verified skills.

    With --llm, each state also gets one removal proposed by the LLM, gated like the
    catalog's and recorded in the lineage with its origin. With --profile, every state is
    profiled (Nsight Compute) and each skill's card shows its counter deltas and the
    bottleneck it relieved.

    With --executor dask, each state's attempts are gated side by side on a Dask cluster's
    GPU workers (one gate run per GPU at a time), builds run on any worker, and the gate
    log is written here, so a killed run resumes with no gate run repeated.

    \b
    On a cluster (pip install 'klineage[dask]'), one worker per GPU, each
    started with CUDA_VISIBLE_DEVICES set to its GPU:
      dask scheduler
      dask worker tcp://HOST:8786 --nthreads 2 --resources GPU=1
      klineage mine DIR --executor dask --scheduler tcp://HOST:8786
    On this host, one worker per GPU (dask-cuda's cluster where installed):
      klineage mine DIR --executor dask [--devices 0,1]

    \b
    PROVIDER:MODEL for --llm, keys from the environment:
      anthropic:MODEL
      openai:MODEL
      openai-compatible:MODEL@http://HOST:PORT/v1"""
    from klineage.gate.gate import GateSetupError

    check_problem_folders(problems, "the expert kernel mining walks backward", errors)
    provider = open_llm(llm, llm_cache, llm_replay_only, errors)  # before any gate run
    refuse_profile_on_a_cluster(executor, profile, errors)
    running = open_cli_executor(executor, scheduler, devices, errors)
    limits = MiningBudget(gate_runs=budget, wall_seconds=wall)
    reports: list[MineReport] = []
    workers = WorkerProgress(running.tally, f"tasks per worker ({running.describe()})")
    try:
        stages = optional_stages(profile, energy=False, every_verdict=False)
        with running, running.gates(time_reference="unpaired", **stages) as gates:
            for folder in problems:
                view = WalkView(folder.name)
                shown = Group(view.render(), workers)
                with Live(shown, console=console, refresh_per_second=4) as live:

                    def on_event(
                        event: WalkEvent, view: WalkView = view, live: Live = live
                    ) -> None:
                        view.update(event)
                        live.update(Group(view.render(), workers))

                    result = mine(
                        folder,
                        out,
                        gate=gates[0],
                        gates=gates,
                        budget=limits,
                        resume=resume,
                        on_event=on_event,
                        llm=provider,
                    )
                reports.append(result)
                _print_report(result)
                if profile:
                    _print_counters(out, folder, result)
                if report is not None:  # after each problem: a killed run keeps what finished
                    _write_report(report, reports, provider)
    except GateSetupError as err:
        _fail(f"gate error: {err}")
    except ExecutorError as err:
        _fail(f"executor error: {err}")
    except ProviderError as err:
        _fail(f"LLM error: {err.message}")
    except (FileNotFoundError, ValueError) as err:
        _fail(str(err))
    finally:
        if provider is not None:
            console.print(usage_line(provider))
    if report is not None:
        _write_report(report, reports, provider)


def _write_report(path: Path, reports: list[MineReport], provider: Provider | None) -> None:
    data: dict[str, object] = {"problems": [r.model_dump(mode="json") for r in reports]}
    if provider is not None:
        data["llm_usage"] = provider.accounting.summary()
    path.write_text(json.dumps(data, indent=2) + "\n")


def _print_report(r: MineReport) -> None:
    recall = f"{r.recall:.0%}" if r.recall is not None else "-"
    console.print(
        f"[bold]{r.problem}[/bold]: {r.termination}, {r.steps} steps, "
        f"{r.walk_gate_runs} walk + {r.probe_gate_runs} probe + "
        f"{r.round_trip_gate_runs} round-trip gate runs, "
        f"{r.accepted} accepted / {r.rejected} rejected, {r.skills} skills "
        f"({r.verified} verified), recall {recall}, {r.wall_seconds:.0f} s"
    )
    if r.missed:
        console.print(f"  no skill for: {', '.join(r.missed)}")
    if r.remaining:
        console.print(f"  left in running code, every site refused: {', '.join(r.remaining)}")
    if r.llm_attempts or r.llm_rejections:
        console.print(
            f"  LLM: {r.llm_attempts} proposals gated ({r.llm_accepted} accepted), "
            f"{r.llm_rejections} answers not used"
        )


def _print_counters(out: Path, folder: Path, r: MineReport) -> None:
    """How many of a problem's skills got counter deltas under --profile: a run whose gate made
    no profile says so, instead of leaving cards without counters unexplained."""
    if not r.skills:
        return
    mined = [s for s in SkillLibrary.load(out) if s.evidence.problem == r.problem]
    counted = sum(s.profile is not None for s in mined)
    if counted == len(mined):
        return
    console.print(
        f"  [yellow]--profile: counters on {counted} of {len(mined)} skills; a state without "
        f"them was not profiled (`klineage gate {folder} --profile` says why: ncu missing, "
        "or not allowed to read the counters)[/yellow]"
    )


def _library(out: Path) -> SkillLibrary:
    try:
        library = SkillLibrary.load(out)
    except FileNotFoundError:
        _fail(f"{out}: no skills.jsonl here; run `klineage mine` first or pass --out")
    except ValueError as err:  # a corrupt line: one line naming the file and line
        _fail(str(err))
    if not len(library):
        _fail(f"{out}: skills.jsonl holds no skills; run `klineage mine` first or pass --out")
    return library


@skills_app.command("list")
def skills_list(out: OutOption = Path("skills_out")) -> None:
    """One line per skill: id, measured gain, what it measured, verified, conditions."""
    columns = [
        Column("id", key=True),
        Column.figure("gain"),
        Column("measured", short=True),
        Column("verified", short=True),
        Column("conditions", optional=True, min_width=30),
    ]
    rows = []
    for skill in _library(out):
        gain = skill.effect.geomean_speedup
        rows.append(
            [
                skill.id,
                f"{gain:.2f}x" if gain else "-",
                skill.effect.measured.value,
                {True: "yes", False: "no", None: "-"}[skill.verified],
                "; ".join(skill.condition_prose),
            ]
        )
    print_rows(console, columns, rows)


@skills_app.command("show")
def skills_show(
    skill_id: Annotated[str, typer.Argument(metavar="ID", help="A skill id (or a unique prefix).")],
    out: OutOption = Path("skills_out"),
    raw: Annotated[
        bool, typer.Option("--raw", help="Print the SKILL.md text exactly, even on a terminal.")
    ] = False,
) -> None:
    """Print a skill's card: SKILL.md exactly as written (`> card.md` gives the same file),
    or on a terminal rendered as Markdown."""
    try:
        skill = _library(out).get(skill_id)
    except SkillLookupError as err:
        _fail(err.message)
    card = render_skill_md(skill)
    if raw or not console.is_terminal:
        sys.stdout.write(card if card.endswith("\n") else card + "\n")
        return
    front, body = _split_front_matter(card)
    console.print(Text(front, style="dim"), soft_wrap=True)
    console.print(Markdown(body, code_theme="ansi_dark"))


def _split_front_matter(card: str) -> tuple[str, str]:
    """(the YAML front matter with its fences, the Markdown after it)."""
    if card.startswith("---\n"):
        end = card.find("\n---\n", 4)
        if end > 0:
            return card[: end + 4], card[end + 5 :]
    return "", card


@lineage_app.command("show")
def lineage_show(
    problem: Annotated[
        str,
        typer.Argument(
            metavar="PROBLEM", help="The problem: its folder (expert_kernels/softmax) or its name."
        ),
    ],
    out: OutOption = Path("skills_out"),
    png: Annotated[Path | None, typer.Option(help="Also draw the DAG to this PNG.")] = None,
) -> None:
    """The main path as a table, and optionally a drawing of the whole DAG."""
    name = _problem_name(problem)
    path = out / "lineages" / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in (out / "lineages").glob("*.json"))
        _fail(f"{path}: no lineage for {name!r}; known: {', '.join(known) or '(none)'}")
    try:
        lineage = LineageGraph.load(path)
    except ValueError as err:
        _fail(str(err).splitlines()[0])
    columns = [
        Column("step", key=True, justify="right"),
        Column("mechanism", key=True),
        Column("origin", short=True, optional=True),
        Column("ratio", short=True),
        Column("trials", short=True, optional=True),
        Column("parent", short=True),
        Column("child", short=True),
    ]
    rows = [
        [
            str(attempt.step),
            attempt.mechanism,
            attempt.origin,
            f"{attempt.ratio:.3f}" if attempt.ratio is not None else "-",
            ", ".join(f"{r:.3f}" for r in attempt.trial_ratios),
            attempt.parent[:10],
            attempt.child[:10],
        ]
        for attempt in lineage.main_path()
    ]
    termination = lineage.termination.value if lineage.termination else "?"
    print_rows(console, columns, rows, title=f"{lineage.problem}: {termination}")
    attempts = lineage.attempts()
    rejected = [a for a in attempts if a.status is AttemptStatus.REJECTED]
    notes = Text(
        f"{len(attempts)} attempts, {len(rejected)} rejected, {len(lineage.meta.refusals)} refusals"
    )
    by_llm = [a for a in attempts if is_llm_origin(a.origin)]
    if by_llm or lineage.meta.llm:
        accepted = sum(a.status is AttemptStatus.ACCEPTED for a in by_llm)
        notes.append(
            f"; {lineage.meta.llm or 'LLM'}: {len(by_llm)} attempts "
            f"({accepted} accepted), {len(lineage.llm_rejections)} answers not used"
        )
    console.print(notes)
    if png is not None:
        from klineage.cli.drawing import draw_lineage

        try:
            draw_lineage(lineage, png)
        except RuntimeError as err:  # no matplotlib: say how to get it, in one line
            _fail(str(err))
        console.print(f"drew {png}")


def _problem_name(problem: str) -> str:
    """The definition name of a problem folder, or `problem` itself when it names one."""
    folder = Path(problem)
    if not (folder / "definition.json").is_file():
        return problem
    try:
        return load_problem(folder).name
    except ProblemError as err:
        _fail(str(err))
