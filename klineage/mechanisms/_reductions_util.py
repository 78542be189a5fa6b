"""Shared helpers of the reductions family (warp shuffles, rows per block/warp/thread, online
softmax, rows in registers).

These mechanisms rewrite whole statements and functions rather than single tokens, so they
need a few things the generic source model does not offer: the names a function uses (to pick
fresh ones), the call graph (a kernel that calls a helper using ``threadIdx`` is not
thread-local), CUDA built-ins such as ``threadIdx.x`` recognized as nodes, whole-line
deletions, re-indentation of a block of text, and edits applied to a piece of text rather
than to the whole file (to build a replacement from an original region).
"""

from __future__ import annotations

import bisect
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import (
    Function,
    Node,
    ParsedSource,
    call_name,
    strip_casts,
    strip_parens,
    within,
)
from klineage.cuda.tree import call_arguments as arguments_of
from klineage.cuda.tree import statements as named_statements

__all__ = [
    "BUILTINS",
    "Graph",
    "arguments_of",
    "builtin_uses",
    "cached",
    "call_name",
    "fold",
    "fresh_name",
    "graph",
    "indent_text",
    "inside",
    "is_builtin",
    "is_zero_literal",
    "line_deletion",
    "local_splice",
    "named_statements",
    "plain_type",
    "strip_casts",
    "strip_parens",
    "struct_fields",
    "within",
]

BUILTINS = ("threadIdx", "blockIdx", "blockDim", "gridDim")
"""CUDA's built-in index variables: a use of one of them ties code to a thread layout."""
_ZERO = re.compile(r"^(0+|0*\.0*|0+\.0*[fF]?|0*\.0+[fF]?|0[fF]|0+[uUlL]*)$")


_T = TypeVar("_T")
_CACHE: weakref.WeakKeyDictionary[ParsedSource, dict[Any, Any]] = weakref.WeakKeyDictionary()


def cached(source: ParsedSource, key: Any, compute: Callable[[], _T]) -> _T:
    """``compute()`` once per parsed source and key: the family's analyses (shuffle steps,
    reduction helpers, the call graph) are asked for by every kernel of a file."""
    store = _CACHE.setdefault(source, {})
    if key not in store:
        store[key] = compute()
    return store[key]  # type: ignore[no-any-return]


def inside(source: ParsedSource, outer: Node, *kinds: str) -> list[Node]:
    """The nodes of the given kinds inside ``outer``, in document order, found by bisection
    (``iter_nodes(within=)`` scans the whole file, which adds up over a long file)."""
    found: list[Node] = []
    for kind in kinds:
        nodes = source.nodes(kind)
        starts = cached(source, ("starts", kind), lambda nodes=nodes: [n.start_byte for n in nodes])
        index = bisect.bisect_left(starts, outer.start_byte)
        while index < len(nodes) and nodes[index].start_byte < outer.end_byte:
            if nodes[index].end_byte <= outer.end_byte:
                found.append(nodes[index])
            index += 1
    if len(kinds) > 1:
        found.sort(key=lambda n: (n.start_byte, -n.end_byte))
    return found


def is_builtin(source: ParsedSource, node: Node | None, name: str, field: str = "x") -> bool:
    """Whether ``node`` (casts and parentheses ignored) is ``name.field``, e.g. ``threadIdx.x``."""
    if node is None:
        return False
    node = strip_casts(node)
    return node.type == "field_expression" and source.text_of(node).replace(" ", "") == (
        f"{name}.{field}"
    )


def builtin_uses(source: ParsedSource, within_node: Node, *names: str) -> list[Node]:
    """The ``name.x/y/z`` field expressions of the given built-ins inside a node."""
    wanted = set(names or BUILTINS)
    found = []
    for node in inside(source, within_node, "field_expression"):
        argument = node.child_by_field_name("argument")
        if (
            argument is not None
            and argument.type == "identifier"
            and source.text_of(argument) in wanted
        ):
            found.append(node)
    return found


def fold(source: ParsedSource, node: Node | None) -> int | None:
    """A node's integer value with the file's constants, or None."""
    return None if node is None else fold_int(source, node)


def is_zero_literal(source: ParsedSource, node: Node | None) -> bool:
    """``0``, ``0.0f``, ``0.f``, ``0.0``: a zero a sum may start from."""
    if node is None:
        return False
    node = strip_casts(node)
    return node.type == "number_literal" and bool(_ZERO.match(source.text_of(node)))


def plain_type(text: str) -> str:
    """A declared type without cv-qualifiers and references: ``const float&`` -> ``float``."""
    words = [w for w in text.replace("&", " ").split() if w not in ("const", "volatile")]
    return " ".join(words)


