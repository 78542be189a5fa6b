"""Staging written into a register-tiled matrix product that reads its operands straight from
global memory: the forward rule of the removal in :mod:`klineage.mechanisms._staging_helper`.

The form it takes: a loop over K by tiles that moves each operand's pointer one tile along K
after reading it, every read indexing by a tile-local index ``X`` split into a slot row and
column (in the kernel, or in a helper that gets the pointer)::

    for (int t = 0; t < K; t += BK) {
      reader<BM, ...>(.., A, B, .., K, N);    // reads A[X % BM * K + X / BM], and
      A += BK;                                 //       B[X % BN + X / BN * N]
      B += BK * N;
    }

``X / L`` moves by ``g_hi`` and the pointer by ``step`` a turn, so the tile has ``step /
g_hi`` rows of ``L`` slots (``step`` a product that ``g_hi`` divides factor by factor). What it
writes: a shared tile per operand, filled at the top of the loop by a generated loader that
every thread of the block runs (each copies a share of the tile's rows), a barrier after the
fill and one at the end of the turn, and each read ``P[X % L * g_lo + X / L * g_hi]`` turned
into ``S[X]``. A reader helper gets the tile where it got the pointer (its parameter renamed
to the tile's name) and loses the trailing parameters only the reads used::

    __shared__ float tile_a[BM * BK];
    for (int t = 0; t < K; t += BK) {
      stage_tiles<BM, BK, ...>(tile_a, A, .., K, N);
      __syncthreads();
      reader<BM, ...>(.., tile_a, tile_b, ..);  // reads tile_a[X]
      A += BK;
      B += BK * N;
      __syncthreads();
    }

A tile of floats is copied a ``float4`` at a time along its side that is contiguous in global
memory (four slot rows from one load for a tile stored transposed, else four slots), behind a
block-uniform test that every such access is aligned, the scalar loop in its ``else``. Where a
name of the kernel is its block's thread count at every launch, the loader counts turns by it
and unrolls, so a thread's loads are in flight together (counted at run time, each turn waits
for its load).

Slot ``hi * L + lo`` holds ``P[lo * g_lo + hi * g_hi]`` for ``lo < L`` and ``hi < step /
g_hi``, which is what ``P[X % L * g_lo + X / L * g_hi]`` read for ``X < L * step / g_hi``:
that every read stays inside the tile is what the tiling is for and is not proved here (the
removal assumes it the same way; the gate's check catches a read past the tile). The rest
holds by checks: the loop's trip count and the layout's names are block-uniform (every
thread reaches both barriers; each thread's loader fills the same slots), no return comes
before the loop, the kernel has no shared memory yet, the operands are never written, and
nothing the layout names or the pointers change before the last read of a turn. The removal
reads the loader back as the tiles it stages, so removing the staging again gives the
kernel back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_parameter
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    binary_operands,
    call_arguments,
    fresh_name,
    operator_of,
    statements,
    strip_parens,
    template_arguments,
    walk,
)
from klineage.mechanisms._staging import thread_names
from klineage.mechanisms._staging_helper import defined_callee
from klineage.mechanisms._staging_once import is_written
from klineage.mechanisms._tiles_util import (
    Locals,
    function_names,
    names_in,
    rename,
    with_comments_above,
)

__all__ = ["TileLoop", "advanced_pointers", "tile_loop", "tile_loop_edits"]

NEEDED = (
    "a top-level loop `for (v = 0; v < n; v += s)` of a kernel without shared memory that "
    "moves pointer parameters `P += step;` after its last read of them, each read `P[X % L * "
    "g_lo + X / L * g_hi]` (in the kernel, or in a helper called only there with P) with L, "
    "g_lo and g_hi the same for every read of P, block-uniform, L and step / g_hi constant"
)


VECTOR_ELEMENTS = frozenset({"float"})
"""Element types whose tiles the loader moves a ``float4`` at a time where addresses allow."""


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _flat(node: Node, operator: str) -> list[Node]:
    """The operands of a chain of one operator: ``a + b + c`` -> ``[a, b, c]``."""
    parts = binary_operands(node, operator)
    if parts is None:
        return [strip_parens(node)]
    return _flat(parts[0], operator) + _flat(parts[1], operator)


def _same(source: ParsedSource, a: Node, b: Node) -> bool:
    return "".join(source.text_of(a).split()) == "".join(source.text_of(b).split())


@dataclass(frozen=True)
class _Split:
    """An index ``X % low * g_low + X / low * g_high + rest`` (the strides as factor lists,
    empty for 1)."""

    tile: Node
    low: Node
    g_low: tuple[Node, ...]
    g_high: tuple[Node, ...]
    rest: tuple[Node, ...]


def _split(source: ParsedSource, index: Node) -> _Split | None:
    """The split of a read's index into a slot's column and row, or None."""
    terms = _flat(index, "+")
    found: dict[str, list[tuple[int, Node, Node, list[Node]]]] = {"%": [], "/": []}
    for position, term in enumerate(terms):
        factors = _flat(term, "*")
        for factor in factors:
            operator = operator_of(factor) if factor.type == "binary_expression" else None
            parts = binary_operands(factor, "%", "/")
            if operator in found and parts is not None:
                others = [f for f in factors if f != factor]
                found[operator].append((position, parts[0], parts[1], others))
    for low_term, tile, low, g_low in found["%"]:
        for high_term, high_tile, high, g_high in found["/"]:
            if low_term == high_term or not _same(source, tile, high_tile):
                continue
            if not _same(source, low, high):
                continue
            rest = tuple(t for i, t in enumerate(terms) if i not in (low_term, high_term))
            return _Split(tile, low, tuple(g_low), tuple(g_high), rest)
    return None


@dataclass
class _Operand:
    """One operand the loop reads and moves along K."""

    pointer: str
    """The kernel's pointer parameter."""
    element: str
    advance: Node
    """The statement ``P += step;``."""
    step: Node
    scope: Function
    """Where the reads are: the kernel, or the reader helper."""
    reads: list[tuple[Node, _Split]] = field(default_factory=list)
    reader: tuple[Node, int] | None = None
    """The reader's call and the position of the pointer among its arguments."""
    names: dict[str, str] = field(default_factory=dict)
    """The scope's names as kernel text (the reader's parameters: the call's arguments)."""


