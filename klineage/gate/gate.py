"""The gate: build -> check -> time, one verdict per kernel.

    with Gate() as gate:
        verdict = gate.run(problem, KernelSource.from_file("kernel.cu"))

The build runs here (no GPU needed); check and time run in a GPU worker process that is
restarted after a crash and killed on a timeout, so one bad kernel never ends a run.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from klineage.gate.audit import Floor, floor_audit, latency_floor
from klineage.gate.build import Builder, BuildResult, check_abi
from klineage.gate.energy import EnergyConfig
from klineage.gate.profile import Profile
from klineage.gate.profiler import ProfileConfig, Profiler
from klineage.gate.result import (
    GATE_PROTOCOL,
    AuditReport,
    Comparison,
    GateVerdict,
    Status,
    WorkloadVerdict,
)
from klineage.gate.timing import TimingConfig
from klineage.gate.worker import (
    REFERENCE,
    CheckReply,
    CheckRequest,
    ErrorReply,
    GpuWorker,
    HelloReply,
    TimeReply,
    TimeRequest,
    WorkerCrashed,
    WorkerTimeout,
)
from klineage.kernel import KernelSource
from klineage.problem import Definition, Problem, Workload
from klineage.problem.abi import KernelAbi

CHECK_TRIALS = 3
"""Seeded input sets per workload in the check stage (the contract asks for at least 3)."""


class GateSetupError(RuntimeError):
    """The gate cannot judge kernels for this problem (no GPU, a broken reference, ...)."""


@dataclass(frozen=True)
class GateEvent:
    """Progress report: `stage` is build, check, time, done or profile; `index` counts
    workloads."""

    stage: str
    kernel: str
    workload: str = ""
    index: int = 0
    total: int = 0
    verdict: WorkloadVerdict | None = None


ProgressHook = Callable[[GateEvent], None]

TimeReference = Literal["always", "unpaired"]
"""When the time stage also times the PyTorch reference: "always", or "unpaired", only in a
verdict without a baseline. A paired verdict's ratio is against its baseline, timed in the same
loop; mining reports no ratio to the reference, so there timing it only costs time (a third of
the timed calls; at fmha_fp16's largest workload, 48 ms of every 62)."""


class Gate:
    """Judges kernels: compile, correctness on every workload, timing against the reference."""

    def __init__(
        self,
        builder: Builder | None = None,
        *,
        device: int = 0,
        timing: TimingConfig | None = None,
        check_trials: int = CHECK_TRIALS,
        check_timeout_s: float = 60.0,
        time_timeout_s: float = 300.0,
        seed: int = 0,
        worker_runner: str | None = None,
        time_reference: TimeReference = "always",
        profile: ProfileConfig | None = None,
        energy: EnergyConfig | None = None,
    ) -> None:
        if check_trials < CHECK_TRIALS:
            raise ValueError(f"check_trials must be at least {CHECK_TRIALS} (the gate's contract)")
        self.builder = builder or Builder()
        if self.builder.device_only:
            raise ValueError(
                "a device-only Builder links no library for the worker to run: pass "
                "Builder(device_only=False) to a Gate"
            )
        self.timing = timing or TimingConfig()
        self.check_trials = check_trials
        self.check_timeout_s = check_timeout_s
        self.time_timeout_s = time_timeout_s
        self.seed = seed
        self.time_reference = time_reference
        self.profiler = (
            Profiler(profile, device=device, build_cache=self.builder.cache_dir)
            if profile is not None
            else None
        )
        self.energy = energy
        worker_args: dict[str, Any] = {"device": device}
        if worker_runner is not None:
            worker_args["runner"] = worker_runner
        self.worker = GpuWorker(**worker_args)

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop this gate's GPU worker process."""
        self.worker.close()

    # ---- stages -----------------------------------------------------------------------------

    def build(self, kernel: KernelSource, problem: Problem | None = None) -> BuildResult:
        """Compile `kernel` (no GPU needed), with its machine code and instruction histograms;
        with `problem`, under its compile options, and its `run(...)` must match the
        definition's ABI, else the result is a COMPILE_ERROR showing the expected line."""
        if problem is None:
            return self.builder.build(kernel.text, name=kernel.name, disassemble=True)
        builder = self.builder.with_options(problem.build_options)
        result = builder.build(kernel.text, name=kernel.name, disassemble=True)
        return check_abi(result, kernel.text, KernelAbi.from_definition(problem.definition))

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
        on_event: ProgressHook | None = None,
    ) -> GateVerdict:
        """Build, check on every workload, and (if `time_it`) time against the reference and,
        when `against` is given, against that baseline kernel in the same interleaved loop.
        The baseline is built and timed but not checked: it is the state being compared to."""
        notify = on_event or (lambda event: None)
        chosen = list(problem.workloads if workloads is None else workloads)
        notify(GateEvent("build", kernel.name, total=len(chosen)))
        build = self.build(kernel, problem)
        verdict = GateVerdict(
            problem=problem.name,
            kernel=kernel.name,
            fingerprint=kernel.fingerprint,
            build=build,
            baseline_fingerprint=against.fingerprint if against else None,
            protocol=GATE_PROTOCOL,
        )
        baseline_library: str | None = None
        if against is not None and build.ok and time_it:
            baseline_build = self.builder.with_options(problem.build_options).build(
                against.text, name=against.name, disassemble=True
            )
            if not baseline_build.ok:
                raise GateSetupError(
                    f"the baseline {against.name} does not build:\n{baseline_build.message}"
                )
            baseline_library = str(baseline_build.library)
        if build.ok:
            hello = self._start_worker()
            verdict.hardware = hello.hardware
            verdict.libs = {**hello.libs, "nvcc": build.nvcc_version}
            if self.energy is not None and time_it:
                verdict.energy_unavailable = hello.energy_unavailable
            for index, workload in enumerate(chosen):
                notify(GateEvent("check", kernel.name, workload.label, index, len(chosen)))
                result = self._gate_workload(
                    problem,
                    str(build.library),
                    workload,
                    time_it,
                    baseline_library,
                    notify,
                    kernel.name,
                    index,
                    len(chosen),
                    hello,
                )
                verdict.workloads.append(result)
                notify(GateEvent("done", kernel.name, workload.label, index, len(chosen), result))
            if self.profiles_every_verdict:
                notify(GateEvent("profile", kernel.name, total=len(chosen)))
                verdict.profile = self._profile(problem, kernel, verdict, chosen)
        verdict.timestamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        return verdict

    @property
    def profiles_every_verdict(self) -> bool:
        """Whether `run` profiles each passing kernel (else only `profile_kernel` does)."""
        return self.profiler is not None and self.profiler.config.every_verdict

    def profile_kernel(
        self,
        problem: Problem,
        kernel: KernelSource,
        latency_ms: dict[str, float] | None = None,
        *,
        workloads: Sequence[Workload] | None = None,
    ) -> Profile | None:
        """The profile stage alone, on a kernel a verdict already passed (its latencies by
        workload label, for the launch-bound test), on the largest of `workloads` (default:
        the problem's); None when this gate does not profile."""
        if self.profiler is None:
            return None
        build = self.build(kernel, problem)
        if not build.ok:
            return Profile.skip(f"the kernel does not build: {build.message[:200]}")
        hello = self._start_worker()
        return self.profiler.profile(
            build,
            problem.definition,
            problem.workloads if workloads is None else workloads,
            seed=self.seed,
            latency_ms=latency_ms,
            hardware=hello.hardware,
            copy_bytes_per_s=hello.copy_bytes_per_s,
        )

    def add_profile(
        self, problem: Problem, kernel: KernelSource, verdict: GateVerdict
    ) -> GateVerdict:
        """`verdict` (made without the profile stage) with its profile; unchanged when this
        gate does not profile."""
        gated = {w.workload_uuid for w in verdict.workloads}
        chosen = [w for w in problem.all_workloads() if w.uuid in gated]
        if self.profiler is None or not chosen:
            return verdict
        return verdict.model_copy(
            update={"profile": self._profile(problem, kernel, verdict, chosen)}
        )

    def _profile(
        self,
        problem: Problem,
        kernel: KernelSource,
        verdict: GateVerdict,
        chosen: Sequence[Workload],
    ) -> Profile | None:
        """The profile stage, for a kernel that passed every workload."""
        if not verdict.passed:
            return Profile.skip("not profiled: the kernel did not pass every workload")
        latency = {w.label: w.latency_ms for w in verdict.workloads if w.latency_ms}
        return self.profile_kernel(problem, kernel, latency, workloads=chosen)

    def _start_worker(self) -> Any:
        try:
            return self.worker.start()
        except (WorkerCrashed, WorkerTimeout) as err:
            tail = getattr(err, "log_tail", "")
            detail = f"{err}\n{tail}".rstrip()
            raise GateSetupError(
                f"{detail}\nThe check and time stages need a CUDA GPU and a CUDA build of torch; "
                "without them, pass --build-only (Gate.build in Python)."
            ) from err

    def _gate_workload(
        self,
        problem: Problem,
        library: str,
        workload: Workload,
        time_it: bool,
        baseline_library: str | None,
        notify: ProgressHook,
        kernel_name: str,
        index: int,
        total: int,
        hello: HelloReply,
    ) -> WorkloadVerdict:
        started = time.perf_counter()
        verdict = WorkloadVerdict(
            workload_uuid=workload.uuid,
            label=workload.label,
            status=Status.PASSED,
            audit=AuditReport(unavailable=dict(hello.audits_unavailable)),
        )
        assert verdict.audit is not None
        seeds = [self.seed + trial for trial in range(self.check_trials)]
        check = CheckRequest(library, problem.definition, workload, seeds)
        reply = self._ask(check, self.check_timeout_s, verdict, "check")
        if isinstance(reply, CheckReply):
            verdict.status, verdict.message = reply.status, reply.message
            verdict.correctness = reply.correctness
            verdict.audit.failed = reply.audit
            verdict.audit.checked_launches = reply.launches
        if verdict.passed and time_it:
            notify(GateEvent("time", kernel_name, workload.label, index, total))
            with_reference = self.time_reference == "always" or not baseline_library
            targets = [
                library,
                *([baseline_library] if baseline_library else []),
                *([REFERENCE] if with_reference else []),
            ]
            timing = TimeRequest(
                targets,
                problem.definition,
                workload,
                self.seed,
                self.timing,
                checked_launches=verdict.audit.checked_launches,
                energy=self.energy,
            )
            reply = self._ask(timing, self.time_timeout_s, verdict, "time")
            if isinstance(reply, TimeReply):
                self._record_timing(verdict, reply, with_reference, bool(baseline_library))
                self._audit_floor(verdict, problem.definition, workload, hello)
        verdict.seconds = time.perf_counter() - started
        return verdict

    @staticmethod
    def _record_timing(
        verdict: WorkloadVerdict, reply: TimeReply, with_reference: bool, paired: bool
    ) -> None:
        assert verdict.audit is not None
        verdict.audit.input_sets = reply.input_sets
        verdict.audit.verified_calls = reply.verified_calls
        verdict.audit.timed_launches = reply.timed_launches
        if reply.failure is not None:
            verdict.status = reply.failure.status
            verdict.message = reply.failure.message
            verdict.audit.failed = reply.failure.audit
            return
        verdict.timing = reply.timings[0]
        if with_reference:
            verdict.reference_timing = reply.timings[-1]
        if reply.energy:
            verdict.energy = reply.energy[0]
            verdict.reference_energy = reply.energy[-1] if with_reference else None
        if paired:
            verdict.comparison = Comparison.of(reply.timings[0], reply.timings[1])

    @staticmethod
    def _audit_floor(
        verdict: WorkloadVerdict, definition: Definition, workload: Workload, hello: HelloReply
    ) -> None:
        """A latency below what the workload's bytes and FLOPs need is not reported."""
        assert verdict.audit is not None
        if verdict.timing is None:
            return
        floor = workload_floor(definition, workload, hello)
        verdict.audit.floor_ms = floor.ms if floor else None
        failure = floor_audit(verdict.timing.latency_ms, floor)
        if failure is not None:
            verdict.status, verdict.message = failure.status, failure.message
            verdict.audit.failed = failure.audit

    def _ask(
        self,
        request: CheckRequest | TimeRequest,
        timeout_s: float,
        verdict: WorkloadVerdict,
        stage: str,
    ) -> Any:
        """Send a request; turn timeouts, crashes and errors into the verdict's status."""
        try:
            reply = self.worker.request(request, timeout_s)
        except WorkerTimeout:
            verdict.status = Status.TIMEOUT
            verdict.message = (
                f"{stage}: no answer within {timeout_s:g} s; the worker was killed and restarted"
            )
            return None
        except WorkerCrashed as err:
            verdict.status = Status.RUNTIME_ERROR
            verdict.message = f"{stage}: {err}\n{err.log_tail[-800:]}".rstrip()
            return None
        if isinstance(reply, ErrorReply):
            if reply.kind == "reference":
                raise GateSetupError(f"{verdict.label}: {reply.message}")
            verdict.status = Status.RUNTIME_ERROR
            restarted = (
                "; the CUDA context was poisoned, the worker restarted" if (reply.poisoned) else ""
            )
            verdict.message = f"{stage}: {reply.message}{restarted}"
            return None
        return reply


def workload_floor(definition: Definition, workload: Workload, hello: HelloReply) -> Floor | None:
    """The physical latency floor of a workload on the worker's device (klineage.gate.audit)."""
    values = definition.axis_values(workload)
    own = [s for s in definition.outputs.values() if s.inplace_of is None]
    declared_bytes, declared_flops = definition.floor_values(workload)
    return latency_floor(
        input_bytes=sum(definition.nbytes(s, values) for s in definition.inputs.values()),
        output_bytes=sum(definition.nbytes(s, values) for s in own),
        declared_bytes=declared_bytes,
        declared_flops=declared_flops,
        operand_dtypes=[s.dtype for s in definition.inputs.values() if not s.is_scalar],
        copy_bytes_per_s=hello.copy_bytes_per_s,
        l2_bytes=hello.l2_bytes,
        hardware=hello.hardware,
    )
