"""The gate's optional profile stage: one call of the kernel on one workload under Nsight
Compute, read back as counters per launch and a bottleneck class.

It runs after the time stage, in a process of its own started under `ncu` (the GPU worker
keeps its CUPTI watcher, which ncu would conflict with). Results are cached by build (the
build's cache key: source, flags, nvcc, arch), workload and metric list, so the states a
mining walk or a replay revisits are profiled once. Skipped cleanly, with the reason in the
verdict, where ncu is missing, cannot read the counters, or the call fails.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from klineage.gate import ncu
from klineage.gate.bottleneck import MachinePeaks, classify, peaks_for
from klineage.gate.build import BuildResult, default_cache_dir
from klineage.gate.profile import LaunchProfile, Profile, ProfileRequest, launch_profile
from klineage.gate.worker import worker_env
from klineage.problem import Definition, Workload

SKIP_REASON_KEPT = 400
"""Characters of a failed call's message kept as the reason the stage was skipped."""


class ProfileConfig(BaseModel):
    """How the profile stage runs."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    timeout_s: float = Field(default=180.0, gt=0)
    """Wall-clock limit of one ncu run (it replays each kernel once per metric pass)."""
    metrics: tuple[str, ...] = ncu.PROFILE_METRICS
    """The metrics collected per launch."""
    cache_dir: Path | None = None
    """Where profiles are cached (default: next to the build cache, `profile/`)."""
    peaks_file: Path | None = None
    """Measured device peaks (JSON, klineage.gate.bottleneck.MachinePeaks); default: the
    datasheet's, with DRAM bandwidth measured by the worker."""
    every_verdict: bool = True
    """Profile every passing verdict (`klineage gate --profile`); False: only the kernels a
    caller asks for (`Gate.profile_kernel`), as mining (the states its skills compare) and
    replay (the states it goes on from) do, so rejected and passed-over kernels cost no ncu
    run."""


def minimum_traffic(definition: Definition, workload: Workload) -> tuple[int, float]:
    """(bytes, FLOPs) the workload needs at least: the definition's declared floor, else its
    inputs and outputs each moved once (and no declared FLOPs)."""
    declared_bytes, declared_flops = definition.floor_values(workload)
    if declared_bytes is None:
        values = definition.axis_values(workload)
        own = [s for s in definition.outputs.values() if s.inplace_of is None]
        specs = [*definition.inputs.values(), *own]
        declared_bytes = sum(definition.nbytes(s, values) for s in specs)
    return declared_bytes, float(declared_flops or 0.0)


def profiled_workload(definition: Definition, workloads: Sequence[Workload]) -> Workload:
    """The workload the stage profiles: the one that must move the most bytes (the steadiest
    picture of the kernel), the first of equals."""
    if not workloads:
        raise ValueError("no workload to profile")
    return max(workloads, key=lambda w: minimum_traffic(definition, w)[0])


def operand_class(definition: Definition) -> str:
    """The tensor-core peak a kernel on these inputs could reach: half, float8 or float32."""
    dtypes = {s.dtype for s in definition.inputs.values() if not s.is_scalar}
    if any("float8" in d for d in dtypes):
        return "float8"
    if dtypes & {"float16", "bfloat16"}:
        return "half"
    return "float32"


class _CachedLaunches(BaseModel):
    """What the profile cache keeps of one ncu run (the class is drawn again from it)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    launches: list[LaunchProfile]
    """The profiled launches."""
    tool: str
    """ncu's version line."""
    seconds: float
    """Wall time of the ncu run."""


