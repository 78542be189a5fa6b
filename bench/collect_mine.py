"""Collect mining reports made on the device into bench/results/mine.json.

    python bench/collect_mine.py REPORT.json [REPORT.json ...] --gatelog skills_out/gatelog \
        --smi smi.csv --commit SHA --command "..." [--note PROBLEM=TEXT ...]

A later report of a problem replaces an earlier one (a resumed chunk reports the whole walk).
With --output NAME.json (a cold-start measurement into throwaway folders, say) the figures go
to bench/results/NAME.json, skills_out/ is left alone, and --gatelog may be left out.
A resumed walk's `wall_seconds` and gate-run counts cover its last chunk only, the rest being
replayed from the gate log: `verdicts_logged` counts every verdict the problem's log holds, and
a note says how the chunks went. Also writes skills_out/environment.json. Nothing is timed here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("reports", type=Path, nargs="+", help="--report files of `klineage mine`")
    parser.add_argument("--gatelog", type=Path, help="the run's gatelog folder")
    parser.add_argument("--output", default="mine.json", help="file name under bench/results")
    parser.add_argument("--smi", type=Path, required=True, help="nvidia-smi query from the run")
    parser.add_argument("--commit", required=True, help="the klineage commit that ran")
    parser.add_argument("--command", required=True, help="how the run was made")
    parser.add_argument("--note", action="append", default=[], help="PROBLEM=TEXT")
    args = parser.parse_args()

    problems: dict[str, dict] = {}
    for path in args.reports:
        for report in json.loads(path.read_text())["problems"]:
            problems[report["problem"]] = report
    notes = dict(note.split("=", 1) for note in args.note)
    libs: dict[str, object] = {}
    if args.gatelog is None and args.output == "mine.json":
        parser.error("mine.json describes skills_out/: give the --gatelog behind it")
    for name, report in problems.items():
        if name in notes:
            report["note"] = notes[name]
        if args.gatelog is None:
            continue
        log = args.gatelog / f"{name}.jsonl"
        verdicts = [json.loads(line)["verdict"] for line in log.read_text().splitlines()]
        report["verdicts_logged"] = len(verdicts)
        libs = {"hardware": verdicts[-1]["hardware"], "libs": verdicts[-1]["libs"]}
    environment = {
        "nvidia_smi": args.smi.read_text().strip().splitlines()[1:],
        **libs,
    }
    payload = {
        "command": args.command,
        "commit": args.commit,
        "environment": environment,
        "problems": list(problems.values()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.output).write_text(json.dumps(payload, indent=2) + "\n")
    if args.output != "mine.json":
        print(f"wrote {RESULTS / args.output} ({len(problems)} problems)")
        return
    skills_env = {
        "command": args.command,
        "commit": args.commit,
        **environment,
        "note": "the gate logs behind these skills are kept in bench/state/mine_gatelog.tar.xz "
        "(build-cache paths written <build-cache>/...); lineages/ and skills.jsonl carry the "
        "evidence",
    }
    (ROOT / "skills_out" / "environment.json").write_text(json.dumps(skills_env, indent=2) + "\n")
    print(f"wrote {RESULTS / 'mine.json'} ({len(problems)} problems)")


if __name__ == "__main__":
    main()
