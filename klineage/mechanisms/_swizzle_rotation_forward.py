"""The rotation swizzle written into shared rows that are not permuted: the forward rule of the
removal in :mod:`klineage.mechanisms._swizzle_rotation`.

The form it takes: a 2-D ``__shared__`` array ``S[R][W]`` declared in a kernel whose every
access wraps its column at the row, as the removal leaves it, with no term that reads the row::

    __cvta_generic_to_shared(&S[row][0]) + ((c) % C) * B    // in bytes, C * B the row's bytes
    &S[row][(c) % W]                                        // in elements

(a cp.async store and an ldmatrix load, typically); pointers made from the array may serve a
later phase, after a barrier that follows every access, as the removal accepts.

What it writes: at every access the column's sum gets the same rotation of the row's 16-byte
chunks, one chunk every ``g`` rows, in the column's units (``k`` of them to a chunk)::

    ((c + (row % (N * g)) / g * k) % C)                     // N chunks to a row

``g`` is the carrier ``shift_rows``, by default the rows that share one 128-byte line of the
32 banks (``128 / row bytes``, at least 1): rows ``g`` apart then start in different chunks, so
the eight rows an ldmatrix phase (or a column of cp.async writes) touches meet different banks.
Why the values stay: for a fixed row the rotation is a bijection of its chunks and every access
of the row applies the same one (it is computed from the row subscript), so each reader meets
the writer it met before; an aligned access of up to 16 bytes stays inside one chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm, descendants
from klineage.mechanisms._swizzle_rotation import RowAccess, RowArray, reads_row, row_array

__all__ = ["RowsCandidate", "canonical_shift", "rotation_application", "rows_candidates"]

NEEDED = (
    "a 2-D shared array declared in the kernel whose every access wraps its column at the "
    "row, `S[row][(c) % W]` or `cvta(&S[row][0]) + ((c) % C) * B`, not yet rotated by the row"
)
CHUNK_BYTES = 16
BANK_LINE_BYTES = 128
"""The bytes one pass over the 32 four-byte banks covers."""


@dataclass(frozen=True)
class RowsCandidate:
    """A shared array whose rows the rule could rotate, or why not (``refusal``)."""

    function: Function
    name: str
    start: Node
    """The first access (or the declaration, when the accesses are not in the form)."""
    end: Node
    """The last access (or the declaration)."""
    array: RowArray | None
    refusal: NotInForm | None


def _access_refusal(source: ParsedSource, access: RowAccess) -> NotInForm | None:
    """Why the rotation cannot be written at one access: a column in units a chunk is not a
    whole number of, or a row subscript the term would evaluate again."""
    line = source.line_of(access.node.start_byte)
    unit = access.column.unit
    if unit > CHUNK_BYTES or CHUNK_BYTES % unit:
        form = f"an access at line {line} whose column counts units of {unit} bytes"
        return NotInForm(form + ", of which a 16-byte chunk is no whole number", NEEDED)
    effects = ("assignment_expression", "update_expression", "call_expression")
    if any(node.type in effects for node in [access.row, *descendants(access.row)]):
        form = f"an access at line {line} whose row subscript writes or calls something"
        return NotInForm(form + ", which the rotation term would do again", NEEDED)
    return None


def _array_refusal(source: ParsedSource, array: RowArray) -> NotInForm | None:
    if array.row_bytes % CHUNK_BYTES or array.row_bytes < 2 * CHUNK_BYTES:
        form = f"`{array.name}`, whose rows of {array.row_bytes} bytes are not two chunks or more"
        return NotInForm(form, NEEDED)
    return next(filter(None, (_access_refusal(source, a) for a in array.accesses)), None)


def _candidate(source: ParsedSource, function: Function, name: str) -> RowsCandidate | None:
    """The candidate of one shared array of ``function``; None when its rows are rotated
    already (the mechanism is there)."""
    declaration = analysis(source).indices(function).buffers[name].node
    if declaration is None:
        return None
    try:
        array = row_array(source, function, name, NEEDED)
    except NotInForm as why:
        return RowsCandidate(function, name, declaration, declaration, None, why)
    if any(reads_row(array, access) for access in array.accesses):
        return None
    first, last = array.accesses[0].node, array.accesses[-1].node
    return RowsCandidate(function, name, first, last, array, _array_refusal(source, array))


def rows_candidates(source: ParsedSource) -> Iterator[RowsCandidate]:
    """A candidate for each 2-D shared array declared in a kernel whose rows are not rotated."""
    for function in source.kernels:
        if function.body is None:
            continue
        for name, buffer in analysis(source).indices(function).buffers.items():
            if buffer.space != "shared" or len(buffer.extents) != 2:
                continue
            found = _candidate(source, function, name)
            if found is not None:
                yield found


def canonical_shift(rotation: tuple[int, ...], row_bytes: int) -> int | None:
    """``g`` when ``rotation`` (bytes for each ``row % len``) is one chunk every ``g`` rows,
    the form this rule writes; else None."""
    chunks = row_bytes // CHUNK_BYTES
    for shift in range(1, len(rotation) + 1):
        period = chunks * shift
        once = tuple((r % period) // shift * CHUNK_BYTES for r in range(period))
        if len(rotation) % period == 0 and rotation == once * (len(rotation) // period):
            return shift
    return None


def default_shift(row_bytes: int) -> int:
    """The rows that share one pass over the 32 banks (at least 1)."""
    return max(1, BANK_LINE_BYTES // row_bytes)


def _row_text(source: ParsedSource, row: Node) -> str:
    text = source.text_of(row)
    simple = row.type in ("identifier", "number_literal", "parenthesized_expression")
    return text if simple else f"({text})"


def _rotation_term(source: ParsedSource, access: RowAccess, chunks: int, shift: int) -> str:
    """``(row % (N g)) / g`` chunks, in the column's units."""
    row = _row_text(source, access.row)
    term = f"({row} % {chunks * shift}) / {shift}" if shift > 1 else f"{row} % {chunks}"
    per_chunk = CHUNK_BYTES // access.column.unit
    return f"{term} * {per_chunk}" if per_chunk > 1 else term


def _with_term(total: Node, term: str) -> list[Edit]:
    """``(c)`` -> ``(c + term)``; ``c`` -> ``(c + term)``."""
    if total.type == "parenthesized_expression":
        return [Edit.insert(total.end_byte - 1, f" + {term}")]
    return [Edit.insert(total.start_byte, "("), Edit.insert(total.end_byte, f" + {term})")]


def rotation_application(
    source: ParsedSource, function: Function, name: str, shift: int | None
) -> list[Edit]:
    """The edits rotating every access of the shared array ``name`` of ``function`` by one
    chunk every ``shift`` rows (default: :func:`default_shift`); NotInForm when the array is
    not a candidate."""
    found = _candidate(source, function, name)
    if found is None:
        raise NotInForm(f"`{name}`, whose rows are rotated already", NEEDED)
    if found.refusal is not None or found.array is None:
        raise found.refusal or NotInForm(f"`{name}`", NEEDED)
    array = found.array
    chunks = array.row_bytes // CHUNK_BYTES
    rows = shift if shift is not None else default_shift(array.row_bytes)
    return [
        edit
        for access in array.accesses
        for edit in _with_term(access.column.total, _rotation_term(source, access, chunks, rows))
    ]
