"""Nsight Compute reports recorded on the H200 (tests/fixtures/ncu/), read into the profile
stage's models for the tests that need real counters: the naive gelu's raw page, and the
bf16 gemm expert's details page (its raw page was not kept)."""

from __future__ import annotations

import csv
import gzip
import io

from klineage.gate import ncu
from klineage.gate.profile import LaunchProfile, launch_profile
from tests.conftest import FIXTURES

REPORTS = FIXTURES / "ncu"
SPEED_OF_LIGHT = "GPU Speed Of Light Throughput"
GEMM_TENSOR_PCT = 72.1
"""The gemm report's tensor-pipe share, as ncu's HighPipeUtilization rule prints it."""


def recorded(name: str) -> str:
    """A recorded export (kept gzipped)."""
    with gzip.open(REPORTS / f"{name}.gz", "rt", encoding="utf-8") as handle:
        return handle.read()


def details_rows(name: str) -> list[dict[str, str]]:
    """The rows of a report's `--page details` export."""
    return list(csv.DictReader(io.StringIO(recorded(f"{name}.details.csv"))))


def details(name: str) -> dict[tuple[str, str], str]:
    """ncu's details page of a report: (section, metric) -> the value ncu printed."""
    return {(r["Section Name"], r["Metric Name"]): r["Metric Value"] for r in details_rows(name)}


def sol_rule(name: str) -> str:
    """ncu's own speed-of-light verdict on the report (its SOLBottleneck rule)."""
    return next(
        r["Rule Description"] for r in details_rows(name) if r["Rule Name"] == "SOLBottleneck"
    )


def gelu_launch() -> LaunchProfile:
    """The naive gelu's one launch (workload 0: 43 blocks, 2.4 us), from its raw page."""
    (launch,) = ncu.parse_raw_csv(recorded("gelu_naive.raw.csv"))
    return launch_profile(launch)


def gemm_launch() -> LaunchProfile:
    """The bf16 gemm expert's launch, from the figures of its details page."""
    page = details("gemm_bf16")
    occupancy = "Occupancy"
    return LaunchProfile(
        kernel="gemm_tiled<0>",
        duration_ns=float(page[(SPEED_OF_LIGHT, "Duration")]) * 1e3,
        dram_pct=float(page[(SPEED_OF_LIGHT, "DRAM Throughput")]),
        memory_pct=float(page[(SPEED_OF_LIGHT, "Memory Throughput")]),
        l1_pct=float(page[(SPEED_OF_LIGHT, "L1/TEX Cache Throughput")]),
        l2_pct=float(page[(SPEED_OF_LIGHT, "L2 Cache Throughput")]),
        sm_pct=float(page[(SPEED_OF_LIGHT, "Compute (SM) Throughput")]),
        tensor_pct=GEMM_TENSOR_PCT,
        achieved_occupancy_pct=float(page[(occupancy, "Achieved Occupancy")]),
        theoretical_occupancy_pct=float(page[(occupancy, "Theoretical Occupancy")]),
        registers_per_thread=int(page[("Launch Statistics", "Registers Per Thread")]),
        waves=float(page[("Launch Statistics", "Waves Per SM")]),
    )
