"""CPU STAND-IN for the GPU worker's runner (a test double at the GPU boundary).

It lets CPU-only CI exercise the real worker process machinery (spawn, hello, replies, crash
detection, hard kill on timeout, restart) without a GPU. It never judges a kernel.
"""

from __future__ import annotations

import os
from typing import Any

from klineage.gate import worker
from klineage.gate.audit import AuditFailure
from klineage.gate.result import Correctness, Status, Timing
from klineage.gate.worker import ErrorReply, HelloReply


class CpuStandInRunner:
    """Answers requests without a GPU: replies ErrorReply('kernel', ...) naming itself."""

    def hello(self) -> HelloReply:
        return HelloReply(hardware="cpu stand-in", libs={"pid": str(os.getpid())}, l2_bytes=0)

    def handle(self, request: Any) -> ErrorReply:
        return ErrorReply("kernel", f"cpu stand-in cannot run {type(request).__name__}", False)


class NoGpuRunner:
    """Fails to start the way the real runner does on a machine without a CUDA device."""

    def __init__(self) -> None:
        raise RuntimeError("the GPU worker found no CUDA device")


class TimingStandInRunner:
    """Passes every check and times every target on paper: the PyTorch reference at 3 ms,
    each kernel at 1 ms. Lets CPU-only CI see which targets the gate asks to time."""

    def hello(self) -> HelloReply:
        return HelloReply(hardware="cpu stand-in", libs={"pid": str(os.getpid())}, l2_bytes=0)

    def handle(self, request: Any) -> worker.CheckReply | worker.TimeReply | ErrorReply:
        if isinstance(request, worker.CheckRequest):
            return worker.CheckReply(Status.PASSED, "", Correctness(trials=len(request.seeds)))
        if isinstance(request, worker.TimeRequest):
            trials = request.config.trials
            return worker.TimeReply(
                [
                    Timing(samples_ms=[[3.0 if t == worker.REFERENCE else 1.0]] * trials)
                    for t in request.targets
                ]
            )
        return ErrorReply("kernel", f"cpu stand-in cannot run {type(request).__name__}", False)


class CheatingTimerStandInRunner(TimingStandInRunner):
    """Passes every check, then reports the audit failure the real runner sends when a timed
    call left its output unwritten: lets CPU-only CI follow a failure to the verdict."""

    def handle(self, request: Any) -> worker.CheckReply | worker.TimeReply | ErrorReply:
        if isinstance(request, worker.TimeRequest):
            failure = AuditFailure(
                Status.INCORRECT_NUMERICAL,
                "timed_output",
                "timed call 7 of trial 1 left its output y unwritten (every element still poison)",
            )
            return worker.TimeReply([], failure=failure, input_sets=3, verified_calls=2)
        return super().handle(request)


class FastTimerStandInRunner(TimingStandInRunner):
    """A device with a measured copy rate whose timed calls take 0.1 ns each: far below any
    workload's physical floor."""

    def hello(self) -> HelloReply:
        return HelloReply(
            hardware="cpu stand-in",
            libs={"pid": str(os.getpid())},
            l2_bytes=50 * 10**6,
            copy_bytes_per_s=4.0e12,
        )

    def handle(self, request: Any) -> worker.CheckReply | worker.TimeReply | ErrorReply:
        if isinstance(request, worker.TimeRequest):
            trials = request.config.trials
            return worker.TimeReply(
                [Timing(samples_ms=[[1e-7]] * trials) for _ in request.targets], input_sets=3
            )
        return super().handle(request)
