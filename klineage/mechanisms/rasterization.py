"""Rasterization: a grouped (swizzled) order of output tiles over the block index.

Blocks with consecutive ids run together. Mapping ``blockIdx.x`` to tiles row by row makes
the blocks in flight share one row of A tiles but sweep all of B; walking down a group of
``kGroupM`` tile-rows before moving to the next tile-column makes them share both, so more
of each operand is served from L2.

- detect: a run of consecutive declarations in a kernel that maps the block index to a
  tile through group arithmetic: each reads the group size (a file-scope integer constant
  above 1 that bounds the last group in a ``min(...)``, e.g. ``kGroupM``) or a value declared
  earlier in the run, and one reads ``blockIdx``; the site spans the run. Other orders (a
  serpentine, a diagonal, a table handed out by a scheduler) are found by the index analysis
  (:mod:`klineage.mechanisms._raster_forms`); a serpentine whose branches are one walked
  backwards is removed to row-major (:mod:`klineage.mechanisms._raster_serpentine`, no
  forward rule), the others are refused with their form;
- remove: when the run reads the group-size constant, every read of it in the run becomes
  ``1 /* klineage:rasterization kGroupM */``. Groups of one tile-row are the plain row-major
  order, so the mapping stays a bijection and the output is the same; only the order in which
  blocks meet the tiles changes. A run without such a constant is refused: rewriting it to
  row-major would need its tile counts and origins identified, which no rule does;
- apply: the marked reads get their constant back; and on a kernel over a 2-D grid of tiles
  without an order of its own, a grouped order is written from scratch with ``group_rows``
  tile-rows a group (:mod:`klineage.mechanisms._raster_grouped`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._forms import form_site, removable_form_site
from klineage.mechanisms._raster_forms import raster_forms
from klineage.mechanisms._raster_grouped import DEFAULT_GROUP, grid_kernels, grouped_order
from klineage.mechanisms._raster_serpentine import serpentine_removal
from klineage.mechanisms._tiles_util import BLOCK_INDEX, names_in, statements
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

REFUSAL = (
    "any bijection of block ids to tiles gives the same output, but rewriting this mapping "
    "to row-major order needs its tile counts and origins identified, which no rule does yet"
)
_MARK = "klineage:rasterization"
_MARKED = re.compile(r"^/\*\s*klineage:rasterization\s+([A-Za-z_]\w*)\s*\*/$")


def _identifiers(source: ParsedSource, run: list[Node]) -> Iterator[Node]:
    for statement in run:
        yield from source.iter_nodes("identifier", within=statement)


def group_sizes(source: ParsedSource, statements_: list[Node]) -> set[str]:
    """File-scope integer constants above 1 that bound a group in a ``min(...)`` of the
    statements (``min(tiles_m - first_m, kGroupM)``): what the grouped order's size is,
    whatever it is called."""
    constants = source.integer_constants
    found = set()
    for statement in statements_:
        for call in source.iter_nodes("call_expression", within=statement):
            function = call.child_by_field_name("function")
            if function is None or source.text_of(function) not in ("min", "std::min"):
                continue
            for node in source.iter_nodes("identifier", within=call):
                value = constants.get(source.text_of(node))
                if isinstance(value, int) and value > 1:
                    found.add(source.text_of(node))
    return found


def group_size_reads(source: ParsedSource, run: list[Node]) -> tuple[str, list[Node]] | None:
    """The group-size constant the run reads and every read of it; None without one."""
    for name in sorted(group_sizes(source, run)):
        return name, [n for n in _identifiers(source, run) if source.text_of(n) == name]
    return None


def marked_reads(source: ParsedSource, run: list[Node]) -> list[tuple[int, int, str]]:
    """(start byte, end byte, constant) of each `1 /* klineage:rasterization NAME */` in the
    run. Found from the comments: tree-sitter may hang a trailing comment outside the
    expression its `1` ends, so the `1` is read back from the bytes before the comment."""
    found = []
    for statement in run:
        for comment in source.iter_nodes("comment", within=statement):
            match = _MARKED.match(source.text_of(comment))
            if match is None:
                continue
            before = source.data[: comment.start_byte].rstrip(b" \t")
            if before.endswith(b"1") and not before[-2:-1].isalnum():
                found.append((len(before) - 1, comment.end_byte, match.group(1)))
    return found


def _declared(source: ParsedSource, statement: Node) -> str | None:
    declarators = statement.children_by_field_name("declarator")
    if statement.type != "declaration" or len(declarators) != 1:
        return None
    name = declarators[0].child_by_field_name("declarator")
    return source.text_of(name) if name is not None else None


def _marked(source: ParsedSource, statement: Node) -> bool:
    return any(
        _MARKED.match(source.text_of(c)) for c in source.iter_nodes("comment", within=statement)
    )


def raster_run(source: ParsedSource, function: Function) -> list[Node]:
    """The longest run of consecutive top-level declarations that each read the group size
    (or a value declared earlier in the run, or hold a removal's mark), one of which reads
    the block index."""
    if function.body is None:
        return []
    sizes = group_sizes(source, statements(function.body))
    best: list[Node] = []
    run: list[Node] = []
    names: set[str] = set()
    sentinel: list[Node | None] = [None]
    for statement in [*statements(function.body), *sentinel]:
        name = None if statement is None else _declared(source, statement)
        used = names_in(source, statement) if statement is not None and name else set()
        grouped = name is not None and (
            bool(used & sizes) or bool(used & names) or _marked(source, statement)  # type: ignore[arg-type]
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

    def _runs(self, source: ParsedSource) -> Iterator[tuple[Function, list[Node]]]:
        for function in source.kernels:
            run = raster_run(source, function)
            if run:
                yield function, run

    def _site(
        self, source: ParsedSource, function: Function, run: list[Node], **extra: str
    ) -> Site:
        return self.site(
            source,
            run[0],
            span=(run[0].start_byte, run[-1].end_byte),
            snippet=f"{function.name}: grouped block-to-tile mapping",
            detail={"kernel": function.name},
            **extra,
        )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        seen: set[str] = set()
        for function, run in self._runs(source):
            seen.add(function.name)
            if group_size_reads(source, run) is not None:
                yield self._site(source, function, run)
            elif not marked_reads(source, run):  # marked: already groups of one, row-major
                yield self._site(source, function, run, refusal=REFUSAL)
        for form in raster_forms(source, seen):
            if form.kind == "serpentine":  # the serpentine removal may take it
                yield removable_form_site(
                    self, source, form, serpentine_removal, "serpentine", "as a serpentine"
                )
            else:
                yield form_site(self, source, form)

    carrier_keys: ClassVar[dict[str, str]] = {
        "group_rows": "tile-rows a group of consecutive blocks walks down before moving right"
    }

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        ordered = set()
        for function, run in self._runs(source):
            ordered.add(function.name)
            if marked_reads(source, run):
                yield self._site(source, function, run)
        ordered |= {f.function.name for f in raster_forms(source, ordered)}
        for kernel in grid_kernels(source, ordered):
            function = kernel.function
            assert function.body is not None
            yield self.site(
                source,
                function.node,
                span=(function.outer.start_byte, function.outer.end_byte),
                kind="function_definition",
                snippet=f"{function.name}: blocks over a 2-D grid of tiles, row by row",
                detail={"kernel": function.name, "form": "grid_2d"},
                refusal=kernel.refusal,
            )

    def _run_at(self, source: ParsedSource, site: Site) -> list[Node]:
        for function, run in self._runs(source):
            if function.name == site.function and run[0].start_byte == site.start_byte:
                return run
        return []

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == "serpentine":
            node = self.node_at(source, site)
            function = source.enclosing_function(node)
            assert function is not None
            return serpentine_removal(source, function, node)
        reads = group_size_reads(source, self._run_at(source, site))
        if reads is None:
            raise self.refuse(REFUSAL, site)
        name, nodes = reads
        return [Edit.replace(node, f"1 /* {_MARK} {name} */") for node in nodes]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == "grid_2d":
            for kernel in grid_kernels(source, set()):
                if kernel.function.name == site.function:
                    group = carrier.get_int("group_rows", DEFAULT_GROUP) or DEFAULT_GROUP
                    return grouped_order(source, kernel, group)
            raise self.refuse("no kernel over a 2-D grid here", site, "apply")
        marks = marked_reads(source, self._run_at(source, site))
        if not marks:
            raise self.refuse("no read of a group size marked by a removal here", site, "apply")
        constants = source.integer_constants
        missing = sorted({name for _, _, name in marks if name not in constants})
        if missing:
            raise self.refuse(f"the group size {missing[0]} is no longer defined", site, "apply")
        return [Edit(start, end, name) for start, end, name in marks]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        """The group size a detected grouped order reads, by value."""
        reads = group_size_reads(kernel.parsed, self._run_at(kernel.parsed, site))
        value = kernel.parsed.integer_constants.get(reads[0]) if reads else None
        return Carrier(group_rows=value) if isinstance(value, int) else Carrier()

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text="the mapping from block ids to tiles is a bijection over the tile grid",
                why="every tile must be computed exactly once",
            )
        ]
