"""A profiled call's counters in a few named figures, and how a step changed them.

Mining profiles both states of an accepted step (each is the candidate of its own verdict);
the figures here, simplified -> optimized, are what the skill's card reports: e.g. a
vectorizing step moves more sectors per load request and raises DRAM throughput, a
warp-shuffle reduction takes shared-memory instructions away.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from klineage.gate.profile import Profile

NOTABLE_CHANGE = 0.05
"""A figure that moved by at least 5% of its larger value is a change worth reading."""


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _longest_occupancy(profile: Profile) -> float | None:
    return profile.weighted("achieved_occupancy_pct")


def _registers(profile: Profile) -> float | None:
    values = [launch.registers_per_thread for launch in profile.launches]
    present = [v for v in values if v is not None]
    return float(max(present)) if present else None


CALL_FIGURES: dict[str, Callable[[Profile], float | None]] = {
    "GPU time (us)": lambda p: p.kernel_ns / 1e3,
    "launches": lambda p: float(len(p.launches)),
    "DRAM throughput (% of peak)": lambda p: p.weighted("dram_pct"),
    "L2 throughput (% of peak)": lambda p: p.weighted("l2_pct"),
    "L1/shared throughput (% of peak)": lambda p: p.weighted("l1_pct"),
    "SM throughput (% of peak)": lambda p: p.weighted("sm_pct"),
    "tensor pipes (% of peak)": lambda p: p.weighted("tensor_pct"),
    "achieved occupancy (%)": _longest_occupancy,
    "registers per thread": _registers,
    "DRAM traffic / minimum": lambda p: p.bytes_over_minimum,
    "sectors per global load request": lambda p: _ratio(
        p.total("global_load_sectors"), p.total("global_load_requests")
    ),
    "global load requests": lambda p: p.total("global_load_requests"),
    "shared-memory instructions": lambda p: p.total("shared_instructions"),
    "shared-memory bank conflicts": lambda p: p.total("shared_bank_conflicts"),
    "FLOPs on CUDA cores": lambda p: p.total("fp_flops"),
}
"""The figures a call is summed up by, each from its launches."""


class CounterChange(BaseModel):
    """One figure on both sides of a step."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    figure: str
    """What is measured (a key of CALL_FIGURES)."""
    simplified: float
    """Its value on the simpler kernel (before the skill)."""
    optimized: float
    """Its value on the optimized kernel (after the skill)."""

    @property
    def relative(self) -> float:
        """(optimized - simplified) / the larger magnitude: -1..1, 0 for no change."""
        scale = max(abs(self.simplified), abs(self.optimized))
        return (self.optimized - self.simplified) / scale if scale else 0.0

    @property
    def notable(self) -> bool:
        """It moved by at least NOTABLE_CHANGE."""
        return abs(self.relative) >= NOTABLE_CHANGE

    def describe(self) -> str:
        """'DRAM throughput (% of peak) 41 -> 78 (up)'."""
        direction = "up" if self.optimized > self.simplified else "down"
        if not self.notable:
            direction = "same"
        return (
            f"{self.figure} {_figure(self.simplified)} -> {_figure(self.optimized)} ({direction})"
        )


def _figure(value: float) -> str:
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-2):
        return f"{value:.3g}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def counter_changes(simplified: Profile, optimized: Profile) -> list[CounterChange]:
    """Each figure both profiles have, simplified -> optimized, in CALL_FIGURES order."""
    changes = []
    for figure, value_of in CALL_FIGURES.items():
        before, after = value_of(simplified), value_of(optimized)
        if before is not None and after is not None:
            changes.append(CounterChange(figure=figure, simplified=before, optimized=after))
    return changes
