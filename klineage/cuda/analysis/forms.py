"""Index forms: integer expressions as polynomials over named atoms.

``blockIdx.x * blockDim.y + threadIdx.y`` is the form ``blockDim.y·blockIdx.x + threadIdx.y``:
a sum of monomials (products of atoms) with integer coefficients. Atoms are the CUDA built-ins
(``threadIdx.x``...), the derived ``lane`` and ``warp`` of a 1-D block, loop variables, buffers
(a pointer or an array an address starts from), parameters and template parameters. What is
not a polynomial (``min(a, b)``, ``x / 3``, a value read from memory) becomes an *opaque* atom
that remembers which atoms it depends on, so "does this vary across the threads of a warp?"
still has an answer.

Forms are plain values: add, subtract, multiply, substitute (a helper's parameters by the
caller's arguments), read a coefficient. The meaning of the atoms lives in
:mod:`klineage.cuda.analysis.indices`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["IndexForm", "Monomial"]

Monomial = tuple[str, ...]
"""A product of atoms, sorted; ``()`` is the constant monomial."""


def _product(a: Monomial, b: Monomial) -> Monomial:
    return tuple(sorted(a + b))


@dataclass(frozen=True, eq=False)
class IndexForm:
    """A polynomial over atoms with integer coefficients, plus the dependencies of its opaque
    atoms (``[min(C - 1, i)]`` -> ``{C, i}``)."""

    terms: tuple[tuple[Monomial, int], ...] = ()
    opaque: tuple[tuple[str, frozenset[str]], ...] = field(default=())

    # -- construction -----------------------------------------------------------------------

    @staticmethod
    def of(
        terms: Mapping[Monomial, int], opaque: Mapping[str, frozenset[str]] | None = None
    ) -> IndexForm:
        kept = tuple((m, c) for m, c in terms.items() if c != 0)
        if not opaque:
            return IndexForm(kept, ())
        used = {a for m, _ in kept for a in m}
        return IndexForm(kept, tuple((k, v) for k, v in opaque.items() if k in used))

    def __eq__(self, other: object) -> bool:
        # terms are kept in the order they arose; a form is the same whatever that order
        return isinstance(other, IndexForm) and dict(self.terms) == dict(other.terms)

    def __hash__(self) -> int:
        return hash(frozenset(self.terms))

    @staticmethod
    def constant(value: int) -> IndexForm:
        return IndexForm.of({(): value})

    @staticmethod
    def atom(name: str) -> IndexForm:
        return IndexForm.of({(name,): 1})

    @staticmethod
    def opaque_atom(name: str, depends_on: Iterable[str]) -> IndexForm:
        """An atom standing for an expression that is not a polynomial of its dependencies."""
        return IndexForm.of({(name,): 1}, {name: frozenset(depends_on)})

    # -- arithmetic -------------------------------------------------------------------------

    def _deps(self) -> dict[str, frozenset[str]]:
        return dict(self.opaque)

    def __add__(self, other: IndexForm | int) -> IndexForm:
        other = _as_form(other)
        terms = dict(self.terms)
        for monomial, coefficient in other.terms:
            terms[monomial] = terms.get(monomial, 0) + coefficient
        return IndexForm.of(terms, {**self._deps(), **other._deps()})

    def __radd__(self, other: int) -> IndexForm:
        return self + other

    def __neg__(self) -> IndexForm:
        return IndexForm.of({m: -c for m, c in self.terms}, self._deps())

    def __sub__(self, other: IndexForm | int) -> IndexForm:
        return self + -_as_form(other)

    def __mul__(self, other: IndexForm | int) -> IndexForm:
        other = _as_form(other)
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                key = _product(m1, m2)
                terms[key] = terms.get(key, 0) + c1 * c2
        return IndexForm.of(terms, {**self._deps(), **other._deps()})

    def __rmul__(self, other: int) -> IndexForm:
        return self * other

    def exact_division(self, divisor: int) -> IndexForm | None:
        """The form divided by ``divisor`` when every coefficient divides; else None."""
        if divisor == 0 or any(c % divisor for _, c in self.terms):
            return None
        return IndexForm.of({m: c // divisor for m, c in self.terms}, self._deps())

    def substitute(self, values: Mapping[str, IndexForm]) -> IndexForm:
        """Every atom in ``values`` replaced by its form (opaque dependencies follow)."""
        result = IndexForm()
        for monomial, coefficient in self.terms:
            term = IndexForm.constant(coefficient)
            for atom in monomial:
                term = term * values.get(atom, self._atom_form(atom))
            result = result + term
        deps: dict[str, frozenset[str]] = {}
        for name, depends_on in self.opaque:
            mapped: set[str] = set()
            for dep in depends_on:
                mapped |= values[dep].base_atoms() if dep in values else {dep}
            deps[name] = frozenset(mapped)
        return IndexForm.of(dict(result.terms), {**result._deps(), **deps})

    def _atom_form(self, atom: str) -> IndexForm:
        deps = dict(self.opaque)
        return IndexForm.of({(atom,): 1}, {atom: deps[atom]} if atom in deps else None)

    # -- reading ----------------------------------------------------------------------------

    @property
    def is_constant(self) -> bool:
        """Whether the form has no atom (an integer)."""
        return all(m == () for m, _ in self.terms)

    @property
    def constant_term(self) -> int:
        """The term with no atom (0 if none)."""
        return next((c for m, c in self.terms if m == ()), 0)

    @property
    def value(self) -> int | None:
        """The integer value of a constant form, else None."""
        return self.constant_term if self.is_constant else None

    def atoms(self) -> frozenset[str]:
        """The atoms written in the form (opaque atoms as themselves)."""
        return frozenset(a for m, _ in self.terms for a in m)

    def base_atoms(self) -> frozenset[str]:
        """The atoms the form depends on, opaque atoms replaced by their dependencies."""
        deps = dict(self.opaque)
        found: set[str] = set()
        for atom in self.atoms():
            found |= deps.get(atom, frozenset({atom})) if atom in deps else {atom}
        return frozenset(found)

    def is_opaque(self, atom: str) -> bool:
        """Whether ``atom`` stands for a part that is not a polynomial."""
        return atom in dict(self.opaque)

    def depends_on(self, atom: str) -> bool:
        """Whether the form varies with ``atom``, through an opaque part or directly."""
        return atom in self.base_atoms() or atom in self.atoms()

    def coefficient(self, atom: str) -> IndexForm:
        """The sum of the terms linear in ``atom``, with ``atom`` divided out (0 if absent)."""
        terms: dict[Monomial, int] = {}
        for monomial, coefficient in self.terms:
            if monomial.count(atom) == 1:
                rest = list(monomial)
                rest.remove(atom)
                terms[tuple(rest)] = terms.get(tuple(rest), 0) + coefficient
        return IndexForm.of(terms, self._deps())

    def without(self, atoms: Iterable[str]) -> IndexForm:
        """The terms that hold none of ``atoms``."""
        dropped = set(atoms)
        return IndexForm.of(
            {m: c for m, c in self.terms if not dropped.intersection(m)}, self._deps()
        )

    def only(self, atoms: Iterable[str]) -> IndexForm:
        """The terms that hold at least one of ``atoms``."""
        kept = set(atoms)
        return IndexForm.of({m: c for m, c in self.terms if kept.intersection(m)}, self._deps())

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for monomial, coefficient in sorted(self.terms):
            body = "·".join(monomial)
            if not body:
                parts.append(str(coefficient))
            elif coefficient == 1:
                parts.append(body)
            elif coefficient == -1:
                parts.append(f"-{body}")
            else:
                parts.append(f"{coefficient}·{body}")
        return " + ".join(parts).replace("+ -", "- ")


def _as_form(value: IndexForm | int) -> IndexForm:
    return value if isinstance(value, IndexForm) else IndexForm.constant(value)
