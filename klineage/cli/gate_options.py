"""The command-line options that turn on the gate's optional stages (profile, energy), shared
by `klineage gate`, `mine` and `replay`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from klineage.gate.energy import EnergyConfig
from klineage.gate.profiler import ProfileConfig

ProfileOption = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="Profile the largest workload under Nsight Compute (ncu): counters per launch "
        "and the kernel's bottleneck class (gate: each passing kernel; mine: the states its "
        "skills compare; replay: the states it goes on from). Skipped, saying why, where ncu "
        "is missing or cannot read the counters.",
    ),
]
EnergyOption = Annotated[
    bool,
    typer.Option(
        "--energy",
        help="Measure energy per call (NVML's energy counter) after timing; needs "
        "nvidia-ml-py (the `energy` extra).",
    ),
]


def optional_stages(profile: bool, energy: bool, *, every_verdict: bool = True) -> dict[str, Any]:
    """Gate keyword arguments for the chosen optional stages (none for a stage left off);
    `every_verdict=False` profiles only the kernels mining and replay ask for."""
    stages: dict[str, Any] = {}
    if profile:
        stages["profile"] = ProfileConfig(every_verdict=every_verdict)
    if energy:
        stages["energy"] = EnergyConfig()
    return stages
