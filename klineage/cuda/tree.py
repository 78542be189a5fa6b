"""One set of tree-sitter node helpers for the CUDA source model, and the one refusal.

Mechanisms and the analysis layer ask the same small questions of a syntax tree: the
statements of a block, the nodes under a node, the operands of ``a * b``, the arguments of a
call, whether ``threadIdx.x`` is a built-in, whether a mask is the full warp, a name not taken
yet. They are answered here once.

:class:`NotInForm` is the one exception for "this site is not in a form this rule can
rewrite": it names the form the site is in and the form the rule would need, and the
mechanism base class turns it into a refusal with that sentence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from klineage.cuda.source import Node, ParsedSource, strip_casts, strip_parens

__all__ = [
    "BUILTINS",
    "FMA_CALLS",
    "FULL_WARP_MASK",
    "FULL_WARP_MASK_TEXT",
    "WARP_SIZE",
    "NotInForm",
    "assigned_names",
    "binary_operands",
    "builtin_of",
    "call_arguments",
    "callee_name",
    "descendants",
    "dim3_extents",
    "evaluated_whenever",
    "fresh_name",
    "identifier_names",
    "integer_literal",
    "is_full_mask",
    "operator_of",
    "statements",
    "strip_casts",
    "strip_parens",
    "template_arguments",
    "walk",
]

WARP_SIZE = 32
FULL_WARP_MASK = 0xFFFFFFFF
"""The mask naming every lane of a warp."""
FULL_WARP_MASK_TEXT = "0xffffffffu"
"""How rewrites spell the full mask."""
BUILTINS = frozenset({"threadIdx", "blockIdx", "blockDim", "gridDim"})
"""The CUDA built-in index variables (each has ``.x``, ``.y``, ``.z``)."""

FMA_CALLS = frozenset({"fmaf", "fma", "__fmaf_rn"})
"""Fused multiply-adds, ``fmaf(a, b, c) = a * b + c``: ``acc = fmaf(a, b, acc)`` is a sum."""

_INTEGER = re.compile(r"^(0[xX][0-9a-fA-F]+|\d+)[uUlL]*$")


class NotInForm(Exception):
    """A site is not in a form this rule can rewrite.

    ``form`` says what the site is ("a cg::reduce over a 16-thread tile"), ``needed`` what the
    rule would need ("a 32-thread tile"); the message joins them into one sentence, which the
    mechanism base class reports as the refusal.
    """

    def __init__(self, form: str, needed: str) -> None:
        self.form = form
        self.needed = needed
        super().__init__(f"the site is {form}; this rule needs {needed}")


def walk(node: Node) -> Iterator[Node]:
    """Every node under ``node`` (itself included), in document order."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def descendants(node: Node, *kinds: str) -> Iterator[Node]:
    """The named nodes strictly under ``node`` of the given kinds (all when none are given),
    in document order."""
    wanted = set(kinds)
    stack = list(reversed(node.named_children))
    while stack:
        current = stack.pop()
        if not wanted or current.type in wanted:
            yield current
        stack.extend(reversed(current.named_children))


def statements(block: Node | None) -> list[Node]:
    """The statements of a compound statement, comments left out; a lone statement (the
    body of ``if (c) s;``) as a list of one."""
    if block is None:
        return []
    if block.type != "compound_statement":
        return [block]
    return [c for c in block.named_children if c.type != "comment"]


def statement_after(node: Node) -> Node | None:
    """The statement right after ``node`` in its block, comments skipped (None at the end)."""
    following = node.next_named_sibling
    while following is not None and following.type == "comment":
        following = following.next_named_sibling
    return following


def statement_before(node: Node) -> Node | None:
    """The statement right before ``node`` in its block, comments skipped (None first)."""
    previous = node.prev_named_sibling
    while previous is not None and previous.type == "comment":
        previous = previous.prev_named_sibling
    return previous


def operator_of(node: Node) -> str | None:
    """The operator token of a binary, unary, update or assignment expression."""
    operator = node.child_by_field_name("operator")
    return operator.type if operator is not None else None


def binary_operands(node: Node, *operators: str) -> tuple[Node, Node] | None:
    """``(left, right)`` of a binary expression with one of ``operators`` (any operator when
    none are given), parentheses around the whole stripped first; else None."""
    node = strip_parens(node)
    if node.type != "binary_expression":
        return None
    if operators and operator_of(node) not in operators:
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None:
        return None
    return left, right


def call_arguments(call: Node) -> list[Node]:
    """The argument expressions of a call, comments left out."""
    arguments = call.child_by_field_name("arguments")
    return [a for a in (arguments.named_children if arguments else []) if a.type != "comment"]


def evaluated_whenever(node: Node, ancestor: Node, conditional: Iterable[str]) -> bool:
    """Whether ``node`` is evaluated whenever its ``ancestor`` is: no node of a
    ``conditional`` kind between them, and no ``&&`` or ``||`` above it (which may skip it)."""
    current = node.parent
    while current is not None and current != ancestor:
        if current.type in conditional:
            return False
        if current.type == "binary_expression" and operator_of(current) in ("&&", "||"):
            return False
        current = current.parent
    return current == ancestor


