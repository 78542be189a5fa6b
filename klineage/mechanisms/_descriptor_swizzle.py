"""The 128-byte swizzle that Hopper's wgmma reads through shared-memory matrix descriptors.

A wgmma operand in shared memory is described by a 64-bit descriptor: start address, leading
byte offset (LBO, bits 16-29), stride byte offset (SBO, bits 32-45) and a swizzle mode (bits
62-63; 1 is the 128-byte swizzle). With the 128-byte swizzle a K-major tile of 128-byte rows
is stored as ``row * 128 + ((chunk ^ (row & 7)) << 4)``: the writers (cp.async, through a
``swizzle(row, chunk)`` helper) and the tensor cores (through the descriptor) both permute, and
a k16 step moves the descriptor's start 32 bytes along the row.

Without a swizzle (mode 0) the tensor cores read "core matrices" of 8 rows x 16 bytes stored
contiguously; LBO is the distance between core matrices that are neighbours along K, SBO the
distance between neighbours along M or N. The same tile as interleaved core matrices is
``(row >> 3) * 1024 + chunk * 128 + (row & 7) * 16`` with LBO 128 and SBO 1024, and a k16 step
moves the start two core matrices: 256 bytes. SBO is 8 rows of 128 bytes in both layouts, so
8-row offsets (warpgroup bases, a thread's row + 32 i copies) are the same in both.

Removing the swizzle therefore changes three places together, and applying it changes them
back: the helper's formula, the descriptor's mode and LBO, and the k offsets added to the
addresses the descriptor is built from. Anything outside these forms is refused with the
reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource

ROW_BYTES = 128
"""The only row width the 128-byte swizzle describes for a K-major tile: 64 bf16 or f16."""
GROUP_BYTES = 8 * ROW_BYTES
"""SBO: eight rows, one swizzle atom or one row of core matrices."""
CORE_BYTES = 128
"""One core matrix: 8 rows of 16 bytes; LBO of the interleaved layout."""
SWIZZLED_LBO = 16
"""The LBO a K-major 128-byte-swizzled descriptor carries (the hardware ignores it)."""
MODE_SHIFT, LBO_SHIFT, SBO_SHIFT = 62, 16, 32


def _operator(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def _operands(node: Node) -> tuple[Node, Node] | None:
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    return None if left is None or right is None else (left, right)


@dataclass(frozen=True)
class Descriptor:
    """A device function that builds a wgmma shared-memory descriptor."""

    function: Function
    mode: Node
    """The value shifted to bit 62 (the swizzle mode)."""
    mode_value: int
    lbo: Node
    """The value shifted to bit 16 (LBO in 16-byte units)."""
    lbo_bytes: int
    sbo_bytes: int


def descriptors(source: ParsedSource) -> list[Descriptor]:
    """The descriptor builders of a file that issues wgmma: device functions that shift a
    constant to bits 16, 32 and 62."""
    if "wgmma.mma_async" not in source.kernel.text:
        return []
    found = []
    for function in source.functions:
        if not function.runs_on_device or function.body is None:
            continue
        fields: dict[int, Node] = {}
        for node in source.iter_nodes("binary_expression", within=function.body):
            pair = _operands(node)
            if _operator(node) != "<<" or pair is None:
                continue
            shift = fold_int(source, pair[1])
            if (
                shift in (MODE_SHIFT, LBO_SHIFT, SBO_SHIFT)
                and fold_int(source, pair[0]) is not None
            ):
                fields[shift] = pair[0]
        if len(fields) == 3:
            values = {shift: fold_int(source, node) or 0 for shift, node in fields.items()}
            found.append(
                Descriptor(
                    function=function,
                    mode=fields[MODE_SHIFT],
                    mode_value=values[MODE_SHIFT],
                    lbo=fields[LBO_SHIFT],
                    lbo_bytes=values[LBO_SHIFT] << 4,
                    sbo_bytes=values[SBO_SHIFT] << 4,
                )
            )
    return found


def _k_offsets(source: ParsedSource, descriptor: Descriptor) -> list[tuple[Node, int]] | str:
    """The literal k offsets (``ks * 32``) in the addresses passed to the builder, or why the
    addresses are not in that form."""
    offsets: list[tuple[Node, int]] = []
    for call in source.calls_named(descriptor.function.name):
        if len(call.args) != 1:
            return f"{source.text_of(call.node)}: the builder takes more than the address"
        for node in source.iter_nodes("binary_expression", within=call.args[0]):
            pair = _operands(node)
            if pair is None:
                continue
            if _operator(node) in ("+", "-") and any(p.type == "number_literal" for p in pair):
                return (
                    f"{source.text_of(call.node)}: a constant is added to the address; only "
                    "'base + k * step' offsets are rewritten"
                )
            if _operator(node) == "*" and pair[1].type == "number_literal":
                offsets.append((pair[1], fold_int(source, pair[1]) or 0))
    if not offsets:
        return (
            f"no call of {descriptor.function.name} adds a 'k * step' offset; the k steps "
            "would have to move with the layout"
        )
    return offsets


def _swizzled_sum(source: ParsedSource, xor: Node, row: str) -> tuple[Node, str] | str:
    """The ``row * 128 + ((chunk ^ (row & 7)) << 4)`` expression around the XOR, and the
    pitch as written (``(kBK * 2)``)."""
    node = xor.parent
    while node is not None and node.type == "parenthesized_expression":
        node = node.parent
    if node is None or node.type != "binary_expression" or _operator(node) not in ("<<", "*"):
        return "the XOR is not shifted to a 16-byte chunk offset"
    pair = _operands(node)
    step = fold_int(source, pair[1]) if pair else None
    if step != (4 if _operator(node) == "<<" else 16):
        return "the XOR is not shifted to a 16-byte chunk offset"
    chunk_term = node
    node = node.parent
    while node is not None and node.type == "parenthesized_expression":
        chunk_term, node = node, node.parent
    if node is None or node.type != "binary_expression" or _operator(node) != "+":
        return "the chunk offset is not added to a row offset"
    pair = _operands(node)
    assert pair is not None
    row_term = pair[0] if pair[1] == chunk_term else pair[1]
    factors = _operands(row_term) if row_term.type == "binary_expression" else None
    if factors is None or _operator(row_term) != "*":
        return "the row offset is not 'row * pitch'"
    texts = [source.text_of(f) for f in factors]
    if row not in texts:
        return "the row offset is not 'row * pitch'"
    pitch = factors[1 - texts.index(row)]
    if fold_int(source, pitch) != ROW_BYTES:
        return (
            f"rows of {source.text_of(pitch)} bytes; the descriptors' 128-byte swizzle "
            "describes 128-byte rows"
        )
    return node, source.text_of(pitch)


def interleaved(row: str, chunk: str) -> str:
    """The tile as interleaved core matrices, chunk ``chunk`` of row ``row``."""
    return f"({row} >> 3) * {GROUP_BYTES} + {chunk} * {CORE_BYTES} + ({row} & 7) * 16"


def swizzled(row: str, chunk: str, pitch: str) -> str:
    return f"{row} * {pitch} + (({chunk} ^ ({row} & 7)) << 4)"


@dataclass(frozen=True)
class Plan:
    """The edits that move a tile between the two layouts."""

    edits: list[Edit]
    pitch: str = str(ROW_BYTES)
    """The swizzled layout's row pitch as written, for re-applying it as it was."""


