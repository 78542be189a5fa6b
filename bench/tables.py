"""Markdown tables for the README from the benchmark results in bench/results/.

python bench/tables.py experts      # expert kernels: every workload
python bench/tables.py heldout      # held-out naive kernels: one line per problem
python bench/tables.py overhead     # gate overhead
python bench/tables.py mine         # mining, one line per expert
python bench/tables.py replay       # the replay experiment: per problem, summary, misses
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def experts() -> str:
    data = _load("experts.json")
    lines = [
        f"Device-to-device copy measured in the same run: {data['copy_bandwidth_tb_s']:.2f} TB/s.",
        "",
        "| problem | workload | latency (ms) | PyTorch (ms) | speedup | share of copy bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for name, problem in data["problems"].items():
        for w in problem["workloads"]:
            share = w["share_of_copy_bandwidth"]
            shown = f"{share:.0%}" if share is not None and name != "topk_f32" else "-"
            lines.append(
                f"| {name} | {w['workload']} | {w['latency_ms']:.4f} | "
                f"{w['reference_latency_ms']:.4f} | {w['speedup_factor']:.2f}x | {shown} |"
            )
    return "\n".join(lines)


def heldout() -> str:
    data = _load("heldout_baseline.json")
    lines = [
        "| problem | workloads | naive (ms, per workload) | PyTorch (ms) | geomean speedup |",
        "|---|---|---|---|---|",
    ]
    for name, problem in sorted(data["problems"].items()):
        rows = problem["workloads"]
        naive = ", ".join(f"{w['latency_ms']:.3g}" for w in rows)
        ref = ", ".join(f"{w['reference_latency_ms']:.3g}" for w in rows)
        geo = math.exp(sum(math.log(w["speedup_factor"]) for w in rows) / len(rows))
        lines.append(f"| {name} | {len(rows)} | {naive} | {ref} | {geo:.2f}x |")
    return "\n".join(lines)


def overhead() -> str:
    figures = _load("gate_overhead.json")["figures"]
    rows = [
        ("cold build (nvcc)", f"{figures['cold_build_s']:.2f} s", "< 2 s"),
        ("cached build", f"{figures['cached_build_s'] * 1e3:.2f} ms", "< 50 ms"),
        ("worker start (once per GPU)", f"{figures['worker_start_s']:.1f} s", ""),
        ("check, 3 workloads", f"{figures['check_3_workloads_s'] * 1e3:.0f} ms", ""),
        ("time, 3 workloads", f"{figures['time_3_workloads_s'] * 1e3:.0f} ms", ""),
        (
            "whole verdict, 3 workloads, cached build",
            f"{figures['whole_verdict_3_workloads_s'] * 1e3:.0f} ms",
            "< 5 s",
        ),
        (
            "whole verdict, 3 workloads, cold build",
            f"{figures['whole_verdict_cold_build_s']:.2f} s",
            "< 5 s",
        ),
        ("`load_inline` build of the same kernel", f"{figures['load_inline_build_s']:.1f} s", ""),
        (
            "`load_inline` / our cold build",
            f"{figures['load_inline_over_cold_build']:.0f}x",
            ">= 10x",
        ),
    ]
    lines = ["| stage | H200 | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _verified_now() -> dict[str, int]:
    """Verified skills per problem as skills_out/ judges them now (a reproduced gain); the
    device's reports in mine.json counted every reproduced round trip, gain or not."""
    counts: dict[str, int] = {}
    path = RESULTS.parents[1] / "skills_out" / "skills.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        skill = json.loads(line)
        problem = skill["evidence"]["problem"]
        counts[problem] = counts.get(problem, 0) + bool(skill.get("verified"))
    return counts


def mine() -> str:
    data = _load("mine.json")
    verified = _verified_now()
    lines = [
        "| expert | termination | steps | gate runs (walk + probes + round trips) | "
        "verdicts logged | wall | accepted / rejected | skills (verified) | recall | "
        "no skill for |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["problems"]:
        runs = r["walk_gate_runs"] + r["probe_gate_runs"] + r["round_trip_gate_runs"]
        lines.append(
            f"| {r['problem']} | {r['termination']} | {r['steps']} | {runs} "
            f"({r['walk_gate_runs']} + {r['probe_gate_runs']} + {r['round_trip_gate_runs']}) | "
            f"{r.get('verdicts_logged', '-')} | {r['wall_seconds']:.0f} s | "
            f"{r['accepted']} / {r['rejected']} | "
            f"{r['skills']} ({verified.get(r['problem'], r['verified'])}) | {r['recall']:.0%} | "
            f"{', '.join(r['missed'])} |"
        )
    for r in data.get("unfinished", []):
        lines.append(
            f"| {r['problem']} | unfinished | - | - | {r['gate_runs_logged']} | - | - | - | - | - |"
        )
    return "\n".join(lines)


def replay() -> str:
    data = _load("replay.json")
    rows: dict[str, dict[str, dict]] = {}
    for r in data["results"]:
        rows.setdefault(r["problem"], {})[r["method"]] = r
    methods = [s["method"] for s in data["summary"]]
    head = " | ".join(f"{m}: vs naive / vs PyTorch / runs" for m in methods)
    lines = [f"| problem | {head} |", "|---" * (len(methods) + 1) + "|"]
    for problem in sorted(rows):
        cells = []
        for m in methods:
            r = rows[problem][m]
            cells.append(
                f"{r['speedup']:.2f}x / {r['speedup_vs_reference']:.2f}x / {len(r['runs'])}"
            )
        lines.append(f"| {problem} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| method | geomean vs naive | geomean vs PyTorch | fast_1.0 | fast_1.5 | "
        "runs to 90% (mean) | gate runs | wasted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in data["summary"]:
        runs = sum(len(rows[p][s["method"]]["runs"]) for p in rows)
        lines.append(
            f"| {s['method']} | {s['geomean_speedup']:.2f}x | {s['geomean_vs_reference']:.2f}x | "
            f"{s['fast_p']['1.0']:.0%} | {s['fast_p']['1.5']:.0%} | "
            f"{s['mean_runs_to_90']:.1f} | {runs} | {s['total_wasted']} |"
        )
    lines += ["", "| problem | mechanism | a baseline kept it at | why the skills method did not |"]
    lines.append("|---|---|---|---|")
    for m in data["misses"]:
        lines.append(
            f"| {m['problem']} | {m['mechanism']} | {m['ratio']:.2f}x ({m['baseline']}) | "
            f"{m['reason']}: {m['detail']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    table = {
        "experts": experts,
        "heldout": heldout,
        "overhead": overhead,
        "mine": mine,
        "replay": replay,
    }[sys.argv[1]]
    print(table())
