"""Thread per row -> group per row where a ``__device__`` helper holds the row's reduction.

Public kernels hand the row index to a helper that walks the row and returns its statistics
(``stats = row_helper(idx, x, n)``); what a thread per row leaves of them is the helper
walking the whole row alone. Spreading such a kernel over a group edits
the helper in place (it has no other caller): its row loops start at the thread's rank in the
group and step by the group's size, and after its last row loop each value the loops fold is
combined over the group, a running (max, sum of exponentials) pair as ``M = reduce_max(m); s
= reduce_sum(s * exp(m - M)); m = M`` (:mod:`klineage.mechanisms._online_pair_form` reads the
fold from what the statements compute). The code after that point sees the group's values.

Row loops, each a statement of the helper's body:

- ``for (T c = S; c < n; ++c)`` -> ``for (T c = S + rank; c < n; c += size)``;
- a walk down the row, ``T i = S;`` then optionally ``while (C) { ...; i -= 1; }`` for the
  partial end (``C`` must hold on a top run of ``i`` and fail below: ``(i + 1) * V > n``)
  then ``for (; i >= 0; i -= 1)`` -> ``i = S - rank`` and every step by the group's size.

Refused, with the line: a helper another call shares, that writes memory, returns early,
loops elsewhere than in its body's statements, carries any other value from one element to
the next, or reads a folded value before the group has combined it; a sum that does not
start at zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from klineage.cuda.cexpr import BINARY_PRECEDENCE, fold_int, operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    assigned_names,
    declaration_names,
    identifier_names,
    statement_after,
    walk,
)
from klineage.mechanisms._online_pair_form import (
    Fold,
    FoldFormError,
    block_folds,
    combine_text,
    fold_blocks,
)
from klineage.mechanisms._reductions_util import (
    call_name,
    graph,
    inside,
    is_zero_literal,
    named_statements,
    plain_type,
    strip_parens,
)
from klineage.mechanisms._rows_forms import NotCanonical, operator_of, single_init
from klineage.mechanisms._thread_row_steps import constant_value, steps_down, vector_access
from klineage.mechanisms._tiles_util import Locals

_LOOPS = ("for_statement", "while_statement", "do_statement")


@dataclass
class HelperLoop:
    """A row loop of the helper (or a walk down, its declaration and loops together)."""

    variable: str
    start: Node
    """The first index, rewritten to start at the thread's rank."""
    steps: list[Node]
    """The ``c += 1`` / ``i -= 1`` expressions, rewritten to step by the group."""
    down: bool
    nodes: list[Node] = field(default_factory=list)
    """The loop statements (the ``while`` and the ``for`` of a walk down)."""


@dataclass
class HelperRows:
    """A helper holding a thread per row's reduction, ready to be spread over a group."""

    helper: Function
    loops: list[HelperLoop]
    folds: list[Fold]
    after: Node
    """The last row loop: the group combines the folded values right after it."""

    @property
    def ops(self) -> list[str]:
        found: list[str] = []
        for fold in self.folds:
            found += ["max", "sum"] if fold.kind == "pair" else [fold.kind]
        return list(dict.fromkeys(found))


def helper_rows(source: ParsedSource, kernel: Function, statements: list[Node]) -> list[HelperRows]:
    """The helpers called by ``statements`` (a thread-per-row kernel's code after its bound
    check, outside its loops) whose body walks a row; :class:`NotCanonical` when one does
    in a form this rule does not spread."""
    found: list[HelperRows] = []
    for statement in statements:
        if statement.type in _LOOPS:
            continue
        for call in inside(source, statement, "call_expression"):
            helper = source.function(call_name(source, call) or "")
            if helper is None or helper.body is None or helper.is_kernel or helper == kernel:
                continue
            if not inside(source, helper.body, *_LOOPS):
                continue  # a helper of scalar code (a load, a cast)
            if any(h.helper == helper for h in found):
                raise NotCanonical(f"{kernel.name} calls {helper.name} twice")
            found.append(_HelperWalk(source, helper).rows())
    return found


