"""An append-only log of gate verdicts, so a killed run resumes without repeating work.

Each line is one verdict keyed by what was asked: the kernel's fingerprint, the baseline's
fingerprint (paired timing), which workloads, and whether it was timed. A line is written
(and flushed) as soon as its verdict exists; a torn last line from a kill is ignored.

With `share`, a verdict is also keyed by the machine code it judged (the device SASS and host
code fingerprints of the kernel and of its baseline, :mod:`klineage.gate.sass`): a kernel whose
source differs from an earlier one's but whose machine code does not gets that verdict
(recorded under its own key with `shared_from`), and the gate never times the same machine
code twice. Lines logged before machine keys existed are indexed once their kernels' sources
are known (:meth:`GateLog.learn_sources`, from the previous run's lineage).

Each line also records what the verdict was judged against (:func:`problem_fingerprint`: the
definition without its prose, the workloads asked about, the build options), and a line whose
problem has changed since is not served: a fixed reference, a declared floor or a resized
workload is judged again. Lines logged before this field existed are served as before, and
logged again with the problem they are first served for, so later edits are noticed.

Profiles taken apart from a verdict (:meth:`GateLog.profile_kernel`: the profile stage alone,
on a state replay goes on from) are logged too, in ``profiles/<log name>`` beside the log,
keyed by the kernel and the problem: a resumed run does not profile a state again, and a run
without a GPU (:class:`LogOnlyGate`) is served them as it is served verdicts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from klineage.gate.build import Builder, BuildResult
from klineage.gate.pool import spread
from klineage.gate.profile import Profile
from klineage.gate.result import GATE_PROTOCOL, GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import CompileOptions, Problem, Workload


class GateLike(Protocol):
    """What mining and replay need from a gate (the real Gate, or a labelled stand-in)."""

    def build(self, kernel: KernelSource) -> BuildResult:
        """Build `kernel` (no GPU needed)."""
        ...

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        """The verdict on `kernel` for `problem` (timed against `against` when given)."""
        ...


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


def problem_fingerprint(problem: Problem, workloads: Sequence[Workload]) -> str:
    """What a verdict was judged against, less the prose: editing a description or a tag
    leaves every logged verdict standing, editing anything the gate reads does not (the
    local headers kernel.cu includes among it: a kernel's text alone does not say what a
    macro of its header expands to)."""
    definition = _without_prose(json.loads(problem.definition.model_dump_json()))
    parts = [
        json.dumps(definition, sort_keys=True),
        *(w.model_dump_json() for w in workloads),
        problem.compile_options.model_dump_json(),
        *(f"{header.name}\n{header.text}" for header in problem.headers()),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _without_prose(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_prose(v) for k, v in value.items() if k not in ("description", "tags")}
    if isinstance(value, list):
        return [_without_prose(v) for v in value]
    return value


def machine_key(kernel: str, workloads: Sequence[str], time_it: bool, against: str | None) -> str:
    """`verdict_key` over machine-code fingerprints instead of source fingerprints."""
    parts = ["machine", kernel, against or "-", ",".join(workloads), str(time_it)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


class GateLog:
    """Verdicts on disk, read back on resume; `run` serves a cached verdict or gates anew."""

    def __init__(
        self,
        path: str | Path,
        gate: GateLike | None,
        *,
        resume: bool = True,
        share: bool = False,
        accept_older: bool = False,
        only_older: bool = False,
    ) -> None:
        """`gate` makes the verdicts the log lacks; without one the log is only read."""
        self.path = Path(path)
        self.gate = gate
        self.share = share
        """Serve a verdict made on the same machine code (see the module's docstring)."""
        self.accept_older = accept_older
        """Serve verdicts made before the gate's current protocol (to re-read old results
        without a GPU); a run that measures anew leaves this off."""
        self.only_older = only_older
        """Serve only verdicts made before the gate's current protocol: a log that goes on
        growing under the audited gate still re-reads, verdict for verdict, what the older
        gate decided (its results were made from those)."""
        self.stale = 0
        """Verdicts in the file that were not served because an older gate made them."""
        self.runs = 0
        """Gate runs made through this log (cache hits not counted)."""
        self.shared = 0
        """Verdicts served from another kernel's on the same machine code (not runs)."""
        self.outdated = 0
        """Logged verdicts not served because their problem changed since (judged again)."""
        self._problems: dict[str, str] = {}
        self._by_machine: dict[str, str] = {}
        self._unindexed: list[str] = []
        self._sources: dict[str, str] = {}
        self.hits = 0
        self._verdicts: dict[str, GateVerdict] = {}
        self._profiles: dict[str, Profile] = {}
        self.profile_path = self.path.parent / "profiles" / self.path.name
        """Where profiles taken apart from a verdict are logged."""
        self._lock = threading.Lock()
        self._made_ahead: set[str] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume and self.path.is_file():
            self._load()
        elif not resume and self.path.exists():
            self.path.unlink()
        if resume and self.profile_path.is_file():
            self._load_profiles()
        elif not resume and self.profile_path.exists():
            self.profile_path.unlink()

    def _load_profiles(self) -> None:
        for line in self.profile_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                self._profiles[record["key"]] = Profile.model_validate(record["profile"])
            except (json.JSONDecodeError, KeyError, ValueError):
                continue  # a line torn by a kill: that profile is simply taken again

    def _load(self) -> None:
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                verdict = GateVerdict.model_validate(record["verdict"])
            except (json.JSONDecodeError, KeyError, ValueError):
                continue  # a line torn by a kill: that verdict is simply made again
            if verdict.protocol != GATE_PROTOCOL and not (self.accept_older or self.only_older):
                self.stale += 1  # timed before the audits: made again by the audited gate
                continue
            if verdict.protocol == GATE_PROTOCOL and self.only_older:
                continue
            self._verdicts[record["key"]] = verdict
            if record.get("problem"):
                self._problems[record["key"]] = record["problem"]
            else:
                self._problems.pop(record["key"], None)
            if record.get("machine"):
                self._by_machine.setdefault(record["machine"], record["key"])
            else:
                self._unindexed.append(record["key"])

    def learn_sources(self, sources: dict[str, str]) -> None:
        """Kernel sources by fingerprint, so lines logged without a machine key get one."""
        self._sources.update(sources)

    def _builder(self, options: CompileOptions) -> Any:
        """The gate's builder under a problem's compile options (None without one)."""
        builder = getattr(self.gate, "builder", None)
        return builder.with_options(options) if builder is not None else None

    def _machine_of(self, kernel: KernelSource, options: CompileOptions) -> str | None:
        builder = self._builder(options)
        if builder is None:
            return None
        code = builder.build(kernel.text, kernel.name).machine_code
        return code.fingerprint if code is not None else None

    def _machine_key(
        self,
        kernel: KernelSource,
        workloads: Sequence[Workload],
        time_it: bool,
        against: KernelSource | None,
        options: CompileOptions,
    ) -> str | None:
        mine = self._machine_of(kernel, options)
        theirs = self._machine_of(against, options) if against is not None else None
        if mine is None or (against is not None and theirs is None):
            return None
        return machine_key(mine, [w.uuid for w in workloads], time_it, theirs)

    def _index_old_lines(self, options: CompileOptions) -> None:
        """Machine keys for logged verdicts whose kernels' sources are known (built once, in
        parallel; the builds are cached), under the compile options of the problem asked
        about (a verdict's key holds its workloads, so another problem's never matches)."""
        builder = self._builder(options)
        todo = [k for k in self._unindexed if self._indexable(self._verdicts[k])]
        if builder is None or not todo:
            return
        wanted = {
            fp
            for k in todo
            for fp in (self._verdicts[k].fingerprint, self._verdicts[k].baseline_fingerprint)
            if fp
        }
        builder.build_many([self._sources[fp] for fp in sorted(wanted)])
        for key in todo:
            verdict = self._verdicts[key]
            kernel = KernelSource(self._sources[verdict.fingerprint])
            against = (
                KernelSource(self._sources[verdict.baseline_fingerprint])
                if verdict.baseline_fingerprint
                else None
            )
            uuids = [w.workload_uuid for w in verdict.workloads]
            for time_it in (True, False):  # the key says which it was
                probe = _stand_in_workloads(uuids)
                if verdict_key(kernel, probe, time_it, against) == key:
                    mkey = self._machine_key(kernel, probe, time_it, against, options)
                    if mkey is not None:
                        self._by_machine.setdefault(mkey, key)
        self._unindexed = [k for k in self._unindexed if k not in set(todo)]

    def _indexable(self, verdict: GateVerdict) -> bool:
        needed = [verdict.fingerprint, verdict.baseline_fingerprint]
        return bool(verdict.workloads) and all(fp in self._sources for fp in needed if fp)

    def __len__(self) -> int:
        return len(self._verdicts)

    def reference_medians(self, problem: str) -> dict[str, float]:
        """Per workload label, the median of the PyTorch reference's latency over every
        verdict the log holds for `problem`. Each verdict times the reference in its own run,
        beside its kernel; a run the host slowed can time a launch-bound reference at several
        times its usual latency (a one-token layer norm at 0.12 ms against a median of 0.026 ms
        over 73 verdicts in the committed replay gate log, on the H200), which would then
        stand for the whole method in a report. The median over the log is one figure per
        workload for every method."""
        with self._lock:
            verdicts = [v for v in self._verdicts.values() if v.problem == problem]
        times: dict[str, list[float]] = {}
        for verdict in verdicts:
            for workload in verdict.workloads:
                if workload.reference_latency_ms:
                    times.setdefault(workload.label, []).append(workload.reference_latency_ms)
        return {label: statistics.median(values) for label, values in sorted(times.items())}

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
        judge = gate if gate is not None else self.gate
        judged_on = problem_fingerprint(problem, chosen)
        if key in self._verdicts and not self._current(key, judged_on):
            with self._lock:
                self.outdated += 1
                del self._verdicts[key]
        if key in self._verdicts:
            if key in self._made_ahead:  # made by run_many for this very call: not a hit
                self._made_ahead.discard(key)
            else:
                self.hits += 1
            if key not in self._problems:
                self._adopt(key, judged_on)
            return self._with_profile(key, problem, kernel, self._verdicts[key], judge)
        options = problem.build_options
        mkey = self._machine_key(kernel, chosen, time_it, against, options) if self.share else None
        if mkey is not None:
            with self._lock:
                self._index_old_lines(options)
                earlier = self._by_machine.get(mkey)
            if earlier is not None and self._current(earlier, judged_on):
                return self._shared(key, mkey, earlier, kernel, against, options, judged_on)
        judge = gate if gate is not None else self.gate
        if judge is None:
            raise RuntimeError(f"{self.path}: no verdict logged for {kernel.name} and no gate")
        verdict = judge.run(problem, kernel, workloads=chosen, time_it=time_it, against=against)
        record = {
            "key": key,
            "verdict": json.loads(verdict.model_dump_json()),
            "machine": mkey,
            "problem": judged_on,
        }
        with self._lock:  # several gates (one per GPU) may report at once
            self.runs += 1
            self._verdicts[key] = verdict
            self._problems[key] = judged_on
            if mkey is not None:
                self._by_machine.setdefault(mkey, key)
            self._append(record)
        return verdict

    def profile_kernel(
        self, problem: Problem, kernel: KernelSource, latency_ms: dict[str, float] | None = None
    ) -> Profile | None:
        """`kernel`'s profile (the gate's profile stage alone, on a kernel a verdict passed)
        from the log, or taken now by the log's gate and logged; None when the gate does not
        profile. A profile the gate skipped (no ncu, counters unreadable) is not logged."""
        key = profile_key(kernel, problem)
        if key in self._profiles:
            return self._profiles[key]
        take = getattr(self.gate, "profile_kernel", None)
        profile: Profile | None = take(problem, kernel, latency_ms) if take else None
        if profile is None or not profile.profiled:
            return profile
        record = {"key": key, "profile": json.loads(profile.model_dump_json())}
        with self._lock:
            self._profiles[key] = profile
            self.profile_path.parent.mkdir(parents=True, exist_ok=True)
            with self.profile_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        return profile

    def _adopt(self, key: str, judged_on: str) -> None:
        """A line logged before the problem field, served now: logged again with the problem
        it is served for, so an edit of that problem from here on is noticed."""
        record = {
            "key": key,
            "verdict": json.loads(self._verdicts[key].model_dump_json()),
            "problem": judged_on,
        }
        with self._lock:
            self._problems[key] = judged_on
            with contextlib.suppress(OSError):  # a log read where it cannot be written
                self._append(record)

    def _current(self, key: str, judged_on: str) -> bool:
        """Whether the logged verdict under `key` was judged against this problem (lines from
        before the field existed are taken to be)."""
        return self._problems.get(key, judged_on) == judged_on

    def _with_profile(
        self,
        key: str,
        problem: Problem,
        kernel: KernelSource,
        verdict: GateVerdict,
        judge: GateLike | None,
    ) -> GateVerdict:
        """A logged verdict made without the profile stage, served to a gate that profiles
        every verdict, gets its profile now (logged again under its key); the rest of it
        stands."""
        add_profile = getattr(judge, "add_profile", None)
        every = getattr(judge, "profiles_every_verdict", False)
        if add_profile is None or not every or verdict.profile is not None or not verdict.passed:
            return verdict
        profiled: GateVerdict = add_profile(problem, kernel, verdict)
        if profiled.profile is None:
            return verdict
        record: dict[str, Any] = {"key": key, "verdict": json.loads(profiled.model_dump_json())}
        if key in self._problems:
            record["problem"] = self._problems[key]
        with self._lock:
            self._verdicts[key] = profiled
            self._append(record)
        return profiled

    def _shared(
        self,
        key: str,
        mkey: str,
        earlier: str,
        kernel: KernelSource,
        against: KernelSource | None,
        options: CompileOptions,
        judged_on: str,
    ) -> GateVerdict:
        """The verdict of `earlier` (the same machine code), as this kernel's, logged."""
        source = self._verdicts[earlier]
        builder = self._builder(options)
        verdict = source.model_copy(
            deep=True,
            update={
                "kernel": kernel.name,
                "fingerprint": kernel.fingerprint,
                "baseline_fingerprint": against.fingerprint if against else None,
                "build": builder.build(kernel.text, kernel.name) if builder else source.build,
            },
        )
        record = {
            "key": key,
            "verdict": json.loads(verdict.model_dump_json()),
            "machine": mkey,
            "shared_from": earlier,
            "problem": judged_on,
        }
        with self._lock:
            self.shared += 1
            self._verdicts[key] = verdict
            self._problems[key] = judged_on
            self._append(record)
        return verdict

    def _append(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

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
        judged_on = problem_fingerprint(problem, chosen)
        pending: dict[str, tuple[KernelSource, KernelSource | None]] = {}
        for kernel, against in pairs:
            key = verdict_key(kernel, chosen, True, against)
            if key not in self._verdicts or not self._current(key, judged_on):
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


def profile_key(kernel: KernelSource, problem: Problem) -> str:
    """A profile's key: the kernel and what it was profiled against (the problem with every
    workload; the profile stage picks the largest)."""
    return f"{kernel.fingerprint}|{problem_fingerprint(problem, problem.workloads)}"


def _stand_in_workloads(uuids: Sequence[str]) -> list[Workload]:
    """Objects with only the `uuid` the keys read (the log holds no workload definitions)."""
    return [Workload.model_construct(uuid=u, axes={}, inputs={}) for u in uuids]


class VerdictMissing(RuntimeError):
    """An offline run needed a verdict (or a profile) the log does not hold (a GPU run)."""


class LogOnlyGate:
    """A gate that builds (real nvcc) but never judges: every verdict must come from the log,
    directly or shared by machine code. Mining a problem again on a machine without a GPU
    with it tells whether the new walk needs any gate run, and where."""

    def __init__(self, builder: Builder | None, *, profiles: bool = False) -> None:
        self.builder = builder
        """Builds kernels for machine-code keys; None: verdicts served by source only."""
        self.profiles = profiles
        """The logged run profiled (a profile the log lacks is then missing, not absent)."""
        self.missing: list[tuple[KernelSource, KernelSource | None]] = []
        """The (kernel, baseline) pairs a verdict was asked for and the log lacked."""

    def build(self, kernel: KernelSource) -> BuildResult:
        """The kernel built (cached) and disassembled; RuntimeError without a builder."""
        if self.builder is None:
            raise RuntimeError("this log-only gate has no builder")
        return self.builder.build(kernel.text, name=kernel.name, disassemble=True)

    def run(
        self,
        problem: Problem,
        kernel: KernelSource,
        *,
        workloads: Sequence[Workload] | None = None,
        time_it: bool = True,
        against: KernelSource | None = None,
    ) -> GateVerdict:
        """Never a verdict: records what was asked and raises :class:`VerdictMissing`."""
        self.missing.append((kernel, against))
        what = "timed against " + against.fingerprint[:8] if against else "checked"
        raise VerdictMissing(
            f"{problem.name}: no logged verdict for {kernel.fingerprint[:8]} ({what}, "
            f"{len(problem.workloads if workloads is None else workloads)} workloads), and "
            "none on the same machine code: this needs the GPU"
        )

    def profile_kernel(
        self, problem: Problem, kernel: KernelSource, latency_ms: dict[str, float] | None = None
    ) -> Profile | None:
        """Never a profile: None where the logged run did not profile; else raises
        :class:`VerdictMissing` (the log serves the profiles it holds before asking)."""
        if not self.profiles:
            return None
        raise VerdictMissing(
            f"{problem.name}: no logged profile for {kernel.fingerprint[:8]}: this needs the GPU"
        )
