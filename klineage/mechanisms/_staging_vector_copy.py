"""A tile slot filled by one whole-vector copy, 16 (or 8) bytes a thread at a time:
``V4(S[i][j]) = V4(P[g]);`` through an access macro of the file, or the cast the macro stands
for (``reinterpret_cast<float4 *>(&S[i][j])[0] = reinterpret_cast<float4
*>(&P[g])[0];``, ``*(float4 *)&S[i][j] = *(float4 *)&P[g];``).

Both sides view the same vector type over arrays of one element type, so the copy is one
scalar copy per lane, ``S[i][j + e] = P[g + e]``: the loader rule reads it as the store
``S[i][j] = P[g]`` when ``g`` steps by one element where ``j`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.vectors import dereferenced_cast
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import call_arguments, strip_parens

__all__ = ["VectorCopy", "vector_copy", "vector_view"]


@dataclass(frozen=True)
class VectorCopy:
    """``V(S[..]) = V(P[..]);``: the element each side views, and the vector type."""

    statement: Node
    target: Node
    """The element whose address the stored vector starts at (``S[i][j]``)."""
    value: Node
    """The element whose address the loaded vector starts at (``P[g]``)."""
    vector: str


def vector_view(source: ParsedSource, node: Node) -> tuple[Node, str] | None:
    """(``x``, ``V``) when ``node`` reads or writes the vector ``V`` at the address of the
    element ``x``: ``MACRO(x)`` for an access macro of the file, ``reinterpret_cast<V *>(&x)[0]``,
    ``*reinterpret_cast<V *>(&x)``, or either with a C cast ``(V *)&x``."""
    vectors = analysis(source).vectors
    node = strip_parens(node)
    if node.type == "call_expression":
        callee = node.child_by_field_name("function")
        macro = vectors.access_macros.get(source.text_of(callee)) if callee is not None else None
        arguments = call_arguments(node)
        if macro is None or len(arguments) != 1:
            return None
        return strip_parens(arguments[0]), macro.vector
    cast = dereferenced_cast(source, node)
    if cast is None or not cast[0].endswith("*"):
        return None
    target, address = cast
    vector = vectors.resolve(target[:-1])
    if vectors.packed(vector) is None or address.type != "pointer_expression":
        return None
    if not source.text_of(address).startswith("&"):
        return None
    element = address.child_by_field_name("argument")
    return (strip_parens(element), vector) if element is not None else None


def vector_copy(source: ParsedSource, statement: Node) -> VectorCopy | None:
    """The statement as a whole-vector copy between two elements, if it is one."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    assignment = statement.named_children[0]
    if assignment.type != "assignment_expression":
        return None
    operator = assignment.child_by_field_name("operator")
    left, right = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
    if operator is None or source.text_of(operator) != "=" or left is None or right is None:
        return None
    written, read = vector_view(source, left), vector_view(source, right)
    if written is None or read is None or written[1] != read[1]:
        return None
    return VectorCopy(statement, written[0], read[0], written[1])
