"""The profile stage and energy per call on problems' kernels (needs a CUDA GPU and ncu).

For each problem folder, gates its `kernel.cu` with the profile stage and energy on, and
keeps: the verdict's latencies and joules per call (kernel and PyTorch reference), the
bottleneck class with its evidence, the counters of each launch, and what the stage cost
(the ncu run's wall time, and the verdict's without it). Results are appended as one JSON
object a line, so a run cut short by a device call's time limit keeps what it finished and a
second call with `--skip-done` goes on.

    python bench/profile_kernels.py heldout/* expert_kernels/* \\
        --out bench/results/profile_kernels.jsonl [--skip-done]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import nvidia_smi  # noqa: E402
from _verdicts import workload_rows  # noqa: E402

from klineage.gate.build import Builder  # noqa: E402
from klineage.gate.energy import EnergyConfig  # noqa: E402
from klineage.gate.gate import Gate  # noqa: E402
from klineage.gate.profiler import ProfileConfig  # noqa: E402
from klineage.gate.result import GateVerdict  # noqa: E402
from klineage.problem import load_problem  # noqa: E402


def summary(verdict: GateVerdict, wall_s: float) -> dict[str, object]:
    """What one verdict says about the kernel's speed, energy, counters and bottleneck."""
    profile = verdict.profile
    call = profile.bottleneck if profile is not None else None
    return {
        "problem": verdict.problem,
        "kernel": verdict.kernel,
        "fingerprint": verdict.fingerprint,
        "status": verdict.status.value,
        "hardware": verdict.hardware,
        "verdict_seconds": wall_s,
        "profile_seconds": profile.seconds if profile is not None else None,
        "profile_cached": profile.cached if profile is not None else None,
        "profile_skipped": profile.skipped if profile is not None else None,
        "energy_unavailable": verdict.energy_unavailable,
        "workloads": workload_rows(verdict),
        "profiled_workload": profile.label if profile is not None else None,
        "bottleneck": call.kind.value if call is not None else None,
        "evidence": call.evidence if call is not None else [],
        "bytes_over_minimum": profile.bytes_over_minimum if profile is not None else None,
        "launches": (
            [launch.model_dump(mode="json") for launch in profile.launches]
            if profile is not None
            else []
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/profile_kernels.jsonl")
    parser.add_argument("--skip-done", action="store_true", help="leave out problems in --out")
    args = parser.parse_args()
    done = set()
    if args.skip_done and args.out.is_file():
        done = {json.loads(line)["folder"] for line in args.out.read_text().splitlines() if line}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(nvidia_smi())
    with tempfile.TemporaryDirectory() as folder:
        builder = Builder(cache_dir=Path(folder) / "builds")
        profile = ProfileConfig(cache_dir=Path(folder) / "profiles")
        with Gate(builder, profile=profile, energy=EnergyConfig()) as gate:
            for problem_dir in args.problems:
                name = str(problem_dir)
                if name in done or not (problem_dir / "definition.json").is_file():
                    continue
                problem = load_problem(problem_dir)
                started = time.perf_counter()
                verdict = gate.run(problem, problem.kernel_source())
                record = {"folder": name, **summary(verdict, time.perf_counter() - started)}
                with args.out.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(
                    f"{name}: {record['status']} {record['bottleneck']} "
                    f"(verdict {record['verdict_seconds']:.1f} s, "
                    f"ncu {record['profile_seconds']} s) {record['profile_skipped'] or ''}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
