"""``klineage mechanisms``: list the catalog, find sites, remove or apply one mechanism.

::

    klineage mechanisms list
    klineage mechanisms detect KERNEL.cu [--mechanism M ...] [--json]
    klineage mechanisms candidates KERNEL.cu [--mechanism M ...] [--json]
    klineage mechanisms remove KERNEL.cu MECHANISM [--site N|ID] [--out FILE | --in-place]
    klineage mechanisms apply KERNEL.cu MECHANISM [--site N|ID] [--carrier k=v ...]
                                                  [--out FILE | --in-place]
    klineage mechanisms walk KERNEL.cu|PROBLEM_DIR|REPO_DIR [--no-build] [--json]

``walk`` plans a mining walk on the CPU (no gate): the removals in mining's order, each state
built with nvcc, and the sites that stay with their rules' reasons; on a folder of CUDA files
(a repository), one line a file.

``--site N`` is the ``#`` column of ``detect`` (for remove) or ``candidates`` (for apply):
the N-th site of that mechanism, counting from 0; a site id works too. Without ``--out`` or
``--in-place`` the result is printed as a unified diff. Exit codes: 0 done, 1 the mechanism
refused (the reason is printed), 2 bad input.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from klineage.cli.progress import progress_bar
from klineage.cli.tables import Cell, Column, print_rows
from klineage.headers import read_repository_file
from klineage.kernel import KernelSource
from klineage.mechanisms import (
    Carrier,
    Mechanism,
    MechanismRefused,
    Site,
    UnknownMechanism,
    all_mechanisms,
    get,
)

if TYPE_CHECKING:
    from klineage.mining.plan import PlannedStep, WalkPlan

mechanisms_app = typer.Typer(
    help="The mechanism catalog: list, detect, remove and apply optimizations.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
console = Console()
errors = Console(stderr=True, soft_wrap=True)


def _kernel_file(path: Path) -> Path:
    """A problem folder stands for its kernel.cu (``expert_kernels/softmax``)."""
    if path.is_dir():
        kernel = path / "kernel.cu"
        if not kernel.is_file():
            raise typer.BadParameter(f"{path} is a folder without kernel.cu; pass a .cu file")
        return kernel
    return path


KernelArg = Annotated[
    Path,
    typer.Argument(
        metavar="KERNEL",
        help="A CUDA kernel source (.cu), or a problem folder (its kernel.cu).",
        callback=_kernel_file,
    ),
]
MechanismArg = Annotated[
    str, typer.Argument(metavar="MECHANISM", help="A mechanism name (see `list`).")
]
Only = Annotated[
    list[str] | None,
    typer.Option("--mechanism", "-m", help="Only this mechanism (repeatable)."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the sites as JSON.")]
SiteOption = Annotated[str, typer.Option("--site", help="Site number (the # column) or site id.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Write the result to FILE.")]
InPlace = Annotated[bool, typer.Option("--in-place", help="Overwrite KERNEL with the result.")]


def _fail(message: str, code: int = 2) -> NoReturn:
    errors.print(Text(message, style="red"))
    raise typer.Exit(code)


def _read(path: Path) -> KernelSource:
    """The kernel at ``path``; a problem folder's kernel.cu with the ``-I`` folders of its
    compile options, so it reads the headers its build finds."""
    from klineage.problem import ProblemError, load_problem

    try:
        if path.name == "kernel.cu" and (path.parent / "definition.json").is_file():
            # a definition being written: the kernel alone is still worth reading
            with contextlib.suppress(ProblemError):
                return load_problem(path.parent).kernel_source()
        return KernelSource.from_file(path)
    except (FileNotFoundError, UnicodeDecodeError) as err:
        _fail(str(err))


def _mechanism(name: str) -> Mechanism:
    try:
        return get(name)
    except UnknownMechanism as err:
        _fail(str(err))


def _chosen(names: list[str] | None) -> list[Mechanism]:
    return [_mechanism(n) for n in names] if names else all_mechanisms()


@mechanisms_app.command("list")
def list_mechanisms(json_out: JsonFlag = False) -> None:
    """Every registered mechanism: category, family, carrier keys and intent."""
    mechanisms = all_mechanisms()
    if json_out:
        entries = [
            {
                "name": m.name,
                "category": m.category,
                "family": m.family,
                "intent": m.intent,
                "carrier_keys": m.carrier_keys,
                "requires": list(m.requires),
                "conflicts": list(m.conflicts),
            }
            for m in mechanisms
        ]
        typer.echo(json.dumps(entries, indent=2))
        return
    columns = [
        Column("mechanism", key=True),
        Column("category", short=True),
        Column("family", optional=True),
        Column("carrier", short=True),
        Column("intent", min_width=40),
    ]
    rows = [
        [m.name, m.category, m.family, ", ".join(m.carrier_keys) or "-", m.intent]
        for m in mechanisms
    ]
    print_rows(console, columns, rows)


def _print_site_table(sites: list[tuple[int, Site]], title: str) -> None:
    columns = [
        Column("#", key=True, justify="right"),
        Column("mechanism", key=True),
        Column("function", key=True),
        Column("lines", short=True),
        Column("kind", optional=True, short=True),
        Column("snippet", min_width=20),
        Column("note", min_width=20),
    ]
    rows: list[list[Cell]] = [
        [
            str(index),
            site.mechanism,
            site.function,
            site.lines,
            site.node_kind,
            Text(" ".join(site.snippet.split())),
            Text(f"refused: {site.refusal}" if site.refusal else "", style="yellow"),
        ]
        for index, site in sites
    ]
    print_rows(console, columns, rows, title=title)


def _print_sites(
    kernel: KernelSource, mechanisms: list[Mechanism], forward: bool, as_json: bool
) -> None:
    numbered: list[tuple[int, Site]] = []
    for mechanism in mechanisms:
        found = mechanism.candidates(kernel) if forward else mechanism.detect(kernel)
        numbered += list(enumerate(found))
    numbered.sort(key=lambda item: (item[1].start_byte, item[1].mechanism))
    if as_json:
        typer.echo(
            json.dumps(
                [{"index": i, **site.model_dump(mode="json")} for i, site in numbered], indent=2
            )
        )
        return
    what = "candidate" if forward else "detected"
    if not numbered:
        console.print(f"no {what} sites in {kernel.name}")
        return
    _print_site_table(numbered, f"{len(numbered)} {what} sites in {kernel.name}")
    errors_in_parse = kernel.parsed.errors
    if errors_in_parse:
        lines = ", ".join(str(e.line) for e in errors_in_parse[:8])
        console.print(
            Text(f"note: the parser could not read line(s) {lines}; edits there are refused")
        )


@mechanisms_app.command()
def detect(kernel: KernelArg, mechanism: Only = None, json_out: JsonFlag = False) -> None:
    """Where each mechanism is present in KERNEL (the sites `remove` takes)."""
    _print_sites(_read(kernel), _chosen(mechanism), forward=False, as_json=json_out)


@mechanisms_app.command()
def candidates(kernel: KernelArg, mechanism: Only = None, json_out: JsonFlag = False) -> None:
    """Where each mechanism could be added to KERNEL (the sites `apply` takes)."""
    _print_sites(_read(kernel), _chosen(mechanism), forward=True, as_json=json_out)


def _pick(sites: list[Site], choice: str, mechanism: Mechanism, what: str) -> Site:
    if not sites:
        _fail(f"no {what} site of {mechanism.name}", code=1)
    if choice.isdigit():
        index = int(choice)
        if index >= len(sites):
            count = len(sites)
            _fail(f"--site {index}: {mechanism.name} has {count} {what} sites (0-{count - 1})")
        return sites[index]
    for site in sites:
        if site.id == choice:
            return site
    _fail(f"--site {choice!r}: no {what} site of {mechanism.name} has that number or id")


def _emit(
    before: KernelSource, after: KernelSource, path: Path, out: Path | None, in_place: bool
) -> None:
    if out is not None and in_place:
        _fail("give --out FILE or --in-place, not both")
    target = path if in_place else out
    if target is not None:
        target.write_text(after.text, encoding="utf-8")
        errors.print(Text(f"wrote {target}"))
        return
    diff = difflib.unified_diff(
        before.text.splitlines(keepends=True),
        after.text.splitlines(keepends=True),
        fromfile=f"a/{path.name}",
        tofile=f"b/{path.name}",
    )
    typer.echo("".join(diff), nl=False)


def _print_conditions(mechanism: Mechanism, kernel: KernelSource, site: Site) -> None:
    for condition in mechanism.conditions(kernel, site):
        errors.print(Text(f"condition: {condition.prose}"))


@mechanisms_app.command()
def remove(
    kernel: KernelArg,
    mechanism: MechanismArg,
    site: SiteOption = "0",
    out: OutOption = None,
    in_place: InPlace = False,
) -> None:
    """Remove MECHANISM at one detected site of KERNEL; print the diff or write the result."""
    source = _read(kernel)
    chosen = _mechanism(mechanism)
    sites = chosen.detect(source)
    if not sites:  # nothing was removed: say so with the refusal code, write nothing
        _fail(f"no {chosen.name} site in {source.name}; nothing to remove", code=1)
    target = _pick(sites, site, chosen, "detected")
    try:
        result = chosen.remove(source, target)
    except MechanismRefused as refused:
        _fail(str(refused), code=1)
    errors.print(Text(f"removed {chosen.name} at {target}"))
    _emit(source, result, kernel, out, in_place)


@mechanisms_app.command()
def apply(
    kernel: KernelArg,
    mechanism: MechanismArg,
    site: SiteOption = "0",
    carrier: Annotated[
        list[str] | None,
        typer.Option("--carrier", help="An instance choice key=value (repeatable)."),
    ] = None,
    out: OutOption = None,
    in_place: InPlace = False,
) -> None:
    """Apply MECHANISM at one candidate site of KERNEL; print the diff or write the result."""
    source = _read(kernel)
    chosen = _mechanism(mechanism)
    try:
        choices = Carrier.from_pairs(carrier or [])
    except (ValueError, ValidationError) as err:
        _fail(f"--carrier: {err}")
    unknown = chosen.unknown_carrier_keys(choices)
    if unknown:  # a typo in the command, not a refusal of the rule: bad input
        accepted = ", ".join(chosen.carrier_keys) or "none"
        _fail(f"--carrier: unknown key(s) {', '.join(unknown)}; {chosen.name} accepts: {accepted}")
    target = _pick(chosen.candidates(source), site, chosen, "candidate")
    try:
        result = chosen.apply(source, target, choices)
    except MechanismRefused as refused:
        _fail(str(refused), code=1)
    carrier_text = f" with {choices}" if choices.as_dict() else " with the rule's default carrier"
    errors.print(Text(f"applied {chosen.name} at {target}{carrier_text}"))
    _print_conditions(chosen, result, _reapplied(chosen, result, target))
    _emit(source, result, kernel, out, in_place)


def _reapplied(mechanism: Mechanism, result: KernelSource, candidate: Site) -> Site:
    """The detected site of the result nearest the candidate (for its conditions)."""
    sites = mechanism.detect(result)
    if not sites:
        return candidate
    return min(sites, key=lambda s: abs(s.start_byte - candidate.start_byte))


def _builder_for(path: Path) -> Callable[[KernelSource], str] | None:
    """A build under the problem's compile options (a folder with definition.json), or
    plain; None, saying why, where nvcc cannot run."""
    from klineage.gate.build import Builder, BuildToolError
    from klineage.problem import ProblemError, load_problem

    options = None
    if path.is_dir() and (path / "definition.json").is_file():
        try:
            options = load_problem(path).build_options
        except ProblemError as err:
            _fail(f"{path}: {err}")
    builder = Builder(options=options)
    try:
        _ = builder.nvcc_version
    except BuildToolError as err:
        errors.print(Text(f"note: states not built ({err})", style="yellow"))
        return None

    def build(state: KernelSource) -> str:
        result = builder.build(state.text, state.name)
        return "OK" if result.ok else (result.message.strip().splitlines() or ["failed"])[0]

    return build


CUDA_SUFFIXES = (".cu", ".cuh")


@mechanisms_app.command()
def walk(
    kernel: Annotated[
        Path,
        typer.Argument(
            metavar="KERNEL",
            help="A CUDA kernel source (.cu), a problem folder (its kernel.cu, built under "
            "its compile options), or any other folder (every .cu/.cuh file under it, "
            "summarized, not built).",
        ),
    ],
    build: Annotated[
        bool, typer.Option("--build/--no-build", help="Build each state with nvcc.")
    ] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Plan a mining walk on the CPU: the mechanisms removals take out of KERNEL, in
    mining's order, and why the others stay. No gate runs: mining also needs each step
    correct and timed on a GPU, so this is the most it can recover. Given a folder of CUDA
    files (a repository), one line per file: where a walk would find something to mine."""
    from klineage.mining.plan import plan_walk

    if kernel.is_dir() and not (kernel / "kernel.cu").is_file():
        _walk_repository(kernel, json_out)
        return
    source = _read(_kernel_file(kernel))
    builder = _builder_for(kernel) if build else None

    def shown(step: PlannedStep) -> None:
        if not json_out:
            errors.print(Text(f"removed {step.mechanism} (lines {_lines(step.lines)})"))

    plan, _ = plan_walk(source, builder, on_step=shown)
    if json_out:
        typer.echo(plan.model_dump_json(indent=2))
        return
    _print_plan(plan)


