"""The Dask executor: gate runs on GPU workers, builds on any worker, the log stays here.

    with DaskExecutor("tcp://HOST:8786") as executor:     # a running cluster
        mine("expert_kernels/softmax", executor=executor)
    with DaskExecutor() as executor:                      # this host: one worker per GPU
        replay(["heldout/gelu"], executor=executor)       # (dask-cuda's, where installed)

A gate run is a task that needs the worker resource `GPU=1`, so a GPU worker runs one at a
time, on a gate it keeps warm between tasks (:mod:`klineage.executors.on_worker`). A build is
a task any worker may take; its cache entry comes back to this process's build cache, and
travels once to each GPU worker that gates the kernel, so no host compiles it twice.
Verdicts come back here and only here are they written to the gate log: one writer, so a
run killed at any point resumes with every finished gate run served from the log (only those
in flight at the kill are made again).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any

from klineage.executors.base import Executor, ExecutorError, TaskTally, require_distributed
from klineage.executors.on_worker import (
    DEVICE_GATE,
    PLUGIN_NAME,
    BuildConfig,
    GateRequest,
    GateSpec,
    TaskOutcome,
    WarmGates,
    build_task,
    close_warm_gates,
    gate_task,
)
from klineage.gate.build import RESULT_FILE, Builder, BuildResult
from klineage.gate.gate import GateSetupError
from klineage.gate.log import GateLike
from klineage.gate.pool import NO_GPU, visible_gpus
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem, Workload

GPU_RESOURCE = "GPU"
"""The worker resource a gate run needs, one unit per GPU (`dask worker --resources GPU=1`)."""

SCHEDULER_ADDRESS = re.compile(
    r"^(?:(?P<scheme>tcp|tls|ucx|ws|wss)://)?(?P<host>[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])"
    r":(?P<port>\d{1,5})$"
)

WORKER_START = (
    "start one worker per GPU: `CUDA_VISIBLE_DEVICES=N dask worker ADDRESS --nthreads 2 "
    "--resources GPU=1` (or `dask cuda worker ADDRESS --resources GPU=1`)"
)


def parse_scheduler(text: str) -> str:
    """`HOST:PORT` or `SCHEME://HOST:PORT` -> the address Dask connects to (tcp by default);
    ExecutorError with one line otherwise."""
    match = SCHEDULER_ADDRESS.match(text.strip())
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ExecutorError(
            f"--scheduler {text!r}: expected a Dask scheduler address such as tcp://HOST:8786"
        )
    return f"{match['scheme'] or 'tcp'}://{match['host']}:{match['port']}"


def _lost_cluster_errors() -> tuple[type[BaseException], ...]:
    """What a task's result raises when its worker or the whole cluster went away."""
    distributed = require_distributed()
    from distributed.client import ClosedClientError
    from distributed.comm.core import CommClosedError

    # not OSError at large: a worker's own OSError (a full disk) comes back as itself
    return (distributed.KilledWorker, CancelledError, ClosedClientError, CommClosedError)


