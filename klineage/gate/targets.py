"""What the time stage times: a kernel (candidate or baseline) or the PyTorch reference, each
over several input sets that move and change between calls. Runs inside the GPU worker.

Each target owns its input sets (its own addresses: nothing one target computed lies in
another's buffers), draws the set for every call at random, and fills it with fresh values
first, so caching by pointer, by shape or by sampled content gains nothing. The candidate's
calls are audited (`klineage.gate.audit`): outputs poisoned before every call, randomly chosen
calls verified against the reference, extra calls watched by the profiler.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from klineage.gate.audit import (
    DECOY_SHARE,
    PARTIAL_SHARE,
    AuditFailure,
    launch_audit,
    middle_block,
)
from klineage.gate.check import changed_count, changed_elements, compare_by_spec, output_fails
from klineage.gate.inputs import (
    allocate_outputs,
    axis_keywords,
    fill_random_,
    load_reference,
    make_inputs,
    poison,
    run_reference,
)
from klineage.gate.result import Status
from klineage.problem import Definition, Workload

if TYPE_CHECKING:
    from klineage.gate.watch import LaunchWatcher


class Host(Protocol):
    """What a target needs from the worker's runner."""

    stream: torch.cuda.Stream
    watcher: LaunchWatcher

    def kernel_call(
        self,
        library: str,
        definition: Definition,
        workload: Workload,
        inputs: dict[str, Any],
        outputs: dict[str, torch.Tensor],
    ) -> Callable[[], None]: ...


def set_bytes(definition: Definition, workload: Workload) -> int:
    """Device bytes of one input set: its inputs and its own outputs."""
    values = definition.axis_values(workload)
    own = [s for s in definition.outputs.values() if s.inplace_of is None]
    return sum(definition.nbytes(s, values) for s in [*definition.inputs.values(), *own])


@dataclass
class InputSet:
    """One set of buffers a target is called with."""

    inputs: dict[str, Any]
    outputs: dict[str, torch.Tensor]
    """Every output by name (an output updated in place is its input's buffer)."""
    call: Callable[[], None]


class _Target:
    """Input sets at their own addresses, one drawn at random and refreshed per call."""

    audited = False

    def __init__(
        self,
        definition: Definition,
        workload: Workload,
        rng: random.Random,
        generator: torch.Generator,
    ) -> None:
        self.definition = definition
        self.workload = workload
        self.rng = rng
        self.generator = generator
        self.sets: list[InputSet] = []
        self.current = 0
        self.decoys: dict[str, torch.Tensor] = {}
        """Outputs as a decoy fill left them before a verified call (when one was used)."""
        # worked out once: prepare() runs before every timed call, where host time counts
        self.values = definition.axis_values(workload)
        self.updated = definition.inplace_outputs()
        self.tensor_inputs = [
            (name, spec) for name, spec in definition.inputs.items() if not spec.is_scalar
        ]

    def _fresh_inputs(self) -> dict[str, Any]:
        # the seed only shapes the first values; every call refreshes them anyway
        return make_inputs(self.definition, self.workload, self.rng.getrandbits(31), "cuda")

    def prepare(self, verify: bool) -> Callable[[], None]:
        self.current = self.rng.randrange(len(self.sets))
        chosen = self.sets[self.current]
        if self.rng.random() < PARTIAL_SHARE:
            self._refresh_middle(chosen.inputs)
        else:
            self._refresh_all(chosen.inputs)
        self.decoys = {}
        decoy = self.rng.random() < DECOY_SHARE
        for name, out in chosen.outputs.items():
            if name in self.updated:
                continue
            if decoy:
                fill_random_(out, self.definition.outputs[name], self.values, self.generator)
                if verify:
                    self.decoys[name] = out.clone()
            else:
                poison(out)
        return chosen.call

    def steady_call(self) -> Callable[[], None]:
        """The call on the first input set as it stands, with nothing refreshed or poisoned
        around it: what the energy measurement repeats back to back, after the samples."""
        return self.sets[0].call

    def _refresh_all(self, inputs: dict[str, Any]) -> None:
        for name, spec in self.tensor_inputs:
            fill_random_(inputs[name], spec, self.values, self.generator)

    def _refresh_middle(self, inputs: dict[str, Any]) -> None:
        for name, spec in self.tensor_inputs:
            flat = inputs[name].view(-1)
            low, high = middle_block(self.rng, flat.numel())
            fill_random_(flat[low:high], spec, self.values, self.generator)

    def verify(self, where: str) -> None:
        """Only audited targets are verified."""

    def settle(self) -> None:
        """Only audited targets have checks to read."""

    def profile(self, where: str) -> None:
        """Only audited targets are profiled."""


