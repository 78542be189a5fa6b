"""The time stage's sampling loop: interleaved, L2 flushed outside the timed region.

Runs inside the GPU worker. Several targets (a candidate, a baseline, the PyTorch reference)
are timed call by call in one loop, their order rotating every sample, so drifting clocks and
a warming GPU affect all of them alike and a ratio between them is fair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    import torch

# The flush buffer is several times the largest L2 we know of (H100/H200: 50-60 MB), so one
# memset evicts everything a previous call left in the cache.
MIN_FLUSH_BYTES = 256 * 1024 * 1024


class TimingConfig(BaseModel):
    """How many calls the time stage makes. Part of the gate's contract: do not lower these to
    make a candidate pass."""

    warmup: int = Field(default=10, ge=1)
    """Untimed calls per target before sampling (module load, caches, clocks)."""
    samples: int = Field(default=50, ge=1)
    """Timed calls per target per trial."""
    trials: int = Field(default=3, ge=1)
    """Independent trials; the latency is the median of the trial medians."""


def flush_buffer(device_l2_bytes: int) -> torch.Tensor:
    import torch

    size = max(MIN_FLUSH_BYTES, 4 * device_l2_bytes)
    return torch.empty(size, dtype=torch.int8, device="cuda")


def sample_interleaved(
    calls: Sequence[Callable[[], None]],
    stream: torch.cuda.Stream,
    flush: torch.Tensor,
    config: TimingConfig,
) -> list[list[list[float]]]:
    """Time each call; returns samples_ms[target][trial][sample] from CUDA events.

    Everything is enqueued on `stream`; the flush runs before the start event, so it is never
    timed. Events are read once per trial, so the host never stalls the queue mid-trial.
    """
    import torch

    n = len(calls)
    with torch.cuda.stream(stream):
        for _ in range(config.warmup):
            for call in calls:
                call()
        stream.synchronize()
        results: list[list[list[float]]] = [[] for _ in range(n)]
        for _ in range(config.trials):
            pairs: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in range(n)]
            for sample in range(config.samples):
                for k in range(n):
                    target = (k + sample) % n  # rotate who goes first
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    flush.zero_()
                    start.record(stream)
                    calls[target]()
                    end.record(stream)
                    pairs[target].append((start, end))
            stream.synchronize()
            for target in range(n):
                results[target].append([s.elapsed_time(e) for s, e in pairs[target]])
    return results
