"""Forward: turn a thread's per-output dot products inside out into register outer products.

The form taken: two counted output loops (compile-time trips), each output summing products
over a reduction into a scalar, then using it::

    for (int io = 0; io < M; ++io) {
      int i = i0 + io;                       (declarations of the row: optional)
      for (int jo = 0; jo < N; ++jo) {
        int j = j0 + jo;                     (declarations of the column: optional)
        float v = 0.0f;                      (a start that reads no output index)
        for (<reduction>) v += X * Y;        (one or more nested loops; or `fmaf`)
        out[i * ld + j] = v;                 (what the output does with its sum)
      }
    }

``X`` reads the row (``io`` or its declarations) and not the column, ``Y`` the column and not
the row. The rewrite sums into a register tile ``acc[M][N]`` started from ``v``'s start; per
turn of the reduction it loads ``X`` for every row into one register array and ``Y`` for every
column into another (unrolled fill loops that declare the row or column again), and
accumulates their outer product; then the output loops run again, each output taking its sum
from the tile. Each output still sums the same products in the same order, so results are the
same bits; a loaded value now serves ``N`` (or ``M``) outputs.

Where the start is the output's accumulator ``A[io][jo]`` of a local array and the output only
stores the sum back (what the removal writes), the products accumulate into ``A`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    declared_names,
    identifier_names,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    index_declaration,
    is_side_effect_free,
    names_in_function,
)
from klineage.mechanisms._outer_product_forms import (
    Counted,
    accumulation,
    counted,
    flattened,
    items_of,
    local_array,
    loop_header,
    nest,
    pragma_line,
    span_start,
)
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import column, fresh_name, substitute

NEEDED = (
    "two counted output loops whose inner body declares a scalar sum, accumulates `v += X * "
    "Y` (or `fmaf`) over reduction loops that hold nothing else, then uses it; X reading the "
    "row and not the column, Y the column and not the row"
)


@dataclass(frozen=True)
class Sums:
    """Per-output dot products: the candidate form."""

    function: Function
    outputs: tuple[Counted, Counted]
    row: tuple[Node, ...]
    """Declarations of the outer loop's body before the inner loop."""
    column: tuple[Node, ...]
    """Declarations of the inner loop's body before the sum."""
    declaration: Node
    """``T v = start;``."""
    total: str
    start: Node
    reductions: tuple[Node, ...]
    """Outermost first; the innermost holds only the update."""
    update: Node
    factors: tuple[Node, Node]
    after: tuple[Node, ...]
    """What the output does with its sum: the inner body after the reduction."""


def sums(source: ParsedSource, function: Function, outer: Node) -> Sums | None:
    """The candidate at an outer counted loop, or None when it is not in that form."""
    first = counted(source, outer)
    if first is None:
        return None
    items = items_of(source, outer.child_by_field_name("body"))
    if not items or any(i.type != "declaration" for i in items[:-1]):
        return None
    second = counted(source, items[-1])
    if second is None:
        return None
    inner = items_of(source, items[-1].child_by_field_name("body"))
    position = next((k for k, i in enumerate(inner) if i.type == "for_statement"), None)
    if position is None or position == 0 or inner[position - 1].type != "declaration":
        return None
    if any(i.type != "declaration" for i in inner[: position - 1]):
        return None
    declared = index_declaration(source, inner[position - 1])
    if declared is None:
        return None
    total, _, start = declared
    reductions = reduction_nest(source, inner[position])
    body = items_of(source, reductions[-1].child_by_field_name("body"))
    if len(body) != 1:
        return None
    factors = _scalar_update(source, body[0], total)
    if factors is None:
        return None
    return Sums(
        function,
        (first, second),
        tuple(items[:-1]),
        tuple(inner[: position - 1]),
        inner[position - 1],
        total,
        start,
        tuple(reductions),
        body[0],
        factors,
        tuple(inner[position + 1 :]),
    )


