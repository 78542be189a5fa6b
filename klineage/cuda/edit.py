"""Edits: byte-range splices on a kernel's source, applied together and re-parsed.

Mechanisms describe a rewrite as a set of :class:`Edit` splices on the original bytes;
:func:`apply_edits` applies them from the end backwards (so every offset refers to the
original) and refuses a result the parser reads worse than the input: a rewrite that leaves a
syntax error is a bug in the mechanism, caught here before the gate compiles it.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klineage.kernel import KernelSource

if TYPE_CHECKING:
    # types only: the source model builds Edits (ParsedSource.deletion), and an edit result is
    # re-parsed through KernelSource.parsed, so this module never imports it at run time
    from tree_sitter import Node

    from klineage.cuda.source import ErrorSpan, ParsedSource

__all__ = ["Edit", "EditError", "apply_edits", "changed_region", "edits_between"]


class EditError(ValueError):
    """A set of edits cannot be applied: they overlap, touch an unparsed region, or leave the
    kernel with a syntax error. The message names the line."""


@dataclass(frozen=True, order=True)
class Edit:
    """Replace the bytes [start_byte, end_byte) of the original source with ``replacement``.

    An insertion has ``start_byte == end_byte``; a deletion has an empty replacement. Offsets
    are UTF-8 byte offsets, as tree-sitter reports them.
    """

    start_byte: int
    end_byte: int
    replacement: str

    def __post_init__(self) -> None:
        if not 0 <= self.start_byte <= self.end_byte:
            raise ValueError(f"bad edit range [{self.start_byte}, {self.end_byte})")

    @classmethod
    def replace(cls, node: Node, replacement: str) -> Edit:
        """Replace a node's text."""
        return cls(node.start_byte, node.end_byte, replacement)

    @classmethod
    def insert(cls, at: int, text: str) -> Edit:
        """Insert text before byte ``at``."""
        return cls(at, at, text)

    @classmethod
    def delete(cls, start_byte: int, end_byte: int) -> Edit:
        """Delete the bytes [start_byte, end_byte)."""
        return cls(start_byte, end_byte, "")

    @property
    def is_insertion(self) -> bool:
        """Whether the edit inserts without deleting."""
        return self.start_byte == self.end_byte


def _check_overlaps(edits: list[Edit], parsed: ParsedSource) -> None:
    for before, after in itertools.pairwise(edits):
        both_inserts = before.is_insertion and after.is_insertion
        if after.start_byte < before.end_byte or (
            both_inserts and after.start_byte == before.start_byte
        ):
            line = parsed.line_of(after.start_byte)
            what = "two insertions at the same place" if both_inserts else "overlapping edits"
            raise EditError(
                f"{parsed.kernel.name}:{line}: {what} "
                f"([{before.start_byte}, {before.end_byte}) and "
                f"[{after.start_byte}, {after.end_byte})); merge them into one edit"
            )


def apply_edits(
    source: KernelSource | ParsedSource, edits: Iterable[Edit], *, check: bool = True
) -> KernelSource:
    """Apply non-overlapping edits together and re-parse; the result, or :class:`EditError`.

    The edits may come in any order; they are applied from the end of the file backwards, so
    every offset refers to the original source. Exact duplicates count once. The result keeps
    the input's name and path (the file it derives from). With ``check``
    (the default) the edits are refused when they overlap, when one touches a region the
    parser could not read, or when the result has more parse errors than the input.
    """
    parsed = source.parsed if isinstance(source, KernelSource) else source
    kernel = parsed.kernel
    ordered = sorted(set(edits))
    if not ordered:
        return kernel
    _check_overlaps(ordered, parsed)
    size = len(parsed.data)
    for edit in ordered:
        if edit.end_byte > size:
            raise EditError(
                f"{kernel.name}: edit [{edit.start_byte}, {edit.end_byte}) runs past the end "
                f"of the source ({size} bytes)"
            )
        if check:
            span = parsed.error_touching(edit.start_byte, edit.end_byte)
            if span is not None:
                raise EditError(
                    f"{kernel.name}:{parsed.line_of(edit.start_byte)}: the edit touches a region "
                    f"the parser could not read (line {span.line}: "
                    f"{parsed.snippet((span.start_byte, max(span.end_byte, span.start_byte)))!r})"
                )
    pieces: list[bytes] = []
    cursor = 0
    new_ranges: list[tuple[int, int]] = []  # where each replacement lands in the result
    length = 0
    for edit in ordered:
        kept = parsed.data[cursor : edit.start_byte]
        inserted = edit.replacement.encode("utf-8")
        pieces += [kept, inserted]
        length += len(kept)
        new_ranges.append((length, length + len(inserted)))
        length += len(inserted)
        cursor = edit.end_byte
    pieces.append(parsed.data[cursor:])
    try:
        text = b"".join(pieces).decode("utf-8")
    except UnicodeDecodeError as err:
        raise EditError(f"{kernel.name}: an edit splits a multi-byte character ({err})") from None
    result = kernel.with_text(text)
    if check:
        _check_no_new_errors(parsed, result.parsed, new_ranges)
    return result


def _check_no_new_errors(
    before: ParsedSource, after: ParsedSource, new_ranges: list[tuple[int, int]]
) -> None:
    if len(after.errors) <= len(before.errors):
        return

    def distance(span: ErrorSpan) -> int:
        return min(
            max(0, start - span.end_byte, span.start_byte - end) for start, end in new_ranges
        )

    worst = min(after.errors, key=distance)
    context = after.snippet((after.line_start(worst.start_byte), worst.end_byte + 20))
    what = "a missing token" if worst.missing else "a syntax error"
    raise EditError(
        f"{after.kernel.name}:{worst.line}: the edited kernel has {what} near {context!r} "
        f"({len(after.errors)} unparsed regions, {len(before.errors)} before)"
    )


def changed_region(old: str, new: str) -> tuple[int, int]:
    """The byte range of `new` that differs from `old` (common prefix and suffix cut off)."""
    a, b = old.encode(), new.encode()
    prefix = 0
    limit = min(len(a), len(b))
    while prefix < limit and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and a[-1 - suffix] == b[-1 - suffix]:
        suffix += 1
    return prefix, len(b) - suffix


def edits_between(old: str, new: str) -> list[Edit]:
    """Edits that turn ``old`` into ``new``, one per run of changed lines (so a rewrite made
    on another text, such as an inlined form, lands as the few places it changed)."""
    old_lines = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    offsets = [0]
    for line in old_lines:
        offsets.append(offsets[-1] + len(line.encode()))
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    edits = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            edits.append(Edit(offsets[i1], offsets[i2], "".join(new_lines[j1:j2])))
    return edits
