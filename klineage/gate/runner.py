"""The check and time stages, as run inside a GPU worker process.

The check follows the gate's contract (DESIGN.md section 5): per workload, several seeded input
sets written into the same buffers (a kernel that returns an earlier call's answer fails the
second trial), outputs poisoned before each call, inputs compared with a pristine copy after
it, outputs snapshotted as soon as the given stream is done (work left running on another
stream shows up as outputs that change afterwards), and the FlashInfer element rule.
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Callable
from typing import Any

import torch

from klineage.gate.audit import AuditFailure, input_set_count, launch_audit
from klineage.gate.check import (
    OutputComparison,
    changed_elements,
    compare_by_spec,
    compare_output,
)
from klineage.gate.energy import (
    Energy,
    EnergyConfig,
    calls_for,
    measure_energy,
    open_nvml_counter,
)
from klineage.gate.inputs import (
    ReferenceFailure,
    allocate_outputs,
    check_reference_outputs,
    derive_seed,
    make_inputs,
    poison,
    refill_inputs,
    run_reference,
)
from klineage.gate.result import Correctness, Status, Timing
from klineage.gate.targets import KernelTarget, ReferenceTarget, set_bytes
from klineage.gate.timing import copy_bandwidth, flush_buffer, sample_interleaved
from klineage.gate.watch import LaunchWatcher, PersistingL2Guard
from klineage.gate.worker import (
    REFERENCE,
    CheckReply,
    CheckRequest,
    ErrorReply,
    HelloReply,
    TimeReply,
    TimeRequest,
)
from klineage.problem import Definition, Workload
from klineage.problem.abi import KernelAbi

COPY_PROBE_BYTES = 1024**3
"""A device-to-device copy this large (far past the L2) measures the memory rate the latency
floor is drawn from."""


class KernelFailure(RuntimeError):
    """run() returned an error code or a CUDA call failed around it."""


def _error_name(code: int) -> str:
    try:
        return str(torch.cuda.CudaError(code))
    except Exception:  # the name is a courtesy; never let it hide the code
        return "unknown error"


class DeviceRunner:
    """Serves CheckRequest and TimeRequest on the worker's one visible GPU."""

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("the GPU worker found no CUDA device")
        torch.cuda.init()
        self.props = torch.cuda.get_device_properties(0)
        # torch's pool streams are non-blocking: a kernel that launches on the legacy default
        # stream or a stream of its own is not silently ordered before our reads
        self.stream = torch.cuda.Stream()
        self.l2_bytes = int(getattr(self.props, "L2_cache_size", 0))
        self.flush = flush_buffer(self.l2_bytes)
        self._libraries: dict[str, ctypes.CDLL] = {}
        self.watcher = LaunchWatcher()
        self.l2 = PersistingL2Guard()
        self.l2.clear(self.stream.cuda_stream)
        self.copy_bytes_per_s = copy_bandwidth(COPY_PROBE_BYTES)
        self.energy_counter = open_nvml_counter(_device_uuid(self.props), _pci_bus_id(self.props))

    def hello(self) -> HelloReply:
        unavailable = {
            name: watcher.reason
            for name, watcher in (("launches", self.watcher), ("persisting_l2", self.l2))
            if not watcher.available
        }
        return HelloReply(
            hardware=self.props.name,
            libs={"torch": torch.__version__, "cuda": str(torch.version.cuda)},
            l2_bytes=self.l2_bytes,
            copy_bytes_per_s=self.copy_bytes_per_s,
            audits_unavailable=unavailable,
            energy_unavailable=(
                self.energy_counter if isinstance(self.energy_counter, str) else ""
            ),
        )

    def handle(self, request: CheckRequest | TimeRequest) -> Any:
        try:
            if isinstance(request, CheckRequest):
                return self.check(request)
            return self.time(request)
        except ReferenceFailure as err:
            return ErrorReply("reference", str(err), poisoned=self._poisoned())
        except Exception as err:
            return ErrorReply("kernel", f"{type(err).__name__}: {err}", poisoned=self._poisoned())

    def _poisoned(self) -> bool:
        try:
            torch.cuda.synchronize()
            probe = torch.ones(4, device="cuda")
            return float((probe + 1).sum()) != 8.0
        except Exception:
            return True

    # ---- the kernel ABI -------------------------------------------------------------------

    def kernel_call(
        self,
        library: str,
        definition: Definition,
        workload: Workload,
        inputs: dict[str, Any],
        outputs: dict[str, torch.Tensor],
    ) -> Callable[[], None]:
        """A no-argument closure that calls run(...) on the worker's stream and checks its code."""
        if library not in self._libraries:
            self._libraries[library] = ctypes.CDLL(library, mode=ctypes.RTLD_LOCAL)
        abi = KernelAbi.from_definition(definition)
        fn = abi.bind(self._libraries[library])
        args = abi.arguments(
            inputs, outputs, definition.axis_values(workload), self.stream.cuda_stream
        )

        def call() -> None:
            code = fn(*args)
            if code != 0:
                raise KernelFailure(f"run() returned cudaError {code} ({_error_name(code)})")

        return call

    # ---- check ----------------------------------------------------------------------------

    def check(self, request: CheckRequest) -> CheckReply:
        definition, workload = request.definition, request.workload
        inputs = make_inputs(definition, workload, request.seeds[0], "cuda")
        fresh = allocate_outputs(definition, workload, "cuda")
        call = self.kernel_call(request.library, definition, workload, inputs, fresh)
        # an output updated in place lives in its input's buffer
        updated = definition.inplace_outputs()
        outputs = {name: inputs.get(updated.get(name, ""), fresh[name]) for name in fresh}
        must_not_change = {
            k: v
            for k, v in inputs.items()
            if isinstance(v, torch.Tensor) and k not in updated.values()
        }
        totals = Correctness()
        launches: list[str] | None = None
        previous_ref: dict[str, torch.Tensor] | None = None
        for trial, seed in enumerate(request.seeds):
            if trial > 0:
                refill_inputs(definition, workload, inputs, seed)
            torch.cuda.synchronize()
            pristine = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            for name, out in fresh.items():
                if name in updated:
                    continue
                if previous_ref is None:
                    poison(out)
                else:
                    # a decoy that looks like an answer: the previous trial's, which a kernel
                    # computing only when its output looks poisoned would leave in place
                    out.copy_(previous_ref[name])
            torch.cuda.synchronize()
            where = f"trial {trial + 1} of {len(request.seeds)} (seed {seed})"
            with torch.cuda.stream(self.stream):
                if trial == len(request.seeds) - 1 and self.watcher.available:
                    # the last checked call is watched (a first call may set up workspace):
                    # timed calls must launch the same work
                    seen = self.watcher.watch(call)
                    failure = launch_audit(seen, None, f"checked call, {where}")
                    if failure is not None:
                        return CheckReply(failure.status, failure.message, None, failure.audit)
                    launches = seen.names
                else:
                    call()
                self.stream.synchronize()
                snapshot = {k: v.clone() for k, v in outputs.items()}
                self.stream.synchronize()
            torch.cuda.synchronize()
            late = [k for k in outputs if changed_elements(snapshot[k], outputs[k])]
            if late:
                return CheckReply(
                    Status.RUNTIME_ERROR,
                    f"{where}: output {', '.join(late)} changed after run() returned and its "
                    "stream finished: the kernel left work running on another stream",
                    None,
                    "other_stream",
                )
            changed = {k: changed_elements(pristine[k], v) for k, v in must_not_change.items()}
            written = {k: n for k, n in changed.items() if n}
            if written:
                detail = ", ".join(f"{k} ({n} elements)" for k, n in written.items())
                return CheckReply(
                    Status.RUNTIME_ERROR,
                    f"{where}: the kernel wrote to its input {detail}; inputs must be unchanged",
                    None,
                    "input_mutation",
                )
            # the reference runs after the kernel, so no answer of it sits in memory the
            # kernel could find (a freed reference output is still in torch's cache)
            given = {k: pristine.get(k, v) for k, v in inputs.items()}  # scalars as given
            ref = run_reference(definition, given, definition.axis_values(workload))
            if trial == 0:
                check_reference_outputs(definition, workload, ref)
            comparisons = [
                compare_by_spec(definition, name, snapshot, ref, pristine)
                for name in definition.outputs
            ]
            _accumulate(totals, comparisons)
            failing = [c for c in comparisons if not c.ok]
            if failing:
                message = f"{where}: " + "; ".join(c.describe() for c in failing)
                if previous_ref is not None and _matches(definition, snapshot, previous_ref):
                    message = (
                        f"{where}: the outputs equal the previous call's answer: the kernel "
                        "returned a cached result for fresh inputs at the same addresses, or "
                        "skipped the work because its output did not look poisoned"
                    )
                return CheckReply(Status.INCORRECT_NUMERICAL, message, totals)
            previous_ref = ref
        return CheckReply(Status.PASSED, "", totals, launches=launches)

    # ---- time -----------------------------------------------------------------------------

    def time(self, request: TimeRequest) -> TimeReply:
        definition, workload = request.definition, request.workload
        rng = random.Random(derive_seed(request.seed, workload.uuid, "time"))
        generator = torch.Generator(device="cuda").manual_seed(rng.getrandbits(63))
        config = request.config
        sets = input_set_count(set_bytes(definition, workload), len(request.targets), config.audit)
        targets: list[KernelTarget | ReferenceTarget] = []
        for position, target in enumerate(request.targets):
            if target == REFERENCE:
                targets.append(ReferenceTarget(definition, workload, sets, rng, generator))
            else:
                audited = position == 0  # the candidate; a baseline is only timed
                targets.append(
                    KernelTarget(
                        self,
                        definition,
                        workload,
                        target,
                        sets,
                        rng,
                        generator,
                        audited=audited,
                        checked_launches=request.checked_launches if audited else None,
                    )
                )
        self.l2.clear(self.stream.cuda_stream)
        torch.cuda.synchronize()
        try:
            samples = sample_interleaved(
                targets,
                self.stream,
                self.flush,
                config,
                rng,
                audit_device=self._l2_audit,
            )
        except AuditFailure as failure:
            torch.cuda.synchronize()
            return TimeReply([], failure=failure)
        torch.cuda.synchronize()
        kernel = targets[0]
        assert isinstance(kernel, KernelTarget)  # the candidate comes first (TimeRequest)
        timings = [Timing(samples_ms=s) for s in samples]
        return TimeReply(
            timings,
            input_sets=sets,
            verified_calls=kernel.verified_calls,
            timed_launches=kernel.timed_launches,
            energy=self._energy(request.energy, targets, timings),
        )

    def _energy(
        self,
        config: EnergyConfig | None,
        targets: list[KernelTarget | ReferenceTarget],
        timings: list[Timing],
    ) -> list[Energy | None]:
        """Each target's energy per call, measured after every sample was taken (the timed
        region never holds a counter read): back to back on its first input set."""
        counter = self.energy_counter
        if config is None or isinstance(counter, str):
            return []
        with torch.cuda.stream(self.stream):
            return [
                measure_energy(
                    target.steady_call(),
                    self.stream.synchronize,
                    counter,
                    calls_for(timing.latency_ms, config),
                    config,
                )
                for target, timing in zip(targets, timings, strict=True)
            ]

    def _l2_audit(self, where: str) -> None:
        failure = self.l2.audit(where, self.stream.cuda_stream)
        if failure is not None:
            raise failure


def _device_uuid(props: Any) -> str | None:
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid else None


def _pci_bus_id(props: Any) -> str | None:
    """NVML's form of the device's PCI address (domain:bus:device.function), when torch
    exposes it."""
    parts = [getattr(props, f"pci_{name}_id", None) for name in ("domain", "bus", "device")]
    if any(part is None for part in parts):
        return None
    domain, bus, device = parts
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def _accumulate(totals: Correctness, comparisons: list[OutputComparison]) -> None:
    totals.trials += 1
    for c in comparisons:
        totals.max_absolute_error = max(totals.max_absolute_error, c.max_abs)
        totals.max_relative_error = max(totals.max_relative_error, c.max_rel)
        totals.bad_elements += c.bad
        totals.total_elements += c.total


def _matches(
    definition: Definition, outputs: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
) -> bool:
    return all(
        compare_output(name, outputs[name], ref[name], definition.tolerance_for(name)).ok
        for name in definition.outputs
    )
