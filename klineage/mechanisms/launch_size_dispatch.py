"""Launch-size dispatch: host code choosing a kernel or a configuration by a size.

``run`` picks a specialized kernel for each size range (``if (cols <= 128) launch<1>(...);
else if (cols <= 256) ...``): a warp per row for short rows, a block per row for long ones,
register-resident rows up to a limit, a streaming fallback beyond it.

- detect: ``if`` chains in host code whose conditions compare a value with a constant
  (``cols <= 1024``, ``m <= 16``) and whose branches launch kernels (directly or through a
  host function that does); also an ``if``/``else`` whose branches both launch and whose
  condition compares a size derived from ``run``'s arguments (``grid_size_y == 1``, computed
  from the channel count and the SM count);
- remove: keep only the most general path. With a final ``else``, the chain becomes that
  branch (the fallback that handles every shape); a chain without ``else`` whose branches
  all end in ``return`` is deleted, so the code after it, the general path, runs for every
  size. Both are semantics-preserving as long as the fallback is valid for all sizes, which
  is what a fallback is for (stated as a condition); a chain that falls through into shared
  code, or has no fallback, is refused;
- apply: a dispatch needs the specialized kernels it chooses between, which only a person or
  an LLM writes, so a new dispatch is refused. What a rule can do is put back a removed one
  whose kernels are still in the file (a round trip): the carrier ``dispatch`` holds the
  chain as it was written (``declarations``: the locals only it read), and it goes back in
  place of the general launch (its final ``else``), or before it for a chain of returning
  branches. Every function the chain calls must be defined in the target; otherwise the
  apply is refused as above.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._tiles_util import (
    column,
    orphaned_declarations,
    reindent,
    statement_deletion,
    statements,
    with_comments_above,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

_RELATIONAL = ("<", "<=", ">", ">=")
# what a dispatch chooses between: kernels it launches (`k<T><<<`) and the specialized host
# functions it calls with template arguments (`launch_rows<256, 4>(`); plain calls (`dim3(`,
# `min(`) are left to the compiler
_LAUNCHED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:<[^<>;()]*>)?\s*<<<")
_SPECIALIZED = re.compile(r"\b([A-Za-z_]\w*)\s*<[^<>;()]*>\s*\(")
_KEYWORDS = {"static_cast", "reinterpret_cast", "const_cast", "dynamic_cast"}
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


def _derived_size(source: ParsedSource, function: Function, condition: Node) -> bool:
    """Whether a condition compares, with a constant, a local computed from the function's
    integer parameters (the sizes ``run`` receives): ``grid_size_y == 1``."""
    sizes = {p.name for p in function.params if p.name and not p.is_pointer}
    for node in source.iter_nodes("binary_expression", within=condition):
        op = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if op is None or op.type not in (*_RELATIONAL, "==", "!=") or None in (left, right):
            continue
        for side, other in ((left, right), (right, left)):
            assert side is not None and other is not None
            if fold_int(source, other) is None or side.type != "identifier":
                continue
            if _computed_from(source, function, source.text_of(side), sizes):
                return True
    return False


def _computed_from(source: ParsedSource, function: Function, name: str, sizes: set[str]) -> bool:
    """Whether local ``name`` is initialized from ``sizes``, directly or through locals."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        current = pending.pop()
        if current in sizes:
            return current != name
        if current in seen or function.body is None:
            continue
        seen.add(current)
        for value in _initializers(source, function, current):
            pending.extend(source.text_of(n) for n in source.iter_nodes("identifier", within=value))
    return False


def _initializers(source: ParsedSource, function: Function, name: str) -> list[Node]:
    """The initializers of the declarations of local ``name`` in `function`."""
    found = []
    for declaration in source.iter_nodes("declaration", within=function.body):
        for declarator in declaration.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if inner is not None and value is not None and source.text_of(inner) == name:
                found.append(value)
    return found


