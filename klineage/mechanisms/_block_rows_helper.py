"""A block per row whose row code is handed to a helper: thread per row, one thread as a block.

Public kernels pass the row index to a ``__device__`` helper that walks the row by the block
and reduces it through a block reducer (``stats = row_stats(idx, x, cols)`` where the helper
strides ``for (c = threadIdx.x; c < cols; c += blockDim.x)``, or walks the row backwards from
``n + threadIdx.x - blockDim.x``, and calls ``block_reduce<warp_max>(m)``). Code that is
correct for any block size is correct for a block of one thread, and a block reduction over
one thread is its value. So the removal runs each thread as a one-thread block over a row of
its own: in the kernel and in the helpers that hold its row code, ``threadIdx.x`` becomes 0
(dropped from a sum), ``blockDim.x`` becomes 1, a block reduction ``block_reduce<op>(v, ...)``
becomes ``v`` and a ``threadIdx.x == 0`` guard its body; the row index becomes the thread's,
with a bound check, and each launch covers the rows with blocks of the same size (both
written by the canonical rule, :func:`klineage.mechanisms._rows_removal.group_rows`).

Refused, with what ties the code to the block, where the row code shares memory or
synchronizes outside the block reducers (``__shared__``, barriers, shuffles, cooperative
groups), uses another built-in than ``threadIdx.x`` and ``blockDim.x`` (or ``blockIdx.x``
outside the row index), or lives in a helper that another caller shares.
"""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.callgraph import BLOCK_BARRIERS, WARP_COLLECTIVES
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.mechanisms._reductions_util import (
    builtin_uses,
    call_name,
    inside,
    is_builtin,
    line_deletion,
    strip_parens,
)

_ONE_THREAD = {"threadIdx.x": "0", "blockDim.x": "1"}
"""What the built-ins of a one-thread block are."""


_PRIMARY = frozenset(
    {
        "identifier",
        "number_literal",
        "field_expression",
        "call_expression",
        "subscript_expression",
        "parenthesized_expression",
    }
)
"""Expressions that need no parentheses where a reduction's call stood."""


class HelperRowsError(ValueError):
    """The kernel's row code is not in the form this removal takes; the message says why."""


def helper_rows(
    source: ParsedSource,
    kernel: Function,
    reducers: set[str],
    row_uses: list[Node],
    row_edits: list[Edit],
) -> list[Edit]:
    """The one-thread-block rewrite of ``kernel``'s row code (in the kernel and the helpers
    that hold it). ``row_edits`` are the caller's
    rewrites of the ``blockIdx.x`` row uses: one inside a node this rewrite replaces is written
    into its text (the caller drops it, :func:`outside`)."""
    functions = _row_functions(source, kernel, reducers)
    checked = reducers | {f.name for f in functions}
    edits: list[Edit] = []
    for function in functions:
        assert function.body is not None
        _check_alone(source, function, kernel, checked, row_uses)
        writer = _OneThread(source, reducers, row_edits)
        edits += writer.edits(function.body)
    return edits


def _row_functions(source: ParsedSource, kernel: Function, reducers: set[str]) -> list[Function]:
    """The kernel and every helper it reaches (not through a reducer) whose code reads the
    block layout or block-reduces; each must be called only from these functions."""
    graph = analysis(source).call_graph
    pruned = graph.graph.subgraph(n for n in graph.graph if n not in reducers)
    found: list[Function] = [kernel]
    seen = {kernel.name}
    queue = sorted(pruned.successors(kernel.name))
    while queue:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        helper = graph.definition(name)
        if helper is None or helper.body is None:
            continue
        queue += sorted(n for n in pruned.successors(name) if n not in seen)
        reduces = any(
            call_name(source, n) in reducers for n in inside(source, helper.body, "call_expression")
        )
        if reduces or builtin_uses(source, helper.body):
            found.append(helper)
    mine = {f.name for f in found}
    for helper in found[1:]:
        others = sorted({c for c, _ in graph.call_sites(helper.name)} - mine)
        if others:
            raise HelperRowsError(
                f"{helper.name} holds the row code of {kernel.name} but {', '.join(others)} "
                "calls it too"
            )
    return found


def _check_alone(
    source: ParsedSource,
    function: Function,
    kernel: Function,
    checked: set[str],
    row_uses: list[Node],
) -> None:
    """Refuse row code that a one-thread block would change beyond the rewrite (calls of
    ``checked`` functions, the reducers and the row code's own helpers, are not looked into)."""
    assert function.body is not None
    line = source.line_of
    for node in inside(source, function.body, "declaration"):
        if "__shared__" in source.text_of(node).split("=")[0]:
            raise HelperRowsError(
                f"{function.name} declares shared memory at line {line(node.start_byte)}"
            )
    groups = analysis(source).cooperative_groups
    collectives = [*groups.reduces, *groups.shuffles, *groups.barriers]
    used = next((c for c in collectives if c.function.node == function.node), None)
    if used is not None:
        raise HelperRowsError(
            f"{function.name} works across threads through cooperative groups at line "
            f"{line(used.node.start_byte)}"
        )
    graph = analysis(source).call_graph
    for call in inside(source, function.body, "call_expression"):
        name = call_name(source, call) or ""
        if name in checked:
            continue
        summary = graph.summary(name)
        intrinsic = name in BLOCK_BARRIERS or name.startswith((*WARP_COLLECTIVES, "__syncwarp"))
        if summary.block_barrier or summary.warp_collective or intrinsic:
            raise HelperRowsError(
                f"{function.name} calls {name} at line {line(call.start_byte)}, which works "
                "across threads outside the block reducers"
            )
    for use in builtin_uses(source, function.body):
        text = source.text_of(use).replace(" ", "")
        if text in _ONE_THREAD:
            continue
        if text == "blockIdx.x" and function is kernel and any(within(use, r) for r in row_uses):
            continue
        raise HelperRowsError(
            f"{function.name} reads {text} at line {line(use.start_byte)}; this rule takes "
            "threadIdx.x and blockDim.x in the row code, blockIdx.x only as the row index"
        )


