"""Block tiling: each block computes one BM x BN tile of the output.

A tiled GEMM gives every block a rectangle of the output (``m0 = tile_row * kBM``, ``n0 =
tile_col * kBN``) and streams only the rows of A and the columns of B that rectangle needs,
in K steps, so each operand element is loaded by ``N / kBN`` (or ``M / kBM``) blocks instead
of by every thread of its row.

- detect: kernels that derive two or more tile origins from the block index scaled by
  compile-time tile extents; the site is the declaration of those extents (file constants
  or ``#define``\\ s), or the origin declarations when the extents are literals or template
  parameters;
- remove and apply: refused in general. The block tile fixes how the grid, the thread
  indexing, the staging and the launch split the output; changing it is a re-tiling of the
  whole kernel.
- two exceptions. The *wide wgmma tile*: a Hopper kernel whose warpgroups each cover the
  tile's whole N extent with one ``wgmma.mma_async.m64n256k16`` (the widest there is) has a
  second site at that extent. Removing it halves the tile to N = 128 and apply widens it back
  to 256; see :mod:`klineage.mechanisms._wgmma_tile` for the four places that move together.
  The tiling itself stays (wgmma needs a tile): what the skill teaches is the width. And the
  *template wgmma tile*: a kernel written for any tile shape, whose wgmma width is one of its
  template parameters picked by a templated wgmma; removing it halves the width where the
  host binds it and apply doubles it, :mod:`klineage.mechanisms._wgmma_width`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import ArchAtLeast, Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
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
from klineage.mechanisms._wgmma_tile import (
    WIDEST_N,
    RetileRefused,
    Tile,
    renamed_wrapper,
    retile,
    tile_of,
    wgmma_wrappers,
)
from klineage.mechanisms._wgmma_width import TemplateTile, template_tiles
from klineage.mechanisms.base import Action, Carrier, Mechanism, Site, register
from klineage.problem import Problem

REFUSAL = (
    "the block tile fixes how the grid, the thread indexing, the staging and the launch split "
    "the output; changing or removing it re-tiles the whole kernel, which rules do not do"
)


def _origin_terms(value: Node) -> Iterator[tuple[Node, Node]]:
    """The scaled terms of an origin, also in each branch of a conditional one: a block row
    walked in serpentine order is ``odd ? (rows - 1 - blockIdx.y) * BM : blockIdx.y * BM``."""
    value = strip_casts(value)
    if value.type == "conditional_expression":
        for field in ("consequence", "alternative"):
            branch = value.child_by_field_name(field)
            if branch is not None:
                yield from _origin_terms(branch)
        return
    yield from scaled_terms(value)


def tile_origins(source: ParsedSource, function: Function) -> list[tuple[Node, Node]]:
    """(declaration, tile extent) of the locals that scale a block-level value (derived from
    the block index, not the thread index) by a compile-time extent (``m0 = tile_row *
    kBM``). Loop counters are not followed,
    ``blockDim`` is not an extent, and an origin that only feeds another one (a
    rasterization group's first row) is left out."""
    locals_ = Locals(source, function)
    counters = frozenset(locals_.assigned)
    found: list[tuple[str, Node, Node]] = []
    threads = {"threadIdx.x", "threadIdx.y", "threadIdx.z"}
    per_thread: set[str] = set()
    for name, decl, value in top_declarations(source, function):
        for scaled, extent in _origin_terms(value):
            extent_node = strip_casts(extent)
            if not is_constant(source, function, extent_node):
                continue
            if "blockDim" in source.text_of(scaled):
                continue
            if locals_.depends_on(scaled, set(BLOCK_INDEX), counters) and not (
                locals_.depends_on(scaled, threads, counters)
            ):
                found.append((name, decl, extent_node))
                if locals_.depends_on(value, threads, counters):
                    per_thread.add(name)
                break
    uses = {name: names_in(source, declaration) for name, declaration, _ in found}
    block_level = [name for name, _, _ in found if name not in per_thread]
    # an origin that feeds a block-level one is a step towards it (a rasterization group's
    # first row); a per-thread one that reads a block-level origin is an address in its tile
    dropped = {n for n in block_level for o in block_level if o != n and n in uses[o]}
    dropped |= {o for o in per_thread if any(n in uses[o] for n in block_level)}
    return [(decl, extent) for name, decl, extent in found if name not in dropped]


WIDE = "wide_wgmma_tile"
"""``Site.detail["form"]`` of the removable wide-tile site."""
TEMPLATE = "template_wgmma_tile"
"""``Site.detail["form"]`` of a wgmma tile whose width is a template parameter."""


def _extents(source: ParsedSource, function: Function) -> list[str]:
    return sorted({source.text_of(extent) for _, extent in tile_origins(source, function)})


def _wgmma_tile(source: ParsedSource, function: Function, extents: list[str]) -> Tile | None:
    if len(extents) < 2:
        return None
    tile = tile_of(source, function, extents)
    return tile if isinstance(tile, Tile) else None


def _extent_declarator(tile: Tile) -> Node:
    node = tile.extent_value.parent
    assert node is not None  # the literal's init_declarator
    return node


@register
class BlockTiling(Mechanism):
    name = "block_tiling"
    category = "parallelism"
    family = "block and warp tiling"
    intent = (
        "Give each block a rectangle of the output and stream only the operand rows and "
        "columns it needs, so every loaded element is reused across the whole tile."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "wrapper": "the wgmma wrapper's exact text at N = 256 (a removal carries it, so "
        "re-applying restores it byte for byte; without it the wrapper is rendered)",
        "n": "the width a template wgmma tile is set to (default: twice the present one)",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            origins = tile_origins(source, function)
            if len(origins) < 2:
                continue
            names = _extents(source, function)
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
            tile = _wgmma_tile(source, function, names)
            if tile is not None and tile.wrapper.n == WIDEST_N:
                yield self._wide_site(source, tile, names)
        for template in template_tiles(source):
            # the wide tile is the widest instruction the templated wgmma writes (as the wide
            # wgmma tile is N = 256); a width not bound once (0) is a site refused with why
            widest = template.width == max(template.widths)
            if template.width == 0 or (widest and template.width // 2 in template.widths):
                yield self._template_site(source, template)

    def _template_site(self, source: ParsedSource, tile: TemplateTile) -> Site:
        widths = ", ".join(str(w) for w in tile.widths)
        return self.site(
            source,
            tile.call,
            snippet=f"{tile.kernel.name}: wgmma tile {tile.parameter} = {tile.width} "
            f"(a template parameter; wgmma widths {widths})",
            detail={
                "kernel": tile.kernel.name,
                "form": TEMPLATE,
                "parameter": tile.parameter,
                "n": tile.width,
            },
            refusal=tile.refusal,
        )

    def _template_at(self, source: ParsedSource, site: Site, action: Action) -> TemplateTile:
        for tile in template_tiles(source):
            if (tile.kernel.name, tile.call.start_byte) == (site.function, site.start_byte):
                return tile
        raise self.refuse("the template wgmma tile is no longer found at the site", site, action)

    def _set_width(self, site: Site, tile: TemplateTile, width: int, action: Action) -> list[Edit]:
        if width not in tile.widths:
            widths = ", ".join(str(w) for w in tile.widths)
            raise self.refuse(
                f"the templated wgmma writes widths {widths}, not {width}", site, action
            )
        if tile.literal is None:
            raise self.refuse(str(tile.refusal), site, action)
        return [Edit.replace(tile.literal, str(width))]

    def _wide_site(self, source: ParsedSource, tile: Tile, names: list[str]) -> Site:
        return self.site(
            source,
            _extent_declarator(tile),
            snippet=(
                f"{tile.kernel.name}: block tile {' x '.join(names)} with {tile.extent} = "
                f"{tile.wrapper.n}, one {tile.wrapper.function.name} per warpgroup"
            ),
            detail={
                "kernel": tile.kernel.name,
                "extents": ",".join(names),
                "form": WIDE,
                "extent": tile.extent,
                "n": tile.wrapper.n,
            },
        )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            names = _extents(source, function)
            tile = _wgmma_tile(source, function, names)
            if tile is not None and tile.wrapper.n < WIDEST_N:
                yield self._wide_site(source, tile, names)
        for template in template_tiles(source):
            if 0 < template.width < max(template.widths) and template.width * 2 in template.widths:
                yield self._template_site(source, template)

    def _tile_at(self, source: ParsedSource, site: Site, action: Action) -> Tile:
        kernel = source.function(str(site.detail.get("kernel", "")))
        tile = _wgmma_tile(source, kernel, _extents(source, kernel)) if kernel else None
        if tile is None:
            raise self.refuse(REFUSAL, site, action)
        return tile

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == TEMPLATE:
            tile = self._template_at(source, site, "remove")
            return self._set_width(site, tile, tile.width // 2, "remove")
        if site.detail.get("form") != WIDE:
            raise self.refuse(REFUSAL, site)
        tile = self._tile_at(source, site, "remove")
        try:
            return retile(source, tile, tile.wrapper.n // 2)
        except RetileRefused as err:
            raise self.refuse(str(err), site) from err

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == TEMPLATE:
            template = self._template_at(source, site, "apply")
            width = carrier.get_int("n", template.width * 2) or template.width * 2
            return self._set_width(site, template, width, "apply")
        tile = self._tile_at(source, site, "apply")
        text = carrier.as_dict().get("wrapper")
        wrapper_text = None
        if text is not None:
            wrapper_text = self._carried_wrapper(str(text), tile, site)
        try:
            return retile(source, tile, WIDEST_N, wrapper_text)
        except RetileRefused as err:
            raise self.refuse(str(err), site, "apply") from err

    def _carried_wrapper(self, text: str, tile: Tile, site: Site) -> str:
        """The carried wrapper, when it is the N = 256 form of the target's wrapper: one f32
        m64n256 wgmma under the name the rename gives."""
        carried = wgmma_wrappers(KernelSource(text=text, name="carried wrapper").parsed)
        wanted = renamed_wrapper(tile.wrapper.function.name, tile.wrapper.n, WIDEST_N)
        if len(carried) != 1 or carried[0].n != WIDEST_N or carried[0].function.name != wanted:
            raise self.refuse(
                f"the carried wrapper is not an f32 m64n{WIDEST_N} wgmma named {wanted}",
                site,
                "apply",
            )
        return text

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("form") == TEMPLATE:
            return Carrier(n=int(site.detail["n"]))
        if site.detail.get("form") != WIDE:
            return Carrier()
        tile = self._tile_at(kernel.parsed, site, "remove")
        return Carrier(wrapper=kernel.parsed.text_of(tile.wrapper.function.outer))

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        if site.detail.get("form") == TEMPLATE:
            parameter = site.detail.get("parameter")
            return [
                ArchAtLeast(sm=90, specific=True, why="wgmma exists only on sm_90a"),
                Prose(
                    text=f"every extent of the tile follows the template parameter {parameter}"
                    " (shared tiles, accumulators, loops, the grid and the tensor maps)",
                    why="only the literal the host binds it with is changed",
                ),
            ]
        found: list[Condition] = [
            Prose(
                text=f"the launch grid covers the output in tiles of {site.detail.get('extents')}",
                why="each block computes one tile; partial tiles must be bounds-checked",
            )
        ]
        if site.detail.get("form") == WIDE:
            found += [
                ArchAtLeast(sm=90, specific=True, why="wgmma exists only on sm_90a"),
                Prose(
                    text=(
                        f"the tile's N extent {site.detail.get('extent')} is the wgmma's N, "
                        "and every warpgroup holds one accumulator of N/2 floats per thread"
                    ),
                    why=(
                        "at N = 256 that is 128 fp32 registers a thread for the accumulator "
                        "alone: the kernel must run one block per SM (__launch_bounds__(..., 1))"
                        " to keep them out of local memory"
                    ),
                ),
            ]
        return found
