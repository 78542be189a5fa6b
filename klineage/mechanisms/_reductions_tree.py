"""A block's shared-memory tree reduction as naive kernels spell it, finished in registers
by warp shuffles once the halving is down to one warp.

The form (the buffer a 1-D function-local ``__shared__`` array of a type shuffles move)::

    buf[tid] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {     // or a constant start, or s /= 2
      if (tid < s) buf[tid] += buf[tid + s];           // or buf[tid] = fmaxf(buf[tid], ...)
      __syncthreads();
    }

becomes (the steps of 32 and more unchanged, the last five in warp 0's registers)::

    for (int s = blockDim.x / 2; s > 16; s >>= 1) { ... }
    if (tid < 32) {
      float kl_tail = buf[tid];
      for (int kl_offset = 16; kl_offset > 0; kl_offset >>= 1)
        kl_tail += __shfl_down_sync(0xffffffffu, kl_tail, kl_offset);
      if (tid == 0) buf[0] = kl_tail;
    }
    __syncthreads();

Exactness: at a step ``s``, lane ``i < s`` computes ``v[i] op v[i + s]`` from the previous
step's values of lanes below ``2 s``, as thread ``i`` did with ``buf``; so lane 0 ends with
``buf[0]``'s value bit for bit (same operations, same operand order). Only ``buf[1..63]``
end differently, so every other read of the buffer must be ``buf[0]`` or another tree of
this form that a full ``buf[tid] = ...`` and a barrier start afresh. The halving must go
through 16 (a start that is a power of two of at least 16) and warp 0 must be the threads
``tid`` 0..31, all present: a 1-D block of at least 32 threads, read from the launches in
the file. Anything else is reported with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._local_util import names_in_function, statements
from klineage.mechanisms._reductions_util import (
    cached,
    call_name,
    fresh_name,
    graph,
    inside,
    is_builtin,
    strip_parens,
)

SHUFFLED_TYPES = frozenset(
    {"float", "double", "int", "unsigned", "unsigned int", "long long", "unsigned long long"}
)
COMBINING_CALLS = frozenset({"fmaxf", "fminf", "fmax", "fmin", "max", "min"})
WARP = 32


@dataclass(frozen=True)
class TreeReduction:
    """One halving loop over a shared buffer, and why it cannot be finished by shuffles."""

    function: Function
    loop: Node
    condition: Node
    stride: str
    thread: str
    buffer: str
    element: str
    combine: str
    """``+`` for ``buf[t] += buf[t + s]``, else the call's name (``fmaxf``)."""
    refusal: str | None


def tree_reductions(source: ParsedSource) -> tuple[TreeReduction, ...]:
    """Every halving loop of the form in the file's device functions."""
    return cached(source, "tree_reductions", lambda: tuple(_tree_reductions(source)))


def _tree_reductions(source: ParsedSource) -> Iterator[TreeReduction]:
    forms = []
    for loop in source.nodes("for_statement"):
        function = source.enclosing_function(loop)
        if function is None or not function.runs_on_device:
            continue
        found = _tree_form(source, function, loop)
        if found is not None:
            forms.append(found)
    for tree in forms:
        yield replace(tree, refusal=_refusal(source, tree, forms))


def _tree_form(source: ParsedSource, function: Function, loop: Node) -> TreeReduction | None:
    """The loop as a tree reduction (with its refusal, if any), or None when not the form."""
    header = _halving_header(source, loop)
    body = loop.child_by_field_name("body")
    if header is None or body is None or body.type != "compound_statement":
        return None
    stride, condition = header
    steps = statements(body)
    if len(steps) != 2 or not _is_syncthreads(source, steps[1]):
        return None
    step = _guarded_step(source, function, steps[0], stride)
    if step is None:
        return None
    thread, buffer, combine = step
    element = _shared_element(source, function, buffer)
    if element is None:
        return None
    return TreeReduction(function, loop, condition, stride, thread, buffer, element, combine, None)