def reduction_nest(source: ParsedSource, first: Node) -> list[Node]:
    """A loop and the loops nested in it, each the only statement of the one around it."""
    loops = [first]
    while (
        (body := items_of(source, loops[-1].child_by_field_name("body")))
        and len(body) == 1
        and body[0].type == "for_statement"
    ):
        loops.append(body[0])
    return loops


def check_reductions(
    source: ParsedSource, reductions: tuple[Node, ...], outside: set[str], total: str
) -> None:
    """The reduction loops' headers read nothing of the outputs (``outside``), and they write
    only the sum and what they declare: one turn for all outputs computes the same."""
    for loop in reductions:
        for part in ("initializer", "condition", "update"):
            node = loop.child_by_field_name(part)
            if node is not None and identifier_names(source, node) & outside:
                raise NotInForm("a reduction whose loop header reads the output", NEEDED)
    written = assigned_names(source, reductions[0]) - {total}
    written -= declared_names(source, reductions[0])
    if written:
        raise NotInForm(
            f"a reduction that also writes {', '.join(sorted(written))}, which one turn for all "
            "outputs would write once",
            NEEDED,
        )


def _scalar_update(source: ParsedSource, statement: Node, total: str) -> tuple[Node, Node] | None:
    """(X, Y) of ``v += X * Y;`` or ``v = fmaf(X, Y, v);``."""
    found = accumulation(source, statement)
    if found is None or source.text_of(strip_parens(found[0])) != total:
        return None
    return found[1], found[2]


def _names(source: ParsedSource, nodes: tuple[Node, ...]) -> set[str]:
    return declared_names(source, nodes) if nodes else set()


def check(source: ParsedSource, form: Sums) -> tuple[int, int]:
    """For each factor, the output loop (0 outer, 1 inner) whose side it reads; NotInForm
    when the form would not stay the same computation with the reduction outside."""
    sides = [
        {form.outputs[0].variable} | _names(source, form.row),
        {form.outputs[1].variable} | _names(source, form.column),
    ]
    owners: list[int] = []
    for factor in form.factors:
        names = identifier_names(source, factor)
        reads = [k for k, side in enumerate(sides) if names & side]
        if len(reads) != 1:
            raise NotInForm(
                f"a factor `{source.text_of(factor)}` that reads "
                f"{'both the row and the column' if reads else 'neither the row nor the column'}",
                NEEDED,
            )
        if form.total in names or not is_side_effect_free(source, factor):
            raise NotInForm(f"a factor `{source.text_of(factor)}` with side effects", NEEDED)
        owners.append(reads[0])
    if sorted(owners) != [0, 1]:
        raise NotInForm("two factors that read the same side of the output", NEEDED)
    for declaration in (*form.row, *form.column):
        if not is_side_effect_free(source, declaration):
            raise NotInForm("a row or column declaration with side effects", NEEDED)
    if any(identifier_names(source, d) & sides[0] for d in form.column):
        raise NotInForm("a column declaration that reads the row", NEEDED)
    if identifier_names(source, form.start) & (sides[0] | sides[1]) and not _direct_target(
        source, form
    ):
        raise NotInForm(f"a sum that starts from `{source.text_of(form.start)}`", NEEDED)
    check_reductions(source, form.reductions, sides[0] | sides[1] | {form.total}, form.total)
    read = identifier_names(source, form.factors[0]) | identifier_names(source, form.factors[1])
    stored = assigned_names(source, form.after) | _stored_through(source, form.after)
    if stored & read:
        raise NotInForm(
            f"an output that writes {', '.join(sorted(stored & read))}, which later sums read",
            NEEDED,
        )
    return owners[0], owners[1]


def _stored_through(source: ParsedSource, nodes: tuple[Node, ...]) -> set[str]:
    """The names memory is written through in ``nodes`` (``p`` of ``p[i] = ..``, ``*p = ..``)."""
    found: set[str] = set()
    for root in nodes:
        for node in source.iter_nodes("assignment_expression", within=root):
            left = node.child_by_field_name("left")
            target = strip_parens(left) if left is not None else None
            chain = subscript_chain(target) if target is not None else None
            if chain is not None:
                found.add(source.text_of(chain[0]))
            elif target is not None and target.type == "pointer_expression":
                found |= identifier_names(source, target)
    return found


