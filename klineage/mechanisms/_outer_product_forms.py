"""The syntax both directions of register_outer_product read and write: counted loops, the
accumulation statement, local and parameter arrays, and loop nests written back as text."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Node, ParsedSource, Pragma, within
from klineage.cuda.tree import (
    FMA_CALLS,
    binary_operands,
    call_arguments,
    identifier_names,
    statements,
    strip_parens,
)
from klineage.mechanisms._local_util import (
    index_declaration,
)
from klineage.mechanisms._staging import subscript_chain


@dataclass(frozen=True)
class Counted:
    """``for (int v = 0; v < N; ++v)`` with ``N`` a compile-time constant."""

    node: Node
    variable: str
    trip: int
    """The trip count; 0 when the bound is a template parameter."""
    bound: str
    """``N`` as written."""
    limit: Node
    """``N``'s node."""
    pragma: Pragma | None
    """The ``#pragma unroll`` line before the loop, if any."""


def counted(source: ParsedSource, node: Node) -> Counted | None:
    """The counted loop at ``node``, or None when it is not one. The bound is a constant or
    an expression of names fixed at compile time (template parameters, ``constexpr``
    locals; its trip count then unknown here, ``trip`` 0)."""
    if node.type != "for_statement":
        return None
    initializer = node.child_by_field_name("initializer")
    condition = node.child_by_field_name("condition")
    update = node.child_by_field_name("update")
    declared = None if initializer is None else index_declaration(source, initializer)
    operands = None if condition is None else binary_operands(condition, "<")
    if declared is None or update is None or operands is None:
        return None
    variable, _, value = declared
    value = braced(value)
    if fold_int(source, value) != 0 or source.text_of(strip_parens(operands[0])) != variable:
        return None
    bound = source.text_of(operands[1])
    trip = fold_int(source, operands[1])
    if trip is None:
        function = source.enclosing_function(node)
        names = identifier_names(source, operands[1])
        if (
            function is None
            or not names
            or not all(compile_time_name(source, function, name) for name in names)
        ):
            return None
        trip = 0
    steps = {f"++{variable}", f"{variable}++", f"{variable}+=1"}
    if trip < 0 or "".join(source.text_of(update).split()) not in steps:
        return None
    pragma = source.pragma_before(node, "unroll")
    return Counted(node, variable, trip, bound, operands[1], pragma)


