"""Gate every public development-set kernel (expert, naive, alternates) in one process: builds
in parallel first, then one GPU worker judges them all (check on every workload, then time
against the PyTorch reference), so 26 verdicts pay one worker start instead of 26.

    python bench/public_gate.py --out bench/results/public_gate.json [--no-time]

Only the git-ignored kernels already in bench/public are used (bench/public/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _environment import nvidia_smi

from klineage.gate.build import Builder
from klineage.gate.gate import Gate
from klineage.gate.result import geomean
from klineage.kernel import KernelSource
from klineage.problem.load import load_problem

PUBLIC = Path(__file__).resolve().parent / "public"


def kernels_of(folder: Path) -> list[tuple[str, Path]]:
    """(role, file) of every kernel a folder holds: the expert, the naive one, alternates."""
    found = [("expert", folder / "kernel.cu"), ("naive", folder / "naive" / "kernel.cu")]
    found += [(f"alt-{p.stem}", p) for p in sorted((folder / "alt").glob("*.cu"))]
    return [(role, path) for role, path in found if path.is_file()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-time", action="store_true", help="check only")
    args = parser.parse_args()
    folders = sorted(
        p.parent for p in PUBLIC.glob("*/steps.json") if (p.parent / "kernel.cu").is_file()
    )
    jobs = [(folder, role, path) for folder in folders for role, path in kernels_of(folder)]
    builder = Builder()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda job: builder.build(job[2].read_text(), str(job[2])), jobs))
    rows: list[dict[str, object]] = []
    libs: dict[str, str] = {}
    with Gate(builder) as gate:
        for folder, role, path in jobs:
            started = time.perf_counter()
            problem = load_problem(folder)
            verdict = gate.run(problem, KernelSource.from_file(path), time_it=not args.no_time)
            libs = verdict.libs
            failed = [w for w in verdict.workloads if not w.passed]
            speeds = [w.speedup_factor for w in verdict.workloads if w.speedup_factor is not None]
            rows.append(
                {
                    "problem": folder.name,
                    "kernel": role,
                    "status": verdict.status.value,
                    "first_failure": (
                        f"{failed[0].label}: {failed[0].message[:300]}"
                        if failed
                        else verdict.build.message[:300]
                        if not verdict.build.ok
                        else ""
                    ),
                    "speedup_over_reference_per_workload": speeds,
                    "speedup_over_reference_geomean": geomean(speeds) if speeds else None,
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )
            row = rows[-1]
            print(
                f"{folder.name:34} {role:14} {row['status']:22} "
                f"{row['speedup_over_reference_geomean']}",
                flush=True,
            )
    args.out.write_text(
        json.dumps(
            {
                "command": "python bench/public_gate.py --out OUT" + (" --no-time" * args.no_time),
                "environment": {"nvidia_smi": nvidia_smi(), "libs": libs},
                "verdicts": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
