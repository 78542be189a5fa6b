"""Removing coarsening by rows per block: one row per block instead of ``K``.

A kernel that gives each block ``K`` rows walks them in a counted loop at the top of its
body, the row an affine function of the block's index and the loop variable (llm.c attention
softmax backward kernel 8, the rows in reverse order)::

    constexpr int T_per_block = 4;
    int t0 = T - 1 - T_per_block * blockIdx.x;
    ...
    for (int to = 0; to < T_per_block; ++to) {
        int t = t0 - to;
        if (t < 0) return;
        ...row code...
    }

launched with ``dim3(T / 4, ...)`` blocks. Block ``b`` at turn ``to`` handles the row ``a +
s * (K * b + to)`` (``s`` is +1 or -1), so with one row per block, block ``b' = K * b + to``
handles the row ``a + s * b'``: the loop goes (its body stays, unindented), the row loses the
loop variable's term, the block's factor ``K`` leaves the row's base, and every launch's grid
along x is multiplied by ``K`` (``T / 4 * 4``), so exactly the rows of the old grid are
handled, each by one block. The rewritten row is checked on the index forms.

The turns of the loop must be independent for this to keep the result: refused, naming what
is carried, when a parameter or a local declared outside the loop is written inside it, a
global buffer is both read and written in it, a shared array written in it is read before a
barrier that follows every write of it (or written conditionally, or at a slot that depends
on the turn), the kernel reads ``blockIdx.x`` outside the row's base or reads ``gridDim.x``,
or a ``return`` in the loop is not a guard the later rows would also take (``if (t < 0)
return;`` for rows walked downwards).
"""

from __future__ import annotations

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.analysis.indices import is_loop_atom
from klineage.cuda.cexpr import precedence
from klineage.cuda.edit import Edit, apply_edits
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    builtin_of,
    call_arguments,
    descendants,
    operator_of,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import splice, statements, unshift

__all__ = ["grid_along_x", "rows_loop_removal", "rows_per_block_count"]

