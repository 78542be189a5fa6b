"""Outer products a ``__device__`` helper computes on register arrays its caller passes.

A turn of a thread tile's reduction may be spread over helpers: one fills register arrays
from the shared tiles, another accumulates their outer product, and the caller's loop over
the shared tile calls both::

    for (int k = 0; k < TILE_K; ++k) {
      load_fragment(As[k], a_regs, ...);
      load_fragment(Bs[k], b_regs, ...);
      outer_product(a_regs, b_regs, c_regs);
    }

    __device__ void outer_product(const T a[M], const T b[N], T c[M][N]) {
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) c[i][j] += a[i] * b[j];
    }

The form read: an accumulation into an array parameter over counted loops (the whole body of
the helper), each factor an element of an array parameter indexed by the loops' variables,
and every call of the helper inside a loop of its caller, passing local arrays for the
factors. ``_outer_product_inline`` reads it with the loop's helper calls written out, where
the loads, the products and the reduction loop are in one function.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import identifier_names, strip_parens
from klineage.mechanisms._outer_product import MAX_OUTPUT_LOOPS
from klineage.mechanisms._outer_product_forms import (
    Counted,
    Update,
    array_parameter,
    counted,
    items_of,
    local_array,
    update_of,
)
from klineage.mechanisms._staging import subscript_chain

FORM = (
    "an outer product of register arrays a helper receives, filled and iterated by its "
    "caller's loop"
)
"""How a refusal names the form (the rest says why its inlined form is refused)."""


@dataclass(frozen=True)
class HelperProduct:
    """An outer product in a helper: its outermost output loop and the accumulation."""

    function: Function
    outer: Node
    update: Update
    outputs: tuple[Counted, ...]


def helper_products(source: ParsedSource) -> Iterator[HelperProduct]:
    """Every outer product a helper computes on arrays its callers' loops pass."""
    for function in source.functions:
        if function.body is None or not function.runs_on_device or function.is_kernel:
            continue
        for statement in source.iter_nodes("expression_statement", within=function.body):
            found = _product(source, function, statement)
            if found is not None and _called_in_loops(source, function, found.update):
                yield found


def _product(source: ParsedSource, function: Function, statement: Node) -> HelperProduct | None:
    update = update_of(source, statement)
    if update is None or not array_parameter(source, function, update.accumulator):
        return None
    read = set().union(*(identifier_names(source, i) for i in update.indices))
    outputs: list[Counted] = []
    inner = statement
    current = statement.parent
    while current is not None and current != function.body:
        if current.type == "for_statement":
            loop = counted(source, current)
            if loop is None or loop.variable not in read or len(outputs) == MAX_OUTPUT_LOOPS:
                return None
            if _sole(source, current) != inner:
                return None
            outputs.insert(0, loop)
            inner = current
        elif current.type != "compound_statement":
            return None
        current = current.parent
    if not outputs or _sole_of(source, function.body) != inner:
        return None
    variables = {o.variable for o in outputs}
    for factor in update.factors:
        chain = subscript_chain(strip_parens(factor))
        if chain is None or not array_parameter(source, function, source.text_of(chain[0])):
            return None
        if not set().union(*(identifier_names(source, i) for i in chain[1])) & variables:
            return None
    return HelperProduct(function, inner, update, tuple(outputs))


def _sole(source: ParsedSource, loop: Node) -> Node | None:
    return _sole_of(source, loop.child_by_field_name("body"))


def _sole_of(source: ParsedSource, block: Node | None) -> Node | None:
    """The one statement of a block, pragma lines and ``static_assert`` aside; None if more."""
    items = [
        s for s in items_of(source, block) if not source.text_of(s).startswith("static_assert")
    ]
    return items[0] if len(items) == 1 else None


def _called_in_loops(source: ParsedSource, helper: Function, update: Update) -> bool:
    """Every call of the helper sits in a loop of its caller and passes local arrays for the
    factors' parameters."""
    names = [p.name for p in helper.params]
    factor_params = set()
    for factor in update.factors:
        chain = subscript_chain(strip_parens(factor))
        if chain is not None:
            factor_params.add(source.text_of(chain[0]))
    calls = source.calls_named(helper.name)
    if not calls:
        return False
    for call in calls:
        caller = source.enclosing_function(call.node)
        if caller is None or caller.body is None or not _in_loop(call.node, caller.body):
            return False
        for name, argument in zip(names, call.args, strict=False):
            if name not in factor_params:
                continue
            passed = strip_parens(argument)
            if passed.type != "identifier":
                return False
            if local_array(source, caller, source.text_of(passed)) is None:
                return False
    return True


def _in_loop(node: Node, body: Node) -> bool:
    current = node.parent
    while current is not None and within(current, body):
        if current.type in ("for_statement", "while_statement", "do_statement"):
            return True
        current = current.parent
    return False
