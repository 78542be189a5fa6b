"""Run flashinfer-bench's own `Benchmark` on kernels exported by `klineage export` (needs a CUDA
GPU, nvcc and ninja; flashinfer-bench installed, without its GPU extras).

    python bench/flashinfer_bench_check.py [PROBLEM ...] [--out bench/results/flashinfer_bench.json]
        [--work DIR] [--warmup 5] [--iterations 30] [--trials 3] [--dry-run]

Each problem's kernel is exported as a FlashInfer-Trace solution (`export_solution`: our
kernel.cu and a generated torch binding) into a scratch dataset folder laid out as
flashinfer-bench's `TraceSet` reads it::

    dataset/definitions/<op_type>/<definition>.json
    dataset/solutions/<op_type>/<definition>/<solution>.json
    dataset/workloads/<op_type>/<definition>.jsonl      (workload traces, random/scalar inputs)
    dataset/traces/<op_type>/<definition>.jsonl         (written by the benchmark)

The folder is loaded back through `TraceSet.from_path` and checked, then each problem runs in
its own `Benchmark` (its `TorchBuilder` compiles the solution with torch.utils.cpp_extension,
its evaluator checks it against the definition's reference and times both). A problem that
flashinfer-bench cannot run as it stands (an axis no input sizes, a reference taking keyword
axes, inputs klineage draws from a range, outputs compared other than elementwise) is skipped
with the reason. The JSON records each workload's status, latency, reference latency and
speedup as flashinfer-bench reports them, and the log of any failure; the exit status is 1 when
any solution fails to export, build or evaluate.

`--dry-run` (no GPU) builds the dataset folder and loads it back through `TraceSet` only.
Compilation dominates a real run: each solution's torch extension builds once, in
flashinfer-bench's worker, one after the other.
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # _environment, also when a test loads this file

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.formats.solution import export_solution  # noqa: E402
from klineage.gate.build import specific_arch_for  # noqa: E402
from klineage.problem import Problem, dump_definition, load_problem  # noqa: E402


def _stub_unused_imports() -> list[str]:
    """`import flashinfer_bench` imports docstring_parser (for its agents' tool schemas) and
    safetensors (for blob workloads); a `--no-deps` install may lack them, and a benchmark of
    random inputs uses neither. Stand-ins, only where they are missing; the names returned.
    Done on import, so flashinfer-bench's spawned workers (which import this file as their main
    module) get them too."""
    import importlib.util
    import types

    stubbed = []
    for name in ("docstring_parser", "safetensors"):
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name)
            stubbed.append(name)
    if "safetensors" in stubbed:
        sys.modules["safetensors.torch"] = types.ModuleType("safetensors.torch")
        sys.modules["safetensors"].torch = sys.modules["safetensors.torch"]  # type: ignore[attr-defined]
    return stubbed


STUBBED = _stub_unused_imports()

DEFAULT_PROBLEMS = [
    "expert_kernels/softmax",
    "expert_kernels/fused_add_rmsnorm",
    "expert_kernels/topk",
    "expert_kernels/column_max",
    "heldout/layernorm",
]
"""Three experts (topk is skipped, with its reason) and one held-out problem's naive kernel."""
DEFAULT_OUT = REPO / "bench" / "results" / "flashinfer_bench.json"
LOG_CHARS = 6000
"""The tail of a failed evaluation's log kept in the JSON (it holds the compiler's output)."""


def solution_name(problem: Problem) -> str:
    """The exported solution's name (unique per definition)."""
    return f"{problem.definition.name}_klineage"


