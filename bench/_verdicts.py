"""What the benchmark scripts keep of a gate verdict's workloads."""

from __future__ import annotations

from typing import Any

from klineage.gate.result import GateVerdict


def workload_rows(verdict: GateVerdict) -> list[dict[str, Any]]:
    """Per workload: the kernel's and the reference's latency and joules per call, and the
    board's mean power while the kernel ran (None where not measured)."""
    return [
        {
            "label": w.label,
            "latency_ms": w.latency_ms,
            "reference_ms": w.reference_latency_ms,
            "joules_per_call": w.joules_per_call,
            "reference_joules_per_call": (
                w.reference_energy.joules_per_call if w.reference_energy else None
            ),
            "mean_watts": w.energy.mean_watts if w.energy else None,
        }
        for w in verdict.workloads
    ]
