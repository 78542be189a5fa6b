"""Collect a replay run made on the device into bench/results/.

    python bench/collect_replay.py REPLAY_OUT --smi nvidia_smi.txt --command "..."

Writes bench/results/replay.json (the command, the environment, the skills used, the gate
log's counts, the report and the reasons behind every miss, recomputed with the current
`klineage.replay.misses` from the run's own lineages), bench/results/replay.png and
bench/results/replay_lineages/*.json.
Nothing is timed here: every figure comes from the device's report.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from klineage.problem import load_problem
from klineage.replay.misses import explain_misses
from klineage.replay.run import draw_chart, load_replay, matched_runs
from klineage.replay.sources import SkillSources

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("replay_out", type=Path, help="the replay_out folder the device wrote")
    parser.add_argument("--smi", type=Path, required=True, help="nvidia-smi query from the run")
    parser.add_argument("--command", required=True, help="how the run was made")
    parser.add_argument("--commit", required=True, help="the klineage commit that ran")
    parser.add_argument("--heldout", type=Path, default=ROOT / "heldout")
    args = parser.parse_args()

    report = load_replay(args.replay_out / "replay.json")
    problems = [
        load_problem(folder)
        for folder in sorted(args.heldout.iterdir())
        if (folder / "definition.json").is_file()
    ]
    sources = SkillSources.load([ROOT / folder for folder in report.skills])
    report.misses = explain_misses(
        report.results, problems, sources.skills, args.replay_out / "lineages"
    )
    report.versus_blind = matched_runs(report.results)
    libs = _libs(args.replay_out / "gatelog")
    payload = {
        "command": args.command,
        "commit": args.commit,
        "environment": {
            "nvidia_smi": args.smi.read_text().strip().splitlines()[1:],
            **libs,
        },
        "skills_library": sorted(
            {f"{s.id} (from {s.evidence.problem})" for s in sources.skills}, key=str.lower
        ),
        "gate_log": _log_counts(args.replay_out / "gatelog"),
        **json.loads(report.model_dump_json()),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "replay.json").write_text(json.dumps(payload, indent=1) + "\n")
    draw_chart(report, RESULTS / "replay.png")
    lineages = RESULTS / "replay_lineages"
    shutil.rmtree(lineages, ignore_errors=True)
    shutil.copytree(args.replay_out / "lineages", lineages)
    print(f"{len(report.results)} results, {len(report.misses)} misses -> {RESULTS}")


def _log_counts(gatelog: Path) -> dict[str, int]:
    """The verdicts of the gate logs, and those given to a kernel whose machine code (SASS and
    host code) another, already timed kernel had: gate runs the machine-code check saved."""
    lines = [json.loads(line) for p in gatelog.glob("*.jsonl") for line in p.open() if line.strip()]
    return {
        "verdicts": len(lines),
        "shared_by_machine_code": sum(1 for line in lines if line.get("shared_from")),
    }


def _libs(gatelog: Path) -> dict[str, object]:
    """Hardware and library versions as the gate's worker reported them."""
    for path in sorted(gatelog.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            verdict = json.loads(line)["verdict"]
            if verdict.get("hardware"):
                return {"hardware": verdict["hardware"], "libs": verdict["libs"]}
    return {}


if __name__ == "__main__":
    main()
