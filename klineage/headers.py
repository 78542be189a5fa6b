"""The local headers a kernel includes, read for what they define.

Real experts keep their macros in a shared header (``#include "utils.h"`` with ``HALF2``,
``LDST128BITS`` or a tile size), found next to the file or through an ``-I`` folder. The
file alone would read ``HALF2(x[i])`` as a call of unknown effect, so a kernel's analysis also
reads the ``#define``\\ s, integer constants, packed vector types and vector load/store
helpers of the headers it includes (``ParsedSource.headers``, ``ParsedSource.defines``).
Headers are only read: every edit stays in the kernel's own text, and
:func:`inline_local_headers` writes them into it where what a header holds is to be mined.

A quoted include is looked up the way the preprocessor does: in the folder of the file that
includes it, then in the kernel's include folders (``KernelSource.include_dirs``: a problem's
``-I`` flags, or for a file of a repository walked whole, the folders under it that hold
headers, nearest first). Angle includes (``<cuda_fp16.h>``) are system headers and are not
read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from klineage.kernel import KernelSource

HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".hh", ".inl")
"""File names a repository's shared headers have."""
MAX_HEADERS = 64
"""Local headers read for one kernel at most (a header graph is rarely deeper)."""
MAX_HEADER_BYTES = 2_000_000
"""A larger file is no header of macros; it is not read."""

_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"[^\n]*', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[^\n]*\n?", re.MULTILINE)


def included_names(text: str) -> list[str]:
    """The quoted includes of a source, in order (``#include "utils.h"`` -> ``utils.h``)."""
    return _QUOTED_INCLUDE.findall(text)


def local_headers(kernel: KernelSource) -> tuple[KernelSource, ...]:
    """Every local header ``kernel`` includes, directly or through another header, each once,
    in the order the preprocessor finishes them (a header after the headers it includes)."""
    return tuple(header for _, header in _local_header_files(kernel))


def local_header_paths(kernel: KernelSource) -> tuple[Path, ...]:
    """Where the headers of :func:`local_headers` are, in the same order."""
    return tuple(path for path, _ in _local_header_files(kernel))


def _local_header_files(kernel: KernelSource) -> list[tuple[Path, KernelSource]]:
    if kernel.path is None and not kernel.include_dirs:
        return []
    here = kernel.path.parent if kernel.path is not None else None
    found: list[tuple[Path, KernelSource]] = []
    seen: set[Path] = set() if kernel.path is None else {kernel.path.resolve()}

    def visit(text: str, folder: Path | None) -> None:
        for name in included_names(text):
            if len(found) >= MAX_HEADERS:
                return
            path = _resolve(name, folder, kernel.include_dirs)
            if path is None or path in seen:
                continue
            seen.add(path)
            header = _read_header(path)
            if header is None:
                continue
            visit(header.text, path.parent)
            found.append((path, header))

    visit(kernel.text, here)
    return found


def read_repository_file(path: Path, root: Path, name: str | None = None) -> KernelSource:
    """A CUDA file of a repository checked out at ``root``, read with the local headers its
    build would find (:func:`repository_include_dirs`); named by its path under ``root``
    unless ``name`` is given. Bytes that are not UTF-8 are replaced, not refused: a walk over
    someone else's repository reads every file it can."""
    return KernelSource(
        path.read_text(encoding="utf-8", errors="replace"),
        name=name if name is not None else str(path.relative_to(root)),
        path=path,
        include_dirs=repository_include_dirs(root, path),
    )


def inline_local_headers(kernel: KernelSource) -> str:
    """``kernel``'s text with each local header it includes written in place of its
    ``#include`` line (recursively, each header once, its ``#pragma once`` dropped), so code
    kept in a header (``load128`` in a shared ``common.h``) becomes the kernel's own and can
    be mined and edited. Includes it cannot find stay as they are."""
    if kernel.path is None and not kernel.include_dirs:
        return kernel.text
    done: set[Path] = set() if kernel.path is None else {kernel.path.resolve()}

    def spliced(text: str, folder: Path | None) -> str:
        def one(match: re.Match[str]) -> str:
            path = _resolve(match.group(1), folder, kernel.include_dirs)
            if path is None:
                return match.group(0)
            if path in done:
                return f"// {match.group(1)}: inlined above"
            done.add(path)
            header = _read_header(path)
            if header is None:
                return match.group(0)
            body = _PRAGMA_ONCE.sub("", spliced(header.text, path.parent)).strip("\n")
            name = match.group(1)
            return f"// ---- {name} (inlined) ----\n{body}\n// ---- end of {name} ----"

        return _QUOTED_INCLUDE.sub(one, text)

    return spliced(kernel.text, kernel.path.parent if kernel.path is not None else None)


def repository_include_dirs(root: Path, file: Path) -> tuple[Path, ...]:
    """Include folders a build of ``file`` inside repository ``root`` would likely pass: every
    folder under ``root`` that holds a header, nearest to ``file`` first (``-I../utils`` of a
    kernel in ``mma/basic/`` finds ``utils/`` before another project's ``utils/``)."""
    folders = {path.parent for path in _headers_under(root)}
    return tuple(sorted(folders, key=lambda folder: (_distance(folder, file.parent), folder)))


def _resolve(name: str, folder: Path | None, include_dirs: Sequence[Path]) -> Path | None:
    """Where the preprocessor finds ``#include "name"``, or None when it is no local file."""
    candidates: Iterable[Path] = ([folder] if folder is not None else []) + list(include_dirs)
    for directory in candidates:
        path = directory / name
        if path.is_file():
            return path.resolve()
    return None


def _read_header(path: Path) -> KernelSource | None:
    """The header at ``path`` (parsed once per version of the file), or None when it cannot
    be read or is too large to be a header."""
    try:
        stat = path.stat()
    except OSError:
        return None
    if stat.st_size > MAX_HEADER_BYTES:
        return None
    return _read_version(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _read_version(path: Path, mtime_ns: int, size: int) -> KernelSource | None:
    del mtime_ns, size  # the cache key: a header edited on disk is read again
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # no path: the header's own includes are followed by local_headers, from the kernel
    return KernelSource(text=text, name=path.name)


@lru_cache(maxsize=16)
def _headers_under(root: Path) -> tuple[Path, ...]:
    return tuple(
        sorted(
            path
            for path in root.rglob("*")
            if path.suffix in HEADER_SUFFIXES and path.is_file() and ".git" not in path.parts
        )
    )


def _distance(folder: Path, start: Path) -> int:
    """Steps from ``start`` up to the folders' common ancestor and down to ``folder``."""
    shared = 0
    for mine, theirs in zip(folder.parts, start.parts, strict=False):
        if mine != theirs:
            break
        shared += 1
    return len(folder.parts) + len(start.parts) - 2 * shared
