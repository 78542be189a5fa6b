"""The offsets of a register-tiled turn's operand reads, read as tile slots: the offset
algebra of :mod:`klineage.mechanisms._staging_operands_forward`.

A read ``P[offset]`` is split, by the index analysis's form of ``offset``, into monomials
without thread or inner-loop indices (``U``, the same for the whole block in a turn), those
scaled by one parameter ``a`` (the row ``X``) and those with constant scales (the column
``Y``; or one rotated column ``(E) % C``). ``X`` and ``Y`` must each take every value of
``[0, R)`` and ``[0, C)`` exactly as a mixed radix does: sorted by scale, each scale at most
one more than what the smaller ones reach. Thread indices range over the launch's block,
inner loops over their trip counts under the template bindings. Every part is spelled back
as C in the function's own names (parameters, template parameters, loop counters, built-ins).
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
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, assigned_names, binary_operands, walk
from klineage.mechanisms._local_util import normalize_type
from klineage.mechanisms._tiles_util import Locals

__all__ = ["NEEDED", "OperandReader", "TileRead", "fixed_names"]

NEEDED = (
    "a top-level counted loop of a kernel without shared memory, launched with a constant "
    "block, whose turn reads pointer parameters only under loops of compile-time trip counts "
    "and under no condition, as `P[U + a * X + Y]`: U the same for the whole block, `a` a "
    "parameter, X and Y sums of thread indices and inner loop counters that cover [0, R) and "
    "[0, C) and share none of them"
)
_THREADS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


@dataclass(frozen=True)
class TileRead:
    """One read as a slot of its operand's tile: ``P[base + stride * row + column]``."""

    pointer: str
    element: str
    """The element type the tile holds (the pointer's, unqualified)."""
    rows: int
    columns: int
    base: str
    """``U`` less the pointer's own offset, as C (each product in 64 bits)."""
    stride: str
    """``a``, as C."""
    row: str
    """``X``, as C in the read's scope."""
    column: str
    """``Y``, as C in the read's scope."""


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


def fixed_names(source: ParsedSource, function: Function) -> set[str]:
    """The parameters and template parameters the function never writes: the same for the
    whole block, and spelled by their names anywhere in it."""
    params = {p.name for p in function.params if p.name}
    return (params | set(function.template_params)) - Locals(source, function).assigned


class OperandReader:
    """Reads the offsets of one function's turn against one set of template bindings."""

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
        self.spell = {a: a for a in _THREADS + tuple(sorted(BLOCK_ATOMS))}
        self.spell |= {name: name for name in fixed_names(source, function)}

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

    def read(self, access: Access, loops: list[Node]) -> TileRead:
        """One read of the turn as a tile slot, ``loops`` the loops between it and the turn
        (each must run a constant number of turns, at least one)."""
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
                if len(monomial) != 1 or coefficient != 1 or modulo is not None:
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
            ranges = [(value, self._range(atom, node)) for atom, value, _, _ in terms]
            extent = _extent((value * r.step, r.count) for value, r in ranges)
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
        element = normalize_type(access.buffer.element_type)
        return TileRead(
            source.text_of(argument), element, rows, columns, base, stride, row_text, column_text
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
