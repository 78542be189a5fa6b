"""Energy per call of each replay method's final kernel, beside its latency (needs a CUDA GPU
and nvidia-ml-py, the `energy` extra).

    python bench/final_energy.py --out bench/results/final_energy.jsonl [--skip-done]
        [--report bench/results/replay.json] [--lineages bench/results/replay_lineages]
        [--problems sgemm_f32 ...]
    python bench/final_energy.py --summarize bench/results/final_energy.jsonl
        --json bench/results/final_energy.json

A replay's gate log holds no energy (its key does not include it), so this gates each
distinct final kernel of a finished replay once more with the energy stage on: checked on
every workload, timed against the PyTorch reference, then each called back to back for at
least 0.3 s while NVML's energy counter is read. Methods that ended on the same kernel share
one verdict; the naive kernel is measured too. One JSON object a line, appended as each
verdict is made, so a device call cut short keeps what it finished and `--skip-done` goes on.

On a lent GPU machine, carry the wheel: `device-wheels nvidia-ml-py` deletes what it fetched
(it drops every `nvidia_*` wheel, meant for the CUDA ones), so `pip download nvidia-ml-py
--no-deps -d .whl` after it. Without the module this stops before gating anything.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # _environment, when loaded as a module

from _environment import command_line, nvidia_smi  # noqa: E402
from _verdicts import workload_rows  # noqa: E402

from klineage.gate.result import GateVerdict  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.problem import Problem, load_problem  # noqa: E402

NAIVE = "naive"
"""The label of the problem's starting kernel among the methods."""


@dataclass(frozen=True)
class FinalKernel:
    """One kernel a replay ended on, and every method that ended on it."""

    problem: str
    kernel: KernelSource
    methods: tuple[str, ...]


def final_kernels(report: Path, lineages: Path) -> list[FinalKernel]:
    """Per problem, the distinct kernels its methods ended on (from each method's forward
    lineage: its `final` state's source), and the naive kernel, in the report's order."""
    data = json.loads(report.read_text(encoding="utf-8"))
    by_problem: dict[str, dict[str, tuple[KernelSource, list[str]]]] = {}
    for result in data["results"]:
        problem, method = result["problem"], result["method"]
        path = lineages / f"{problem}.{method}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no lineage for {problem}'s {method} method")
        graph = json.loads(path.read_text(encoding="utf-8"))
        nodes = {n["fingerprint"]: n for n in graph["nodes"]}
        kernels = by_problem.setdefault(problem, {})
        for label, fingerprint in ((NAIVE, graph["graph"]["root"]), (method, result["final"])):
            node = next((n for f, n in nodes.items() if f.startswith(fingerprint)), None)
            if node is None:
                raise ValueError(f"{path}: no state {fingerprint} in the lineage")
            source = KernelSource(node["source"], f"{problem}.{label}.cu")
            _, methods = kernels.setdefault(source.fingerprint, (source, []))
            if label not in methods:
                methods.append(label)
    return [
        FinalKernel(problem, source, tuple(methods))
        for problem, kernels in by_problem.items()
        for source, methods in kernels.values()
    ]


def record(final: FinalKernel, verdict: GateVerdict, seconds: float) -> dict[str, Any]:
    """What one verdict says of a final kernel's speed and energy."""
    return {
        "problem": final.problem,
        "fingerprint": final.kernel.fingerprint,
        "methods": list(final.methods),
        "status": verdict.status.value,
        "hardware": verdict.hardware,
        "verdict_seconds": round(seconds, 2),
        "energy_unavailable": verdict.energy_unavailable,
        "workloads": [
            {
                **row,
                "reference_mean_watts": (
                    w.reference_energy.mean_watts if w.reference_energy else None
                ),
            }
            for row, w in zip(workload_rows(verdict), verdict.workloads, strict=True)
        ],
    }