def flashinfer_bench_gap(problem: Problem) -> str | None:
    """Why flashinfer-bench 0.1.2 cannot run this problem as it stands, or None."""
    definition = problem.definition
    if not problem.compile_options.empty:
        return (
            "the kernel needs compile options (compile_options.json); flashinfer-bench's torch "
            "builder passes no extra flags"
        )
    if specific_arch_for("sm_90", problem.kernel_source().text):
        return (
            "the kernel needs sm_90a (wgmma or setmaxnreg); flashinfer-bench's torch builder "
            "compiles for the GPU's plain arch (TORCH_CUDA_ARCH_LIST=9.0a might do)"
        )
    sized_by_inputs = {a for s in definition.inputs.values() for a in s.shape or []}
    for name, spec in definition.outputs.items():
        loose = [a for a in spec.shape or [] if a in definition.var_axes()]
        missing = [a for a in loose if a not in sized_by_inputs]
        if missing:
            return (
                f"var axis {missing[0]!r} of output {name!r} sizes no input; flashinfer-bench "
                "derives the outputs' shapes from the inputs"
            )
        if spec.compare != "elementwise":
            return (
                f"output {name!r} is compared {_compare_name(spec.compare)!r} by klineage "
                "(ties and order may differ); flashinfer-bench compares elementwise"
            )
    for name, spec in definition.inputs.items():
        if spec.range is not None:
            return (
                f"input {name!r} is drawn from {list(spec.range)} by klineage; flashinfer-bench "
                "draws randn (integers in [-1024, 1024))"
            )
    keyword = _keyword_only_parameters(definition.reference)
    if keyword:
        return (
            f"the reference takes keyword-only {', '.join(keyword)}; flashinfer-bench calls it "
            "with the inputs alone"
        )
    for workload in problem.workloads:
        kinds = {spec.type for spec in workload.inputs.values()}
        if not kinds <= {"random", "scalar"}:
            return f"workload {workload.uuid} has {sorted(kinds)} inputs; only random and scalar"
    return None


def _compare_name(compare: object) -> str:
    return compare if isinstance(compare, str) else str(getattr(compare, "kind", compare))


def _keyword_only_parameters(reference: str) -> list[str]:
    """The keyword-only parameters without defaults of the reference's run()."""
    for node in ast.parse(reference).body:
        if isinstance(node, ast.FunctionDef) and node.name == "run":
            pairs = zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True)
            return [arg.arg for arg, default in pairs if default is None]
    return []


def _relative(folder: Path) -> str:
    folder = folder.resolve()
    return str(folder.relative_to(REPO)) if folder.is_relative_to(REPO) else folder.name


def build_dataset(
    folders: list[str], root: Path, max_workloads: int | None = None
) -> list[dict[str, Any]]:
    """Write each problem's definition, exported solution and workloads under `root` in
    flashinfer-bench's layout; one entry per problem (skipped or failed ones say why)."""
    entries: list[dict[str, Any]] = []
    for name in folders:
        folder = Path(name)
        if not folder.is_absolute() and not folder.exists() and (REPO / folder).exists():
            folder = REPO / folder  # the defaults, from another working directory
        entry: dict[str, Any] = {"problem": _relative(folder), "status": "EXPORTED"}
        entries.append(entry)
        try:
            problem = load_problem(folder)
            definition = problem.definition
            entry.update(definition=definition.name, op_type=definition.op_type)
            gap = flashinfer_bench_gap(problem)
            if gap is not None:
                entry.update(status="SKIPPED", reason=gap)
                print(f"[skip]   {entry['problem']}: {gap}", flush=True)
                continue
            workloads = problem.workloads[:max_workloads] if max_workloads else problem.workloads
            kernel = problem.kernel_source()
            solution = export_solution(
                problem,
                kernel,
                name=solution_name(problem),
                description=f"klineage's {entry['problem']}/kernel.cu with a torch binding",
            )
            op = definition.op_type
            definitions = root / "definitions" / op
            solutions = root / "solutions" / op / definition.name
            workload_dir = root / "workloads" / op
            for path in (definitions, solutions, workload_dir):
                path.mkdir(parents=True, exist_ok=True)
            dump_definition(definition, definitions / f"{definition.name}.json")
            (solutions / f"{solution.name}.json").write_text(
                solution.model_dump_json(indent=2, exclude_none=True) + "\n", encoding="utf-8"
            )
            lines = [
                json.dumps(
                    {
                        "definition": definition.name,
                        "workload": workload.model_dump(mode="json"),
                        "solution": None,
                        "evaluation": None,
                    }
                )
                for workload in workloads
            ]
            (workload_dir / f"{definition.name}.jsonl").write_text("\n".join(lines) + "\n")
            entry.update(
                solution=solution.name,
                kernel_fingerprint=kernel.fingerprint,
                workloads=[w.uuid for w in workloads],
            )
            print(
                f"[export] {entry['problem']}: {solution.name}, {len(workloads)} workloads",
                flush=True,
            )
        except Exception as err:  # one problem's failure is reported, the others go on
            entry.update(status="EXPORT_ERROR", error=f"{type(err).__name__}: {err}")
            entry["log"] = traceback.format_exc()[-LOG_CHARS:]
            print(f"[error]  {entry['problem']}: {entry['error']}", flush=True)
    return entries


