"""Reading register outer products: operand values loaded once per step of a reduction and
reused across a thread's outputs (the rewrite is ``_outer_product_removal``).

The form read::

    for (<reduction>) {                        (nested reduction loops: each the only
      float x[M];                               statement of the one around it)
      float y[N];                               (or arrays declared before the loops, or
                                                 received from a caller that only passes them)
      for (int u = 0; u < M; ++u) x[u] = X(u);  (fill loops: counted; declarations of
      for (int u = 0; u < N; ++u) y[u] = Y(u);   offsets, then `c[u] = E;` only)
      for (int i = 0; i < M; ++i) {             (output loops: counted, constant or
        float s = S(i);                          template-parameter trips; a scalar
        for (int j = 0; j < N; ++j)              declared per output row is a register too,
                                                 offsets declared per output move with it)
          A[i][j] += x[i] * y[j];               (or `fmaf`, or a flat mixed-radix index
                                                 `A[i * N + j]`; up to four output loops)
      }
    }

``A`` is an array (local, or the caller's) with one element per output; a factor is a
register value (an array filled in the turn, read at the slot its fill stores, or a scalar
declared in the turn) or an expression read in place. The removal interchanges the loops:
the output loops go outside and each output sums over the reduction into a scalar started
from and stored back into its element of ``A``, each product reading its operands where the
registers were filled from. Every output's sum still runs over the reduction in the same
order, so the results are the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klineage.cuda.cexpr import fold_int
from klineage.cuda.facts import compile_time_bindings
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    callee_name,
    declared_names,
    identifier_names,
    one_line,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    index_declaration,
    is_side_effect_free,
)
from klineage.mechanisms._outer_product_forms import (
    Counted,
    Update,
    array_parameter,
    braced,
    counted,
    flattened,
    items_of,
    local_array,
    update_of,
)
from klineage.mechanisms._outer_product_index import mixed_radix, unify
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import rename

NEEDED = (
    "a reduction loop whose turn loads operand values into registers (arrays filled by "
    "counted loops `c[u] = E;`, or scalars declared from one expression) and accumulates "
    "their products into a local array, `A[i][j] += x[i] * y[j]` or `fmaf`, over counted "
    "loops of the outputs, with nothing else in the turn"
)
MAX_OUTPUT_LOOPS = 4
"""Output loops read around one accumulation (a warp tile's sub-tiles of thread tiles)."""


def _one_output_each(source: ParsedSource, update: Update, outputs: list[Counted]) -> bool:
    """Whether every output (a tuple of the output loops' variables) has an accumulator of its
    own: one subscript per variable, or one flat mixed-radix index (``i * N + j``)."""
    variables = [o.variable for o in outputs]
    if sorted(update.subscripts) == sorted(variables):
        return True
    if len(update.indices) != 1:
        return False
    return mixed_radix(source, update.indices[0], variables, [o.limit for o in outputs])


@dataclass
class Cache:
    """An operand value held in registers for one turn of the reduction."""

    name: str
    declaration: Node
    array: bool
    """An array filled by a loop (else a scalar declared with its value)."""
    value: Node | None = None
    """The expression it holds (a scalar's initializer; an array's fill value)."""
    indices: tuple[str, ...] = ()
    """An array's fill-loop variables (outermost first), which ``value`` reads."""
    extents: tuple[Counted, ...] = ()
    """The fill loops, outermost first."""
    slot: tuple[Node, ...] = ()
    """An array's subscripts in the fill (``u``, ``w * TM + u``; ``[r][u]`` gives two)."""
    fill: Node | None = None
    """An array's (outermost) fill loop."""
    parameter: bool = False
    """An array the function receives (its caller's registers), left in place."""
    before: bool = False
    """Declared before the reduction loops (deleted with them), not in the turn."""
    scope: frozenset[str] = frozenset()
    """The output loops' variables in scope where it is declared (a scalar of an output)."""


@dataclass
class OuterProduct:
    """One outer-product accumulation and the loops around it."""

    function: Function
    update: Update
    outputs: list[Counted]
    """The output loops, outermost first (one or two)."""
    reductions: list[Node]
    """The reduction loops, outermost first; the last one's turn holds the caches."""
    caches: dict[str, Cache] = field(default_factory=dict)
    fill_locals: list[tuple[Node, tuple[str, ...], Node]] = field(default_factory=list)
    """Declarations in fill loops (``int r = r0 + u;``), with the variables of the fill loops
    around them and the outermost fill loop."""
    carried: list[str] = field(default_factory=list)
    """The fill loops' declarations as the interchanged turn declares them (its indices)."""
    locals: list[tuple[Node, frozenset[str]]] = field(default_factory=list)
    """Declarations of the turn or of an output that cache values read (offsets), with the
    output variables in scope there: they move into the interchanged turn."""

    @property
    def top(self) -> Node:
        return self.reductions[0]

    @property
    def turn(self) -> Node:
        body = self.reductions[-1].child_by_field_name("body")
        assert body is not None
        return body


def shape(source: ParsedSource, function: Function, statement: Node) -> OuterProduct | None:
    """The loops around an accumulation into a local array by the variables of the counted
    loops around it, with a reduction loop around those; None when ``statement`` is not one.
    Only the shape is read here; :func:`read_caches` checks the turn."""
    update = update_of(source, statement)
    if update is None:
        return None
    local = local_array(source, function, update.accumulator) is not None
    if not local and not array_parameter(source, function, update.accumulator):
        return None
    read = set().union(*(identifier_names(source, i) for i in update.indices))
    outputs: list[Counted] = []
    current = statement.parent
    while current is not None:
        if current.type == "compound_statement":
            current = current.parent
            continue
        loop = counted(source, current)
        if loop is None or loop.variable not in read or len(outputs) == MAX_OUTPUT_LOOPS:
            break
        if loop.variable in {o.variable for o in outputs}:
            return None
        outputs.insert(0, loop)
        current = current.parent
    if current is None or current.type != "for_statement" or not outputs:
        return None
    if not _one_output_each(source, update, outputs):
        return None
    reductions = [current]
    while True:
        block = reductions[0].parent
        outer = block.parent if block is not None else None
        if block is None or block.type != "compound_statement" or outer is None:
            break
        if outer.type != "for_statement" or items_of(source, block) != [reductions[0]]:
            break
        reductions.insert(0, outer)
    return OuterProduct(function, update, outputs, reductions)


def is_array(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether ``name`` is a local array of the function or an array (pointer) parameter."""
    return local_array(source, function, name) is not None or array_parameter(
        source, function, name
    )


def looks_cached(source: ParsedSource, product: OuterProduct) -> bool:
    """Whether a factor reads a value the reduction's turn loads (declares, or stores into a
    local array): what makes the accumulation an outer product of registers."""
    innermost = product.outputs[-1].node  # a value declared per output is not reused
    declared = {
        name
        for node in source.iter_nodes("declaration", within=product.turn)
        if not within(node, innermost)
        for name in declared_names(source, node)
    }
    stored = {
        source.text_of(chain[0])
        for node in source.iter_nodes("assignment_expression", within=product.turn)
        if (left := node.child_by_field_name("left")) is not None
        and (chain := subscript_chain(strip_parens(left))) is not None
    }
    for factor in product.update.factors:
        node = strip_parens(factor)
        chain = subscript_chain(node)
        name = source.text_of(chain[0]) if chain is not None else source.text_of(node)
        filled = chain is not None and name in stored and name != product.update.accumulator
        if filled and is_array(source, product.function, name):
            return True
        if (chain is not None or node.type == "identifier") and name in declared:
            return True
    return False


def read_caches(source: ParsedSource, product: OuterProduct) -> None:
    """Fill ``product.caches`` and check the turn holds nothing else; NotInForm otherwise."""
    _check_nest(source, product)
    outer = product.outputs[0].node
    for item in items_of(source, product.turn):
        if item == outer:
            continue
        if item.type == "declaration":
            _declare(source, product, item)
        elif item.type == "for_statement":
            _fill(source, product, item)
        else:
            raise _stray(source, item)
    for depth, loop in enumerate(product.outputs):
        scope = frozenset(o.variable for o in product.outputs[: depth + 1])
        for item in items_of(source, loop.node.child_by_field_name("body"))[:-1]:
            if item.type != "declaration":
                raise _stray(source, item)
            _declare(source, product, item, scope=scope)
    for cache in product.caches.values():
        if cache.value is None:
            raise NotInForm(f"a register array {cache.name} that no fill loop writes", NEEDED)
    _separate_locals(source, product)
    _check_factors(source, product)
    _carry_fill_locals(source, product)
    _check_values(source, product)
    _check_writes(source, product)


def _stray(source: ParsedSource, item: Node) -> NotInForm:
    return NotInForm(
        f"a turn that also runs `{one_line(source, item, 70)}` (line "
        f"{source.line_of(item.start_byte)})",
        NEEDED,
    )


def _separate_locals(source: ParsedSource, product: OuterProduct) -> None:
    """Scalars of the turn or of an output that no factor reads but cache values do (``const
    int row = ..``) are offsets, not caches: they move into the interchanged turn."""
    read_by_factors = set().union(*(identifier_names(source, f) for f in product.update.factors))
    values = [c.value for c in product.caches.values() if c.value is not None]
    read_by_values = set().union(*(identifier_names(source, v) for v in values))
    for name, cache in list(product.caches.items()):
        if cache.array or name in read_by_factors or name not in read_by_values:
            continue
        product.locals.append((cache.declaration, cache.scope))
        del product.caches[name]


def _carry_fill_locals(source: ParsedSource, product: OuterProduct) -> None:
    """A fill loop's declarations go into the interchanged turn with the fill loops' variables
    renamed to the output indices their registers are read at; refused where one fill loop's
    registers are read at different indices, or two declarations share a name."""
    outputs = {o.variable for o in product.outputs}
    read_at: dict[str, dict[str, str]] = {}
    for factor in product.update.factors:
        cache = factor_cache(source, product, factor)
        chain = subscript_chain(strip_parens(factor))
        if cache is not None and cache.array and chain is not None:
            read_at[cache.name] = slot_mapping(source, cache, chain[1]) or {}
    seen: set[str] = set()
    for declaration, variables, loop in product.fill_locals:
        readings = {
            tuple(read_at[c.name].get(v, "") for v in variables)
            for c in product.caches.values()
            if c.fill == loop
        }
        name = declared_names(source, declaration)
        if len(readings) != 1 or name & seen or not is_side_effect_free(source, declaration):
            raise NotInForm(
                f"a fill loop declaring `{one_line(source, declaration, 60)}` for registers read "
                "at different output indices",
                NEEDED,
            )
        if (identifier_names(source, declaration) - set(variables)) & outputs:
            raise NotInForm(
                f"a fill declaration `{one_line(source, declaration, 60)}` that reads a name the "
                "output loops would shadow",
                NEEDED,
            )
        seen |= name
        indices = dict(zip(variables, readings.pop(), strict=True))
        product.carried.append(flattened(rename(source, declaration, indices)))


def _check_nest(source: ParsedSource, product: OuterProduct) -> None:
    """The innermost output loop holds only the update; an outer one only its row's scalars
    and the inner loop; the outermost sits in the turn."""
    last = product.outputs[-1].node
    if items_of(source, last.child_by_field_name("body"))[-1:] != [product.update.statement]:
        raise NotInForm(
            f"output loops whose innermost body (line {source.line_of(last.start_byte)}) "
            "holds more than the accumulation",
            NEEDED,
        )
    for outer, inner in zip(product.outputs, product.outputs[1:], strict=False):
        rows = items_of(source, outer.node.child_by_field_name("body"))
        if not rows or rows[-1] != inner.node:
            raise NotInForm("output loops with statements after the inner loop", NEEDED)
    if product.outputs[0].node.parent != product.turn:
        raise NotInForm("output loops that are not directly in the reduction's turn", NEEDED)


def _declare(
    source: ParsedSource, product: OuterProduct, item: Node, scope: frozenset[str] = frozenset()
) -> None:
    declarators = item.children_by_field_name("declarator")
    qualifiers = {
        source.text_of(c)
        for c in item.children
        if c.type in ("type_qualifier", "storage_class_specifier")
    }
    if len(declarators) != 1 or qualifiers & {"static", "extern", "__shared__"}:
        raise _stray(source, item)
    declarator = declarators[0]
    if declarator.type == "array_declarator" and not scope:
        inner = declarator.child_by_field_name("declarator")
        while inner is not None and inner.type == "array_declarator":  # `T r[M][N]`
            inner = inner.child_by_field_name("declarator")
        if inner is None or inner.type != "identifier":
            raise _stray(source, item)
        name = source.text_of(inner)
        product.caches[name] = Cache(name, item, array=True)
        return
    declared = index_declaration(source, item)
    value = None if declared is None else braced(declared[2])
    if declared is None or value is None or value.type == "initializer_list":
        raise _stray(source, item)
    name = declared[0]
    product.caches[name] = Cache(name, item, array=False, value=value, scope=scope)


def _fill(source: ParsedSource, product: OuterProduct, loop: Node) -> None:
    """A fill: counted loops (nested, each holding the next after declarations of offsets),
    the innermost storing ``c[slot] = E;`` (one slot per subscript) into register arrays."""
    headers: list[Counted] = []
    current: Node | None = loop
    items: list[Node] = []
    while current is not None:
        header = counted(source, current)
        if header is None:
            raise NotInForm(
                f"a loop at line {source.line_of(current.start_byte)} in the turn that is not "
                "a counted fill of register arrays",
                NEEDED,
            )
        headers.append(header)
        items = items_of(source, current.child_by_field_name("body"))
        scope = tuple(h.variable for h in headers)
        while items and items[0].type == "declaration" and index_declaration(source, items[0]):
            product.fill_locals.append((items.pop(0), scope, loop))
        only = items[0] if len(items) == 1 else None
        current = only if only is not None and only.type == "for_statement" else None
    variables = tuple(h.variable for h in headers)
    for item in items:
        assignment = item.named_children[0] if item.type == "expression_statement" else None
        if assignment is None or assignment.type != "assignment_expression":
            raise _stray(source, item)
        left = assignment.child_by_field_name("left")
        value = assignment.child_by_field_name("right")
        operator = assignment.child_by_field_name("operator")
        chain = subscript_chain(strip_parens(left)) if left is not None else None
        cache = None if chain is None else _cache_named(source, product, chain[0])
        slot = () if chain is None else tuple(strip_parens(i) for i in chain[1])
        read = set().union(*(identifier_names(source, i) for i in slot))
        if (
            not slot
            or cache is None
            or not cache.array
            or operator is None
            or operator.type != "="
            or value is None
            or not set(variables) <= read
            or cache.value is not None
        ):
            raise NotInForm(
                f"a fill `{one_line(source, item, 70)}` (line {source.line_of(item.start_byte)}) "
                "that is not one `c[slot] = E;` per register array, its slot reading every "
                "fill loop's variable",
                NEEDED,
            )
        cache.value, cache.indices, cache.slot, cache.fill = value, variables, slot, loop
        cache.extents = tuple(headers)


def _cache_named(source: ParsedSource, product: OuterProduct, name_node: Node) -> Cache | None:
    """The register array a fill writes: declared in the turn, or before the loops (a local
    array the turn fills, which the removal then deletes)."""
    name = source.text_of(name_node)
    if name in product.caches:
        return product.caches[name]
    declaration = local_array(source, product.function, name)
    if declaration is not None:
        if within(declaration, product.top):
            return None
        if len(declaration.children_by_field_name("declarator")) != 1:
            return None
        product.caches[name] = Cache(name, declaration, array=True, before=True)
        return product.caches[name]
    parameter = next((p for p in product.function.params if p.name == name), None)
    if parameter is None or not array_parameter(source, product.function, name):
        return None
    if not registers_of_callers(source, product.function, name):
        raise NotInForm(
            f"a register array {name} the function receives, which a caller also uses "
            "elsewhere or passes from other than its own local array",
            NEEDED,
        )
    product.caches[name] = Cache(name, parameter.node, array=True, parameter=True)
    return product.caches[name]


def registers_of_callers(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether every call of ``function`` passes, for parameter ``name``, a local array of the
    caller that the caller uses only as an argument of calls to ``function``: what the
    function stores there is seen by no one else."""
    position = next(k for k, p in enumerate(function.params) if p.name == name)
    calls = [c for c in source.calls if callee_name(c.name) == function.name]
    if not calls:
        return False
    for call in calls:
        caller = source.enclosing_function(call.node)
        if caller is None or caller.body is None or len(call.args) <= position:
            return False
        passed = strip_parens(call.args[position])
        if passed.type != "identifier":
            return False
        array = source.text_of(passed)
        declaration = local_array(source, caller, array)
        if declaration is None:
            return False
        allowed = [a for c in calls if within(c.node, caller.body) for a in c.args]
        for node in source.iter_nodes("identifier", within=caller.body):
            if source.text_of(node) != array or within(node, declaration):
                continue
            if not any(node == strip_parens(a) for a in allowed):
                return False
    return True


def factor_cache(source: ParsedSource, product: OuterProduct, factor: Node) -> Cache | None:
    node = strip_parens(factor)
    chain = subscript_chain(node)
    if chain is not None:
        cache = product.caches.get(source.text_of(chain[0]))
        if cache is not None and cache.array:
            return cache
    if node.type == "identifier":
        cache = product.caches.get(source.text_of(node))
        if cache is not None and not cache.array:
            return cache
    return None


def slot_mapping(
    source: ParsedSource, cache: Cache, read: tuple[Node, ...]
) -> dict[str, str] | None:
    """The output index each fill variable stands for at a read of the register array (its
    subscripts): ``regM[w * TM + m]`` against the fill's ``regM[w * TM + i]`` gives
    ``{w: w, i: m}``; ``a[r][y]`` against ``a[u][v]`` gives ``{u: r, v: y}``."""
    if len(read) != len(cache.slot):
        return None
    found = unify(_subscripts(source, cache.slot), set(cache.indices), _subscripts(source, read))
    return found if found is not None and set(found) == set(cache.indices) else None


def _subscripts(source: ParsedSource, indices: tuple[Node, ...]) -> str:
    return " ] [ ".join(source.text_of(i) for i in indices)


def _short_fill(
    source: ParsedSource,
    product: OuterProduct,
    cache: Cache,
    mapping: dict[str, str],
) -> str | None:
    """How a fill loop's range falls short of the output loop its variable stands for
    (``i < 2, fewer than`` when ``m < 4`` is read), or None when every range covers. Bounds
    written differently are compared in every instantiation the file makes."""
    bounds = {o.variable: o for o in product.outputs}
    for fill in cache.extents:
        output = bounds[mapping[fill.variable]]
        same = "".join(fill.bound.split()) == "".join(output.bound.split())
        if same or (fill.trip and fill.trip == output.trip):
            continue
        covers = _covers(source, product.function, fill.limit, output.limit)
        if covers is not True:
            return f"{fill.variable} < {fill.bound}, " + (
                "fewer than" if covers is False else "which may be fewer than"
            )
    return None


def _covers(source: ParsedSource, function: Function, filled: Node, read: Node) -> bool | None:
    """Whether ``filled`` is at least ``read`` in every instantiation of the function; None
    when some instantiation's values are not known."""
    bindings = compile_time_bindings(source, function)
    if not bindings:
        return None
    for binding in bindings:
        names: dict[str, int | str] = {**source.integer_constants, **binding}
        low, high = fold_int(source, read, names), fold_int(source, filled, names)
        if low is None or high is None:
            return None
        if high < low:
            return False
    return True


def _check_factors(source: ParsedSource, product: OuterProduct) -> None:
    """Each factor is a cache read at an output index, or an expression that reads no cache;
    every cache is read by a factor and nowhere else in the function."""
    outputs = {o.variable for o in product.outputs}
    used: set[str] = set()
    for factor in product.update.factors:
        cache = factor_cache(source, product, factor)
        if cache is None:
            if identifier_names(source, factor) & set(product.caches):
                raise NotInForm(
                    f"a factor `{one_line(source, factor, 60)}` that computes with a register "
                    "value instead of reading it",
                    NEEDED,
                )
            continue
        if cache.array:
            chain = subscript_chain(strip_parens(factor))
            assert chain is not None
            mapping = slot_mapping(source, cache, chain[1])
            if mapping is None or not set(mapping.values()) <= outputs:
                raise NotInForm(
                    f"a register array {cache.name} read at `{one_line(source, chain[1][0], 40)}`"
                    ", not at the slot its fill stores with output loops' variables",
                    NEEDED,
                )
            short = _short_fill(source, product, cache, mapping)
            if short is not None:
                raise NotInForm(
                    f"a register array {cache.name} filled for {short} the outputs that read "
                    "it (the rest would read what an earlier turn left)",
                    NEEDED,
                )
        used.add(cache.name)
    unused = set(product.caches) - used
    if unused:
        raise NotInForm(
            f"a turn that also declares {', '.join(sorted(unused))}, which no factor reads",
            NEEDED,
        )
    body = product.function.body
    assert body is not None
    declarations = [c.declaration for c in product.caches.values()]
    for node in source.iter_nodes("identifier", within=body):
        if any(within(node, d) for d in declarations):
            continue
        if source.text_of(node) in product.caches and not within(node, product.turn):
            raise NotInForm(
                f"a register value {source.text_of(node)} also used at line "
                f"{source.line_of(node.start_byte)}, outside the turn",
                NEEDED,
            )


def _check_values(source: ParsedSource, product: OuterProduct) -> None:
    """Values read again per output must give what the turn read: no side effects, nothing
    the turn computes, and no name the moved loops would shadow."""
    outputs = [o.variable for o in product.outputs]
    for cache in product.caches.values():
        assert cache.value is not None
        names = identifier_names(source, cache.value)
        if not is_side_effect_free(source, cache.value):
            raise NotInForm(
                f"a register value {cache.name} loaded by `{one_line(source, cache.value, 60)}`"
                ", which has side effects",
                NEEDED,
            )
        if names & ({product.update.accumulator} | set(product.caches)):
            raise NotInForm(
                f"a register value {cache.name} computed from other registers of the turn",
                NEEDED,
            )
        own = set(cache.indices) if cache.array else set(cache.scope)
        captured = (names - own) & set(outputs)
        if captured:
            raise NotInForm(
                f"a register value {cache.name} that reads {', '.join(sorted(captured))}, a "
                "name the output loops would shadow",
                NEEDED,
            )
    for local, scope in product.locals:
        if not is_side_effect_free(source, local) or identifier_names(source, local) & (
            (set(outputs) - scope) | set(product.caches) | {product.update.accumulator}
        ):
            raise NotInForm(
                f"an offset `{one_line(source, local, 60)}` of the turn that the output loops "
                "would change",
                NEEDED,
            )
    for loop in product.reductions:
        header = _header_nodes(loop)
        if any(identifier_names(source, n) & set(outputs) for n in header):
            raise NotInForm(
                f"a reduction loop at line {source.line_of(loop.start_byte)} whose header "
                "reads a name of the output loops",
                NEEDED,
            )


def _header_nodes(loop: Node) -> list[Node]:
    return [
        n
        for n in (
            loop.child_by_field_name("initializer"),
            loop.child_by_field_name("condition"),
            loop.child_by_field_name("update"),
        )
        if n is not None
    ]


def _check_writes(source: ParsedSource, product: OuterProduct) -> None:
    """Moving the reduction inside the output loops repeats it per output: it may write only
    the accumulator, the caches and variables its own loops declare."""
    allowed = {product.update.accumulator, *product.caches}
    allowed |= declared_names(source, product.top)  # loop initializers are declarations
    written = assigned_names(source, product.top) - allowed
    if written:
        raise NotInForm(
            f"a reduction that also writes {', '.join(sorted(written))}, which a turn per "
            "output would write again",
            NEEDED,
        )
