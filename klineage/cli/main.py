"""The `klineage` command."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from klineage import __version__
from klineage.cli.gate_options import EnergyOption, ProfileOption, optional_stages
from klineage.cli.import_export import export_command, import_command, new_command
from klineage.cli.mechanisms import mechanisms_app
from klineage.cli.mine import lineage_app, mine_command, skills_app
from klineage.cli.profile_view import print_profile
from klineage.cli.progress import progress_bar
from klineage.cli.replay import replay_command
from klineage.cli.tables import Column, print_rows, short_kernel_names
from klineage.gate.build import Builder, BuildResult, check_abi
from klineage.gate.gate import Gate, GateEvent, GateSetupError
from klineage.gate.result import GateVerdict, Status
from klineage.gate.trace import append_traces, verdict_to_traces
from klineage.kernel import KernelSource
from klineage.problem import Problem, ProblemError, load_problem
from klineage.problem.abi import KernelAbi

# Plain help (rich_markup_mode=None): paragraphs re-wrapped to the terminal, flags without a
# `<bool>`, long values such as the --llm spec never cut.
app = typer.Typer(
    help="Mine verified GPU-kernel optimization skills.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(mechanisms_app, name="mechanisms")
app.command("mine")(mine_command)
app.command("replay")(replay_command)
app.add_typer(skills_app, name="skills")
app.add_typer(lineage_app, name="lineage")
app.command("import")(import_command)
app.command("export")(export_command)
app.command("new")(new_command)
console = Console()
errors = Console(stderr=True, soft_wrap=True)


class WorkloadSet(str, enum.Enum):
    all = "all"
    probes = "probes"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"klineage {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = None,
) -> None:
    """klineage: gate, mine and replay CUDA kernel optimizations."""


@app.command()
def gate(
    problem_dir: Annotated[
        Path, typer.Argument(metavar="PROBLEM_DIR", help="Problem folder (definition.json, ...).")
    ],
    kernel: Annotated[
        Path | None, typer.Option(help="Kernel .cu to gate (default: PROBLEM_DIR/kernel.cu).")
    ] = None,
    against: Annotated[
        Path | None, typer.Option(help="Baseline .cu: time both interleaved, report the ratio.")
    ] = None,
    workloads: Annotated[
        WorkloadSet, typer.Option(help="Gate the required workloads, or the probes.")
    ] = WorkloadSet.all,
    build_only: Annotated[
        bool, typer.Option("--build-only", help="Only compile (works without a GPU).")
    ] = False,
    no_time: Annotated[
        bool, typer.Option("--no-time", help="Check correctness only; skip timing.")
    ] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the full verdict as JSON here.")
    ] = None,
    traces: Annotated[
        Path | None, typer.Option(help="Append FlashInfer-Trace traces (JSONL) here.")
    ] = None,
    arch: Annotated[str, typer.Option(help="GPU architecture to build for.")] = "sm_90",
    device: Annotated[int, typer.Option(help="Index of the GPU to run on.")] = 0,
    profile: ProfileOption = False,
    energy: EnergyOption = False,
) -> None:
    """Build a kernel, check it on every workload against the reference, and time it."""
    problem = _load(problem_dir)
    source = _kernel_source(problem, kernel)
    baseline = _read_kernel(against) if against else None
    builder = Builder(arch=arch)
    if build_only:
        abi = KernelAbi.from_definition(problem.definition)
        builder = builder.with_options(problem.build_options)
        with console.status(f"building {source.name} for {arch}"):
            built = builder.build(source.text, name=source.name, disassemble=True)
            build = check_abi(built, source.text, abi)
        _print_build(source, build)
        if json_out:
            json_out.write_text(build.model_dump_json(indent=2))
        raise typer.Exit(0 if build.ok else 1)

    chosen = problem.probes if workloads is WorkloadSet.probes else problem.workloads
    if not chosen:
        _fail(f"{problem.root}: no {workloads.value} workloads to gate")
    try:
        with (
            Gate(builder, device=device, **optional_stages(profile, energy)) as judge,
            progress_bar(console) as progress,
        ):
            task = progress.add_task(f"gating {source.name}", total=len(chosen))

            def on_event(event: GateEvent) -> None:
                label = f"{event.stage} {event.workload}".strip()
                advance = 1 if event.stage == "done" else 0
                progress.update(task, description=f"{source.name}: {label}", advance=advance)

            verdict = judge.run(
                problem,
                source,
                workloads=chosen,
                time_it=not no_time,
                against=baseline,
                on_event=on_event,
            )
    except GateSetupError as err:
        _fail(f"gate error: {err}")
    _print_build(source, verdict.build)
    if verdict.workloads:
        _print_verdict(verdict)
    if verdict.energy_unavailable:
        console.print(Text(f"no energy: {verdict.energy_unavailable}", style="yellow"))
    if verdict.profile is not None:
        print_profile(console, verdict.profile)
    if json_out:
        json_out.write_text(verdict.model_dump_json(indent=2))
    if traces:
        append_traces(traces, verdict_to_traces(verdict, problem))
    raise typer.Exit(0 if verdict.passed or workloads is WorkloadSet.probes else 1)


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print an error as plain text (paths and brackets are not markup) and exit."""
    errors.print(Text(message, style="red"))
    raise typer.Exit(code)