def _walk_repository(folder: Path, json_out: bool) -> None:
    """One plan per CUDA file under ``folder`` (not built: a repository's headers and flags
    are its own), summarized one line a file."""
    from klineage.mining.plan import plan_walk

    files = sorted(p for p in folder.rglob("*") if p.suffix in CUDA_SUFFIXES and p.is_file())
    if not files:
        _fail(f"{folder}: no .cu or .cuh file under it; pass a kernel file or a problem folder")
    plans: list[WalkPlan] = []
    with progress_bar(errors) as progress:
        task = progress.add_task("planning walks", total=len(files))
        for path in files:
            name = str(path.relative_to(folder))
            progress.update(task, description=f"planning {name}")
            plans.append(plan_walk(read_repository_file(path, folder))[0])
            progress.advance(task)
    if json_out:
        typer.echo(json.dumps([plan.model_dump(mode="json") for plan in plans], indent=2))
        return
    columns = [
        Column("file", key=True),
        Column("steps", short=True, justify="right"),
        Column("removed, in order", min_width=20),
        Column("stay", short=True, justify="right"),
    ]
    rows: list[list[Cell]] = [
        [
            plan.kernel,
            str(len(plan.steps)),
            ", ".join(
                step.mechanism + ("" if step.transferable else " (evidence only)")
                for step in plan.steps
            )
            or "-",
            str(len(plan.staying)),
        ]
        for plan in plans
        if plan.steps or plan.staying
    ]
    if rows:
        print_rows(console, columns, rows, title=f"walks of {len(files)} files under {folder}")
    mined = sum(1 for plan in plans if plan.steps)
    console.print(
        f"{mined} of {len(files)} files have a step a walk can take "
        f"({sum(len(p.steps) for p in plans)} steps, "
        f"{sum(s.transferable for p in plans for s in p.steps)} with a forward rule); "
        f"{sum(len(p.staying) for p in plans)} sites stay. `klineage mechanisms walk FILE` "
        "shows one file's steps and why its sites stay; `klineage new` makes a problem "
        "folder to mine it."
    )