def _halving_header(source: ParsedSource, loop: Node) -> tuple[str, Node] | None:
    """``int s = ...; s > 0; s >>= 1`` (or ``s /= 2``): the stride's name and the condition."""
    init = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    if init is None or condition is None or update is None or init.type != "declaration":
        return None
    declarators = init.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    name_node = declarators[0].child_by_field_name("declarator")
    if name_node is None or name_node.type != "identifier":
        return None
    stride = source.text_of(name_node)
    if source.text_of(condition).replace(" ", "") != f"{stride}>0":
        return None
    if source.text_of(update).replace(" ", "") not in (f"{stride}>>=1", f"{stride}/=2"):
        return None
    return stride, condition


def _start(loop: Node) -> Node | None:
    init = loop.child_by_field_name("initializer")
    declarator = init.children_by_field_name("declarator")[0] if init is not None else None
    return declarator.child_by_field_name("value") if declarator is not None else None


def _is_syncthreads(source: ParsedSource, statement: Node) -> bool:
    return source.text_of(statement).replace(" ", "") == "__syncthreads();"


def _guarded_step(
    source: ParsedSource, function: Function, statement: Node, stride: str
) -> tuple[str, str, str] | None:
    """``if (t < s) buf[t] op= buf[t + s];``: the thread index, the buffer, the combine."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return None
    condition = statement.child_by_field_name("condition")
    if condition is not None and condition.type == "condition_clause":
        condition = condition.child_by_field_name("value")
    guard = strip_parens(condition) if condition is not None else None
    if guard is None or guard.type != "binary_expression":
        return None
    left, right = guard.child_by_field_name("left"), guard.child_by_field_name("right")
    operator = guard.child_by_field_name("operator")
    if left is None or right is None or operator is None or source.text_of(operator) != "<":
        return None
    if source.text_of(right) != stride or not _is_thread_index(source, function, left):
        return None
    thread = source.text_of(left)
    update = _only_statement(statement.child_by_field_name("consequence"))
    if update is None or update.type != "expression_statement" or not update.named_children:
        return None
    return _combine(source, update.named_children[0], thread, stride)


def _only_statement(node: Node | None) -> Node | None:
    if node is not None and node.type == "compound_statement":
        inner = statements(node)
        return inner[0] if len(inner) == 1 else None
    return node


def _is_thread_index(source: ParsedSource, function: Function, node: Node) -> bool:
    """``threadIdx.x``, or a local initialized from it and never assigned again."""
    if is_builtin(source, node, "threadIdx"):
        return True
    if node.type != "identifier" or function.body is None:
        return False
    name = source.text_of(node)
    initial = [
        d
        for d in inside(source, function.body, "init_declarator")
        if (n := d.child_by_field_name("declarator")) is not None and source.text_of(n) == name
    ]
    if len(initial) != 1 or not is_builtin(
        source, initial[0].child_by_field_name("value"), "threadIdx"
    ):
        return False
    return not any(
        (target := a.child_by_field_name("left")) is not None and source.text_of(target) == name
        for a in inside(source, function.body, "assignment_expression", "update_expression")
    )


def _combine(
    source: ParsedSource, expr: Node, thread: str, stride: str
) -> tuple[str, str, str] | None:
    """``buf[t] += buf[t + s]`` -> (t, buf, "+"); ``buf[t] = f(buf[t], buf[t + s])`` -> f."""
    if expr.type != "assignment_expression":
        return None
    target, value = expr.child_by_field_name("left"), expr.child_by_field_name("right")
    operator = expr.child_by_field_name("operator")
    if target is None or value is None or operator is None:
        return None
    buffer = _buffer_at(source, target, {thread})
    if buffer is None:
        return None
    partner = {f"{thread}+{stride}", f"{stride}+{thread}"}
    if source.text_of(operator) == "+=":
        return (thread, buffer, "+") if _buffer_at(source, value, partner) == buffer else None
    if source.text_of(operator) != "=" or value.type != "call_expression":
        return None
    name = call_name(source, value)
    arguments = value.child_by_field_name("arguments")
    operands = arguments.named_children if arguments is not None else []
    if name not in COMBINING_CALLS or len(operands) != 2:
        return None
    if _buffer_at(source, operands[0], {thread}) != buffer:
        return None
    return (thread, buffer, name) if _buffer_at(source, operands[1], partner) == buffer else None


def _buffer_at(source: ParsedSource, node: Node, indices: set[str]) -> str | None:
    """``buf[i]`` with ``i`` (spaces ignored) one of ``indices``: the buffer's name."""
    node = strip_parens(node)
    if node.type != "subscript_expression":
        return None
    array = node.child_by_field_name("argument")
    index = node.child_by_field_name("indices") or node.child_by_field_name("index")
    if array is None or array.type != "identifier" or index is None:
        return None
    text = source.text_of(index).strip("[] ").replace(" ", "")
    return source.text_of(array) if text in indices else None


