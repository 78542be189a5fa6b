"""Energy per call, from the GPU's total energy counter (NVML).

Measured after the time stage's samples are all taken, never inside them: the timed region
and what it holds do not change. Each target is called back to back on one input set, with
no L2 flush and no refresh between calls, for at least `min_seconds`, the counter (millijoules
since the driver loaded) read before and after. Joules per call is the difference over the
calls: the board's whole energy while the call runs at a steady rate, static power included,
so compare kernels measured the same way (same problem, same device). The counter updates
every few milliseconds, so a window of a few hundred milliseconds keeps its step under 1%.

NVML comes from `nvidia-ml-py` (module `pynvml`), when installed; without it, or without a
driver, no energy is reported and the verdict says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class EnergyConfig(BaseModel):
    """How energy is measured."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    min_seconds: float = Field(default=0.3, gt=0)
    """The shortest window measured, per target and workload."""
    min_calls: int = Field(default=20, ge=1)
    """The fewest calls measured."""
    max_calls: int = Field(default=200_000, ge=1)
    """The most calls measured (a kernel of a few microseconds reaches the window first)."""


class Energy(BaseModel):
    """Energy of one target's calls on one workload."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    joules_per_call: float
    """Board energy over the window divided by the calls made in it."""
    calls: int
    """Calls made back to back in the window."""
    seconds: float
    """Wall time of the window."""
    counter: str = "nvml_total_energy"
    """Which counter was read."""

    @property
    def mean_watts(self) -> float:
        """The board's mean power over the window."""
        return self.joules_per_call * self.calls / self.seconds if self.seconds > 0 else 0.0


class EnergyCounter(Protocol):
    """A monotonic energy counter in millijoules."""

    def millijoules(self) -> int:
        """The counter's current value."""
        ...


class NvmlEnergyCounter:
    """NVML's total energy consumption of one GPU (millijoules since the driver loaded)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle

    def millijoules(self) -> int:
        """The counter now (NVML: millijoules since the driver loaded)."""
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))


def open_nvml_counter(uuid: str | None, pci_bus_id: str | None) -> NvmlEnergyCounter | str:
    """The energy counter of the GPU with this UUID (or PCI bus id), or why there is none.
    NVML sees every GPU whatever CUDA_VISIBLE_DEVICES says, so the device is found by
    identity, never by index."""
    try:
        import pynvml
    except ImportError:
        return "NVML is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"NVML did not start: {err}"
    lookups = []
    if uuid:
        name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        lookups.append((pynvml.nvmlDeviceGetHandleByUUID, name))
    if pci_bus_id:
        lookups.append((pynvml.nvmlDeviceGetHandleByPciBusId, pci_bus_id))
    if not lookups:
        return "the GPU's UUID and PCI bus id are unknown, so NVML cannot find it"
    failures = []
    for lookup, key in lookups:
        try:
            counter = NvmlEnergyCounter(pynvml, lookup(key))
            counter.millijoules()  # a device without the counter raises NVMLError_NotSupported
            return counter
        except pynvml.NVMLError as err:
            failures.append(f"{key}: {err}")
    return f"NVML's energy counter is not readable ({'; '.join(failures)})"


def calls_for(latency_ms: float | None, config: EnergyConfig) -> int:
    """Calls that fill the window at the timed latency (min_calls when it is unknown)."""
    if not latency_ms or latency_ms <= 0:
        return config.min_calls
    wanted = math.ceil(config.min_seconds / (latency_ms * 1e-3))
    return max(config.min_calls, min(config.max_calls, wanted))


def measure_energy(
    call: Callable[[], None],
    synchronize: Callable[[], None],
    counter: EnergyCounter,
    calls: int,
    config: EnergyConfig,
    clock: Callable[[], float] = time.perf_counter,
) -> Energy:
    """Call `call` back to back until at least `calls` calls and `min_seconds` (by `clock`,
    in seconds) have passed, synchronizing before the first counter read and before the last."""
    synchronize()
    start_mj = counter.millijoules()
    started = clock()
    made = 0
    while made < calls or (clock() - started < config.min_seconds and made < config.max_calls):
        call()
        made += 1
        if made % calls == 0:
            synchronize()  # keep the host's notion of time close to the device's
    synchronize()
    seconds = clock() - started
    joules = (counter.millijoules() - start_mj) / 1e3
    return Energy(joules_per_call=joules / made, calls=made, seconds=seconds)
