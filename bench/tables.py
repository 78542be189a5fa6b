"""Markdown tables for the README from the benchmark results in bench/results/.

python bench/tables.py experts      # expert kernels: every workload
python bench/tables.py heldout      # held-out naive kernels: one line per problem
python bench/tables.py overhead     # gate overhead
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


if __name__ == "__main__":
    table = {"experts": experts, "heldout": heldout, "overhead": overhead}[sys.argv[1]]
    print(table())