@dataclass(frozen=True)
class TileLoop:
    """A loop in the form above."""

    function: Function
    loop: Node
    operands: tuple[_Operand, ...]


def advanced_pointers(source: ParsedSource, function: Function, loop: Node) -> list[Node]:
    """The statements ``P += step;`` directly in ``loop``'s body that move a pointer parameter
    of the kernel; a loop with none is no candidate."""
    body = loop.child_by_field_name("body")
    pointers = {p.name for p in function.params if p.is_pointer and p.name}
    found = []
    for statement in statements(body) if body is not None else []:
        expression = statement.named_children[0] if statement.named_children else None
        if statement.type != "expression_statement" or expression is None:
            continue
        target = expression.child_by_field_name("left")
        if (
            expression.type == "assignment_expression"
            and operator_of(expression) == "+="
            and target is not None
            and target.type == "identifier"
            and source.text_of(target) in pointers
        ):
            found.append(statement)
    return found


def _wrapped(source: ParsedSource, node: Node) -> str:
    return _wrap(source.text_of(node))


def _scope_names(source: ParsedSource, reader: Function, call: Node) -> dict[str, str]:
    names = {
        p.name: _wrapped(source, a)
        for p, a in zip(reader.params, call_arguments(call), strict=False)
        if p.name
    }
    for name, argument in zip(reader.template_params, template_arguments(call), strict=False):
        names[name] = _wrapped(source, argument)
    return names


def _reads_of(source: ParsedSource, scope: Function, name: str, within: Node) -> list[Node]:
    """Every use of ``name`` in ``within``; NotInForm for one that is not a read ``name[e]``."""
    found = []
    for node in walk(within):
        if node.type != "identifier" or source.text_of(node) != name:
            continue
        if node.parent is not None and node.parent.type in (
            "pointer_declarator",
            "parameter_declaration",
        ):
            continue
        parent = node.parent
        index = parent.child_by_field_name("indices") if parent is not None else None
        if (
            parent is None
            or parent.type != "subscript_expression"
            or parent.children[0] != node
            or index is None
            or len(index.named_children) != 1
            or is_written(parent)
        ):
            raise _refuse(
                f"{name} used as `{source.snippet(parent or node, 60)}` in {scope.name}, not "
                f"read as `{name}[e]`"
            )
        found.append(parent)
    return found


