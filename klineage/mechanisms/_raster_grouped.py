"""A grouped block order written from scratch on a kernel over a 2-D grid of tiles.

Blocks of a 2-D grid run roughly in order of ``blockIdx.y * gridDim.x + blockIdx.x``: row by
row, so the blocks in flight share one row of tiles of A but sweep all of B. Handing them out in
groups of ``G`` tile-rows (down a group's column of tiles before moving right) makes them share
both operands in L2. Any bijection of block ids onto the grid computes the same outputs when
blocks do not depend on each other, so the rewrite renames the kernel's block coordinates::

    constexpr int kGroup = G;  // at file scope, before the kernel
    const unsigned width = kGroup * gridDim.x;
    const unsigned group = (blockIdx.y * gridDim.x + blockIdx.x) / width;
    const unsigned first = group * kGroup;
    const unsigned rows = min(gridDim.y - first, (unsigned)kGroup);
    const unsigned in_group = (blockIdx.y * gridDim.x + blockIdx.x) - group * width;
    const unsigned tile_y = first + in_group % rows;   // every other blockIdx.y read
    const unsigned tile_x = in_group / rows;           // every other blockIdx.x read

(the last group holds the rows left, so it is a bijection for any grid; with ``G = 1`` it is
the identity, which is what the removal writes). ``blockIdx.z`` (a batch) is kept. Refused
where a device helper reads the block index itself (it would see the old order) or the kernel
synchronizes the grid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.mechanisms._tiles_util import fresh_name, function_names, name_of

__all__ = ["DEFAULT_GROUP", "GridKernel", "grid_kernels", "grouped_order"]

DEFAULT_GROUP = 8
"""Tile-rows a group: eight blocks down a column before moving right."""
_GRID_SYNC = re.compile(r"\b(this_grid|grid_group|cudaLaunchCooperativeKernel)\b")


@dataclass(frozen=True)
class GridKernel:
    """A kernel that reads both coordinates of a 2-D grid of blocks."""

    function: Function
    reads: tuple[Node, ...]
    """Every ``blockIdx.x`` and ``blockIdx.y`` the kernel reads."""
    refusal: str | None


def _block_reads(source: ParsedSource, node: Node) -> list[Node]:
    return [
        n
        for n in source.iter_nodes("field_expression", within=node)
        if name_of(source, n) in ("blockIdx.x", "blockIdx.y")
    ]


def grid_kernels(source: ParsedSource, skip: set[str]) -> list[GridKernel]:
    """The kernels (not in `skip`) that read ``blockIdx.x`` and ``blockIdx.y``."""
    helpers = [
        f.name
        for f in source.functions
        if f not in source.kernels and f.body is not None and _block_reads(source, f.body)
    ]
    sync = _GRID_SYNC.search(source.kernel.text)
    found = []
    for function in source.kernels:
        if function.name in skip or function.body is None:
            continue
        reads = _block_reads(source, function.body)
        if {name_of(source, n) for n in reads} != {"blockIdx.x", "blockIdx.y"}:
            continue
        refusal = None
        if helpers:
            refusal = (
                f"the site is a kernel whose helper {helpers[0]} reads the block index itself; "
                "this rule needs every read of blockIdx.x and blockIdx.y in the kernel's body"
            )
        elif sync:
            refusal = (
                f"the site is a kernel that synchronizes the grid ({sync.group(1)}); this rule "
                "needs blocks that do not wait on each other"
            )
        found.append(GridKernel(function, tuple(reads), refusal))
    return found


def grouped_order(source: ParsedSource, kernel: GridKernel, group: int) -> list[Edit]:
    """The kernel's block coordinates renamed into groups of `group` tile-rows."""
    if group < 2:
        raise NotInForm(f"groups of {group} tile-row", "a group of two or more tile-rows")
    function = kernel.function
    assert function.body is not None
    used = function_names(source, function) | {f.name for f in source.functions}
    size = fresh_name(used, "kGroupRows")
    width, index, first, rows, within, tile_y, tile_x = (
        fresh_name(used, base)
        for base in (
            "group_width",
            "group",
            "group_first",
            "group_rows",
            "in_group",
            "tile_y",
            "tile_x",
        )
    )
    linear = "(blockIdx.y * gridDim.x + blockIdx.x)"
    open_brace = function.body.children[0]
    indent = "  "
    lines = [
        f"// blocks take tiles in groups of {size} tile-rows, so those in flight share L2",
        f"const unsigned {width} = {size} * gridDim.x;",
        f"const unsigned {index} = {linear} / {width};",
        f"const unsigned {first} = {index} * {size};",
        f"const unsigned {rows} = min(gridDim.y - {first}, (unsigned){size});",
        f"const unsigned {within} = {linear} - {index} * {width};",
        f"const unsigned {tile_y} = {first} + {within} % {rows};",
        f"const unsigned {tile_x} = {within} / {rows};",
    ]
    header = "".join(f"\n{indent}{line}" for line in lines)
    start = function.outer.start_byte
    edits = [
        Edit(start, start, f"constexpr int {size} = {group};\n\n"),
        Edit(open_brace.end_byte, open_brace.end_byte, header),
    ]
    for read in kernel.reads:
        edits.append(
            Edit.replace(read, tile_x if name_of(source, read) == "blockIdx.x" else tile_y)
        )
    return edits
