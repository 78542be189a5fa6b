"""A bottleneck class per kernel state, from its hardware counters and the roofline.

The rule is Nsight Compute's own speed-of-light triage, made explicit:

- **launch-bound**: the GPU is mostly idle during a call: its kernels run for less than half
  of the timed latency (the rest is launch overhead and gaps between launches), or the whole
  call's kernels take less than a launch costs and no unit gets busy;
- **memory-bound**: the busiest memory unit (DRAM, L2, L1/shared) reaches BUSY_PCT of its
  peak and at least the SM's share;
- **compute-bound**: the SM or the tensor pipes reach BUSY_PCT and more than memory;
- **latency/occupancy-bound**: neither reaches BUSY_PCT: warps wait (the stall reasons say on
  what) and too few are resident to hide it (the occupancy and its limiter say why).

The roofline (arithmetic intensity against the machine balance, peak FLOP/s over peak bytes/s)
is kept as evidence and says which side a kernel that is not yet busy would saturate first.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from klineage.gate.profile import LaunchProfile, Profile

BUSY_PCT = 60.0
"""A unit at or above this share of its peak is the limiter (Nsight Compute's speed-of-light
guidance: below 60% of peak the kernel is held back by latency, not by a unit's throughput)."""
LAUNCH_GAP_SHARE = 0.5
"""Launch-bound when the kernels' GPU time is below this share of the timed latency."""
SHORT_CALL_NS = 5_000.0
"""A call whose kernels take under 5 us costs about what launching them does (2-5 us)."""
TENSOR_ACTIVE_PCT = 1.0
"""Tensor pipes busier than this mean the kernel multiplies on tensor cores."""


class Bottleneck(str, enum.Enum):
    """What limits a kernel."""

    MEMORY = "memory-bound"
    COMPUTE = "compute-bound"
    LATENCY = "latency/occupancy-bound"
    LAUNCH = "launch-bound"


class MachinePeaks(BaseModel):
    """A device's peak rates, and where they come from."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """The device family they describe (matched against the GPU's name)."""
    dram_bytes_per_s: float
    """Peak DRAM bandwidth."""
    fp32_flops_per_s: float
    """Peak FP32 rate of the CUDA cores (no tensor cores)."""
    tensor_flops_per_s: dict[str, float] = Field(default_factory=dict)
    """Dense tensor-core peak by operand class: half (FP16/BF16), float32 (TF32), float8."""
    source: str
    """Where the numbers come from (a datasheet, or a measurement and its date)."""

    def with_measured_bandwidth(self, bytes_per_s: float) -> MachinePeaks:
        """These peaks with DRAM bandwidth measured on the device (a large copy's read+write
        rate), so the machine balance is the device's own."""
        if bytes_per_s <= 0:
            return self
        return self.model_copy(
            update={
                "dram_bytes_per_s": bytes_per_s,
                "source": f"{self.source}; DRAM bandwidth measured on the device (copy rate)",
            }
        )

    @classmethod
    def load(cls, path: str | Path) -> MachinePeaks:
        """Peaks from a JSON file (e.g. measured ones); the error names the file."""
        target = Path(path)
        try:
            return cls.model_validate(json.loads(target.read_text()))
        except (OSError, ValueError) as err:
            raise ValueError(f"{target}: not a machine-peaks file: {err}") from err


DATASHEET_PEAKS = {
    "H200": MachinePeaks(
        name="H200",
        dram_bytes_per_s=4.8e12,
        fp32_flops_per_s=67e12,
        tensor_flops_per_s={"half": 989e12, "float32": 494e12, "float8": 1979e12},
        source="NVIDIA H200 Tensor Core GPU datasheet, SXM, dense (without sparsity)",
    ),
    "H100": MachinePeaks(
        name="H100",
        dram_bytes_per_s=3.35e12,
        fp32_flops_per_s=67e12,
        tensor_flops_per_s={"half": 989e12, "float32": 494e12, "float8": 1979e12},
        source="NVIDIA H100 Tensor Core GPU datasheet, SXM, dense (without sparsity)",
    ),
}
"""Documented peaks of the devices this project runs on."""


def peaks_for(hardware: str) -> MachinePeaks | None:
    """The datasheet peaks of the device family `hardware` names, None for an unknown one."""
    upper = hardware.upper()
    return next((p for name, p in DATASHEET_PEAKS.items() if name in upper), None)


class BottleneckCall(BaseModel):
    """The bottleneck class of one kernel state and the evidence that decided it."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    kind: Bottleneck
    """The class."""
    evidence: list[str]
    """The counters and comparisons that decided it, in words, deciding one first."""
    memory_pct: float | None = None
    """The busiest memory unit's throughput, % of peak (weighted over launches)."""
    compute_pct: float | None = None
    """The SM's or tensor pipes' throughput, % of peak (weighted over launches)."""
    arithmetic_intensity: float | None = None
    """FLOPs per DRAM byte of the call."""
    machine_balance: float | None = None
    """Peak FLOP/s over peak bytes/s of the device: the roofline's ridge point."""
    roofline_side: str | None = None
    """'memory' below the ridge, 'compute' above it; None when unknown."""


def _busiest(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _memory_pct(profile: Profile) -> float | None:
    return _busiest([profile.weighted(f) for f in ("memory_pct", "dram_pct", "l2_pct", "l1_pct")])


def _compute_pct(profile: Profile) -> float | None:
    return _busiest([profile.weighted("sm_pct"), profile.weighted("tensor_pct")])


def _uses_tensor_cores(profile: Profile) -> bool:
    tensor = profile.weighted("tensor_pct")
    return tensor is not None and tensor > TENSOR_ACTIVE_PCT


def _call_flops(profile: Profile, peaks: MachinePeaks | None, operand_class: str) -> float:
    """The call's FLOPs: counted on the CUDA cores, plus the tensor pipes' share of their peak
    over their launches' time; at least what the definition declares."""
    counted = sum(launch.fp_flops or 0.0 for launch in profile.launches)
    tensor_peak = peaks.tensor_flops_per_s.get(operand_class) if peaks else None
    if tensor_peak:
        counted += sum(
            (launch.tensor_pct or 0.0) / 100 * tensor_peak * launch.duration_ns * 1e-9
            for launch in profile.launches
            if (launch.tensor_pct or 0.0) > TENSOR_ACTIVE_PCT  # below: counter noise
        )
    return max(counted, profile.minimum_flops)


def _roofline(
    profile: Profile, peaks: MachinePeaks | None, operand_class: str
) -> tuple[float | None, float | None, str | None]:
    moved = profile.dram_bytes
    if peaks is None or not moved:
        return None, None, None
    flops = _call_flops(profile, peaks, operand_class)
    tensor = _uses_tensor_cores(profile)
    compute_peak = peaks.tensor_flops_per_s.get(operand_class) if tensor else None
    balance = (compute_peak or peaks.fp32_flops_per_s) / peaks.dram_bytes_per_s
    intensity = flops / moved
    return intensity, balance, "memory" if intensity < balance else "compute"


def _pct(value: float | None) -> str:
    return f"{value:.0f}%" if value is not None else "unknown"


def _latency_evidence(profile: Profile) -> list[str]:
    """Why warps wait: occupancy, its limiter, waves, the top stalls of the longest launch."""
    longest: LaunchProfile = max(profile.launches, key=lambda launch: launch.duration_ns)
    facts = []
    if longest.achieved_occupancy_pct is not None:
        limit = (
            f", theoretical {_pct(longest.theoretical_occupancy_pct)} limited by "
            f"{longest.occupancy_limiter}"
            if longest.occupancy_limiter
            else ""
        )
        facts.append(
            f"achieved occupancy {_pct(longest.achieved_occupancy_pct)} of the SM's warps{limit}"
        )
    if longest.waves is not None and longest.waves < 1:
        facts.append(f"{longest.waves:.2f} waves: the grid leaves SMs idle")
    if longest.top_stalls:
        stalls = ", ".join(f"{s.reason} {s.warps_per_issue:.2f}" for s in longest.top_stalls)
        facts.append(f"top warp stalls (warps per issued instruction): {stalls}")
    return facts


def classify(
    profile: Profile,
    *,
    latency_ms: float | None = None,
    peaks: MachinePeaks | None = None,
    operand_class: str = "float32",
) -> BottleneckCall | None:
    """The bottleneck of a profiled call (None for a profile without launches). `latency_ms`
    is the gate's timed latency of the same workload (the launch-bound test), `peaks` the
    device's (the roofline), `operand_class` picks the tensor peak (half, float32, float8)."""
    if not profile.launches:
        return None
    memory = _memory_pct(profile)
    compute = _compute_pct(profile)
    intensity, balance, side = _roofline(profile, peaks, operand_class)
    kernel_ns = profile.kernel_ns
    busy = f"busiest memory unit {_pct(memory)} of peak, SM/tensor {_pct(compute)}"
    roofline = (
        [
            f"arithmetic intensity {intensity:.3g} FLOP/byte vs machine balance {balance:.3g}: "
            f"{side} side of the roofline"
        ]
        if intensity is not None and balance is not None
        else []
    )
    moved = profile.bytes_over_minimum
    traffic = [f"DRAM traffic {moved:.2f}x the workload's minimum"] if moved is not None else []
    launches = len(profile.launches)
    gpu_time = f"{kernel_ns / 1e3:.3g} us of GPU time in {launches} launch(es)"

    def call(kind: Bottleneck, evidence: list[str]) -> BottleneckCall:
        return BottleneckCall(
            kind=kind,
            evidence=evidence,
            memory_pct=memory,
            compute_pct=compute,
            arithmetic_intensity=intensity,
            machine_balance=balance,
            roofline_side=side,
        )

    busiest = max(memory or 0.0, compute or 0.0)
    if latency_ms and kernel_ns < LAUNCH_GAP_SHARE * latency_ms * 1e6:
        return call(
            Bottleneck.LAUNCH,
            [
                f"{gpu_time} against {latency_ms * 1e3:.3g} us timed: the GPU idles between "
                "launches for most of the call",
                busy,
                *roofline,
            ],
        )
    if kernel_ns < SHORT_CALL_NS and busiest < BUSY_PCT:
        return call(
            Bottleneck.LAUNCH,
            [f"{gpu_time}: no more than launching costs, and no unit busy", busy, *roofline],
        )
    if memory is not None and memory >= BUSY_PCT and memory >= (compute or 0.0):
        return call(Bottleneck.MEMORY, [busy, *traffic, *roofline])
    if compute is not None and compute >= BUSY_PCT:
        tensor = _pct(profile.weighted("tensor_pct"))
        return call(Bottleneck.COMPUTE, [busy, f"tensor pipes {tensor}", *roofline])
    return call(
        Bottleneck.LATENCY,
        [
            f"no unit busy: {busy} (below {BUSY_PCT:.0f}%)",
            *_latency_evidence(profile),
            *traffic,
            *roofline,
        ],
    )