def _operand(
    source: ParsedSource, function: Function, loop: Node, advance: Node, first: Node
) -> _Operand:
    """The reads of the pointer ``advance`` moves, in ``loop`` before ``first`` advance."""
    expression = advance.named_children[0]
    target, step = expression.child_by_field_name("left"), expression.child_by_field_name("right")
    assert target is not None and step is not None
    pointer = source.text_of(target)
    param = function.param(pointer)
    assert param is not None
    body = loop.child_by_field_name("body")
    assert body is not None
    operand = _Operand(pointer, param.base_type, advance, step, function)
    subscripts: list[Node] = []
    for node in walk(body):
        if node.type != "identifier" or source.text_of(node) != pointer:
            continue
        if advance.start_byte <= node.start_byte < advance.end_byte:
            continue
        parent = node.parent
        if node.start_byte >= first.start_byte:
            raise _refuse(f"{pointer} used after the loop moves a pointer (line {_line(node)})")
        if parent is not None and parent.type == "subscript_expression":
            subscripts += _reads_of(source, function, pointer, parent)
            continue
        outer = parent.parent if parent is not None else None
        reader = defined_callee(source, outer) if outer is not None else None
        if parent is None or parent.type != "argument_list" or outer is None or reader is None:
            raise _refuse(
                f"{pointer} used as `{source.snippet(parent or node, 60)}`, neither read as "
                f"`{pointer}[e]` nor passed to a helper defined here"
            )
        if (
            operand.reader is not None
            or len(analysis(source).call_graph.call_sites(reader.name)) != 1
        ):
            raise _refuse(f"{pointer} passed to {reader.name}, not a helper called only once")
        position = next(i for i, a in enumerate(call_arguments(outer)) if a == node)
        name = reader.params[position].name if position < len(reader.params) else None
        if reader.body is None or name is None:
            raise _refuse(f"{pointer} passed to {reader.name}, which has no body or name for it")
        if name in assigned_names(source, reader.body):
            raise _refuse(f"{reader.name}, which moves its parameter {name}")
        operand.scope, operand.reader = reader, (outer, position)
        operand.names = _scope_names(source, reader, outer)
        subscripts += _reads_of(source, reader, name, reader.body)
    if not subscripts:
        raise _refuse(f"a loop that moves {pointer} without reading it")
    for subscript in subscripts:
        index = subscript.child_by_field_name("indices")
        assert index is not None
        split = _split(source, index.named_children[0])
        if split is None:
            raise _refuse(
                f"a read `{source.snippet(subscript, 60)}`, whose index is not split into "
                "`X % L` and `X / L` of one tile-local index X"
            )
        operand.reads.append((subscript, split))
    return operand


def _line(node: Node) -> int:
    return node.start_point[0] + 1


def _layout_nodes(split: _Split) -> list[Node]:
    return [split.low, *split.g_low, *split.g_high, *split.rest]


def _key(source: ParsedSource, nodes: tuple[Node, ...]) -> list[str]:
    return sorted("".join(source.text_of(n).split()) for n in nodes)


def _layout_key(source: ParsedSource, split: _Split) -> list[list[str]]:
    return [_key(source, (split.low,)), *(_key(source, p) for p in (split.g_low, split.g_high))]


@dataclass(frozen=True)
class _Name:
    """A name a layout uses, as the loader declares and the kernel passes it."""

    kind: str
    """``template`` (a compile-time value), ``value`` (a runtime parameter) or ``constant``
    (a file-scope constant the loader sees as it is)."""
    type: str
    argument: str
    """The kernel's text for it."""


def _name(source: ParsedSource, function: Function, operand: _Operand, name: str) -> _Name:
    """How the loader gets a name of the operand's layout."""
    scope = operand.scope
    if name in analysis(source).constants:
        return _Name("constant", "", name)
    argument = operand.names.get(name, name)
    if name in scope.template_params:
        return _Name("template", "int", argument)
    param = scope.param(name)
    if param is not None:
        return _Name("value", param.type, argument)
    if scope is function and name in Locals(source, function).declared:
        declaration = Locals(source, function).declared[name][0][0]
        text = source.text_of(declaration)
        if text.startswith("constexpr") or text.startswith("static constexpr"):
            return _Name("template", "int", name)
        kind = source.local_types(function).get(name)
        if kind is not None:
            return _Name("value", kind, name)
    raise _refuse(f"a layout over {name}, which {scope.name} neither gets nor declares")