def _shape_test(source: ParsedSource, function: Function, condition: Node) -> bool:
    """Whether a condition tests the arguments' divisibility or alignment (``k % 4 == 0``, a
    pointer's low bits), itself or through the locals it reads: ``if (vectors)`` after
    ``const bool vectors = k % 4 == 0 && aligned16(x);``."""
    arguments = {p.name for p in function.params if p.name}
    for node in _with_initializers(source, function, condition):
        if _tests_low_bits(source, node, arguments):
            return True
        for call in source.iter_nodes("call_expression", within=node):
            # `aligned16(x)`: a helper handed an argument, which tests its own parameter's bits
            callee = call.child_by_field_name("function")
            helper = source.function(source.text_of(callee)) if callee is not None else None
            args = call.child_by_field_name("arguments")
            passed = {source.text_of(n) for n in args.named_children} if args else set()
            if helper is None or helper.body is None or not passed & arguments:
                continue
            own = {p.name for p in helper.params if p.name}
            if _tests_low_bits(source, helper.body, own):
                return True
    return False


def _tests_low_bits(source: ParsedSource, node: Node, names: set[str]) -> bool:
    """Whether ``node`` holds ``e % C`` or ``e & C`` (C constant) with ``e`` reading `names`."""
    for test in source.iter_nodes("binary_expression", within=node):
        op = test.child_by_field_name("operator")
        left, right = test.child_by_field_name("left"), test.child_by_field_name("right")
        if op is None or op.type not in ("%", "&") or left is None or right is None:
            continue
        if fold_int(source, right) is None:
            continue
        if {source.text_of(n) for n in source.iter_nodes("identifier", within=left)} & names:
            return True
    return False


def _with_initializers(source: ParsedSource, function: Function, condition: Node) -> list[Node]:
    """The condition and the initializers of the locals it reads, followed through locals."""
    found = [condition]
    seen: set[str] = set()
    pending = [source.text_of(n) for n in source.iter_nodes("identifier", within=condition)]
    while pending and function.body is not None:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for value in _initializers(source, function, name):
            found.append(value)
            pending.extend(source.text_of(n) for n in source.iter_nodes("identifier", within=value))
    return found


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


def _blank_lines_above(source: ParsedSource, line_start: int) -> int:
    """Where the run of blank lines that ends at ``line_start`` begins."""
    start = line_start
    while start > 0:
        previous = source.line_start(start - 1)
        if source.data[previous:start].strip():
            break
        start = previous
    return start


def _block(source: ParsedSource, chain: Node, orphaned: list[Edit], following: Node) -> str | None:
    """For a chain of returning branches: the lines from its first declaration (or itself) to
    the general path, as written, blank lines included, so that putting them back in place of
    the blank lines the removal leaves restores the file exactly; None when other statements
    lie among them."""
    first = min([chain.start_byte, *(e.start_byte for e in orphaned)])
    begin = _blank_lines_above(source, source.line_start(first))
    end = source.line_start(with_comments_above(source, following).start_byte)
    removed = sorted(
        [(e.start_byte, e.end_byte) for e in orphaned] + [(chain.start_byte, chain.end_byte)]
    )
    cursor, rest = begin, []
    for start, stop in removed:
        rest.append(source.data[cursor:start])
        cursor = max(cursor, stop)
    rest.append(source.data[cursor:end])
    if b"".join(rest).strip():
        return None
    return source.data[begin:end].decode("utf-8")


