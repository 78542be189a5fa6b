"""The worker's two watchers of a call: the profiler (what GPU work one call made, on which
stream, and when) and the persisting-L2 guard (no data may be pinned in the L2 across the
flush). Runs inside the GPU worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from klineage.gate.audit import (
    GRACE_S,
    AuditFailure,
    CallLaunches,
    GpuActivity,
    launches_between_markers,
)
from klineage.gate.result import Status

OPENING_MARKER_CYCLES = 2_000_000
"""The opening marker spins about a millisecond, longer than the host takes to call run()
under the profiler (the first launch of a profiled window alone took 0.3 ms on the H200): work
run() starts on a stream of its own, not waiting for the given stream, runs meanwhile, where
the audit sees it."""
CLOSING_MARKER_CYCLES = 1000
"""The closing marker spins about half a microsecond."""

CUDA_LIMIT_PERSISTING_L2 = 0x06
"""cudaLimitPersistingL2CacheSize, from the CUDA runtime's cudaLimit enum."""

CUDA_STREAM_ATTR_ACCESS_POLICY_WINDOW = 1
"""cudaStreamAttributeAccessPolicyWindow (= cudaLaunchAttributeAccessPolicyWindow)."""

STREAM_ATTR_VALUE_BYTES = 64
"""At least sizeof(cudaStreamAttrValue); zeroed, it is an empty access-policy window."""


class LaunchWatcher:
    """Runs one call under the CUDA profiler (CUPTI, through the Kineto calls torch.profiler
    wraps) between two marker kernels on the current stream, and returns the GPU work it made.
    The first profile pays CUPTI's start-up (seconds), so the worker makes it once when it
    starts."""

    def __init__(self) -> None:
        self.available = True
        self.reason = ""
        self._kineto = _KinetoWindow.make()
        try:
            self.watch(lambda: None)
        except Exception as err:  # no CUPTI: say so in every verdict instead of failing
            self.available = False
            self.reason = f"{type(err).__name__}: {err}"

    def watch(self, call: Callable[[], None]) -> CallLaunches:
        def window() -> None:
            torch.cuda._sleep(OPENING_MARKER_CYCLES)
            call()
            torch.cuda._sleep(CLOSING_MARKER_CYCLES)
            torch.cuda.synchronize()
            time.sleep(GRACE_S)  # a thread the call left behind may launch a little later
            torch.cuda.synchronize()

        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self._kineto is not None:
                events = self._kineto.record(window)
            else:
                events = _torch_profiler_record(window)
        activities = [
            GpuActivity(
                name=event.name(),
                stream=int(event.device_resource_id()),
                start_ns=int(event.start_ns()),
                end_ns=int(event.end_ns()),
            )
            for event in events
            if "CUDA" in str(event.device_type())
        ]
        return launches_between_markers(activities)


class _KinetoWindow:
    """A profiler window opened and closed with the Kineto calls torch.profiler makes, without
    its bookkeeping: half the cost of a window on the H200 (3.6 ms against 7.2 ms,
    bench/results/gate_breakdown_9da9da0.json), paid twice per gated workload."""

    def __init__(self, source: Any, activities: set[Any]) -> None:
        self._source = source
        self._activities = activities

    @classmethod
    def make(cls) -> _KinetoWindow | None:
        """None where this torch lacks the calls (the public profiler is used then)."""
        try:
            from torch.autograd import profiler as autograd_profiler

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "CUDA is not available" on CPU machines
                source = autograd_profiler.profile(use_kineto=True, use_device="cuda")
            activities = {torch.autograd.ProfilerActivity.CUDA}
            for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler"):
                getattr(torch.autograd, name)
            source.config(create_trace_id=True)
        except (AttributeError, TypeError, ImportError):
            return None
        return cls(source, activities)

    def record(self, window: Callable[[], None]) -> list[Any]:
        torch.autograd._prepare_profiler(
            self._source.config(create_trace_id=True), self._activities
        )
        torch.autograd._enable_profiler(self._source.config(), self._activities)
        try:
            window()
        finally:
            result = torch.autograd._disable_profiler()
        return list(result.events())


def _torch_profiler_record(window: Callable[[], None]) -> list[Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        window()
    return list(prof.profiler.kineto_results.events())


class PersistingL2Guard:
    """Keeps the persisting-L2 set-aside at zero, so the L2 flush evicts everything, and
    notices a kernel that reserves it. With no set-aside no line can persist, so the lines are
    not reset before every call: cudaCtxResetPersistingL2Cache takes effect on return, and
    calling it per sample would stall the timing loop's queue."""

    def __init__(self) -> None:
        self.runtime = _load_cudart()
        self.available = self.runtime is not None
        self.reason = "" if self.available else "no CUDA runtime library found for the L2 audit"

    def limit(self) -> int:
        if self.runtime is None:
            return 0
        value = ctypes.c_size_t(0)
        self.runtime.cudaDeviceGetLimit(ctypes.byref(value), CUDA_LIMIT_PERSISTING_L2)
        return int(value.value)

    def clear(self, stream: int | None = None) -> None:
        """Zero the set-aside, demote persisting lines, and drop an access-policy window a
        kernel may have left on `stream` (a cudaStream_t)."""
        if self.runtime is None:
            return
        self.runtime.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0))
        self.runtime.cudaCtxResetPersistingL2Cache()
        if stream is not None:
            empty = ctypes.create_string_buffer(STREAM_ATTR_VALUE_BYTES)  # num_bytes = 0
            self.runtime.cudaStreamSetAttribute(
                ctypes.c_void_p(stream), CUDA_STREAM_ATTR_ACCESS_POLICY_WINDOW, empty
            )

    def audit(self, where: str, stream: int | None = None) -> AuditFailure | None:
        reserved = self.limit()
        if not reserved:
            return None
        self.clear(stream)
        return AuditFailure(
            Status.RUNTIME_ERROR,
            "persisting_l2",
            f"{where}: the kernel reserved {reserved / 1e6:.3g} MB of persisting L2, which "
            "keeps its data in the cache across the flush; timed calls must start cold",
        )


def _load_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch was built with (any runtime in the process shares the device's
    primary context, so its limits are the kernel's too)."""
    torch_lib = Path(torch.__file__).resolve().parent
    candidates = [
        *sorted(torch_lib.parent.glob("nvidia/*/lib/libcudart.so*")),
        *sorted(torch_lib.parent.glob("nvidia/cuda_runtime/lib/libcudart.so*")),
        *sorted((torch_lib / "lib").glob("libcudart*.so*")),
    ]
    found = ctypes.util.find_library("cudart")
    names = [str(p) for p in candidates] + ([found] if found else [])
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