def check_trace_set(trace_set: Any, entries: list[dict[str, Any]]) -> list[str]:
    """What of the exported entries flashinfer-bench's TraceSet did not read back as written."""
    problems: list[str] = []
    for entry in entries:
        if entry["status"] != "EXPORTED":
            continue
        name = entry["definition"]
        if name not in trace_set.definitions:
            problems.append(f"{entry['problem']}: definition {name} not in the TraceSet")
            continue
        if trace_set.get_solution(entry["solution"]) is None or entry["solution"] not in [
            s.name for s in trace_set.solutions.get(name, [])
        ]:
            problems.append(f"{entry['problem']}: solution {entry['solution']} not read")
        uuids = [t.workload.uuid for t in trace_set.workloads.get(name, [])]
        if uuids != entry["workloads"]:
            problems.append(f"{entry['problem']}: workloads {uuids} != {entry['workloads']}")
    return problems


def _evaluation_row(trace: Any) -> dict[str, Any]:
    evaluation = trace.evaluation
    status = evaluation.status.value
    performance = evaluation.performance
    correctness = evaluation.correctness
    row: dict[str, Any] = {
        "workload": trace.workload.uuid,
        "axes": dict(trace.workload.axes),
        "status": status,
        "latency_ms": performance.latency_ms if performance else None,
        "reference_latency_ms": performance.reference_latency_ms if performance else None,
        "speedup": performance.speedup_factor if performance else None,
        "max_absolute_error": correctness.max_absolute_error if correctness else None,
        "max_relative_error": correctness.max_relative_error if correctness else None,
        "hardware": evaluation.environment.hardware,
    }
    if status != "PASSED":
        row["log"] = (evaluation.log or "")[-LOG_CHARS:]
    return row


def run_problem(trace_set: Any, entry: dict[str, Any], config_args: dict[str, Any]) -> None:
    """Benchmark one exported problem in its own `Benchmark`; fills the entry's rows."""
    from flashinfer_bench import Benchmark, BenchmarkConfig

    config = BenchmarkConfig(
        **config_args, definitions=[entry["definition"]], solutions=[entry["solution"]]
    )
    started = time.perf_counter()
    benchmark = Benchmark(trace_set, config)
    try:
        result = benchmark.run_all(dump_traces=True)
    finally:
        benchmark.close()
    traces = [t for t in result.traces.get(entry["definition"], []) if t.solution]
    rows = [_evaluation_row(t) for t in traces]
    seen = {r["workload"] for r in rows}
    for uuid in entry["workloads"]:
        if uuid not in seen:  # run_all logs and drops a workload whose reference failed
            rows.append(
                {
                    "workload": uuid,
                    "status": "NO_TRACE",
                    "log": "flashinfer-bench wrote no trace (see its log above)",
                }
            )
    entry["workload_results"] = rows
    entry["seconds"] = round(time.perf_counter() - started, 1)
    entry["status"] = "PASSED" if rows and all(r["status"] == "PASSED" for r in rows) else "FAILED"


def prepare_toolchain() -> dict[str, Any]:
    """Put ninja where torch's extension builder looks for it (PATH: a venv's python run without
    activating the venv has its ninja off PATH); say what the builds will find."""
    bin_dir = Path(sys.executable).parent
    if shutil.which("ninja") is None and (bin_dir / "ninja").exists():
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    found: dict[str, Any] = {"ninja": _version_line(["ninja", "--version"])}
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        found["cuda_home_found"] = CUDA_HOME is not None
    except Exception as err:
        found["cuda_home_found"] = f"unknown: {err}"
    for tool, value in found.items():
        if not value:
            print(f"[warn]   {tool}: not found; the torch builds will fail", flush=True)
    return found


