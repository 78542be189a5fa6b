"""Warp tiling: the warps of a block split its tile into a 2-D grid of warp tiles.

Inside a block tile, each warp owns a sub-tile (``warp_m = warp / 4``, ``warp_n = warp % 4``,
rows ``warp_m * kWarpTileM ...``) and keeps its accumulators in registers; fragments are
read at the warp's row and column offsets, so each shared-memory element is read by few
warps and reused from registers many times.

- detect: kernels that split the warp index (``threadIdx.x >> 5``, ``/ 32``) into two
  coordinates and scale them by compile-time warp-tile extents; the site spans those
  declarations. Other spellings (the warp index from a 2-D block, coordinates scaled inside
  helpers, offsets in ``ldmatrix`` addresses) are found by the index analysis
  (:mod:`klineage.mechanisms._tiling_forms`), the site then the kernel;
- remove and apply: refused: the warp tile fixes the accumulator arrays, the fragment
  loads and the epilogue together; changing it re-tiles the kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

from klineage.conditions import BlockSizeMultiple, Condition
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import (
    Locals,
    block_threads,
    is_constant,
    names_in,
    scaled_terms,
    strip_casts,
    top_declarations,
)
from klineage.mechanisms._tiling_forms import warp_coordinates
from klineage.mechanisms.base import DetectOnly, Site, register
from klineage.problem import Problem

REFUSAL = (
    "the warp tile fixes the accumulator arrays, the fragment loads and the epilogue "
    "together; changing or removing it re-tiles the kernel, which rules do not do"
)


def _operator(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def _warp_index(source: ParsedSource, locals_: Locals, value: Node) -> bool:
    """``threadIdx.x >> 5`` or ``threadIdx.x / 32`` (or of a local holding threadIdx.x)."""
    value = strip_casts(value)
    left, right = value.child_by_field_name("left"), value.child_by_field_name("right")
    if value.type != "binary_expression" or left is None or right is None:
        return False
    op, amount = _operator(value), source.text_of(right).strip()
    if not ((op == ">>" and amount == "5") or (op == "/" and amount == "32")):
        return False
    return locals_.thread_component(left) == "x"


def warp_grid(source: ParsedSource, function: Function) -> list[Node]:
    """The declarations of a 2-D warp grid: the coordinates split from the warp index and
    the offsets that scale them by constant warp-tile extents; empty if there is none."""
    locals_ = Locals(source, function)
    declarations = top_declarations(source, function)
    warps = {name for name, _, value in declarations if _warp_index(source, locals_, value)}
    coordinates = [
        (name, decl)
        for name, decl, value in declarations
        if names_in(source, value) & warps
        and _operator(strip_casts(value)) in (">>", "/", "&", "%")
    ]
    if len(coordinates) < 2:
        return []
    names = {name for name, _ in coordinates}
    offsets = [
        decl
        for _, decl, value in declarations
        if any(
            strip_casts(scaled).type == "identifier"
            and source.text_of(strip_casts(scaled)) in names
            and is_constant(source, function, extent)
            for scaled, extent in scaled_terms(value)
        )
    ]
    if not offsets:
        return []
    return [decl for _, decl in coordinates] + offsets


@register
class WarpTiling(DetectOnly):
    name = "warp_tiling"
    refusal = REFUSAL
    category = "parallelism"
    family = "block and warp tiling"
    intent = (
        "Split a block's tile among its warps as a 2-D grid of warp tiles, so each warp "
        "reuses its operand fragments from registers across its whole sub-tile."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            declarations = warp_grid(source, function)
            if not declarations:
                yield from self._analysis_site(source, function)
                continue
            start = min(d.start_byte for d in declarations)
            end = max(d.end_byte for d in declarations)
            yield self.site(
                source,
                declarations[0],
                span=(start, end),
                snippet=f"{function.name}: warp grid and warp-tile offsets",
                detail={"kernel": function.name},
                refusal=REFUSAL,
            )

    def _analysis_site(self, source: ParsedSource, function: Function) -> Iterator[Site]:
        """A 2-D warp grid the index analysis finds in the addresses (helpers included)."""
        if function.body is None:
            return
        coordinates = warp_coordinates(source, function)
        if len(coordinates) < 2:
            return
        header = source.snippet((function.outer.start_byte, function.body.start_byte))
        yield self.site(
            source,
            function.node,
            span=(function.outer.start_byte, function.outer.end_byte),
            kind="function_definition",
            snippet=header,
            detail={"kernel": function.name, "coordinates": ", ".join(coordinates)[:200]},
            refusal=REFUSAL,
        )

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        block = block_threads(kernel.parsed, str(site.detail.get("kernel", "")))
        return [
            BlockSizeMultiple(
                k=32, block_size=block, why="the block is divided into whole warps of 32 lanes"
            )
        ]
