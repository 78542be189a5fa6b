"""Forward on a tile of per-output sums kept in an accumulator array: up to four output loops,
each output summing over the reduction into a scalar started from and stored back into its
element, as the removal writes it::

    for (int w = 0; w < WM; ++w)                 (output loops: counted, nothing between
      for (int v = 0; v < WN; ++v)                them; constant or compile-time trips)
        for (int m = 0; m < TM; ++m)
          for (int n = 0; n < TN; ++n) {
            float s = acc[(w * TM + m) * (WN * TN) + v * TN + n];
            for (<reduction>) {                  (nested loops holding nothing else)
              int row = r0 + w * 16 + m;         (offsets: each reads one side's outputs)
              s += X(row) * Y(v, n);             (or `fmaf`)
            }
            acc[(w * TM + m) * (WN * TN) + v * TN + n] = s;
          }

``X`` reads some of the output loops (with the offsets that read them), ``Y`` the others. The
rewrite runs the reduction once: per turn, ``X`` for every combination of its loops into one
register array and ``Y`` for its loops into another (unrolled fills declaring their offsets
again), then the output loops accumulate the outer product into ``acc`` directly. Each output
sums the same products in the same order, so results are the same bits. Where one factor
reads no output loop (one output loop, the 1-D tiling of a column strip), it becomes one
register of the turn and the other is read per output: in place, or, where it has offsets,
as a value declared after them. The two-loop form with a sum used elsewhere is
``_outer_product_forward``.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    declared_names,
    identifier_names,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    index_declaration,
    is_side_effect_free,
    names_in_function,
)
from klineage.mechanisms._outer_product import MAX_OUTPUT_LOOPS, is_array
from klineage.mechanisms._outer_product_forms import (
    Counted,
    accumulation,
    counted,
    flattened,
    items_of,
    loop_header,
    nest,
    pragma_line,
    span_start,
)
from klineage.mechanisms._outer_product_forward import check_reductions, reduction_nest
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import column, fresh_name, substitute

NEEDED = (
    "counted output loops (one to four, nothing between them) whose innermost body starts a "
    "scalar sum from its element of an accumulator array, accumulates `s += X * Y` over "
    "reduction loops (offsets, then the update), and stores it back; X reading some output "
    "loops and Y the others (or none)"
)


@dataclass(frozen=True)
class TileSums:
    """Per-output sums of a tile, started from and stored back into their accumulator."""

    function: Function
    outputs: tuple[Counted, ...]
    """Outermost first."""
    declaration: Node
    """``T s = acc[...];``."""
    target: Node
    """The accumulator element, ``acc[...]`` (the sum's start)."""
    accumulator: str
    total: str
    reductions: tuple[Node, ...]
    """Outermost first."""
    offsets: tuple[Node, ...]
    """Declarations of the innermost reduction body, before the update."""
    update: Node
    factors: tuple[Node, Node]


def tile_sums(source: ParsedSource, function: Function, outer: Node) -> TileSums | None:
    """The candidate at an outer counted loop, or None when it is not in that form (or the
    loop is the only statement of a counted loop around it: the form starts there)."""
    parent = outer.parent
    around = parent.parent if parent is not None and parent.type == "compound_statement" else parent
    if (
        around is not None
        and counted(source, around) is not None
        and items_of(source, around.child_by_field_name("body")) == [outer]
    ):
        return None
    outputs: list[Counted] = []
    current: Node | None = outer
    items: list[Node] = []
    while current is not None and len(outputs) < MAX_OUTPUT_LOOPS:
        loop = counted(source, current)
        if loop is None:
            break
        outputs.append(loop)
        items = items_of(source, current.child_by_field_name("body"))
        current = items[0] if len(items) == 1 and items[0].type == "for_statement" else None
    if not outputs or len(items) != 3:
        return None
    declared = index_declaration(source, items[0])
    if declared is None or items[1].type != "for_statement":
        return None
    total, _, start = declared
    target = strip_parens(start)
    chain = subscript_chain(target)
    if chain is None or not is_array(source, function, source.text_of(chain[0])):
        return None
    store = "".join(source.text_of(items[2]).split())
    if store != "".join(f"{source.text_of(target)}={total};".split()):
        return None
    reductions = reduction_nest(source, items[1])
    body = items_of(source, reductions[-1].child_by_field_name("body"))
    if not body or any(i.type != "declaration" for i in body[:-1]):
        return None
    found = accumulation(source, body[-1])
    if found is None or source.text_of(strip_parens(found[0])) != total:
        return None
    return TileSums(
        function,
        tuple(outputs),
        items[0],
        target,
        source.text_of(chain[0]),
        total,
        tuple(reductions),
        tuple(body[:-1]),
        body[-1],
        (found[1], found[2]),
    )


@dataclass(frozen=True)
class _Side:
    """One factor's output loops and the offsets it reads."""

    loops: tuple[Counted, ...]
    offsets: tuple[Node, ...]


def sides(source: ParsedSource, form: TileSums) -> tuple[_Side, _Side, tuple[Node, ...]]:
    """Each factor's side and the offsets neither side reads; NotInForm when the reduction
    would not compute the same with the outputs inside it."""
    variables = [o.variable for o in form.outputs]
    reads: dict[str, set[str]] = {}  # a name an offset declares -> the output variables it reads
    read_by: dict[Node, set[str]] = {}  # the same, per offset

    def outputs_read(node: Node) -> set[str]:
        names = identifier_names(source, node)
        found = {v for v in variables if v in names}
        return found.union(*(read for name, read in reads.items() if name in names))

    for offset in form.offsets:
        if not is_side_effect_free(source, offset):
            raise NotInForm(f"an offset `{flattened(source.text_of(offset))}`", NEEDED)
        read_by[offset] = outputs_read(offset)
        for name in declared_names(source, offset):
            reads[name] = read_by[offset]
    owned: list[set[str]] = []
    for factor in form.factors:
        if form.total in identifier_names(source, factor) or not is_side_effect_free(
            source, factor
        ):
            raise NotInForm(f"a factor `{source.text_of(factor)}` with side effects", NEEDED)
        owned.append(outputs_read(factor))
    if owned[0] & owned[1] or owned[0] | owned[1] != set(variables):
        raise NotInForm(
            "factors that do not split the output loops between them (each output loop read "
            "by exactly one factor)",
            NEEDED,
        )
    check_reductions(source, form.reductions, set(variables) | {form.total}, form.total)
    for offset in form.offsets:
        if index_declaration(source, offset) is None:
            raise NotInForm(f"an offset `{flattened(source.text_of(offset))}`", NEEDED)
        if read_by[offset] and not any(read_by[offset] <= own for own in owned):
            raise NotInForm(
                f"an offset `{flattened(source.text_of(offset))}` read by both factors", NEEDED
            )
    first, second = (
        _Side(
            tuple(o for o in form.outputs if o.variable in own),
            tuple(o for o in form.offsets if read_by[o] and read_by[o] <= own),
        )
        for own in owned
    )
    shared = tuple(o for o in form.offsets if not read_by[o])
    return first, second, shared


def tile_application(
    source: ParsedSource, form: TileSums, names: tuple[str | None, str | None]
) -> tuple[int, int, str]:
    """(start, end, text) of the rewrite."""
    first, second, shared = sides(source, form)
    taken = names_in_function(source, form.function)
    type_node = form.declaration.child_by_field_name("type")
    element = source.text_of(type_node) if type_node is not None else "float"
    turn = [flattened(source.text_of(o)) for o in shared]
    reads: dict[tuple[int, int], str] = {}
    scalar = not first.loops or not second.loops
    in_place: list[str] = []  # a factor read per output, inside the output loops
    for k, (side, factor) in enumerate(zip((first, second), form.factors, strict=True)):
        offsets = [flattened(source.text_of(o)) for o in side.offsets]
        if scalar and side.loops and not offsets:
            continue  # read where it is
        base = names[k] or f"{form.accumulator}_{'lhs' if k == 0 else 'rhs'}"
        cache = fresh_name(taken, base)
        taken.add(cache)
        value = flattened(source.text_of(factor))
        if scalar:  # one value: per output where it reads them, else once a turn
            (in_place if side.loops else turn).extend(
                [*offsets, f"const {element} {cache} = {value};"]
            )
            reads[(factor.start_byte, factor.end_byte)] = cache
            continue
        slot = "".join(f"[{o.variable}]" for o in side.loops)
        turn.append(f"{element} {cache}{''.join(f'[{o.bound}]' for o in side.loops)};")
        headers = [("#pragma unroll", loop_header(source, o.node)) for o in side.loops]
        turn += nest("", headers, [*offsets, f"{cache}{slot} = {value};"]).split("\n")
        reads[(factor.start_byte, factor.end_byte)] = f"{cache}{slot}"
    target = flattened(source.text_of(form.target))

    def replace(node: Node) -> str | None:
        if node.type == "identifier" and source.text_of(node) == form.total:
            return target
        return reads.get((node.start_byte, node.end_byte))

    update = flattened(substitute(source, form.update, replace))
    outputs = [(pragma_line(o.pragma, None), loop_header(source, o.node)) for o in form.outputs]
    turn += nest("", outputs, [*in_place, update]).split("\n")
    reductions = [
        (pragma_line(source.pragma_before(r, "unroll"), None), loop_header(source, r))
        for r in form.reductions
    ]
    outer = form.outputs[0].node
    indent = " " * column(source, outer.start_byte)
    return span_start(source, outer), outer.end_byte, nest(indent, reductions, turn)