def _kernel_nodes(source: ParsedSource, operand: _Operand, node: Node) -> list[Node]:
    """The kernel expressions a layout expression stands for (the reader's arguments)."""
    if operand.reader is None:
        return [node]
    call, _ = operand.reader
    reader = operand.scope
    bound = dict(zip(reader.template_params, template_arguments(call), strict=False))
    bound |= {
        p.name: a for p, a in zip(reader.params, call_arguments(call), strict=False) if p.name
    }
    return [bound[n] for n in sorted(names_in(source, node)) if n in bound]


def _compile_time(source: ParsedSource, function: Function, name: str) -> bool:
    if name in function.template_params or name in analysis(source).constants:
        return True
    declared = Locals(source, function).declared.get(name, [])
    return len(declared) == 1 and "constexpr" in source.text_of(declared[0][0]).split()


def _extent(source: ParsedSource, function: Function, operand: _Operand, split: _Split) -> str:
    """The tile's rows: the pointer's step over the row stride, factor by factor."""
    names = operand.names
    factors = _flat(operand.step, "*")
    for factor in split.g_high:
        kernel = rename(source, factor, names) if names else source.text_of(factor)
        key = "".join(kernel.split()).strip("()")
        found = next((f for f in factors if "".join(source.text_of(f).split()) == key), None)
        if found is None:
            stride = " * ".join(source.text_of(f) for f in split.g_high)
            raise _refuse(
                f"{operand.pointer} moved by `{source.text_of(operand.step)}`, not a whole "
                f"number of rows of stride `{stride}` (a tile whose K side is its slot column, "
                "so its other side is unknown)"
            )
        factors.remove(found)
    for factor in factors:
        for name in names_in(source, factor):
            if not _compile_time(source, function, name):
                raise _refuse(
                    f"{operand.pointer} moved by `{source.text_of(operand.step)}`, a tile of "
                    f"rows that {name} counts at run time"
                )
    return " * ".join(source.text_of(f) for f in factors) if factors else "1"


def tile_loop(source: ParsedSource, function: Function, loop: Node) -> TileLoop:
    """The form of a candidate loop (one :func:`advanced_pointers` finds moves in);
    NotInForm says what differs."""
    body = loop.child_by_field_name("body")
    advances = advanced_pointers(source, function, loop)
    if function.body is None or loop.parent != function.body or body is None or not advances:
        raise _refuse("a loop that moves no pointer parameter, or not at the kernel's top level")
    variable = analysis(source).indices(function).loop_of(loop)
    if variable is None or variable.init.value != 0 or variable.bound is None:
        raise _refuse("a loop that does not count from 0 to a bound")
    locals_ = Locals(source, function)
    threads = set().union(*(thread_names(locals_, c) for c in "xyz"))
    header = [loop.child_by_field_name(f) for f in ("initializer", "condition", "update")]
    if any(h is not None and locals_.depends_on(h, threads, {variable.name}) for h in header):
        raise _refuse("a loop whose trip count depends on the thread, so a barrier is unsafe")
    for node in source.iter_nodes("return_statement", within=function.body):
        if node.start_byte < loop.start_byte:
            raise _refuse(f"a return before the loop (line {_line(node)}), which threads may take")
    if (
        any(
            function.node.start_byte <= d.node.start_byte < function.node.end_byte
            for d in source.shared_declarations
        )
        or analysis(source).shared(function).barriers
    ):
        raise _refuse(f"{function.name}, which already uses shared memory or barriers")
    first = min(advances, key=lambda a: a.start_byte)
    if any(s.start_byte > first.start_byte and s not in advances for s in statements(body)):
        raise _refuse("a loop whose pointer moves are not its last statements")
    operands = tuple(_operand(source, function, loop, a, first) for a in advances)
    if len({o.pointer for o in operands}) != len(operands):
        raise _refuse("a loop that moves one pointer twice")
    written = {
        a.buffer.name
        for scope in {function.name: function, **{o.scope.name: o.scope for o in operands}}.values()
        for a in analysis(source).indices(scope).accesses()
        if a.direction != "load"
    }
    moved = assigned_names(source, [s for s in statements(body) if s.start_byte < first.start_byte])
    for operand in operands:
        subscript, reference = operand.reads[0]
        read_as = subscript.child_by_field_name("argument")
        if {operand.pointer, source.text_of(read_as) if read_as else ""} & written:
            raise _refuse(f"a tile of {operand.pointer}, which the kernel also writes")
        for other, split in operand.reads[1:]:
            if _layout_key(source, split) != _layout_key(source, reference) or _key(
                source, split.rest
            ) != _key(source, reference.rest):
                raise _refuse(
                    f"reads of {operand.pointer} in two layouts (`{source.snippet(other, 60)}`)"
                )
        for node in _layout_nodes(reference):
            for kernel in _kernel_nodes(source, operand, node):
                if locals_.depends_on(kernel, threads):
                    raise _refuse(
                        f"a layout over `{source.text_of(kernel)}`, which differs between threads"
                    )
                if names_in(source, kernel) & moved:
                    raise _refuse(
                        f"a layout over `{source.text_of(kernel)}`, which the loop changes "
                        "before its reads"
                    )
            for name in names_in(source, node):
                _name(source, function, operand, name)
        for name in names_in(source, reference.low):
            if _name(source, function, operand, name).kind == "value":
                raise _refuse(
                    f"reads of {operand.pointer} in rows `{source.text_of(reference.low)}` wide, "
                    f"which {name} sets at run time"
                )
        _extent(source, function, operand, reference)
    return TileLoop(function, loop, operands)


