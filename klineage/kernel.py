"""A kernel's source: its text, a display name, and a fingerprint blind to line endings.

This is the bottom of the package: it imports nothing else of klineage. The tree-sitter model
of a kernel (:class:`klineage.cuda.source.ParsedSource`) is reached as ``kernel.parsed``,
parsed on first use by the parser the package installs (:func:`use_parser`), so that this
module neither imports nor knows the parser; the ABI a kernel must export is
:mod:`klineage.problem.abi`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from klineage.cuda.source import ParsedSource

FINGERPRINT_LENGTH = 16
"""Hex digits of a fingerprint: the id of a kernel state in lineages, logs and skill ids."""

Parser = Callable[["KernelSource"], "ParsedSource"]
_parser: Parser | None = None


def use_parser(parse: Parser) -> None:
    """Install what ``KernelSource.parsed`` calls. The package's ``__init__`` installs the
    tree-sitter model of :mod:`klineage.cuda.source`, loaded on the first parse."""
    global _parser
    _parser = parse


def normalize_source(text: str) -> str:
    """Canonical form used for fingerprints: LF line ends, no trailing blanks, one final newline."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def fingerprint_of(text: str) -> str:
    """A stable short id of a kernel's source, blind to line endings and trailing whitespace."""
    digest = hashlib.sha256(normalize_source(text).encode("utf-8")).hexdigest()
    return digest[:FINGERPRINT_LENGTH]


@dataclass(frozen=True)
class KernelSource:
    """The text of one `.cu` kernel, with a display name and a stable fingerprint."""

    text: str
    """The CUDA source, exactly as written."""
    name: str = "kernel.cu"
    """Display name used in messages (the file name when read from disk)."""
    path: Path | None = field(default=None, compare=False)
    """Where the source was read from, if anywhere; its folder is where ``#include "..."``
    is looked up first."""
    include_dirs: tuple[Path, ...] = field(default=(), compare=False)
    """Further folders a quoted ``#include`` is looked up in (a build's ``-I`` folders): the
    analysis reads the macros and constants of the local headers found there."""

    @classmethod
    def from_file(cls, path: str | Path, include_dirs: Sequence[Path] = ()) -> KernelSource:
        """The kernel in a `.cu` file, named after it; FileNotFoundError when there is none."""
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such kernel file; pass the path of a .cu file")
        text = file.read_text(encoding="utf-8")
        return cls(text=text, name=file.name, path=file, include_dirs=tuple(include_dirs))

    def with_text(self, text: str) -> KernelSource:
        """Another state of this kernel: ``text`` under the same name, file and include
        folders (so it reads the same headers)."""
        return KernelSource(text, self.name, self.path, self.include_dirs)

    @cached_property
    def fingerprint(self) -> str:
        """A short stable id of the source, blind to line endings and trailing blanks."""
        return fingerprint_of(self.text)

    @cached_property
    def parsed(self) -> ParsedSource:
        """The tree-sitter source model (:mod:`klineage.cuda.source`), parsed on first use and
        kept: every mechanism asks the same parse."""
        if _parser is None:
            raise RuntimeError("no parser installed: import klineage (its __init__ installs one)")
        return _parser(self)

    def __repr__(self) -> str:
        return f"KernelSource({self.name!r}, fingerprint={self.fingerprint})"
