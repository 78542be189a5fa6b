"""Block tiling: each block computes one BM x BN tile of the output.

A tiled GEMM gives every block a rectangle of the output (``m0 = tile_row * kBM``, ``n0 =
tile_col * kBN``) and streams only the rows of A and the columns of B that rectangle needs,
in K steps, so each operand element is loaded by ``N / kBN`` (or ``M / kBM``) blocks instead
of by every thread of its row.

- detect: kernels that derive two or more tile origins from the block index scaled by
  compile-time tile extents; the site is the declaration of those extents (file constants
  or ``#define``\\ s), or the origin declarations when the extents are literals or template
  parameters;
- remove and apply: refused. The block tile fixes how the grid, the thread indexing, the
  staging and the launch split the output; changing it is a re-tiling of the whole kernel.
"""

from __future__ import annotations

from collections.abc import Iterator

from klineage.conditions import Condition, Prose
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import (
    BLOCK_INDEX,
    Locals,
    constant_declaration,
    is_constant,
    names_in,
    scaled_terms,
    strip_casts,
    top_declarations,
)
from klineage.mechanisms.base import DetectOnly, Site, register
from klineage.problem import Problem
from klineage.source import Function, Node, ParsedSource

REFUSAL = (
    "the block tile fixes how the grid, the thread indexing, the staging and the launch split "
    "the output; changing or removing it re-tiles the whole kernel, which rules do not do"
)


def tile_origins(source: ParsedSource, function: Function) -> list[tuple[Node, Node]]:
    """(declaration, tile extent) of the locals that scale a block-level value (derived from
    the block index, not the thread index) by a compile-time extent (``m0 = tile_row *
    kBM``). Loop counters are not followed,
    ``blockDim`` is not an extent, and an origin that only feeds another one (a
    rasterization group's first row) is left out."""
    locals_ = Locals(source, function)
    counters = frozenset(locals_.assigned)
    found: list[tuple[str, Node, Node]] = []
    for name, decl, value in top_declarations(source, function):
        for scaled, extent in scaled_terms(value):
            extent_node = strip_casts(extent)
            if not is_constant(source, function, extent_node):
                continue
            if "blockDim" in source.text_of(scaled):
                continue
            threads = {"threadIdx.x", "threadIdx.y", "threadIdx.z"}
            if locals_.depends_on(scaled, set(BLOCK_INDEX), counters) and not (
                locals_.depends_on(scaled, threads, counters)
            ):
                found.append((name, decl, extent_node))
                break
    feeding = {
        name
        for name, _, _ in found
        for other, declaration, _ in found
        if other != name and name in names_in(source, declaration)
    }
    return [(decl, extent) for name, decl, extent in found if name not in feeding]


@register
class BlockTiling(DetectOnly):
    name = "block_tiling"
    refusal = REFUSAL
    category = "parallelism"
    family = "block and warp tiling"
    intent = (
        "Give each block a rectangle of the output and stream only the operand rows and "
        "columns it needs, so every loaded element is reused across the whole tile."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            origins = tile_origins(source, function)
            if len(origins) < 2:
                continue
            names = sorted({source.text_of(extent) for _, extent in origins})
            declared = [constant_declaration(source, n) for n in names]
            nodes = [d for d in declared if d is not None] or [decl for decl, _ in origins]
            start = min(n.start_byte for n in nodes)
            end = max(n.end_byte for n in nodes)
            yield self.site(
                source,
                nodes[0],
                span=(start, end),
                snippet=f"{function.name}: block tile {' x '.join(names)}",
                detail={"kernel": function.name, "extents": ",".join(names)},
                refusal=REFUSAL,
            )

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text=f"the launch grid covers the output in tiles of {site.detail.get('extents')}",
                why="each block computes one tile; partial tiles must be bounds-checked",
            )
        ]