class _HelperWalk:
    def __init__(self, source: ParsedSource, helper: Function) -> None:
        assert helper.body is not None
        self.source = source
        self.helper = helper
        self.body = helper.body
        self.types = source.local_types(helper)

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    def rows(self) -> HelperRows:
        name = self.helper.name
        if len(self.source.calls_named(name)) != 1:
            raise NotCanonical(
                f"{name} has other callers, so spreading its row loops would change them too"
            )
        self.check_pure()
        self.check_callees()
        statements = named_statements(self.body)
        loops = self.row_loops(statements)
        after = max((n for loop in loops for n in loop.nodes), key=lambda n: n.start_byte)
        tracked = self.carried(loops)
        folds = self.folds(loops, tracked)
        self.check_starts(folds)
        self.check_unread(tracked, loops, after)
        return HelperRows(self.helper, loops, folds, after)

    def check_pure(self) -> None:
        """The helper writes no memory (every thread of the group runs all of it) and returns
        only at its end (every thread reaches the group's combine)."""
        self.check_writes()
        source, name = self.source, self.helper.name
        returns = inside(source, self.body, "return_statement")
        last = named_statements(self.body)[-1:] if named_statements(self.body) else []
        for node in returns:
            if node not in last:
                raise NotCanonical(
                    f"{name} returns at line {self.line(node)} before its end, so not every "
                    "thread of a group would reach the group's combine"
                )

    def check_writes(self) -> None:
        """The function writes nothing but its own locals."""
        source, name = self.source, self.helper.name
        for node in inside(source, self.body, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is None or self._local_target(strip_parens(target)):
                continue
            raise NotCanonical(
                f"{name} writes {source.text_of(target)} at line {self.line(node)}; a helper "
                "this rule spreads writes no memory"
            )
        for call in inside(source, self.body, "call_expression"):
            access = vector_access(source, call)
            called = call_name(source, call) or ""
            if (access is not None and access.kind == "store") or called.startswith(
                ("atomic", "__st")
            ):
                raise NotCanonical(f"{name} stores through {called} at line {self.line(call)}")

    def check_callees(self) -> None:
        """The functions the helper calls write no memory either (each thread of the group
        would repeat the write)."""
        calls = graph(self.source)
        for callee in sorted(calls.reachable(self.helper.name)):
            for function in calls.functions(callee):
                if function.body is not None and function != self.helper:
                    try:
                        _HelperWalk(self.source, function).check_writes()
                    except NotCanonical as why:
                        raise NotCanonical(f"{self.helper.name} calls {callee}: {why}") from None

    def _local_target(self, target: Node) -> bool:
        """A name, or an element or member of an array or struct the helper declares."""
        while target.type in ("subscript_expression", "field_expression"):
            operator = target.child_by_field_name("operator")
            if operator is not None and operator.type == "->":
                return False
            inner = target.child_by_field_name("argument")
            if inner is None:
                return False
            target = strip_parens(inner)
        if target.type != "identifier":
            return False
        name = self.source.text_of(target)
        declared = any(
            name in declaration_names(self.source, d)
            for d in inside(self.source, self.body, "declaration")
        )
        return declared and "*" not in self.types.get(name, "*")

    # -- the row loops --------------------------------------------------------------------

    def row_loops(self, statements: list[Node]) -> list[HelperLoop]:
        source, name = self.source, self.helper.name
        loops: list[HelperLoop] = []
        taken: set[int] = set()
        for statement in statements:
            if statement.start_byte in taken:
                continue
            if statement.type == "for_statement":
                loops.append(self.for_loop(statement))
            elif statement.type in _LOOPS:
                raise NotCanonical(
                    f"the {statement.type.split('_')[0]} loop at line {self.line(statement)} of "
                    f"{name} is not a walk down its row (T i = S; while (C) {{...; i -= 1;}} "
                    "for (; i >= 0; i -= 1))"
                )
            elif statement.type == "declaration":
                down = self.walk_down(statement)
                if down is not None:
                    loops.append(down)
                    taken |= {n.start_byte for n in down.nodes}
            elif inside(source, statement, *_LOOPS):
                raise NotCanonical(
                    f"{name} loops inside the statement at line {self.line(statement)}; this "
                    "rule spreads loops that are statements of the helper's body"
                )
        if not loops:
            raise NotCanonical(f"{name} has no loop over its row")
        written = assigned_names(source, self.body)
        locals_ = Locals(source, self.helper)
        for loop in loops:
            if locals_.depends_on(loop.start, written - {loop.variable}):
                raise NotCanonical(
                    f"the row loop at line {self.line(loop.nodes[0])} of {name} starts at "
                    f"{source.text_of(loop.start)}, which reads a name the helper writes"
                )
            self.check_variable(loop)
        return loops

    def for_loop(self, node: Node) -> HelperLoop:
        source = self.source
        found = source.loop_at(node)
        line = self.line(node)
        declared = single_init(source, found.initializer) if found and found.initializer else None
        if found is None or declared is None or found.update is None or found.body is None:
            raise NotCanonical(
                f"the loop at line {line} of {self.helper.name} is not for (T c = S; c < n; ++c)"
            )
        variable, start = declared
        condition = strip_parens(found.condition) if found.condition is not None else None
        left = condition.child_by_field_name("left") if condition is not None else None
        update = "".join(source.text_of(found.update).split())
        if (
            condition is None
            or left is None
            or source.text_of(left) != variable
            or operator_of(condition) not in ("<", "<=")
            or update not in (f"++{variable}", f"{variable}++", f"{variable}+=1")
        ):
            raise NotCanonical(
                f"the loop at line {line} of {self.helper.name} is not for (T {variable} = S; "
                f"{variable} < n; ++{variable})"
            )
        return HelperLoop(variable, start, [found.update], False, [node])

    def walk_down(self, declaration: Node) -> HelperLoop | None:
        """``T i = S;`` followed by ``while (C) {...; i -= 1;}`` and ``for (; i >= 0; i -=
        1)`` (or by the ``for`` alone); None when no loop follows the declaration."""
        source = self.source
        declared = single_init(source, declaration)
        following = statement_after(declaration)
        if declared is None or following is None or following.type not in _LOOPS:
            return None
        variable, start = declared
        if variable not in identifier_names(source, following):
            return None  # the loop walks something else
        found = source.loop_at(following)
        if found is not None and found.kind == "for" and found.initializer is not None:
            return None  # a loop of its own
        nodes, steps = [], []
        if following.type == "while_statement":
            steps.append(self.while_step(following, variable))
            nodes.append(following)
            following = statement_after(following)
        back = source.loop_at(following) if following is not None else None
        test = strip_parens(back.condition) if back and back.condition is not None else None
        left = test.child_by_field_name("left") if test is not None else None
        if (
            back is None
            or back.kind != "for"
            or back.initializer is not None
            or test is None
            or left is None
            or source.text_of(left) != variable
            or operator_of(test) != ">="
            or fold_int(source, test.child_by_field_name("right")) != 0
            or not steps_down(source, back.update, variable, "1")
        ):
            raise NotCanonical(
                f"{variable} at line {self.line(declaration)} starts a walk down the row, which "
                f"this rule takes as `while (C) {{...; {variable} -= 1;}}` then `for (; "
                f"{variable} >= 0; {variable} -= 1)`"
            )
        assert back.update is not None and following is not None
        return HelperLoop(variable, start, [*steps, back.update], True, [*nodes, following])

    def while_step(self, loop: Node, variable: str) -> Node:
        """The ``i -= 1`` that ends the body of the walk's ``while``, whose condition holds on
        a top run of ``i`` (increasing in ``i``: true above a point, false below it), so a
        thread's stride down leaves it where a single thread would."""
        source = self.source
        body = loop.child_by_field_name("body")
        last = named_statements(body)[-1] if body is not None and named_statements(body) else None
        step = last.named_children[0] if last is not None and last.named_children else None
        condition = loop.child_by_field_name("condition")
        if step is None or not steps_down(source, step, variable, "1"):
            raise NotCanonical(
                f"the while loop at line {self.line(loop)} does not end with {variable} -= 1"
            )
        if condition is None or not _top_run(source, self.helper, condition, variable):
            raise NotCanonical(
                f"the while loop at line {self.line(loop)} runs while "
                f"{source.text_of(condition) if condition else '?'}, which this rule needs to "
                f"hold on a top run of {variable} (a comparison increasing in {variable})"
            )
        return step

    def check_variable(self, loop: HelperLoop) -> None:
        """The loop variable moves only by its steps, and nothing leaves the loop early."""
        source = self.source
        steps = {(s.start_byte, s.end_byte) for s in loop.steps}
        for node in loop.nodes:
            for write in inside(source, node, "assignment_expression", "update_expression"):
                target = write.child_by_field_name("left") or write.child_by_field_name("argument")
                if target is None or source.text_of(target) != loop.variable:
                    continue
                if (write.start_byte, write.end_byte) not in steps:
                    raise NotCanonical(
                        f"{loop.variable} is written at line {self.line(write)} besides its step"
                    )
            for jump in inside(source, node, "break_statement", "continue_statement"):
                if _target_loop(jump) in loop.nodes:
                    raise NotCanonical(
                        f"the {jump.type.split('_')[0]} at line {self.line(jump)} leaves the "
                        "row loop, where a group's threads would leave at different elements"
                    )
        later = statement_after(loop.nodes[-1])
        while later is not None:
            if loop.variable in identifier_names(source, later):
                raise NotCanonical(
                    f"{loop.variable} is read after its row loop (line {self.line(later)}), "
                    "where each thread of a group leaves it elsewhere"
                )
            later = statement_after(later)

    # -- what the loops fold --------------------------------------------------------------

    def carried(self, loops: list[HelperLoop]) -> set[str]:
        """Names declared in the helper's body outside the loops and written inside them."""
        source = self.source
        inner = {
            name
            for loop in loops
            for node in loop.nodes
            for d in inside(source, node, "declaration")
            for name in declaration_names(source, d)
        }
        written = {
            name for loop in loops for node in loop.nodes for name in assigned_names(source, node)
        }
        variables = {loop.variable for loop in loops}
        return written - inner - variables

    def folds(self, loops: list[HelperLoop], tracked: set[str]) -> list[Fold]:
        source = self.source
        try:
            blocks = fold_blocks(source, [n for loop in loops for n in loop.nodes], tracked)
        except FoldFormError as why:
            raise NotCanonical(str(why)) from None
        folds: dict[tuple[str, ...], Fold] = {}
        for block in blocks.values():
            try:
                found = block_folds(source, block, tracked)
            except FoldFormError as why:
                raise NotCanonical(str(why)) from None
            for fold in found:
                if folds.setdefault(fold.names, fold).kind != fold.kind:
                    raise NotCanonical(f"{', '.join(fold.names)} are folded two ways")
        folded = [n for names in folds for n in names]
        for name in tracked:
            if folded.count(name) != 1:
                raise NotCanonical(
                    f"{name} is carried from one element to the next in a way this rule does "
                    "not combine over a group"
                )
            if plain_type(self.types.get(name, "")) != "float":
                raise NotCanonical(f"{name} is not a float (only float reductions are emitted)")
        return list(folds.values())

    def check_starts(self, folds: list[Fold]) -> None:
        """Every thread starts each sum at zero: its one write outside the loops is its
        declaration, with a zero literal (a maximum may start anywhere)."""
        source = self.source
        for fold in folds:
            sums = fold.names[1:] if fold.kind == "pair" else fold.names
            if fold.kind in ("max", "min"):
                continue
            for name in sums:
                declaration = next(
                    (
                        d
                        for d in named_statements(self.body)
                        if d.type == "declaration" and name in declaration_names(source, d)
                    ),
                    None,
                )
                value = single_init(source, declaration) if declaration is not None else None
                if value is None or not is_zero_literal(source, value[1]):
                    raise NotCanonical(
                        f"the sum {name} does not start from a zero literal in {self.helper.name}"
                        ", so each thread of a group would add its start value"
                    )

    def check_unread(self, tracked: set[str], loops: list[HelperLoop], after: Node) -> None:
        """No folded value is read or written outside the row loops before the combine."""
        source = self.source
        inside_loops = [(n.start_byte, n.end_byte) for loop in loops for n in loop.nodes]
        for node in walk(self.body):
            if node.type != "identifier" or source.text_of(node) not in tracked:
                continue
            if node.start_byte >= after.end_byte:
                continue
            if any(a <= node.start_byte < b for a, b in inside_loops):
                continue
            parent = node.parent
            declared = parent is not None and (
                parent.type == "declaration"
                or (
                    parent.type == "init_declarator"
                    and parent.child_by_field_name("declarator") == node
                )
            )
            if not declared:
                raise NotCanonical(
                    f"{source.text_of(node)} is used at line {self.line(node)}, before the "
                    "group combines it after the last row loop, where each thread holds only "
                    "its share of the row"
                )


def _top_run(source: ParsedSource, function: Function, condition: Node, variable: str) -> bool:
    """``L > R`` or ``L >= R`` with ``L`` increasing in ``variable`` and ``R`` free of it (or
    the mirror ``R < L``)."""
    if condition.type == "condition_clause" and condition.named_children:
        condition = condition.named_children[-1]
    condition = strip_parens(condition)
    operator = operator_of(condition)
    left, right = condition.child_by_field_name("left"), condition.child_by_field_name("right")
    if left is None or right is None:
        return False
    if operator in ("<", "<="):
        left, right = right, left
    elif operator not in (">", ">="):
        return False
    return variable not in identifier_names(source, right) and _increasing(
        source, function, left, variable
    )


def _increasing(source: ParsedSource, function: Function, node: Node, variable: str) -> bool:
    """Whether ``node`` is ``variable`` plus terms free of it, times positive constants."""
    node = strip_parens(node)
    if node.type == "identifier":
        return source.text_of(node) == variable
    if node.type != "binary_expression":
        return False
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    assert left is not None and right is not None
    operator = operator_of(node)
    names = (identifier_names(source, left), identifier_names(source, right))
    if operator in ("+", "-"):
        if variable in names[1]:
            return (
                operator == "+"
                and variable not in names[0]
                and _increasing(source, function, right, variable)
            )
        return _increasing(source, function, left, variable)
    if operator == "*":
        for varying, scale, scale_names in ((left, right, names[1]), (right, left, names[0])):
            if variable in scale_names:
                continue
            value = constant_value(source, function, scale)
            return (
                value is not None and value > 0 and _increasing(source, function, varying, variable)
            )
    return False


def _target_loop(jump: Node) -> Node | None:
    """The loop (or switch, for a ``break``) a ``break`` or ``continue`` leaves."""
    node = jump.parent
    while node is not None:
        switch = jump.type == "break_statement" and node.type == "switch_statement"
        if node.type in _LOOPS or switch:
            return node
        node = node.parent
    return None


def helper_edits(
    source: ParsedSource, rows: HelperRows, rank: str, size: str, group: str
) -> list[Edit]:
    """The edits that spread ``rows`` over a group whose threads are numbered ``rank`` among
    ``size``, combining each fold with ``{group}_reduce_{op}``."""
    edits: list[Edit] = []
    minus = BINARY_PRECEDENCE["-"] + 1
    ranked = rank if rank.replace(".", "").isidentifier() else f"({rank})"
    for loop in rows.loops:
        if loop.down:
            start = operand(source, loop.start, BINARY_PRECEDENCE["-"])
            edits.append(Edit.replace(loop.start, f"{start} - {ranked}"))
            step = f"{loop.variable} -= {size}"
        elif is_zero_literal(source, loop.start):
            edits.append(Edit.replace(loop.start, rank))
            step = f"{loop.variable} += {size}"
        else:
            start = operand(source, loop.start, minus)
            edits.append(Edit.replace(loop.start, f"{start} + {ranked}"))
            step = f"{loop.variable} += {size}"
        edits += [Edit.replace(s, step) for s in loop.steps]
    indent = source.indent_of(rows.after.start_byte)
    taken = identifier_names(source, rows.helper.body) if rows.helper.body else set()
    lines = [combine_text(fold, group, indent, taken) for fold in rows.folds]
    text = "".join(f"\n{indent}{line}" for line in lines)
    return [*edits, Edit.insert(rows.after.end_byte, text)]