def _load(problem_dir: Path) -> Problem:
    try:
        return load_problem(problem_dir)
    except ProblemError as err:
        _fail(str(err))


def _read_kernel(path: Path) -> KernelSource:
    try:
        return KernelSource.from_file(path)
    except FileNotFoundError as err:
        _fail(str(err))


def _kernel_source(problem: Problem, kernel: Path | None) -> KernelSource:
    if kernel is not None:
        return _read_kernel(kernel)
    if problem.kernel_path is None:
        _fail(f"{problem.root}: no kernel.cu in the problem folder; pass --kernel FILE")
    return _read_kernel(problem.kernel_path)


def _print_build(source: KernelSource, build: BuildResult) -> None:
    if not build.ok:
        console.print(Text("COMPILE_ERROR ", style="red") + Text(source.name))
        console.print(Text(build.message), soft_wrap=True)
        return
    hit = "cached" if build.cached else f"{build.seconds:.2f} s"
    console.print(f"[green]built[/green] {source.name} ({source.fingerprint}, {hit})")
    if build.report and build.report.kernels:
        kernels = build.report.kernels
        columns = [
            Column("kernel", key=True),
            Column.figure("registers"),
            Column.figure("shared"),
            Column.figure("spills st/ld"),
            Column.figure("stack"),
        ]
        rows = [
            [
                name,
                str(k.registers),
                f"{k.shared_bytes} B",
                f"{k.spill_store_bytes}/{k.spill_load_bytes} B",
                f"{k.stack_bytes} B",
            ]
            for name, k in zip(short_kernel_names([k.name for k in kernels]), kernels, strict=True)
        ]
        print_rows(console, columns, rows)
    _print_machine_code(build)


def _print_machine_code(build: BuildResult) -> None:
    """Per kernel: its SASS fingerprint, size and the counted instructions."""
    code = build.machine_code
    if code is None:
        if build.machine_code_note:
            console.print(Text(build.machine_code_note, style="yellow"))
        return
    columns = [
        Column("kernel", key=True),
        Column.figure("SASS"),
        Column.figure("instructions"),
        Column("counted instructions"),
    ]
    names = short_kernel_names([k.name for k in code.kernels])
    rows = [
        [
            name,
            k.fingerprint[:12],
            str(k.instructions),
            ", ".join(f"{m} x{n}" for m, n in (k.histogram or {}).items()) or "-",
        ]
        for name, k in zip(names, code.kernels, strict=True)
    ]
    print_rows(console, columns, rows, title="machine code")
    console.print(f"device {code.device_fingerprint[:12]}, host {code.host_fingerprint[:12]}")
    if build.machine_code_note:
        console.print(Text(build.machine_code_note, style="yellow"))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_verdict(verdict: GateVerdict) -> None:
    compared = any(w.comparison for w in verdict.workloads)
    measured = any(w.energy for w in verdict.workloads)
    columns = [
        Column("workload", key=True),
        Column("status", key=True),
        Column("max abs err", short=True, optional=True),
        Column("max rel err", short=True, optional=True),
        Column("latency (ms)", short=True),
        Column("reference (ms)", short=True),
        Column("speedup", short=True),
        *([Column("vs baseline", short=True)] if compared else []),
        *([Column("energy (mJ)", short=True)] if measured else []),
    ]
    rows = []
    for w in verdict.workloads:
        color = "green" if w.passed else "red"
        c = w.correctness
        row: list[str | Text] = [
            w.label,
            Text(w.status.value, style=color),
            _fmt(c.max_absolute_error if c else None, ".2e"),
            _fmt(c.max_relative_error if c else None, ".2e"),
            _fmt(w.latency_ms, ".4f"),
            _fmt(w.reference_latency_ms, ".4f"),
            _fmt(w.speedup_factor, ".2f") + ("x" if w.speedup_factor else ""),
        ]
        if compared:
            row.append(_fmt(w.comparison.ratio if w.comparison else None, ".3f"))
        if measured:
            row.append(_fmt(w.joules_per_call * 1e3 if w.joules_per_call else None, ".4g"))
        rows.append(row)
    print_rows(console, columns, rows, title=f"{verdict.problem} on {verdict.hardware}")
    for w in verdict.workloads:
        if w.status is not Status.PASSED:
            console.print(Text(f"{w.label}: ", style="red") + Text(w.message), soft_wrap=True)
    pooled = verdict.comparison
    if pooled is not None:
        word = "not slower" if pooled.not_slower else "SLOWER"
        trials = ", ".join(f"{r:.3f}" for r in pooled.trial_ratios)
        console.print(f"baseline/candidate = {pooled.ratio:.3f} (trials {trials}): {word}")
    console.print(f"verdict: [bold]{verdict.status.value}[/bold]")


if __name__ == "__main__":
    app()
