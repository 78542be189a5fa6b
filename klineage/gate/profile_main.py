"""The process the profile stage runs under ncu: one call of a kernel on one workload.

    python -m klineage.gate.profile_main REQUEST.pkl

It makes the workload's inputs, calls run(...) once untimed (module load, lazy setup), then
once between cudaProfilerStart and cudaProfilerStop (ncu runs it with `--profile-from-start
off`, so only that call's launches are profiled), and exits. Exit code 0: profiled call
made; 3: the kernel failed (the message on stderr); 2: bad request.
"""

from __future__ import annotations

import ctypes
import pickle
import sys

from klineage.gate.profile import ProfileRequest


def profiled_call(request: ProfileRequest) -> None:
    """Call the kernel once untimed, then once with the profiler started."""
    import torch

    from klineage.gate.inputs import allocate_outputs, make_inputs
    from klineage.problem.abi import KernelAbi

    definition, workload = request.definition, request.workload
    inputs = make_inputs(definition, workload, request.seed, "cuda")
    outputs = allocate_outputs(definition, workload, "cuda")
    abi = KernelAbi.from_definition(definition)
    run = abi.bind(ctypes.CDLL(request.library, mode=ctypes.RTLD_LOCAL))
    stream = torch.cuda.Stream()
    args = abi.arguments(inputs, outputs, definition.axis_values(workload), stream.cuda_stream)

    def call() -> None:
        code = run(*args)
        stream.synchronize()
        if code != 0:
            raise RuntimeError(f"run() returned cudaError {code}")

    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.profiler.stop()


def main(argv: list[str]) -> int:
    """Read the request named on the command line, make the profiled call; the exit code."""
    if len(argv) != 2:
        print("usage: python -m klineage.gate.profile_main REQUEST.pkl", file=sys.stderr)
        return 2
    with open(argv[1], "rb") as handle:
        request = pickle.load(handle)
    if not isinstance(request, ProfileRequest):
        print(f"{argv[1]}: not a ProfileRequest", file=sys.stderr)
        return 2
    try:
        profiled_call(request)
    except Exception as err:  # reported to the parent through the exit code and stderr
        print(f"the profiled call failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
