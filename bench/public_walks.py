"""Every file of public repositories walked on the CPU: where mining would find steps, how
many of them a forward rule takes again, and why the others do not.

    cd <folder holding the unpacked repositories>
    python <repo>/bench/public_walks.py OWNER+NAME ... --out FILE [--commit OWNER+NAME=SHA]

Each argument is a folder named ``owner+name`` (a repository unpacked at a known commit, as
for ``bench/public_sweep.py``). Every ``.cu``/``.cuh`` file under it gets the walk that
``klineage mechanisms walk FOLDER --json`` plans (not built: a repository's headers and flags
are its own), the files spread over the CPU's cores. Per repository: files, files with a
step, steps, steps whose forward rule takes the site again, sites that stay; per mechanism:
steps and steps with a forward rule; and every step without one, with its refusal, which is
the list of round trips to fix. Nothing is built or timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from klineage.headers import read_repository_file
from klineage.mining.plan import plan_walk

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".cu", ".cuh")


@dataclass(frozen=True)
class Step:
    mechanism: str
    forward: bool
    """Whether the mechanism's forward rule takes the site again."""
    refusal: str | None


@dataclass(frozen=True)
class FileWalk:
    file: str
    steps: tuple[Step, ...]
    stay: int
    """Sites no removal of the walk takes."""


def walk_file(path: Path, folder: Path) -> FileWalk:
    """The walk of one file: its steps and how many sites stay."""
    name = str(path.relative_to(folder.parent))
    plan, _ = plan_walk(read_repository_file(path, folder, name))
    steps = tuple(Step(s.mechanism, s.transferable, s.forward_refusal) for s in plan.steps)
    return FileWalk(name, steps, len(plan.staying))


def summarize(walks: list[FileWalk]) -> dict[str, int]:
    steps = [s for w in walks for s in w.steps]
    return {
        "files": len(walks),
        "steps": len(steps),
        "steps_with_a_forward_rule": sum(1 for s in steps if s.forward),
        "sites_that_stay": sum(w.stay for w in walks),
        "files_with_a_step": sum(1 for w in walks if w.steps),
    }


def walk_folders(folders: list[Path], jobs: int) -> dict[str, object]:
    """The walks of every CUDA file under each folder, summarized per repository and per
    mechanism, with the steps no forward rule takes again."""
    work = [
        (path, folder)
        for folder in folders
        for path in sorted(folder.rglob("*"))
        if path.suffix in SUFFIXES and path.is_file()
    ]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            walks = list(pool.map(walk_file, *zip(*work, strict=True), chunksize=1))
    else:
        walks = [walk_file(path, folder) for path, folder in work]
    pairs = list(zip(walks, work, strict=True))
    mechanisms: Counter[str] = Counter()
    forward: Counter[str] = Counter()
    for step in (s for w in walks for s in w.steps):
        mechanisms[step.mechanism] += 1
        forward[step.mechanism] += step.forward
    return {
        "repositories": {
            folder.name: summarize([w for w, (_, f) in pairs if f is folder]) for folder in folders
        },
        "total": summarize(walks),
        "steps_by_mechanism": {
            name: {"steps": count, "with_a_forward_rule": forward[name]}
            for name, count in mechanisms.most_common()
        },
        "steps_without_a_forward_rule": [
            {"file": w.file, "mechanism": s.mechanism, "refusal": s.refusal}
            for w in walks
            for s in w.steps
            if not s.forward
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--commit", action="append", default=[], help="OWNER+NAME=SHA the folder was unpacked at"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    found = walk_folders(args.folders, args.jobs)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    payload = {
        "command": "python bench/public_walks.py "
        + " ".join(f.name for f in args.folders)
        + "".join(f" --commit {c}" for c in args.commit),
        "note": "CPU only: a walk plan per file (no gate, no build); a step with a forward "
        "rule is one whose mechanism's apply takes the site again",
        "commit": head,
        "repository_commits": dict(c.split("=", 1) for c in args.commit),
        **found,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    total = found["total"]
    assert isinstance(total, dict)
    print(
        f"{total['files_with_a_step']} of {total['files']} files with a step, {total['steps']} "
        f"steps, {total['steps_with_a_forward_rule']} with a forward rule, "
        f"{total['sites_that_stay']} sites stay; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