def compile_time_name(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether ``name`` is a template parameter of the function or a ``constexpr`` local of
    its body (``constexpr unsigned int TILES{W / (T * N)};``): fixed at compile time."""
    if name in function.template_params:
        return True
    body = function.body
    return body is not None and any(
        name in d.names and "constexpr" in d.qualifiers and within(d.node, body)
        for d in source.declarations
    )


def braced(value: Node) -> Node:
    """``x{0U}`` declares with an initializer list of one value: that value."""
    items = [c for c in value.named_children if c.type != "comment"]
    return items[0] if value.type == "initializer_list" and len(items) == 1 else value


def array_parameter(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether ``name`` is a parameter passed as an array or a pointer (``T* a``, ``T a[N]``)."""
    return any(
        p.name == name and (p.is_pointer or "[" in source.text_of(p.node)) for p in function.params
    )


@dataclass(frozen=True)
class Update:
    """``A[i][j] += F1 * F2;`` or ``A[i][j] = fmaf(F1, F2, A[i][j]);``."""

    statement: Node
    accumulator: str
    target: Node
    subscripts: tuple[str, ...]
    """Each subscript's text: output loop variables (``A[i][j]``), or one flat index."""
    indices: tuple[Node, ...]
    factors: tuple[Node, Node]


def accumulation(source: ParsedSource, statement: Node) -> tuple[Node, Node, Node] | None:
    """(target, X, Y) of ``target += X * Y;`` or ``target = fmaf(X, Y, target);``."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    assignment = statement.named_children[0]
    if assignment.type != "assignment_expression":
        return None
    left, right = assignment.child_by_field_name("left"), assignment.child_by_field_name("right")
    operator = assignment.child_by_field_name("operator")
    if left is None or right is None or operator is None:
        return None
    factors: tuple[Node, Node] | None = None
    call = strip_parens(right)
    if operator.type == "+=":
        factors = binary_operands(right, "*")
    elif operator.type == "=" and call.type == "call_expression":
        callee = call.child_by_field_name("function")
        arguments = call_arguments(call)
        fused = callee is not None and source.text_of(callee) in FMA_CALLS
        if fused and len(arguments) == 3 and _same(source, arguments[2], left):
            factors = (arguments[0], arguments[1])
    return None if factors is None else (left, *factors)


def update_of(source: ParsedSource, statement: Node) -> Update | None:
    """The accumulation into an array element at ``statement``, or None when it is not one."""
    found = accumulation(source, statement)
    chain = None if found is None else subscript_chain(strip_parens(found[0]))
    if found is None or chain is None:
        return None
    left, *factors = found
    subscripts = tuple(source.text_of(strip_parens(s)) for s in chain[1])
    indices = tuple(strip_parens(s) for s in chain[1])
    pair = (factors[0], factors[1])
    return Update(statement, source.text_of(chain[0]), left, subscripts, indices, pair)


def _same(source: ParsedSource, a: Node, b: Node) -> bool:
    return "".join(source.text_of(a).split()) == "".join(source.text_of(b).split())


def local_array(source: ParsedSource, function: Function, name: str) -> Node | None:
    """The declaration of a local (not shared, not static) array ``name`` in ``function``."""
    if function.body is None:
        return None
    for declaration in source.declarations:
        if name not in declaration.names or not within(declaration.node, function.body):
            continue
        if {"__shared__", "static", "extern"} & set(declaration.qualifiers):
            return None
        arrays = [d for d in declaration.declarators if "[" in source.text_of(d)]
        return declaration.node if arrays else None
    return None


def is_pragma(source: ParsedSource, node: Node) -> bool:
    return node.type == "preproc_call" and source.text_of(node).lstrip().startswith("#pragma")


def items_of(source: ParsedSource, block: Node | None) -> list[Node]:
    """A block's statements, pragma lines left out (they go with their loops)."""
    return [s for s in statements(block) if not is_pragma(source, s)]


def flattened(text: str) -> str:
    """A statement on one line: every run of whitespace as one space."""
    return " ".join(text.split())


def loop_header(source: ParsedSource, loop: Node) -> str:
    """``for (int i = 0; i < 8; ++i)``: a loop's text up to its body."""
    body = loop.child_by_field_name("body")
    assert body is not None
    return flattened(source.text_of((loop.start_byte, body.start_byte)))


def pragma_line(pragma: Pragma | None, default: str | None) -> str | None:
    """``#pragma unroll [N]`` as a line, or ``default`` when the loop has none."""
    if pragma is None:
        return default
    return f"#pragma {pragma.text.strip()}"


def span_start(source: ParsedSource, loop: Node) -> int:
    """Where a loop's lines start: its ``#pragma unroll`` line's, or its own."""
    pragma = source.pragma_before(loop, "unroll")
    return source.line_start(pragma.node.start_byte if pragma is not None else loop.start_byte)


def nest(indent: str, headers: list[tuple[str | None, str]], inner: list[str]) -> str:
    """Loops ``(pragma, header)`` nested outermost first around the ``inner`` lines, two
    spaces a level, every loop braced."""
    lines: list[str] = []
    for depth, (pragma, header) in enumerate(headers):
        pad = indent + "  " * depth
        if pragma is not None:
            lines.append(pad + pragma)
        lines.append(f"{pad}{header} {{")
    pad = indent + "  " * len(headers)
    lines += [pad + line if line else line for line in inner]
    for depth in reversed(range(len(headers))):
        lines.append(indent + "  " * depth + "}")
    return "\n".join(lines)
