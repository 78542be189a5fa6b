"""An append-only log of gate verdicts, so a killed run resumes without repeating work.

Each line is one verdict keyed by what was asked: the kernel's fingerprint, the baseline's
fingerprint (paired timing), which workloads, and whether it was timed. A line is written
(and flushed) as soon as its verdict exists; a torn last line from a kill is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from klineage.gate.build import BuildResult
from klineage.gate.pool import spread
from klineage.gate.result import GATE_PROTOCOL, GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import Problem, Workload


class GateLike(Protocol):
    """What mining and replay need from a gate (the real Gate, or a labelled stand-in)."""

    def build(self, kernel: KernelSource) -> BuildResult: ...

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict: ...


def verdict_key(
    kernel: KernelSource,
    workloads: Sequence[Workload],
    time_it: bool,
    against: KernelSource | None,
) -> str:
    """What a verdict answers: kernel, baseline, workload set, timed or not."""
    parts = [
        kernel.fingerprint,
        against.fingerprint if against else "-",
        ",".join(w.uuid for w in workloads),
        "timed" if time_it else "checked",
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


class GateLog:
    """Verdicts on disk, read back on resume; `run` serves a cached verdict or gates anew."""

    def __init__(
        self,
        path: str | Path,
        gate: GateLike | None,
        *,
        resume: bool = True,
        accept_older: bool = False,
    ) -> None:
        """`gate` makes the verdicts the log lacks; without one the log is only read."""
        self.path = Path(path)
        self.gate = gate
        self.accept_older = accept_older
        """Serve verdicts made before the gate's current protocol (to re-read old results
        without a GPU); a run that measures anew leaves this off."""
        self.stale = 0
        """Verdicts in the file that were not served because an older gate made them."""
        self.runs = 0
        """Gate runs made through this log (cache hits not counted)."""
        self.hits = 0
        self._verdicts: dict[str, GateVerdict] = {}
        self._lock = threading.Lock()
        self._made_ahead: set[str] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.is_file():
            self._load()
        elif not resume and self.path.exists():
            self.path.unlink()

    def _load(self) -> None:
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                verdict = GateVerdict.model_validate(record["verdict"])
            except (json.JSONDecodeError, KeyError, ValueError):
                continue  # a line torn by a kill: that verdict is simply made again
            if verdict.protocol != GATE_PROTOCOL and not self.accept_older:
                self.stale += 1  # timed before the audits: made again by the audited gate
                continue
            self._verdicts[record["key"]] = verdict

    def __len__(self) -> int:
        return len(self._verdicts)

    def logged(
        self,
        kernel: KernelSource,
        workloads: Sequence[Workload],
        *,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict | None:
        """The verdict the log holds for this question, or None; never gates."""
        return self._verdicts.get(verdict_key(kernel, list(workloads), time_it, against))

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
        gate: GateLike | None = None,
    ) -> GateVerdict:
        """The verdict from the log, or made now by `gate` (default: this log's gate)."""
        chosen = list(problem.workloads if workloads is None else workloads)
        key = verdict_key(kernel, chosen, time_it, against)
        if key in self._verdicts:
            if key in self._made_ahead:  # made by run_many for this very call: not a hit
                self._made_ahead.discard(key)
            else:
                self.hits += 1
            return self._verdicts[key]
        judge = gate if gate is not None else self.gate
        if judge is None:
            raise RuntimeError(f"{self.path}: no verdict logged for {kernel.name} and no gate")
        verdict = judge.run(problem, kernel, workloads=chosen, time_it=time_it, against=against)
        record = {"key": key, "verdict": json.loads(verdict.model_dump_json())}
        with self._lock:  # several gates (one per GPU) may report at once
            self.runs += 1
            self._verdicts[key] = verdict
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        return verdict

    def run_many(
        self,
        problem: Problem,
        pairs: Sequence[tuple[KernelSource, KernelSource | None]],
        gates: Sequence[GateLike],
    ) -> None:
        """Make the verdicts of `(kernel, against)` pairs not yet in the log, spread over
        `gates` (one per GPU: each paired timing runs whole on one device). `run` then serves
        them from the log."""
        chosen = list(problem.workloads)
        pending: dict[str, tuple[KernelSource, KernelSource | None]] = {}
        for kernel, against in pairs:
            key = verdict_key(kernel, chosen, True, against)
            if key not in self._verdicts:
                pending.setdefault(key, (kernel, against))
        todo = list(pending.values())
        if not todo:
            return
        spread(
            list(gates),
            len(todo),
            lambda i, gate: self.run(problem, todo[i][0], against=todo[i][1], gate=gate),
        )
        self._made_ahead.update(pending)
