"""Scalar element loops and one-thread-per-element kernels, written again with vector accesses
per a :class:`~._vector_plans.VectorPlan`: with an alignment check and a scalar fallback, or
peeled to the first aligned element."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.conditions import (
    Condition,
    Prose,
)
from klineage.cuda.cexpr import MULTIPLICATIVE, operand
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._local_util import (
    ElementKernel,
    Refused,
    assigned_names,
    binary,
    builtin_of,
    element_refusal,
    element_returns,
    element_text,
    global_index,
    identifiers,
    index_declaration,
    is_block_size,
    is_side_effect_free,
    normalize_type,
    shift,
    splice,
    statements,
    strip_parens,
)
from klineage.mechanisms._vector_plans import (
    VectorPlan,
    check_names,
    plan_lanes,
    plan_vectorization,
    vector_lines,
    vector_names,
)


@dataclass(frozen=True)
class ScalarLoop:
    node: Node
    var: str
    type: str
    start: Node
    bound: Node
    update: Node
    step: Node | None
    """``K`` of ``c += K``; None for ``++c``."""
    body: Node


def scalar_loop(source: ParsedSource, node: Node) -> ScalarLoop | None:
    """``for (T c = S; c < N; ++c | c++ | c += K) body``, else None."""
    if node.type != "for_statement":
        return None
    init = node.child_by_field_name("initializer")
    condition = node.child_by_field_name("condition")
    update = node.child_by_field_name("update")
    body = node.child_by_field_name("body")
    if init is None or condition is None or update is None or body is None:
        return None
    parsed = index_declaration(source, init)
    if parsed is None:
        return None
    var, specifiers, start = parsed
    sides = binary(strip_parens(condition), "<")
    if sides is None or strip_parens(sides[0]).type != "identifier":
        return None
    if source.text_of(strip_parens(sides[0])) != var:
        return None
    step: Node | None = None
    if update.type == "update_expression":
        argument = update.child_by_field_name("argument")
        if (
            argument is None
            or source.text_of(argument) != var
            or "++" not in source.text_of(update)
        ):
            return None
    elif update.type == "assignment_expression":
        left = update.child_by_field_name("left")
        operator = update.child_by_field_name("operator")
        step = update.child_by_field_name("right")
        if left is None or operator is None or operator.type != "+=" or step is None:
            return None
        if source.text_of(left) != var:
            return None
    else:
        return None
    return ScalarLoop(node, var, normalize_type(specifiers), start, sides[1], update, step, body)


def loop_nodes(loop: ScalarLoop) -> list[Node]:
    body = loop.body
    return statements(body) if body.type == "compound_statement" else [body]


def loop_refusal(source: ParsedSource, loop: ScalarLoop) -> str | None:
    parent = loop.node.parent
    if parent is None or parent.type != "compound_statement":
        return "the loop is not directly in a block, so it cannot become two loops"
    if not source.starts_line(loop.node.start_byte):
        return "the loop does not start its line"
    invariant = [loop.bound, loop.start] + ([loop.step] if loop.step is not None else [])
    written = assigned_names(source, loop.body)
    for node in invariant:
        if not is_side_effect_free(source, node):
            return f"{source.snippet(node)!r} has side effects"
        changed = {source.text_of(n) for n in identifiers(source, node)} & (written | {loop.var})
        if changed:
            return (
                f"{source.snippet(node)!r} uses {', '.join(sorted(changed))}, written in the loop"
            )
    return None


def _body_text(source: ParsedSource, body: Node, reps: list[tuple[Node, str]]) -> str:
    """The loop body's statements as text at the body's indentation plus 2 (the compound
    statement's braces left out), starting with a newline."""
    if body.type == "compound_statement":
        inner = body.named_children
        if not inner:
            return ""
        return splice(source, body.start_byte + 1, inner[-1].end_byte, reps)
    indent = source.indent_of(body.start_byte) if source.starts_line(body.start_byte) else None
    if indent is None:
        indent = source.indent_of(body.parent.start_byte if body.parent else 0) + "  "
    return f"\n{indent}" + splice(source, body.start_byte, body.end_byte, reps)


def alignment_check(plan: VectorPlan, width: int) -> str:
    """The run-time test that every vectorized pointer holds a whole vector's alignment."""
    return " && ".join(
        f"reinterpret_cast<unsigned long long>({pointer.name}) % {pointer.size * width} == 0"
        for pointer in plan.pointers
    )


def checked_loop_text(source: ParsedSource, loop: ScalarLoop, plan: VectorPlan, width: int) -> str:
    """The vectorized form of ``loop`` behind a run-time alignment test, the loop as it was
    in the other branch: for rows whose alignment no static condition promises (a row length
    not a multiple of the width)."""
    indent = source.indent_of(loop.node.start_byte)
    vector = loop_text(source, loop, plan, width).replace("\n", "\n  ")
    scalar = source.text_of(loop.node).replace("\n", "\n  ")
    return "\n".join(
        [
            f"if ({alignment_check(plan, width)}) {{",
            f"{indent}  {vector}",
            f"{indent}}} else {{",
            f"{indent}  {scalar}",
            f"{indent}}}",
        ]
    )


def peeled_loop_text(source: ParsedSource, loop: ScalarLoop, plan: VectorPlan, width: int) -> str:
    """``loop`` peeled to alignment: scalar elements up to the first pointer's first
    vector-aligned element, whole vectors from there, then the tail. The pointers must share
    one misalignment, which holds for rows of one length in buffers that start aligned;
    where they do not (tested at run time when there are several), the loop as it was."""
    sizes = {p.size for p in plan.pointers}
    if len(sizes) != 1:
        raise Refused(
            "its vectorized pointers have elements of different sizes, so no one count of "
            "scalar elements aligns them all"
        )
    vectors = width * sizes.pop()
    indent = source.indent_of(loop.node.start_byte)
    head, peel = f"{loop.var}_head", f"{loop.var}_peel"
    clash = sorted({head, peel} & {source.text_of(n) for n in identifiers(source, loop.node)})
    if clash:
        raise Refused(f"the loop reads {', '.join(clash)}, which the peel would declare")
    first = plan.pointers[0].name
    address = f"reinterpret_cast<unsigned long long>({first})"
    bound = operand(source, loop.bound, 12)
    head_loop = splice(source, loop.node.start_byte, loop.node.end_byte, [(loop.bound, head)])
    peeled = [
        f"const {loop.type} {peel} = ({loop.type})(({vectors} - {address} % {vectors}) % "
        f"{vectors} / {vectors // width});",
        f"const {loop.type} {head} = {peel} < {bound} ? {peel} : {bound};",
        head_loop,
        loop_text(source, loop, plan, width, offset=head),
    ]
    inner = indent + "  "
    block = "\n".join(inner + line.replace("\n", "\n  ") for line in peeled)
    if len(plan.pointers) == 1:
        return f"{{  // peeled to alignment\n{block}\n{indent}}}"
    same = " && ".join(
        f"(reinterpret_cast<unsigned long long>({p.name}) - {address}) % {vectors} == 0"
        for p in plan.pointers[1:]
    )
    scalar = source.text_of(loop.node).replace("\n", "\n  ")
    return "\n".join(
        [
            f"if ({same}) {{  // one peel aligns every pointer",
            block,
            f"{indent}}} else {{",
            f"{indent}  {scalar}",
            f"{indent}}}",
        ]
    )


def loop_text(
    source: ParsedSource, loop: ScalarLoop, plan: VectorPlan, width: int, offset: str | None = None
) -> str:
    """The canonical vectorized form of ``loop`` (replacing its text); with `offset`, the
    vectors start at that element (the peeled form's aligned part) and the tail after them."""
    refusal = loop_refusal(source, loop)
    if refusal is not None:
        raise Refused(refusal)
    if not plan.pointers:
        raise Refused("no pointer is accessed only as p[c] outside conditions")
    check_names(source, plan, loop.var, loop.node)
    vectors = vector_names(plan, width)
    indent = source.indent_of(loop.node.start_byte)
    vec = f"{loop.var}_vec"
    bound = operand(source, loop.bound, MULTIPLICATIVE)
    start = source.text_of(loop.start)
    update = splice(
        source,
        loop.update.start_byte,
        loop.update.end_byte,
        [(n, vec) for n in identifiers(source, loop.update) if source.text_of(n) == loop.var],
    )
    loads, stores = vector_lines(plan, vectors, vec, offset)
    body = _body_text(source, loop.body, plan.replacements(f"{loop.var}_lane"))
    if offset is not None:
        bound = f"({operand(source, loop.bound, 12)} - {offset})"
    lines = [f"for ({loop.type} {vec} = {start}; {vec} < {bound} / {width}; {update}) {{"]
    lines += [f"{indent}  {line}" for line in loads]
    lines += plan_lanes(plan, loop.type, loop.var, width, body, indent + "  ", offset)
    lines += [f"{indent}  {line}" for line in stores]
    lines.append(f"{indent}}}")
    tail_start = f"{bound} / {width} * {width}"
    if offset is not None:
        tail_start = f"{offset} + {tail_start}"
    if start != "0":
        tail_start += f" + {operand(source, loop.start, 12)}"
    tail = splice(source, loop.node.start_byte, loop.node.end_byte, [(loop.start, tail_start)])
    lines.append(f"{indent}{tail}")
    return "\n".join(lines)


def partition_prose(source: ParsedSource, function: Function, loop: ScalarLoop) -> list[Condition]:
    """Prose for a loop whose threads' start values are not recognizably 0..K-1."""
    start, step = loop.start, loop.step
    step_text = source.text_of(step) if step is not None else "1"
    if source.text_of(start) == "0" and step is None:
        return []
    if builtin_of(source, start) == "threadIdx.x" and (
        step is not None and is_block_size(source, function, step)
    ):
        return []
    if global_index(source, start) is not None and step is not None:
        factors = binary(strip_parens(step), "*")
        names = {builtin_of(source, f) for f in factors} if factors else set()
        if names == {"gridDim.x", "blockDim.x"}:
            return []
    return [
        Prose(
            text=f"the loop's start {source.snippet(start, 40)!r} must take each value "
            f"0..{step_text}-1 in exactly one of the threads that run it",
            why="the vector loop and the tail reuse the loop's split of the work",
        )
    ]


def kernel_text(source: ParsedSource, element: ElementKernel, plan: VectorPlan, width: int) -> str:
    """The canonical vectorized form of a one-thread-per-element kernel: the text from the
    index declaration to the end of the element code."""
    if not plan.pointers:
        raise Refused("no pointer is accessed only as p[i] outside conditions")
    check_names(source, plan, element.name)
    vectors = vector_names(plan, width)
    indent = source.indent_of(element.decl.start_byte)
    i, vec = element.name, f"{element.name}_vec"
    bound = operand(source, element.bound, 10)
    gid = source.text_of(element.index.node)
    loads, stores = vector_lines(plan, vectors, vec)
    exits = [(n, "continue;") for n in element_returns(element)]  # leave the lane, not the thread
    lane_body = element_text(source, element, plan.replacements(f"{i}_lane") + exits)
    scalar_body = element_text(source, element, exits)
    lines = [
        f"{element.specifiers} {vec} = {gid};",
        f"{indent}if ({vec} * {width} >= {bound}) return;",
        f"{indent}if ({vec} * {width} + {width} <= {bound}) {{",
    ]
    lines += [f"{indent}  {line}" for line in loads]
    lines += plan_lanes(plan, element.index_type, i, width, shift(lane_body, 2), indent + "  ")
    lines += [f"{indent}  {line}" for line in stores]
    lines += [f"{indent}  return;", f"{indent}}}"]
    lines.append(
        f"{indent}for ({element.index_type} {i} = {vec} * {width}; {i} < {bound}; ++{i}) {{"
        f"{shift(scalar_body, 2)}\n{indent}}}"
    )
    return "\n".join(lines)


def element_plan(source: ParsedSource, element: ElementKernel) -> VectorPlan:
    refusal = element_refusal(source, element, returns="nested")
    if refusal is None and not source.starts_line(element.decl.start_byte):
        refusal = "the index declaration does not start its line"
    if refusal is not None:
        raise Refused(refusal)
    return plan_vectorization(
        source, element.function, element.name, list(element.body), exits=element_returns(element)
    )
