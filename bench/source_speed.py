"""How fast the source model parses and detects every mechanism on 1,000 lines of CUDA (CPU).

    python bench/source_speed.py [--repeats 10] [--target-ms 200]

The best of `repeats` runs, each on a fresh kernel (nothing cached), in CPU time of this
process. The target is 200 ms; the exit code is 1 when the best run misses it. It lives here,
not in the tests, because a timed test fails whenever the machine is busy; the test
`test_parse_and_detect_everything_on_1000_lines` checks the same work without a clock.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms import all_mechanisms, detect_all  # noqa: E402
from tests.mechanisms.large_kernel import thousand_line_kernel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--target-ms", type=float, default=200.0)
    args = parser.parse_args()
    text = thousand_line_kernel()
    all_mechanisms()  # import the catalog outside the timing
    timings, sites = [], 0
    for _ in range(args.repeats):
        kernel = KernelSource(text)
        start = time.process_time()
        sites = len(detect_all(kernel)) if not kernel.parsed.errors else -1
        timings.append(time.process_time() - start)
    best_ms = min(timings) * 1e3
    result = {
        "lines": text.count("\n"),
        "sites": sites,
        "best_ms": round(best_ms, 1),
        "median_ms": round(sorted(timings)[len(timings) // 2] * 1e3, 1),
        "target_ms": args.target_ms,
    }
    print(json.dumps(result))
    sys.exit(0 if best_ms < args.target_ms else 1)


if __name__ == "__main__":
    main()