class ReferenceTarget(_Target):
    """The definition's PyTorch reference, timed under the same rotation as the kernels."""

    def __init__(
        self,
        definition: Definition,
        workload: Workload,
        sets: int,
        rng: random.Random,
        generator: torch.Generator,
    ) -> None:
        super().__init__(definition, workload, rng, generator)
        reference = load_reference(definition)
        keywords = axis_keywords(definition, definition.axis_values(workload))
        for _ in range(sets):
            inputs = self._fresh_inputs()
            self.sets.append(InputSet(inputs, {}, _reference_call(reference, inputs, keywords)))


class KernelTarget(_Target):
    """A kernel library; when `audited`, its timed calls are verified and profiled."""

    def __init__(
        self,
        host: Host,
        definition: Definition,
        workload: Workload,
        library: str,
        sets: int,
        rng: random.Random,
        generator: torch.Generator,
        *,
        audited: bool,
        checked_launches: list[str] | None,
    ) -> None:
        super().__init__(definition, workload, rng, generator)
        self.host = host
        self.audited = audited
        self.checked_launches = checked_launches
        self.verified_calls = 0
        self.timed_launches: list[str] | None = None
        self._pristine: dict[str, torch.Tensor] = {}
        self._pending: list[_PendingCheck] = []
        updated = definition.inplace_outputs()
        for _ in range(sets):
            inputs = self._fresh_inputs()
            fresh = allocate_outputs(definition, workload, "cuda")
            call = host.kernel_call(library, definition, workload, inputs, fresh)
            outputs = {name: inputs.get(updated.get(name, ""), fresh[name]) for name in fresh}
            self.sets.append(InputSet(inputs, outputs, call))

    def prepare(self, verify: bool) -> Callable[[], None]:
        call = super().prepare(verify)
        if verify:
            chosen = self.sets[self.current]
            self._pristine = {
                k: v.clone() for k, v in chosen.inputs.items() if isinstance(v, torch.Tensor)
            }
        return call

    def verify(self, where: str) -> None:
        """Check the call that just ran, without making the host wait: the outputs as its
        stream left them, against the reference for its inputs, and its inputs unchanged, all
        enqueued on the stream behind the call (outside the timed region) as counts that
        `settle` reads. Work the call left for later (another stream, a thread) lands after
        the snapshot, which then fails as unwritten or wrong."""
        chosen = self.sets[self.current]
        snapshot = {k: v.clone() for k, v in chosen.outputs.items()}
        updated = set(self.updated.values())
        given = {k: self._pristine.get(k, v) for k, v in chosen.inputs.items()}
        reference = run_reference(self.definition, given, self.values)
        watched = [k for k in self._pristine if k not in updated]
        counts = [changed_count(self._pristine[k], chosen.inputs[k]) for k in watched]
        elementwise = all(s.compare == "elementwise" for s in self.definition.outputs.values())
        if elementwise:
            counts += [
                output_fails(snapshot[name], reference[name], self.definition.tolerance_for(name))
                for name in self.definition.outputs
            ]
        self.verified_calls += 1
        self._pending.append(
            _PendingCheck(
                where=where,
                counts=torch.stack([c.to(torch.int64) for c in counts]) if counts else None,
                watched_inputs=watched,
                elementwise=elementwise,
                snapshot=snapshot,
                reference=reference,
                pristine=self._pristine,
                decoys=self.decoys,
            )
        )

    def settle(self) -> None:
        """Read every check enqueued since the last settle in one host sync; raise the
        AuditFailure of the first call that failed."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        with_counts = [p for p in pending if p.counts is not None]
        read = (
            torch.cat([p.counts for p in with_counts if p.counts is not None]).tolist()
            if with_counts
            else []
        )
        offset = 0
        for check in pending:
            size = 0 if check.counts is None else check.counts.numel()
            self._explain(check, read[offset : offset + size])
            offset += size

    def _explain(self, check: _PendingCheck, counts: list[int]) -> None:
        """Raise the audit a verified call failed, with what went wrong; return when it
        passed (outputs compared by sorting or by the indices they select are looked at
        here, closely)."""
        mutated = {k: n for k, n in zip(check.watched_inputs, counts, strict=False) if n}
        if mutated:
            detail = ", ".join(f"{k} ({n} elements)" for k, n in mutated.items())
            raise AuditFailure(
                Status.RUNTIME_ERROR,
                "input_mutation",
                f"{check.where}: the kernel wrote to its input {detail}; inputs must be unchanged",
            )
        if check.elementwise and not any(counts[len(check.watched_inputs) :]):
            return
        comparisons = [
            compare_by_spec(self.definition, name, check.snapshot, check.reference, check.pristine)
            for name in self.definition.outputs
        ]
        failing = [c for c in comparisons if not c.ok]
        if not failing:
            return
        names = ", ".join(c.name for c in failing)
        where = check.where
        if all(c.unwritten == c.total for c in failing):
            message = (
                f"{where} left its output {names} unwritten (every element still poison when "
                "its stream finished)"
            )
        elif check.decoys and all(
            not changed_elements(check.decoys[c.name], check.snapshot[c.name]) for c in failing
        ):
            message = (
                f"{where} left its output {names} unwritten: it still holds the values "
                "written there before the call (a kernel that computes only when its "
                "output looks poisoned)"
            )
        else:
            message = f"{where}: " + "; ".join(c.describe() for c in failing)
        raise AuditFailure(Status.INCORRECT_NUMERICAL, "timed_output", message)

    def profile(self, where: str) -> None:
        """One extra call, prepared like a timed one, watched by the profiler and verified (its
        check is read with the trial's others, at the trial's end: no extra host wait)."""
        call = self.prepare(verify=True)
        seen = self.host.watcher.watch(call)
        failure = launch_audit(seen, self.checked_launches, where)
        if failure is not None:
            raise failure
        self.timed_launches = seen.names
        self.verify(where)


@dataclass
class _PendingCheck:
    """A verified call's check, enqueued on the stream and not read yet."""

    where: str
    counts: torch.Tensor | None
    """Changed elements of each watched input, then (elementwise outputs) 1 per failing
    output, as int64 on the device."""
    watched_inputs: list[str]
    """Inputs that must be unchanged (not updated in place), in `counts` order."""
    elementwise: bool
    snapshot: dict[str, torch.Tensor]
    """The outputs as the call's stream left them."""
    reference: dict[str, torch.Tensor]
    pristine: dict[str, torch.Tensor]
    """The inputs as the call was given them."""
    decoys: dict[str, torch.Tensor]
    """The outputs as a decoy fill left them before the call (when one was used)."""


def _reference_call(
    reference: Callable[..., Any], inputs: dict[str, Any], keywords: dict[str, int]
) -> Callable[[], None]:
    args = list(inputs.values())

    def call() -> None:
        with torch.no_grad():
            reference(*args, **keywords)

    return call