def dim3_extents(node: Node) -> list[Node]:
    """The sizes a ``dim3`` is built from, comments left out: the arguments of ``dim3(x,
    y)``, of ``dim3 g(x, y);`` (``(x, y)``) or ``dim3 g{x, y};``, or of ``dim3 g(blocks);``,
    which parses as a function declarator whose parameter types are the names; [] for
    anything else."""
    node = strip_parens(node)
    if node.type == "call_expression":
        return call_arguments(node)
    if node.type in ("argument_list", "initializer_list"):
        return [a for a in node.named_children if a.type != "comment"]
    if node.type == "parameter_list":
        return [
            p.child_by_field_name("type") or p for p in node.named_children if p.type != "comment"
        ]
    return []


def callee_name(written: str) -> str:
    """The function a call names, without namespace or template arguments:
    ``wt::loadFromGmem<BM, BN>`` -> ``loadFromGmem``."""
    name = "".join(written.split())
    depth = 0
    kept = []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            kept.append(ch)
    return "".join(kept).split("::")[-1]


def template_arguments(call: Node) -> list[Node]:
    """The template arguments of a call ``f<A, B>(...)`` or ``ns::f<A, B>(...)``."""
    function = call.child_by_field_name("function")
    while function is not None and function.type == "qualified_identifier":
        function = function.child_by_field_name("name")
    if function is None or function.type != "template_function":
        return []
    arguments = function.child_by_field_name("arguments")
    return [c for c in (arguments.named_children if arguments else []) if c.type != "comment"]


def builtin_of(source: ParsedSource, node: Node) -> str | None:
    """``threadIdx.x`` for a CUDA built-in index (casts and parentheses ignored), else None."""
    node = strip_casts(node)
    if node.type != "field_expression":
        return None
    argument = node.child_by_field_name("argument")
    field = node.child_by_field_name("field")
    if argument is None or field is None or argument.type != "identifier":
        return None
    name = source.text_of(argument)
    return f"{name}.{source.text_of(field)}" if name in BUILTINS else None


def one_line(source: ParsedSource, node: Node, limit: int = 80) -> str:
    """A node's text on one line, whitespace collapsed, cut to ``limit`` characters (for
    refusals that quote the code)."""
    text = " ".join(source.text_of(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def identifier_names(source: ParsedSource, node: Node) -> set[str]:
    """The names of the ``identifier`` nodes under ``node`` (field names and types excluded)."""
    return {source.text_of(n) for n in walk(node) if n.type == "identifier"}


def assigned_names(source: ParsedSource, nodes: Node | Iterable[Node]) -> set[str]:
    """Names written under the nodes (assignments, ``++``/``--``), by their identifier."""
    written: set[str] = set()
    for root in [nodes] if isinstance(nodes, Node) else nodes:
        for n in walk(root):
            target = None
            if n.type == "assignment_expression":
                target = n.child_by_field_name("left")
            elif n.type == "update_expression":
                target = n.child_by_field_name("argument")
            if target is not None:
                target = strip_parens(target)
                if target.type == "identifier":
                    written.add(source.text_of(target))
    return written


def declarator_name(source: ParsedSource, declarator: Node) -> str | None:
    """The name one declarator declares (``*b[4]`` and ``g(x, y)`` -> ``b``, ``g``), or None."""
    current: Node | None = declarator
    while current is not None and current.type != "identifier":
        current = current.child_by_field_name("declarator")
    return None if current is None else source.text_of(current)


def declaration_names(source: ParsedSource, declaration: Node) -> list[str]:
    """The names one declaration declares, in order (``int a = 0, *b[4];`` -> ``a``, ``b``)."""
    names = (declarator_name(source, d) for d in declaration.children_by_field_name("declarator"))
    return [name for name in names if name is not None]


def declared_names(source: ParsedSource, nodes: Node | Iterable[Node]) -> set[str]:
    """Names declared under the nodes."""
    return {
        name
        for root in ([nodes] if isinstance(nodes, Node) else nodes)
        for node in walk(root)
        if node.type == "declaration"
        for name in declaration_names(source, node)
    }


def integer_literal(text: str) -> int | None:
    """``32``, ``0x1F``, ``32u`` -> the value; None for anything else."""
    match = _INTEGER.match(text.strip())
    return int(match.group(1), 0) if match is not None else None


def is_full_mask(source: ParsedSource, node: Node) -> bool:
    """``0xffffffff``, ``0xffffffffu``, ``~0u``, ``-1u`` or a file constant with that value."""
    node = strip_parens(node)
    text = "".join(source.text_of(node).split())
    if node.type == "identifier":
        return source.integer_constants.get(text) == FULL_WARP_MASK
    if text in ("~0u", "~0U", "~0", "(unsigned)-1", "-1u", "-1U"):
        return True
    return integer_literal(text) == FULL_WARP_MASK


def fresh_name(taken: set[str], base: str) -> str:
    """``base``, or ``base_2``, ``base_3``... whichever is not in ``taken``."""
    if base not in taken:
        return base
    index = 2
    while f"{base}_{index}" in taken:
        index += 1
    return f"{base}_{index}"
