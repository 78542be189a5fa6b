"""Removing a register outer product: the loops interchanged, each output summing over the
reduction into a scalar that starts from and goes back to its accumulator, each product
reading its operands where the registers were loaded from (``_outer_product`` reads and
checks the form)."""

from __future__ import annotations

from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    call_arguments,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    names_in_function,
)
from klineage.mechanisms._outer_product import OuterProduct, factor_cache, slot_mapping
from klineage.mechanisms._outer_product_forms import (
    Update,
    flattened,
    local_array,
    loop_header,
    nest,
    pragma_line,
    span_start,
)
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import column, fresh_name, rename, substitute

_PRIMARY = frozenset(
    {
        "identifier",
        "subscript_expression",
        "call_expression",
        "field_expression",
        "parenthesized_expression",
        "number_literal",
    }
)


def operand(text: str, node: Node) -> str:
    """``text`` as a factor: parenthesized unless the expression it came from is primary."""
    return text if node.type in _PRIMARY else f"({text})"


def accumulator_type(source: ParsedSource, function: Function, name: str) -> str:
    """The element type of a local accumulator array (``float`` of ``float acc[4][4]``)."""
    declaration = local_array(source, function, name)
    type_node = None if declaration is None else declaration.child_by_field_name("type")
    if type_node is not None:
        return source.text_of(type_node)
    parameter = next((p for p in function.params if p.name == name), None)
    return parameter.base_type if parameter is not None else "float"


def accumulator_nodes(source: ParsedSource, update: Update) -> list[Node]:
    """Where an update names its accumulator element: the target, and ``fmaf``'s addend."""
    nodes = [update.target]
    right = update.statement.named_children[0].child_by_field_name("right")
    if right is not None and strip_parens(right).type == "call_expression":
        nodes.append(call_arguments(strip_parens(right))[2])
    return nodes


def removal(source: ParsedSource, product: OuterProduct) -> list[Edit]:
    """The interchanged loops: outputs outside, each summing over the reduction into a scalar
    that starts from and goes back to its accumulator, each product reading its operands
    where the caches were filled from. No loop is unrolled that was not: the accumulator is
    read and written once per output, wherever the compiler keeps it."""
    body = product.function.body
    assert body is not None
    total = fresh_name(names_in_function(source, product.function), "sum")
    replacements: dict[tuple[int, int], str] = {
        (n.start_byte, n.end_byte): total for n in accumulator_nodes(source, product.update)
    }
    for factor in product.update.factors:
        cache = factor_cache(source, product, factor)
        if cache is None:
            continue
        assert cache.value is not None
        if cache.array:
            chain = subscript_chain(strip_parens(factor))
            assert chain is not None
            text = rename(source, cache.value, slot_mapping(source, cache, chain[1]) or {})
        else:
            text = source.text_of(cache.value)
        replacements[(factor.start_byte, factor.end_byte)] = operand(text, cache.value)

    def replace(node: Node) -> str | None:
        return replacements.get((node.start_byte, node.end_byte))

    update = flattened(substitute(source, product.update.statement, replace))
    turn_level = [d for d, scope in product.locals if not scope]
    per_output = [d for d, scope in product.locals if scope]
    carried = [flattened(source.text_of(d)) for d in turn_level]
    carried += product.carried
    carried += [flattened(source.text_of(d)) for d in per_output]
    reductions = [
        (pragma_line(source.pragma_before(r, "unroll"), None), loop_header(source, r))
        for r in product.reductions
    ]
    element = accumulator_type(source, product.function, product.update.accumulator)
    target = source.text_of(product.update.target)
    per_output = [
        f"{element} {total} = {target};",
        *nest("", reductions, [*carried, update]).split("\n"),
        f"{target} = {total};",
    ]
    outputs = [(pragma_line(o.pragma, None), loop_header(source, o.node)) for o in product.outputs]
    top = product.top
    indent = " " * column(source, top.start_byte)
    start = span_start(source, top)
    edits = [Edit(start, top.end_byte, nest(indent, outputs, per_output))]
    edits += [
        source.deletion(c.declaration, whole_line=True) for c in product.caches.values() if c.before
    ]
    return edits
