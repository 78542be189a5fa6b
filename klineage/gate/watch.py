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
    """Runs one call under torch.profiler (CUPTI) between two marker kernels on the current
    stream, and returns the GPU work it made. The first profile pays CUPTI's start-up (seconds),
    so the worker makes it once when it starts."""

    def __init__(self) -> None:
        self.available = True
        self.reason = ""
        try:
            self.watch(lambda: None)
        except Exception as err:  # no CUPTI: say so in every verdict instead of failing
            self.available = False
            self.reason = f"{type(err).__name__}: {err}"

    def watch(self, call: Callable[[], None]) -> CallLaunches:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(OPENING_MARKER_CYCLES)
                call()
                torch.cuda._sleep(CLOSING_MARKER_CYCLES)
                torch.cuda.synchronize()
                time.sleep(GRACE_S)  # a thread the call left behind may launch a little later
                torch.cuda.synchronize()
        activities = [
            GpuActivity(
                name=event.name(),
                stream=int(event.device_resource_id()),
                start_ns=int(event.start_ns()),
                end_ns=int(event.end_ns()),
            )
            for event in prof.profiler.kineto_results.events()
            if "CUDA" in str(event.device_type())
        ]
        return launches_between_markers(activities)


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
