"""Which held-out problems a chunked replay has finished, so the next chunk skips them.

    python bench/replay_finished.py order   METHODS    # the problems still to run, cheapest first
    python bench/replay_finished.py mark    METHODS SINCE   # after a chunk: record what it ended
    python bench/replay_finished.py settle  METHODS [--profile]   # on a CPU, before the device

A problem is finished when every method's lineage (`replay_out/lineages/P.METHOD.json`) was
written by a chunk that ran with the same skill library (the sha256 of skills_out/skills.jsonl),
the same methods and the same code (the sha256 of klineage/**/*.py); `replay_out/finished.json`
keeps that. A chunk replays an unfinished problem from its gate log first (verdicts served,
nothing re-timed), so skipping finished ones saves the builds of every logged candidate,
minutes on a fresh machine. A changed library or changed code runs every problem again (the
new moves gated, the rest served from the log): one experiment, one library, one version of
the rules. Those reruns go after the problems never finished. `order` with ALL=1 lists every
problem (the final chunk, which writes replay.json).

`settle` saves device time after a code change: it replays each unfinished problem offline on
the machine it runs on (`klineage replay --offline`: real nvcc builds, every verdict and
profile served from the log, none made) and marks finished those whose log already holds
everything the new code asks for. A change that offers no new move on a problem then costs
that problem no device call; the others are listed with the first verdict they lack.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET = os.environ.get("REPLAY_BUDGET", "30")
"""Gate runs per problem and method; bench/replay_chunk.sh reads the same variable."""


def library_hash(skills: Path) -> str:
    """The skill library's identity: the sha256 of its skills.jsonl."""
    return hashlib.sha256((skills / "skills.jsonl").read_bytes()).hexdigest()[:16]


def code_hash(repo: Path) -> str:
    """The replaying code's identity: the sha256 of every klineage/**/*.py (path and text).
    A rule or search change can change the moves, so a problem finished before it reruns
    (its old moves served from the log, the new ones gated)."""
    digest = hashlib.sha256()
    for path in sorted((repo / "klineage").rglob("*.py")):
        digest.update(path.relative_to(repo).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def finished_key(repo: Path, methods: list[str]) -> dict[str, object]:
    """What a problem was finished with: the skill library, the methods, the code."""
    return {
        "library": library_hash(repo / "skills_out"),
        "methods": sorted(methods),
        "code": code_hash(repo),
    }


def held_out_by_cost(repo: Path) -> list[str]:
    """Held-out folders, cheapest naive kernel first; one the baseline file lacks goes last."""
    data = json.loads((repo / "bench/results/heldout_baseline.json").read_text())["problems"]
    cost = {p["folder"]: sum(w["latency_ms"] or 0 for w in p["workloads"]) for p in data.values()}
    folders = [
        f"heldout/{d.name}"
        for d in (repo / "heldout").iterdir()
        if (d / "definition.json").is_file()
    ]
    return sorted(folders, key=lambda f: (f not in cost, cost.get(f, 0.0), f))


def problem_name(repo: Path, folder: str) -> str:
    """The problem's name as its lineages are saved (the definition's `name`)."""
    return json.loads((repo / folder / "definition.json").read_text())["name"]


def to_run(repo: Path, out: Path, methods: list[str], everything: bool = False) -> list[str]:
    """The folders a chunk should replay: those not finished with this library, these methods
    and this code (:func:`finished_key`).

    Those never finished go first, cheapest first; those finished under another key go after
    them, since most of their moves are served from the log and only the new moves are gated:
    new work is not kept waiting behind reruns."""
    folders = held_out_by_cost(repo)
    if everything:
        return folders
    finished = _load(out)
    key = finished_key(repo, methods)
    pending = [f for f in folders if finished.get(problem_name(repo, f)) != key]
    return sorted(pending, key=lambda f: problem_name(repo, f) in finished)  # stable: by cost


def mark(repo: Path, out: Path, methods: list[str], since: float) -> list[str]:
    """Record as finished each problem whose every method's lineage was written after `since`
    (a Unix time: the chunk's start); return their names."""
    finished = _load(out)
    key = finished_key(repo, methods)
    done = []
    for folder in held_out_by_cost(repo):
        name = problem_name(repo, folder)
        paths = [out / "lineages" / f"{name}.{m}.json" for m in methods]
        if all(p.is_file() and p.stat().st_mtime >= since for p in paths):
            finished[name] = key
            done.append(name)
    _save(out, finished)
    return done


def replay_command(folders: list[str], methods: list[str], profile: bool) -> list[str]:
    """The replay a chunk runs (bench/replay_chunk.sh), with the log-only gate."""
    baselines = ",".join(m for m in methods if m != "skills")
    return [
        sys.executable,
        "-m",
        "klineage",
        "replay",
        *folders,
        "--skills",
        "skills_out",
        "--budget",
        BUDGET,
        "--out",
        "replay_out",
        "--offline",
        "--baselines",  # always: an empty list is skills alone, none would be the default
        baselines,
        *(["--profile"] if profile else []),
    ]


def settle(repo: Path, methods: list[str], profile: bool) -> tuple[list[str], dict[str, str]]:
    """Replay every unfinished problem offline (:func:`replay_command`, run in `repo`); mark
    finished those the log serves whole. Returns them, and each other folder's reason: the
    last line the offline replay wrote to stderr (the verdict or profile it lacked)."""
    out = repo / "replay_out"
    settled: list[str] = []
    needs_gpu: dict[str, str] = {}
    for folder in to_run(repo, out, methods):
        done = subprocess.run(
            replay_command([folder], methods, profile),
            cwd=repo,
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "400"},  # the missing verdict's message on one line
        )
        if done.returncode == 0:
            finished = _load(out)
            finished[problem_name(repo, folder)] = finished_key(repo, methods)
            _save(out, finished)
            settled.append(folder)
        else:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            needs_gpu[folder] = lines[-1].strip() if lines else f"exit {done.returncode}"
    return settled, needs_gpu


def _save(out: Path, finished: dict[str, dict[str, object]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "finished.json").write_text(json.dumps(finished, indent=1, sort_keys=True) + "\n")


def _load(out: Path) -> dict[str, dict[str, object]]:
    path = out / "finished.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("order", "mark", "settle"):
        sys.exit(__doc__)
    methods = [m.strip() for m in argv[1].split(",") if m.strip()]
    out = REPO / "replay_out"
    if argv[0] == "order":
        print(" ".join(to_run(REPO, out, methods, everything=os.environ.get("ALL") == "1")))
    elif argv[0] == "settle":
        settled, needs_gpu = settle(REPO, methods, profile="--profile" in argv[2:])
        print(f"finished offline: {', '.join(settled) or 'none'}")
        for folder, why in needs_gpu.items():
            print(f"needs the GPU: {folder}: {why}")
    else:
        done = mark(REPO, out, methods, float(argv[2]))
        print(f"finished this chunk: {', '.join(done) or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
