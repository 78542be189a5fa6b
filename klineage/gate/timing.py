"""The time stage's sampling loop: interleaved, audited, L2 flushed outside the timed region.

Runs inside the GPU worker. Several targets (a candidate, a baseline, the PyTorch reference)
are timed call by call in one loop, their order rotating every sample, so drifting clocks and
a warming GPU affect all of them alike and a ratio between them is fair. Before every timed
call a target picks one of its input sets at random, fills it with fresh values and poisons
its outputs (all untimed); calls chosen at random are verified after they ran, and extra calls
at random positions are watched by the profiler (`klineage.gate.audit`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, Field

from klineage.gate.audit import AuditConfig, profiled_positions, verified_positions

if TYPE_CHECKING:
    import torch

# The flush buffer is several times the largest L2 we know of (H100/H200: 50-60 MB), so one
# memset evicts everything a previous call left in the cache.
MIN_FLUSH_BYTES = 256 * 1024 * 1024


class TimingConfig(BaseModel):
    """How many calls the time stage makes. Part of the gate's contract: do not lower these to
    make a candidate pass."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    warmup: int = Field(default=10, ge=1)
    """Untimed calls per target before sampling (module load, caches, clocks)."""
    samples: int = Field(default=50, ge=1)
    """Timed calls per target per trial."""
    trials: int = Field(default=3, ge=1)
    """Independent trials; the latency is the median of the trial medians."""
    audit: AuditConfig = Field(default_factory=AuditConfig)
    """How timed calls are audited (input sets, verified and profiled calls)."""


class TimedTarget(Protocol):
    """One thing being timed: a kernel (candidate or baseline) or the reference."""

    audited: bool
    """Whether its timed calls are verified and profiled (the candidate's are)."""

    def prepare(self, verify: bool) -> Callable[[], None]:
        """Pick an input set, fill it with fresh values and poison its outputs (enqueued on the
        current stream, untimed); return the call to time. `verify` asks the target to keep
        what `verify` will need (a copy of the inputs)."""
        ...

    def verify(self, where: str) -> None:
        """After a prepared call with `verify=True` ran: enqueue its check, untimed."""
        ...

    def settle(self) -> None:
        """Read the checks enqueued since the last settle; raise AuditFailure for the first
        call that failed."""
        ...

    def profile(self, where: str) -> None:
        """Make one extra call under the profiler and audit it; raise AuditFailure."""
        ...


def copy_bandwidth(nbytes: int, *, warmup: int = 1, repeats: int = 10) -> float:
    """Bytes per second (read plus write) of a device-to-device copy of `nbytes`, the median of
    `repeats` copies timed with CUDA events; the rate the latency floor is drawn from."""
    import statistics

    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    times: list[float] = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times)


def flush_buffer(device_l2_bytes: int) -> torch.Tensor:
    import torch

    size = max(MIN_FLUSH_BYTES, 4 * device_l2_bytes)
    return torch.empty(size, dtype=torch.int8, device="cuda")


def sample_interleaved(
    targets: Sequence[TimedTarget],
    stream: torch.cuda.Stream,
    flush: torch.Tensor,
    config: TimingConfig,
    rng: random.Random,
    audit_device: Callable[[str], None] = lambda where: None,
) -> list[list[list[float]]]:
    """Time each target; returns samples_ms[target][trial][sample] from CUDA events.

    Everything is enqueued on `stream`; preparing inputs and the flush run before the start
    event, and verified calls' checks after the end event, so they are never timed. The host
    waits once per trial (and around a profiled call): events and checks are read at the end
    of the trial, so the GPU never idles mid-trial while the host checks a call.
    `audit_device` (the persisting-L2 audit) runs after every verified call and at the end of
    every trial, off the clock, and raises AuditFailure.
    """
    import torch

    n = len(targets)
    samples = config.samples
    with torch.cuda.stream(stream):
        for _ in range(config.warmup):
            for target in targets:
                target.prepare(False)()
        stream.synchronize()
        profiled = {
            k: profiled_positions(rng, config.trials, samples, config.audit.profiled_calls)
            for k, t in enumerate(targets)
            if t.audited
        }
        results: list[list[list[float]]] = [[] for _ in range(n)]
        for trial in range(config.trials):
            verified = {
                k: verified_positions(rng, samples, config.audit.verified_per_trial)
                for k, t in enumerate(targets)
                if t.audited
            }
            pairs: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in range(n)]
            for sample in range(samples):
                for k in range(n):
                    index = (k + sample) % n  # rotate who goes first
                    target = targets[index]
                    where = f"timed call {sample + 1} of trial {trial + 1}"
                    if (trial, sample) in profiled.get(index, ()):
                        target.profile(f"a profiled call before {where}")
                    check = sample in verified.get(index, ())
                    call = target.prepare(check)
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    flush.zero_()
                    start.record(stream)
                    call()
                    end.record(stream)
                    pairs[index].append((start, end))
                    if check:
                        target.verify(where)
                        audit_device(where)
            stream.synchronize()
            for target in targets:
                target.settle()
            audit_device(f"trial {trial + 1}")
            for index in range(n):
                results[index].append([s.elapsed_time(e) for s, e in pairs[index]])
    return results
