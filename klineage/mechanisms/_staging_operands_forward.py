"""Staging written into a tile loop whose threads read their operands straight from global
memory, each thread a register micro-tile of them: the forward rule for what the loader
removal (:mod:`klineage.mechanisms._staging_loader`) leaves of a register-tiled GEMM.

The form it takes: a top-level counted loop of a kernel without shared memory whose turn
reads pointer parameters, inside loops of compile-time trip counts, as ``P[U + a·X + Y]``::

    for (int t = 0; t < tiles; ++t)
      for (int k = 0; k < BK; ++k)
        for (int m = 0; m < TM; ++m)
          for (int n = 0; n < TN; ++n)
            acc[m][n] += A[t * BK + by * BM * K + K * (ty * TM + m) + k] * B[...];

``U`` is the same for every thread of the block in a turn (block indices, the turn's counter,
parameters), ``a`` is a parameter (the row stride), and ``X`` and ``Y`` are sums of thread
indices and inner loop counters with compile-time coefficients, over disjoint sets of them,
each taking every value of ``[0, R)`` and ``[0, C)`` (checked as a mixed radix from the
launch's block and the loops' trip counts). What it writes: a ``__shared__`` tile ``S[R][C]``
per operand, filled at the top of the turn by the whole block (``S[e / C][e % C] = P[U + a
* (e / C) + e % C]`` for ``e`` over the slots, consecutive threads on consecutive addresses),
a barrier after the fill and one at the end of the turn, and each read ``S[X][Y]``.

Slot ``[x][y]`` holds ``P[U + a·x + y]``, the value a read with ``X = x`` and ``Y = y`` gets,
so every read gets its value back. The fill reads only elements the kernel read: every slot
is some thread's read in the same turn, because the reads sit under no condition, ``X`` and
``Y`` cover their ranges and vary with different indices. The rest holds by checks: ``P`` is
never written, ``U`` and ``a`` name nothing the loop writes, and every thread reaches both
barriers (the loop is at the top of the kernel with a block-uniform trip count, nothing
returns before it and nothing jumps out of its turn).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.analysis.indices import (
    BLOCK_ATOMS,
    Access,
    FunctionIndices,
    is_buffer,
    is_loop_atom,
)
from klineage.cuda.cexpr import SIZEOF
from klineage.cuda.edit import Edit
from klineage.cuda.facts import compile_time_bindings
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, assigned_names, binary_operands, fresh_name, walk
from klineage.mechanisms._tiles_util import (
    STATIC_SHARED_LIMIT,
    Locals,
    function_names,
    kernel_block_dims,
)

__all__ = ["OperandTile", "OperandTiles", "operand_tile_edits", "operand_tiles", "reads_tiles"]

NEEDED = (
    "a top-level counted loop of a kernel without shared memory, launched with a constant "
    "block, whose turn reads pointer parameters only under loops of compile-time trip counts "
    "and under no condition, as `P[U + a * X + Y]`: U the same for the whole block, `a` a "
    "parameter, X and Y sums of thread indices and inner loop counters that cover [0, R) and "
    "[0, C) and share none of them"
)
_THREADS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_JUMPS = ("return_statement", "break_statement", "continue_statement", "goto_statement")
_CONDITIONAL = (
    "if_statement",
    "conditional_expression",
    "while_statement",
    "do_statement",
    "switch_statement",
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


@dataclass(frozen=True)
class OperandTile:
    """One operand the turn reads as a register micro-tile, and the tile that stages it."""

    pointer: str
    element: str
    """The element type the tile holds (the pointer's, unqualified)."""
    base: str
    """``U`` less the pointer's own offset, as C text (64-bit)."""
    stride: str
    """``a``, as C text."""
    rows: int
    columns: int
    reads: tuple[tuple[Node, str, str], ...]
    """(the read, X's text, Y's text) for each read of the tile."""


@dataclass(frozen=True)
class OperandTiles:
    """A loop in the form above."""

    function: Function
    loop: Node
    threads: tuple[int, int, int]
    tiles: tuple[OperandTile, ...]


# ---------------------------------------------------------------------------------------------
# Forms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Range:
    """What a varying atom steps through: ``count`` values, ``step`` apart from 0."""

    count: int
    step: int


def _bound(form: IndexForm, bindings: Mapping[str, int]) -> IndexForm:
    return form.substitute({name: IndexForm.constant(v) for name, v in bindings.items()})


def _extent(terms: Iterable[tuple[int, int]]) -> int | None:
    """The values of ``sum c_i * j_i`` (``j_i`` over ``[0, n_i)``), given as (c_i, n_i), when
    they are every integer of ``[0, extent)``; None otherwise."""
    reach = 0
    for coefficient, count in sorted(terms):
        if coefficient <= 0 or coefficient > reach + 1:
            return None
        reach += coefficient * (count - 1)
    return reach + 1


def _monomial_text(monomial: tuple[str, ...], coefficient: int, spell: Mapping[str, str]) -> str:
    factors = [spell[a] for a in monomial]
    if coefficient != 1 or not factors:
        factors.insert(0, str(abs(coefficient)))
    return " * ".join(factors)


def _c_text(
    terms: Iterable[tuple[tuple[str, ...], int]], spell: Mapping[str, str], wide: bool
) -> str:
    """A sum of monomials as C; with ``wide``, each computed in 64 bits."""
    parts: list[str] = []
    for monomial, coefficient in sorted(terms, key=lambda t: (len(t[0]), t[0])):
        text = _monomial_text(monomial, coefficient, spell)
        if wide:
            text = f"(long long){text}"
        sign = "-" if coefficient < 0 else "+"
        parts.append(f"{sign} {text}" if parts else ("-" if coefficient < 0 else "") + text)
    return " ".join(parts) if parts else "0"


class _Reader:
    """Reads the offsets of one kernel's turn against one set of template bindings."""

    def __init__(
        self,
        source: ParsedSource,
        function: Function,
        loop: Node,
        threads: tuple[int, int, int],
        bindings: Mapping[str, int],
    ) -> None:
        self.source = source
        self.indices: FunctionIndices = analysis(source).indices(function)
        self.function = function
        self.loop = loop
        self.bindings = bindings
        self.ranges: dict[str, _Range] = {
            atom: _Range(count, 1) for atom, count in zip(_THREADS, threads, strict=True)
        }
        self.turn = self.indices.loop_of(loop)
        locals_ = Locals(source, function)
        params = {p.name for p in function.params if p.name}
        self.fixed = (set(function.template_params) | params) - locals_.assigned
        self.spell = {a: a for a in _THREADS + tuple(sorted(BLOCK_ATOMS))}
        self.spell |= {name: name for name in self.fixed}

    def _inner_range(self, atom: str, read: Node) -> _Range:
        variable = self.indices.loop(atom)
        if variable is None or not within(read, variable.loop) or variable.loop == self.loop:
            raise _refuse(f"an index that moves with `{atom}`, a loop outside the turn")
        shown = self.source.snippet(variable.loop, 50)
        condition = variable.loop.child_by_field_name("condition")
        if condition is None or binary_operands(condition, "<") is None:
            raise _refuse(f"an inner loop `{shown}` whose condition is not `i < bound`")
        if variable.step is None or variable.bound is None:
            raise _refuse(f"an inner loop `{shown}` that does not count by a fixed step")
        begin = _bound(variable.init, self.bindings).value
        step = _bound(variable.step, self.bindings).value
        end = _bound(self.indices.form(variable.bound), self.bindings).value
        if begin != 0 or step is None or end is None or step <= 0:
            raise _refuse(f"an inner loop `{shown}` that does not count from 0 to a constant")
        if variable.name in assigned_names(
            self.source, variable.loop.child_by_field_name("body") or variable.loop
        ):
            raise _refuse(f"an inner loop `{shown}` whose counter its body writes")
        if end <= 0:
            raise _refuse(f"an inner loop `{shown}` that may not run")
        self.spell[atom] = variable.name
        return _Range(-(-end // step), step)

    def _range(self, atom: str, read: Node) -> _Range:
        if atom in self.ranges:
            return self.ranges[atom]
        if is_loop_atom(atom):
            return self._inner_range(atom, read)
        raise _refuse(f"an index that moves with `{atom}` (not a thread index or inner loop)")

    def _is_varying(self, atom: str) -> bool:
        return atom in self.ranges or (
            is_loop_atom(atom) and (self.turn is None or atom != self.turn.atom)
        )

    def _check_uniform(self, atoms: Iterable[str], shown: str) -> None:
        for atom in atoms:
            if atom in self.spell and not is_loop_atom(atom):
                continue
            if self.turn is not None and atom == self.turn.atom:
                self.spell[atom] = self.turn.name
                continue
            raise _refuse(
                f"a read `{shown}` whose offset uses `{atom}`, which is neither a block index, "
                "the turn's counter, a parameter nor a thread index"
            )

    def read(
        self, access: Access, loops: list[Node]
    ) -> tuple[str, str, tuple[int, int], str, str, str, str]:
        """(pointer, element, (R, C), base, stride, X, Y) texts for one read of the turn,
        which ``loops`` enclose (each must run a constant number of turns, at least one)."""
        source, node = self.source, access.node
        for inner in loops:
            variable = self.indices.loop_of(inner)
            if variable is None:
                raise _refuse(
                    f"a read under a loop `{source.snippet(inner, 50)}` that does not count"
                )
            self._inner_range(variable.atom, node)
        shown = source.snippet(node, 60)
        argument = (
            node.child_by_field_name("argument") if node.type == "subscript_expression" else None
        )
        if argument is None or argument.type != "identifier":
            raise _refuse(f"a read `{shown}` that is not a subscript of a pointer parameter")
        own = self.indices.form(argument)
        offset = access.offset - own.without([a for a in own.atoms() if is_buffer(a)])
        # monomials of the offset: uniform (U), scaled by a parameter (X), or constant-scaled (Y)
        uniform: list[tuple[tuple[str, ...], int]] = []
        groups: dict[tuple[str, ...], list[tuple[str, int, tuple[str, ...], int]]] = {}
        modulo: str | None = None
        opaque = dict(offset.opaque)
        for monomial, coefficient in offset.terms:
            if any(a in opaque for a in monomial):
                if monomial != tuple(a for a in monomial if a in opaque) or len(monomial) != 1:
                    raise _refuse(f"a read `{shown}` whose offset is not a sum of products")
                if coefficient != 1 or modulo is not None:
                    raise _refuse(f"a read `{shown}` whose offset is not a sum of products")
                modulo = monomial[0]
                continue
            varying = [a for a in monomial if self._is_varying(a)]
            if not varying:
                uniform.append((monomial, coefficient))
                continue
            if len(varying) > 1:
                raise _refuse(
                    f"a read `{shown}` whose offset multiplies two thread or loop indices"
                )
            rest = tuple(a for a in monomial if a != varying[0])
            scale = _bound(IndexForm.of({rest: coefficient}), self.bindings)
            if len(scale.terms) != 1:
                raise _refuse(f"a read `{shown}` whose offset scales `{varying[0]}` by zero")
            key, value = scale.terms[0]
            groups.setdefault(key, []).append((varying[0], value, rest, coefficient))
        strides = [key for key in groups if key]
        if len(strides) != 1 or (() in groups) == (modulo is not None):
            raise _refuse(
                f"a read `{shown}` that is not `P[U + a * X + Y]` over the thread and loop "
                "indices (one parameter stride `a` and one unit-stride part)"
            )
        self._check_uniform({a for m, _ in uniform for a in m} | set(strides[0]), shown)
        if any(a in self.ranges or is_loop_atom(a) for a in strides[0]):
            raise _refuse(f"a read `{shown}` whose row stride varies")
        parts = []
        for key in (strides[0], ()) if modulo is None else (strides[0],):
            terms = groups[key]
            extent = _extent(
                (value * self._range(atom, node).step, self._range(atom, node).count)
                for atom, value, _, _ in terms
            )
            if extent is None:
                raise _refuse(
                    f"a read `{shown}` whose in-tile index over "
                    f"{', '.join(sorted(a for a, *_ in terms))} skips values or repeats them"
                )
            spelled = []
            for atom, _, rest, coefficient in terms:
                rest_left = list(rest)
                for name in key:
                    if name in rest_left:
                        rest_left.remove(name)
                spelled.append((tuple(sorted([*rest_left, atom])), coefficient))
            self._check_uniform(
                {a for m, _ in spelled for a in m if not self._is_varying(a)}, shown
            )
            parts.append((extent, {a for a, *_ in terms}, _c_text(spelled, self.spell, False)))
        if modulo is not None:
            parts.append(self._wrapped_column(node, modulo, parts[0][1], shown))
        (rows, row_atoms, row_text), (columns, column_atoms, column_text) = parts
        if row_atoms & column_atoms:
            raise _refuse(
                f"a read `{shown}` whose row and column both move with "
                f"{sorted(row_atoms & column_atoms)}"
            )
        base = _c_text(uniform, self.spell, True)
        stride = _c_text([(strides[0], 1)], self.spell, False)
        element = " ".join(
            w
            for w in access.buffer.element_type.split()
            if w not in ("const", "volatile", "__restrict__")
        )
        return (
            source.text_of(argument),
            element,
            (rows, columns),
            base,
            stride,
            row_text,
            column_text,
        )

    def _wrapped_column(
        self, read: Node, atom: str, row_atoms: set[str], shown: str
    ) -> tuple[int, set[str], str]:
        """(C, the indices it moves with, its text) for a column ``(E) % C`` (a rotated walk
        along the row): it covers ``[0, C)`` for every row when the indices ``E`` does not
        share with the row step through ``C`` consecutive values or more from 0 up."""
        source = self.source
        wanted = atom[1:-1]
        found = [
            n
            for n in walk(read)
            if n.type == "binary_expression"
            and n.children[1].type == "%"
            and " ".join(source.text_of(n).split()) == wanted
        ]
        if not found:
            raise _refuse(f"a read `{shown}` whose offset is not a sum of products")
        wrap = found[0]
        left, right = wrap.children[0], wrap.children[-1]
        width = _bound(self.indices.form(right), self.bindings).value
        walked = _bound(self.indices.form(left), self.bindings)
        if width is None or width <= 0 or walked.opaque:
            raise _refuse(
                f"a read `{shown}` whose column `{wanted}` is not a sum modulo a constant"
            )
        free = []
        for monomial, coefficient in walked.terms:
            varying = [a for a in monomial if self._is_varying(a)]
            if not varying and (monomial or coefficient < 0):
                raise _refuse(f"a read `{shown}` whose column `{wanted}` may be negative")
            if len(varying) > 1 or (varying and (len(monomial) != 1 or coefficient <= 0)):
                raise _refuse(
                    f"a read `{shown}` whose column `{wanted}` is not a sum modulo a constant"
                )
            if varying and varying[0] not in row_atoms:
                step = self._range(varying[0], read)
                free.append((varying[0], coefficient * step.step, step.count))
        span = _extent((c, n) for _, c, n in free)
        if span is None or span < width:
            raise _refuse(
                f"a read `{shown}` whose column `{wanted}` does not reach every value below {width}"
            )
        return width, {a for a, *_ in free}, source.text_of(wrap)


# ---------------------------------------------------------------------------------------------
# The form
# ---------------------------------------------------------------------------------------------


def _turn_reads(source: ParsedSource, function: Function, loop: Node) -> list[Access]:
    """The global loads of pointer parameters in the turn that move with an inner loop."""
    indices = analysis(source).indices(function)
    body = loop.child_by_field_name("body")
    if body is None:
        return []
    pointers = {p.name for p in function.params if p.is_pointer and p.name}
    turn = indices.loop_of(loop)
    found = []
    for access in indices.accesses():
        if access.direction != "load" or access.buffer.name not in pointers:
            continue
        if not within(access.node, body) or access.helper is not None:
            continue
        inner = [
            a
            for a in access.offset.base_atoms()
            if is_loop_atom(a) and (turn is None or a != turn.atom)
        ]
        if inner:
            found.append(access)
    return found


def reads_tiles(source: ParsedSource, function: Function, loop: Node) -> bool:
    """Whether a top-level loop reads a pointer parameter inside a loop nested in its turn,
    in a kernel or ``__device__`` function without shared memory: the cheap test of a
    candidate."""
    if function.body is None or not function.runs_on_device or _has_shared(source, function):
        return False
    return bool(_turn_reads(source, function, loop))


def _has_shared(source: ParsedSource, function: Function) -> bool:
    assert function.body is not None
    return any(
        source.text_of(n) == "__shared__"
        for n in walk(function.body)
        if n.type in ("type_qualifier", "storage_class_specifier")
    )


def _synchronizes(source: ParsedSource, function: Function) -> bool:
    assert function.body is not None
    return any(
        n.type == "call_expression" and source.text_of(n).startswith("__syncthreads")
        for n in walk(function.body)
    )


def _block_uniform(source: ParsedSource, function: Function, condition: Node) -> bool:
    """Whether a condition reads only block indices, grid and block sizes, and parameters
    and template parameters the function never writes."""
    fixed = ({p.name for p in function.params if p.name} | set(function.template_params)) - (
        Locals(source, function).assigned
    )
    for node in walk(condition):
        if node.type == "field_expression":
            base = node.child_by_field_name("argument")
            if base is None or source.text_of(base) not in ("blockIdx", "gridDim", "blockDim"):
                return False
        elif node.type == "identifier":
            parent = node.parent
            in_field = parent is not None and parent.type == "field_expression"
            if not in_field and source.text_of(node) not in fixed:
                return False
        elif node.type in ("call_expression", "subscript_expression", "pointer_expression"):
            return False
    return True


def _uniform_returns(source: ParsedSource, function: Function, before: int, what: str) -> None:
    """Refuse a return before byte ``before`` of ``function`` unless it is the whole block's:
    ``if (block-uniform condition) return;`` at the top of the function."""
    assert function.body is not None
    for node in walk(function.body):
        if node.type != "return_statement" or node.end_byte > before:
            continue
        guard = node.parent
        if guard is not None and guard.type == "compound_statement":
            guard = guard.parent if len(guard.named_children) == 1 else None
        condition = guard.child_by_field_name("condition") if guard is not None else None
        if (
            guard is None
            or guard.type != "if_statement"
            or guard.parent != function.body
            or condition is None
            or not _block_uniform(source, function, condition)
        ):
            raise _refuse(
                f"a {what} that may return before the loop for some threads only "
                f"(line {source.line_of(node.start_byte)})"
            )


def _entry(source: ParsedSource, function: Function, loop: Node) -> Function:
    """The kernel whose launches give the block: ``function`` itself, or the one kernel that
    calls this ``__device__`` function, at its top level and with every thread."""
    if function.is_kernel:
        return function
    sites = analysis(source).call_graph.call_sites(function.name)
    if len(sites) != 1:
        raise _refuse(f"a `__device__` function called from {len(sites)} places, not one kernel")
    caller, call = sites[0]
    kernel = source.function(caller)
    statement = call.parent
    if kernel is None or not kernel.is_kernel or kernel.body is None:
        raise _refuse(f"a `__device__` function that `{caller}`, not a kernel, calls")
    if statement is None or statement.parent != kernel.body:
        raise _refuse(f"a `__device__` function that `{caller}` calls under a condition or loop")
    if _has_shared(source, kernel) or _synchronizes(source, kernel):
        raise _refuse(f"a `__device__` function whose kernel `{caller}` already shares memory")
    _uniform_returns(source, kernel, call.start_byte, "kernel")
    return kernel


def _guards(source: ParsedSource, node: Node, body: Node) -> list[Node]:
    """The loops between a read and the turn's body; refuse a read a condition guards."""
    loops, at = [], node
    while at.parent is not None and at != body:
        parent = at.parent
        guarded = parent.type in _CONDITIONAL and at != parent.child_by_field_name("condition")
        logical = parent.type == "binary_expression" and parent.children[1].type in ("&&", "||")
        if guarded or (logical and at == parent.children[-1]):
            raise _refuse(f"a read `{source.snippet(node, 60)}` under a condition")
        if parent.type == "for_statement" and at == parent.child_by_field_name("body"):
            loops.append(parent)
        at = parent
    return loops


def operand_tiles(source: ParsedSource, function: Function, loop: Node) -> OperandTiles:
    """The loop's operand tiles; raises NotInForm with the form found otherwise."""
    body = loop.child_by_field_name("body")
    if function.body is None or loop.parent != function.body:
        raise _refuse("a loop that is not at the top of the kernel")
    if body is None or body.type != "compound_statement":
        raise _refuse("a loop whose turn is not a block `{ ... }`")
    indices = analysis(source).indices(function)
    turn = indices.loop_of(loop)
    if turn is None or not turn.bound_uniform:
        raise _refuse("a loop whose trip count is not the same for every thread")
    jumps = [n for n in walk(body) if n.type in _JUMPS]
    if jumps:
        raise _refuse(f"a turn that jumps (`{source.snippet(jumps[0], 30)}`)")
    if _has_shared(source, function):
        raise _refuse("a function that already stages in shared memory")
    _uniform_returns(source, function, loop.start_byte, "function")
    if _synchronizes(source, function):
        raise _refuse("a kernel that already synchronizes its block")
    kernel = _entry(source, function, loop)
    threads = kernel_block_dims(source, kernel)
    if threads is None:
        raise _refuse(f"a kernel `{kernel.name}` whose launches do not all give one constant block")
    bindings = compile_time_bindings(source, function)
    if not bindings:
        raise _refuse("a kernel whose template arguments do not fold to integers")
    reads = _turn_reads(source, function, loop)
    if not reads:
        raise _refuse("a turn that reads no pointer parameter inside an inner loop")
    written = {a.buffer.name for a in indices.accesses() if a.direction in ("store", "both")}
    written |= assigned_names(source, body)
    found: dict[tuple[str, str, str], list[tuple[Node, str, str, tuple[int, int], str]]] = {}
    for access in reads:
        loops = _guards(source, access.node, body)
        if access.buffer.name in written:
            raise _refuse(f"a kernel that writes or moves `{access.buffer.name}`, which it reads")
        readings = {
            _Reader(source, function, loop, threads, binding).read(access, loops)
            for binding in bindings
        }
        if len(readings) != 1:
            raise _refuse(
                f"a read `{source.snippet(access.node, 60)}` whose tile differs between "
                "instantiations"
            )
        reading = readings.pop()
        pointer, element, extents, base, stride, row, column = reading
        found.setdefault((pointer, base, stride), []).append(
            (access.node, element, row, extents, column)
        )
    tiles = []
    for (pointer, base, stride), entries in found.items():
        extents = {e[3] for e in entries}
        if len(extents) != 1:
            raise _refuse(f"reads of `{pointer}` that cover tiles of different sizes")
        rows, columns = extents.pop()
        tiles.append(
            OperandTile(
                pointer,
                entries[0][1],
                base,
                stride,
                rows,
                columns,
                tuple((node, row, column) for node, _, row, _, column in entries),
            )
        )
    size = sum(t.rows * t.columns * SIZEOF.get(t.element, 4) for t in tiles)
    if size > STATIC_SHARED_LIMIT:
        raise _refuse(
            f"tiles of {size} bytes, more than the {STATIC_SHARED_LIMIT} of static shared memory"
        )
    return OperandTiles(function, loop, threads, tuple(tiles))


# ---------------------------------------------------------------------------------------------
# Edits
# ---------------------------------------------------------------------------------------------


def _thread_text(threads: tuple[int, int, int]) -> str:
    x, y, z = threads
    if z > 1:
        return f"(threadIdx.z * {y} + threadIdx.y) * {x} + threadIdx.x"
    if y > 1:
        return f"threadIdx.y * {x} + threadIdx.x"
    return "threadIdx.x"


def operand_tile_edits(source: ParsedSource, form: OperandTiles) -> list[Edit]:
    """The tiles declared before the loop, filled at the top of its turn between barriers,
    and the reads turned into tile reads."""
    loop, body = form.loop, form.loop.child_by_field_name("body")
    assert body is not None
    taken = function_names(source, form.function)
    indent = source.indent_of(loop.start_byte)
    inner = indent + "  "
    x, y, z = form.threads
    count = x * y * z
    slot, turn = fresh_name(taken, "slot"), fresh_name(taken, "fill")
    taken |= {slot, turn}
    thread = _thread_text(form.threads)
    declarations, fills, edits = [], [], []
    for tile in form.tiles:
        name = fresh_name(taken, f"tile_{tile.pointer}")
        taken.add(name)
        declarations.append(
            f"__shared__ {tile.element} {name}[{tile.rows}][{tile.columns}];\n{indent}"
        )
        slots = tile.rows * tile.columns
        if slots % count == 0:
            # every thread fills as many slots: a constant trip count nvcc unrolls by itself
            header = (
                f"for (int {turn} = 0; {turn} < {slots // count}; "
                f"++{turn}) {{\n{inner}  const int {slot} = {turn} * {count} + {thread};"
            )
        else:
            header = f"for (int {slot} = {thread}; {slot} < {slots}; {slot} += {count}) {{"
        fills.append(
            f"\n{inner}{header}\n"
            f"{inner}  {name}[{slot} / {tile.columns}][{slot} % {tile.columns}] = "
            f"{tile.pointer}[{tile.base} + (long long)({tile.stride}) * ({slot} / {tile.columns}) "
            f"+ {slot} % {tile.columns}];\n"
            f"{inner}}}"
        )
        for node, row, column in tile.reads:
            edits.append(Edit.replace(node, f"{name}[{row}][{column}]"))
    edits.append(Edit.insert(loop.start_byte, "".join(declarations)))
    edits.append(Edit.insert(body.start_byte + 1, "".join(fills) + f"\n{inner}__syncthreads();"))
    closing = body.end_byte - 1
    edits.append(Edit.insert(closing, f"  __syncthreads();\n{indent}"))
    return edits