def _shared_element(source: ParsedSource, function: Function, buffer: str) -> str | None:
    """The element type of a 1-D ``__shared__`` array of that name declared in the function."""
    if function.body is None:
        return None
    for declaration in source.shared_declarations:
        inside_function = function.body.start_byte <= declaration.node.start_byte
        if not inside_function or declaration.node.end_byte > function.body.end_byte:
            continue
        for name, declarator in zip(declaration.names, declaration.declarators, strict=False):
            one_dimension = declarator.type == "array_declarator" and (
                (inner := declarator.child_by_field_name("declarator")) is not None
                and inner.type == "identifier"
            )
            if name == buffer and one_dimension:
                return declaration.type
    return None


# ---------------------------------------------------------------------------------------------
# When finishing by shuffles is exact
# ---------------------------------------------------------------------------------------------


def _refusal(source: ParsedSource, tree: TreeReduction, forms: list[TreeReduction]) -> str | None:
    if tree.element not in SHUFFLED_TYPES:
        return f"{tree.buffer} holds {tree.element}; shuffles move 32- and 64-bit numbers"
    return (
        _start_refusal(source, tree)
        or _fresh_write_refusal(source, tree, tree.loop)
        or _other_uses_refusal(source, tree, forms)
    )


def _block_threads(source: ParsedSource, function: Function) -> int | None:
    """The threads of the 1-D block every launch in the file gives the one kernel reaching
    ``function``; None when not one constant (a ``dim3`` block, a variable, no launch)."""
    kernels = graph(source).kernels_reaching(function.name)
    if len(kernels) != 1:
        return None
    sizes = {_one_dimension(source, launch.block) for launch in source.launches_of(kernels[0])}
    size = sizes.pop() if len(sizes) == 1 else None
    return size if isinstance(size, int) else None


def _one_dimension(source: ParsedSource, block: Node | None) -> int | None:
    """A launch's constant 1-D block size; None for a ``dim3`` (``fold_int`` multiplies its
    extents, which is the thread count but not ``blockDim.x``)."""
    if block is None or "dim3" in source.text_of(block):
        return None
    return fold_int(source, block)


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _start_refusal(source: ParsedSource, tree: TreeReduction) -> str | None:
    """The halving must pass through 16 and warp 0 must be threads 0..31, all present."""
    threads = _block_threads(source, tree.function)
    if threads is None:
        return (
            "the block is not one constant 1-D size in the file's launches, so warp 0 is not "
            f"known to be {tree.thread} 0..31 with every lane present"
        )
    start = _start(tree.loop)
    constant = fold_int(source, start) if start is not None else None
    if constant is None and start is not None and _is_half_block(source, start):
        constant = threads // 2 if _is_power_of_two(threads) else None
    if constant is None or not _is_power_of_two(constant) or constant < WARP // 2:
        return (
            f"the halving does not start at a power of two of at least 16 (blocks of {threads} "
            "threads): the warp's shuffles would skip or repeat a step"
        )
    if threads < WARP or 2 * constant > threads:
        return f"blocks of {threads} threads do not cover the tree of {2 * constant} values"
    return None


def _is_half_block(source: ParsedSource, start: Node) -> bool:
    text = source.text_of(strip_parens(start)).replace(" ", "")
    return text in ("blockDim.x/2", "blockDim.x>>1")


