"""Warp tiling: the warps of a block split its tile into a 2-D grid of warp tiles.

Inside a block tile, each warp owns a sub-tile (the warp index split into a row and a column
of the warp grid, each scaled by a warp-tile extent) and keeps its accumulators in registers;
fragments are read at the warp's row and column offsets, so each shared-memory element is read
by few warps and reused from registers many times.

- detect: kernels that split the warp index (``threadIdx.x >> 5``, ``/ 32``, ``/ WARPSIZE``,
  ``(threadIdx.y * blockDim.x + threadIdx.x) / 32U``) into two coordinates; the site spans
  the warp and lane index declarations where the lanes are split too, else the declarations
  or (the index analysis, :mod:`klineage.mechanisms._tiling_forms`) the kernel;
- remove: in a SIMT kernel whose lanes are split into a row and a column of the warp's patch,
  the warp and lane indices are rebuilt from a block-wide thread grid, so each warp becomes
  a strip of it (:mod:`klineage.mechanisms._warp_grid`); refused where the lanes' places are
  fixed by ``mma`` fragments or other warp-collective operations;
- apply: a block-wide thread grid (``row = t / NC``, ``col = t % NC``) becomes warp tiles of
  ``32 / lane_cols`` by ``lane_cols`` threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import BlockSizeMultiple, Condition
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
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
from klineage.mechanisms._warp_grid import (
    block_grid,
    block_wide_grid,
    collective,
    lane_cols_of,
    rebuilt_grid,
    warp_lane_grid,
    warp_lane_restored,
    warp_tiled_grid,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

REFUSAL = (
    "the warp tile fixes the accumulator arrays, the fragment loads and the epilogue "
    "together; changing or removing it re-tiles the kernel, which rules do not do"
)
DEFAULT_LANE_COLS = 4
"""A warp of 8 x 4 threads: with square thread tiles, a square warp tile."""


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
class WarpTiling(Mechanism):
    name = "warp_tiling"
    category = "parallelism"
    family = "block and warp tiling"
    intent = (
        "Split a block's tile among its warps as a 2-D grid of warp tiles, so each warp "
        "reuses its operand fragments from registers across its whole sub-tile."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "lane_cols": "lanes per row of a warp's patch of threads (32 / rows)"
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            if rebuilt_grid(source, function) is not None:
                # warps rebuilt from a block-wide grid are strips of it, even where the grid is
                # 32 columns wide and so reads as warp and lane indices split again
                continue
            refusal = REFUSAL
            try:
                grid = warp_lane_grid(source, function)
            except NotInForm as err:
                grid, refusal = None, str(err)
            if grid is not None:
                yield self._pair_site(
                    source,
                    (grid.warp.declaration, grid.lane.declaration),
                    f"{function.name}: warp and lane indices split into a warp grid",
                    {"kernel": function.name, "lane_cols": grid.lane_cols},
                )
                continue
            declarations = warp_grid(source, function)
            if not declarations:
                yield from self._analysis_site(source, function, refusal)
                continue
            start = min(d.start_byte for d in declarations)
            end = max(d.end_byte for d in declarations)
            yield self.site(
                source,
                declarations[0],
                span=(start, end),
                snippet=f"{function.name}: warp grid and warp-tile offsets",
                detail={"kernel": function.name},
                refusal=refusal,
            )

    def _analysis_site(
        self, source: ParsedSource, function: Function, refusal: str
    ) -> Iterator[Site]:
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
            refusal=refusal,
        )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        found = collective(source)
        refusal = (
            None
            if found is None
            else f"the file uses the warp-collective `{found}`, whose lanes the hardware fixes; "
            "regrouping warps would change what it reads"
        )
        for function in source.kernels:
            rebuilt = rebuilt_grid(source, function)
            if rebuilt is not None:
                end = max(rebuilt.warp.declaration.end_byte, rebuilt.lane.declaration.end_byte)
                yield self.site(
                    source,
                    rebuilt.grid.row.declaration,
                    span=(rebuilt.span[0], end),
                    snippet=f"{function.name}: warp and lane indices rebuilt from a "
                    "block-wide grid",
                    detail={"kernel": function.name, "form": "rebuilt"},
                    refusal=refusal,
                )
            for pair in block_grid(source, function):
                if rebuilt is not None and pair.row.name == rebuilt.grid.row.name:
                    continue  # the grid the warps are rebuilt from: restored above
                yield self._pair_site(
                    source,
                    (pair.row.declaration, pair.col.declaration),
                    f"{function.name}: threads in a block-wide grid of {pair.columns} columns",
                    {"kernel": function.name, "columns": pair.columns},
                    refusal,
                )

    def _pair_site(
        self,
        source: ParsedSource,
        declarations: tuple[Node, Node],
        snippet: str,
        detail: dict[str, str | int],
        refusal: str | None = None,
    ) -> Site:
        """A site spanning two declarations."""
        return self.site(
            source,
            min(declarations, key=lambda d: d.start_byte),
            span=(min(d.start_byte for d in declarations), max(d.end_byte for d in declarations)),
            snippet=snippet,
            detail=detail,
            refusal=refusal,
        )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        grid = warp_lane_grid(source, self._function(source, site))
        if grid is None:
            raise NotInForm("a kernel without a warp index", "a warp index `t / 32`")
        return block_wide_grid(source, grid)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        function = self._function(source, site)
        if site.detail.get("form") == "rebuilt":
            rebuilt = rebuilt_grid(source, function)
            if rebuilt is None:
                raise NotInForm("no rebuilt warp grid here", "warps rebuilt from a grid")
            return warp_lane_restored(source, rebuilt)
        for pair in block_grid(source, function):
            if site.start_byte in (
                pair.row.declaration.start_byte,
                pair.col.declaration.start_byte,
            ):
                lane_cols = carrier.get("lane_cols") or DEFAULT_LANE_COLS
                return warp_tiled_grid(source, pair, lane_cols)
        raise NotInForm("no block-wide thread grid here", "`row = t / NC` and `col = t % NC`")

    @staticmethod
    def _function(source: ParsedSource, site: Site) -> Function:
        function = source.function(site.function)
        if function is None:
            raise NotInForm(f"no kernel {site.function}", "a kernel")
        return function

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        function = kernel.parsed.function(site.function)
        try:
            grid = warp_lane_grid(kernel.parsed, function) if function is not None else None
        except NotInForm:
            grid = None
        return Carrier() if grid is None else Carrier(lane_cols=lane_cols_of(grid))

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        return Carrier(lane_cols=DEFAULT_LANE_COLS)

    def alternative_carriers(self, kernel: KernelSource) -> list[Carrier]:
        """A warp of 4 x 8 threads beside the default 8 x 4: which suits a kernel depends on
        the shape of its thread tiles, which one gate run each tells."""
        return [Carrier(lane_cols=8)] if self.candidates(kernel) else []

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        block = block_threads(kernel.parsed, str(site.detail.get("kernel", "")))
        return [
            BlockSizeMultiple(
                k=32, block_size=block, why="the block is divided into whole warps of 32 lanes"
            )
        ]
