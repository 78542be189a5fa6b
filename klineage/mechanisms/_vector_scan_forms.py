"""Vectorized chunked scans of either kind, a warp's (:mod:`._vector_scan`) or a block's
(:mod:`._vector_block_scan`): which a loop is, its vector form, and the vector forms a kernel
holds, each recognized by writing it again from its scalar loop."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import binary, form_text, statements, strip_parens, unshift
from klineage.mechanisms._vector_block_scan import (
    BlockScanLoop,
    block_scan_loop,
    vector_block_scan_text,
)
from klineage.mechanisms._vector_lanes import is_pragma
from klineage.mechanisms._vector_scan import (
    VECTORS,
    WarpScanLoop,
    vector_scan_text,
    warp_scan_loop,
)

__all__ = ["VectorScan", "scan_loop", "vector_scan_edit", "vector_scans"]


@dataclass(frozen=True)
class VectorScan:
    """A vectorized warp or block scan this module wrote: the ``if``, its width, the scalar
    loop."""

    node: Node
    width: int
    scalar: str


def vector_scans(source: ParsedSource) -> list[VectorScan]:
    """The vectorized warp and block scans of a kernel, each recognized by writing it
    again."""
    found = []
    for node in source.nodes("if_statement"):
        other = node.child_by_field_name("alternative")
        block = other.named_children[-1] if other is not None and other.named_children else None
        inside = (
            statements(block) if block is not None and block.type == "compound_statement" else []
        )
        pragma = len(inside) == 2 and is_pragma(source, inside[0])
        if len(inside) != 1 + pragma or inside[-1].type != "for_statement":
            continue
        condition = node.child_by_field_name("condition")
        first = binary(strip_parens(condition.named_children[-1]), "&&") if condition else None
        head = binary(strip_parens(first[0]), "&&") if first is not None else None
        modulo = binary(strip_parens(head[0]), "==") if head is not None else None
        width_node = binary(strip_parens(modulo[0]), "%") if modulo is not None else None
        width = fold_int(source, width_node[1]) if width_node is not None else None
        if width not in VECTORS:
            continue
        scalar = unshift(source.text_of((inside[0].start_byte, inside[-1].end_byte)), 2)
        if scalar is None:
            continue
        data = source.data
        text = data[: node.start_byte] + scalar.encode("utf-8") + data[node.end_byte :]
        temp = KernelSource(text.decode("utf-8"), name=source.kernel.name).parsed
        loop = next((n for n in temp.nodes("for_statement") if n.start_byte >= node.start_byte),
                    None)  # fmt: skip
        if loop is None or (_pragma_before(temp, loop) is not None) != pragma:
            continue
        try:
            again = any_scan_text(temp, loop, width)
        except NotInForm:
            continue
        if form_text(again) == form_text(source.text_of(node)):
            assert width is not None
            found.append(VectorScan(node, width, scalar))
    return found


def scan_loop(source: ParsedSource, loop: Node) -> WarpScanLoop | BlockScanLoop:
    """The chunked warp or block scan ``loop`` is; :class:`NotInForm` says what differs from
    the one its step is closer to (32 a turn: a warp's, else a block's)."""
    try:
        return warp_scan_loop(source, loop)
    except NotInForm as warp:
        if "step by 32" not in warp.form:
            raise
    return block_scan_loop(source, loop)


def _pragma_before(source: ParsedSource, loop: Node) -> Node | None:
    """The ``#pragma unroll`` on the line before ``loop``, if one is."""
    before = loop.prev_named_sibling
    if before is None or not is_pragma(source, before):
        return None
    between = source.data[before.end_byte : loop.start_byte]
    return before if not between.strip() else None


def any_scan_text(source: ParsedSource, loop: Node, width: int) -> str:
    """The vectorized form of the warp or block scan ``loop`` (from its ``#pragma unroll``
    where it has one, which then goes before both loops: the scalar one keeps it, and a
    pragma before the ``if`` would unroll nothing)."""
    found = scan_loop(source, loop)
    pragma = _pragma_before(source, loop) is not None
    if isinstance(found, BlockScanLoop):
        return vector_block_scan_text(source, found, width, pragma)
    return vector_scan_text(source, found, width, pragma)


def vector_scan_edit(source: ParsedSource, loop: Node, width: int) -> Edit:
    """The edit that vectorizes the warp or block scan ``loop`` (and moves its pragma)."""
    pragma = _pragma_before(source, loop)
    start = loop.start_byte if pragma is None else pragma.start_byte
    return Edit(start, loop.end_byte, any_scan_text(source, loop, width))
