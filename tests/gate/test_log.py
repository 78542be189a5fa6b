"""The append-only gate log: verdicts are served back by what was asked, a torn line is made
again, and verdicts timed before the audits are not served to an audited run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from klineage.gate.build import BuildResult, BuildStatus
from klineage.gate.log import GateLog, verdict_key
from klineage.gate.result import GATE_PROTOCOL, GateVerdict
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO


def _verdict(fingerprint: str, protocol: str) -> GateVerdict:
    build = BuildResult(status=BuildStatus.COMPILE_ERROR, key="k" * 64, message="stand-in")
    return GateVerdict(
        problem="p", kernel="k.cu", fingerprint=fingerprint, build=build, protocol=protocol
    )


def _write(path: Path, records: list[tuple[str, GateVerdict]], torn: bool = False) -> None:
    lines = [
        json.dumps({"key": key, "verdict": json.loads(v.model_dump_json())}) for key, v in records
    ]
    if torn:
        lines.append('{"key": "torn", "verdict": {"prob')
    path.write_text("\n".join(lines) + "\n")


def test_verdicts_from_before_the_audits_are_not_served_to_an_audited_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    _write(path, [("old", _verdict("a", "")), ("new", _verdict("b", GATE_PROTOCOL))], torn=True)
    log = GateLog(path, None)  # type: ignore[arg-type]
    assert len(log) == 1 and log.stale == 1
    older = GateLog(path, None, accept_older=True)  # type: ignore[arg-type]
    assert len(older) == 2 and older.stale == 0
    # re-reading the older gate's results from a log the audited gate has grown since
    _write(path, [("same", _verdict("a", "")), ("same", _verdict("b", GATE_PROTOCOL))])
    before = GateLog(path, None, only_older=True)  # type: ignore[arg-type]
    assert before._verdicts["same"].fingerprint == "a"
    assert GateLog(path, None)._verdicts["same"].fingerprint == "b"  # type: ignore[arg-type]


class _CountingStandInGate:
    """STAND-IN at the GPU boundary: answers every question with a fresh verdict, counted."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, problem, kernel, *, workloads=None, time_it=True, against=None):  # type: ignore[no-untyped-def]
        self.runs += 1
        return _verdict(kernel.fingerprint, GATE_PROTOCOL)


def _problem_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "scale_rows"
    shutil.copytree(REPO / "tests" / "fixtures" / "problems" / "scale_rows", folder)
    return folder