_NEEDED = (
    "rows per block: a loop `for (r = 0; r < K; ++r)` (K fixed at compile time) at the top of "
    "the kernel whose body declares its row `t = t0 - r` (or `+ r`) with `t0` holding `K * "
    "blockIdx.x`, and whose turns carry no state from one row to the next"
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def _identifier_uses(source: ParsedSource, root: Node, name: str) -> list[Node]:
    return [n for n in walk(root) if n.type == "identifier" and source.text_of(n) == name]


def _row_declaration(
    source: ParsedSource, body: Node, variable: str
) -> tuple[Node, str, Node, Node]:
    """The statement ``int t = X -/+ r;`` of the loop body: (declaration, row name, the
    term ``X``, the loop variable's identifier)."""
    uses = _identifier_uses(source, body, variable)
    if len(uses) != 1:
        raise _refuse(f"a loop whose body reads its variable {variable} {len(uses)} times")
    use = uses[0]
    plus = use.parent
    if plus is None or plus.type != "binary_expression" or operator_of(plus) not in "+-":
        raise _refuse(f"a loop whose variable {variable} is not added to a row's base")
    left, right = plus.child_by_field_name("left"), plus.child_by_field_name("right")
    assert left is not None and right is not None
    if operator_of(plus) == "-" and right != use:
        raise _refuse(f"a row `{source.text_of(plus)}` that subtracts its base")
    base = left if right == use else right
    declarator = plus.parent
    declaration = declarator.parent if declarator is not None else None
    if (
        declarator is None
        or declarator.type != "init_declarator"
        or declaration is None
        or declaration.type != "declaration"
        or declaration.parent != body
    ):
        raise _refuse(f"a row `{source.text_of(plus)}` that is not a local of the loop's body")
    target = declarator.child_by_field_name("declarator")
    assert target is not None
    return declaration, source.text_of(target), base, use


def _factor(source: ParsedSource, function: Function, loop: Node, count: int, bound: str) -> Node:
    """The one product ``K * blockIdx.x`` (either order) in the kernel before the loop;
    every ``blockIdx.x`` of the kernel must be in it."""
    assert function.body is not None
    products = []
    for node in descendants(function.body, "binary_expression"):
        if operator_of(node) != "*" or node.start_byte >= loop.start_byte:
            continue
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            continue
        for factor, other in ((left, right), (right, left)):
            text = source.text_of(strip_parens(factor))
            block = builtin_of(source, strip_parens(other)) == "blockIdx.x"
            if block and text in (bound, str(count)):
                products.append(node)
    blocks = [
        n
        for n in walk(function.body)
        if n.type == "field_expression" and builtin_of(source, n) == "blockIdx.x"
    ]
    if len(products) != 1:
        raise _refuse(f"a kernel with {len(products)} products `{bound} * blockIdx.x`, not one")
    outside = [
        b for b in blocks if not products[0].start_byte <= b.start_byte < products[0].end_byte
    ]
    if outside:
        raise _refuse(
            f"a kernel reading blockIdx.x outside its row's base (`{source.snippet(outside[0])}`)"
        )
    if any(
        n.type == "field_expression" and builtin_of(source, n) == "gridDim.x"
        for n in walk(function.body)
    ):
        raise _refuse("a kernel that reads gridDim.x, which more blocks would change")
    return products[0]


def _base_read_once(source: ParsedSource, function: Function, product: Node, row: Node) -> None:
    """The local whose initializer holds ``product`` is a statement of the kernel read only
    by the row's declaration: its value changes, and nothing else may see it."""
    assert function.body is not None
    declaration = _top_statement(product, function.body)
    names = _declared_in(source, declaration) if declaration is not None else set()
    if declaration is None or declaration.type != "declaration" or len(names) != 1:
        raise _refuse(f"a block's share `{source.text_of(product)}` outside a local of the kernel")
    (name,) = names
    reads = [
        n
        for n in _identifier_uses(source, function.body, name)
        if not declaration.start_byte <= n.start_byte < declaration.end_byte
    ]
    if name in assigned_names(source, function.body) or any(
        not row.start_byte <= n.start_byte < row.end_byte for n in reads
    ):
        raise _refuse(f"a row base {name} read outside the row's declaration")


def _declared_in(source: ParsedSource, root: Node) -> set[str]:
    names = set()
    for declaration in [root, *descendants(root, "declaration")]:
        if declaration.type != "declaration":
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator") or declarator
            while target.type not in ("identifier",) and target.named_children:
                inner = target.child_by_field_name("declarator")
                if inner is None:
                    break
                target = inner
            names.add(source.text_of(target))
    return names


def _top_statement(node: Node, body: Node) -> Node | None:
    """The statement of ``body`` (a compound statement) that holds ``node``."""
    current: Node | None = node
    while current is not None and current.parent != body:
        current = current.parent
    return current


def _carried_state(
    source: ParsedSource, function: Function, loop: Node, body: Node, row: str, down: bool
) -> None:
    """Refuses when one turn of the loop can see what an earlier turn did."""
    assert function.body is not None
    inside = _declared_in(source, body)
    carried = sorted(assigned_names(source, body) - inside)
    if carried:
        raise _refuse(f"rows that carry {carried[0]} from one turn to the next")
    indices = analysis(source).indices(function)
    accesses = [
        a
        for a in indices.accesses()
        if loop.start_byte <= a.node.start_byte < loop.end_byte and a.direction != "address"
    ]
    if any(a.helper is not None for a in accesses):
        raise _refuse("rows whose loop calls a helper that touches memory")
    by_buffer: dict[tuple[str, str], list] = {}
    for access in accesses:
        if access.direction == "both":
            raise _refuse(f"rows that read and update {access.buffer.name} in one access")
        if access.direction not in ("load", "store"):
            raise _refuse(f"rows that {access.direction} {access.buffer.name}")
        by_buffer.setdefault((access.buffer.space, access.buffer.name), []).append(access)
    barriers = [
        s
        for s in (_top_statement(b, body) for b in analysis(source).shared(function).barriers)
        if s is not None and s.parent == body and s.type == "expression_statement"
    ]
    for (space, name), group in by_buffer.items():
        stores = [a for a in group if a.direction == "store"]
        loads = [a for a in group if a.direction == "load"]
        if not stores or not loads:
            continue
        if space == "global" or space not in ("shared",):
            raise _refuse(f"rows that both read and write {name}, which a later row may read")
        for store in stores:
            top = _top_statement(store.node, body)
            if top is None or top.type != "expression_statement":
                raise _refuse(f"rows writing {name} conditionally")
            if any(is_loop_atom(a) for a in store.offset.atoms()) or store.offset.opaque:
                raise _refuse(f"rows writing {name}[{store.offset}], a slot that moves by turn")
        last = max(a.node.start_byte for a in stores)
        first = min(a.node.start_byte for a in loads)
        if not any(last < b.start_byte and b.end_byte <= first for b in barriers):
            raise _refuse(f"rows reading {name} with no barrier after every write of it")
    for node in walk(body):
        if node.type in ("break_statement", "continue_statement", "goto_statement"):
            owner = node.parent
            while owner is not None and owner.type not in (
                "for_statement",
                "while_statement",
                "do_statement",
                "switch_statement",
            ):
                owner = owner.parent
            if owner == loop:
                raise _refuse(f"rows ended by `{source.text_of(node)}`")
        if node.type == "return_statement":
            _guard(source, node, body, row, down)


def _guard(source: ParsedSource, node: Node, body: Node, row: str, down: bool) -> None:
    """``if (t < e) return;`` (rows walked downwards) or ``if (t >= e) return;`` (upwards),
    ``e`` unchanged by the loop: later rows take it too."""
    statement = node.parent
    if statement is not None and statement.type == "compound_statement":
        statement = statement.parent if len(statements(statement)) == 1 else None
    wanted = ("<", "<=") if down else (">", ">=")
    if statement is not None and statement.type == "if_statement" and statement.parent == body:
        clause = statement.child_by_field_name("condition")
        values = [c for c in clause.named_children if c.type != "comment"] if clause else []
        value = strip_parens(values[0]) if len(values) == 1 else None
        if (
            value is not None
            and value.type == "binary_expression"
            and operator_of(value) in wanted
            and statement.child_by_field_name("alternative") is None
        ):
            left, right = value.child_by_field_name("left"), value.child_by_field_name("right")
            assert left is not None and right is not None
            moved = assigned_names(source, body) | _declared_in(source, body)
            reads = {source.text_of(n) for n in walk(right) if n.type == "identifier"}
            if source.text_of(strip_parens(left)) == row and not reads & moved:
                return
    raise _refuse(
        f"rows ended by `{source.snippet(statement or node, 40)}`, not a guard every later row "
        "takes too"
    )


def grid_along_x(source: ParsedSource, grid: Node) -> Node:
    """The expression of a launch's grid along x: the grid itself, or the first argument of
    ``dim3(...)``; NotInForm for a grid held in a variable, which the edit cannot reach."""
    stripped = strip_parens(grid)
    if stripped.type == "call_expression" and source.text_of(
        stripped.child_by_field_name("function") or stripped
    ) in ("dim3", "::dim3"):
        args = call_arguments(stripped)
        if not args:
            raise _refuse(f"a launch with the grid `{source.snippet(grid, 40)}`")
        return args[0]
    if stripped.type == "identifier":
        raise _refuse(f"a launch with the grid variable {source.text_of(stripped)}")
    return stripped


def _launch_edit(source: ParsedSource, launch: Launch, count: int) -> Edit:
    grid = launch.grid
    if grid is None:
        raise _refuse("a launch without a grid")
    target = grid_along_x(source, grid)
    text = " ".join(source.text_of(target).split())
    left = text if precedence(target) >= 13 else f"({text})"  # 13: multiplicative
    return Edit.replace(target, f"{left} * {count}")


def _row_form(source: ParsedSource, function: Function, row: str) -> IndexForm:
    assert function.body is not None
    for declaration in descendants(function.body, "declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if target is not None and value is not None and source.text_of(target) == row:
                return analysis(source).indices(function).form(value)
    raise _refuse(f"a row {row} the rewrite lost")


def _unused_constant(
    source: ParsedSource, function: Function, name: str, removed: list[Node]
) -> Edit | None:
    """The deletion of the kernel's local ``constexpr`` count when only removed code read it."""
    assert function.body is not None
    declarations = [
        d
        for d in statements(function.body)
        if d.type == "declaration" and name in _declared_in(source, d)
    ]
    if len(declarations) != 1:
        return None
    reads = [
        n
        for n in _identifier_uses(source, function.body, name)
        if not any(r.start_byte <= n.start_byte < r.end_byte for r in [*removed, declarations[0]])
    ]
    return None if reads else source.deletion(declarations[0], whole_line=True)


def rows_per_block_count(source: ParsedSource, function: Function, loop: Node) -> int | None:
    """The loop's trip count ``K`` (rows a block), where it is fixed at compile time."""
    variable = analysis(source).indices(function).loop_of(loop)
    if variable is None or variable.bound is None:
        return None
    return analysis(source).indices(function).form(variable.bound).value


def rows_loop_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """One row per block instead of the loop ``loop`` over a block's rows, and every launch's
    grid along x ``K`` times larger; NotInForm when not in the form."""
    indices = analysis(source).indices(function)
    variable = indices.loop_of(loop) if loop.type == "for_statement" else None
    body = loop.child_by_field_name("body")
    header = source.snippet(loop, 50)
    if (
        variable is None
        or variable.bound is None
        or variable.init.value != 0
        or variable.step is None
        or variable.step.value != 1
        or body is None
        or body.type != "compound_statement"
    ):
        raise _refuse(f"`{header}`, not a loop from 0 by 1 over a block")
    if loop.parent != function.body:
        raise _refuse(f"`{header}`, a loop inside another statement")
    trip = indices.form(variable.bound)
    count = trip.value
    if count is None or count < 2:
        raise _refuse(f"a loop to {trip}, not a count fixed at compile time")
    bound = source.text_of(strip_parens(variable.bound))
    declaration, row, base, use = _row_declaration(source, body, variable.name)
    if row in assigned_names(source, function.body):
        raise _refuse(f"a row {row} written after its declaration")
    old = _row_form(source, function, row)
    sign = old.coefficient(variable.atom).value
    if sign not in (1, -1) or old.coefficient("blockIdx.x") != IndexForm.constant(sign * count):
        raise _refuse(f"a row {row} = {old}, not its base plus or minus {variable.name}")
    _carried_state(source, function, loop, body, row, sign == -1)
    product = _factor(source, function, loop, count, bound)
    left, right = product.child_by_field_name("left"), product.child_by_field_name("right")
    assert left is not None and right is not None
    kept = left if builtin_of(source, strip_parens(left)) == "blockIdx.x" else right
    inner = [(use.parent, source.text_of(base))]
    if loop.start_byte <= product.start_byte < loop.end_byte:
        inner.append((product, source.text_of(kept)))
        edits = []
    else:
        _base_read_once(source, function, product, declaration)
        edits = [Edit.replace(product, source.text_of(kept))]
    children = body.named_children
    text = splice(source, children[0].start_byte, children[-1].end_byte, inner)
    step = source.indent_of(children[0].start_byte)
    outer = source.indent_of(loop.start_byte)
    unindented = unshift(text, len(step) - len(outer)) if len(step) >= len(outer) else None
    if unindented is None:
        raise _refuse(f"`{header}`, a loop body indented unevenly")
    edits.append(Edit(loop.start_byte, loop.end_byte, unindented))
    constant = _unused_constant(source, function, bound, [loop, product])
    if constant is not None:
        edits.append(constant)
    launches = source.launches_of(function)
    if not launches:
        raise _refuse(f"rows per block with no launch of {function.name} in the file")
    edits += [_launch_edit(source, launch, count) for launch in launches]
    _check(source, function, edits, row, old, variable.atom)
    return edits


def _check(
    source: ParsedSource,
    function: Function,
    edits: list[Edit],
    row: str,
    old: IndexForm,
    atom: str,
) -> None:
    """The rewritten row is ``a + s * blockIdx.x`` where the old one was ``a + s * (K *
    blockIdx.x + r)``."""
    rewritten = apply_edits(source, edits).parsed
    again = rewritten.function(function.name)
    if again is None:
        raise _refuse(f"a kernel {function.name} the rewrite lost")
    new = _row_form(rewritten, again, row)
    sign = old.coefficient(atom)
    rest = old.substitute({atom: IndexForm.constant(0)}).without(["blockIdx.x"])
    if new.coefficient("blockIdx.x") != sign or new.without(["blockIdx.x"]) != rest:
        raise _refuse(f"a row {row} = {old} the rewrite cannot keep ({new})")
