"""Re-derive the committed mining and replay results from the committed gate logs: no GPU, no
gate run. A change to the walk, the replay methods or the search loop they share must leave
what they ask the gate, and what they make of its answers, as it was.

    python bench/reproduce_offline.py --out /tmp/reproduce --report reproduce.json

Mining: each expert of bench/results/mine.json is mined again the way the H200 run was, every
verdict from bench/state/mine_gatelog.tar.xz (`LogOnlyGate`: a verdict the log lacks stops the
problem and is reported): a walk of the audited gate (its row counts `no_machine_code_change`)
with the machine-code check and nvcc builds, serving that gate's verdicts alone; an older walk
with neither (`skip_no_ops=False`, the older verdicts served). Compared: the
report's counts with mine.json, and every attempt of the walk (parent, child, mechanism,
verdict, ratio, chosen, step) with the lineage in skills_out/lineages where that lineage is the
walk the H200 recorded (`reextracted` on a CPU afterwards: an edge relabelled
no_machine_code_change there was accepted by the gate). Top-k's committed lineage comes from a
later re-mine with the machine-code check (bench/remine_offline.py): its counts are compared.

Replay: each held-out problem and method of bench/results/replay.json (the audited replay,
five methods) is replayed with the 88 skills it used (bench/state/replay_skills.jsonl.xz) from
bench/state/replay_gatelog.tar.xz as the chunks ran it (the machine-code check on nvcc builds,
profiles served from the log, the skills method ranking without them beside `profiled`), and
each gate run's record (action, origin, carrier, status, outcome, speedup) is compared with the
committed one, in order. A problem whose current rules or moves write a kernel the H200 never
gated stops at that run (`missing`): the code changed since (the report says at which commit
it was made), not the search.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from klineage.gate.build import Builder
from klineage.gate.log import GateLog, LogOnlyGate, VerdictMissing
from klineage.kernel import KernelSource
from klineage.lineage import AttemptStatus, LineageGraph
from klineage.mining.mine import mine
from klineage.problem import load_problem
from klineage.replay.methods import Materializer
from klineage.replay.results import ReplayBudget
from klineage.skills import Skill

REPO = Path(__file__).resolve().parents[1]
STATE = REPO / "bench" / "state"
RESULTS = REPO / "bench" / "results"
COUNTS = ["termination", "accepted", "rejected", "refusals", "remaining", "steps", "skills"]
COUNTS += ["recall", "missed", "llm_attempts", "llm_accepted", "llm_rejections"]
AUDITED_COUNTS = ["no_machine_code_change", "verified", "shared_verdicts"]
RUN_FIELDS = ("action", "origin", "carrier", "gate_status", "outcome")
EDGE_FIELDS = ("mechanism", "gate_status", "chosen", "step")
CLOSE = 1e-9
"""Relative tolerance on recomputed ratios (a geometric mean summed in another order)."""


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=CLOSE)


def _unpack(archive: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "xJf", str(archive), "-C", str(into)], check=True)


def _edge_differences(ours: LineageGraph, committed: LineageGraph) -> list[str]:
    """How the walk's attempts differ from the committed lineage's, edge by edge."""
    mine_edges = {(a.parent, a.child): a for a in ours.attempts()}
    theirs = {(a.parent, a.child): a for a in committed.attempts()}
    out = [f"edge {key} not walked" for key in theirs if key not in mine_edges]
    out += [f"edge {key} not in the committed lineage" for key in mine_edges if key not in theirs]
    for key, want in theirs.items():
        got = mine_edges.get(key)
        if got is None:
            continue
        relabelled = want.status is AttemptStatus.NO_MACHINE_CODE_CHANGE
        if got.status != want.status and not (relabelled and got.status is AttemptStatus.ACCEPTED):
            out.append(f"edge {key}: {got.status.value} where {want.status.value}")
        for field in EDGE_FIELDS:
            if getattr(got, field) != getattr(want, field):
                out.append(f"edge {key}: {field} {getattr(got, field)} vs {getattr(want, field)}")
        if not _close(got.ratio, want.ratio):
            out.append(f"edge {key}: ratio {got.ratio} vs {want.ratio}")
    return out


def reproduce_mining(out: Path, problems: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Mine each expert of mine.json (or those named) from the log; one row per problem."""
    committed = json.loads((RESULTS / "mine.json").read_text(encoding="utf-8"))["problems"]
    committed = [row for row in committed if not problems or row["problem"] in problems]
    _unpack(STATE / "mine_gatelog.tar.xz", out)
    root = out / "skills_out"
    rows = []
    for row in committed:
        started = time.monotonic()
        recorded = LineageGraph.load(REPO / "skills_out" / "lineages" / f"{row['problem']}.json")
        # a walk of the audited gate ran with the machine-code check: nvcc builds each state
        # to refuse the same no-ops, and only that gate's verdicts are served; an older walk
        # ran with neither
        audited = _audited(row)
        gate = LogOnlyGate(Builder(cache_dir=out / "build") if audited else None)
        found: dict[str, Any] = {"problem": row["problem"]}
        try:
            report = mine(
                REPO / row["folder"],
                root,
                gate=gate,
                resume=True,
                skip_no_ops=audited,
                reuse_unaudited=not audited,
            )
        except VerdictMissing as err:
            found.update(missing=str(err), reproduced=False)
            rows.append(found)
            continue
        got = report.model_dump(mode="json")
        found["gate_runs"] = report.walk_gate_runs + report.probe_gate_runs
        found["gate_runs"] += report.round_trip_gate_runs
        found["differences"] = [
            f"{key}: {got[key]} vs {row.get(key)}" for key in COUNTS if got[key] != row.get(key)
        ]
        if audited:
            found["differences"] += [
                f"{key}: {got[key]} vs {row.get(key)}"
                for key in AUDITED_COUNTS
                if got[key] != row.get(key)
            ]
        lineage = LineageGraph.load(root / "lineages" / f"{row['problem']}.json")
        if recorded.meta.reextracted or audited:
            found["attempts"] = len(lineage.attempts())
            found["differences"] += _edge_differences(lineage, recorded)
        found["reproduced"] = not found["differences"] and found["gate_runs"] == 0
        found["seconds"] = round(time.monotonic() - started, 1)
        rows.append(found)
        print(json.dumps(found)[:400], flush=True)
    return rows