# ---------------------------------------------------------------------------------------------
# The edits
# ---------------------------------------------------------------------------------------------


@dataclass
class _Loader:
    """The generated loader's parameters: name -> how it is declared and passed."""

    templates: dict[str, _Name] = field(default_factory=dict)
    pointers: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, name, argument) of its tile and global pointer parameters, in order."""
    values: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, name, argument) of the values the layouts name, after the pointers."""
    lines: list[str] = field(default_factory=list)

    def names(self) -> set[str]:
        return {n for _, n, _ in self.pointers + self.values} | set(self.templates)

    def need(self, name: str, wanted: _Name) -> None:
        if wanted.kind == "constant":
            return
        known = self.templates.get(name) or next(
            (_Name("value", t, a) for t, n, a in self.values if n == name), None
        )
        if known is not None:
            if _template_argument(known.argument) != _template_argument(wanted.argument):
                raise _refuse(f"layouts that name {name} for two kernel values")
            return
        if wanted.kind == "template":
            self.templates[name] = wanted
        else:
            self.values.append((wanted.type, name, wanted.argument))


def _text(source: ParsedSource, nodes: tuple[Node, ...]) -> str:
    return " * ".join(source.text_of(n) for n in nodes)


def tile_loop_edits(source: ParsedSource, tiles: TileLoop, names: list[str]) -> list[Edit]:
    """The edits that stage each operand's tile (see the module docstring); ``names``
    suggests the tiles' names, one per operand in order.

    Where a compile-time name of the kernel is its block's thread count at every launch
    (:func:`klineage.cuda.facts.block_size_parameter`), the loader counts threads by it: its
    loops then run a compile-time number of times and unroll, so a thread's loads are all in
    flight before its first store (counted at run time, each turn waits for its load)."""
    threads = block_size_parameter(source, tiles.function, before=tiles.loop.start_byte)
    if threads is not None:
        try:
            return _tile_loop_edits(source, tiles, names, threads)
        except NotInForm:
            pass  # a layout names the count's parameter for another value
    return _tile_loop_edits(source, tiles, names, None)


