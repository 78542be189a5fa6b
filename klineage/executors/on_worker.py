"""What runs on a Dask worker: a build for another host's cache, or a gate run on the worker's
GPU through a gate kept warm between tasks (its GPU worker process stays started).

Imported by the worker when a task arrives; it must be importable there (klineage installed
with the `dask` extra on every worker).
"""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed import WorkerPlugin, get_worker

from klineage.gate.build import Builder
from klineage.gate.gate import Gate
from klineage.gate.log import GateLike
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem, Workload

PLUGIN_NAME = "klineage-warm-gates"

DEVICE_GATE = "klineage.executors.on_worker:device_gate"
"""The real gate: check and time on the worker's GPU."""


def device_gate(**gate_options: Any) -> Gate:
    """A gate on the worker's GPU: device 0 of what it sees (dask-cuda, or a worker started
    with CUDA_VISIBLE_DEVICES, shows each worker one GPU), building into the worker's cache."""
    return Gate(Builder(), **gate_options)


@dataclass(frozen=True)
class GateSpec:
    """How a worker makes its gate: a factory importable there, and its keyword options."""

    factory: str = DEVICE_GATE
    """`module:callable` returning a gate (the real one, or a labelled test stand-in)."""
    options: tuple[tuple[str, Any], ...] = ()
    """Keyword options for the factory, as sorted pairs (hashable: one warm gate per spec)."""

    @classmethod
    def of(cls, factory: str = DEVICE_GATE, **options: Any) -> GateSpec:
        """A spec from keyword options."""
        return cls(factory, tuple(sorted(options.items())))

    def make(self) -> GateLike:
        """A new gate, made by the factory."""
        module, _, attribute = self.factory.partition(":")
        made: GateLike = getattr(importlib.import_module(module), attribute)(**dict(self.options))
        return made


class WarmGates(WorkerPlugin):
    """A worker's gates, one per spec, made on first use and kept until the worker closes.
    The worker runs one gate task at a time (its resource `GPU=1`), so one gate suffices."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self._gates: dict[tuple[str, GateSpec], GateLike] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # sent to each worker empty: gates are made there

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def gate(self, worker: str, spec: GateSpec) -> GateLike:
        """The gate of `worker` (its address) for `spec`, made on first use. Keyed by worker
        too: workers in one process (threads, `processes=False`) may share this plugin."""
        with self._lock:
            if (worker, spec) not in self._gates:
                self._gates[worker, spec] = spec.make()
            return self._gates[worker, spec]

    def close(self) -> int:
        """Stop every gate's GPU worker process; how many were open."""
        with self._lock:
            gates, self._gates = list(self._gates.values()), {}
        for gate in gates:
            closer = getattr(gate, "close", None)
            if closer is not None:
                closer()
        return len(gates)

    def teardown(self, worker: Any) -> None:
        self.close()


def close_warm_gates(dask_worker: Any) -> int:
    """Run on every worker (`Client.run` passes it as `dask_worker`) when an executor
    closes: stop its gates' GPU worker processes, freeing the GPUs."""
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return plugin.close() if isinstance(plugin, WarmGates) else 0


@dataclass(frozen=True)
class GateRequest:
    """One gate run, as it travels to a GPU worker."""

    problem: Problem
    kernel: tuple[str, str]
    """The kernel's text and display name."""
    against: tuple[str, str] | None
    """The baseline's text and display name (paired timing), or None."""
    workloads: list[Workload] | None
    time_it: bool
    entries: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Build cache entries of the kernel and the baseline, by key: installed on the GPU
    worker's host so it runs no nvcc (hosts with one nvcc share keys)."""


@dataclass(frozen=True)
class TaskOutcome:
    """What a task sends back: its result, the worker that made it, its time inside."""

    worker: str
    seconds: float
    verdict: GateVerdict | None = None
    """A gate task's verdict."""
    key: str = ""
    """A build task's cache key."""
    entry: dict[str, bytes] | None = None
    """A build task's cache entry (None: not cached, a build that timed out)."""


def gate_task(spec: GateSpec, request: GateRequest) -> TaskOutcome:
    """Gate one kernel on this worker's warm gate."""
    worker = get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, WarmGates):
        raise RuntimeError(f"worker {worker.address}: klineage's {PLUGIN_NAME} plugin is missing")
    gate = plugin.gate(worker.address, spec)
    builder = getattr(gate, "builder", None)
    if isinstance(builder, Builder):
        for key, files in request.entries.items():
            builder.import_entry(key, files)
    kernel = KernelSource(*request.kernel)
    against = KernelSource(*request.against) if request.against is not None else None
    started = time.perf_counter()
    verdict = gate.run(
        request.problem,
        kernel,
        workloads=request.workloads,
        time_it=request.time_it,
        against=against,
    )
    return TaskOutcome(worker.address, time.perf_counter() - started, verdict=verdict)


@dataclass(frozen=True)
class BuildConfig:
    """The client's builder settings, so a worker's build lands under the client's key."""

    arch: str
    extra_flags: tuple[str, ...]
    nvcc: str
    timeout_s: float
    cache_dir: str | None = None
    """The worker's cache folder; None: its own default (`KLINEAGE_CACHE_DIR`)."""

    @classmethod
    def of(cls, builder: Builder, cache_dir: str | Path | None = None) -> BuildConfig:
        """The settings of `builder` (its cache folder is the client's, not sent)."""
        return cls(
            builder.arch,
            builder.extra_flags,
            builder.nvcc,
            builder.timeout_s,
            str(cache_dir) if cache_dir is not None else None,
        )

    def builder(self) -> Builder:
        """A builder with these settings on this worker."""
        cache = Path(self.cache_dir) if self.cache_dir is not None else None
        return Builder(cache, self.arch, self.extra_flags, self.nvcc, self.timeout_s)


def build_task(config: BuildConfig, text: str, name: str, disassemble: bool) -> TaskOutcome:
    """Build one kernel on this worker and send its cache entry back."""
    builder = config.builder()
    started = time.perf_counter()
    builder.build(text, name, disassemble=disassemble)
    key = builder.entry_key(text)
    entry = builder.export_entry(key)  # None for a build that timed out: never cached
    return TaskOutcome(get_worker().address, time.perf_counter() - started, key=key, entry=entry)