def _direct_target(source: ParsedSource, form: Sums) -> str | None:
    """``A[io][jo]`` when the sum starts from and is stored back into an element of a local
    array and nothing else happens to it (then the products accumulate there directly)."""
    if form.row or form.column or len(form.after) != 1:
        return None
    start = strip_parens(form.start)
    chain = subscript_chain(start)
    if chain is None or local_array(source, form.function, source.text_of(chain[0])) is None:
        return None
    target = source.text_of(start)
    store = "".join(source.text_of(form.after[0]).split())
    return target if store == "".join(f"{target}={form.total};".split()) else None


def application(
    source: ParsedSource, form: Sums, names: tuple[str | None, str | None]
) -> tuple[int, int, str]:
    """(start, end, text) of the rewrite."""
    owners = check(source, form)
    taken = names_in_function(source, form.function)
    element = source.text_of(form.declaration.child_by_field_name("type") or form.declaration)
    direct = _direct_target(source, form)
    tile = direct or fresh_name(taken, "acc")
    taken.add(tile)
    caches: list[str] = []
    for k, wanted in enumerate(names):
        base = wanted or f"{tile.split('[')[0]}_{'lhs' if k == 0 else 'rhs'}"
        caches.append(fresh_name(taken, base))
        taken.add(caches[-1])
    sides = (form.row, form.column)
    turn: list[str] = [
        f"{element} {cache}[{form.outputs[owner].bound}];"
        for cache, owner in zip(caches, owners, strict=True)
    ]
    for cache, owner, factor in zip(caches, owners, form.factors, strict=True):
        loop = form.outputs[owner]
        body = [flattened(source.text_of(d)) for d in sides[owner]]
        body.append(f"{cache}[{loop.variable}] = {source.text_of(factor)};")
        turn += nest("", [("#pragma unroll", loop_header(source, loop.node))], body).split("\n")
    element_of = "" if direct else f"[{form.outputs[0].variable}][{form.outputs[1].variable}]"
    reads = {
        (f.start_byte, f.end_byte): f"{c}[{form.outputs[o].variable}]"
        for f, c, o in zip(form.factors, caches, owners, strict=True)
    }

    def replace(node: Node) -> str | None:
        if node.type == "identifier" and source.text_of(node) == form.total:
            return tile + element_of
        return reads.get((node.start_byte, node.end_byte))

    update = substitute(source, form.update, replace)
    pragmas = [pragma_line(o.pragma, None if direct else "#pragma unroll") for o in form.outputs]
    headers = [(p, loop_header(source, o.node)) for p, o in zip(pragmas, form.outputs, strict=True)]
    turn += nest("", headers, [update]).split("\n")
    reductions = [
        (pragma_line(source.pragma_before(r, "unroll"), None), loop_header(source, r))
        for r in form.reductions
    ]
    outer = form.outputs[0].node
    indent = " " * column(source, outer.start_byte)
    text = nest(indent, reductions, turn)
    if direct is None:  # the tile starts from the sums' start and hands each output its sum
        declare = f"{indent}{element} {tile}[{form.outputs[0].bound}][{form.outputs[1].bound}];"
        start = nest(indent, headers, [f"{tile}{element_of} = {source.text_of(form.start)};"])
        per_column = [flattened(source.text_of(d)) for d in form.column]
        per_column.append(f"{element} {form.total} = {tile}{element_of};")
        per_column += [flattened(source.text_of(s)) for s in form.after]
        per_row = [flattened(source.text_of(d)) for d in form.row]
        per_row += nest("", [headers[1]], per_column).split("\n")
        text = "\n".join([declare, start, text, nest(indent, [headers[0]], per_row)])
    return span_start(source, outer), outer.end_byte, text
