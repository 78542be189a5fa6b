"""Call one kernel once on one workload, for a profiler to watch (no gate, no worker process).

    ncu --clock-control none --set full -o report python bench/ncu_one.py PROBLEM [--kernel K]

The gate runs kernels in a worker process behind a pipe with timeouts, which a profiler that
replays every launch slows past those timeouts; this driver is one plain process instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from klineage.gate.build import Builder
from klineage.gate.inputs import allocate_outputs, make_inputs, poison
from klineage.gate.runner import DeviceRunner
from klineage.problem.load import load_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problem", type=Path)
    parser.add_argument("--kernel", type=Path, default=None)
    parser.add_argument("--workload", type=int, default=0, help="index of the required workload")
    args = parser.parse_args()
    problem = load_problem(args.problem)
    kernel = args.kernel or args.problem / "kernel.cu"
    built = Builder().build(kernel.read_text(), str(kernel))
    if built.library is None:
        raise SystemExit(f"{kernel}: build failed\n{built.log}")
    workload = problem.workloads[args.workload]
    inputs = make_inputs(problem.definition, workload, 0, "cuda")
    outputs = allocate_outputs(problem.definition, workload, "cuda")
    for tensor in outputs.values():
        poison(tensor)
    runner = DeviceRunner()
    call = runner.kernel_call(str(built.library), problem.definition, workload, inputs, outputs)
    call()
    torch.cuda.synchronize()
    print(f"{problem.name}: one call of {kernel.name} on workload {args.workload} done")


if __name__ == "__main__":
    main()
