"""Link failures of the build stage: unresolved symbols and missing libraries, explained.

The gate links every kernel with ``-Xlinker --no-undefined``, so a shared library that would
build but fail to load (``cuTensorMapEncodeTiled`` called without ``-lcuda``) fails at link
time, with the linker naming the symbol. That works on a machine without a GPU driver too:
the linker resolves against the libraries it is given (the toolkit's ``lib64/stubs/libcuda.so``
where the driver is absent), where loading the library with ``RTLD_NOW`` would need the driver
itself and fail on CI machines for every kernel that links ``-lcuda``.

This module reads ld's messages and says which flag of ``compile_options.json`` is missing.
It also lets ``-lcuda`` link on a GPU machine whose driver has only ``libcuda.so.1`` (a
container's driver mount has no unversioned ``libcuda.so``, and a toolkit may lack its stubs).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from klineage.gate.ptxas import demangle
from klineage.problem.compile_options import COMPILE_OPTIONS_FILE

# ld: kernel.o: in function `run': ... undefined reference to `cuTensorMapEncodeTiled'
_UNDEFINED = re.compile(r"undefined reference to [`'](?P<symbol>[^'`]+)'")
# ld: cannot find -lcuda: No such file or directory
_NOT_FOUND = re.compile(r"cannot find (?P<flag>-l\S+?)(?::|$)", re.MULTILINE)

# Symbol prefixes -> the library that defines them, longest prefix first where they overlap.
# cuda* (the runtime) is linked statically by nvcc, so it is never missing.
_LIBRARIES: tuple[tuple[str, str, str], ...] = (
    ("cublasLt", "-lcublasLt", "cuBLASLt"),
    ("cublas", "-lcublas", "cuBLAS"),
    ("cufft", "-lcufft", "cuFFT"),
    ("curand", "-lcurand", "cuRAND"),
    ("cusparse", "-lcusparse", "cuSPARSE"),
    ("cusolver", "-lcusolver", "cuSOLVER"),
    ("cudnn", "-lcudnn", "cuDNN"),
    ("nvrtc", "-lnvrtc", "NVRTC"),
    ("nvJitLink", "-lnvJitLink", "nvJitLink"),
    ("nccl", "-lnccl", "NCCL"),
    ("cupti", "-lcupti", "CUPTI"),
    ("nvtx", "-lnvToolsExt", "NVTX"),
    ("cu", "-lcuda", "the CUDA driver API"),
)


@dataclass(frozen=True)
class LinkFailure:
    """What the linker could not do, and the message the build result shows."""

    kind: str
    """'unresolved_symbol' (a symbol no linked library defines) or 'library_not_found' (an
    -l flag whose library is not on this machine)."""
    message: str
    """The explanation, naming the symbols or libraries and the flag to add."""


def library_for(symbol: str) -> tuple[str, str] | None:
    """(the -l flag, the library's name) that usually defines `symbol`, or None."""
    if symbol.startswith("cuda") and not symbol.startswith("cudnn"):
        return None  # the runtime API: cudart, linked by nvcc itself
    for prefix, flag, library in _LIBRARIES:
        # the name goes on with a capital or '_' after the prefix (cublasSgemm, cuMemAlloc)
        if symbol.startswith(prefix) and not symbol[len(prefix) :][:1].islower():
            return flag, library
    return None


def link_failure(log: str, name: str) -> LinkFailure | None:
    """The link failure nvcc's `log` reports for the kernel `name`, or None when the log
    holds none."""
    missing = list(dict.fromkeys(m["flag"] for m in _NOT_FOUND.finditer(log)))
    if missing:
        return LinkFailure("library_not_found", _not_found_message(missing, name))
    symbols = list(dict.fromkeys(m["symbol"] for m in _UNDEFINED.finditer(log)))
    if symbols:
        return LinkFailure("unresolved_symbol", _unresolved_message(symbols, name))
    return None


def _unresolved_message(symbols: list[str], name: str) -> str:
    lines = [
        f"{name}: compiles, but calls {len(symbols)} function"
        f"{'s' if len(symbols) > 1 else ''} that no library it links defines, so the harness "
        "could not load it (unresolved at link time)"
    ]
    wanted: dict[str, str] = {}
    for symbol, shown in zip(symbols, demangle(symbols), strict=True):
        found = library_for(shown)
        pretty = shown if shown == symbol else f"{symbol} ({shown})"
        if found is None:
            lines.append(f"  {pretty}: in no library klineage knows; define it or link its library")
            continue
        flag, library = found
        wanted.setdefault(flag, library)
        lines.append(f"  {pretty}: from {library}, linked with {flag}")
    if wanted:
        flags = ", ".join(f'"{flag}"' for flag in wanted)
        lines.append(
            f'  add {flags} to "ld_flags" in the problem\'s {COMPILE_OPTIONS_FILE}, e.g. '
            f'{{"ld_flags": [{flags}]}}'
        )
    return "\n".join(lines)


def _not_found_message(flags: list[str], name: str) -> str:
    lines = [f"{name}: the linker found no library for {', '.join(flags)} on this machine"]
    if "-lcuda" in flags:
        lines.append(
            "  libcuda.so comes with the GPU driver; where there is none, nvcc links against "
            "the toolkit's lib64/stubs/libcuda.so, and neither is on the linker's path here. "
            "Build where the driver or the stubs are, or name the driver's own file: "
            "-l:libcuda.so.1"
        )
    lines.append(
        f"  the flags come from the problem's {COMPILE_OPTIONS_FILE}; add -L<folder> there "
        "when the library is outside the linker's search path"
    )
    return "\n".join(lines)


DRIVER_LINK_DIR = "driver-lib"
"""Folder in a build's work dir holding a libcuda.so that points at the driver's library."""
_LDCONFIG_ENTRY = re.compile(r"^\s*libcuda\.so\.1 \((?P<flags>[^)]*)\) => (?P<path>\S+)$")


@functools.cache
def driver_library() -> Path | None:
    """The GPU driver's libcuda.so.1 as the dynamic loader knows it (`ldconfig -p`), or None
    on a machine without a driver."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/sbin", "/usr/sbin"])
    ldconfig = shutil.which("ldconfig", path=search)
    if ldconfig is None:
        return None
    try:
        listing = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = [m for m in map(_LDCONFIG_ENTRY.match, listing.splitlines()) if m]
    found.sort(key=lambda m: "x86-64" not in m["flags"] and "AArch64" not in m["flags"])
    return Path(found[0]["path"]) if found else None


def driver_link_flags(work: Path, ld_flags: Sequence[str]) -> list[str]:
    """For a build that links -lcuda on a machine with a driver: a libcuda.so in `work`
    pointing at the driver's libcuda.so.1, and the -L (relative to `work`) that finds it.
    The library still records libcuda.so.1, which the harness loads from the driver."""
    if "-lcuda" not in ld_flags:
        return []
    driver = driver_library()
    if driver is None:
        return []
    folder = work / DRIVER_LINK_DIR
    folder.mkdir(exist_ok=True)
    (folder / "libcuda.so").symlink_to(driver)
    return [f"-L{DRIVER_LINK_DIR}"]
