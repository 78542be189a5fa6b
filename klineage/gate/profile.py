"""What the profile stage records: hardware counters per kernel launch of one workload, and
the profile of a whole call (its launches, the bytes it moved against the least it needs, the
bottleneck they show).

The numbers come from Nsight Compute (:mod:`klineage.gate.ncu`); this module only reads them
into models, so it runs and is tested without a GPU on recorded reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from klineage.gate import ncu
from klineage.gate.bottleneck import BottleneckCall
from klineage.problem import Definition, Workload

TOP_STALLS = 3
"""Warp-stall reasons kept per launch, largest first."""


@dataclass
class ProfileRequest:
    """What the profiled process (klineage.gate.profile_main) is asked to run: a built kernel
    library on one workload. Defined here, not in that module: run as `python -m` it is
    __main__, whose classes are not the ones a request was pickled as."""

    library: str
    """Path of the kernel's shared library."""
    definition: Definition
    workload: Workload
    seed: int
    """Seed of the inputs (any valid inputs do; the gate's seed keeps runs reproducible)."""


class StallReason(BaseModel):
    """One reason warps were not issuing, and how much."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    reason: str
    """Nsight Compute's warp-state name: long_scoreboard, barrier, mio_throttle, ..."""
    warps_per_issue: float
    """Warps stalled for this reason per issued instruction (higher is worse)."""


class LaunchProfile(BaseModel):
    """The counters of one kernel launch."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    kernel: str
    """The kernel's demangled name."""
    duration_ns: float
    """GPU time of the launch (ncu replays it with caches flushed)."""
    dram_pct: float | None = None
    """DRAM throughput, % of peak sustained over the launch."""
    l2_pct: float | None = None
    """L2 throughput, % of peak."""
    l1_pct: float | None = None
    """L1/TEX (and shared memory) throughput, % of peak while active."""
    memory_pct: float | None = None
    """Memory speed of light: the busiest memory unit's throughput, % of peak."""
    sm_pct: float | None = None
    """SM (compute) speed of light: the busiest SM pipe's throughput, % of peak."""
    tensor_pct: float | None = None
    """Tensor pipes active, % of peak cycles."""
    achieved_occupancy_pct: float | None = None
    """Warps active per cycle, % of the SM's maximum."""
    theoretical_occupancy_pct: float | None = None
    """The most warps the launch's resources allow, % of the SM's maximum."""
    occupancy_limiter: str | None = None
    """The resource that allows the fewest blocks per SM (registers, shared memory, block
    size or blocks per SM), when the theoretical occupancy is below the SM's maximum; None
    when nothing holds it below."""
    blocks_per_sm_limits: dict[str, float] = Field(default_factory=dict)
    """Blocks per SM each resource allows."""
    grid_size: int | None = None
    """Blocks launched."""
    block_size: int | None = None
    """Threads per block."""
    registers_per_thread: int | None = None
    """Registers per thread."""
    waves: float | None = None
    """Waves of blocks per SM (below 1: the grid leaves SMs idle)."""
    shared_bank_conflicts: float | None = None
    """Shared-memory bank conflicts (loads plus stores)."""
    dram_bytes: float | None = None
    """Bytes read from and written to DRAM."""
    global_load_sectors: float | None = None
    """32-byte sectors global loads asked of L1 (fewer per request: wider, coalesced loads)."""
    global_load_requests: float | None = None
    """Global load requests (one per warp-level load instruction)."""
    shared_instructions: float | None = None
    """Warp-level shared-memory loads and stores executed."""
    fp_flops: float | None = None
    """Floating-point operations executed on the CUDA cores (FP32 and packed FP16; tensor-core
    work is not counted here)."""
    top_stalls: list[StallReason] = Field(default_factory=list)
    """The largest warp-stall reasons, largest first."""


def _sum(launch: ncu.RawLaunch, names: Sequence[str]) -> float | None:
    values = [launch.get(name) for name in names]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _flops(launch: ncu.RawLaunch) -> float | None:
    weighted = [
        (launch.get(name), weight) for name, weight in {**ncu.FP32_OPS, **ncu.FP16_OPS}.items()
    ]
    present = [value * weight for value, weight in weighted if value is not None]
    return sum(present) if present else None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None else None


FULL_OCCUPANCY_PCT = 99.9
"""A theoretical occupancy this high is the SM's maximum: no resource limits it."""


def _limiter(limits: dict[str, float], theoretical_pct: float | None) -> str | None:
    if not limits or (theoretical_pct is not None and theoretical_pct >= FULL_OCCUPANCY_PCT):
        return None
    return min(limits, key=lambda resource: limits[resource])


