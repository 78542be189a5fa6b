"""The executor's counted gate passes the profile stage through: mining and replay find
`profile_kernel` and `add_profile` on the gate they hold, and before these were forwarded,
`mine --profile` on the local executor profiled nothing (found on the H200: every skill of a
`--profile` re-mine came back without counters)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from klineage.executors.base import TalliedGate, TaskTally
from klineage.gate.profile import Profile
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.mining.profiles import state_profile


class ProfilingStandIn:
    """A stand-in at the GPU boundary: a gate whose profile stage returns a fixed profile."""

    builder = None

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []

    def profile_kernel(
        self, problem: Any, kernel: Any, latency_ms: Any = None, *, workloads: Any = None
    ) -> Profile:
        self.asked.append((problem, kernel.text, latency_ms, workloads))
        return Profile(workload_uuid="w", label="n=4", launches=[], minimum_bytes=16)

    def add_profile(self, problem: Any, kernel: Any, verdict: GateVerdict) -> GateVerdict:
        return verdict.model_copy(update={"profile": self.profile_kernel(problem, kernel)})


class PlainStandIn:
    """A stand-in gate without a profile stage."""

    builder = None


def test_the_counted_gate_forwards_the_profile_stage() -> None:
    inner = ProfilingStandIn()
    gate = TalliedGate(inner, "gpu0", TaskTally())  # type: ignore[arg-type]

    class Kernel:
        text = "__global__ void k() {}"

    profile = gate.profile_kernel("problem", Kernel(), {"n=4": 0.01})  # type: ignore[arg-type]
    assert profile is not None and profile.label == "n=4"
    assert inner.asked == [("problem", Kernel.text, {"n=4": 0.01}, None)]


def test_a_gate_without_the_stage_profiles_nothing_through_the_counted_gate() -> None:
    gate = TalliedGate(PlainStandIn(), "gpu0", TaskTally())  # type: ignore[arg-type]
    assert gate.profile_kernel("problem", object()) is None  # type: ignore[arg-type]


def test_mining_reaches_the_profile_stage_through_the_counted_gate() -> None:
    inner = ProfilingStandIn()
    gate = TalliedGate(inner, "gpu0", TaskTally())  # type: ignore[arg-type]

    state = SimpleNamespace(profile=None, source="__global__ void k() {}", latency_ms=None)

    class Lineage:
        def __init__(self) -> None:
            self.kept: dict[str, Profile] = {}

        def state(self, fingerprint: str) -> SimpleNamespace:
            return state

        def set_profile(self, fingerprint: str, profile: Profile) -> None:
            self.kept[fingerprint] = profile

    class Problem:
        name = "p"

        def kernel_state(self, text: str) -> KernelSource:
            return KernelSource(text, name="p.cu")

    lineage = Lineage()
    profile = state_profile(Problem(), lineage, "abc", gate)  # type: ignore[arg-type]
    assert profile is not None and len(inner.asked) == 1