def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _ratios(row: dict[str, Any], numerator: str, denominator: str) -> list[float]:
    return [
        w[numerator] / w[denominator]
        for w in row["workloads"]
        if w.get(numerator) and w.get(denominator)
    ]


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per method, over the problems where its final kernel passed with energy measured: the
    geomean of PyTorch's joules per call over the kernel's (above 1: less energy than
    PyTorch) and of the same for latency, and the problems where its final kernel used the
    least energy of all the methods' (ties shared)."""
    per_problem: dict[str, dict[str, tuple[float, float]]] = {}
    for row in rows:
        energy = _geomean(_ratios(row, "reference_joules_per_call", "joules_per_call"))
        speed = _geomean(_ratios(row, "reference_ms", "latency_ms"))
        if row["status"] != "PASSED" or energy is None or speed is None:
            continue
        for method in row["methods"]:
            per_problem.setdefault(row["problem"], {})[method] = (energy, speed)
    methods = sorted({m for by_method in per_problem.values() for m in by_method})
    summary: dict[str, Any] = {}
    for method in methods:
        measured = [by[method] for by in per_problem.values() if method in by]
        least = [
            problem
            for problem, by in per_problem.items()
            if method in by and by[method][0] >= max(e for e, _ in by.values()) * (1 - 1e-9)
        ]
        summary[method] = {
            "problems": len(measured),
            "energy_vs_pytorch": _geomean([e for e, _ in measured]),
            "speed_vs_pytorch": _geomean([s for _, s in measured]),
            "least_energy": len(least),
        }
    return summary


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _problems(names: Sequence[str]) -> dict[str, Problem]:
    """The held-out problems by name (all, or those named)."""
    found = {}
    for folder in sorted((REPO / "heldout").iterdir()):
        if (folder / "definition.json").is_file():
            problem = load_problem(folder)
            if not names or problem.name in names:
                found[problem.name] = problem
    return found


class Gates(Protocol):
    """What measuring asks of a gate: a verdict on a kernel (the real gate, energy on)."""

    def run(self, problem: Problem, kernel: KernelSource) -> GateVerdict: ...


def measure(args: argparse.Namespace, gate: Gates | None = None) -> None:
    """Gate every final kernel not yet in `--out`, energy on, appending each record."""
    if gate is None:
        if importlib.util.find_spec("pynvml") is None:
            raise SystemExit(
                "final_energy: no module pynvml, so every verdict would say energy unavailable; "
                "install nvidia-ml-py (the `energy` extra) where the GPU is"
            )
        from klineage.gate.build import Builder
        from klineage.gate.energy import EnergyConfig
        from klineage.gate.gate import Gate

        with Gate(Builder(), energy=EnergyConfig()) as real:
            measure(args, real)
        return
    done = {(r["problem"], r["fingerprint"]) for r in _read(args.out)} if args.skip_done else set()
    problems = _problems(args.problems)
    finals = [
        f
        for f in final_kernels(args.report, args.lineages)
        if f.problem in problems and (f.problem, f.kernel.fingerprint) not in done
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(nvidia_smi(), command_line(sys.argv), f"{len(finals)} kernels to gate", flush=True)
    for number, final in enumerate(finals, 1):
        started = time.perf_counter()
        verdict = gate.run(problems[final.problem], final.kernel)
        row = record(final, verdict, time.perf_counter() - started)
        with args.out.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        print(
            f"[{number}/{len(finals)}] {final.problem} {','.join(final.methods)}: "
            f"{row['status']} {row['energy_unavailable'] or ''}",
            flush=True,
        )


def main(argv: list[str] | None = None, gate: Gates | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/final_energy.jsonl")
    parser.add_argument("--report", type=Path, default=REPO / "bench/results/replay.json")
    parser.add_argument("--lineages", type=Path, default=REPO / "bench/results/replay_lineages")
    parser.add_argument("--problems", nargs="*", default=[], help="problem names (default: all)")
    parser.add_argument("--skip-done", action="store_true", help="leave out kernels in --out")
    parser.add_argument("--summarize", type=Path, help="summarize this file; gate nothing")
    parser.add_argument("--json", type=Path, help="with --summarize: write the summary here")
    args = parser.parse_args(argv)
    if args.summarize is None:
        measure(args, gate)
        return
    rows = _read(args.summarize)
    kept = {
        "command": command_line(sys.argv if argv is None else ["bench/final_energy.py", *argv]),
        "source": args.summarize.name,
        "hardware": sorted({str(r.get("hardware")) for r in rows}),
        "kernels": len(rows),
        "passed": sum(r.get("status") == "PASSED" for r in rows),
        "methods": summarize(rows),
    }
    text = json.dumps(kept, indent=1)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