class DaskExecutor(Executor):
    """Builds and gate runs as tasks on a Dask cluster (see the module's docstring)."""

    name = "dask"

    def __init__(
        self,
        scheduler: str | None = None,
        *,
        devices: Sequence[int] | None = None,
        client: Any = None,
        gate_factory: str = DEVICE_GATE,
        gate_options: Mapping[str, Any] | None = None,
        worker_cache_dir: str | Path | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """`scheduler`: a running cluster's address; None: start a one-worker-per-GPU cluster
        on this host's GPUs (`devices`, default all; dask-cuda's where installed); `client`:
        an open `distributed.Client` to use instead (its cluster stays the caller's). Gate runs use
        `gate_factory` (`module:callable`, importable on the workers) with `gate_options`;
        workers build into `worker_cache_dir` (None: each worker's own default)."""
        super().__init__()
        distributed = require_distributed()
        self.gate_factory = gate_factory
        self.gate_options = dict(gate_options or {})
        self.worker_cache_dir = worker_cache_dir
        self.connect_timeout_s = connect_timeout_s
        self._cluster: Any = None
        self._owns_client = client is None
        if client is not None:
            self.client = client
        elif scheduler is not None:
            address = parse_scheduler(scheduler)
            try:
                self.client = distributed.Client(
                    address, timeout=f"{connect_timeout_s}s", set_as_default=False
                )
            except (OSError, TimeoutError) as err:
                raise ExecutorError(
                    f"--scheduler {address}: no Dask scheduler answered within "
                    f"{connect_timeout_s:g} s ({type(err).__name__}); is `dask scheduler` "
                    "running there and reachable from here?"
                ) from None
        else:
            self._cluster = _local_gpu_cluster(devices)
            self.client = distributed.Client(self._cluster, set_as_default=False)
        self.client.register_plugin(WarmGates(), name=PLUGIN_NAME)

    @property
    def address(self) -> str:
        """The scheduler's address."""
        return str(self.client.scheduler.address)

    def gpu_workers(self) -> dict[str, float]:
        """Workers offering the GPU resource, with how many units each offers."""
        workers = self.client.scheduler_info().get("workers", {})
        return {
            address: float(info.get("resources", {}).get(GPU_RESOURCE, 0))
            for address, info in workers.items()
            if info.get("resources", {}).get(GPU_RESOURCE, 0) > 0
        }

    def _gpu_slots(self) -> list[str]:
        """The GPU workers' addresses, waiting up to the connect timeout for one to join."""
        deadline = time.monotonic() + self.connect_timeout_s
        while not (found := self.gpu_workers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not found:
            raise ExecutorError(
                f"the Dask cluster at {self.address} has no worker with the resource "
                f"{GPU_RESOURCE}; {WORKER_START}"
            )
        shared = [address for address, units in found.items() if units != 1]
        if shared:
            raise ExecutorError(
                f"worker {shared[0]} offers {GPU_RESOURCE}={found[shared[0]]:g}; klineage gates "
                f"on one GPU per worker: {WORKER_START}"
            )
        return sorted(found)

    @contextlib.contextmanager
    def gates(self, **gate_options: Any) -> Iterator[list[GateLike]]:
        spec = GateSpec.of(self.gate_factory, **{**self.gate_options, **gate_options})
        builder = ClusterBuilder(self.client, self.tally, self.worker_cache_dir)
        # one handle per GPU worker, as the local pool has one gate per GPU: a replayed
        # problem's verdicts are all timed on one device while that worker lives
        yield [
            RemoteGate(self.client, spec, builder, self.tally, worker)
            for worker in self._gpu_slots()
        ]

    def describe(self) -> str:
        workers = self.client.scheduler_info().get("workers", {})
        started = f" ({type(self._cluster).__name__} here)" if self._cluster is not None else ""
        return (
            f"dask: {self.address}{started}, {len(self.gpu_workers())} GPU of "
            f"{len(workers)} workers"
        )

    def close(self) -> None:
        """Stop the workers' warm gates, then the client and a cluster started here."""
        # best effort: after a lost cluster there is nothing left to stop, and whatever the
        # client raises then (it varies with where the loss caught it) must not hide why
        with contextlib.suppress(Exception):
            self.client.run(close_warm_gates)
        if self._owns_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _local_gpu_cluster(devices: Sequence[int] | None) -> Any:
    """One worker process per GPU of this host, each seeing only its own GPU (as device 0),
    offering `GPU=1`, with a second thread for builds: dask-cuda's LocalCUDACluster where it
    is installed, else the same shape from distributed alone."""
    if visible_gpus() == 0:
        raise GateSetupError(NO_GPU)
    indexes = list(devices) if devices is not None else list(range(visible_gpus()))
    chosen = visible_device_ids(indexes, os.environ.get("CUDA_VISIBLE_DEVICES"))
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return _per_gpu_cluster(chosen)
    return LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=",".join(chosen),
        threads_per_worker=2,
        resources={GPU_RESOURCE: 1},
        dashboard_address=":0",
    )


def visible_device_ids(indexes: Sequence[int], visible: str | None) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of GPU `indexes` as this process numbers them: where
    this process itself sees only some GPUs (`visible`, its CUDA_VISIBLE_DEVICES), index 0
    is the first of those, not the machine's GPU 0."""
    if not visible:
        return [str(index) for index in indexes]
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    missing = [index for index in indexes if not 0 <= index < len(entries)]
    if missing:
        raise ExecutorError(
            f"--devices {missing[0]}: this process sees {len(entries)} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={visible}), numbered from 0"
        )
    return [entries[index] for index in indexes]


def _per_gpu_cluster(devices: Sequence[str]) -> Any:
    """A SpecCluster of one Nanny per GPU, its worker started with CUDA_VISIBLE_DEVICES set to
    that GPU (without dask-cuda's memory management, which gate runs do not use)."""
    from distributed import Nanny, Scheduler, SpecCluster

    workers = {
        f"gpu{device}": {
            "cls": Nanny,
            "options": {
                "nthreads": 2,
                "resources": {GPU_RESOURCE: 1},
                "env": {"CUDA_VISIBLE_DEVICES": device},
            },
        }
        for device in devices
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, name="klineage-gpus")


class ClusterBuilder(Builder):
    """This process's builder, whose `build_many` compiles what the cache lacks on the
    cluster's workers (any worker) and installs their entries here."""

    def __init__(self, client: Any, tally: TaskTally, worker_cache_dir: str | Path | None) -> None:
        super().__init__()
        self.client = client
        self.tally = tally
        self.config = BuildConfig.of(self, worker_cache_dir)

    def build_many(
        self,
        sources: Sequence[tuple[str, str]] | Sequence[str],
        jobs: int | None = None,
        on_done: Callable[[int, BuildResult], None] | None = None,
        *,
        disassemble: bool = False,
    ) -> list[BuildResult]:
        """Builds not in this cache run on the cluster first; then every result is read here
        (cache hits), in input order."""
        items = [(s, "kernel.cu") if isinstance(s, str) else s for s in sources]
        missing: dict[str, tuple[str, str]] = {}
        for text, name in items:
            key = self.entry_key(text)
            if not (self.entry_dir(key) / RESULT_FILE).is_file():
                missing.setdefault(key, (text, name))
        distributed = require_distributed()
        try:
            futures = [
                self.client.submit(
                    build_task, self.config, text, name, disassemble, key=f"build-{key[:16]}"
                )
                for key, (text, name) in missing.items()
            ]
            for future in distributed.as_completed(futures, loop=self.client.loop):
                outcome: TaskOutcome = future.result()
                if outcome.entry is not None:
                    self.import_entry(outcome.key, outcome.entry)
                self.tally.record(outcome.worker, "build", outcome.seconds)
        except _lost_cluster_errors() as err:
            raise ExecutorError(f"a build task was lost with its worker: {err}") from err
        return super().build_many(items, jobs, on_done, disassemble=disassemble)


class RemoteGate:
    """A gate whose runs are tasks on one GPU worker of the cluster, or on another GPU
    worker once that one is gone (a loose restriction: Dask moves the task)."""

    def __init__(
        self, client: Any, spec: GateSpec, builder: ClusterBuilder, tally: TaskTally, worker: str
    ) -> None:
        self.client = client
        self.spec = spec
        self.builder = builder
        """Builds here and on the cluster (the gate log and the walk build through it)."""
        self.tally = tally
        self.worker = worker
        """The GPU worker this gate's runs go to while it lives."""
        self._delivered: set[str] = set()
        """Cache keys that worker already holds (sent with an earlier gate run there): a
        state's every attempt is timed against it, and it is carried once."""

    def build(self, kernel: KernelSource) -> BuildResult:
        """The kernel built (this process's cache, else nvcc here) and disassembled."""
        return self.builder.build(kernel.text, name=kernel.name, disassemble=True)

    def _entries(self, *kernels: KernelSource | None) -> dict[str, dict[str, bytes]]:
        entries = {}
        for kernel in kernels:
            if kernel is None:
                continue
            key = self.builder.entry_key(kernel.text)
            if key in self._delivered:
                continue
            files = self.builder.export_entry(key)
            if files is not None:
                entries[key] = files
        return entries

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        """The verdict, made on a GPU worker; ExecutorError if the cluster lost the task."""
        request = GateRequest(
            problem=problem,
            kernel=(kernel.text, kernel.name),
            against=(against.text, against.name) if against is not None else None,
            workloads=list(workloads) if workloads is not None else None,
            time_it=time_it,
            entries=self._entries(kernel, against),
        )
        started = time.perf_counter()
        try:
            future = self.client.submit(
                gate_task,
                self.spec,
                request,
                resources={GPU_RESOURCE: 1},
                workers=[self.worker],
                allow_other_workers=True,
                key=f"gate-{kernel.fingerprint[:10]}-{uuid.uuid4().hex[:8]}",
            )
            outcome: TaskOutcome = future.result()
        except _lost_cluster_errors() as err:
            raise ExecutorError(
                f"the gate run of {kernel.name} ({kernel.fingerprint[:8]}) was lost with the "
                f"cluster ({type(err).__name__}); verdicts made so far are in the gate log: run "
                "the same command again to resume"
            ) from err
        round_trip = time.perf_counter() - started
        if outcome.worker == self.worker:
            self._delivered.update(request.entries)
        self.tally.record(outcome.worker, "gate", outcome.seconds, round_trip - outcome.seconds)
        assert outcome.verdict is not None
        return outcome.verdict