def _edit_definition(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = folder / "definition.json"
    definition = json.loads(path.read_text())
    change(definition)
    path.write_text(json.dumps(definition, indent=2))


def test_a_verdict_judged_against_an_older_problem_is_judged_again(tmp_path: Path) -> None:
    folder, path = _problem_copy(tmp_path), tmp_path / "log.jsonl"
    kernel = KernelSource("__global__ void k(float* x) { x[0] = 1.f; }\n")
    gate = _CountingStandInGate()
    GateLog(path, gate).run(load_problem(folder), kernel)  # type: ignore[arg-type]
    assert gate.runs == 1

    # prose is not what the gate reads: editing it leaves the verdict standing
    _edit_definition(folder, lambda d: d.update(description="reworded", tags=["other"]))
    again = GateLog(path, gate)  # type: ignore[arg-type]
    again.run(load_problem(folder), kernel)
    assert (gate.runs, again.hits, again.outdated) == (1, 1, 0)

    # a declared floor changes what the gate judges: made again, and the new line is served
    _edit_definition(folder, lambda d: d.update(floor={"bytes": "rows*cols*4"}))
    changed = GateLog(path, gate)  # type: ignore[arg-type]
    changed.run(load_problem(folder), kernel)
    assert (gate.runs, changed.outdated, changed.runs) == (2, 1, 1)
    last = GateLog(path, gate)  # type: ignore[arg-type]
    last.run(load_problem(folder), kernel)
    assert (gate.runs, last.hits) == (2, 1)

    # a resized workload under the same uuid is judged again too
    workloads = folder / "workloads.jsonl"
    rows = [json.loads(line) for line in workloads.read_text().splitlines() if line.strip()]
    first_axes = rows[0]["axes"]
    first_axes[next(iter(first_axes))] += 1
    workloads.write_text("".join(json.dumps(r) + "\n" for r in rows))
    resized = GateLog(path, gate)  # type: ignore[arg-type]
    resized.run(load_problem(folder), kernel)
    assert (gate.runs, resized.outdated) == (3, 1)


def test_lines_logged_before_the_problem_field_are_served(tmp_path: Path) -> None:
    folder, path = _problem_copy(tmp_path), tmp_path / "log.jsonl"
    problem = load_problem(folder)
    kernel = KernelSource("__global__ void k(float* x) { x[0] = 1.f; }\n")
    key = verdict_key(kernel, problem.workloads, True, None)
    _write(path, [(key, _verdict(kernel.fingerprint, GATE_PROTOCOL))])
    gate = _CountingStandInGate()
    log = GateLog(path, gate)  # type: ignore[arg-type]
    log.run(problem, kernel)
    assert (gate.runs, log.hits, log.outdated) == (0, 1, 0)
    # served once, the line is logged again with its problem: a later edit is noticed
    _edit_definition(folder, lambda d: d.update(floor={"bytes": "rows*cols*4"}))
    edited = GateLog(path, gate)  # type: ignore[arg-type]
    edited.run(load_problem(folder), kernel)
    assert (gate.runs, edited.outdated) == (1, 1)


class _ProfilingStandInGate:
    """STAND-IN at the GPU boundary: the profile stage alone, counted; `skipped` says why a
    profile was not taken (no ncu, say)."""

    def __init__(self, skipped: str | None = None) -> None:
        self.taken = 0
        self.skipped = skipped

    def profile_kernel(self, problem, kernel, latency_ms=None):  # type: ignore[no-untyped-def]
        from klineage.gate.profile import Profile
        from tests.recorded_profiles import gelu_launch

        self.taken += 1
        if self.skipped:
            return Profile.skip(self.skipped)
        return Profile(workload_uuid="w", label="rows=64", launches=[gelu_launch()])


def test_a_profile_is_logged_once_and_served_on_resume_and_without_a_gpu(tmp_path: Path) -> None:
    from klineage.gate.log import LogOnlyGate, VerdictMissing

    problem = load_problem(_problem_copy(tmp_path))
    kernel = KernelSource("__global__ void k(float* y) { y[threadIdx.x] = 0.0f; }\n", name="k.cu")
    path = tmp_path / "gatelog" / "scale_rows.jsonl"
    gate = _ProfilingStandInGate()
    first = GateLog(path, gate)  # type: ignore[arg-type]
    taken = first.profile_kernel(problem, kernel)
    assert taken is not None and taken.profiled and gate.taken == 1
    assert first.profile_kernel(problem, kernel) == taken and gate.taken == 1
    assert first.profile_path == tmp_path / "gatelog" / "profiles" / "scale_rows.jsonl"
    # a resumed run, and one without a GPU, are served the logged profile
    assert GateLog(path, gate).profile_kernel(problem, kernel) == taken  # type: ignore[arg-type]
    assert gate.taken == 1
    offline = GateLog(path, LogOnlyGate(None, profiles=True))
    assert offline.profile_kernel(problem, kernel) == taken
    other = KernelSource(kernel.text + "\n// another kernel\n", name=kernel.name)
    with pytest.raises(VerdictMissing, match="no logged profile"):
        offline.profile_kernel(problem, other)
    # of a run that did not profile, a profile is absent, not missing
    assert GateLog(path, LogOnlyGate(None)).profile_kernel(problem, other) is None
    # a fresh run starts a fresh profile log
    GateLog(path, gate, resume=False)  # type: ignore[arg-type]
    assert not (tmp_path / "gatelog" / "profiles" / "scale_rows.jsonl").exists()


def test_a_skipped_profile_is_not_logged(tmp_path: Path) -> None:
    problem = load_problem(_problem_copy(tmp_path))
    kernel = KernelSource("__global__ void k(float* y) { y[threadIdx.x] = 0.0f; }\n", name="k.cu")
    gate = _ProfilingStandInGate(skipped="ncu not found")
    log = GateLog(tmp_path / "log.jsonl", gate)  # type: ignore[arg-type]
    skipped = log.profile_kernel(problem, kernel)
    assert skipped is not None and skipped.skipped == "ncu not found"
    assert not log.profile_path.exists()
    log.profile_kernel(problem, kernel)
    assert gate.taken == 2  # asked again: a skip is not a profile to serve
