"""Gate verdicts: statuses, per-workload results, paired comparisons.

Statuses are FlashInfer-Trace's, so a verdict can be written as a trace other tools read.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from klineage.gate.build import BuildResult
from klineage.gate.energy import Energy
from klineage.gate.profile import Profile

NOT_SLOWER_RATIO = 0.99
"""A candidate is "not slower" when baseline/candidate is at least this, overall and per trial."""


class Status(str, Enum):
    """Outcome of gating one kernel on one workload (FlashInfer-Trace's evaluation statuses)."""

    PASSED = "PASSED"
    COMPILE_ERROR = "COMPILE_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    INCORRECT_SHAPE = "INCORRECT_SHAPE"
    INCORRECT_DTYPE = "INCORRECT_DTYPE"
    INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
    TIMEOUT = "TIMEOUT"
    IMPOSSIBLE = "IMPOSSIBLE"
    """Ours, not FlashInfer-Trace's: a latency below the physical floor (the timer did not see
    the work). Traces write it as RUNTIME_ERROR with the reason in the log."""


class Correctness(BaseModel):
    """Errors of the kernel's outputs against the reference, worst over outputs and trials."""

    model_config = ConfigDict(use_attribute_docstrings=True, ser_json_inf_nan="strings")

    max_absolute_error: float = 0.0
    """Largest |out - ref| over finite elements."""
    max_relative_error: float = 0.0
    """Largest |out - ref| / |ref| over finite elements with ref != 0."""
    bad_elements: int = 0
    """Elements failing the rule |err| > atol and |err| > rtol*|ref| (or a NaN/Inf ref lacks)."""
    total_elements: int = 0
    """Elements compared (all outputs, all trials)."""
    trials: int = 0
    """Seeded input sets the kernel was checked on."""


class Timing(BaseModel):
    """Device latencies of one target, as sampled: `trials` lists of per-call milliseconds."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    samples_ms: list[list[float]]
    """One list of per-call latencies per trial."""
    timer: str = "cuda_event"
    """Which clock produced the samples."""

    @property
    def trial_medians_ms(self) -> list[float]:
        return [statistics.median(trial) for trial in self.samples_ms]

    @property
    def latency_ms(self) -> float:
        """Median of trial medians."""
        return statistics.median(self.trial_medians_ms)

    @property
    def spread(self) -> float:
        """(max - min) / median of the trial medians: how much trials disagree."""
        medians = self.trial_medians_ms
        return (max(medians) - min(medians)) / statistics.median(medians)


def not_slower(ratio: float, trial_ratios: Sequence[float]) -> bool:
    """The gate's "not slower" rule: ratio >= 0.99 overall and in every trial."""
    return ratio >= NOT_SLOWER_RATIO and all(r >= NOT_SLOWER_RATIO for r in trial_ratios)


class Comparison(BaseModel):
    """A candidate timed against a baseline in one worker run, interleaved call by call."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    ratio: float
    """baseline latency / candidate latency (medians of trial medians): > 1 means faster."""
    trial_ratios: list[float]
    """The same ratio per trial."""
    candidate_ms: float
    """Candidate latency, median of trial medians."""
    baseline_ms: float
    """Baseline latency, median of trial medians."""

    @property
    def not_slower(self) -> bool:
        """The gate's "not slower" rule: ratio >= 0.99 overall and in every trial."""
        return not_slower(self.ratio, self.trial_ratios)

    @classmethod
    def of(cls, candidate: Timing, baseline: Timing) -> Comparison:
        pairs = zip(baseline.trial_medians_ms, candidate.trial_medians_ms, strict=True)
        trial_ratios = [b / c for b, c in pairs]
        return cls(
            ratio=baseline.latency_ms / candidate.latency_ms,
            trial_ratios=trial_ratios,
            candidate_ms=candidate.latency_ms,
            baseline_ms=baseline.latency_ms,
        )


GATE_PROTOCOL = "audited-1"
"""What a verdict's timing stands on. Verdicts made before the timing audits carry none, and a
gate log does not serve them to an audited run."""


class AuditReport(BaseModel):
    """What the timing audits did for one workload (klineage.gate.audit)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    failed: str | None = None
    """The audit that failed, when one did: timed_output, other_stream, input_mutation,
    persisting_l2, no_launch, launches or floor."""
    input_sets: int = 0
    """Input sets each timed target rotated over (fresh values before every call)."""
    verified_calls: int = 0
    """Timed and profiled calls of the kernel whose outputs were checked, untimed."""
    checked_launches: list[str] | None = None
    """GPU work (kernels, copies, memsets) of the first checked call, from the profiler."""
    timed_launches: list[str] | None = None
    """GPU work of a profiled timed call."""
    floor_ms: float | None = None
    """The physical latency floor of this workload on this device."""
    unavailable: dict[str, str] = Field(default_factory=dict)
    """Audits the worker could not make, and why (no CUPTI, no runtime library)."""


class WorkloadVerdict(BaseModel):
    """The gate's verdict for one kernel on one workload."""

    model_config = ConfigDict(use_attribute_docstrings=True, ser_json_inf_nan="strings")

    workload_uuid: str
    """The workload's uuid."""
    label: str
    """Readable axis values, e.g. `rows=4096,cols=1024`."""
    status: Status
    """Check outcome (and TIMEOUT / RUNTIME_ERROR from either stage)."""
    message: str = ""
    """Why it failed, in words; empty when it passed."""
    correctness: Correctness | None = None
    """Errors against the reference, when the outputs could be compared."""
    timing: Timing | None = None
    """The kernel's latencies, when timed."""
    reference_timing: Timing | None = None
    """The PyTorch reference's latencies, timed in the same run."""
    comparison: Comparison | None = None
    """Against a baseline kernel, when one was given."""
    audit: AuditReport | None = None
    """What the timing audits did, or which one failed."""
    energy: Energy | None = None
    """The kernel's energy per call (NVML), measured after its samples, when asked and
    readable."""
    reference_energy: Energy | None = None
    """The PyTorch reference's energy per call, measured the same way."""
    seconds: float = 0.0
    """Wall time spent on this workload (check + time)."""

    @property
    def passed(self) -> bool:
        """This workload's status is PASSED."""
        return self.status is Status.PASSED

    @property
    def latency_ms(self) -> float | None:
        """The kernel's timed latency (ms), None when it was not timed."""
        return self.timing.latency_ms if self.timing else None

    @property
    def reference_latency_ms(self) -> float | None:
        """The PyTorch reference's latency (ms) in the same run, None when not timed."""
        return self.reference_timing.latency_ms if self.reference_timing else None

    @property
    def joules_per_call(self) -> float | None:
        """The kernel's energy per call (J), None when it was not measured."""
        return self.energy.joules_per_call if self.energy else None

    @property
    def speedup_factor(self) -> float | None:
        """Reference latency / kernel latency."""
        if self.timing is None or self.reference_timing is None:
            return None
        return self.reference_timing.latency_ms / self.timing.latency_ms


class GateVerdict(BaseModel):
    """Everything the gate learned about one kernel on one problem."""

    model_config = ConfigDict(use_attribute_docstrings=True, ser_json_inf_nan="strings")

    problem: str
    """Definition name."""
    kernel: str
    """Kernel display name."""
    fingerprint: str
    """Kernel fingerprint."""
    build: BuildResult
    """The build stage's result (status, ptxas report, log)."""
    workloads: list[WorkloadVerdict] = Field(default_factory=list)
    """One verdict per workload, in the order gated; empty when the build failed."""
    baseline_fingerprint: str | None = None
    """Fingerprint of the baseline kernel for paired comparisons, if any."""
    hardware: str = ""
    """GPU name the check and time stages ran on (empty for build-only)."""
    libs: dict[str, str] = Field(default_factory=dict)
    """Library versions of the run (torch, CUDA, nvcc)."""
    timestamp: str = ""
    """ISO-8601 time the verdict was finished."""
    protocol: str = ""
    """GATE_PROTOCOL of the gate that made it ('' for verdicts made before the audits)."""
    profile: Profile | None = None
    """The profile stage's counters and bottleneck class, when the gate profiled (its
    `skipped` says why when it could not)."""
    energy_unavailable: str = ""
    """Why no energy was measured although it was asked for (no NVML, no counter)."""

    @property
    def status(self) -> Status:
        """COMPILE_ERROR, or the first non-PASSED workload status, or PASSED."""
        if not self.build.ok:
            return Status.COMPILE_ERROR
        for verdict in self.workloads:
            if not verdict.passed:
                return verdict.status
        return Status.PASSED

    @property
    def passed(self) -> bool:
        """Built, and every workload judged PASSED (at least one)."""
        return self.status is Status.PASSED and bool(self.workloads)

    @property
    def comparison(self) -> Comparison | None:
        """Pooled comparison over workloads: geometric means of the ratios."""
        pairs = [v.comparison for v in self.workloads if v.comparison is not None]
        if not pairs or len(pairs) != len(self.workloads):
            return None
        trials = len(pairs[0].trial_ratios)
        return Comparison(
            ratio=geomean([p.ratio for p in pairs]),
            trial_ratios=[geomean([p.trial_ratios[t] for p in pairs]) for t in range(trials)],
            candidate_ms=geomean([p.candidate_ms for p in pairs]),
            baseline_ms=geomean([p.baseline_ms for p in pairs]),
        )


def geomean(values: Sequence[float]) -> float:
    """Geometric mean; 1.0 for no values (no change)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 1.0