def _descriptor_edits(
    source: ParsedSource, descriptor: Descriptor, *, to_swizzle: bool
) -> list[Edit] | str:
    want_mode, want_lbo = (0, CORE_BYTES) if to_swizzle else (1, SWIZZLED_LBO)
    if descriptor.mode_value != want_mode or descriptor.lbo_bytes != want_lbo:
        return (
            f"{descriptor.function.name} has swizzle mode {descriptor.mode_value} and LBO "
            f"{descriptor.lbo_bytes}; the rule rewrites mode {want_mode} with LBO {want_lbo}"
        )
    if descriptor.sbo_bytes != GROUP_BYTES:
        return f"SBO {descriptor.sbo_bytes}: 8-row groups are not {GROUP_BYTES} bytes apart"
    offsets = _k_offsets(source, descriptor)
    if isinstance(offsets, str):
        return offsets
    # a 16-byte chunk along a swizzled row is one 128-byte core matrix when interleaved
    scale = CORE_BYTES // 16
    edits = [
        Edit.replace(descriptor.mode, f"(uint64_t){1 - want_mode}"),
        Edit.replace(
            descriptor.lbo, f"(uint64_t)({SWIZZLED_LBO if to_swizzle else CORE_BYTES} >> 4)"
        ),
    ]
    for node, step in offsets:
        if to_swizzle:
            if step % (scale * 16) or step >= GROUP_BYTES:
                return f"k step {step} is not a whole number of core matrices in a row"
            edits.append(Edit.replace(node, str(step // scale)))
        else:
            if step % 16 or step >= ROW_BYTES:
                return f"k step {step} is not a whole number of 16-byte chunks in a row"
            edits.append(Edit.replace(node, str(step * scale)))
    return edits


def removal_plan(source: ParsedSource, xor: Node, row: str, chunk: str) -> Plan | str:
    """Swizzled helper and descriptors to interleaved core matrices and mode 0."""
    found = descriptors(source)
    if len(found) != 1:
        return f"{len(found)} wgmma descriptor builders; the rule rewrites exactly one"
    summed = _swizzled_sum(source, xor, row)
    if isinstance(summed, str):
        return summed
    edits = _descriptor_edits(source, found[0], to_swizzle=False)
    if isinstance(edits, str):
        return edits
    return Plan([Edit.replace(summed[0], interleaved(row, chunk)), *edits], summed[1])


def _normal(text: str) -> str:
    return re.sub(r"\s+", "", text)


def application_plan(
    source: ParsedSource, helper: Function, row: str, chunk: str, pitch: str
) -> Plan | str:
    """Interleaved helper and mode-0 descriptors back to the 128-byte swizzle."""
    found = descriptors(source)
    if len(found) != 1:
        return f"{len(found)} wgmma descriptor builders; the rule rewrites exactly one"
    assert helper.body is not None
    wanted = _normal(interleaved(row, chunk))
    target = next(
        (
            n
            for n in source.iter_nodes("binary_expression", within=helper.body)
            if _normal(source.text_of(n)) == wanted
        ),
        None,
    )
    if target is None:
        return (
            f"{helper.name} is not the interleaved core-matrix layout "
            f"'{interleaved(row, chunk)}' that the descriptors read"
        )
    edits = _descriptor_edits(source, found[0], to_swizzle=True)
    if isinstance(edits, str):
        return edits
    return Plan([Edit.replace(target, swizzled(row, chunk, pitch)), *edits], pitch)
