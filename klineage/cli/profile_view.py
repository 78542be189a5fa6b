"""The profile stage's result as the `klineage gate --profile` command prints it."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from klineage.cli.tables import Column, print_rows, short_kernel_names
from klineage.gate.profile import LaunchProfile, Profile


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _occupancy(launch: LaunchProfile) -> str:
    achieved = _pct(launch.achieved_occupancy_pct)
    theoretical = _pct(launch.theoretical_occupancy_pct)
    limiter = f" ({launch.occupancy_limiter})" if launch.occupancy_limiter else ""
    return f"{achieved}/{theoretical}{limiter}"


def launch_rows(profile: Profile) -> list[list[str | Text]]:
    """One row per launch: time, throughputs, occupancy, bank conflicts, top stall."""
    names = short_kernel_names([launch.kernel for launch in profile.launches])
    rows: list[list[str | Text]] = []
    for name, launch in zip(names, profile.launches, strict=True):
        stall = launch.top_stalls[0] if launch.top_stalls else None
        rows.append(
            [
                name,
                f"{launch.duration_ns / 1e3:.3g}",
                _pct(launch.dram_pct),
                _pct(launch.l2_pct),
                _pct(launch.sm_pct),
                _pct(launch.tensor_pct),
                _occupancy(launch),
                "-"
                if launch.shared_bank_conflicts is None
                else f"{launch.shared_bank_conflicts:.0f}",
                f"{stall.reason} {stall.warps_per_issue:.2f}" if stall else "-",
            ]
        )
    return rows


def print_profile(console: Console, profile: Profile) -> None:
    """The launches' counters, the traffic against the minimum, the bottleneck and why."""
    if not profile.profiled:
        console.print(Text(f"profile skipped: {profile.skipped}", style="yellow"), soft_wrap=True)
        return
    columns = [
        Column("kernel", key=True),
        Column.figure("us"),
        Column.figure("DRAM"),
        Column.figure("L2", optional=True),
        Column.figure("SM"),
        Column.figure("tensor", optional=True),
        Column("occupancy", short=True),
        Column.figure("bank conflicts", optional=True),
        Column("top stall", short=True, optional=True),
    ]
    cost = "cached" if profile.cached else f"{profile.seconds:.1f} s of ncu"
    title = f"profile of {profile.label} ({cost})"
    print_rows(console, columns, launch_rows(profile), title=title)
    moved, ratio = profile.dram_bytes, profile.bytes_over_minimum
    if moved is not None and ratio is not None:
        console.print(
            f"DRAM traffic {moved / 1e6:.3g} MB, {ratio:.2f}x the workload's minimum "
            f"({profile.minimum_bytes / 1e6:.3g} MB)"
        )
    call = profile.bottleneck
    if call is not None:
        console.print(Text("bottleneck: ", style="bold") + Text(call.kind.value))
        for line in call.evidence:
            console.print(Text(f"  - {line}"), soft_wrap=True)
