"""Index algebra for outer products: does a flat accumulator index give every output a slot of
its own, and which output index does a register read stand for.

An accumulator ``A[(w * TM + m) * (WN * TN) + n_w * TN + n]`` over loops ``w < WM``, ``m <
TM``, ``n_w < WN``, ``n < TN`` is a mixed-radix number: ordered by stride, each variable's
stride is the previous one's times the previous bound (``1``, ``TN``, ``WN·TN``, ``TM·WN·TN``),
so no two outputs share a slot and each output's sum keeps its order when the loops are
interchanged. Polynomials here are sums of products of names and integers, which is what such
indices are made of; anything else (a division, a call) is not read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import integer_literal, operator_of, strip_parens

Monomial = tuple[str, ...]
"""Names multiplied together, sorted; ``()`` is the constant term."""
Polynomial = dict[Monomial, int]

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+[uUlL]*|\S")


def polynomial(source: ParsedSource, node: Node) -> Polynomial | None:
    """``node`` as a polynomial in its names, or None when it is not a sum of products."""
    node = strip_parens(node)
    if node.type == "identifier":
        return {(source.text_of(node),): 1}
    if node.type == "number_literal":
        value = integer_literal(source.text_of(node))
        return None if value is None else {(): value}
    if node.type == "cast_expression":
        value = node.child_by_field_name("value")
        return None if value is None else polynomial(source, value)
    if node.type != "binary_expression":
        return None
    left = node.child_by_field_name("left")
    right = node.child_by_field_name("right")
    a = None if left is None else polynomial(source, left)
    b = None if right is None else polynomial(source, right)
    if a is None or b is None:
        return None
    operator = operator_of(node)
    if operator == "+":
        return _add(a, b)
    if operator == "-":
        return _add(a, {m: -c for m, c in b.items()})
    if operator == "*":
        return _multiply(a, b)
    return None


def _add(a: Polynomial, b: Polynomial) -> Polynomial:
    total = dict(a)
    for monomial, coefficient in b.items():
        total[monomial] = total.get(monomial, 0) + coefficient
    return {m: c for m, c in total.items() if c != 0}


def _multiply(a: Polynomial, b: Polynomial) -> Polynomial:
    product: Polynomial = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            monomial = tuple(sorted(ma + mb))
            product[monomial] = product.get(monomial, 0) + ca * cb
    return {m: c for m, c in product.items() if c != 0}


def mixed_radix(
    source: ParsedSource, index: Node, variables: Sequence[str], bounds: Sequence[Node]
) -> bool:
    """Whether ``index`` gives each tuple of ``variables`` (each below its bound) a slot of
    its own: linear in them, and their strides, in increasing order, each the previous one
    times the previous bound."""
    whole = polynomial(source, index)
    limits = [polynomial(source, b) for b in bounds]
    if whole is None or any(limit is None for limit in limits):
        return False
    strides: dict[str, Polynomial] = {}
    for monomial, coefficient in whole.items():
        present = [v for v in monomial if v in variables]
        if len(present) > 1 or (present and monomial.count(present[0]) > 1):
            return False
        if present:
            rest = list(monomial)
            rest.remove(present[0])
            stride = strides.setdefault(present[0], {})
            stride[tuple(rest)] = stride.get(tuple(rest), 0) + coefficient
    if set(strides) != set(variables):
        return False
    bound_of = dict(zip(variables, limits, strict=True))
    remaining = set(variables)
    expected: Polynomial = {(): 1}
    while remaining:
        following = next((v for v in remaining if strides[v] == expected), None)
        if following is None:
            return False
        remaining.discard(following)
        limit = bound_of[following]
        assert limit is not None
        expected = _multiply(expected, limit)
    return True


def unify(text: str, variables: set[str], target: str) -> dict[str, str] | None:
    """The names ``variables`` of the pattern ``text`` stand for in ``target``, token by
    token (each stands for one token); None when the two differ elsewhere."""
    pattern, tokens = _TOKEN.findall(text), _TOKEN.findall(target)
    if len(pattern) != len(tokens):
        return None
    mapping: dict[str, str] = {}
    for mine, theirs in zip(pattern, tokens, strict=True):
        if mine in variables:
            if mapping.setdefault(mine, theirs) != theirs:
                return None
        elif mine != theirs:
            return None
    return mapping
