"""An isolated GPU worker process, and the messages it understands.

Kernels run in a separate Python process (a fresh interpreter, never a fork), one per GPU. An
illegal address poisons a CUDA context for good, an endless loop never returns, a segfault
takes the process down: the parent survives all three. It kills the worker on a timeout,
notices a crash, and starts a new worker for the next request.

The child runs `python -m klineage.gate.worker_main FD RUNNER`, talking over the socket it
inherits as FD.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from klineage.gate.audit import AuditFailure, AuditName
from klineage.gate.energy import Energy, EnergyConfig
from klineage.gate.result import Correctness, Status, Timing
from klineage.gate.timing import TimingConfig
from klineage.problem import Definition, Workload

REFERENCE = "<reference>"
"""Timing target standing for the definition's PyTorch reference."""

DEFAULT_RUNNER = "klineage.gate.runner:DeviceRunner"
"""The object a worker serves requests with, as `module:Class`."""

START_TIMEOUT_S = 180.0
"""Time allowed for a worker to import torch and create its CUDA context."""


# ---- messages ---------------------------------------------------------------------------


@dataclass
class HelloReply:
    """Sent once by a worker that started; describes its device."""

    hardware: str
    libs: dict[str, str]
    l2_bytes: int
    copy_bytes_per_s: float = 0.0
    """Measured device-to-device copy rate (read plus write), for the latency floor."""
    audits_unavailable: dict[str, str] = field(default_factory=dict)
    """Audits this worker cannot make (no CUPTI, no runtime library), and why."""
    energy_unavailable: str = ""
    """Why this worker cannot read the GPU's energy counter; empty when it can."""


@dataclass
class StartupFailure:
    """Sent instead of a hello by a worker whose runner could not start (no GPU, ...)."""

    message: str


@dataclass
class CheckRequest:
    """Check one kernel on one workload, once per seed."""

    library: str
    definition: Definition
    workload: Workload
    seeds: list[int]


@dataclass
class CheckReply:
    status: Status
    message: str
    correctness: Correctness | None
    audit: AuditName | None = None
    """The audit that failed, when one did."""
    launches: list[str] | None = None
    """GPU work the first checked call made (kernels, copies, memsets), when profiled."""


@dataclass
class TimeRequest:
    """Time several targets (library paths or REFERENCE) interleaved on one input set."""

    targets: list[str]
    """The first is the candidate (audited); a baseline library and REFERENCE may follow."""
    definition: Definition
    workload: Workload
    seed: int
    config: TimingConfig
    checked_launches: list[str] | None = None
    """What a checked call of the candidate launched; profiled timed calls must match it."""
    energy: EnergyConfig | None = None
    """Measure each target's energy per call after the samples (None: do not)."""


@dataclass
class TimeReply:
    timings: list[Timing]
    """One per target, in request order; empty when an audit failed."""
    failure: AuditFailure | None = None
    """The audit a timed or profiled call failed."""
    input_sets: int = 0
    """Input sets each target rotated over."""
    verified_calls: int = 0
    """Timed and profiled calls of the candidate whose outputs were verified."""
    timed_launches: list[str] | None = None
    """GPU work of a profiled timed call of the candidate."""
    energy: list[Energy | None] = field(default_factory=list)
    """Energy per call of each target, in request order, when asked and readable."""


@dataclass
class ErrorReply:
    """A request failed inside the worker."""

    kind: Literal["kernel", "reference"]
    message: str
    poisoned: bool
    """The CUDA context is unusable; the worker exits after sending this."""


@dataclass
class DebugRequest:
    """Test hook: make the worker misbehave (crash, hang) to exercise the parent."""

    action: Literal["crash", "hang", "echo"]
    payload: Any = None


Request = CheckRequest | TimeRequest | DebugRequest


def ends_worker(reply: Any) -> bool:
    """Whether the worker exits after sending this reply: a poisoned CUDA context, or a kernel
    caught cheating the timer (it may have left threads or streams running that would touch
    the next kernel's buffers)."""
    if isinstance(reply, ErrorReply):
        return reply.poisoned
    if isinstance(reply, TimeReply):
        return reply.failure is not None
    if isinstance(reply, CheckReply):
        return reply.audit == "other_stream"
    return False


# ---- parent side --------------------------------------------------------------------------


class WorkerTimeout(Exception):
    """The worker did not answer in time; it has been killed."""


