"""`klineage import` and `klineage export`: the field's formats in and out (FlashInfer-Trace
solutions and traces, KernelBench problems)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from klineage.formats.kernelbench import KernelBenchError, import_kernelbench
from klineage.formats.scaffold import ScaffoldError, new_problem
from klineage.formats.solution import SolutionError, export_solution, import_solution
from klineage.gate.result import GateVerdict
from klineage.gate.trace import append_traces, verdict_to_traces
from klineage.kernel import KernelSource
from klineage.problem import ProblemError, load_problem

console = Console()
errors = Console(stderr=True, soft_wrap=True)


def _fail(message: str) -> NoReturn:
    errors.print(Text(message, style="red"))
    raise typer.Exit(2)


def import_command(
    source: Annotated[
        str, typer.Argument(help="A FlashInfer-Trace SOLUTION.json, or the word 'kernelbench'.")
    ],
    file: Annotated[
        Path | None, typer.Argument(help="With 'kernelbench': the KernelBench-style .py file.")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Problem folder to write (or to add the kernel to).")
    ] = Path("."),
    definition: Annotated[
        Path | None, typer.Option(help="The solution's definition.json (FlashInfer-Trace).")
    ] = None,
    workloads: Annotated[
        Path | None, typer.Option(help="Workloads (JSONL) for a new problem folder.")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Problem name (KernelBench; default: the file's name).")
    ] = None,
) -> None:
    """Make a problem folder from a FlashInfer-Trace solution or a KernelBench problem."""
    try:
        if source == "kernelbench":
            if file is None:
                _fail("klineage import kernelbench FILE.py --out DIR: give the .py file")
            imported = import_kernelbench(file, out, name=name)
            console.print(f"wrote {imported.folder} ({imported.definition.name})")
            for note in imported.notes:
                console.print(Text(f"  note: {note}"))
            return
        if file is not None:
            _fail(f"unexpected argument {file}: only 'kernelbench' takes a second argument")
        problem = import_solution(
            Path(source), out, definition_path=definition, workloads_path=workloads
        )
        console.print(f"wrote {problem.root} ({problem.definition.name}, kernel.cu)")
    except (SolutionError, KernelBenchError, ProblemError, FileNotFoundError) as err:
        _fail(str(err))


def export_command(
    problem_dir: Annotated[Path, typer.Argument(help="Problem folder (definition.json, ...).")],
    out: Annotated[Path, typer.Option(help="Solution JSON to write.")],
    kernel: Annotated[
        Path | None, typer.Option(help="Kernel .cu to export (default: PROBLEM_DIR/kernel.cu).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Solution name (default: kernel name).")] = None,
    author: Annotated[str, typer.Option(help="Solution author.")] = "klineage",
    verdict: Annotated[
        Path | None,
        typer.Option(help="A verdict from `klineage gate --json`: its traces go beside it."),
    ] = None,
) -> None:
    """Write a kernel as a FlashInfer-Trace solution (with a torch binding flashinfer-bench's
    torch builder loads), and its gate verdict as traces."""
    try:
        problem = load_problem(problem_dir)
    except ProblemError as err:
        _fail(str(err))
    path = kernel or problem.kernel_path
    if path is None or not Path(path).is_file():
        _fail(f"{problem.root}: no kernel.cu in the problem folder; pass --kernel FILE")
    source = KernelSource.from_file(path)
    title = name or f"{problem.definition.name}_{source.fingerprint}"
    try:
        solution = export_solution(problem, source, name=title, author=author)
    except SolutionError as err:
        _fail(str(err))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(solution.model_dump(mode="json", exclude_none=True), indent=2) + "\n")
    console.print(f"wrote {out} ({title})")
    if verdict is not None:
        try:
            judged = GateVerdict.model_validate_json(verdict.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            _fail(f"{verdict}: not a verdict from `klineage gate --json` ({err})")
        if judged.fingerprint != source.fingerprint:
            _fail(f"{verdict}: judged kernel {judged.fingerprint}, not {source.fingerprint}")
        traces = out.with_suffix(".traces.jsonl")
        append_traces(traces, verdict_to_traces(judged, problem, solution=title))
        console.print(f"wrote {traces}")


def new_command(
    name: Annotated[str, typer.Argument(help="The problem's name (definition.json's name).")],
    kernel: Annotated[
        Path,
        typer.Option(
            help="The kernel .cu whose run(...) to read (a file without one gets a run(...) "
            "that launches its kernel, its grid and block left to you)."
        ),
    ],
    out: Annotated[Path | None, typer.Option(help="Folder to write (default: ./NAME).")] = None,
    launch: Annotated[
        str | None,
        typer.Option(
            help="The __global__ kernel the written run(...) launches, when the file has no "
            "run(...) and more than one kernel."
        ),
    ] = None,
    inline_headers: Annotated[
        bool,
        typer.Option(
            "--inline-headers",
            help="Write the local headers the kernel includes into kernel.cu (so what they "
            "hold can be mined) instead of copying them beside it.",
        ),
    ] = False,
) -> None:
    """Scaffold a problem folder from a kernel: definition, reference stub and a workload
    guessed from its run(...) signature, and what is left to fill in."""
    try:
        made = new_problem(
            name, kernel, out or Path(name), inline_headers=inline_headers, launch=launch
        )
    except (ScaffoldError, ProblemError, FileNotFoundError) as err:
        _fail(str(err))
    console.print(f"wrote {made.problem.root} (it validates; the gate can build the kernel)")
    console.print("still to do:")
    for item in made.todo:
        console.print(Text(f"  - {item}"))