@register
class LaunchSizeDispatch(Mechanism):
    name = "launch_size_dispatch"
    category = "launch"
    signature = ("host",)
    family = "launch configuration"
    intent = (
        "Choose a kernel specialized for the problem's size range at launch time instead of "
        "one kernel general enough for every size."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "dispatch": "the removed if chain as written (re-applied only where its kernels exist)",
        "declarations": "the locals only the chain read, as written, one per line",
        "fallback": "'else': the chain's final else is the general path; 'after': the code "
        "after a chain of returning branches is",
        "next": "for 'after': the statement the chain stood before, as written",
        "block": "for 'after': the lines from the declarations to that statement, as written",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        launching = _launching_functions(source)
        for node in source.nodes("if_statement"):
            function = source.enclosing_function(node)
            if function is None or function.runs_on_device or _nested(node):
                continue
            links = _chain(node)
            sized = [c for c, _ in links if c is not None and _compares_size(source, c)]
            launched = [b for _, b in links if _launches(source, b, launching)]
            if not sized and links[-1][0] is None and len(launched) >= 2:
                # `if (blocks_y == 1) k<false><<<..>>> else { k<true><<<..>>>; sum<<<..>>> }`:
                # a choice on a size derived from the arguments, with a general else
                sized = [
                    c for c, _ in links if c is not None and _derived_size(source, function, c)
                ] or [
                    # `if (vectors) tiled<<<..>>> else plain<<<..>>>`: a choice on the shape's
                    # divisibility or alignment, with a general else
                    c
                    for c, _ in links
                    if c is not None and _shape_test(source, function, c)
                ]
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
                # supported: a carrier holding a removed chain can go back here
                yield self.site(source, launch.node)

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

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        node = self.node_at(source, site, "if_statement")
        links = _chain(node)
        if _refusal(links) is not None:
            return Carrier()
        dropped = [c for c, _ in links if c is not None] + [b for _, b in links[:-1]]
        if links[-1][0] is not None:
            dropped = [node]
        orphaned = orphaned_declarations(source, dropped)
        declarations = [source.data[e.start_byte : e.end_byte].decode().strip() for e in orphaned]
        following = node.next_named_sibling
        while following is not None and following.type == "comment":
            following = following.next_named_sibling
        after = links[-1][0] is not None and following is not None
        extra: dict[str, str] = {}
        if after and following is not None:
            extra["next"] = source.text_of(following)
            block = _block(source, node, orphaned, following)
            if block is not None:
                extra["block"] = block
        return Carrier(
            dispatch=source.text_of(node),
            declarations="\n".join(declarations),
            fallback="after" if after else "else",
            **extra,
        )

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        chain = carrier.get_str("dispatch")
        if not chain:
            raise self.refuse(_APPLY_REFUSAL, site, "apply")
        defined = {f.name for f in source.functions}
        called = {*_LAUNCHED.findall(chain), *_SPECIALIZED.findall(chain)} - _KEYWORDS
        missing = sorted(name for name in called if name not in defined)
        if missing:
            raise self.refuse(
                f"the kernels the dispatch chooses between are not all here ({', '.join(missing)} "
                f"missing); {_APPLY_REFUSAL}",
                site,
                "apply",
            )
        launch = self.node_at(source, site, "call_expression")
        if carrier.get_str("fallback") == "after":
            statement = self._general_path(source, launch, carrier.get_str("next") or "", site)
        else:
            statement = launch
            while statement.parent is not None and statement.type != "expression_statement":
                statement = statement.parent
        if statement.type not in ("expression_statement", "declaration"):
            raise self.refuse("the general launch is not a statement of its own", site, "apply")
        # the chain's continuation lines keep the columns they were written at
        indent = " " * column(source, statement.start_byte)
        declarations = (carrier.get_str("declarations") or "").splitlines()
        text = "".join(f"{line}\n{indent}" for line in declarations if line) + chain
        if carrier.get_str("fallback") == "after":
            start = with_comments_above(source, statement)
            block = carrier.get_str("block")
            if block is not None and source.starts_line(start.start_byte):
                # the lines as written, in place of the blank lines the removal left
                end = source.line_start(start.start_byte)
                return [Edit(_blank_lines_above(source, end), end, block)]
            return [Edit.insert(start.start_byte, f"{text}\n\n{indent}")]
        written = " ".join(chain.split())
        block = statement.parent
        if (
            block is not None
            and block.type == "compound_statement"
            and block.parent is not None
            and block.parent.type == "compound_statement"
            and written.endswith("else " + " ".join(source.text_of(block).split()))
        ):
            statement = block  # the braced final else the removal left in the chain's place
        general = " ".join(source.text_of(statement).split())
        if not written.endswith(general):
            raise self.refuse(
                "the chain's final else is not this launch, so it would not stand where the "
                "general path is",
                site,
                "apply",
            )
        return [Edit.replace(statement, text)]

    def _general_path(self, source: ParsedSource, launch: Node, first: str, site: Site) -> Node:
        """The statement a chain of returning branches stood before (``first``, as written), in
        the function of the candidate launch."""
        function = source.enclosing_function(launch)
        wanted = " ".join(first.split())
        if function is not None and function.body is not None and wanted:
            for block in source.iter_nodes("compound_statement", within=function.body):
                for statement in statements(block):
                    if " ".join(source.text_of(statement).split()) == wanted:
                        return statement
            for statement in statements(function.body):
                if " ".join(source.text_of(statement).split()) == wanted:
                    return statement
        raise self.refuse(
            "the statement the dispatch stood before is not in this function", site, "apply"
        )

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
