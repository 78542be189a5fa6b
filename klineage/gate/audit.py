"""Audits of the time stage: what is timed must be work the check would accept.

The time stage runs inside the GPU worker; this module holds the parts of its audits that are
plain logic (which calls to verify, what a profiled call launched and when, the physical
latency floor), so they run and are tested on the CPU. DESIGN.md section 5 lists the audits:

- every timed call gets poisoned outputs and fresh inputs; timed calls chosen at random are
  verified against the reference, untimed (``timed_output``);
- outputs that change after the stream is done, or GPU work that ends after the timed region
  closed, mean work left on another stream or thread (``other_stream``);
- inputs must be unchanged after a timed call (``input_mutation``);
- a persisting-L2 reservation would let data survive the L2 flush (``persisting_l2``);
- a profiled timed call must launch GPU work, and the same kernels as a checked call
  (``no_launch``, ``launches``);
- a latency below the bytes and FLOPs the workload needs at the device's peak rates is not
  reported but flagged IMPOSSIBLE (``floor``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from klineage.gate.result import Status

AuditName = Literal[
    "timed_output",
    "other_stream",
    "input_mutation",
    "persisting_l2",
    "no_launch",
    "launches",
    "floor",
]
"""The audit that failed, as named in a verdict."""

MARKER_KERNEL = "spin"
"""Substring of the marker kernels (torch.cuda._sleep) that open and close a profiled call."""

GRACE_S = 0.0002
"""How long a profiled call's window stays open after the device is idle, so work that a
background thread launches just after run() returns is still seen."""

# Device peaks the latency floor is drawn from. A measured copy reaches about 87% of the HBM
# peak, so the floor allows 1.25x the measured copy bandwidth; FLOP peaks are the datasheet's
# dense tensor-core rates (H100/H200 SXM) with 10% to spare.
COPY_BANDWIDTH_MARGIN = 1.25
FLOP_PEAK_MARGIN = 1.10
TENSOR_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100": {"float8": 1979e12, "half": 989e12, "float32": 494e12},
    "H200": {"float8": 1979e12, "half": 989e12, "float32": 494e12},
}
"""Dense tensor-core peak by device family and operand class (float32 means TF32: the fastest
way a float32 kernel could multiply)."""


DECOY_SHARE = 0.5
"""Share of timed calls whose outputs are filled with plausible finite values instead of NaN
before the call, so a kernel that computes only when its output looks poisoned is caught."""

PARTIAL_SHARE = 0.5
"""Share of timed calls that refresh only a middle block of each input (head and tail keep
their values), so a kernel that samples a few elements to decide "same input" is caught."""


class AuditConfig(BaseModel):
    """How hard the time stage audits. Part of the gate's contract: do not lower these to make
    a candidate pass."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    input_sets: int = Field(default=3, ge=2)
    """Input sets per timed target, each at its own addresses; every timed call picks one at
    random and fills it with fresh values first."""
    verified_per_trial: int = Field(default=3, ge=1)
    """Timed calls per trial, at random positions, whose outputs are checked (untimed)."""
    profiled_calls: int = Field(default=1, ge=1)
    """Extra calls per timed kernel, at random positions, watched by the profiler (launches,
    streams, work outside the timed region); they are verified too, but not sampled."""
    max_set_bytes: int = Field(default=24 * 1024**3, ge=1)
    """Device memory all input sets of one request may take; past it fewer sets are made (never
    fewer than two)."""


@dataclass
class AuditFailure(Exception):
    """A timed or profiled call failed an audit; becomes the workload's status and message."""

    status: Status
    audit: AuditName
    message: str

    def __str__(self) -> str:
        return f"{self.status.value} ({self.audit}): {self.message}"

    def __reduce__(self) -> tuple[type[AuditFailure], tuple[Status, AuditName, str]]:
        # sent from the worker to the gate: pickle the fields, not Exception's empty args
        return (AuditFailure, (self.status, self.audit, self.message))


# ---- which calls are verified ------------------------------------------------------------