def _version_line(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = out.stdout.strip().splitlines()
    return lines[-1] if out.returncode == 0 and lines else ""


def environment() -> dict[str, Any]:
    """The machine and the libraries the run used."""
    env: dict[str, Any] = {"python": platform.python_version(), "nvidia_smi": nvidia_smi()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
    except Exception as err:
        env["torch"] = f"unavailable: {err}"
    env["nvcc"] = _version_line(["nvcc", "--version"])
    if STUBBED:
        env["stand_ins"] = [
            f"{name} (missing; flashinfer-bench imports it, unused)" for name in STUBBED
        ]
    return env


def _flashinfer_bench_version() -> str:
    import flashinfer_bench

    return str(getattr(flashinfer_bench, "__version__", "unknown"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="*", default=DEFAULT_PROBLEMS, help="problem folders")
    parser.add_argument("--out", help=f"the JSON report (default {_relative(DEFAULT_OUT)})")
    parser.add_argument("--work", help="scratch folder for the dataset, cache and logs")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--atol", type=float, default=1e-2)
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--timeout", type=int, default=300, help="per evaluation, build included")
    parser.add_argument("--max-workloads", type=int, default=None)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the dataset and load it back through TraceSet; run nothing (no GPU)",
    )
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    started = time.perf_counter()

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="klineage-fib-"))
    dataset = work / "dataset"
    # flashinfer-bench builds under FIB_CACHE_PATH (read at each build, inherited by its workers)
    os.environ["FIB_CACHE_PATH"] = str(work / "cache")
    print(f"dataset: {dataset}", flush=True)

    from flashinfer_bench import TraceSet

    entries = build_dataset(args.problems, dataset, args.max_workloads)
    trace_set = TraceSet.from_path(str(dataset))
    mismatches = check_trace_set(trace_set, entries)
    for line in mismatches:
        print(f"[error]  TraceSet: {line}", flush=True)
    summary = {
        "definitions": sorted(trace_set.definitions),
        "solutions": sorted(s.name for sols in trace_set.solutions.values() for s in sols),
        "workloads": sum(len(w) for w in trace_set.workloads.values()),
    }
    print(
        f"TraceSet: {len(summary['definitions'])} definitions, {len(summary['solutions'])} "
        f"solutions, {summary['workloads']} workloads",
        flush=True,
    )

    config_args = {
        "warmup_runs": args.warmup,
        "iterations": args.iterations,
        "num_trials": args.trials,
        "atol": args.atol,
        "rtol": args.rtol,
        "timeout_seconds": args.timeout,
        "log_dir": str(work / "logs"),
    }
    toolchain: dict[str, Any] = {}
    if not args.dry_run:
        toolchain = prepare_toolchain()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
        for entry in entries:
            if entry["status"] != "EXPORTED":
                continue
            print(f"[bench]  {entry['problem']} ({entry['solution']})", flush=True)
            try:
                run_problem(trace_set, entry, config_args)
            except Exception as err:  # one problem's failure is reported, the others go on
                entry.update(status="BENCHMARK_ERROR", error=f"{type(err).__name__}: {err}")
                entry["log"] = traceback.format_exc()[-LOG_CHARS:]
            for row in entry.get("workload_results", []):
                speed = f"{row['speedup']:.2f}x" if row.get("speedup") else "-"
                print(
                    f"         {row['workload']:40s} {row['status']:20s} "
                    f"{row.get('latency_ms') or 0:9.4f} ms  ref "
                    f"{row.get('reference_latency_ms') or 0:9.4f} ms  {speed:>7s}",
                    flush=True,
                )
            print(f"[{entry['status'].lower()}] {entry['problem']}", flush=True)
        reloaded = TraceSet.from_path(str(dataset))
        summary["traces_written"] = sum(len(t) for t in reloaded.traces.values())

    failed = [e for e in entries if e["status"] not in ("PASSED", "SKIPPED", "EXPORTED")]
    failed += [{"problem": "TraceSet", "error": m} for m in mismatches]
    if not args.dry_run:
        failed += [e for e in entries if e["status"] == "EXPORTED"]  # exported, never run
    report = {
        "command": command_line([str(Path(__file__).resolve()), *argv]),
        "dry_run": args.dry_run,
        "flashinfer_bench_version": _flashinfer_bench_version(),
        "config": {k: v for k, v in config_args.items() if k != "log_dir"},
        "environment": {**environment(), **toolchain},
        "trace_set": summary,
        "seconds": round(time.perf_counter() - started, 1),
        "ok": not failed,
        "problems": entries,
    }
    out = args.out or (None if args.dry_run else str(DEFAULT_OUT))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {out}", flush=True)
    for entry in failed:
        print(f"FAILED {entry['problem']}: {_why(entry)}", file=sys.stderr, flush=True)
    print(f"{len(failed)} failed, {time.perf_counter() - started:.0f} s", flush=True)
    return 1 if failed else 0


def _why(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return str(entry["error"])
    bad = [r for r in entry.get("workload_results", []) if r["status"] != "PASSED"]
    if not bad:
        return f"status {entry.get('status')}"
    first = bad[0]
    tail = " ".join(str(first.get("log", "")).strip().splitlines()[-3:])[-400:]
    return f"{len(bad)} workloads not PASSED; {first['workload']}: {first['status']}: {tail}"


if __name__ == "__main__":
    sys.exit(main())