def _audited(row: dict[str, Any]) -> bool:
    """Whether mine.json's row is a walk of the audited gate (its report counts no-ops)."""
    return "no_machine_code_change" in row


def _h200_skills() -> list[Skill]:
    text = lzma.decompress((STATE / "replay_skills.jsonl.xz").read_bytes()).decode("utf-8")
    return [Skill.model_validate_json(line) for line in text.splitlines() if line.strip()]


def _run_differences(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> list[str]:
    out = []
    for index, (a, b) in enumerate(zip(got, want, strict=False), 1):
        fields = [f for f in RUN_FIELDS if a[f] != b[f]]
        if not _close(a["speedup"], b["speedup"]):
            fields.append("speedup")
        if fields:
            out.append(f"run {index}: {', '.join(fields)} differ")
    if len(got) != len(want):
        out.append(f"{len(got)} runs where {len(want)}")
    return out


def reproduce_replay(out: Path, problems: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Replay each problem and method of replay.json (or of the problems named) from the log;
    one row per method run."""
    committed = json.loads((RESULTS / "replay.json").read_text(encoding="utf-8"))
    by_run = {(r["problem"], r["method"]): r for r in committed["results"]}
    _unpack(STATE / "replay_gatelog.tar.xz", out)
    skills = _h200_skills()
    budget = ReplayBudget.model_validate(committed["budget"])
    methods = [s["method"] for s in committed["summary"]]
    builder = Builder()
    folders = [p for p in sorted((REPO / "heldout").iterdir()) if (p / "definition.json").is_file()]
    rows = []
    for folder in folders:
        problem = load_problem(folder)
        if problems and problem.name not in problems:
            continue
        path = out / "replay_out" / "gatelog" / f"{problem.name}.jsonl"
        # as the chunks ran: real builds (no-ops refused, verdicts shared by machine code), the
        # profiles the tree and profiled methods rank by served from the log
        log = GateLog(path, LogOnlyGate(builder, profiles=True), resume=True, share=True)
        naive = KernelSource.from_file(folder / "kernel.cu")
        for method in methods:
            want = by_run.get((problem.name, method))
            if want is None:
                continue
            seen: list[dict[str, Any]] = []

            def keep(_: str, record: Any, seen: list[dict[str, Any]] = seen) -> None:
                seen.append(record.model_dump(mode="json"))

            found: dict[str, Any] = {"problem": problem.name, "method": method}
            runs_before = log.runs
            materializer = Materializer(
                log,
                skills,
                budget,
                on_run=keep,
                carriers_first=committed["carriers_first"],
                beam_width=committed["beam_width"],
                skills_rank_by_profile="profiled" not in methods,
                # the committed replay gated kernels of machine code gated from their state,
                # and tried mechanisms idle on the way in rank order
                skip_same_as_gated=False,
                idle_last=False,
                spread_first=False,
                stage_first=False,
                pull_closed_first=False,
                weigh_track_record=False,
                race_before_carriers=False,
            )
            try:
                result, _ = materializer.run(problem, naive, method)
                found["speedup"] = result.speedup
            except VerdictMissing as err:
                found["missing"] = str(err)
            # the tree records a level's kept runs when the level is settled: by gate-run order
            seen.sort(key=lambda record: record["index"])
            differences = _run_differences(seen, want["runs"])
            found["runs"], found["committed_runs"] = len(seen), len(want["runs"])
            found["same_runs"] = next(
                (i for i, d in enumerate(differences) if d.startswith("run")), len(seen)
            )
            found["gate_runs"] = log.runs - runs_before
            found["differences"] = differences
            found["reproduced"] = not differences and "missing" not in found
            rows.append(found)
            print(json.dumps(found)[:300], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="a scratch folder")
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--only", choices=["mine", "replay"], default=None)
    parser.add_argument("--problems", nargs="*", default=[], help="definition names (all)")
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    report: dict[str, Any] = {}
    if args.only in (None, "mine"):
        report["mine"] = reproduce_mining(args.out / "mine", args.problems)
    if args.only in (None, "replay"):
        report["replay"] = reproduce_replay(args.out / "replay", args.problems)
    for part, rows in report.items():
        done = sum(r["reproduced"] for r in rows)
        runs = sum(r.get("gate_runs", 0) for r in rows)
        print(f"{part}: {done} of {len(rows)} reproduced, {runs} gate runs")
    if args.report:
        args.report.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
