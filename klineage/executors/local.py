"""The local executor: one gate per GPU of this machine (klineage's own pool), the default."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from klineage.executors.base import Executor, TalliedGate
from klineage.gate import pool
from klineage.gate.log import GateLike


class LocalExecutor(Executor):
    """Gates on this machine's GPUs, one worker process each, sharing one build cache;
    builds in parallel threads here. This is how mining and replay ran before executors."""

    name = "local"

    def __init__(self, devices: Sequence[int] | None = None) -> None:
        super().__init__()
        self.devices = list(devices) if devices is not None else None
        """GPU indexes to gate on; None: every visible GPU."""

    @contextlib.contextmanager
    def gates(self, **gate_options: Any) -> Iterator[list[GateLike]]:
        with pool.open_gates(self.devices, **gate_options) as opened:
            chosen = self.devices if self.devices is not None else range(len(opened))
            yield [
                TalliedGate(gate, f"gpu{device}", self.tally)
                for gate, device in zip(opened, chosen, strict=True)
            ]

    def describe(self) -> str:
        devices = self.devices if self.devices is not None else list(range(pool.visible_gpus()))
        return f"local: GPUs {', '.join(map(str, devices)) or 'none'}"