def verified_positions(rng: random.Random, samples: int, per_trial: int) -> set[int]:
    """Sample indices of one trial whose outputs are verified: `per_trial` of them (all when
    there are fewer samples), drawn anew every trial so no position is fixed."""
    return set(rng.sample(range(samples), min(per_trial, samples)))


def profiled_positions(
    rng: random.Random, trials: int, samples: int, count: int
) -> set[tuple[int, int]]:
    """(trial, sample) slots before which an extra profiled call is made."""
    slots = [(t, s) for t in range(trials) for s in range(samples)]
    return set(rng.sample(slots, min(count, len(slots))))


def middle_block(rng: random.Random, numel: int) -> tuple[int, int]:
    """A random block [low, high) of a flattened tensor that leaves its first and last eighth
    alone (where "has this input changed?" samples look)."""
    margin = numel // 8
    low = rng.randrange(margin, max(margin + 1, numel // 2))
    high = rng.randrange(low + 1, max(low + 2, numel - margin + 1))
    return low, min(high, numel)


def input_set_count(set_bytes: int, targets: int, config: AuditConfig) -> int:
    """How many input sets each target gets within the memory allowance (at least two)."""
    if set_bytes <= 0:
        return config.input_sets
    affordable = config.max_set_bytes // max(1, set_bytes * targets)
    return max(2, min(config.input_sets, affordable))


# ---- what a profiled call launched ---------------------------------------------------------


@dataclass(frozen=True)
class GpuActivity:
    """One piece of GPU work the profiler saw: a kernel, a copy or a memset."""

    name: str
    stream: int
    """The profiler's stream id (not a cudaStream_t)."""
    start_ns: int
    end_ns: int


@dataclass
class CallLaunches:
    """The GPU work one profiled call made, between the opening and closing markers."""

    names: list[str] = field(default_factory=list)
    """Kernels, copies and memsets, in start order."""
    outside: list[GpuActivity] = field(default_factory=list)
    """Work that was still running when the timed region had closed (another stream or a
    thread the kernel left behind)."""


def launches_between_markers(activities: Sequence[GpuActivity]) -> CallLaunches:
    """Split a profiled window at its two marker kernels (the opening one long, so that work
    the call starts without waiting for the caller's stream overlaps it). Everything else in
    the window is the call's; work on another stream that started before the opening marker
    ended, or that ended after the closing marker started, was not ordered with the caller's
    stream: the timer did not see it. Work joined to the caller's stream (fork-join through
    events) lies between the markers and passes."""
    markers = [a for a in activities if MARKER_KERNEL in a.name]
    if len(markers) < 2:
        raise ValueError(f"expected two marker kernels in the profile, found {len(markers)}")
    opening = min(markers, key=lambda a: a.start_ns)
    closing = max(markers, key=lambda a: a.start_ns)
    ours = sorted((a for a in activities if MARKER_KERNEL not in a.name), key=lambda a: a.start_ns)
    return CallLaunches(
        names=[a.name for a in ours],
        outside=[
            a
            for a in ours
            if a.end_ns > closing.start_ns
            or (a.stream != opening.stream and a.start_ns < opening.end_ns)
        ],
    )


def launch_audit(
    timed: CallLaunches, checked: Sequence[str] | None, where: str
) -> AuditFailure | None:
    """A profiled timed call must launch GPU work, all of it inside the timed region, and the
    same kinds of work as a checked call (when one was profiled). Counts may differ (work that
    depends on the data), names may not."""
    if timed.outside:
        late = ", ".join(sorted({_short(a.name) for a in timed.outside}))
        return AuditFailure(
            Status.RUNTIME_ERROR,
            "other_stream",
            f"{where}: GPU work ({late}) ran on another stream without being ordered with the "
            "stream run() was given (or still ran after the call was over): the timer does not "
            "see it",
        )
    if not timed.names:
        return AuditFailure(
            Status.RUNTIME_ERROR,
            "no_launch",
            f"{where}: run() launched no GPU work (no kernel, copy or memset)",
        )
    if checked is not None and set(checked) != set(timed.names):
        return AuditFailure(
            Status.RUNTIME_ERROR,
            "launches",
            f"{where}: launched {_describe(timed.names)}, but a checked call launched "
            f"{_describe(checked)}: timed calls must run the work that was checked",
        )
    return None


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _describe(names: Iterable[str]) -> str:
    counts = Counter(names)
    if not counts:
        return "nothing"
    return ", ".join(f"{_short(n)} x{c}" for n, c in sorted(counts.items()))


# ---- the physical floor ------------------------------------------------------------------


class Floor(BaseModel):
    """The least time a workload can take on this device, and what it was drawn from."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    ms: float
    """The floor: the larger of the memory and arithmetic times below."""
    bytes: int
    """Bytes that must come from or go to device memory."""
    flops: float
    """Floating-point operations the definition declares (0 when it declares none)."""
    bytes_per_s: float
    """The memory rate allowed: measured copy bandwidth times COPY_BANDWIDTH_MARGIN."""
    flops_per_s: float | None
    """The arithmetic rate allowed, when the device's peak is known."""
    declared: bool = False
    """Whether the bytes are the definition's own (`floor.bytes`), not every input's."""

    def describe(self) -> str:
        parts = [f"{self.bytes / 1e6:.3g} MB at {self.bytes_per_s / 1e12:.3g} TB/s"]
        if self.flops and self.flops_per_s:
            parts.append(f"{self.flops / 1e9:.3g} GFLOP at {self.flops_per_s / 1e12:.4g} TFLOP/s")
        return f"{self.ms * 1e3:.3g} us ({'; '.join(parts)})"


def tensor_peak_flops(hardware: str, operand_dtypes: Iterable[str]) -> float | None:
    """The fastest dense tensor-core rate a kernel on these operands could use, if known."""
    family = next((f for f in TENSOR_PEAK_FLOPS if f in hardware.upper()), None)
    if family is None:
        return None
    peaks = TENSOR_PEAK_FLOPS[family]
    classes = {_operand_class(d) for d in operand_dtypes}
    return max(peaks[c] for c in classes) if classes else None


def _operand_class(dtype: str) -> str:
    if "float8" in dtype or "e4m3" in dtype or "e5m2" in dtype:
        return "float8"
    if dtype in ("float16", "bfloat16"):
        return "half"
    return "float32"


def latency_floor(
    *,
    input_bytes: int,
    output_bytes: int,
    declared_bytes: int | None,
    declared_flops: float | None,
    operand_dtypes: Iterable[str],
    copy_bytes_per_s: float,
    l2_bytes: int,
    hardware: str,
) -> Floor | None:
    """The floor of one workload. Inputs come from device memory (the L2 was flushed);
    outputs may stay in the L2, so only the part that does not fit counts. A definition that
    knows better (a gather reads a few rows of a table) declares its bytes."""
    if copy_bytes_per_s <= 0:
        return None
    moved = (
        declared_bytes
        if declared_bytes is not None
        else input_bytes + max(0, output_bytes - l2_bytes)
    )
    rate = copy_bytes_per_s * COPY_BANDWIDTH_MARGIN
    memory_s = moved / rate
    peak = tensor_peak_flops(hardware, operand_dtypes)
    flops = float(declared_flops or 0.0)
    flop_rate = peak * FLOP_PEAK_MARGIN if peak else None
    compute_s = flops / flop_rate if flop_rate and flops else 0.0
    return Floor(
        ms=max(memory_s, compute_s) * 1e3,
        bytes=moved,
        flops=flops,
        bytes_per_s=rate,
        flops_per_s=flop_rate,
        declared=declared_bytes is not None,
    )


def floor_audit(latency_ms: float, floor: Floor | None) -> AuditFailure | None:
    """A latency below the physical floor is not a measurement; say so instead of reporting it."""
    if floor is None or latency_ms >= floor.ms:
        return None
    return AuditFailure(
        Status.IMPOSSIBLE,
        "floor",
        f"measured {latency_ms * 1e3:.3g} us, below the physical floor of {floor.describe()}: "
        "the timer did not see the work"
        + (
            ""
            if floor.declared
            else " (or the kernel rightly reads less than every input byte, as under a causal "
            "mask: then declare the bytes it must move as floor.bytes in definition.json)"
        ),
    )
