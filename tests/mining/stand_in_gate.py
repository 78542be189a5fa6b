"""STAND-IN for the gate's GPU stages (a labelled test double at the GPU boundary).

The build stage is real (nvcc through Builder: compile errors and ptxas reports are real).
The check and time stages are synthesized from the kernel's source by explicit rules, so the
mining logic (walk, graph, conditions, skills, persistence, resume) runs on a CPU-only CI:

- latency = base * product of `cost[m]` over catalog mechanisms NOT present in the kernel
  (removing mechanism m makes the kernel `cost[m]` times slower);
- `breaks`: mechanisms whose removal makes the kernel wrong (INCORRECT_NUMERICAL);
- `breaks_together`: sets of mechanisms whose removal makes the kernel wrong only when every
  one of a set is gone (an expert's latent fault that one removal alone leaves hidden);
- `needed_text`: source texts whose absence makes the kernel wrong (one site of a mechanism
  that cannot go while its others can);
- `probe_failures`: mechanism -> predicate over axis values; while the mechanism is present,
  workloads where the predicate holds fail with RUNTIME_ERROR (misaligned address);
- `profiles`: the profile stage when asked (`profile_kernel`, as mining and replay ask it), as
  a function of the mechanisms present (it returns a profile made of counters recorded on
  the H200); `profiled` counts the kernels it profiled;
- `same_kernel_noise`: per-trial latency factors of a kernel compared against its own source
  (a round trip that restored the optimized source exactly), as timing noise reads on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from klineage.gate.build import Builder, BuildResult
from klineage.gate.profile import Profile
from klineage.gate.result import (
    GATE_PROTOCOL,
    Comparison,
    Correctness,
    GateVerdict,
    Status,
    Timing,
    WorkloadVerdict,
)
from klineage.kernel import KernelSource
from klineage.mechanisms import all_mechanisms
from klineage.mining.mine import MineReport, mine
from klineage.problem import Problem, Workload
from klineage.replay.run import ReplayReport, replay

BASE_MS = 0.010


class StandInGate:
    """Real builds, synthetic verdicts. Counts the verdicts it makes in `runs`."""

    def __init__(
        self,
        builder: Builder,
        *,
        cost: dict[str, float] | None = None,
        breaks: Sequence[str] = (),
        breaks_together: Sequence[Sequence[str]] = (),
        probe_failures: dict[str, Callable[[dict[str, int]], bool]] | None = None,
        expert_mechanisms: Sequence[str] = (),
        needed_text: Sequence[str] = (),
        profiles: Callable[[set[str]], Profile] | None = None,
        same_kernel_noise: Sequence[float] | None = None,
    ) -> None:
        self.builder = builder
        self.cost = cost or {}
        self.breaks = set(breaks)
        self.breaks_together = [frozenset(s) for s in breaks_together]
        self.probe_failures = probe_failures or {}
        self.expert_mechanisms = set(expert_mechanisms)
        self.needed_text = tuple(needed_text)
        self.profiles = profiles
        self.same_kernel_noise = same_kernel_noise
        self.profiled: list[str] = []
        self.runs = 0

    def build(self, kernel: KernelSource, problem: Problem | None = None) -> BuildResult:
        """The real build stage, under the problem's compile options as the real gate's."""
        builder = (
            self.builder if problem is None else self.builder.with_options(problem.compile_options)
        )
        return builder.build(kernel.text, name=kernel.name)

    def present(self, kernel: KernelSource) -> set[str]:
        return {m.name for m in all_mechanisms() if any(s.supported for s in m.detect(kernel))}

    def latency(self, present: set[str]) -> float:
        latency = BASE_MS
        for mechanism, factor in self.cost.items():
            if mechanism not in present:
                latency *= factor
        return latency

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        self.runs += 1
        build = self.build(kernel, problem)
        verdict = GateVerdict(
            problem=problem.name,
            kernel=kernel.name,
            fingerprint=kernel.fingerprint,
            build=build,
            hardware="stand-in (no GPU)",
            timestamp="2026-01-01T00:00:00+00:00",
            protocol=GATE_PROTOCOL,
        )
        if not build.ok:
            return verdict
        present = self.present(kernel)
        base = self.present(against) if against is not None else set()
        missing = [text for text in self.needed_text if text not in kernel.text]
        noise = (
            self.same_kernel_noise
            if against is not None and against.fingerprint == kernel.fingerprint
            else None
        )
        for workload in problem.workloads if workloads is None else workloads:
            result = self._one(workload, present, base, time_it, against, missing)
            if noise is not None and result.timing is not None and result.comparison is not None:
                trials = result.timing.samples_ms
                noisy = Timing(
                    samples_ms=[[ms * f for ms in s] for s, f in zip(trials, noise, strict=True)]
                )
                baseline = _timing(self.latency(base))
                result.timing = noisy
                result.comparison = Comparison.of(noisy, baseline)
            verdict.workloads.append(result)
        return verdict

    def profile_kernel(
        self, problem: Problem, kernel: KernelSource, latency_ms: dict[str, float] | None = None
    ) -> Profile | None:
        """The stand-in profile of `kernel`; None without `profiles` (a gate that does not
        profile)."""
        if self.profiles is None:
            return None
        self.profiled.append(kernel.fingerprint)
        return self.profiles(self.present(kernel))

    def _one(
        self,
        workload: Workload,
        present: set[str],
        base: set[str],
        time_it: bool,
        against: KernelSource | None,
        missing: Sequence[str] = (),
    ) -> WorkloadVerdict:
        result = WorkloadVerdict(
            workload_uuid=workload.uuid, label=workload.label, status=Status.PASSED
        )
        gone = self.expert_mechanisms - present
        broken = gone & self.breaks
        broken |= {m for s in self.breaks_together if s <= gone for m in s}
        failing_probe = [
            m for m, rule in self.probe_failures.items() if m in present and rule(workload.axes)
        ]
        if missing:
            result.status = Status.INCORRECT_NUMERICAL
            result.message = f"y: 3 of 4096 elements wrong (stand-in: {missing[0]!r} removed)"
            result.correctness = Correctness(max_absolute_error=0.5, bad_elements=3, trials=1)
            return result
        if broken:
            result.status = Status.INCORRECT_NUMERICAL
            result.message = f"y: 12 of 4096 elements wrong (stand-in: {sorted(broken)} removed)"
            result.correctness = Correctness(max_absolute_error=0.5, bad_elements=12, trials=1)
            return result
        if failing_probe:
            result.status = Status.RUNTIME_ERROR
            result.message = f"check: misaligned address (stand-in: {failing_probe[0]})"
            return result
        result.correctness = Correctness(trials=3, total_elements=1)
        if time_it:
            result.timing = _timing(self.latency(present))
            result.reference_timing = _timing(BASE_MS * 3)
            if against is not None:
                result.comparison = Comparison.of(result.timing, _timing(self.latency(base)))
        return result


def _timing(ms: float) -> Timing:
    return Timing(samples_ms=[[ms] * 5, [ms * 1.002] * 5, [ms * 0.998] * 5])


def mine_gated(*args: Any, **kwargs: Any) -> MineReport:
    """`mine` gating every removal, also those that change no machine code: the stand-in's
    costs make each of the fixture's mechanisms matter (the compiler already applies two of
    them), and the tests using it are about the walk around them."""
    return mine(*args, skip_no_ops=False, **kwargs)


def replay_gated(*args: Any, **kwargs: Any) -> ReplayReport:
    """`replay` gating every move, also those that change no machine code (as `mine_gated`)."""
    return replay(*args, skip_no_ops=False, **kwargs)