def _tile_loop_edits(
    source: ParsedSource, tiles: TileLoop, names: list[str], threads: str | None
) -> list[Edit]:
    function, loop = tiles.function, tiles.loop
    body = loop.child_by_field_name("body")
    assert body is not None and function.body is not None
    taken = set(function_names(source, function))
    for operand in tiles.operands:
        taken |= function_names(source, operand.scope)
    taken |= {f.name for f in source.functions}
    loader_name = fresh_name(taken, "stage_tiles")
    taken.add(loader_name)
    loader = _Loader()
    edits: list[Edit] = []
    declarations = []
    indent = source.indent_of(loop.start_byte)
    row, col = fresh_name(taken, "hi"), fresh_name(taken | {"hi"}, "lo")
    thread, count = fresh_name(taken, "thread"), fresh_name(taken, "threads")
    taken |= {row, col, thread, count}
    flat, quad, base = (fresh_name(taken, n) for n in ("slot", "quad", "base"))
    taken |= {flat, quad, base}
    if threads is not None:
        count = threads
        loader.need(threads, _Name("template", "int", threads))
    guards: list[str] = []
    fast: list[str] = []  # each tile's vector loop where it has one, else its scalar loop
    scalars: list[str] = []
    for operand, suggested in zip(tiles.operands, names, strict=True):
        tile = fresh_name(taken, suggested)
        taken.add(tile)
        split = operand.reads[0][1]
        for node in _layout_nodes(split):
            for name in sorted(names_in(source, node)):
                loader.need(name, _name(source, function, operand, name))
        low = source.text_of(split.low)
        kernel_low = rename(source, split.low, operand.names) if operand.names else low
        vectorized = operand.element in VECTOR_ELEMENTS and not (split.g_low and split.g_high)
        flat_loops = vectorized or threads is not None
        if strip_parens(split.low).type != "identifier" and (
            flat_loops or strip_parens(split.low).type != "number_literal"
        ):
            # the removal reads the slot's row stride as one compile-time name of the loader
            low = fresh_name(taken, "COLS")
            taken.add(low)
            loader.need(low, _Name("template", "int", _template_argument(kernel_low)))
        rows = _extent(source, function, operand, split)
        # the tile's rows as the loader sees them: a compile-time name passed to the reader
        # too when there is one
        scope = operand.scope
        compile_time = {n: operand.names.get(n, n) for n in scope.template_params}
        rows_name = next((n for n, v in compile_time.items() if v == _wrap(rows)), None)
        if rows_name is None or rows_name in taken - set(compile_time):
            rows_name = fresh_name(taken, "ROWS")
            taken.add(rows_name)
        loader.need(rows_name, _Name("template", "int", _template_argument(rows)))
        # the global pointer under the reader's name for it, which the removal gives back
        pointer_name = operand.pointer
        if operand.reader is not None:
            _, position = operand.reader
            pointer_name = operand.scope.params[position].name or operand.pointer
        if pointer_name in loader.names():
            pointer_name = fresh_name(taken | loader.names(), pointer_name)
        loader.pointers += [
            (f"{operand.element} *", tile, tile),
            (f"const {operand.element} *", pointer_name, operand.pointer),
        ]
        offset = [f"{col} * {_wrap(_text(source, split.g_low))}" if split.g_low else col]
        offset.append(f"{row} * {_wrap(_text(source, split.g_high))}" if split.g_high else row)
        offset += [source.text_of(r) for r in split.rest]
        store = f"{tile}[{row} * {low} + {col}] = {pointer_name}[{' + '.join(offset)}];"
        names_ = _LoopNames(row, col, flat, quad, thread, count, base if threads else None)
        scalar = _scalar_lines(split, store, names_, rows_name, low)
        scalars += scalar
        if vectorized:
            guards.append(_aligned_text(source, split, pointer_name, rows_name, low))
            fast += _vector_lines(split, (tile, pointer_name, offset), names_, rows_name, low)
        else:
            fast += scalar
        aligned = "__align__(16) " if vectorized and not split.g_low else ""
        declarations.append(
            f"__shared__ {aligned}{operand.element} {tile}[{_wrap(kernel_low)} * {_wrap(rows)}];"
            f"\n{indent}"
        )
        edits += _read_edits(source, operand, tile)
    # one test for every tile, so the vector loads of all tiles share a block and are in
    # flight together (a test a tile kept each tile's loads behind the last one's stores)
    guard = " &&\n      ".join(guards)
    loader.lines += (
        [
            f"  if ({guard}) {{",
            *(f"  {line}" for line in fast),
            "  } else {",
            *(f"  {line}" for line in scalars),
            "  }",
        ]
        if guards
        else scalars
    )
    edits += _unused_tails(source, tiles.operands)
    edits.append(
        Edit.insert(
            with_comments_above(source, function.outer).start_byte,
            _loader_text(loader, loader_name, thread, None if threads else count),
        )
    )
    edits.append(Edit.insert(loop.start_byte, "".join(declarations)))
    inner = statements(body)
    step_in = source.indent_of(inner[0].start_byte)
    template = ", ".join(v.argument.strip() for v in loader.templates.values())
    arguments = ", ".join(a for _, _, a in loader.pointers + loader.values)
    call = (
        f"{loader_name}<{template}>({arguments});" if template else f"{loader_name}({arguments});"
    )
    edits.append(Edit.insert(inner[0].start_byte, f"{call}\n{step_in}__syncthreads();\n{step_in}"))
    # after the last statement and a comment that ends its line
    last = [c for c in body.children if c.type != "}"][-1]
    edits.append(Edit.insert(last.end_byte, f"\n{step_in}__syncthreads();"))
    return edits


