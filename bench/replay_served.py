"""How far the committed replay gate log takes each held-out problem with the code and skills
here, on the CPU: the gate runs it serves before the first verdict it lacks, which is the
first one the next device chunk has to time.

    python bench/replay_served.py [--methods skills,blind] [--problems gelu_tanh_f32 ...]

Every candidate is built with nvcc as the device builds it and disassembled (the machine-code
check refuses a no-op without a gate run, as on the device); a verdict is served by its key
(kernel and baseline fingerprints, workloads) or shared by the same machine code, the audited
gate's only. Profiles are served from the log's `profiles/` (logged since 2026-12-04; a state
whose profile is missing stops the `tree` and `profiled` methods as a missing verdict does).
As the chunks run them, the `skills` method does not rank by profile (the `profiled` method
runs beside it). Use it to size the chunks of a rerun before spending device time.

    python bench/replay_served.py --summarize SERVED.jsonl [--method skills]
        [--report bench/results/replay.json]

reads such a file back: per problem both the method and blind search finished from the log
(or the method, stopped by a missing verdict, had already passed blind's final speed), the
gate runs each spent to the speed both reached (the lower final speedup), and the sums;
what a change of the search would do to issue 18's "2x fewer runs than blind", before the
device measures it. With ``--report``, a method the log does not finish on a problem counts
with that finished replay's runs instead of being left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from klineage.gate.build import Builder
from klineage.gate.log import GateLog, LogOnlyGate, VerdictMissing
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from klineage.replay.methods import Materializer
from klineage.replay.results import ReplayBudget
from klineage.skills import SkillLibrary

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = REPO / "bench" / "state" / "replay_gatelog.tar.xz"
SERVABLE = ("skills", "blind", "memory", "tree", "profiled")


def served(
    folder: Path,
    method: str,
    gatelog: Path,
    *,
    skills: Path = REPO / "skills_out",
    budget: int = 30,
    skip_no_ops: bool = True,
    builder: Builder | None = None,
) -> dict[str, Any]:
    """One problem and method replayed from `gatelog` alone: the runs served, the speedup after
    each, and the speedup reached or the verdict first missing. `builder` builds the
    candidates (default: nvcc with the gate's flags, cached where the gate caches)."""
    problem = load_problem(folder)
    # as replay's own log: real builds, so no-ops are refused and verdicts shared by SASS
    gate = LogOnlyGate(builder or Builder(), profiles=True)  # the chunks run with PROFILE=1
    log = GateLog(gatelog / f"{problem.name}.jsonl", gate, resume=True, share=skip_no_ops)
    runs: list[Any] = []
    materializer = Materializer(
        log,
        list(SkillLibrary.load(skills)),
        ReplayBudget(gate_runs=budget),
        on_run=lambda _, record: runs.append(record),
        skip_no_ops=skip_no_ops,
        skills_rank_by_profile=False,  # the chunks run `profiled` beside `skills`
    )
    row: dict[str, Any] = {"problem": problem.name, "method": method}
    try:
        result, _ = materializer.run(problem, KernelSource.from_file(folder / "kernel.cu"), method)
        row["finished"] = round(result.speedup, 3)
    except VerdictMissing as missing:
        row["missing"] = str(missing)
        # a dispatch says in its own source which split it is and what it predicts
        asked = gate.missing[-1][0].text if gate.missing else ""
        row["missing_dispatch"] = next(
            (
                line[3:]
                for line in asked.splitlines()
                if line.startswith("// ") and "the kernel faster there" in line
            ),
            "",
        )
    row["served"] = len(runs)
    row["best"] = round(max((r.speedup for r in runs), default=1.0), 3)
    row["speedups"] = [round(r.speedup, 4) for r in runs]  # after each run, for runs to a speed
    row["moves"] = [f"{r.action}:{r.outcome}" for r in runs]
    return row


def runs_to(speedups: list[float], speed: float) -> int | None:
    """The first run after which the method was at `speed` or above (0 at or below 1.0;
    None if it never was), with the report's tolerance (:func:`klineage.replay.run.
    runs_to_reach`)."""
    if speed <= 1.0:
        return 0
    return next((i + 1 for i, s in enumerate(speedups) if s >= speed * (1 - 1e-3)), None)


def report_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished replay report's results as served rows: the final speedup, and the speedup
    recorded after each gate run."""
    return [
        {
            "problem": result["problem"],
            "method": result["method"],
            "finished": result["speedup"],
            "speedups": [run.get("speedup") or 1.0 for run in result["runs"]],
        }
        for result in report["results"]
    ]


def matched(
    rows: list[dict[str, Any]], method: str = "skills", report: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per problem both `method` and blind finished from the log (and both gained), the runs
    each spent to the lower of their two final speedups; and the sums. With `report` (a
    finished replay's), a method the log does not finish on a problem counts with the
    report's runs there."""
    finished = {(r["problem"], r["method"]): r for r in rows if r.get("finished") is not None}
    # a method the log stops on, after it already passed blind search's final speed: its own
    # final is at least that (the search ends at the best state it reached), so the speed
    # both reached is blind's, and the runs to it are known
    for row in rows:
        blind = finished.get((row["problem"], "blind"))
        key = (row["problem"], row["method"])
        if key in finished or blind is None or not row.get("speedups"):
            continue
        if runs_to(row["speedups"], blind["finished"]) is not None:
            finished[key] = {**row, "finished": max(row["speedups"])}
    if report is not None:
        served = {r["problem"] for r in rows}
        for row in report_rows(report):
            if row["problem"] in served:
                finished.setdefault((row["problem"], row["method"]), row)
    problems = []
    for (problem, name), row in sorted(finished.items()):
        blind = finished.get((problem, "blind"))
        if name != method or blind is None:
            continue
        speed = min(row["finished"], blind["finished"])
        if speed <= 1.01:
            continue
        problems.append(
            {
                "problem": problem,
                "speed": speed,
                "runs": runs_to(row["speedups"], speed),
                "blind_runs": runs_to(blind["speedups"], speed),
            }
        )
    runs = sum(p["runs"] or 0 for p in problems)
    blind_runs = sum(p["blind_runs"] or 0 for p in problems)
    return {
        "method": method,
        "problems": problems,
        "runs": runs,
        "blind_runs": blind_runs,
        "fewer": round(blind_runs / runs, 3) if runs else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--methods", default="skills", help="comma-separated, of: " + ", ".join(SERVABLE)
    )
    parser.add_argument("--problems", nargs="*", default=[], help="problem names (default: all)")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the replay state archive")
    parser.add_argument("--summarize", type=Path, help="a served file: runs to blind's speed")
    parser.add_argument("--method", default="skills", help="with --summarize: against blind")
    parser.add_argument(
        "--report", type=Path, help="with --summarize: a finished replay report for the rest"
    )
    args = parser.parse_args(argv)
    if args.summarize is not None:
        text = args.summarize.read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        report = json.loads(args.report.read_text(encoding="utf-8")) if args.report else None
        print(json.dumps(matched(rows, args.method, report), indent=1))
        return 0
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in SERVABLE]
    if unknown:
        parser.error(f"cannot serve {', '.join(unknown)} from the log; use {', '.join(SERVABLE)}")
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(args.archive) as archive:
            archive.extractall(scratch, filter="data")
        gatelog = Path(scratch) / "replay_out" / "gatelog"
        for folder in sorted((REPO / "heldout").iterdir()):
            if not (folder / "definition.json").is_file():
                continue
            name = load_problem(folder).name
            if args.problems and name not in args.problems:
                continue
            for method in methods:
                print(json.dumps(served(folder, method, gatelog)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
