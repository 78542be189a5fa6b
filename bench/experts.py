"""Gate every problem's kernel against its PyTorch reference, with the device-to-device copy
bandwidth measured in the same run (needs a CUDA GPU).

    python bench/experts.py expert_kernels/* --out bench/results/experts.json

For each workload: status, latency, reference latency, speedup, and the bandwidth the kernel
reached counting each input read once and each output written once, as a share of the copy
bandwidth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.gate.gate import Gate  # noqa: E402
from klineage.gate.timing import copy_bandwidth  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.problem import Problem, Workload, dtype_itemsize, load_problem  # noqa: E402

COPY_BYTES = 2 * 1024**3  # well past the 60 MB L2


def bytes_moved(problem: Problem, workload: Workload) -> int:
    """Fewest bytes a kernel must move: each input read once, each output written once."""
    d = problem.definition
    values = d.axis_values(workload)
    total = 0
    for spec in [*d.inputs.values(), *d.outputs.values()]:
        if spec.is_scalar:
            continue
        count = 1
        for axis in spec.shape or []:
            count *= values[axis]
        total += count * dtype_itemsize(spec.dtype)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    copy_bps = copy_bandwidth(COPY_BYTES, warmup=3, repeats=20)
    print(f"device-to-device copy: {copy_bps / 1e12:.2f} TB/s")
    report: dict[str, object] = {
        "command": command_line(sys.argv),
        "copy_bandwidth_tb_s": copy_bps / 1e12,
        "problems": {},
    }
    with Gate() as gate:
        for folder in args.problems:
            problem = load_problem(folder)
            kernel = KernelSource.from_file(problem.root / "kernel.cu")
            started = time.perf_counter()
            verdict = gate.run(problem, kernel)
            rows = []
            for w, workload in zip(verdict.workloads, problem.workloads, strict=True):
                moved = bytes_moved(problem, workload)
                bandwidth = moved / (w.latency_ms / 1e3) if w.latency_ms else None
                rows.append(
                    {
                        "workload": w.label,
                        "status": w.status.value,
                        "message": w.message,
                        "latency_ms": w.latency_ms,
                        "latency_trial_medians_ms": w.timing.trial_medians_ms if w.timing else None,
                        "reference_latency_ms": w.reference_latency_ms,
                        "speedup_factor": w.speedup_factor,
                        "max_abs_error": w.correctness.max_absolute_error
                        if w.correctness
                        else None,
                        "bytes": moved,
                        "bandwidth_tb_s": bandwidth / 1e12 if bandwidth else None,
                        "share_of_copy_bandwidth": bandwidth / copy_bps if bandwidth else None,
                    }
                )
                speed = f"{w.speedup_factor:.2f}x" if w.speedup_factor else "-"
                share = f"{bandwidth / copy_bps:.0%}" if bandwidth else "-"
                print(
                    f"{problem.name:28s} {w.label:34s} {w.status.value:20s} "
                    f"{(w.latency_ms or 0):9.4f} ms  ref {(w.reference_latency_ms or 0):9.4f} ms"
                    f"  {speed:>7s}  copy-bw {share:>5s}"
                )
                if w.message:
                    print("   ", w.message[:300])
            probes = gate.run(problem, kernel, workloads=problem.probes, time_it=False)
            probe_rows = [
                {"workload": w.label, "status": w.status.value, "message": w.message[:300]}
                for w in probes.workloads
            ]
            failing = [r for r in probe_rows if r["status"] != "PASSED"]
            print(f"{problem.name:28s} probes: {len(probe_rows) - len(failing)}/{len(probe_rows)}")
            for row in failing:
                print("    probe", row["workload"], row["status"], row["message"][:200])
            report["problems"][problem.name] = {  # type: ignore[index]
                "probes": probe_rows,
                "folder": str(Path(folder)),
                "fingerprint": kernel.fingerprint,
                "status": verdict.status.value,
                "registers": {k.name: k.registers for k in verdict.build.report.kernels}
                if verdict.build.report
                else {},
                "seconds": time.perf_counter() - started,
                "workloads": rows,
            }
        report["environment"] = {
            "hardware": verdict.hardware,
            "libs": verdict.libs,
            "nvidia_smi": nvidia_smi(),
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