class Profiler:
    """Runs the profile stage; one per gate."""

    def __init__(
        self,
        config: ProfileConfig | None = None,
        *,
        device: int = 0,
        build_cache: Path | None = None,
    ) -> None:
        """`build_cache`: the build cache's folder; profiles are kept beside it (`profile/`)
        unless the config names a folder."""
        self.config = config or ProfileConfig()
        self.device = device
        beside = (build_cache or default_cache_dir()).parent / "profile"
        self.cache_dir = self.config.cache_dir or beside
        self._tool: str | None = None

    def tool_version(self, executable: str) -> str:
        """ncu's version line (asked once)."""
        if self._tool is None:
            try:
                out = subprocess.run(
                    [executable, "--version"], capture_output=True, text=True, timeout=60
                ).stdout
            except (OSError, subprocess.SubprocessError) as err:
                out = f"unknown ({err})"
            lines = [line.strip() for line in out.splitlines() if line.strip()]
            self._tool = lines[-1] if lines else "unknown"
        return self._tool

    def cache_key(self, build: BuildResult, workload: Workload, tool: str) -> str:
        """The build, the workload, the metrics and the profiler's version."""
        parts = [build.key, workload.uuid, ",".join(self.config.metrics), tool]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]

    def profile(
        self,
        build: BuildResult,
        definition: Definition,
        workloads: Sequence[Workload],
        *,
        seed: int = 0,
        latency_ms: dict[str, float] | None = None,
        hardware: str = "",
        copy_bytes_per_s: float = 0.0,
    ) -> Profile:
        """Profile `build`'s kernel on the largest of `workloads`; `latency_ms` (label ->
        the time stage's latency) and the device (`hardware`, its measured copy rate) feed
        the bottleneck class."""
        workload = profiled_workload(definition, workloads)
        label = workload.label
        executable = ncu.find_ncu()
        if executable is None:
            return Profile.skip(
                f"ncu was not found (on PATH, or named by ${ncu.NCU_ENV})", label, workload.uuid
            )
        if build.library is None:
            return Profile.skip("the build made no library to run", label, workload.uuid)
        tool = self.tool_version(executable)
        key = self.cache_key(build, workload, tool)
        cached = self._cached(key)
        if cached is None:
            launches_or_reason = self._run(
                executable, str(build.library), definition, workload, seed
            )
            if isinstance(launches_or_reason, str):
                return Profile.skip(launches_or_reason, label, workload.uuid)
            cached = launches_or_reason.model_copy(update={"tool": tool})
            self._store(key, cached)
            fresh = True
        else:
            fresh = False
        minimum_bytes, minimum_flops = minimum_traffic(definition, workload)
        profile = Profile(
            workload_uuid=workload.uuid,
            label=label,
            launches=cached.launches,
            minimum_bytes=minimum_bytes,
            minimum_flops=minimum_flops,
            seconds=cached.seconds if fresh else 0.0,
            cached=not fresh,
            tool=cached.tool,
        )
        profile.bottleneck = classify(
            profile,
            latency_ms=(latency_ms or {}).get(label),
            peaks=self._peaks(hardware, copy_bytes_per_s),
            operand_class=operand_class(definition),
        )
        return profile

    def _peaks(self, hardware: str, copy_bytes_per_s: float) -> MachinePeaks | None:
        if self.config.peaks_file is not None:
            return MachinePeaks.load(self.config.peaks_file)
        peaks = peaks_for(hardware)
        return peaks.with_measured_bandwidth(copy_bytes_per_s) if peaks else None

    def _run(
        self,
        executable: str,
        library: str,
        definition: Definition,
        workload: Workload,
        seed: int,
    ) -> _CachedLaunches | str:
        """ncu over one profiled call; the launches, or why there are none."""
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="klineage-profile-") as folder:
            request_path = Path(folder) / "request.pkl"
            log_path = Path(folder) / "ncu.csv"
            with request_path.open("wb") as handle:
                pickle.dump(ProfileRequest(library, definition, workload, seed), handle)
            target = [sys.executable, "-m", "klineage.gate.profile_main", str(request_path)]
            command = ncu.ncu_command(executable, target, str(log_path), self.config.metrics)
            try:
                done = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    timeout=self.config.timeout_s,
                    env=worker_env(self.device),
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                return f"ncu did not finish within {self.config.timeout_s:g} s"
            except OSError as err:
                return f"ncu could not be started: {err}"
            output = log_path.read_text(errors="replace") if log_path.exists() else ""
        messages = f"{output}\n{done.stdout}\n{done.stderr}"
        if done.returncode == 3 or "the profiled call failed" in done.stderr:
            failed = [line for line in done.stderr.splitlines() if "profiled call failed" in line]
            return failed[-1][:SKIP_REASON_KEPT] if failed else "the profiled call failed"
        # the table goes to --log-file; an ncu that printed it to stdout instead is read there
        table = output if ncu.has_table(output) else done.stdout
        try:
            raw = ncu.parse_raw_csv(table)
        except ncu.NcuOutputError:
            return ncu.failure_reason(messages)
        if not raw:
            return ncu.failure_reason(messages)
        return _CachedLaunches(
            launches=[launch_profile(launch) for launch in raw],
            tool="",
            seconds=time.perf_counter() - started,
        )

    def _path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.json"

    def _cached(self, key: str) -> _CachedLaunches | None:
        path = self._path(key)
        try:
            return _CachedLaunches.model_validate_json(path.read_text())
        except (OSError, ValueError):
            return None

    def _store(self, key: str, launches: _CachedLaunches) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{time.time_ns()}.tmp")
        temporary.write_text(json.dumps(launches.model_dump(mode="json")))
        temporary.replace(path)  # atomic: a reader never sees half a file