def outside(edits: list[Edit], rewrites: list[Edit]) -> list[Edit]:
    """The ``edits`` no rewrite contains (those it does are written into its text)."""
    return [
        e
        for e in edits
        if not any(
            r.start_byte <= e.start_byte and e.end_byte <= r.end_byte and r != e for r in rewrites
        )
    ]


class _OneThread:
    """Writes a function body's code as a one-thread block runs it."""

    def __init__(self, source: ParsedSource, reducers: set[str], row_edits: list[Edit]) -> None:
        self.source = source
        self.reducers = reducers
        self.row_edits = {(e.start_byte, e.end_byte): e.replacement for e in row_edits}

    def edits(self, body: Node) -> list[Edit]:
        """Replacements at the outermost nodes the rewrite changes."""
        found: list[Edit] = []
        pending = [body]
        while pending:
            node = pending.pop()
            if self._self_reduction(node):
                found.append(line_deletion(self.source, node))
            elif self._rewrite(node) is not None:
                found.append(Edit.replace(node, self.render(node)))
            else:
                pending += node.children
        return found

    def _self_reduction(self, statement: Node) -> bool:
        """``v = block_reduce<op>(v, ...);``: a one-thread block leaves ``v`` as it is."""
        if statement.type != "expression_statement" or not statement.named_children:
            return False
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression":
            return False
        left, right = (
            assignment.child_by_field_name("left"),
            assignment.child_by_field_name("right"),
        )
        if left is None or right is None or call_name(self.source, right) not in self.reducers:
            return False
        first = _first_argument(right)
        text = self.source.text_of
        operator = assignment.child_by_field_name("operator")
        plain = operator is None or text(operator) == "="
        return plain and first is not None and text(first) == text(left)

    def render(self, node: Node) -> str:
        """The node's text with every rewrite inside it applied."""
        own = self._rewrite(node)
        if own is not None:
            return own
        return self._splice(node)

    def _splice(self, node: Node) -> str:
        data = self.source.data
        pieces, at = [], node.start_byte
        for child in node.children:
            pieces.append(data[at : child.start_byte].decode("utf-8"))
            pieces.append(self.render(child))
            at = child.end_byte
        pieces.append(data[at : node.end_byte].decode("utf-8"))
        return "".join(pieces)

    def _rewrite(self, node: Node) -> str | None:
        source = self.source
        row = self.row_edits.get((node.start_byte, node.end_byte))
        if row is not None and node.type == "field_expression":
            return row
        if node.type == "field_expression":
            return _ONE_THREAD.get(source.text_of(node).replace(" ", ""))
        if node.type == "call_expression" and call_name(source, node) in self.reducers:
            first = _first_argument(node)
            if first is None:
                raise HelperRowsError(f"a block reduction without a value: {source.text_of(node)}")
            value = self.render(first)
            return value if first.type in _PRIMARY else f"({value})"
        if node.type == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            operator = node.child_by_field_name("operator")
            if operator is not None and source.text_of(operator) == "+":
                if is_builtin(source, right, "threadIdx") and left is not None:
                    return self.render(left)
                if is_builtin(source, left, "threadIdx") and right is not None:
                    return self.render(right)
        if node.type == "if_statement" and node.child_by_field_name("alternative") is None:
            condition = node.child_by_field_name("condition")
            consequence = node.child_by_field_name("consequence")
            if condition is not None and consequence is not None and self._first(condition):
                return self.render(consequence)
        return None

    def _first(self, condition: Node) -> bool:
        """``threadIdx.x == 0`` (either side), the test a one-thread block always passes."""
        node = strip_parens(condition)
        if node.type == "condition_clause":
            inner = node.child_by_field_name("value")
            node = strip_parens(inner) if inner is not None else node
        if node.type != "binary_expression":
            return False
        operator = node.child_by_field_name("operator")
        if operator is None or self.source.text_of(operator) != "==":
            return False
        sides = [node.child_by_field_name("left"), node.child_by_field_name("right")]
        texts = sorted(self.source.text_of(s).replace(" ", "") for s in sides if s is not None)
        return texts == ["0", "threadIdx.x"]


def _first_argument(call: Node) -> Node | None:
    """The first argument of a call: the value a block reduction reduces."""
    arguments = call.child_by_field_name("arguments")
    return arguments.named_children[0] if arguments and arguments.named_children else None