def launch_profile(launch: ncu.RawLaunch, top: int = TOP_STALLS) -> LaunchProfile:
    """The counters of one raw launch, named."""
    limits = {
        resource: value
        for resource, metric in ncu.OCCUPANCY_LIMITS.items()
        if (value := launch.get(metric)) is not None
    }
    stalls = [
        StallReason(reason=reason, warps_per_issue=value)
        for reason in ncu.STALL_REASONS
        # "selected" is the warp that did issue: not a stall
        if reason != "selected" and (value := launch.get(ncu.stall_metric(reason)))
    ]
    stalls.sort(key=lambda s: (-s.warps_per_issue, s.reason))
    return LaunchProfile(
        kernel=launch.kernel,
        duration_ns=launch.get(ncu.DURATION) or 0.0,
        dram_pct=launch.get(ncu.DRAM_PCT),
        l2_pct=launch.get(ncu.L2_PCT),
        l1_pct=launch.get(ncu.L1_PCT),
        memory_pct=launch.get(ncu.MEMORY_PCT),
        sm_pct=launch.get(ncu.SM_PCT),
        tensor_pct=launch.get(ncu.TENSOR_PCT),
        achieved_occupancy_pct=launch.get(ncu.ACHIEVED_OCCUPANCY),
        theoretical_occupancy_pct=launch.get(ncu.THEORETICAL_OCCUPANCY),
        occupancy_limiter=_limiter(limits, launch.get(ncu.THEORETICAL_OCCUPANCY)),
        blocks_per_sm_limits=limits,
        grid_size=_int(launch.get(ncu.GRID_SIZE)),
        block_size=_int(launch.get(ncu.BLOCK_SIZE)),
        registers_per_thread=_int(launch.get(ncu.REGISTERS)),
        waves=launch.get(ncu.WAVES),
        shared_bank_conflicts=_sum(launch, ncu.BANK_CONFLICTS),
        dram_bytes=_sum(launch, ncu.DRAM_BYTES),
        global_load_sectors=launch.get(ncu.GLOBAL_LOAD_SECTORS),
        global_load_requests=launch.get(ncu.GLOBAL_LOAD_REQUESTS),
        shared_instructions=_sum(launch, ncu.SHARED_INSTRUCTIONS),
        fp_flops=_flops(launch),
        top_stalls=stalls[:top],
    )


class Profile(BaseModel):
    """The profile stage's result for one kernel on one workload."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    workload_uuid: str = ""
    """The workload profiled (the largest of the verdict's, by bytes it must move)."""
    label: str = ""
    """Its axis values."""
    skipped: str | None = None
    """Why nothing was profiled (no ncu, counters not readable, the kernel failed); None when
    the launches below were profiled."""
    launches: list[LaunchProfile] = Field(default_factory=list)
    """Every kernel launch of one call of run(), in launch order."""
    minimum_bytes: int = 0
    """Bytes the workload must move at least: its inputs and outputs (or what the definition
    declares in its `floor`)."""
    minimum_flops: float = 0.0
    """FLOPs the definition declares the workload needs (0 when it declares none)."""
    bottleneck: BottleneckCall | None = None
    """What limits the kernel, and the evidence (klineage.gate.bottleneck)."""
    seconds: float = 0.0
    """Wall time of the ncu run that produced it (0 for none)."""
    cached: bool = False
    """Served from the profile cache (same build, same workload, same metrics)."""
    tool: str = ""
    """The profiler's version line."""

    @property
    def profiled(self) -> bool:
        """Launches were profiled (not skipped)."""
        return self.skipped is None and bool(self.launches)

    @property
    def kernel_ns(self) -> float:
        """GPU time of all launches of the call."""
        return sum(launch.duration_ns for launch in self.launches)

    @property
    def dram_bytes(self) -> float | None:
        """DRAM bytes moved by all launches, None when no launch reported them."""
        return self.total("dram_bytes")

    def total(self, field: str) -> float | None:
        """A per-launch count summed over launches, None when no launch reported it."""
        values = [v for launch in self.launches if (v := getattr(launch, field)) is not None]
        return float(sum(values)) if values else None

    @property
    def bytes_over_minimum(self) -> float | None:
        """DRAM bytes moved / the least the workload needs (1.0 moves each byte once). Below
        1 when outputs are still in the L2 as the launch ends (a small workload's writes
        never reach DRAM while ncu watches)."""
        moved = self.dram_bytes
        if moved is None or self.minimum_bytes <= 0:
            return None
        return moved / self.minimum_bytes

    def weighted(self, field: str) -> float | None:
        """A per-launch percentage averaged over launches, weighted by their GPU time."""
        pairs = [
            (value, launch.duration_ns)
            for launch in self.launches
            if (value := getattr(launch, field)) is not None
        ]
        total = sum(weight for _, weight in pairs)
        if not pairs or total <= 0:
            return None
        return sum(float(value) * weight for value, weight in pairs) / total

    @classmethod
    def skip(cls, reason: str, label: str = "", workload_uuid: str = "") -> Profile:
        """A profile that was not made, saying why."""
        return cls(skipped=reason, label=label, workload_uuid=workload_uuid)
