"""Rasterization: a grouped (swizzled) order of output tiles over the block index.

Blocks with consecutive ids run together. Mapping ``blockIdx.x`` to tiles row by row makes
the blocks in flight share one row of A tiles but sweep all of B; walking down a group of
``kGroupM`` tile-rows before moving to the next tile-column makes them share both, so more
of each operand is served from L2.

- detect: a run of consecutive declarations in a kernel that maps the block index to a
  tile through "group" arithmetic (names with group in them, or a call of a function named
  swizzle or raster on ``blockIdx``); the site spans the run;
- remove and apply: refused. Any bijection from block ids to tiles computes the same
  output, but rewriting the run to the plain row-major order needs the tile counts and the
  tile origins identified, which is not done by rule here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from klineage.conditions import Condition, Prose
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import BLOCK_INDEX, names_in, statements
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem
from klineage.source import Edit, Function, Node, ParsedSource

REFUSAL = (
    "any bijection of block ids to tiles gives the same output, but rewriting this mapping "
    "to row-major order needs its tile counts and origins identified, which no rule does yet"
)
_GROUP = re.compile(r"(?i)group|swizzl|raster")


def _declared(source: ParsedSource, statement: Node) -> str | None:
    declarators = statement.children_by_field_name("declarator")
    if statement.type != "declaration" or len(declarators) != 1:
        return None
    name = declarators[0].child_by_field_name("declarator")
    return source.text_of(name) if name is not None else None


def raster_run(source: ParsedSource, function: Function) -> list[Node]:
    """The longest run of consecutive top-level declarations that each read a group-named
    value (or one declared earlier in the run), one of which reads the block index."""
    if function.body is None:
        return []
    best: list[Node] = []
    run: list[Node] = []
    names: set[str] = set()
    sentinel: list[Node | None] = [None]
    for statement in [*statements(function.body), *sentinel]:
        name = None if statement is None else _declared(source, statement)
        used = names_in(source, statement) if statement is not None and name else set()
        grouped = name is not None and (
            _GROUP.search(name) or any(_GROUP.search(u) for u in used) or used & names
        )
        if grouped and statement is not None:
            run.append(statement)
            names.add(name or "")
            continue
        touches_block = any(names_in(source, s) & BLOCK_INDEX for s in run)
        if touches_block and len(run) >= 2 and len(run) > len(best):
            best = run
        run, names = [], set()
    return best


@register
class Rasterization(Mechanism):
    name = "rasterization"
    category = "parallelism"
    family = "block and warp tiling"
    intent = (
        "Hand out output tiles to consecutive blocks in groups of tile-rows, so the blocks "
        "running together share operand tiles in L2."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            run = raster_run(source, function)
            if run:
                yield self.site(
                    source,
                    run[0],
                    span=(run[0].start_byte, run[-1].end_byte),
                    snippet=f"{function.name}: grouped block-to-tile mapping",
                    detail={"kernel": function.name},
                    refusal=REFUSAL,
                )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        return iter(())

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        raise self.refuse(REFUSAL, site)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        raise self.refuse(REFUSAL, site, "apply")

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text="the mapping from block ids to tiles is a bijection over the tile grid",
                why="every tile must be computed exactly once",
            )
        ]