class WorkerCrashed(Exception):
    """The worker process died; `log_tail` holds the end of its output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class GpuWorker:
    """Parent-side handle of one worker bound to one GPU. Restarts it on demand."""

    device: int = 0
    runner: str = DEFAULT_RUNNER
    """`module:Class` the worker serves requests with (tests swap in a CPU stand-in)."""
    start_timeout_s: float = START_TIMEOUT_S
    starts: int = 0
    """How many processes this handle has started (1 + restarts)."""
    hello: HelloReply | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _conn: Connection | None = field(default=None, repr=False)
    _log: Any = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> HelloReply:
        if self.alive:
            assert self.hello is not None
            return self.hello
        self._discard()
        parent_sock, child_sock = socket.socketpair()
        self._log = tempfile.TemporaryFile(prefix="klineage-worker-")  # noqa: SIM115 (kept open)
        child_fd = child_sock.fileno()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "klineage.gate.worker_main", str(child_fd), self.runner],
            pass_fds=(child_fd,),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=worker_env(self.device),
            start_new_session=True,  # so a kill takes any children the kernel spawned too
        )
        child_sock.close()
        self._conn = Connection(parent_sock.detach())
        self.starts += 1
        reply = self._receive(self.start_timeout_s, what="start")
        if isinstance(reply, StartupFailure):
            self._reap()
            raise WorkerCrashed(f"the GPU worker could not start: {reply.message}", "")
        if not isinstance(reply, HelloReply):
            self.kill()
            raise WorkerCrashed(f"worker sent {reply!r} instead of its hello", self.log_tail())
        self.hello = reply
        return reply

    def request(self, message: Request, timeout_s: float) -> Any:
        """Send one request and wait for its reply; kill the worker if it takes too long."""
        self.start()
        assert self._conn is not None
        try:
            self._conn.send(message)
        except OSError as err:
            raise self._crashed(f"could not send to the worker ({err})") from err
        reply = self._receive(timeout_s, what="reply")
        if ends_worker(reply):
            self._reap()
        return reply

    def _receive(self, timeout_s: float, what: str) -> Any:
        assert self._conn is not None
        try:
            ready = self._conn.poll(timeout_s)
        except OSError:
            ready = True  # the socket broke: recv below reports the crash
        if not ready:
            self.kill()
            raise WorkerTimeout(f"no {what} from the GPU worker within {timeout_s:g} s")
        try:
            return self._conn.recv()
        except (EOFError, OSError) as err:
            raise self._crashed(f"the GPU worker died before its {what}") from err

    def _crashed(self, message: str) -> WorkerCrashed:
        code = self._reap()
        tail = self.log_tail()
        return WorkerCrashed(f"{message} ({_describe_exit(code)})", tail)

    def _reap(self, wait_s: float = 10.0) -> int | None:
        """Wait briefly for a worker that is exiting by itself, then make sure it is gone."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return self.kill()

    def kill(self) -> int | None:
        """Hard-kill the worker's whole process group."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        return self._proc.wait()

    def log_tail(self, limit: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - limit))
        tail: bytes = self._log.read()
        return tail.decode("utf-8", "replace")

    def _discard(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._log is not None:
            self._log.close()
        self._proc = self._conn = self._log = None
        self.hello = None

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive and self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.wait(10)  # type: ignore[union-attr]
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        self._discard()


def worker_env(device: int) -> dict[str, str]:
    """The environment of a process that runs kernels on GPU `device`: only that GPU visible,
    this package importable, output unbuffered."""
    env = dict(os.environ)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        # device indexes the parent's visible list, so a user's own mask keeps working
        choices = [v.strip() for v in visible.split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = choices[device] if device < len(choices) else str(device)
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


# ---- child side ---------------------------------------------------------------------------


def _load_runner(spec: str) -> Any:
    module_name, _, class_name = spec.partition(":")
    module = importlib.import_module(module_name)  # imports torch: only in the worker
    return getattr(module, class_name)()


def serve(fd: int, runner_spec: str) -> None:
    """The worker's main loop (run by `python -m klineage.gate.worker_main`)."""
    conn = Connection(fd)
    try:
        runner = _load_runner(runner_spec)
    except Exception as err:  # tell the parent why, in one line, instead of a traceback
        conn.send(StartupFailure(f"{type(err).__name__}: {err}"))
        return
    conn.send(runner.hello())
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        if isinstance(message, DebugRequest):
            _debug(conn, message)
            continue
        reply = runner.handle(message)
        conn.send(reply)
        if ends_worker(reply):
            # the context or the process cannot be trusted again: exit so the parent starts a
            # fresh worker
            os._exit(3)


def _debug(conn: Connection, message: DebugRequest) -> None:
    if message.action == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif message.action == "hang":
        while True:
            time.sleep(1)
    else:
        conn.send(message.payload)
