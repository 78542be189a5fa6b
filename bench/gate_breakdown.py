"""Where the audited gate's time goes, on the softmax expert (needs a CUDA GPU).

Runs the worker's DeviceRunner in this process and times its check and time requests whole,
then with one audit component switched off at a time (the profiled call, the verified calls,
the input refresh, the output decoys), and the profiler window alone, with torch.profiler and
with the low-level Kineto calls it wraps. Each difference is that component's cost; the
switched-off variants exist only here, to measure, never in a verdict.

    python bench/gate_breakdown.py [--out bench/results/gate_breakdown.json] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.gate import targets as targets_module  # noqa: E402
from klineage.gate.build import Builder  # noqa: E402
from klineage.gate.runner import DeviceRunner  # noqa: E402
from klineage.gate.timing import TimingConfig  # noqa: E402
from klineage.gate.worker import REFERENCE, CheckRequest, TimeRequest  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.problem import load_problem  # noqa: E402


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm: libraries loaded, references imported
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _unprofiled(self: Any, where: str) -> None:
    self.prepare(verify=False)()


def _no_verify(self: Any, where: str) -> None:
    return None


def _raw_watch(call: Callable[[], None]) -> int:
    """The same window as LaunchWatcher.watch through the Kineto calls torch.profiler wraps."""
    import torch
    from torch.autograd import profiler as ap

    from klineage.gate.watch import CLOSING_MARKER_CYCLES, OPENING_MARKER_CYCLES

    prof = ap.profile(use_kineto=True, use_device="cuda")
    activities = {torch.autograd.ProfilerActivity.CUDA}
    torch.cuda.synchronize()
    torch.autograd._prepare_profiler(prof.config(create_trace_id=True), activities)
    torch.autograd._enable_profiler(prof.config(), activities)
    torch.cuda._sleep(OPENING_MARKER_CYCLES)
    call()
    torch.cuda._sleep(CLOSING_MARKER_CYCLES)
    torch.cuda.synchronize()
    result = torch.autograd._disable_profiler()
    return sum(1 for e in result.events() if "CUDA" in str(e.device_type()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(REPO / "bench/results/gate_breakdown.json"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    problem = load_problem(REPO / "expert_kernels/softmax")
    kernel = KernelSource.from_file(problem.root / "kernel.cu")
    builder = Builder(cache_dir=Path(tempfile.mkdtemp(prefix="klineage-breakdown-")))
    built = builder.build(kernel.text, kernel.name)
    assert built.ok, built.message
    library = str(built.library)
    runner = DeviceRunner()
    config = TimingConfig()
    rows: list[dict[str, Any]] = []
    for workload in problem.workloads[:3]:
        definition = problem.definition
        check = CheckRequest(library, definition, workload, [0, 1, 2])
        reply = runner.check(check)
        assert reply.status.value == "PASSED", reply.message
        timed = TimeRequest(
            [library, REFERENCE], definition, workload, 0, config, checked_launches=reply.launches
        )
        row: dict[str, Any] = {"workload": workload.label}

        def time_request(request: TimeRequest = timed) -> None:
            answer = runner.time(request)
            assert answer.failure is None, answer.failure

        row["check_s"] = _median_seconds(lambda check=check: runner.check(check), args.repeats)
        with _patched(runner.watcher, "available", False):
            row["check_unwatched_s"] = _median_seconds(
                lambda check=check: runner.check(check), args.repeats
            )
        row["time_s"] = _median_seconds(time_request, args.repeats)
        kt = targets_module.KernelTarget
        with _patched(kt, "profile", _unprofiled):
            row["time_unprofiled_s"] = _median_seconds(time_request, args.repeats)
        with _patched(kt, "verify", _no_verify), _patched(kt, "profile", _unprofiled):
            row["time_unverified_unprofiled_s"] = _median_seconds(time_request, args.repeats)
        with (
            _patched(kt, "verify", _no_verify),
            _patched(kt, "profile", _unprofiled),
            _patched(targets_module._Target, "_refresh_all", lambda *a, **k: None),
            _patched(targets_module, "PARTIAL_SHARE", -1.0),
            _patched(targets_module, "DECOY_SHARE", -1.0),
        ):
            row["time_bare_s"] = _median_seconds(time_request, args.repeats)
        with _patched(runner, "_l2_audit", lambda *a, **k: None):
            row["time_no_l2_audit_s"] = _median_seconds(time_request, args.repeats)
        rows.append(row)

    # the profiler window alone, on a trivial call
    import torch

    probe = torch.empty(1024, device="cuda")
    windows: dict[str, Any] = {
        "watcher_window_s": _median_seconds(
            lambda: runner.watcher.watch(lambda: probe.zero_()), 20
        ),
    }
    try:
        windows["kineto_window_s"] = _median_seconds(lambda: _raw_watch(lambda: probe.zero_()), 20)
        windows["kineto_window_events"] = _raw_watch(lambda: probe.zero_())
    except Exception as err:  # a torch without these private calls: say so, keep the rest
        windows["kineto_window_error"] = f"{type(err).__name__}: {err}"

    result = {
        "command": command_line(sys.argv),
        "environment": {
            "hardware": runner.props.name,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "nvidia_smi": nvidia_smi(),
        },
        "workloads": rows,
        "windows": windows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    keys = [k for k in rows[0] if k != "workload"]
    print("workload".ljust(22) + "".join(k.removesuffix("_s")[:18].rjust(19) for k in keys))
    for row in rows:
        print(row["workload"].ljust(22) + "".join(f"{row[k] * 1e3:19.2f}" for k in keys))
    for key, value in windows.items():
        shown = f"{value * 1e3:.2f} ms" if key.endswith("_s") else value
        print(f"{key}: {shown}")


if __name__ == "__main__":
    main()
