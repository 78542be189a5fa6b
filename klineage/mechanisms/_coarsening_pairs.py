"""Removing coarsening by several loads per iteration of a grid-stride loop.

The reductions that "add during load" read ``K`` elements a block apart in each turn of a
grid-stride loop::

    unsigned i = blockIdx.x * kBlock * 2 + threadIdx.x;
    stride = stride << 1;                       // (or kBlock * 2 * gridDim.x written out)
    while (i < n) {
      sum += x[i];
      if (i + kBlock < n) sum += x[i + kBlock];
      i += stride;
    }

Without the coarsening each turn reads one element: the statements reading the others go,
and the start and the step lose the factor ``K`` (the literal ``* K`` or ``<< log2 K`` in the
start, the step's, or the statement that scaled the step's variable before the loop). The
grid stays as it is: the loop still covers every element, so nothing outside the kernel (a
per-block partial, the launch) changes. The result is checked by the index analysis on the
rewritten source: start and step must be the old ones divided by ``K``.
"""

from __future__ import annotations

from klineage.cuda.analysis import Access, FunctionIndices, IndexForm, analysis
from klineage.cuda.edit import Edit, apply_edits
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    descendants,
    integer_literal,
    operator_of,
    statements,
    strip_parens,
)
from klineage.mechanisms._coarsening_forms import enclosing, unrolled_pairs

__all__ = [
    "declaration_before",
    "index_update",
    "pair_loads_at",
    "pair_loads_removal",
    "pair_of_loop",
]