@dataclass(frozen=True)
class _LoopNames:
    """The loader's local names: slot row and column, flat slot, vector, thread, threads."""

    row: str
    col: str
    flat: str
    quad: str
    thread: str
    count: str
    base: str | None = None
    """The unrolled loops' counter, where ``count`` is a compile-time name (else None)."""


def _flat_loop(n: _LoopNames, total: str, width: int, body: list[str]) -> list[str]:
    """A loop over a tile's slots, ``width`` a thread a turn, around ``body`` (which reads
    the slot as ``n.flat``): counted from the thread's first slot, or, with a compile-time
    thread count, from 0 (unrolled, a guard for the last turn)."""
    step = f"{n.count} * {width}" if width > 1 else n.count
    first = f"{n.thread} * {width}" if width > 1 else n.thread
    if n.base is None:
        head = f"  for (int {n.flat} = {first}; {n.flat} < {total}; {n.flat} += {step}) {{"
        return [head, *body, "  }"]
    return [
        "  #pragma unroll",
        f"  for (int {n.base} = 0; {n.base} < {total}; {n.base} += {step}) {{",
        f"    const int {n.flat} = {n.base} + {first};",
        f"    if ({n.flat} < {total}) {{",
        *(f"  {line}" for line in body),
        "    }",
        "  }",
    ]


def _slot_lines(split: _Split, n: _LoopNames, rows: str, low: str) -> list[str]:
    """The slot row and column of the flat slot: for a tile stored transposed (a slot row
    runs along the operand's contiguous dimension), consecutive slots walk a slot column, so
    a warp reads runs of global memory instead of one element of each of 32 rows."""
    if split.g_low and not split.g_high:
        return [
            f"    const int {n.row} = {n.flat} % {rows};",
            f"    const int {n.col} = {n.flat} / {rows};",
        ]
    return [
        f"    const int {n.row} = {n.flat} / {low};",
        f"    const int {n.col} = {n.flat} % {low};",
    ]


def _scalar_lines(split: _Split, store: str, n: _LoopNames, rows: str, low: str) -> list[str]:
    """A loader loop that copies a tile an element at a time."""
    if n.base is not None or (split.g_low and not split.g_high):
        body = [*_slot_lines(split, n, rows, low), f"    {store}"]
        return _flat_loop(n, f"{rows} * {_wrap(low)}", 1, body)
    return [
        f"  for (int {n.row} = 0; {n.row} < {rows}; ++{n.row}) {{",
        f"    for (int {n.col} = {n.thread}; {n.col} < {low}; {n.col} += {n.count}) {{",
        f"      {store}",
        "    }",
        "  }",
    ]


def _aligned_text(source: ParsedSource, split: _Split, pointer: str, rows: str, low: str) -> str:
    """The block-uniform test that every 16-byte access of the vector loop is aligned: the
    contiguous side a multiple of 4 (folded at compile time), the stride too, and the base."""
    side, stride = (rows, split.g_low) if split.g_low else (low, split.g_high)
    stride_text = _wrap(_text(source, stride)) if stride else "1"
    base = " + ".join([pointer, *(_wrap(source.text_of(r)) for r in split.rest)])
    return (
        f"{_wrap(side)} % 4 == 0 && {stride_text} % 4 == 0 && "
        f"reinterpret_cast<unsigned long long>({base}) % 16 == 0"
    )


def _vector_lines(
    split: _Split, buffers: tuple[str, str, list[str]], n: _LoopNames, rows: str, low: str
) -> list[str]:
    """A loader loop that moves a tile four elements at a time: a ``float4`` load split over
    four slot rows for a tile stored transposed, else ``float4`` copies along its rows.
    Each thread starts at four times its index, so a warp's loads stay contiguous."""
    tile, pointer, offset = buffers
    load = f"reinterpret_cast<const float4 *>(&{pointer}[{' + '.join(offset)}])[0]"
    lines = _slot_lines(split, n, rows, low)
    if split.g_low:
        lines.append(f"    const float4 {n.quad} = {load};")
        for lane, component in enumerate("xyzw"):
            slot_row = f"({n.row} + {lane})" if lane else n.row
            lines.append(f"    {tile}[{slot_row} * {low} + {n.col}] = {n.quad}.{component};")
    else:
        lines += [
            f"    reinterpret_cast<float4 *>(&{tile}[{n.row} * {low} + {n.col}])[0] =",
            f"        {load};",
        ]
    return _flat_loop(n, f"{rows} * {_wrap(low)}", 4, lines)


