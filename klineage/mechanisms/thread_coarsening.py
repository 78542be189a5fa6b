"""Thread coarsening: one thread computes several elements, and the grid shrinks to match.

Fewer, busier threads amortize the per-thread index math and launch overhead, and keep
several independent loads in flight per thread.

The canonical form (what ``apply`` writes) starts from the one-thread-per-element kernel::

    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    ...element code...

and gives each thread ``coarsen`` elements, ``blockDim.x`` apart so that a warp's accesses
stay contiguous (``layout=strided``, the default), or consecutive (``layout=contiguous``)::

    const int64_t i_first = (int64_t)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    #pragma unroll
    for (int i_step = 0; i_step < 4; ++i_step) {
      const int64_t i = i_first + (int64_t)i_step * blockDim.x;
      if (i >= n) return;           // later steps have larger i: nothing is left to do
      ...element code...            // its own `return`s become `continue`
    }

and every launch's grid becomes ``(n + 4 * block - 1) / (4 * block)`` blocks.

- remove: the canonical form back to one element per thread, with the grid enlarged to
  ``(n + block - 1) / block``. It checks the form by writing it again from the result and
  comparing. Coarsening written any other way (a loop ``for (k < K)`` over ``base + k *
  stride`` in a helper, register arrays indexed by it, as expert kernels write it) is
  reported with the reason it is refused: removing it needs the launch, the helpers and the
  arrays to change together, which a rule cannot do safely. Loads a block apart in one turn
  of a grid-stride loop are the exception (:mod:`klineage.mechanisms._coarsening_pairs`):
  the loop absorbs the change and the launch stays.
- apply: on a one-thread-per-element kernel whose element code reads no ``blockIdx``,
  ``threadIdx`` or ``gridDim`` and holds no barrier or warp collective; refused when a
  launch of the kernel is not in the file or its bound cannot be written at the launch. A
  vector kernel (what vectorized_access writes: ``if (i_vec * W >= n) return;``, then the
  vector path and the scalar tail) is such a kernel whose index stands for ``W`` elements:
  each thread takes ``coarsen`` vectors, and the grid covers ``W * coarsen`` elements a
  thread, so more loads are in flight per thread, as in PyTorch's vectorized elementwise
  kernels; the removal gives it back.
- apply, in two dimensions (``form=register_tile``): a one-output-per-thread shared-memory
  tiled product (what smem_staging writes on a naive GEMM) gets a ``tm x tn`` register
  micro-tile per thread, the block tile and the grid following
  (:mod:`klineage.mechanisms._register_tile`, which says why the rule lives here).
- apply, rows per block (``form=rows``, carrier ``rows``): a kernel with a block per row and
  the guard later rows also take gets ``rows`` rows a block in a counted loop, the grid
  divided to match; checked by removing it again
  (:mod:`klineage.mechanisms._coarsening_rows_forward`, the inverse of
  :mod:`klineage.mechanisms._coarsening_rows`).
- apply, loads per turn (``form=pairs``, carrier ``coarsen``, default 2): a grid-stride loop
  that accumulates one element a turn reads ``coarsen`` elements a block apart in each turn,
  its start and step scaled to match, the grid unchanged; checked by removing it again
  (:mod:`klineage.mechanisms._coarsening_pairs_forward`, the inverse of
  :mod:`klineage.mechanisms._coarsening_pairs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

from klineage.conditions import Condition
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._coarsening_chunks import chunk_loop_removal
from klineage.mechanisms._coarsening_forms import coarsening_forms
from klineage.mechanisms._coarsening_pairs import pair_loads_at, pair_of_loop
from klineage.mechanisms._coarsening_pairs_forward import (
    StrideLoop,
    loads_per_turn_edits,
    stride_loops,
)
from klineage.mechanisms._coarsening_rows import rows_loop_removal, rows_per_block_count
from klineage.mechanisms._coarsening_rows_forward import block_rows_of, rows_per_block_edits
from klineage.mechanisms._forms import form_site, removable_form_site
from klineage.mechanisms._local_util import (
    ElementKernel,
    Refused,
    binary,
    builtin_of,
    element_kernels,
    element_refusal,
    element_returns,
    element_text,
    grid_edits,
    identifiers,
    index_bound,
    index_declaration,
    loop_bound_jumps,
    names_in_function,
    scaled_index_bound,
    shift,
    splice,
    statements,
    strip_parens,
    unshift,
    walk,
)
from klineage.mechanisms._register_tile import (
    register_tile_edits,
    register_tile_of,
    tile_products,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

Layout = Literal["strided", "contiguous"]
DEFAULT_COARSEN = 4
DEFAULT_MICRO_TILE = 4
DEFAULT_STAGE = 16
WIDE_MICRO_TILE = 8
"""The wider register micro-tile raced beside the default on a staged product: 8 x 8 outputs
a thread on 128 x 128 block tiles, 64 fused multiply-adds for every 16 shared values read."""
REGISTER_TILE = "register_tile"
"""``Site.detail["form"]`` of a staged tile product that takes a register micro-tile."""
ROWS = "rows"
"""``Site.detail["form"]`` of rows per block: a block's counted loop over its rows (removal)
or a kernel with a block per row (apply)."""
DEFAULT_ROWS = 4
PAIRS = "pairs"
"""``Site.detail["form"]`` of loads a block apart in a grid-stride loop's turn (removal), or
of a grid-stride loop accumulating one element a turn (apply)."""
DEFAULT_PAIRS = 2


def _guard_text(source: ParsedSource, element: ElementKernel) -> str:
    """The guard that ends the thread once its index passes the bound."""
    if element.form == "return":
        return source.text_of(element.guard)
    return f"if ({element.name} >= {operand(source, element.bound, 10)}) return;"


def coarsened_text(
    source: ParsedSource, element: ElementKernel, coarsen: int, layout: Layout
) -> str:
    """The canonical coarsened form: the text from the index declaration to the end of the
    element code."""
    refusal = element_refusal(source, element, returns="nested")
    if refusal is not None:
        raise Refused(refusal)
    if not source.starts_line(element.decl.start_byte):
        raise Refused("the index declaration does not start its line")
    i = element.name
    first, step = f"{i}_first", f"{i}_step"
    clash = {first, step} & names_in_function(source, element.function)
    if clash:
        raise Refused(f"the names {', '.join(sorted(clash))} are already used")
    index = element.index
    if layout == "strided":
        start = splice(
            source,
            index.node.start_byte,
            index.node.end_byte,
            [(index.block_term, f"{source.text_of(index.block_term)} * {coarsen}")],
        )
        stride = operand(source, index.stride, 14)
        each = f"{first} + ({element.index_type}){step} * {stride}"
    else:
        start = f"({source.text_of(index.node)}) * {coarsen}"
        each = f"{first} + {step}"
    indent = source.indent_of(element.decl.start_byte)
    # the element's returns become `continue`: they end one element, not the thread
    body = element_text(source, element, [(n, "continue;") for n in element_returns(element)])
    return "\n".join(
        [
            f"{element.specifiers} {first} = {start};",
            f"{indent}#pragma unroll",
            f"{indent}for (int {step} = 0; {step} < {coarsen}; ++{step}) {{",
            f"{indent}  {element.specifiers} {i} = {each};",
            f"{indent}  {_guard_text(source, element)}{shift(body, 2)}",
            f"{indent}}}",
        ]
    )


# ---------------------------------------------------------------------------------------------
# The canonical form, recognized by writing it again
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Coarsened:
    function: Function
    decl: Node
    loop: Node
    coarsen: int
    layout: Layout
    bound: Node
    scalar: str
    """The one-element-per-thread text for [decl, loop)."""
    scale: int = 1
    """Elements an index stands for (a vector kernel's width), as in ElementKernel."""


def _code(text: str) -> str:
    # an unroll pragma is the pragma_unroll mechanism's, with or without a count
    kept = [line for line in text.split("\n") if not _is_unroll_pragma(line)]
    return " ".join(" ".join(kept).split())


def _is_unroll_pragma(line: str) -> bool:
    words = line.split()
    return words[:2] == ["#pragma", "unroll"] and all(w.isdigit() for w in words[2:])


def _step_loop(source: ParsedSource, node: Node, step: str) -> int | None:
    """C of ``for (int step = 0; step < C; ++step)``."""
    if node.type != "for_statement":
        return None
    init = node.child_by_field_name("initializer")
    condition = node.child_by_field_name("condition")
    parsed = index_declaration(source, init) if init is not None else None
    if parsed is None or parsed[0] != step or source.text_of(parsed[2]) != "0":
        return None
    sides = binary(strip_parens(condition), "<") if condition is not None else None
    if sides is None or source.text_of(sides[0]) != step:
        return None
    count = source.text_of(sides[1])
    return int(count) if count.isdigit() else None


def _uncoarsened_index(source: ParsedSource, value: Node, coarsen: int) -> tuple[str, Layout]:
    """The one-element index of ``i_first``'s initializer, and the layout it implies."""
    product = binary(strip_parens(value), "*")
    if product is not None and source.text_of(product[1]) == str(coarsen):
        inner = strip_parens(product[0])
        if inner.type != "parenthesized_expression" and product[0].type == (
            "parenthesized_expression"
        ):
            return source.text_of(inner), "contiguous"
    for node in walk(value):
        sides = binary(node, "*")
        if sides is not None and source.text_of(sides[1]) == str(coarsen):
            holds_block = any(builtin_of(source, n) == "blockIdx.x" for n in walk(sides[0]))
            if holds_block:
                text = splice(
                    source,
                    value.start_byte,
                    value.end_byte,
                    [(node, source.text_of(sides[0]))],
                )
                return text, "strided"
    raise Refused("the first index is not a coarsened global index")


def _write(coarsen: int, layout: Layout) -> Callable[[ParsedSource, int], str]:
    def write(temp: ParsedSource, start: int) -> str:
        element = next(e for e in element_kernels(temp, scaled=True) if e.start_byte == start)
        return coarsened_text(temp, element, coarsen, layout)

    return write


def _regenerates(
    source: ParsedSource,
    region: tuple[int, int],
    scalar: str,
    write: Callable[[ParsedSource, int], str],
) -> bool:
    data = source.data
    text = (data[: region[0]] + scalar.encode("utf-8") + data[region[1] :]).decode("utf-8")
    temp = KernelSource(text, name=source.kernel.name).parsed
    try:
        again = write(temp, region[0])
    except (Refused, StopIteration, AssertionError):
        return False
    return _code(again) == _code(source.text_of(region))


def _canonical_at(
    source: ParsedSource, function: Function, body: list[Node], position: int
) -> _Coarsened | None:
    decl = body[position]
    parsed = index_declaration(source, decl)
    if parsed is None or not parsed[0].endswith("_first"):
        return None
    first, specifiers, value = parsed
    i = first[: -len("_first")]
    rest = [n for n in body[position + 1 :] if n.type != "preproc_call"]
    if len(rest) != 1:
        return None
    loop = rest[0]
    coarsen = _step_loop(source, loop, f"{i}_step")
    loop_body = loop.child_by_field_name("body")
    if coarsen is None or loop_body is None or loop_body.type != "compound_statement":
        return None
    inner = statements(loop_body)
    if len(inner) < 3 or index_declaration(source, inner[0]) is None:
        return None
    guard = inner[1]
    clause = guard.child_by_field_name("condition")
    values = statements(clause) if clause is not None else []
    bound = index_bound(source, values[0], i, exits=True) if len(values) == 1 else None
    scale = 1
    if bound is None and len(values) == 1:
        bound, scale = scaled_index_bound(source, values[0], i) or (None, 1)
    if guard.type != "if_statement" or bound is None:
        return None
    try:
        index, layout = _uncoarsened_index(source, value, coarsen)
    except Refused:
        return None
    continues = [
        (node, "return;")
        for statement in inner[2:]
        for node in loop_bound_jumps(statement, ("continue_statement",))
        + ([statement] if statement.type == "continue_statement" else [])
    ]
    code = unshift(
        splice(source, guard.end_byte, loop_body.named_children[-1].end_byte, continues), 2
    )
    if code is None:
        return None
    indent = source.indent_of(decl.start_byte)
    scalar = f"{specifiers} {i} = {index};\n{indent}{source.text_of(guard)}{code}"
    if not _regenerates(source, (decl.start_byte, loop.end_byte), scalar, _write(coarsen, layout)):
        return None
    return _Coarsened(function, decl, loop, coarsen, layout, bound, scalar, scale)


def coarsened_kernels(source: ParsedSource) -> list[_Coarsened]:
    """The kernels in the canonical coarsened form."""
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        body = statements(function.body)
        for position in range(len(body) - 1):
            coarsened = _canonical_at(source, function, body, position)
            if coarsened is not None:
                found.append(coarsened)
    return found


# ---------------------------------------------------------------------------------------------
# Coarsening written by hand: detected, refused
# ---------------------------------------------------------------------------------------------


def _compile_time(source: ParsedSource, function: Function, node: Node) -> bool:
    text = source.text_of(node)
    return text.isdigit() or text in source.integer_constants or text in function.template_params


def _uses(source: ParsedSource, node: Node, name: str) -> bool:
    return any(source.text_of(n) == name for n in identifiers(source, node))


def _coarsened_index(source: ParsedSource, value: Node, k: str, limit: str) -> bool:
    """``base + k * stride`` (either order, casts allowed) or ``base * LIMIT + k``."""
    sides = binary(strip_parens(value), "+")
    if sides is None:
        return False
    for term, other in (sides, sides[::-1]):
        if _uses(source, other, k):
            continue
        product = binary(strip_parens(term), "*")
        if product is not None and any(_uses(source, f, k) for f in product):
            return True
        scaled = binary(strip_parens(other), "*")
        if (
            source.text_of(strip_parens(term)) == k
            and scaled is not None
            and any(source.text_of(f) == limit for f in scaled)
        ):
            return True
    return False


def _is_vector_lane(source: ParsedSource, value: Node, k: str) -> bool:
    """``i_vec * W + i_lane``: the lanes of a vectorized access (vectorized_access's form),
    where the elements of one thread are one vector, not coarsening."""
    sides = binary(strip_parens(value), "+")
    if sides is None or not k.endswith("_lane") or source.text_of(sides[1]) != k:
        return False
    product = binary(strip_parens(sides[0]), "*")
    return product is not None and source.text_of(product[0]) == k[: -len("_lane")] + "_vec"


@dataclass(frozen=True)
class _HandWritten:
    loop: Node
    limit: str
    index: Node


_FRAGMENT_FAMILIES = ("mma", "ldmatrix", "stmatrix", "wgmma", "wgmma_sync")
"""Warp-wide tensor-core instructions: a loop issuing them walks a warp's fragments (its warp
tile), which is not one thread's share of elements."""


def _fragment_loop(source: ParsedSource, loop: Node, fragments: list[int]) -> bool:
    """Whether the loop issues a warp-wide tensor-core instruction (`fragments`: where the
    file issues them, PTX inline, through a macro or a helper) or a wmma fragment call."""
    if any(loop.start_byte <= at < loop.end_byte for at in fragments):
        return True
    return "wmma::" in source.text_of(loop)


def handwritten(source: ParsedSource, skip: list[tuple[int, int]]) -> Iterator[_HandWritten]:
    """Loops ``for (int k = 0; k < K; ++k)`` with a compile-time ``K`` in device code whose
    body computes an element index from ``k`` (``base + k * stride``); not a loop over a
    warp's tensor-core fragments."""
    fragments = [
        site.node.start_byte for site in analysis(source).ptx.of_family(*_FRAGMENT_FAMILIES)
    ]
    for node in source.nodes("for_statement"):
        if any(start <= node.start_byte < end for start, end in skip):
            continue
        if _fragment_loop(source, node, fragments):
            continue
        function = source.enclosing_function(node)
        init = node.child_by_field_name("initializer")
        condition = node.child_by_field_name("condition")
        body = node.child_by_field_name("body")
        if function is None or not function.runs_on_device or None in (init, condition, body):
            continue
        assert init is not None and condition is not None and body is not None
        parsed = index_declaration(source, init)
        sides = binary(strip_parens(condition), "<")
        if parsed is None or sides is None or source.text_of(parsed[2]) != "0":
            continue
        k = parsed[0]
        if source.text_of(sides[0]) != k or not _compile_time(source, function, sides[1]):
            continue
        limit = source.text_of(sides[1])
        for statement in statements(body) if body.type == "compound_statement" else []:
            declared = index_declaration(source, statement)
            if declared is None or _is_vector_lane(source, declared[2], k):
                continue
            if _coarsened_index(source, declared[2], k, limit):
                yield _HandWritten(node, limit, statement)
                break


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


@register
class ThreadCoarsening(Mechanism):
    name = "thread_coarsening"
    category = "parallelism"
    family = "thread coarsening"
    intent = (
        "Give each thread several elements so index math and launch overhead are amortized "
        "and several independent loads are in flight per thread."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "coarsen": (
            f"elements per thread (default {DEFAULT_COARSEN}; loads per turn of a grid-stride "
            f"loop: default {DEFAULT_PAIRS})"
        ),
        "layout": "strided (elements blockDim.x apart, coalesced; default) or contiguous",
        "tm": f"register tile: output rows per thread (default {DEFAULT_MICRO_TILE})",
        "tn": f"register tile: output columns per thread (default {DEFAULT_MICRO_TILE})",
        "bk": f"register tile: k extent of a staged tile (default {DEFAULT_STAGE})",
        "rows": f"rows a block handles, for a kernel with a block per row (default {DEFAULT_ROWS})",
    }

    def _canonical(self, source: ParsedSource) -> list[_Coarsened]:
        cache = source.__dict__.setdefault("_klineage_coarsened", {})
        if "canonical" not in cache:
            cache["canonical"] = coarsened_kernels(source)
        found: list[_Coarsened] = cache["canonical"]
        return found

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        spans = []
        for found in self._canonical(source):
            spans.append((found.decl.start_byte, found.loop.end_byte))
            yield self.site(
                source,
                found.decl,
                span=spans[-1],
                detail={
                    "coarsen": found.coarsen,
                    "layout": found.layout,
                    "kernel": found.function.name,
                },
            )
        handwritten_loops = list(handwritten(source, spans))
        covered = spans + [(h.loop.start_byte, h.loop.end_byte) for h in handwritten_loops]
        for form in coarsening_forms(source, covered):
            if form.kind == PAIRS:  # loads a block apart in a grid-stride loop's turn
                yield removable_form_site(
                    self, source, form, pair_loads_at, PAIRS, "as loads per turn"
                )
            elif form.kind == "chunk":  # a block's chunk in a counted loop, one partial a block
                site = removable_form_site(
                    self, source, form, chunk_loop_removal, "chunk", "as a block's chunk"
                )
                if site.supported:
                    yield site
                    continue
                # or a block's rows in a counted loop, one row at a turn
                try:
                    rows_loop_removal(source, form.function, form.node)
                except NotInForm as why:
                    refusal = (
                        f"{site.refusal} (as rows per block, it is {why.form}; that removal "
                        f"needs {why.needed})"
                    )
                    yield site.model_copy(update={"refusal": refusal})
                    continue
                yield site.model_copy(
                    update={"refusal": None, "detail": {**site.detail, "form": ROWS}}
                )
            else:
                yield form_site(self, source, form)
        for loop in handwritten_loops:
            yield self.site(
                source,
                loop.loop,
                snippet=source.header(loop.loop),
                detail={"coarsen": loop.limit},
                refusal=(
                    f"each thread handles {loop.limit} elements through "
                    f"{source.snippet(loop.index, 60)!r}, not in the canonical form over a "
                    "one-element-per-thread kernel; one element per thread needs the launch, "
                    "the helpers and the register arrays indexed by it to change together"
                ),
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        yield from self._register_tile_candidates(source)
        yield from self._block_row_candidates(source)
        yield from self._loads_per_turn_candidates(source)
        for element in element_kernels(source, scaled=True):
            refusal = element_refusal(source, element, returns="nested")
            if refusal is None and not source.launches_of(element.function):
                refusal = f"no launch of {element.function.name} in this file"
            yield self.site(
                source,
                element.decl,
                span=(element.start_byte, element.end_byte),
                snippet=f"{element.function.name}: {source.snippet(element.decl)}",
                detail={"kernel": element.function.name},
                refusal=refusal,
            )

    def _register_tile_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Staged tile products (one output a thread, ``T x T`` threads): a register micro-tile
        a thread (:mod:`klineage.mechanisms._register_tile`)."""
        for function, loop, found in tile_products(source):
            yield self.site(
                source,
                loop,
                snippet=source.header(loop),
                detail={"kernel": function.name, "form": REGISTER_TILE},
                refusal=str(found) if isinstance(found, NotInForm) else None,
            )

    def _block_row_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Kernels with a block per row: several rows a block
        (:mod:`klineage.mechanisms._coarsening_rows_forward`)."""
        for function in source.kernels:
            try:
                form = block_rows_of(source, function)
            except NotInForm as why:
                first = function.body.named_children[0] if function.body else function.node
                yield self.site(
                    source,
                    first,
                    snippet=f"{function.name}: {why.form}",
                    detail={"kernel": function.name, "form": ROWS},
                    refusal=str(why),
                )
                continue
            if form is not None:
                yield self.site(
                    source,
                    form.row,
                    detail={"kernel": function.name, "form": ROWS},
                    refusal=None
                    if source.launches_of(function)
                    else (f"no launch of {function.name} in this file"),
                )

    def _loads_per_turn_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Grid-stride loops accumulating one element a turn: several loads a turn
        (:mod:`klineage.mechanisms._coarsening_pairs_forward`); not those that read several
        already (the removal's sites)."""
        coarsened = {
            form.node.start_byte for form in coarsening_forms(source, []) if form.kind == PAIRS
        }
        for found in stride_loops(source):
            if isinstance(found, StrideLoop):
                function, loop, refusal = found.function, found.loop, None
                span = found.span
            else:
                function, loop, why = found
                if loop.start_byte in coarsened:
                    continue
                refusal, span = str(why), (loop.start_byte, loop.end_byte)
            yield self.site(
                source,
                loop,
                span=span,
                snippet=f"{function.name}: {source.header(loop)}",
                detail={"kernel": function.name, "form": PAIRS},
                refusal=refusal,
            )

    def _loads_per_turn(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        factor = carrier.get_int("coarsen", DEFAULT_PAIRS) or 0
        if factor < 2:
            raise self.refuse(f"coarsen={factor} gives each turn one load", site, "apply")
        found = next(
            (
                f
                for f in stride_loops(source)
                if isinstance(f, StrideLoop) and f.span == (site.start_byte, site.end_byte)
            ),
            None,
        )
        if found is None:
            raise self.refuse("no grid-stride loop accumulating one element here", site, "apply")
        try:
            return loads_per_turn_edits(source, found, factor)
        except NotInForm as why:
            raise self.refuse(str(why), site, "apply") from why

    def _rows_per_block(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        rows = carrier.get_int("rows", DEFAULT_ROWS) or 0
        if rows < 2:
            raise self.refuse(f"rows={rows}: a block must take at least 2 rows", site, "apply")
        function = source.function(str(site.detail.get("kernel")))
        form = block_rows_of(source, function) if function is not None else None
        if form is None or form.row.start_byte != site.start_byte:
            raise self.refuse("no block-per-row kernel at this site", site, "apply")
        try:
            return rows_per_block_edits(source, form, rows)
        except NotInForm as why:
            raise self.refuse(str(why), site, "apply") from why

    def _register_tile(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        sizes = {
            key: carrier.get_int(key, DEFAULT_STAGE if key == "bk" else DEFAULT_MICRO_TILE)
            for key in ("tm", "tn", "bk")
        }
        tm, tn, bk = (sizes[key] or 0 for key in ("tm", "tn", "bk"))
        if min(tm, tn, bk) < 1 or tm * tn < 2:
            raise self.refuse(
                f"tm={tm}, tn={tn}, bk={bk}: each must be at least 1 and tm * tn at least 2",
                site,
                "apply",
            )
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        assert function is not None
        tile = register_tile_of(source, function, loop)
        shared = (tm + tn) * tile.tile * bk * 4
        if shared > 49152:
            raise self.refuse(
                f"the tiles need {shared} bytes of shared memory, over the 48 KiB of static "
                "shared memory a block may have",
                site,
                "apply",
            )
        return register_tile_edits(source, tile, tm, tn, bk)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == PAIRS:
            loop = self.node_at(source, site, "for_statement", "while_statement")
            function = source.enclosing_function(loop)
            assert function is not None
            return pair_loads_at(source, function, loop)
        if site.detail.get("form") == "chunk":
            loop = self.node_at(source, site, "for_statement")
            function = source.enclosing_function(loop)
            assert function is not None
            return chunk_loop_removal(source, function, loop)
        if site.detail.get("form") == ROWS:
            loop = self.node_at(source, site, "for_statement")
            function = source.enclosing_function(loop)
            assert function is not None
            return rows_loop_removal(source, function, loop)
        found = next(
            c
            for c in self._canonical(source)
            if (c.decl.start_byte, c.loop.end_byte) == (site.start_byte, site.end_byte)
        )
        try:
            grids = grid_edits(source, found.function, found.bound, found.scale)
        except Refused as refused:
            raise self.refuse(str(refused), site) from refused
        region = Edit(found.decl.start_byte, found.loop.end_byte, found.scalar)
        return [region] + [Edit.replace(node, text) for node, text in grids]

    def alternative_carriers(self, kernel: KernelSource) -> list[Carrier]:
        """On a staged tile product, an 8 x 8 register tile beside the default 4 x 4:
        a quarter of the blocks, twice the reuse of each shared value, and a grid that may
        leave SMs idle on a small output, which only a gate run can weigh."""
        staged = [c for c in self.candidates(kernel) if c.detail.get("form") == REGISTER_TILE]
        if not any(c.supported for c in staged):
            return []
        return [Carrier(tm=WIDE_MICRO_TILE, tn=WIDE_MICRO_TILE)]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("form") == ROWS:
            loop = self.node_at(kernel.parsed, site, "for_statement")
            function = kernel.parsed.enclosing_function(loop)
            rows = rows_per_block_count(kernel.parsed, function, loop) if function else None
            return Carrier(rows=rows) if rows is not None else Carrier()
        if site.detail.get("form") == PAIRS:
            loop = self.node_at(kernel.parsed, site, "for_statement", "while_statement")
            function = kernel.parsed.enclosing_function(loop)
            pair = pair_of_loop(kernel.parsed, function, loop) if function else None
            return Carrier(coarsen=pair[1]) if pair is not None else Carrier()
        coarsen = site.detail.get("coarsen")
        layout = site.detail.get("layout")
        if not isinstance(coarsen, int):
            return Carrier()
        return Carrier(coarsen=coarsen, layout=str(layout or "strided"))

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == REGISTER_TILE:
            return self._register_tile(source, site, carrier)
        if site.detail.get("form") == ROWS:
            return self._rows_per_block(source, site, carrier)
        if site.detail.get("form") == PAIRS:
            return self._loads_per_turn(source, site, carrier)
        coarsen = carrier.get_int("coarsen", DEFAULT_COARSEN)
        layout = carrier.get_str("layout", "strided")
        assert coarsen is not None
        if coarsen < 2:
            raise self.refuse(f"coarsen={coarsen} gives each thread one element", site, "apply")
        if layout not in ("strided", "contiguous"):
            raise self.refuse(f"layout={layout!r} is not 'strided' or 'contiguous'", site, "apply")
        chosen: Layout = "contiguous" if layout == "contiguous" else "strided"
        element = next(
            e for e in element_kernels(source, scaled=True) if e.start_byte == site.start_byte
        )
        try:
            text = coarsened_text(source, element, coarsen, chosen)
            grids = grid_edits(source, element.function, element.bound, coarsen * element.scale)
        except Refused as refused:
            raise self.refuse(str(refused), site, "apply") from refused
        region = Edit(element.start_byte, element.end_byte, text)
        return [region] + [Edit.replace(node, grid) for node, grid in grids]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        """None: the guard inside the loop handles any size, and the grid follows the
        factor at every launch."""
        return []