def struct_fields(source: ParsedSource, name: str) -> dict[str, str]:
    """Field name -> type of a ``struct``/``class``/``union`` defined in the file (the first
    one called ``name``); empty when there is none."""
    return cached(source, ("struct", name), lambda: _struct_fields(source, name))


def _struct_fields(source: ParsedSource, name: str) -> dict[str, str]:
    for node in source.iter_nodes("struct_specifier", "union_specifier", "class_specifier"):
        name_node = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name_node is None or body is None or source.text_of(name_node) != name:
            continue
        fields: dict[str, str] = {}
        for declaration in body.named_children:
            if declaration.type != "field_declaration":
                continue
            type_node = declaration.child_by_field_name("type")
            if type_node is None:
                continue
            for declarator in declaration.children_by_field_name("declarator"):
                if declarator.type == "field_identifier":
                    fields[source.text_of(declarator)] = source.text_of(type_node)
        return fields
    return {}


# ---------------------------------------------------------------------------------------------
# Text: whole lines, indentation, local splices
# ---------------------------------------------------------------------------------------------


def line_deletion(source: ParsedSource, node: Node) -> Edit:
    """Delete a statement together with its line when it is alone there (indentation, the
    newline and a trailing comment included), else just the statement."""
    start, end = node.start_byte, node.end_byte
    data = source.data
    line_end = data.find(b"\n", end)
    stop = len(data) if line_end < 0 else line_end
    rest = data[end:stop].strip()
    if source.starts_line(start) and (not rest or rest.startswith(b"//")):
        return Edit(source.line_start(start), min(len(data), stop + 1), "")
    while end < len(data) and data[end] in b" \t":
        end += 1
    return Edit(start, end, "")


def indent_text(text: str, prefix: str) -> str:
    """Every line after the first of ``text`` with ``prefix`` added (the first line starts
    where the text is spliced, already indented)."""
    lines = text.split("\n")
    return "\n".join([lines[0], *[(prefix + line) if line.strip() else line for line in lines[1:]]])


def local_splice(source: ParsedSource, start: int, end: int, edits: Iterable[Edit]) -> str:
    """The text of ``[start, end)`` with edits inside it applied (offsets are the file's)."""
    pieces: list[bytes] = []
    cursor = start
    for edit in sorted(set(edits)):
        if edit.start_byte < cursor or edit.end_byte > end:
            raise ValueError(f"edit [{edit.start_byte}, {edit.end_byte}) outside the region")
        pieces.append(source.data[cursor : edit.start_byte])
        pieces.append(edit.replacement.encode())
        cursor = edit.end_byte
    pieces.append(source.data[cursor:end])
    return b"".join(pieces).decode("utf-8")


def fresh_name(taken: set[str], base: str) -> str:
    """``base``, or ``base2``, ``base3``... : the first not in ``taken``."""
    if base not in taken:
        return base
    index = 2
    while f"{base}{index}" in taken:
        index += 1
    return f"{base}{index}"


# ---------------------------------------------------------------------------------------------
# The call graph
# ---------------------------------------------------------------------------------------------


@dataclass
class Graph:
    """Which functions of the file call which (by name; overloads share a name)."""

    source: ParsedSource

    def __post_init__(self) -> None:
        self.calls: dict[str, set[str]] = {}
        self.by_name: dict[str, list[Function]] = {}
        self._closure: dict[str, frozenset[str]] = {}
        defined = {f.name for f in self.source.functions}
        for function in self.source.functions:
            self.by_name.setdefault(function.name, []).append(function)
            names = self.calls.setdefault(function.name, set())
            if function.body is None:
                continue
            for node in inside(self.source, function.body, "call_expression"):
                name = call_name(self.source, node)
                if name in defined:
                    names.add(name)

    def reachable(self, name: str) -> set[str]:
        return set(self._reachable(name))

    def _reachable(self, name: str) -> frozenset[str]:
        found = self._closure.get(name)
        if found is None:
            found = self._closure[name] = frozenset(self._walk(name))
        return found

    def _walk(self, name: str) -> set[str]:
        """Functions ``name`` calls, directly or not (itself excluded unless recursive)."""
        seen: set[str] = set()
        stack = list(self.calls.get(name, ()))
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            stack.extend(self.calls.get(current, ()))
        return seen

    def callers(self, name: str) -> set[str]:
        """Functions that reach ``name``."""
        return {f for f in self.calls if name in self.reachable(f)}

    def kernels_reaching(self, name: str) -> list[Function]:
        """The ``__global__`` functions that are ``name`` or call it."""
        names = self.callers(name) | {name}
        return [k for k in self.source.kernels if k.name in names]

    def functions(self, name: str) -> list[Function]:
        return self.by_name.get(name, [])


def graph(source: ParsedSource) -> Graph:
    """The file's call graph, computed once."""
    return cached(source, "graph", lambda: Graph(source))
