"""Build stage of the gate: compile one-file CUDA kernels into shared libraries with nvcc.

A kernel is a single ``.cu`` file exporting ``extern "C" int run(...)``. :class:`Builder`
compiles it to ``kernel.so`` and keeps the outcome in a content-addressed cache::

    <cache>/<key[:2]>/<key>/kernel.so     (only when the build is OK, and not device-only)
    <cache>/<key[:2]>/<key>/kernel.cu     (the source, for debugging)
    <cache>/<key[:2]>/<key>/kernel.cubin  (the device image, for disassembly; only when OK)
    <cache>/<key[:2]>/<key>/result.json   (the BuildResult, library path relative)
    <cache>/<key[:2]>/<key>.lock          (per-key flock, never deleted)
    <cache>/tmp/                          (work dirs; same filesystem so rename is atomic)

An OK build also records its machine code (:mod:`klineage.gate.sass`): fingerprints of the
device and host code, read from the files nvcc keeps, and (on demand, cached in the entry)
instruction histograms from nvdisasm.

Compile errors are cached as well: the same broken source never runs nvcc twice. Timeouts
are not cached because they depend on machine load rather than on the source, nor is a
library the linker cannot find on this machine.

A problem's ``compile_options.json`` (:class:`~klineage.problem.CompileOptions`) reaches
nvcc through ``Builder(options=...)`` or :meth:`Builder.with_options` (a sibling sharing the
cache); the flags are part of the cache key. The library is linked with ``--no-undefined``, so
a kernel that calls a library it does not link (``cuTensorMapEncodeTiled`` without
``-lcuda``) is a COMPILE_ERROR naming the symbol and the flag (:mod:`klineage.gate.link`),
not a build reported OK that fails when the harness loads it.

A device-only builder (``Builder(device_only=True)``, ``nvcc -cubin``) compiles the device
code alone, in about half the time: nvcc's front end still checks the whole file (host code
included) and ptxas reports the same resources and writes the same SASS as in the full build,
but the host compiler never runs and no library is linked. Its entries hold ``kernel.cubin``
and no ``kernel.so``, so they can be disassembled but not run: for "does it compile", the
ptxas report and SASS questions (the tests', the -lineinfo builds of no-op reasons).
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from klineage.gate import sass
from klineage.gate.link import DRIVER_LINK_DIR, driver_link_flags, link_failure
from klineage.gate.ptxas import PtxasReport, demangle, parse_ptxas
from klineage.headers import local_headers
from klineage.kernel import KernelSource
from klineage.problem.abi import KernelAbi
from klineage.problem.compile_options import CompileOptions

__all__ = [
    "BASE_FLAGS",
    "DEVICE_FLAGS",
    "BuildResult",
    "BuildStatus",
    "BuildToolError",
    "Builder",
    "FailureKind",
    "arch_flags",
    "check_abi",
    "default_cache_dir",
    "option_flags",
    "render_compile_errors",
]

CACHE_SCHEMA = 2  # bump when the entry layout or the key recipe changes
SOURCE_FILE = "kernel.cu"  # name of the source inside the work dir; nvcc reports it in errors
LIBRARY_FILE = "kernel.so"
RESULT_FILE = "result.json"
CUBIN_FILE = "kernel.cubin"
KEEP_DIR = "nvcc-tmp"
# nvcc keeps its intermediates (the cubin, the host object) where the fingerprints read them;
# it changes no output, so the recorded command and the cache key leave it out
KEEP_FLAGS: tuple[str, ...] = ("-keep", "-keep-dir", KEEP_DIR)
MAX_ERRORS = 20
MAX_NOTES = 3
BASE_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17")
# --no-undefined: a symbol no linked library defines fails the link (see klineage.gate.link)
SHARED_FLAGS: tuple[str, ...] = (
    "-shared",
    "-Xcompiler",
    "-fPIC",
    "-Xptxas",
    "-v",
    "-Xlinker",
    "--no-undefined",
)
DEVICE_FLAGS: tuple[str, ...] = ("-cubin", "-Xptxas", "-v")  # device-only: no host compile
_ARCH = re.compile(r"^sm_(\d+)([a-z]?)$")


class BuildToolError(RuntimeError):
    """A tool the build needs (nvcc) is missing or broken; not a problem of the kernel."""


class BuildStatus(str, enum.Enum):
    """Outcome of a build."""

    OK = "OK"
    COMPILE_ERROR = "COMPILE_ERROR"


class FailureKind(str, enum.Enum):
    """Why a COMPILE_ERROR happened."""

    NVCC = "nvcc"  # nvcc (front end, ptxas or host compiler) exited non-zero
    TIMEOUT = "timeout"  # nvcc ran past timeout_s
    MISSING_RUN = "missing_run"  # compiled, but no extern "C" run symbol
    SIGNATURE = "signature"  # run(...) is declared with other parameters than the ABI's
    UNRESOLVED_SYMBOL = "unresolved_symbol"  # links a call no linked library defines
    LIBRARY_NOT_FOUND = "library_not_found"  # an -l library absent from this machine


class BuildResult(BaseModel):
    """Everything known about one build, fresh or served from the cache."""

    status: BuildStatus = Field(description="OK or COMPILE_ERROR.")
    key: str = Field(description="Cache key: sha256 hex of source, flags, nvcc version and arch.")
    library: Path | None = Field(
        default=None,
        description="Path of kernel.so inside the cache entry; None unless OK, and always "
        "None for a device-only build.",
    )
    device_only: bool = Field(
        default=False,
        description="True for a device-only build (nvcc -cubin): checked by nvcc's front end "
        "and ptxas, with a ptxas report and device machine code, but no library to run.",
    )
    log: str = Field(
        default="",
        description="nvcc's combined stdout/stderr (work-dir prefix stripped from paths).",
    )
    message: str = Field(
        default="", description="Rendered errors using the display name; empty when OK."
    )
    report: PtxasReport | None = Field(
        default=None, description="Parsed ptxas -v resources; None when ptxas produced none."
    )
    seconds: float = Field(
        default=0.0, description="Wall time of this call's nvcc run; 0 for a cache hit."
    )
    compile_seconds: float = Field(
        default=0.0, description="Wall time of the nvcc run that produced this entry."
    )
    cached: bool = Field(default=False, description="True when served from the cache.")
    command: list[str] = Field(
        default_factory=list, description="The nvcc command line, with relative file names."
    )
    nvcc_version: str = Field(default="", description="Last line of `nvcc --version`.")
    arch: str = Field(default="", description="Target architecture, e.g. 'sm_90'.")
    options: CompileOptions = Field(
        default_factory=CompileOptions,
        description="The problem's extra flags (compile_options.json) this build used.",
    )
    source_name: str = Field(default=SOURCE_FILE, description="Display name used in `message`.")
    failure: FailureKind | None = Field(
        default=None, description="Which step failed for a COMPILE_ERROR; None when OK."
    )
    machine_code: sass.MachineCode | None = Field(
        default=None,
        description="Fingerprints of the device and host code, and (once disassembled) "
        "instruction histograms per kernel; None unless OK, or when nvcc kept no files.",
    )
    machine_code_note: str = Field(
        default="", description="Why machine_code or its histograms are missing, if they are."
    )

    @property
    def ok(self) -> bool:
        """True when the build succeeded: a usable library, or for a device-only build its
        device image (``library`` is then None)."""
        return self.status is BuildStatus.OK


def default_cache_dir() -> Path:
    """``$KLINEAGE_CACHE_DIR`` if set, else ``~/.cache/klineage/build``."""
    env = os.environ.get("KLINEAGE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "klineage" / "build"


def arch_flags(arch: str) -> list[str]:
    """nvcc flags selecting ``arch``.

    Arch-specific targets (``sm_90a``, ``sm_100f``) need an explicit ``-gencode``: with
    ``-arch=sm_90a`` nvcc 13.0 rejects wgmma instructions.
    """
    m = _ARCH.match(arch)
    if m is None:
        raise ValueError(f"arch must look like 'sm_90' or 'sm_90a', got {arch!r}")
    if m[2]:
        return [f"-gencode=arch=compute_{m[1]}{m[2]},code={arch}"]
    return [f"-arch={arch}"]


# Instructions only an architecture-specific target accepts (sm_90a on Hopper). A source that
# uses them is built for that target automatically: it runs on the same chips as sm_90 code.
_ARCH_SPECIFIC = re.compile(r"\bwgmma\.|\bsetmaxnreg\b")


def specific_arch_for(arch: str, source: str) -> str | None:
    """The arch-specific target `source` needs when built for the plain `arch`, else None."""
    m = _ARCH.match(arch)
    if m is None or m[2] or int(m[1]) != 90 or not _ARCH_SPECIFIC.search(source):
        return None
    return f"{arch}a"


@dataclass
class _NvccRun:
    returncode: int
    log: str
    seconds: float
    timed_out: bool


class Builder:
    """Compiles kernels with nvcc into a content-addressed, multi-process-safe cache."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        arch: str = "sm_90",
        extra_flags: Sequence[str] = (),
        nvcc: str = "nvcc",
        timeout_s: float = 300,
        *,
        device_only: bool = False,
        options: CompileOptions | None = None,
    ) -> None:
        if isinstance(extra_flags, str):
            raise TypeError("extra_flags must be a sequence of flags, not one string")
        self.options = options if options is not None else CompileOptions()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.arch = arch
        self._arch_flags = arch_flags(arch)  # validates early
        self.extra_flags: tuple[str, ...] = tuple(extra_flags)
        self.nvcc = nvcc
        self.timeout_s = float(timeout_s)
        self.device_only = device_only
        self._nvcc_path: str | None = None
        self._nvcc_version: str | None = None
        self._version_lock = threading.Lock()
        self._specific: dict[str, Builder] = {}
        self._with_options: dict[CompileOptions, Builder] = {}
        self._lines: dict[str, frozenset[int]] = {}
        self._specific_lock = threading.Lock()

    # ----------------------------------------------------------------- configuration

    @property
    def flags(self) -> list[str]:
        """All nvcc flags except the output and input file names."""
        mode = DEVICE_FLAGS if self.device_only else SHARED_FLAGS
        chosen = option_flags(self.options, link=not self.device_only)
        return [*BASE_FLAGS, *self._arch_flags, *mode, *self.extra_flags, *chosen]

    @property
    def command(self) -> list[str]:
        """The nvcc command line as run inside the work dir."""
        output = CUBIN_FILE if self.device_only else LIBRARY_FILE
        return [self.nvcc, *self.flags, "-o", output, SOURCE_FILE]

    @property
    def nvcc_version(self) -> str:
        """Last line of ``nvcc --version``; computed once per Builder."""
        with self._version_lock:
            if self._nvcc_version is None:
                self._nvcc_path, self._nvcc_version = _probe_nvcc(self.nvcc)
            return self._nvcc_version

    def _executable(self) -> str:
        """Resolved path of nvcc (raises BuildToolError when it is missing)."""
        _ = self.nvcc_version
        return self._nvcc_path or self.nvcc

    def key(self, source: str) -> str:
        """Cache key of ``source`` under this Builder's configuration, the local headers it
        includes from the ``-I`` folders of its options among it (a header edited on disk
        is another build)."""
        payload: dict[str, object] = {
            "schema": CACHE_SCHEMA,
            "source": source,
            "flags": self.flags,
            "nvcc": self.nvcc_version,
            "arch": self.arch,
            "machine_code": sass.RECIPE,
        }
        headers = local_headers(KernelSource(source, include_dirs=self.options.include_dirs))
        if headers:
            payload["headers"] = [[header.name, header.text] for header in headers]
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()

    def with_options(self, options: CompileOptions) -> Builder:
        """This builder with a problem's extra flags: itself when they are its own, else a
        sibling (made once per options) sharing the cache, arch and mode."""
        if options == self.options:
            return self
        with self._specific_lock:
            if options not in self._with_options:
                self._with_options[options] = self._like(self.arch, options=options)
            return self._with_options[options]

    def _like(
        self,
        arch: str,
        *,
        extra_flags: Sequence[str] | None = None,
        device_only: bool | None = None,
        options: CompileOptions | None = None,
    ) -> Builder:
        """A builder on the same cache and nvcc, with the settings given changed."""
        return Builder(
            self.cache_dir,
            arch,
            self.extra_flags if extra_flags is None else extra_flags,
            self.nvcc,
            self.timeout_s,
            device_only=self.device_only if device_only is None else device_only,
            options=self.options if options is None else options,
        )

    def entry_dir(self, key: str) -> Path:
        """Directory of the cache entry for ``key`` (it may not exist)."""
        return self.cache_dir / key[:2] / key

    # ----------------------------------------------------------------------- building

    def build(
        self, source: str, name: str = SOURCE_FILE, *, disassemble: bool = False
    ) -> BuildResult:
        """Build ``source``; ``name`` is only the display name used in error messages. With
        ``disassemble``, the machine code also gets its instruction histograms (nvdisasm,
        once per entry: see :meth:`disassemble`).

        A source using sm_90a-only instructions (wgmma, setmaxnreg) is built for sm_90a by a
        sibling builder sharing this cache; its result says so in ``arch``.
        """
        specific = specific_arch_for(self.arch, source)
        if specific is not None:
            return self._sibling(specific).build(source, name, disassemble=disassemble)
        key = self.key(source)
        hit = self._lookup(key, source, name)
        if hit is None:
            with self._key_lock(key):
                # Another process may have built it while we waited for the lock.
                hit = self._lookup(key, source, name)
                if hit is None:
                    hit = self._compile_and_publish(key, source, name)
        return self.disassemble(hit) if disassemble else hit

    def entry_key(self, source: str) -> str:
        """The cache key ``source`` is stored under (a sm_90a-only source's sibling's key)."""
        specific = specific_arch_for(self.arch, source)
        return self._sibling(specific).key(source) if specific is not None else self.key(source)

    def export_entry(self, key: str) -> dict[str, bytes] | None:
        """The files of a complete cache entry, to carry it to another host's cache (a build
        made on one cluster worker, used by the client and the GPU workers); None if absent."""
        entry = self.entry_dir(key)
        if not (entry / RESULT_FILE).is_file():
            return None
        return {path.name: path.read_bytes() for path in entry.iterdir() if path.is_file()}

    def import_entry(self, key: str, files: dict[str, bytes]) -> bool:
        """Install an entry exported by :meth:`export_entry` (on another host, with the same
        nvcc, so under the same key); False when this cache already holds it."""
        if any(Path(name).name != name or name in ("", ".", "..") for name in files):
            raise ValueError(f"cache entry {key[:12]}: a file name with a path in it")
        if RESULT_FILE not in files:
            raise ValueError(f"cache entry {key[:12]}: no {RESULT_FILE}")
        if (self.entry_dir(key) / RESULT_FILE).is_file():
            return False
        tmp_root = self.cache_dir / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{key[:16]}-in-", dir=tmp_root))
        try:
            for name, data in files.items():
                if name != RESULT_FILE:  # result.json last: it marks the entry complete
                    (work / name).write_bytes(data)
            (work / RESULT_FILE).write_bytes(files[RESULT_FILE])
            with self._key_lock(key):
                if (self.entry_dir(key) / RESULT_FILE).is_file():
                    return False
                _publish(work, self.entry_dir(key), tmp_root)
            return True
        finally:
            shutil.rmtree(work, ignore_errors=True)  # no-op once published

    def disassemble(self, result: BuildResult) -> BuildResult:
        """``result`` with instruction histograms in its machine code, made by nvdisasm from
        the entry's cubin the first time and kept in the entry's result.json."""
        code = result.machine_code
        if not result.ok or code is None or code.disassembled:
            return result
        entry = self.entry_dir(result.key)
        with self._key_lock(result.key):
            stored = BuildResult.model_validate_json((entry / RESULT_FILE).read_bytes())
            if stored.machine_code is not None and stored.machine_code.disassembled:
                return result.model_copy(update={"machine_code": stored.machine_code})
            try:
                code = sass.disassemble(code, entry / CUBIN_FILE)
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                return result.model_copy(update={"machine_code_note": str(err)})
            stored.machine_code = code
            _write_atomic(entry / RESULT_FILE, stored.model_dump_json(indent=1))
        return result.model_copy(update={"machine_code": code, "machine_code_note": ""})

    def instantiated_lines(self, source: str) -> set[int] | None:
        """The source lines some SASS instruction of ``source`` comes from (a -lineinfo build
        beside this one, cached like any build); None when that cannot be told. Only its
        cubin is read, so it is a device-only build."""
        lined = self._like(
            self.arch, extra_flags=(*self.extra_flags, "-lineinfo"), device_only=True
        )
        result = lined.build(source)
        if not result.ok:
            return None
        if result.key not in self._lines:  # nvdisasm costs half a second: once per source
            try:
                found = sass.instantiated_lines(lined.entry_dir(result.key) / CUBIN_FILE)
            except (OSError, RuntimeError, subprocess.SubprocessError):
                return None
            self._lines[result.key] = frozenset(found)
        return set(self._lines[result.key])

    def _sibling(self, arch: str) -> Builder:
        with self._specific_lock:
            if arch not in self._specific:
                self._specific[arch] = self._like(arch)
            return self._specific[arch]

    def build_many(
        self,
        sources: Sequence[tuple[str, str]] | Sequence[str],
        jobs: int | None = None,
        on_done: Callable[[int, BuildResult], None] | None = None,
        *,
        disassemble: bool = False,
    ) -> list[BuildResult]:
        """Build many sources in parallel; results come back in input order.

        Items are either source strings or ``(source, name)`` pairs. ``on_done(index, result)``
        is called from the calling thread as each build finishes. ``disassemble`` as in
        :meth:`build`.
        """
        items = [_as_item(item) for item in sources]
        if not items:
            return []
        _ = self.nvcc_version  # fail fast (BuildToolError) before starting threads
        workers = max(1, min(jobs or os.cpu_count() or 1, len(items)))
        results: list[BuildResult | None] = [None] * len(items)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(self.build, src, nm, disassemble=disassemble): i
                for i, (src, nm) in enumerate(items)
            }
            try:
                for future in as_completed(futures):
                    index = futures[future]
                    result = results[index] = future.result()
                    if on_done is not None:
                        on_done(index, result)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        return [r for r in results if r is not None]

    # -------------------------------------------------------------------------- cache

    def _lookup(self, key: str, source: str, name: str) -> BuildResult | None:
        """A valid cache entry as a hit, or None (missing, partial or corrupt = miss)."""
        entry = self.entry_dir(key)
        try:
            stored = BuildResult.model_validate_json((entry / RESULT_FILE).read_bytes())
        except (OSError, ValueError, ValidationError):
            return None
        if stored.key != key:
            return None
        library = entry / stored.library if stored.library is not None else None
        product = entry / CUBIN_FILE if stored.device_only else library
        if stored.ok and (product is None or not product.is_file()):
            return None
        message = stored.message
        if stored.source_name != name:
            message = _rerender_message(stored, source, name)
        return stored.model_copy(
            update={
                "library": library,
                "cached": True,
                "seconds": 0.0,
                "message": message,
                "source_name": name,
            }
        )

    @contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        # flock locks belong to the open file description, so they also exclude threads
        # of this process that opened the file separately.
        path = self.cache_dir / key[:2] / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _compile_and_publish(self, key: str, source: str, name: str) -> BuildResult:
        tmp_root = self.cache_dir / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{key[:16]}-", dir=tmp_root))
        try:
            result = self._compile(work, key, source, name)
            if result.failure in _NOT_CACHED:
                return result  # depends on the machine (its load, its libraries), not the source
            self._finalize_work_dir(work, result)
            entry = self.entry_dir(key)
            _publish(work, entry, tmp_root)
            if result.ok and not result.device_only:
                result.library = entry / LIBRARY_FILE
            return result
        finally:
            shutil.rmtree(work, ignore_errors=True)  # no-op once published

    def _finalize_work_dir(self, work: Path, result: BuildResult) -> None:
        """Leave only what the entry should hold, and write result.json last."""
        shutil.rmtree(work / "nvcc-tmp", ignore_errors=True)
        shutil.rmtree(work / DRIVER_LINK_DIR, ignore_errors=True)
        library = work / LIBRARY_FILE
        if not result.ok:
            library.unlink(missing_ok=True)
        elif library.exists():
            _fsync_file(library)
        linked = result.ok and not result.device_only
        stored = result.model_copy(update={"library": Path(LIBRARY_FILE) if linked else None})
        result_path = work / RESULT_FILE
        result_path.write_text(stored.model_dump_json(indent=1), encoding="utf-8")
        _fsync_file(result_path)

    # ------------------------------------------------------------------------ compile

    def _compile(self, work: Path, key: str, source: str, name: str) -> BuildResult:
        run = self._run_nvcc(work, source)
        result = BuildResult(
            status=BuildStatus.COMPILE_ERROR,
            key=key,
            log=run.log,
            seconds=run.seconds,
            compile_seconds=run.seconds,
            command=self.command,
            nvcc_version=self.nvcc_version,
            arch=self.arch,
            options=self.options,
            source_name=name,
            device_only=self.device_only,
        )
        if run.timed_out:
            result.failure = FailureKind.TIMEOUT
            result.message = (
                f"{name}: nvcc timed out after {self.timeout_s:g} s and was killed "
                "(raise Builder(timeout_s=...) if the kernel really needs longer)"
            )
            return result
        report = parse_ptxas(run.log)
        if run.returncode != 0:
            result.report = report if report.kernels else None
            linking = link_failure(run.log, name)
            if linking is not None:
                result.failure = FailureKind(linking.kind)
                result.message = linking.message
                return result
            result.failure = FailureKind.NVCC
            result.message = render_compile_errors(run.log, source, name, run.returncode)
            return result
        result.report = report
        if self.device_only:  # no library: nothing to look the run symbol up in
            result.status = BuildStatus.OK
            self._read_machine_code(work, result)
            return result
        missing = _missing_run_message(work / LIBRARY_FILE, name)
        if missing is not None:
            result.failure = FailureKind.MISSING_RUN
            result.message = missing
            return result
        result.status = BuildStatus.OK
        self._read_machine_code(work, result)
        return result

    def _read_machine_code(self, work: Path, result: BuildResult) -> None:
        """Fingerprints from nvcc's kept files, and the cubin kept for disassembly."""
        kept = work / KEEP_DIR
        try:
            if self.device_only:
                cubin = work / CUBIN_FILE  # nvcc's output, rewritten normalized below
                result.machine_code = sass.read_device_code(cubin, kept, self.arch)
                image = sass.normalized_image(kept, cubin)
            else:
                result.machine_code = sass.read_machine_code(kept, self.arch)
                image = sass.normalized_image(kept)
            (work / CUBIN_FILE).write_bytes(image)
        except (OSError, ValueError) as err:
            result.machine_code = None
            result.machine_code_note = f"no machine code fingerprints: {err}"

    def _run_nvcc(self, work: Path, source: str) -> _NvccRun:
        executable = self._executable()
        (work / SOURCE_FILE).write_text(source, encoding="utf-8")
        # nvcc's own intermediates go into the work dir so a killed build leaves nothing behind.
        nvcc_tmp = work / "nvcc-tmp"
        nvcc_tmp.mkdir()
        env = {**os.environ, "TMPDIR": str(nvcc_tmp)}
        found = [] if self.device_only else driver_link_flags(work, self.options.ld_flags)
        # what finds this machine's driver is no part of the key, like nvcc's own search path
        command = [executable, *self.command[1:-3], *found, *KEEP_FLAGS, *self.command[-3:]]
        start = time.perf_counter()
        # A new session lets a timeout kill nvcc's children (cicc, ptxas, gcc) as well.
        proc = subprocess.Popen(
            command,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, _ = proc.communicate()
        seconds = time.perf_counter() - start
        log = _strip_dir(out.decode("utf-8", errors="replace"), work)
        return _NvccRun(proc.returncode, log, seconds, timed_out)


# ----------------------------------------------------------------------------- helpers


_NOT_CACHED = (FailureKind.TIMEOUT, FailureKind.LIBRARY_NOT_FOUND)
"""Failures that depend on the machine (its load, the libraries it has), not on the source."""


def option_flags(options: CompileOptions, *, link: bool) -> list[str]:
    """nvcc's arguments for a problem's compile options: nvcc flags as they are, host flags
    behind -Xcompiler, linker flags (only where something is linked) as nvcc takes them:
    -l and -L itself, -Wl,<options> as -Xlinker <options>."""
    flags = list(options.cuda_cflags)
    for flag in options.cflags:
        flags += ["-Xcompiler", flag]
    if link:
        for flag in options.ld_flags:
            flags += ["-Xlinker", flag[len("-Wl,") :]] if flag.startswith("-Wl,") else [flag]
    return flags


def _probe_nvcc(nvcc: str) -> tuple[str, str]:
    """Resolve ``nvcc`` and return (path, last line of ``nvcc --version``)."""
    path = shutil.which(nvcc)
    if path is None:
        raise BuildToolError(
            f"nvcc was not found: {nvcc!r} is not on PATH or not executable. Install the CUDA "
            "toolkit and put its bin/ directory on PATH, or pass Builder(nvcc='/path/to/nvcc')."
        )
    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildToolError(f"could not run {path} --version: {exc}") from exc
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise BuildToolError(
            f"{path} --version failed (exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return path, lines[-1]


def _as_item(item: str | tuple[str, str]) -> tuple[str, str]:
    if isinstance(item, str):
        return item, SOURCE_FILE
    if len(item) != 2 or not all(isinstance(x, str) for x in item):
        raise TypeError("build_many items must be source strings or (source, name) pairs")
    return item[0], item[1]


def _publish(work: Path, entry: Path, tmp_root: Path) -> None:
    """Atomically make ``work`` the entry; caller holds the key lock."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    if entry.exists():
        # A corrupt or partial entry: move it aside first (rename cannot replace a
        # non-empty dir), so readers see either the old dir or the complete new one.
        trash = Path(tempfile.mkdtemp(prefix="trash-", dir=tmp_root))
        os.rename(entry, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(work, entry)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _strip_dir(text: str, directory: Path) -> str:
    """Drop the work dir prefix (and its resolved form) from paths in nvcc's output."""
    for form in {str(directory), os.path.realpath(directory)}:
        text = text.replace(form + os.sep, "").replace(form, ".")
    return text


def _missing_run_message(library: Path, name: str) -> str | None:
    """Message if the library lacks a dynamic ``run`` symbol; None if fine or unknowable."""
    nm = shutil.which("nm")
    if nm is None:
        return None
    try:
        proc = subprocess.run(
            [nm, "-D", "--defined-only", str(library)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    symbols = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            symbols[parts[-1]] = parts[-2]
    if symbols.get("run") in {"T", "W", "i"}:
        return None
    message = f'{name} does not export extern "C" run(...)'
    mangled = sorted(s for s in symbols if s.startswith("_Z3run"))
    if mangled:
        shown = ", ".join(demangle(mangled))
        message += f'\n  found C++-mangled {shown}: declare it extern "C"'
    return message


def check_abi(result: BuildResult, source: str, abi: KernelAbi) -> BuildResult:
    """`result` with the source's `run(...)` held against the definition's ABI. A run with
    other parameters links fine but would be called with the wrong arguments, so, like a
    missing run, it is a COMPILE_ERROR: the kernel does not build into what the harness
    calls. The message shows the declaration found and the line expected."""
    if result.failure is FailureKind.MISSING_RUN:
        return result.model_copy(
            update={"message": f"{result.message}\n  expected: {abi.prototype}"}
        )
    mismatch = abi.mismatch(source, result.source_name) if result.ok else None
    if mismatch is None:
        return result
    update = {
        "status": BuildStatus.COMPILE_ERROR,
        "failure": FailureKind.SIGNATURE,
        "message": mismatch,
        "library": None,
    }
    return result.model_copy(update=update)


def _rerender_message(stored: BuildResult, source: str, name: str) -> str:
    """The stored message for another display name (the cache key ignores the name)."""
    if stored.failure is FailureKind.NVCC:
        return render_compile_errors(stored.log, source, name)
    if stored.failure is FailureKind.MISSING_RUN:
        rest = stored.message.partition("\n")[2]
        first = f'{name} does not export extern "C" run(...)'
        return f"{first}\n{rest}" if rest else first
    if stored.failure is FailureKind.UNRESOLVED_SYMBOL:
        linking = link_failure(stored.log, name)
        return linking.message if linking is not None else stored.message
    return stored.message


# ------------------------------------------------------------------- error rendering

# EDG front end: kernel.cu(12): error #20: identifier "y" is undefined
_EDG_HEADER = re.compile(
    r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|internal error|error|"
    r"warning|remark|note)(?: #[\w-]+)?: (?P<msg>.*)$"
)
# Host compiler (gcc/clang): kernel.cu:1:10: fatal error: nothere.h: No such file
_GCC_HEADER = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|"
    r"warning|note): (?P<msg>.*)$"
)
_GCC_CONTEXT = re.compile(r"^\s*\d*\s*\|")  # gcc's own "  12 | code" / "     |  ^~~" lines
_PTXAS_DIAG = re.compile(
    r"^ptxas (?:(?P<file>\S+), line (?P<line>\d+); )?(?P<sev>error|fatal)\s*: (?P<msg>.*)$"
)
_TOOL_ERROR = re.compile(
    r"^(?:\S*/)?(?:nvlink|fatbinary|collect2|ld)\b.*\b(?:error|fatal|undefined reference)\b",
    re.IGNORECASE,
)
_NVCC_FATAL = re.compile(r"^nvcc (?:fatal|error)\s*: (?P<msg>.*)$")
_CARET = re.compile(r"^\s*\^\s*$")
_TMPXFT = re.compile(r"(?:[^\s'\"(]*/)?tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_")
_MANGLED = re.compile(r"'(_Z[\w$.]+)'")
_ERROR_SEVERITIES = {"catastrophic error", "internal error", "error", "fatal error"}


@dataclass
class _Diag:
    file: str
    line: int
    severity: str
    message: str
    col: int | None = None  # 0-based column, when known exactly (gcc)
    echo: str | None = None  # nvcc's echo of the (preprocessed) source line
    caret: int | None = None  # caret column within `echo`
    extra: list[str] = field(default_factory=list)  # continuation lines before the echo
    post: list[str] = field(default_factory=list)  # e.g. "detected during instantiation ..."
    notes: list[_Diag] = field(default_factory=list)


def render_compile_errors(log: str, source: str, name: str, returncode: int | None = None) -> str:
    """Render nvcc's errors as ``name:line: error: ...`` plus the source line and a caret.

    ``log`` is nvcc's output for a file compiled as ``kernel.cu``; temp paths are removed so
    the message only refers to ``name``. At most MAX_ERRORS errors are shown.
    """
    log = _TMPXFT.sub("", log)
    lines = source.splitlines()
    blocks = _render_source_diags(log, lines, name) + _render_tool_errors(log)
    blocks = list(dict.fromkeys(blocks))  # multi-target builds repeat front-end errors
    if not blocks:
        code = f" {returncode}" if returncode is not None else ""
        tail = "\n".join(log.strip().splitlines()[-30:])
        return f"{name}: nvcc failed (exit{code}) without a recognised error\n{tail}".rstrip()
    shown = blocks[:MAX_ERRORS]
    if len(blocks) > MAX_ERRORS:
        shown.append(f"... and {len(blocks) - MAX_ERRORS} more errors")
    return "\n\n".join(shown)


def _render_source_diags(log: str, source_lines: list[str], name: str) -> list[str]:
    diags = [d for d in _parse_source_diags(log) if d.severity in _ERROR_SEVERITIES]
    return [_render_diag(d, source_lines, name) for d in diags]


def _parse_source_diags(log: str) -> list[_Diag]:
    """Group front-end / host-compiler diagnostics; notes attach to the preceding error."""
    diags: list[_Diag] = []
    current: _Diag | None = None
    for raw in log.splitlines():
        line = raw.rstrip()
        diag = _parse_header(line)
        if diag is not None:
            if diag.severity == "note" and diags and diags[-1].severity != "note":
                diags[-1].notes.append(diag)
            else:
                diags.append(diag)
            current = diag
        elif not line.strip() or _GCC_CONTEXT.match(line):
            continue
        elif current is not None and current.col is None and _CARET.match(line):
            _attach_caret(current, line)
        elif current is not None and line.startswith(" "):
            (current.extra if current.echo is None else current.post).append(line)
        else:
            current = None  # an unrelated line (e.g. "3 errors detected ...") ends the block
    return diags


def _parse_header(line: str) -> _Diag | None:
    if m := _EDG_HEADER.match(line):
        return _Diag(m["file"], int(m["line"]), m["sev"], m["msg"])
    if m := _GCC_HEADER.match(line):
        col = int(m["col"]) - 1 if m["col"] else None
        return _Diag(m["file"], int(m["line"]), m["sev"], m["msg"], col=col)
    return None


def _attach_caret(diag: _Diag, caret_line: str) -> None:
    # The line just before the caret is nvcc's echo of the source line.
    if diag.extra:
        diag.echo = diag.extra.pop()
        diag.caret = caret_line.index("^")


def _render_diag(diag: _Diag, source_lines: list[str], name: str) -> str:
    ours = _is_our_file(diag.file)
    where = name if ours else diag.file
    out = [f"{where}:{diag.line}: {diag.severity}: {diag.message}"]
    out += [f"  {text.strip()}" for text in diag.extra]
    if ours and 1 <= diag.line <= len(source_lines):
        out += _source_context(diag, source_lines[diag.line - 1])
    elif diag.echo is not None and diag.caret is not None:
        out += [f"      | {diag.echo[2:]}", f"      | {' ' * max(diag.caret - 2, 0)}^"]
    out += [f"  {text.strip()}" for text in diag.post]
    for note in diag.notes[:MAX_NOTES]:
        note_where = name if _is_our_file(note.file) else note.file
        out.append(f"  note: {note_where}:{note.line}: {note.message}")
    return "\n".join(out)


def _source_context(diag: _Diag, original: str) -> list[str]:
    gutter = f"{diag.line:>5} | "
    blank = "      | "
    out = [f"{gutter}{original}".rstrip()]
    col = diag.col
    if col is None and diag.echo is not None and diag.caret is not None:
        col = _map_caret(original, diag.echo, diag.caret)
        if col is None:
            # Could not line the preprocessed echo up with the original: show both.
            out.append(f"{blank}as seen by nvcc: {diag.echo[2:]}")
            out.append(f"{blank}{' ' * (len('as seen by nvcc: ') + diag.caret - 2)}^")
            return out
    if col is not None and col <= len(original):
        # Keep tabs so the caret lines up however the terminal expands them.
        pad = "".join("\t" if ch == "\t" else " " for ch in original[:col])
        out.append(f"{blank}{pad}^")
    return out


def _map_caret(original: str, echo: str, caret: int) -> int | None:
    """Column in ``original`` of nvcc's caret, which points into the preprocessed echo.

    nvcc indents the echo by two spaces, prints tabs as single spaces and shows the line
    after cudafe's rewrites (``__global__`` -> ``__attribute__((global))``, macros expanded).
    Text after the caret is usually untouched, so a matching suffix pins the column.
    """
    if echo.startswith("  "):
        echo, caret = echo[2:], caret - 2
    flat = original.replace("\t", " ").rstrip()
    if caret < 0:
        return None
    if echo.rstrip() == flat:
        return caret
    suffix = echo[caret:].rstrip()
    if suffix and flat.endswith(suffix):
        return len(flat) - len(suffix)
    return None


def _is_our_file(path: str) -> bool:
    return path in (SOURCE_FILE, f"./{SOURCE_FILE}")


def _render_tool_errors(log: str) -> list[str]:
    """ptxas / nvcc / linker errors, which carry no source line of the kernel."""
    ptxas_errors: list[str] = []
    ptxas_fatal: list[str] = []
    tools: list[str] = []
    for raw in log.splitlines():
        line = raw.rstrip()  # tool lines start at column 0; indented lines are source echoes
        if m := _PTXAS_DIAG.match(line):
            where = f" (generated PTX line {m['line']})" if m["line"] else ""
            text = f"ptxas {m['sev']}: {m['msg'].strip()}{where}"
            (ptxas_errors if m["sev"] == "error" else ptxas_fatal).append(text)
        elif m := _NVCC_FATAL.match(line):
            tools.append(f"nvcc fatal: {m['msg'].strip()}")
        elif _TOOL_ERROR.match(line):
            tools.append(line)
    # "ptxas fatal: Ptx assembly aborted due to errors" only repeats the errors above it.
    found = ptxas_errors or ptxas_fatal
    return [_annotate_mangled(text) for text in found] + tools


def _annotate_mangled(text: str) -> str:
    names = _MANGLED.findall(text)
    if not names:
        return text
    for mangled, pretty in zip(names, demangle(names), strict=True):
        if pretty != mangled:
            text = text.replace(f"'{mangled}'", f"'{mangled}' ({pretty})", 1)
    return text
