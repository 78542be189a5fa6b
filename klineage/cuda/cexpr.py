"""C++ expression helpers for writing rewrites: precedence, parentheses, constant folding.

A mechanism that swaps one expression for another (``__fdividef(a, b)`` for ``a / b``) must
not change how the surrounding code groups: ``y * rsqrtf(v)`` becomes ``y * (1.0f /
sqrtf(v))``, not ``y * 1.0f / sqrtf(v)``. Use :func:`operand` to parenthesize the pieces of a
new expression and :func:`wrap_at` to parenthesize the new expression where it lands.

:func:`to_size_expr` turns a C++ integer expression (a launch's block size, a shared-memory
size) into a size expression over constants and axis names that :mod:`klineage.conditions`
evaluates per workload; :func:`fold_int` folds it to a number when it is constant.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from klineage.conditions import evaluate_size

if TYPE_CHECKING:
    # types only: the source model folds its constants with this module, so it imports it
    from tree_sitter import Node

    from klineage.cuda.source import ParsedSource

__all__ = [
    "ASSIGNMENT",
    "MULTIPLICATIVE",
    "PRIMARY",
    "SIZEOF",
    "UNARY",
    "fold_int",
    "operand",
    "precedence",
    "replacement_target",
    "required_precedence",
    "to_size_expr",
    "without_outer_parentheses",
    "wrap_at",
]

# Higher binds tighter (C++ operator precedence, grouped).
PRIMARY = 16
UNARY = 15
MULTIPLICATIVE = 13
ASSIGNMENT = 2
COMMA = 1

BINARY_PRECEDENCE: dict[str, int] = {
    "*": 13,
    "/": 13,
    "%": 13,
    "+": 12,
    "-": 12,
    "<<": 11,
    ">>": 11,
    "<=>": 10,
    "<": 9,
    "<=": 9,
    ">": 9,
    ">=": 9,
    "==": 8,
    "!=": 8,
    "&": 7,
    "^": 6,
    "|": 5,
    "&&": 4,
    "||": 3,
}

_PRIMARY_KINDS = frozenset(
    {
        "identifier",
        "number_literal",
        "string_literal",
        "char_literal",
        "concatenated_string",
        "raw_string_literal",
        "true",
        "false",
        "null",
        "nullptr",
        "this",
        "parenthesized_expression",
        "call_expression",
        "subscript_expression",
        "field_expression",
        "template_function",
        "qualified_identifier",
        "compound_literal_expression",
        "user_defined_literal",
        "lambda_expression",
        "field_identifier",
    }
)
_UNARY_KINDS = frozenset(
    {
        "unary_expression",
        "pointer_expression",
        "cast_expression",
        "sizeof_expression",
        "alignof_expression",
        "new_expression",
        "delete_expression",
    }
)
# Positions where any expression but a comma expression fits without parentheses.
_LOOSE_PARENTS = frozenset(
    {
        "argument_list",
        "init_declarator",
        "initializer_list",
        "initializer_pair",
        "return_statement",
        "expression_statement",
        "parenthesized_expression",
        "condition_clause",
        "subscript_argument_list",
        "kernel_call_syntax",
        "for_statement",
        "while_statement",
        "do_statement",
        "case_statement",
        "comma_expression",
    }
)


def _operator(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def precedence(node: Node) -> int:
    """How tightly an existing expression node binds (:data:`PRIMARY` for a name or a call)."""
    kind = node.type
    if kind in _PRIMARY_KINDS:
        return PRIMARY
    if kind == "update_expression":
        first = node.children[0] if node.children else None
        return UNARY if first is not None and first.type in ("++", "--") else PRIMARY
    if kind in _UNARY_KINDS:
        return UNARY
    if kind == "binary_expression":
        return BINARY_PRECEDENCE.get(_operator(node) or "", COMMA)
    if kind in ("conditional_expression", "assignment_expression", "throw_expression"):
        return ASSIGNMENT
    if kind == "comma_expression":
        return COMMA
    return COMMA  # unknown: assume the loosest, so it gets parentheses


def required_precedence(node: Node) -> int:
    """The least precedence an expression replacing ``node`` needs to group the same way
    without parentheses."""
    parent = node.parent
    if parent is None:
        return COMMA
    kind = parent.type
    if kind in _LOOSE_PARENTS:
        return ASSIGNMENT
    if kind == "binary_expression":
        op = BINARY_PRECEDENCE.get(_operator(parent) or "", PRIMARY)
        right = parent.child_by_field_name("right")
        return op + 1 if right is not None and right == node else op
    if kind == "assignment_expression":
        right = parent.child_by_field_name("right")
        return ASSIGNMENT if right is not None and right == node else UNARY
    if kind == "conditional_expression":
        condition = parent.child_by_field_name("condition")
        if condition is not None and condition == node:
            return BINARY_PRECEDENCE["||"]
        return ASSIGNMENT
    if kind in _UNARY_KINDS:
        return UNARY
    if kind == "update_expression":
        return PRIMARY
    # field access, subscripts, the callee of a call, and anything unknown
    return PRIMARY


def operand(source: ParsedSource, node: Node, minimum: int) -> str:
    """The text of ``node`` for use as an operand that needs at least ``minimum`` precedence:
    parenthesized when it binds more loosely."""
    text = source.text_of(node)
    return f"({text})" if precedence(node) < minimum else text


def wrap_at(node: Node, text: str, new_precedence: int) -> str:
    """``text`` (an expression of precedence ``new_precedence``) ready to replace ``node``:
    parenthesized when the surrounding code would otherwise group it differently."""
    return f"({text})" if new_precedence < required_precedence(node) else text


# Parents under which a parenthesized expression is only grouping (not syntax, as in
# `do ... while (x);` or `sizeof (x)`), so redundant parentheses may be dropped.
_GROUPING_PARENTS = frozenset(
    {
        "binary_expression",
        "assignment_expression",
        "init_declarator",
        "argument_list",
        "unary_expression",
        "pointer_expression",
        "conditional_expression",
        "return_statement",
        "expression_statement",
        "subscript_argument_list",
        "initializer_list",
        "parenthesized_expression",
        "field_expression",
        "subscript_expression",
    }
)


def replacement_target(node: Node, new_precedence: int) -> Node:
    """The node to replace when swapping ``node`` for an expression of ``new_precedence``:
    ``node`` itself, or the parentheses around it when the new expression does not need them
    (``y * (1.0f / sqrtf(v))`` -> ``y * rsqrtf(v)``)."""
    target = node
    while True:
        parent = target.parent
        if parent is None or parent.type != "parenthesized_expression":
            return target
        if parent.named_child_count != 1 or parent.parent is None:
            return target
        if parent.parent.type not in _GROUPING_PARENTS:
            return target
        if new_precedence < required_precedence(parent):
            return target
        target = parent


# ---------------------------------------------------------------------------------------------
# Integer constant expressions -> size expressions
# ---------------------------------------------------------------------------------------------

_INT_LITERAL = re.compile(r"^(0[xX][0-9a-fA-F']+|0[bB][01']+|0[0-7']*|[1-9][0-9']*)[uUlLzZ]*$")
SIZEOF: dict[str, int] = {
    "char": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "bool": 1,
    "short": 2,
    "int16_t": 2,
    "uint16_t": 2,
    "half": 2,
    "__half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "float": 4,
    "half2": 4,
    "__half2": 4,
    "__nv_bfloat162": 4,
    "double": 8,
    "long long": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "size_t": 8,
    "float2": 8,
    "int2": 8,
    "uint2": 8,
    "float4": 16,
    "int4": 16,
    "uint4": 16,
    "double2": 16,
}
_PY_BINARY = {"/": "//", "&&": " and ", "||": " or "}
_MAX_DEPTH = 40


def without_outer_parentheses(text: str) -> str:
    """``((x))`` -> ``x``: outer parentheses dropped only where they enclose the whole text
    (``(a) + (b)`` stays)."""
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for position, char in enumerate(text):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0 and position < len(text) - 1:
                return text
        text = text[1:-1].strip()
    return text


def _int_literal(text: str) -> int | None:
    match = _INT_LITERAL.match(text)
    if match is None:
        return None
    digits = match.group(1).replace("'", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXbB":
        return int(digits, 8)
    return int(digits, 0)


def to_size_expr(
    source: ParsedSource, node: Node, names: Mapping[str, int | str], _depth: int = 0
) -> str | None:
    """A C++ integer expression as a size expression, or None when it holds anything else.

    ``names`` maps identifiers to numbers or to size expressions (axis names map to
    themselves). Handled: integer literals, names, ``+ - * / % << >> & | ^``, comparisons,
    ``&& || !``, ``?:``, casts (dropped), ``sizeof`` of common types, ``min``/``max``, and
    ``dim3(x, y, z)`` (its thread count ``x * y * z``). C's ``/`` becomes ``//``: sizes are
    not negative, where the two agree.
    """
    if _depth > _MAX_DEPTH:
        return None
    kind = node.type

    def sub(child: Node | None) -> str | None:
        return None if child is None else to_size_expr(source, child, names, _depth + 1)

    if kind == "number_literal":
        literal = _int_literal(source.text_of(node))
        return None if literal is None else str(literal)
    if kind in ("true", "false"):
        return "1" if kind == "true" else "0"
    if kind in ("identifier", "qualified_identifier", "type_identifier", "type_descriptor"):
        # A template argument that is a bare name parses as a type (`k<kWarps>`).
        value = names.get(" ".join(source.text_of(node).split()))
        if value is None:
            return None
        return str(value) if isinstance(value, int) else f"({value})"
    if kind == "parenthesized_expression":
        inner = sub(node.named_children[0] if node.named_children else None)
        return None if inner is None else f"({inner})"
    if kind == "cast_expression":
        return sub(node.child_by_field_name("value"))
    if kind == "binary_expression":
        op = _operator(node)
        left = sub(node.child_by_field_name("left"))
        right = sub(node.child_by_field_name("right"))
        if op is None or op not in BINARY_PRECEDENCE or op == "<=>" or None in (left, right):
            return None
        return f"({left} {_PY_BINARY.get(op, op).strip()} {right})"
    if kind == "unary_expression":
        op = _operator(node)
        arg = sub(node.child_by_field_name("argument"))
        if arg is None or op not in ("-", "+", "~", "!"):
            return None
        return f"(not {arg})" if op == "!" else f"({op}{arg})"
    if kind == "conditional_expression":
        parts = [sub(node.child_by_field_name(f)) for f in ("condition", "consequence")]
        parts.append(sub(node.child_by_field_name("alternative")))
        if None in parts:
            return None
        condition, consequence, alternative = parts
        return f"({consequence} if {condition} else {alternative})"
    if kind == "sizeof_expression":
        # `sizeof(float)` has a type; `sizeof(float4)` reads as a parenthesized name
        operand_node = node.child_by_field_name("type") or node.child_by_field_name("value")
        if operand_node is None:
            return None
        name = " ".join(source.text_of(operand_node).strip("()").split())
        size = SIZEOF.get(name)
        return None if size is None else str(size)
    if kind == "call_expression":
        return _call_size_expr(source, node, sub)
    return None


def _call_size_expr(
    source: ParsedSource, node: Node, sub: Callable[[Node | None], str | None]
) -> str | None:
    function = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    if function is None or arguments is None:
        return None
    name = source.text_of(function).replace("std::", "").replace("::", "")
    args: list[str] = []
    for child in arguments.named_children:
        if child.type == "comment":
            continue
        folded = sub(child)
        if folded is None:
            return None
        args.append(folded)
    if name in ("min", "max") and len(args) >= 2:
        return f"{name}({', '.join(args)})"
    if name == "dim3" and 1 <= len(args) <= 3:
        return "(" + " * ".join(args) + ")"
    return None


def fold_int(
    source: ParsedSource, node: Node, constants: Mapping[str, int | str] | None = None
) -> int | None:
    """The value of a constant C++ integer expression, or None when it is not constant.

    ``constants`` defaults to the file's constants (``constexpr``, ``#define``).
    """
    names = source.integer_constants if constants is None else constants
    expr = to_size_expr(source, node, names)
    return None if expr is None else evaluate_size(expr, {})
