"""Gate overhead on the softmax problem, in one run (needs a CUDA GPU).

Measures: cold build, cached build, check and time of one candidate on 3 workloads, a whole
gate verdict (build + check + time, warm worker), the worker's start-up, and, for the same
kernel, a build through torch.utils.cpp_extension.load_inline (what KernelBench does).

    python bench/gate_overhead.py [--out bench/results/gate_overhead.json] [--before OLD.json]
                                  [--repeats 7]

A whole verdict (and a check alone) is the median of `--repeats` verdicts on a warm worker: one
verdict of ~0.2 s moves by 10% between runs. `--before` takes this script's output from an
earlier gate (run in the same device call) and keeps it beside the new figures, with the ratio
of whole verdicts. The script uses only the API both gates share, so bench/audit_call.sh runs
this same file against the gate before the audits.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import nvidia_smi  # noqa: E402

try:  # this script also runs from an older tree's folder, whose _environment lacks it
    from _environment import command_line
except ImportError:

    def command_line(argv: list[str]) -> str:
        return "python " + " ".join(Path(a).name if Path(a).is_absolute() else a for a in argv)


from klineage.gate.build import Builder  # noqa: E402
from klineage.gate.gate import Gate  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.problem import load_problem  # noqa: E402

# A torch binding around the kernel's run(...), so load_inline builds the same CUDA code.
_BINDING = """
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream);
torch::Tensor softmax(torch::Tensor x) {
  auto y = torch::empty_like(x);
  run(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1),
      c10::cuda::getCurrentCUDAStream());
  return y;
}
"""


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _load_inline_seconds(source: str) -> float:
    import torch.utils.cpp_extension as ext

    build_dir = Path(tempfile.mkdtemp(prefix="klineage-load-inline-"))
    try:
        _, seconds = _timed(
            lambda: ext.load_inline(
                name="klineage_softmax_bench",
                cpp_sources="torch::Tensor softmax(torch::Tensor x);",
                cuda_sources=source + _BINDING,
                functions=["softmax"],
                extra_cuda_cflags=["-O3", "-std=c++17", "-arch=sm_90"],
                build_directory=str(build_dir),
                verbose=False,
            )
        )
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(REPO / "bench/results/gate_overhead.json"))
    parser.add_argument("--before", type=Path, help="an earlier gate's output, same device call")
    parser.add_argument("--repeats", type=int, default=7, help="verdicts per median")
    parser.add_argument(
        "--skip-load-inline",
        action="store_true",
        help="leave out the load_inline build (a 60 s torch extension build; NaN in the output)",
    )
    args = parser.parse_args()

    problem = load_problem(REPO / "expert_kernels/softmax")
    kernel = KernelSource.from_file(problem.root / "kernel.cu")
    workloads = problem.workloads[:3]
    cache = Path(tempfile.mkdtemp(prefix="klineage-bench-cache-"))
    builder = Builder(cache_dir=cache)
    figures: dict[str, float] = {}

    cold, figures["cold_build_s"] = _timed(lambda: builder.build(kernel.text, kernel.name))
    assert cold.ok and not cold.cached, cold.message
    hit, figures["cached_build_s"] = _timed(lambda: builder.build(kernel.text, kernel.name))
    assert hit.cached

    with Gate(builder) as gate:
        _, figures["worker_start_s"] = _timed(gate.worker.start)
        # the first verdict loads the library and the reference: report it on its own
        first, figures["first_verdict_3_workloads_s"] = _timed(
            lambda: gate.run(problem, kernel, workloads=workloads)
        )
        assert first.passed, [w.message for w in first.workloads]
        checks = [
            _timed(lambda: gate.run(problem, kernel, workloads=workloads, time_it=False))
            for _ in range(args.repeats)
        ]
        assert all(c.passed for c, _ in checks), [w.message for w in checks[0][0].workloads]
        figures["check_3_workloads_s"] = statistics.median(s for _, s in checks)
        wholes = [
            _timed(lambda: gate.run(problem, kernel, workloads=workloads))
            for _ in range(args.repeats)
        ]
        assert all(w.passed for w, _ in wholes), [w.message for w in wholes[0][0].workloads]
        figures["whole_verdict_3_workloads_s"] = statistics.median(s for _, s in wholes)
        whole = wholes[-1][0]
        figures["time_3_workloads_s"] = (
            figures["whole_verdict_3_workloads_s"] - figures["check_3_workloads_s"]
        )
        # a fresh kernel (new fingerprint) pays a cold build inside the verdict
        fresh = KernelSource(kernel.text + "\n// variant\n", name="kernel_variant.cu")
        _, figures["whole_verdict_cold_build_s"] = _timed(
            lambda: gate.run(problem, fresh, workloads=workloads)
        )
        hardware, libs = whole.hardware, whole.libs
        per_workload = [
            {
                "workload": w.label,
                "latency_ms": w.latency_ms,
                "reference_latency_ms": w.reference_latency_ms,
                "speedup_factor": w.speedup_factor,
                "seconds": w.seconds,
            }
            for w in whole.workloads
        ]

    figures["load_inline_build_s"] = (
        float("nan") if args.skip_load_inline else _load_inline_seconds(kernel.text)
    )
    figures["load_inline_over_cold_build"] = (
        figures["load_inline_build_s"] / figures["cold_build_s"]
    )
    shutil.rmtree(cache, ignore_errors=True)

    result = {
        "command": command_line(sys.argv),
        "repeats": args.repeats,
        "environment": {
            "hardware": hardware,
            "libs": libs,
            "python": platform.python_version(),
            "nvcc": cold.nvcc_version,
            "nvidia_smi": nvidia_smi(),
        },
        "workloads": [w.label for w in workloads],
        "figures": figures,
        "targets": {
            "cold_build_s": "< 2",
            "cached_build_s": "< 0.05",
            "whole_verdict_3_workloads_s": "< 5",
            "whole_verdict_cold_build_s": "< 5",
            "load_inline_over_cold_build": ">= 10",
        },
        "per_workload": per_workload,
    }
    if args.before:
        before = json.loads(args.before.read_text())
        result["before"] = {k: before[k] for k in ("command", "figures", "per_workload")}
        result["whole_verdict_over_before"] = (
            figures["whole_verdict_3_workloads_s"]
            / before["figures"]["whole_verdict_3_workloads_s"]
        )
        result["targets"]["whole_verdict_over_before"] = "< 1.5"  # type: ignore[index]
        print(f"whole verdict, audited over before: {result['whole_verdict_over_before']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value:.3f}")


if __name__ == "__main__":
    main()
