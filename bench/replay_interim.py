"""Where a chunked replay stands before its final report: each problem and method's last
lineage, read for the speed of its final kernel against the naive kernel and against PyTorch.

    python bench/replay_interim.py [--archive bench/state/replay_gatelog.tar.xz]
        [--served served.jsonl] [--out bench/results/replay_audited_interim.json]

Nothing is built or timed: every latency is one the H200 measured, kept in the lineages of
the archive (`replay_out/lineages/P.METHOD.json`). Against the naive kernel: the final
kernel's latency over the start's, per workload; against PyTorch: the reference's latency
over the final kernel's, the reference being the median of its timings over the problem's
gate log (one figure per workload for every method, as `replay.json` has it since
2026-12-05), and beside it (`_own`) the one timed in the final verdict's own run. Geometric
means over the workloads, then over the problems. `replay.json` (written by the last,
`ALL=1`, chunk) recomputes these over the runs and replaces this file.

With ``--served`` (the output of ``bench/replay_served.py --methods skills,blind``), the gate
runs the skills method and blind search each spent to reach the lower of their two final
speeds, as `replay.json`'s `versus_blind` counts them.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from klineage.gate.log import GateLog
from klineage.gate.result import geomean

REPO = Path(__file__).resolve().parents[1]
METHODS = ("skills", "blind", "memory", "tree", "profiled")


def final_speeds(lineage: dict[str, Any], shared: dict[str, float]) -> dict[str, float]:
    """The final kernel's speed over the start and over PyTorch (geomeans over workloads):
    against the reference `shared` by every method (the median over the problem's gate log,
    as `replay.json` measures since 2026-12-05), and against the final verdict's own."""
    nodes = {node["id"]: node for node in lineage["nodes"]}
    final, start = nodes[lineage["graph"]["final"]], nodes[lineage["graph"]["root"]]
    labels = [w for w in final["latency_ms"] if w in start["latency_ms"]]
    latency, own = final["latency_ms"], final["reference_ms"]
    return {
        "vs_naive": geomean([start["latency_ms"][w] / latency[w] for w in labels]),
        "vs_pytorch": geomean([shared.get(w, own[w]) / latency[w] for w in labels]),
        "vs_pytorch_own": geomean([own[w] / latency[w] for w in labels]),
    }


def runs_to(speedups: list[float], target: float) -> int:
    """The first gate run after which the speedup was at least `target` (as replay counts)."""
    return next((i + 1 for i, s in enumerate(speedups) if s >= target * (1 - 1e-3)), len(speedups))


def versus_blind(served: list[dict[str, Any]]) -> dict[str, Any]:
    """Gate runs of skills and blind to the lower of their final speeds, problem by problem."""
    rows = {(r["problem"], r["method"]): r for r in served}
    problems = []
    for problem in sorted({p for p, _ in rows}):
        skills, blind = rows.get((problem, "skills")), rows.get((problem, "blind"))
        if skills is None or blind is None:
            continue
        target = min(skills["best"], blind["best"])
        if target <= 1.01:
            continue
        problems.append({
            "problem": problem,
            "speed": target,
            "skills_runs": runs_to(skills["speedups"], target),
            "blind_runs": runs_to(blind["speedups"], target),
            "complete": "missing" not in skills and "missing" not in blind,
        })  # fmt: skip
    runs = sum(p["skills_runs"] for p in problems)
    blind_runs = sum(p["blind_runs"] for p in problems)
    return {
        "problems": problems,
        "skills_runs": runs,
        "blind_runs": blind_runs,
        "fewer": round(blind_runs / runs, 3) if runs else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--archive", type=Path, default=REPO / "bench" / "state" / "replay_gatelog.tar.xz"
    )
    parser.add_argument("--served", type=Path, help="bench/replay_served.py output (JSON lines)")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "replay_audited_interim.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(args.archive) as archive:
            archive.extractall(scratch, filter="data")
        folder = Path(scratch) / "replay_out" / "lineages"
        finished = json.loads((Path(scratch) / "replay_out" / "finished.json").read_text())
        table: dict[str, dict[str, dict[str, float]]] = {}
        logs = Path(scratch) / "replay_out" / "gatelog"
        for path in sorted(folder.glob("*.json")):
            problem, method = path.stem.rsplit(".", 1)
            shared = GateLog(logs / f"{problem}.jsonl", None).reference_medians(problem)
            lineage = json.loads(path.read_text())
            table.setdefault(problem, {})[method] = final_speeds(lineage, shared)
    summary = {}
    for method in METHODS:
        rows = [speeds[method] for speeds in table.values() if method in speeds]
        summary[method] = {
            "problems": len(rows),
            "vs_pytorch": round(geomean([r["vs_pytorch"] for r in rows]), 3),
            "vs_naive": round(geomean([r["vs_naive"] for r in rows]), 3),
            "faster_than_pytorch": sum(r["vs_pytorch"] > 1.0 for r in rows),
            "vs_pytorch_own": round(geomean([r["vs_pytorch_own"] for r in rows]), 3),
            "faster_than_pytorch_own": sum(r["vs_pytorch_own"] > 1.0 for r in rows),
        }
    report: dict[str, Any] = {
        "command": "python bench/replay_interim.py"
        + (f" --served {args.served.name}" if args.served else ""),
        "source": "the last lineage of each problem and method in the archive, timed on the H200",
        "finished_with": {p: v["code"] for p, v in sorted(finished.items())},
        "summary": summary,
        "problems": {
            p: {m: {k: round(v, 3) for k, v in s.items()} for m, s in sorted(row.items())}
            for p, row in sorted(table.items())
        },
    }
    if args.served:
        served = [json.loads(line) for line in args.served.read_text().splitlines() if line]
        report["versus_blind"] = versus_blind(served)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for method, row in summary.items():
        print(method, row)
    if args.served:
        print("versus blind:", {k: v for k, v in report["versus_blind"].items() if k != "problems"})


if __name__ == "__main__":
    main()