def _lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:6])) + (f" (+{len(lines) - 6})" if len(lines) > 6 else "")


def _forward(step: PlannedStep) -> Text:
    """What the mechanism's forward rule does where the step removed it."""
    if step.transferable:
        return Text("exact" if step.exact else "rewrites")
    return Text(f"refused: {step.forward_refusal}", style="yellow")


def _print_plan(plan: WalkPlan) -> None:
    steps: list[list[Cell]] = [
        [
            str(index),
            step.mechanism,
            _lines(step.lines),
            _forward(step),
            Text(step.build or "-", style="" if step.build in (None, "OK") else "red"),
        ]
        for index, step in enumerate(plan.steps, start=1)
    ]
    step_columns = [
        Column("step", key=True, justify="right"),
        Column("removed", key=True),
        Column("lines", short=True),
        Column("forward rule", min_width=12),
        Column("build", min_width=10),
    ]
    if steps:
        print_rows(console, step_columns, steps, title=f"walk of {plan.kernel} (no gate)")
    else:
        console.print(f"no removal takes a site of {plan.kernel}")
    staying: list[list[Cell]] = [
        [site.mechanism, site.function, str(site.line), Text(site.refusal, style="yellow")]
        for site in plan.staying
    ]
    if staying:
        stay_columns = [
            Column("mechanism", key=True),
            Column("function", key=True),
            Column("line", short=True, justify="right"),
            Column("why it stays", min_width=30),
        ]
        print_rows(console, stay_columns, staying, title=f"{len(staying)} sites stay")
    failed = [s for s in plan.steps if s.build not in (None, "OK")]
    forward = sum(s.transferable for s in plan.steps)
    console.print(
        f"{len(plan.steps)} steps ({forward} with a forward rule), "
        f"{len({s.mechanism for s in plan.staying})} mechanisms "
        f"stay detected, {len(failed)} states that do not compile; "
        f"{plan.cpu_seconds:.2f} s of CPU. Mining gates each step on a GPU: this is the "
        "most it can recover."
    )