def _fresh_write_refusal(source: ParsedSource, tree: TreeReduction, loop: Node) -> str | None:
    """The tree must read only values its own ``buf[tid] = ...`` and barrier published: the
    shuffles leave ``buf[1..63]`` differently from the original."""
    parent = loop.parent
    siblings = statements(parent) if parent is not None else []
    at = siblings.index(loop) if loop in siblings else -1
    if at >= 2 and _is_syncthreads(source, siblings[at - 1]):
        write = siblings[at - 2]
        expr = write.named_children[0] if write.type == "expression_statement" else None
        if (
            expr is not None
            and expr.type == "assignment_expression"
            and (operator := expr.child_by_field_name("operator")) is not None
            and source.text_of(operator) == "="
            and (target := expr.child_by_field_name("left")) is not None
            and _buffer_at(source, target, {tree.thread}) == tree.buffer
        ):
            return None
    line = source.line_of(loop.start_byte)
    return (
        f"the tree at line {line} is not right after {tree.buffer}[{tree.thread}] = ...; "
        "__syncthreads();, so it may read values an earlier tree left behind"
    )


def _other_uses_refusal(
    source: ParsedSource, tree: TreeReduction, forms: list[TreeReduction]
) -> str | None:
    """Outside trees of the form, the buffer may be written, and read only at ``[0]``."""
    assert tree.function.body is not None
    trees = [t for t in forms if t.buffer == tree.buffer and t.function.node == tree.function.node]
    for other in trees:
        if other.loop != tree.loop and (refusal := _fresh_write_refusal(source, tree, other.loop)):
            return refusal
    for use in inside(source, tree.function.body, "identifier"):
        if source.text_of(use) != tree.buffer or any(_within(use, t.loop) for t in trees):
            continue
        access = use.parent
        if access is None or access.type == "array_declarator":
            continue
        if access.type != "subscript_expression" or access.child_by_field_name("argument") != use:
            line = source.line_of(use.start_byte)
            return f"{tree.buffer} is used at line {line} other than through a subscript"
        if _is_written(access) or _buffer_at(source, access, {"0"}) == tree.buffer:
            continue
        return (
            f"{source.text_of(access)} is read at line {source.line_of(use.start_byte)}: after "
            f"the shuffles only {tree.buffer}[0] holds what the tree left there"
        )
    return None


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _is_written(access: Node) -> bool:
    """``buf[i] = ...``: a plain store (a compound assignment also reads)."""
    parent = access.parent
    if parent is None or parent.type != "assignment_expression":
        return False
    operator = parent.child_by_field_name("operator")
    return parent.child_by_field_name("left") == access and (
        operator is not None and operator.type == "="
    )


# ---------------------------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------------------------


def finish_by_shuffles(source: ParsedSource, tree: TreeReduction, mask: str) -> list[Edit]:
    """Stop the shared-memory halving at 32 and do the last five steps in warp 0."""
    taken = names_in_function(source, tree.function)
    value, offset = fresh_name(taken, "kl_tail"), fresh_name(taken, "kl_offset")
    shuffle = f"__shfl_down_sync({mask}, {value}, {offset})"
    step = (
        f"{value} += {shuffle};"
        if tree.combine == "+"
        else f"{value} = {tree.combine}({value}, {shuffle});"
    )
    indent = _indent_of(source, tree.loop)
    inner = indent + "  "
    tail = "\n".join(
        [
            "",
            f"{indent}if ({tree.thread} < {WARP}) {{",
            f"{inner}{tree.element} {value} = {tree.buffer}[{tree.thread}];",
            f"{inner}for (int {offset} = {WARP // 2}; {offset} > 0; {offset} >>= 1)",
            f"{inner}  {step}",
            f"{inner}if ({tree.thread} == 0) {tree.buffer}[0] = {value};",
            f"{indent}}}",
            f"{indent}__syncthreads();",
        ]
    )
    return [
        Edit.replace(tree.condition, f"{tree.stride} > {WARP // 2}"),
        Edit.insert(tree.loop.end_byte, tail),
    ]


def _indent_of(source: ParsedSource, node: Node) -> str:
    start = source.line_start(node.start_byte)
    prefix = source.data[start : node.start_byte].decode("utf-8")
    return prefix if prefix.strip() == "" else ""
