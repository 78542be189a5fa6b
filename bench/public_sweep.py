"""Every mechanism over every CUDA file of some folders (public repositories fetched locally):
what each detects, what the first supported site's removal gives, and how long a file takes.

    python bench/public_sweep.py FOLDER [FOLDER ...] [--out bench/results/public_sweep.json]

CPU only; nothing is built or committed from the folders (their code stays where it was
fetched). A crash is any exception but a refusal (`MechanismRefused`): a rule that meets a form
it cannot rewrite must say so, never fail. Kept per run: files read, sites supported and
refused per mechanism, the commonest refusals (mechanism and the first clause of the reason),
each crash with its file and mechanism, and the slowest files (CPU seconds for every
mechanism's detect, candidates and first removal).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from klineage.headers import read_repository_file
from klineage.mechanisms import MechanismRefused, all_mechanisms

SUFFIXES = (".cu", ".cuh")


def sweep_file(path: Path, folder: Path) -> dict[str, Any]:
    """One file of the repository at `folder` (named in the summary by its path from the
    folder's parent, read with the headers its build finds under the folder): sites per
    mechanism (supported, refused with reasons), removals, crashes."""
    shown = path.relative_to(folder.parent)
    kernel = read_repository_file(path, folder, path.name)
    supported: Counter[str] = Counter()
    refused: Counter[tuple[str, str]] = Counter()
    crashes: list[dict[str, str]] = []
    removed = 0
    started = time.process_time()
    for mechanism in all_mechanisms():
        stage = "detect"
        try:
            sites = mechanism.detect(kernel)
            for site in sites:
                if site.supported:
                    supported[mechanism.name] += 1
                else:
                    refused[(mechanism.name, (site.refusal or "").split(";")[0][:120])] += 1
            first = next((s for s in sites if s.supported), None)
            if first is not None:
                stage = "remove"
                try:
                    mechanism.remove(kernel, first)
                    removed += 1
                except MechanismRefused:
                    pass
            stage = "candidates"
            mechanism.candidates(kernel)
        except Exception as err:
            crashes.append({
                "file": str(shown),
                "mechanism": mechanism.name,
                "stage": stage,
                "error": f"{type(err).__name__}: {err}"[:300],
                "where": traceback.format_exc().strip().splitlines()[-3][:200],
            })  # fmt: skip
    return {
        "lines": kernel.text.count("\n") + 1,
        "cpu_s": time.process_time() - started,
        "supported": supported,
        "refused": refused,
        "removed": removed,
        "crashes": crashes,
    }


def sweep(folders: list[Path]) -> dict[str, Any]:
    """Every CUDA file under `folders`, summed."""
    files = sorted(
        (p, folder)
        for folder in folders
        for p in folder.rglob("*")
        if p.suffix in SUFFIXES and p.is_file()
    )
    supported: Counter[str] = Counter()
    refused: Counter[tuple[str, str]] = Counter()
    crashes: list[dict[str, str]] = []
    removed = 0
    timing = []
    for path, folder in files:
        one = sweep_file(path, folder)
        supported.update(one["supported"])
        refused.update(one["refused"])
        crashes.extend(one["crashes"])
        removed += one["removed"]
        timing.append((round(one["cpu_s"], 3), one["lines"], str(path.relative_to(folder.parent))))
    by_mechanism: Counter[str] = Counter()
    for (mechanism, _), count in refused.items():
        by_mechanism[mechanism] += count
    return {
        "files": len(files),
        "first_site_removals": removed,
        "crashes": crashes,
        "supported_sites": dict(supported.most_common()),
        "refused_sites": dict(by_mechanism.most_common()),
        "commonest_refusals": [
            {"mechanism": m, "reason": r, "sites": n} for (m, r), n in refused.most_common(25)
        ],
        "slowest_files": [
            {"cpu_s": t, "lines": n, "file": f} for t, n, f in sorted(timing, reverse=True)[:8]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, help="write the summary here (JSON)")
    parser.add_argument(
        "--commit",
        action="append",
        default=[],
        metavar="FOLDER=SHA",
        help="the commit a folder was fetched at, kept in the summary (repeat per folder)",
    )
    args = parser.parse_args()
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    summary = sweep(args.folders)
    summary["commits"] = dict(pair.split("=", 1) for pair in args.commit if "=" in pair)
    summary["files_per_folder"] = {
        f.name: sum(1 for p in f.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        for f in args.folders
    }
    summary["command"] = "python bench/public_sweep.py " + " ".join(f.name for f in args.folders)
    text = json.dumps(summary, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    print(
        f"{summary['files']} files, {summary['first_site_removals']} first-site removals, "
        f"{len(summary['crashes'])} crashes; slowest "
        f"{summary['slowest_files'][0]['cpu_s'] if summary['slowest_files'] else 0} s"
    )
    for crash in summary["crashes"]:
        print(f"CRASH {crash['file']} {crash['mechanism']} {crash['stage']}: {crash['error']}")


if __name__ == "__main__":
    main()