_NEEDED = (
    "a grid-stride loop reading `x[i]` and, in statements of their own, `x[i + d]`... (d the "
    "block's share), whose start and step carry the factor as a literal `* K` or `<< k`"
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def _top(node: Node, body: Node) -> Node:
    """The statement of ``body`` that holds ``node``."""
    current = node
    while current.parent is not None and current.parent != body:
        current = current.parent
    return current


def _factor_edit(source: ParsedSource, root: Node, factor: int) -> Edit | None:
    """Dropping a literal factor ``factor`` (``* K`` or ``<< log2 K``) from ``root``."""
    shift = factor.bit_length() - 1 if factor & (factor - 1) == 0 else None
    for node in [root, *descendants(root, "binary_expression")]:
        node = strip_parens(node)
        if node.type != "binary_expression":
            continue
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            continue
        operator = operator_of(node)
        pairs = [(left, right), (right, left)] if operator == "*" else [(left, right)]
        for kept, literal in pairs:
            value = integer_literal(source.text_of(strip_parens(literal)))
            if (operator == "*" and value == factor) or (operator == "<<" and value == shift):
                return Edit.replace(node, source.text_of(kept))
    return None


def declaration_before(source: ParsedSource, loop: Node, name: str) -> Node | None:
    """The declaration of ``name`` among the statements before ``loop`` in its block."""
    block = loop.parent
    found = None
    for statement in statements(block):
        if statement.start_byte >= loop.start_byte:
            break
        if statement.type == "declaration" and any(
            source.text_of(d.child_by_field_name("declarator") or d) == name
            for d in statement.children_by_field_name("declarator")
        ):
            found = statement
    return found


def _scaling_statement(source: ParsedSource, loop: Node, name: str) -> Node | None:
    """``v = v << 1;`` (``v <<= 1``, ``v *= 2``, ``v = v * 2``) right before the loop, in its
    block, when ``v`` is not read after it outside the loop."""
    block = loop.parent
    before = [s for s in statements(block) if s.end_byte <= loop.start_byte]
    after = [s for s in statements(block) if s.start_byte > loop.end_byte]
    for statement in reversed(before):
        if name in assigned_names(source, statement) and statement.type == "expression_statement":
            if any(
                name in {source.text_of(n) for n in descendants(s, "identifier")} for s in after
            ):
                return None
            return statement
    return None


def _step_edit(source: ParsedSource, loop: Node, update: Node, name: str, factor: int) -> Edit:
    step = update.child_by_field_name("right")
    if step is None:
        raise _refuse(f"a loop whose step `{source.snippet(update)}` is not `{name} += s`")
    edit = _factor_edit(source, step, factor)
    if edit is not None:
        return edit
    stripped = strip_parens(step)
    if stripped.type == "identifier":
        scaling = _scaling_statement(source, loop, source.text_of(stripped))
        if scaling is not None and _factor_edit(source, scaling, factor) is not None:
            return source.deletion(scaling, whole_line=True)
    raise _refuse(f"a loop whose step `{source.snippet(step)}` carries no literal factor {factor}")


def index_update(source: ParsedSource, loop: Node, name: str) -> Node | None:
    """``name += step`` in the loop's header (a ``for``) or as a statement of its body."""
    header = loop.child_by_field_name("update")
    candidates = [header] if header is not None else []
    candidates += [s.named_children[0] for s in statements(loop.child_by_field_name("body"))]
    for node in candidates:
        target = node.child_by_field_name("left") if node.type == "assignment_expression" else None
        if target is not None and source.text_of(target) == name and operator_of(node) == "+=":
            return node
    return None


def _extra_loads(
    indices: FunctionIndices, loop: Node, body: Node, base: Access, count: int
) -> list[Node]:
    """The statements of ``body`` reading the elements after ``base`` (each on its own)."""
    source = indices.source
    loads = [
        a
        for a in indices.accesses()
        if a.buffer == base.buffer and loop.start_byte <= a.node.start_byte < loop.end_byte
    ]
    extra = [a for a in loads if a.offset != base.offset]
    if len(extra) != count - 1 or len(loads) != count:
        raise _refuse(f"a loop reading {base.buffer.name} {len(loads)} times, not {count}")
    kept = _top(base.node, body)
    found = []
    for access in extra:
        statement = _top(access.node, body)
        if statement == kept:
            raise _refuse(f"a loop reading {count} elements of {base.buffer.name} in one statement")
        written = assigned_names(source, statement) - assigned_names(source, kept)
        if written:
            raise _refuse(f"an extra load whose statement also writes {', '.join(sorted(written))}")
        found.append(statement)
    return found


def pair_loads_removal(
    source: ParsedSource, function: Function, loop: Node, base: Access, count: int
) -> list[Edit]:
    """The edits that make each turn of ``loop`` read one element where it read ``count``
    (``base`` the first); NotInForm when the loop is not in the form above."""
    indices = analysis(source).indices(function)
    variable = indices.loop_of(loop)
    body = loop.child_by_field_name("body")
    if variable is None or variable.step is None or body is None:
        raise _refuse(f"loads in `{source.snippet(loop, 50)}`, not a loop with a step")
    if not variable.step.coefficient("gridDim.x").terms:
        raise _refuse(f"a loop by {variable.step}, not a grid-stride loop")
    edits = [
        source.deletion(s, whole_line=True) for s in _extra_loads(indices, loop, body, base, count)
    ]
    declaration = loop.child_by_field_name("initializer")
    if declaration is None:
        declaration = declaration_before(source, loop, variable.name)
    init = _factor_edit(source, declaration, count) if declaration is not None else None
    update = index_update(source, loop, variable.name)
    if init is None or update is None:
        raise _refuse(f"a loop whose start {variable.init} carries no literal factor {count}")
    edits += [init, _step_edit(source, loop, update, variable.name, count)]
    _check(source, function, loop, variable.init, variable.step, count, edits)
    return edits


def _check(
    source: ParsedSource,
    function: Function,
    loop: Node,
    init: IndexForm,
    step: IndexForm,
    count: int,
    edits: list[Edit],
) -> None:
    """The rewritten loop must step by ``step / count`` and start where the block's share of
    ``init`` is divided by ``count`` (the thread's offset within it stays)."""
    shift = sum(
        len(e.replacement.encode()) - (e.end_byte - e.start_byte)
        for e in edits
        if e.end_byte <= loop.start_byte
    )
    rewritten = apply_edits(source, edits).parsed
    again = rewritten.function(function.name)
    found = None
    if again is not None:
        for variable in analysis(rewritten).indices(again).loops:
            if variable.loop.start_byte == loop.start_byte + shift:
                found = variable
    blocks = init.only(["blockIdx.x"]).exact_division(count)
    want_step = step.exact_division(count)
    want_init = None if blocks is None else init.without(["blockIdx.x"]) + blocks
    if found is None or found.init != want_init or found.step != want_step:
        got = f"from {found.init} by {found.step}" if found is not None else "no loop"
        raise _refuse(f"a loop whose factor {count} does not come out cleanly ({got})")


def pair_of_loop(source: ParsedSource, function: Function, loop: Node) -> tuple[Access, int] | None:
    """The first of the loads the analysis pairs in ``loop``, and how many there are."""
    indices = analysis(source).indices(function)
    accesses = [
        a for a in indices.accesses() if a.buffer.space == "global" and a.direction != "address"
    ]
    for base, count in unrolled_pairs(indices, accesses):
        if enclosing(base.node, function, ("for_statement", "while_statement")) == loop:
            return base, count
    return None


def pair_loads_at(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """:func:`pair_loads_removal` for the loads the analysis pairs in ``loop``."""
    found = pair_of_loop(source, function, loop)
    if found is None:
        raise _refuse(f"`{source.snippet(loop, 50)}` with no loads a block apart in one turn")
    return pair_loads_removal(source, function, loop, *found)
