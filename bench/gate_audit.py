"""Every adversarial kernel in tests/fixtures/kernels/ through the audited gate, with the honest
kernel judged after each; optionally, honest experts' latencies before and after the audits
(two bench/experts.py outputs from the same device call). Needs a CUDA GPU.

    python bench/gate_audit.py --out bench/results/gate_audit.json \
        [--experts-before OLD.json --experts-after NEW.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.gate.build import Builder  # noqa: E402
from klineage.gate.gate import Gate  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.problem import load_problem  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
KERNELS = FIXTURES / "kernels" / "scale_rows"
HONEST = "correct.cu"
NOISE = 0.05
"""Honest latencies may move this much between the two gates before it counts as a change."""


def _judge(gate: Gate, problem_dir: Path, name: str) -> dict[str, object]:
    problem = load_problem(problem_dir)
    kernel = KernelSource.from_file(KERNELS / name)
    started = time.perf_counter()
    verdict = gate.run(problem, kernel, workloads=problem.workloads[:1])
    [result] = verdict.workloads or [None]
    honest = gate.run(
        problem, KernelSource.from_file(KERNELS / HONEST), workloads=problem.workloads[:1]
    )
    return {
        "kernel": name,
        "problem": problem.name,
        "status": verdict.status.value,
        "audit": result.audit.failed if result and result.audit else None,
        "message": result.message if result else verdict.build.message,
        "latency_ms": result.latency_ms if result else None,
        "seconds": time.perf_counter() - started,
        "honest_after": {
            "status": honest.status.value,
            "latency_ms": honest.workloads[0].latency_ms if honest.workloads else None,
        },
    }


def _experts_change(before_path: Path, after_path: Path) -> dict[str, object]:
    before = json.loads(before_path.read_text())["problems"]
    after = json.loads(after_path.read_text())["problems"]
    rows = []
    for name, problem in after.items():
        old = {w["workload"]: w for w in before.get(name, {}).get("workloads", [])}
        for w in problem["workloads"]:
            previous = old.get(w["workload"])
            if not previous or not previous["latency_ms"] or not w["latency_ms"]:
                continue
            rows.append(
                {
                    "problem": name,
                    "workload": w["workload"],
                    "status_before": previous["status"],
                    "status_after": w["status"],
                    "latency_ms_before": previous["latency_ms"],
                    "latency_ms_after": w["latency_ms"],
                    "after_over_before": w["latency_ms"] / previous["latency_ms"],
                }
            )
    ratios = [r["after_over_before"] for r in rows]
    return {
        "rows": rows,
        "geomean_after_over_before": statistics.geometric_mean(ratios) if ratios else None,
        "moved_past_noise": [r for r in rows if abs(r["after_over_before"] - 1) > NOISE],
        "noise": NOISE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(REPO / "bench/results/gate_audit.json"))
    parser.add_argument("--experts-before", type=Path)
    parser.add_argument("--experts-after", type=Path)
    args = parser.parse_args()

    fixtures = sorted(p.name for p in KERNELS.glob("*.cu") if p.name != HONEST)
    rows = []
    with Gate(Builder(), check_timeout_s=8.0) as gate:
        for name in fixtures:
            rows.append(_judge(gate, FIXTURES / "problems" / "scale_rows", name))
            print(
                f"{name:28s} {rows[-1]['status']:20s} {rows[-1]['audit'] or '-':15s}"
                f" {str(rows[-1]['message'])[:90]}"
            )
        floor = _judge(gate, FIXTURES / "problems" / "scale_rows_floor", HONEST)
        print(f"{'floor: ' + HONEST:28s} {floor['status']:20s} {floor['audit'] or '-'}")
        hello = gate.worker.start()
        hardware, libs = hello.hardware, hello.libs
    report: dict[str, object] = {
        "command": command_line(sys.argv),
        "environment": {
            "hardware": hardware,
            "libs": libs,
            "python": platform.python_version(),
            "nvidia_smi": nvidia_smi(),
        },
        "fixtures": rows,
        "floor": floor,
        "passed_cheats": [r["kernel"] for r in rows if r["status"] == "PASSED"],
        "honest_after_failed": [
            r["kernel"] for r in rows if r["honest_after"]["status"] != "PASSED"
        ],
    }
    if args.experts_before and args.experts_after:
        report["honest_experts"] = _experts_change(args.experts_before, args.experts_after)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("cheats that passed:", report["passed_cheats"] or "none")


if __name__ == "__main__":
    main()