def _template_argument(text: str) -> str:
    """A template argument needs parentheses only around a ``>``."""
    stripped = text.strip()
    while stripped.startswith("(") and stripped.endswith(")") and stripped.count("(") == 1:
        stripped = stripped[1:-1].strip()
    return f"({stripped})" if ">" in stripped else stripped


def _wrap(text: str) -> str:
    """``text`` as a primary expression: a name or number as it is, anything else in
    parentheses (once)."""
    stripped = text.strip()
    if re.fullmatch(r"[\w.]+", stripped) or (
        stripped.startswith("(") and stripped.endswith(")") and stripped.count("(") == 1
    ):
        return stripped
    return f"({stripped})"


def _loader_text(loader: _Loader, name: str, thread: str, count: str | None) -> str:
    template = ", ".join(f"{v.type} {n}" for n, v in loader.templates.items())
    params = ", ".join(
        f"{t}{'' if t.endswith('*') else ' '}{n}" for t, n, _ in loader.pointers + loader.values
    )
    lines = [f"template <{template}>"] if template else []
    lines += [
        f"__device__ void {name}({params}) {{",
        "  // every thread of the block copies its share of each tile's rows",
        f"  const int {thread} = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + "
        "threadIdx.x;",
        *([f"  const int {count} = blockDim.x * blockDim.y * blockDim.z;"] if count else []),
        *loader.lines,
        "}",
    ]
    return "\n".join(lines) + "\n\n"


def _read_edits(source: ParsedSource, operand: _Operand, tile: str) -> list[Edit]:
    """Each read ``P[X % L * g + X / L * h]`` becomes ``S[X]``; a reader gets the tile for
    the pointer and loses the trailing parameters nothing reads any more."""
    edits = [
        Edit.replace(subscript, f"{tile}[{source.text_of(strip_parens(split.tile))}]")
        for subscript, split in operand.reads
    ]
    if operand.reader is None:
        return edits
    call, position = operand.reader
    reader = operand.scope
    assert reader.body is not None
    param = reader.params[position]
    for node in walk(param.node):
        if node.type == "identifier" and source.text_of(node) == param.name:
            edits.append(Edit.replace(node, tile))
    edits.append(Edit.replace(call_arguments(call)[position], tile))
    return edits


def _used_after(source: ParsedSource, body: Node, name: str, reads: list[_Split | Node]) -> bool:
    """Whether ``name`` is still read in ``body`` once the reads (subscripts, each given with
    its split) are rewritten to keep only their tile-local index."""
    gone = [(n.start_byte, n.end_byte) for n in reads if not isinstance(n, _Split)]
    kept = [(s.tile.start_byte, s.tile.end_byte) for s in reads if isinstance(s, _Split)]
    for node in walk(body):
        if node.type != "identifier" or source.text_of(node) != name:
            continue
        inside = any(a <= node.start_byte < b for a, b in gone)
        if not inside or any(a <= node.start_byte < b for a, b in kept):
            return True
    return False


def _unused_tails(source: ParsedSource, operands: tuple[_Operand, ...]) -> list[Edit]:
    """Deletions of each reader's last parameters (and their arguments) that only the
    rewritten reads used: the values the removal passed in for them."""
    edits = []
    for call in {o.reader[0] for o in operands if o.reader is not None}:
        group = [o for o in operands if o.reader is not None and o.reader[0] == call]
        reader = group[0].scope
        assert reader.body is not None
        reads: list[_Split | Node] = [n for o in group for read in o.reads for n in read]
        last = max(o.reader[1] for o in group if o.reader is not None)
        params, args = list(reader.params), call_arguments(call)
        drop = len(params)
        while drop > last + 1 and not _used_after(
            source, reader.body, params[drop - 1].name or "", reads
        ):
            drop -= 1
        if drop < len(params) and len(args) == len(params):
            edits.append(Edit.delete(params[drop - 1].node.end_byte, params[-1].node.end_byte))
            edits.append(Edit.delete(args[drop - 1].end_byte, args[-1].end_byte))
    return edits
