"""Energy per call on the CPU: the window arithmetic over a stand-in counter (the NVML
boundary), and the clean absence of NVML."""

from __future__ import annotations

import importlib.util

import pytest

from klineage.gate.energy import (
    Energy,
    EnergyConfig,
    calls_for,
    measure_energy,
    open_nvml_counter,
)


class StepClock:
    """A clock that moves only when told to: each stand-in kernel call takes `step` seconds,
    so the window's arithmetic is checked without reading the host's clock."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self) -> None:
        self.now += self.step


class WattMeterStandIn:
    """STAND-IN for NVML's energy counter (a test double at the GPU boundary): a board drawing
    a constant `watts` over the time `clock` says has passed, in millijoules as NVML reports."""

    def __init__(self, watts: float, clock: StepClock) -> None:
        self.watts = watts
        self.clock = clock

    def millijoules(self) -> int:
        return int(self.clock() * self.watts * 1e3)


def test_calls_fill_the_window_at_the_timed_latency() -> None:
    config = EnergyConfig(min_seconds=0.3, min_calls=20, max_calls=200_000)
    assert calls_for(0.01, config) == 30_000  # 10 us a call: 0.3 s is 30,000 calls
    assert calls_for(100.0, config) == 20  # a slow kernel still gets min_calls
    assert calls_for(1e-6, config) == 200_000  # capped
    assert calls_for(None, config) == 20


def test_energy_per_call_is_the_window_energy_over_the_calls() -> None:
    config = EnergyConfig(min_seconds=0.05, min_calls=10)
    made: list[int] = []
    synchronized: list[int] = []
    clock = StepClock(0.001)  # a 1 ms kernel

    def call() -> None:
        made.append(1)
        clock.advance()

    meter = WattMeterStandIn(300.0, clock)
    energy = measure_energy(
        call, lambda: synchronized.append(len(made)), meter, 10, config, clock=clock
    )
    assert energy.calls == len(made) >= 10
    assert energy.seconds >= 0.05  # the window is at least min_seconds, however few calls
    assert synchronized[0] == 0 and synchronized[-1] == energy.calls  # before and after
    # 300 W for the window, spread over its calls; the counter's 1 mJ steps are the error
    assert energy.mean_watts == pytest.approx(300.0, rel=0.05)
    assert energy.joules_per_call == pytest.approx(300.0 * energy.seconds / energy.calls, rel=0.05)


def test_energy_round_trips_as_json() -> None:
    energy = Energy(joules_per_call=0.0123, calls=40, seconds=0.5)
    again = Energy.model_validate_json(energy.model_dump_json())
    assert again == energy and again.counter == "nvml_total_energy"


@pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is not None, reason="NVML's bindings are installed here"
)
def test_without_nvml_the_counter_says_why() -> None:
    reason = open_nvml_counter("GPU-0000", None)
    assert isinstance(reason, str) and "nvidia-ml-py" in reason


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="needs nvidia-ml-py")
def test_a_device_nvml_does_not_know_is_named() -> None:
    reason = open_nvml_counter(None, None)
    assert isinstance(reason, str)
