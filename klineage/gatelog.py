"""An append-only log of gate verdicts, so a killed run resumes without repeating work.

Each line is one verdict keyed by what was asked: the kernel's fingerprint, the baseline's
fingerprint (paired timing), which workloads, and whether it was timed. A line is written
(and flushed) as soon as its verdict exists; a torn last line from a kill is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from klineage.gate.build import BuildResult
from klineage.gate.result import GateVerdict
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

    def __init__(self, path: str | Path, gate: GateLike, *, resume: bool = True) -> None:
        self.path = Path(path)
        self.gate = gate
        self.runs = 0
        """Gate runs made through this log (cache hits not counted)."""
        self.hits = 0
        self._verdicts: dict[str, GateVerdict] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.is_file():
            self._load()
        elif not resume and self.path.exists():
            self.path.unlink()

    def _load(self) -> None:
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                self._verdicts[record["key"]] = GateVerdict.model_validate(record["verdict"])
            except (json.JSONDecodeError, KeyError, ValueError):
                continue  # a line torn by a kill: that verdict is simply made again

    def __len__(self) -> int:
        return len(self._verdicts)

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        chosen = list(problem.workloads if workloads is None else workloads)
        key = verdict_key(kernel, chosen, time_it, against)
        if key in self._verdicts:
            self.hits += 1
            return self._verdicts[key]
        verdict = self.gate.run(problem, kernel, workloads=chosen, time_it=time_it, against=against)
        self.runs += 1
        self._verdicts[key] = verdict
        with self.path.open("a", encoding="utf-8") as handle:
            record = {"key": key, "verdict": json.loads(verdict.model_dump_json())}
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return verdict
