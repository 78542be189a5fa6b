"""CPU STAND-IN for the GPU worker's runner (a test double at the GPU boundary).

It lets CPU-only CI exercise the real worker process machinery (spawn, hello, replies, crash
detection, hard kill on timeout, restart) without a GPU. It never judges a kernel.
"""

from __future__ import annotations

import os
from typing import Any

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
