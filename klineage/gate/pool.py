"""Several GPUs, one gate each: judge many kernels at once.

Builds run first, in parallel on the CPU (nvcc), then each GPU's worker takes the next kernel
from a shared queue. Verdicts come back in input order.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from klineage.gate.build import Builder
from klineage.gate.gate import Gate, GateSetupError
from klineage.gate.result import GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem

W = TypeVar("W")
R = TypeVar("R")


NO_GPU = (
    "no CUDA GPU is visible (or torch is missing, or is a CPU build): mining and replay check "
    "and time every kernel on a GPU. Without one, `klineage gate PROBLEM_DIR --build-only` "
    "compiles a kernel and `klineage mechanisms detect|remove|apply` rewrites it."
)


def visible_gpus() -> int:
    """How many CUDA GPUs this process can see (0 without torch or a GPU)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


class GatePool:
    """One Gate (and so one worker process) per GPU, sharing one build cache."""

    def __init__(
        self,
        devices: Sequence[int] | None = None,
        builder: Builder | None = None,
        **gate_options: Any,
    ) -> None:
        chosen = list(devices) if devices is not None else list(range(visible_gpus()))
        if not chosen:
            raise RuntimeError("no CUDA GPU is visible; the check and time stages need one")
        self.builder = builder or Builder()
        self.gates = [Gate(self.builder, device=d, **gate_options) for d in chosen]

    def __enter__(self) -> GatePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every gate's worker."""
        for gate in self.gates:
            gate.close()

    def run_many(
        self, problem: Problem, kernels: Sequence[KernelSource], **run_options: Any
    ) -> list[GateVerdict]:
        """Gate every kernel; same options as Gate.run. Verdicts in input order."""
        # compile everything up front so GPUs never wait on nvcc
        self.builder.build_many([(k.text, k.name) for k in kernels])
        return spread(
            self.gates,
            len(kernels),
            lambda index, gate: gate.run(problem, kernels[index], **run_options),
        )


def spread(workers: Sequence[W], count: int, work: Callable[[int, W], R]) -> list[R]:
    """`work(index, worker)` for every index below `count`, each worker (a gate, one per GPU)
    taking the next index when it is free; results in index order. The first failure stops
    the handing out of work and is raised in the caller's thread."""
    if len(workers) == 1:
        return [work(index, workers[0]) for index in range(count)]
    todo: queue.Queue[int] = queue.Queue()
    for index in range(count):
        todo.put(index)
    results: list[R | None] = [None] * count
    failures: list[BaseException] = []

    def serve(worker: W) -> None:
        while not failures:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = work(index, worker)
            except BaseException as err:  # raised in the caller's thread below
                failures.append(err)
                return

    threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return [r for r in results if r is not None]


@contextlib.contextmanager
def open_gates(devices: Sequence[int] | None = None, **gate_options: Any) -> Iterator[list[Gate]]:
    """One gate per GPU in `devices` (default: every visible GPU), sharing one build cache.
    Without a visible GPU it raises GateSetupError at once, before anything is started or
    written: mining and replay gate every kernel on one. `gate_options` go to each Gate."""
    if visible_gpus() == 0:
        raise GateSetupError(NO_GPU)
    chosen = list(devices) if devices is not None else list(range(visible_gpus()))
    builder = Builder()
    opened = [Gate(builder, device=d, **gate_options) for d in chosen]
    try:
        yield opened
    finally:
        for gate in opened:
            gate.close()


def parse_devices(text: str | None) -> list[int] | None:
    """`--devices 0,1` -> [0, 1]; None stays None (every visible GPU). ValueError otherwise."""
    if text is None:
        return None
    try:
        chosen = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--devices {text!r}: expected GPU indexes such as 0,1") from None
    if not chosen or any(d < 0 for d in chosen):
        raise ValueError(f"--devices {text!r}: expected GPU indexes such as 0,1")
    return chosen
