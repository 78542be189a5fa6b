#!/usr/bin/env python3
"""CPU STAND-IN for Nsight Compute's `ncu` (a test double at the GPU boundary).

It checks the command line the profile stage built (clocks left alone, the explicit metric
list, profiling only from cudaProfilerStart, the raw page as CSV into --log-file), never runs
the target, and answers with a report recorded on the H200 (tests/fixtures/ncu/), as ncu
would have written it. What it answers is chosen by the environment:

    NCU_STAND_IN_REPORT   the recorded raw CSV to write into the log file
    NCU_STAND_IN_MESSAGE  a recorded ncu message to print instead (e.g. ERR_NVGPUCTRPERM)
    NCU_STAND_IN_CALLS    a file that gets one line per profiling run (to count them)
    NCU_STAND_IN_RUN      set: run the target first, as ncu does, and pass on its failure
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REQUIRED = ("--clock-control", "none", "--metrics", "--profile-from-start", "--csv", "raw")


def main(argv: list[str]) -> int:
    if argv[1:] == ["--version"]:
        print("NVIDIA (R) Nsight Compute Command Line Profiler\nVersion stand-in")
        return 0
    missing = [flag for flag in REQUIRED if flag not in argv]
    if missing:
        print(f"==ERROR== stand-in: missing {missing}", file=sys.stderr)
        return 1
    calls = os.environ.get("NCU_STAND_IN_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as handle:
            handle.write(argv[argv.index("--metrics") + 1] + "\n")
    message = os.environ.get("NCU_STAND_IN_MESSAGE")
    if message:
        print(Path(message).read_text(encoding="utf-8"))
        return 1
    at = argv.index("--log-file") + 1
    log_file, target = Path(argv[at]), argv[at + 1 :]
    if os.environ.get("NCU_STAND_IN_RUN"):
        done = subprocess.run(target, check=False)
        if done.returncode != 0:
            return done.returncode
    report = Path(os.environ["NCU_STAND_IN_REPORT"])
    log_file.write_text(report.read_text(encoding="utf-8"), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
