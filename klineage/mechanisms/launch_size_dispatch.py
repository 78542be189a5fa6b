"""Launch-size dispatch: host code choosing a kernel or a configuration by a size.

``run`` picks a specialized kernel for each size range (``if (cols <= 128) launch<1>(...);
else if (cols <= 256) ...``): a warp per row for short rows, a block per row for long ones,
register-resident rows up to a limit, a streaming fallback beyond it.

- detect: ``if`` chains in host code whose conditions compare a value with a constant
  (``cols <= 1024``, ``m <= 16``) and whose branches launch kernels (directly or through a
  host function that does);
- remove: keep only the most general path. With a final ``else``, the chain becomes that
  branch (the fallback that handles every shape, as ``softmax_online_rows<512, false>``
  does); a chain without ``else`` whose branches all end in ``return`` is deleted, so the
  code after it, the general path, runs for every size. Both are semantics-preserving as
  long as the fallback is valid for all sizes, which is what a fallback is for (stated as a
  condition); a chain that falls through into shared code, or has no fallback, is refused;
- apply: refused: a dispatch needs the specialized kernels it chooses between, which only a
  person or an LLM writes.
"""

from __future__ import annotations

from collections.abc import Iterator

from klineage.cexpr import fold_int
from klineage.conditions import Condition, Prose
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import (
    column,
    orphaned_declarations,
    reindent,
    statement_deletion,
    statements,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem
from klineage.source import Edit, Node, ParsedSource

_RELATIONAL = ("<", "<=", ">", ">=")
_APPLY_REFUSAL = (
    "a size dispatch chooses between specialized kernels for each size range; writing them "
    "is a job for a person or an LLM, not a rule"
)


def _chain(node: Node) -> list[tuple[Node | None, Node]]:
    """``if (a) x; else if (b) y; else z;`` -> [(a, x), (b, y), (None, z)]."""
    links: list[tuple[Node | None, Node]] = []
    current: Node | None = node
    while current is not None and current.type == "if_statement":
        condition = current.child_by_field_name("condition")
        consequence = current.child_by_field_name("consequence")
        if consequence is None:
            break
        links.append((condition, consequence))
        alternative = current.child_by_field_name("alternative")
        current = None
        if alternative is not None:
            inner = next((c for c in alternative.named_children if c.type != "comment"), None)
            if inner is not None and inner.type == "if_statement":
                current = inner
            elif inner is not None:
                links.append((None, inner))
    return links


def _compares_size(source: ParsedSource, condition: Node) -> bool:
    """Whether a condition compares something with a compile-time constant (``n <= 16``)."""
    for node in source.iter_nodes("binary_expression", within=condition):
        op = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if op is None or op.type not in _RELATIONAL or left is None or right is None:
            continue
        values = [fold_int(source, side) for side in (left, right)]
        known = [v for v in values if v is not None]
        if len(known) == 1 and known[0] not in (0, 1):  # `n > 0` is a guard, not a size
            return True
    return False


def _launching_functions(source: ParsedSource) -> set[str]:
    """Host functions that launch a kernel (directly, or through another such function)."""
    launching = {
        f.name
        for f in source.functions
        if any(
            f.node.start_byte <= launch.node.start_byte < f.node.end_byte
            for launch in source.launches
        )
    }
    for _ in range(4):
        more = {
            f.name
            for f in source.functions
            if not f.runs_on_device
            and any(
                c.name in launching and f.node.start_byte <= c.node.start_byte < f.node.end_byte
                for c in source.calls
            )
        }
        if more <= launching:
            break
        launching |= more
    return launching


def _launches(source: ParsedSource, node: Node, launching: set[str]) -> bool:
    if any(node.start_byte <= launch.node.start_byte < node.end_byte for launch in source.launches):
        return True
    return any(
        c.name in launching and node.start_byte <= c.node.start_byte < node.end_byte
        for c in source.calls
    )


def _launches_after(source: ParsedSource, node: Node, launching: set[str]) -> bool:
    """Whether the statements after ``node`` in its block launch a kernel (the general path
    a returning branch skips)."""
    parent = node.parent
    if parent is None or parent.type != "compound_statement":
        return False
    return any(
        _launches(source, s, launching) for s in statements(parent) if s.start_byte > node.end_byte
    )


def _ends_in_return(node: Node) -> bool:
    if node.type == "return_statement":
        return True
    if node.type == "compound_statement":
        inner = statements(node)
        return bool(inner) and _ends_in_return(inner[-1])
    return False


def _nested(node: Node) -> bool:
    """Whether an if statement is the ``else if`` of another (not a chain's head)."""
    parent = node.parent
    return parent is not None and parent.type == "else_clause"


def _refusal(links: list[tuple[Node | None, Node]]) -> str | None:
    if links[-1][0] is None:
        return None
    if all(_ends_in_return(body) for _, body in links):
        return None
    return (
        "the chain has no final else and its branches do not all return, so no branch is the "
        "general path that could stand for every size"
    )


@register
class LaunchSizeDispatch(Mechanism):
    name = "launch_size_dispatch"
    category = "launch"
    family = "launch configuration"
    intent = (
        "Choose a kernel specialized for the problem's size range at launch time instead of "
        "one kernel general enough for every size."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        launching = _launching_functions(source)
        for node in source.nodes("if_statement"):
            function = source.enclosing_function(node)
            if function is None or function.runs_on_device or _nested(node):
                continue
            links = _chain(node)
            sized = [c for c, _ in links if c is not None and _compares_size(source, c)]
            launched = [b for _, b in links if _launches(source, b, launching)]
            if (
                not sized
                or not launched
                or not (len(launched) >= 2 or _launches_after(source, node, launching))
            ):
                continue
            condition = node.child_by_field_name("condition")
            end = condition.end_byte if condition is not None else node.end_byte
            yield self.site(
                source,
                node,
                snippet=source.snippet((node.start_byte, end)) + f" ... ({len(links)} branches)",
                detail={"branches": len(links)},
                refusal=_refusal(links),
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for launch in source.launches:
            function = source.enclosing_function(launch.node)
            if function is not None and function.extern_c:
                yield self.site(source, launch.node, refusal=_APPLY_REFUSAL)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        node = self.node_at(source, site, "if_statement")
        links = _chain(node)
        refusal = _refusal(links)
        if refusal is not None:
            raise self.refuse(refusal, site)
        condition, fallback = links[-1]
        dropped = [c for c, _ in links if c is not None] + [b for _, b in links[:-1]]
        if condition is not None:  # every branch returns: the code after the chain is general
            return [statement_deletion(source, node), *orphaned_declarations(source, [node])]
        text = source.text_of(fallback)
        shift = column(source, fallback.start_byte) - column(source, node.start_byte)
        if not source.starts_line(fallback.start_byte):
            shift = 0
        return [Edit.replace(node, reindent(text, shift)), *orphaned_declarations(source, dropped)]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        raise self.refuse(_APPLY_REFUSAL, site, "apply")

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text="the fallback path (the final else, or the code after a chain of "
                "returning branches) must handle every size",
                why="removing the dispatch sends every shape down that path",
            )
        ]
