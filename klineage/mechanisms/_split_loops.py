"""split_k forward on naive code: a thread-per-output sum split over ``blockIdx.y``.

The naive form is one thread per output, walking the whole reduction dimension:

    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    y[c] = acc;

When the outputs are too few to fill the GPU (a tall column sum, a short GEMV), most SMs sit
idle. The rewrite gives each block row (``blockIdx.y``) a range of ``r`` and adds the partial
sums with ``atomicAdd``: into the output itself, zeroed on the launch's stream first, when the
sum is stored as it is into a float output; otherwise (``y[i] = __float2half(acc / n)``, an
epilogue that reads only the sum and parameters) into a float workspace allocated and zeroed
on the stream, which a second kernel (the thread index, the guard and the store as written)
turns into the output before the workspace is freed. ``run`` picks the split count to fill the
GPU (blocks per SM times the SM count, over the blocks the outputs need), with at least
``min_rows`` values of ``r`` per split, so short reductions stay one split. The host choice is
written in the canonical form the removal deletes (``splits = 1`` raised by one ``if``), so a
forward split is also a removable one. This module reads the form;
:mod:`klineage.mechanisms._split_rewrite` writes the split.

Everything else is refused, with the form found: other accumulators (a max needs an atomic
max and a -inf fill), a loop that is not ``for (r = 0; r < n; ++r)`` over a parameter, more
than the one store after the loop, an epilogue reading locals, a kernel using ``blockIdx.y``
or shared memory, several launches.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Launch, Node, ParsedSource, strip_casts, strip_parens
from klineage.mechanisms._local_util import element_kernels
from klineage.mechanisms._tiles_util import names_in, rename, statements

__all__ = ["BLOCKS_PER_SM", "MIN_ROWS", "NotSplittable", "SplitLoop", "match", "split_loops"]

BLOCKS_PER_SM = 8
"""Blocks per SM the split count aims at (a full wave of 256-thread blocks)."""
MIN_ROWS = 128
"""Reduction steps a split keeps at least, so that its atomics stay a small share."""


class NotSplittable(Exception):
    """The kernel is not in the naive thread-per-output sum form (the message says why)."""


@dataclass(frozen=True)
class SplitLoop:
    """A thread-per-output sum and its one launch."""

    kernel: Function
    loop: Node
    start: Node
    """The loop variable's initial ``0``."""
    condition: Node
    """``r < n``."""
    store: Node
    """The ``y[i] = acc;`` statement."""
    target: Node
    """``y[i]``."""
    accumulator: str
    index: str
    """``i`` of the store ``y[i] = ...`` (the thread's index)."""
    launch: Launch
    steps: str
    """The launch argument bound to the loop's bound ``n``."""
    outputs: str
    """The launch argument bound to the guard's bound (how many outputs are written)."""
    output: str
    """The launch argument bound to the output pointer."""
    direct: bool
    """The sum is stored as it is into a float output (atomics into it); otherwise the
    partials meet in a float workspace that a second kernel stores through the epilogue."""
    declaration: Node
    """The thread index's declaration."""
    guard: Node
    """``if (i >= n) return;``."""


def split_loops(source: ParsedSource) -> list[tuple[Function, Node, str | None]]:
    """Each kernel's top-level reduction loops ``for (r = 0; r < n; ++r) acc += ...;``, with
    None where the split rewrite applies or why not."""
    found: list[tuple[Function, Node, str | None]] = []
    for kernel in source.kernels:
        if kernel.body is None:
            continue
        for loop in statements(kernel.body):
            if loop.type != "for_statement" or _summed(source, loop) is None:
                continue
            try:
                match(source, kernel, loop)
            except NotSplittable as why:
                found.append((kernel, loop, str(why)))
            else:
                found.append((kernel, loop, None))
    return found


def match(source: ParsedSource, kernel: Function, loop: Node) -> SplitLoop:
    """The split form of ``loop`` in ``kernel``; :class:`NotSplittable` says why not."""
    assert kernel.body is not None
    if kernel.template_params:
        raise NotSplittable(f"{kernel.name} is a template (its launches are not followed)")
    accumulator = _summed(source, loop)
    if accumulator is None:
        raise NotSplittable("the loop body is not one `acc += value;`")
    start, bound, condition = _counted(source, kernel, loop)
    body = statements(kernel.body)
    after = [s for s in body if s.start_byte >= loop.end_byte]
    if len(after) != 1:
        raise NotSplittable(
            f"{len(after)} statements follow the loop; the form ends with the one store "
            f"`y[i] = {accumulator};`"
        )
    store, target, pointer, index, direct = _store(source, kernel, after[0], accumulator)
    _declared_zero(source, kernel, body, loop, accumulator)
    guard, declaration, outputs = _guard(source, kernel, index)
    _one_thread_per_output(source, kernel, store)
    _written_only(source, kernel, store, pointer)
    launch = _only_launch(source, kernel)
    arguments = _arguments(source, kernel, launch)
    return SplitLoop(
        kernel=kernel,
        loop=loop,
        start=start,
        condition=condition,
        store=store,
        target=target,
        accumulator=accumulator,
        index=index,
        launch=launch,
        steps=arguments[bound],
        outputs=rename(
            source, outputs, {n: a if a.isidentifier() else f"({a})" for n, a in arguments.items()}
        ),
        output=arguments[pointer],
        direct=direct,
        declaration=declaration,
        guard=guard,
    )


def _summed(source: ParsedSource, loop: Node) -> str | None:
    """``acc`` when the loop body is one ``acc += value;`` (value without side effects)."""
    body = loop.child_by_field_name("body")
    if body is None:
        return None
    inner = statements(body) if body.type == "compound_statement" else [body]
    if len(inner) != 1 or inner[0].type != "expression_statement" or not inner[0].named_children:
        return None
    assignment = inner[0].named_children[0]
    operator = assignment.child_by_field_name("operator")
    left = assignment.child_by_field_name("left")
    right = assignment.child_by_field_name("right")
    if (
        assignment.type != "assignment_expression"
        or operator is None
        or operator.type != "+="
        or left is None
        or left.type != "identifier"
        or right is None
    ):
        return None
    if any(
        True for _ in source.iter_nodes("assignment_expression", "update_expression", within=right)
    ):
        return None
    for call in source.iter_nodes("call_expression", within=right):
        callee = call.child_by_field_name("function")
        if callee is not None and source.text_of(callee).startswith("atomic"):
            return None
    return source.text_of(left)


def _counted(source: ParsedSource, kernel: Function, loop: Node) -> tuple[Node, str, Node]:
    """(the initial 0, the bound parameter, the condition) of ``for (r = 0; r < n; ++r)``."""
    initializer = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    declarators = initializer.children_by_field_name("declarator") if initializer else []
    value = declarators[0].child_by_field_name("value") if len(declarators) == 1 else None
    if value is None or fold_int(source, value) != 0:
        raise NotSplittable("the loop does not declare its variable from 0")
    inner = declarators[0].child_by_field_name("declarator")
    variable = source.text_of(inner) if inner is not None else ""
    operator, left, right = _parts(condition, "operator", "left", "right")
    if condition is None or condition.type != "binary_expression" or operator is None:
        raise NotSplittable(f"the loop condition is not `{variable} < n`")
    if operator.type != "<" or left is None or source.text_of(left) != variable or not right:
        raise NotSplittable(f"the loop condition is not `{variable} < n`")
    bound = source.text_of(strip_parens(strip_casts(right)))
    if bound not in {p.name for p in kernel.params if p.name and not p.pointer_depth}:
        raise NotSplittable(f"the loop bound {source.text_of(right)} is not a kernel parameter")
    steps = {f"++{variable}", f"{variable}++", f"{variable}+=1"}
    if update is None or source.text_of(update).replace(" ", "") not in steps:
        raise NotSplittable(f"the loop does not step {variable} by one")
    return value, bound, condition


def _parts(node: Node | None, *fields: str) -> list[Node | None]:
    """The named fields of ``node`` (all None without a node)."""
    return [node.child_by_field_name(f) if node is not None else None for f in fields]


def _store(
    source: ParsedSource, kernel: Function, statement: Node, accumulator: str
) -> tuple[Node, Node, str, str, bool]:
    """(statement, target, pointer, index, direct) of ``y[i] = value;``: direct when the value
    is the sum itself into a float pointer; otherwise the value is an epilogue of it
    (``__float2half(acc / (float)seq)``) that reads only the sum and parameters."""
    assignment = statement.named_children[0] if statement.type == "expression_statement" else None
    operator, target, value = _parts(assignment, "operator", "left", "right")
    stored = (
        assignment is not None
        and assignment.type == "assignment_expression"
        and operator is not None
        and operator.type == "="
        and value is not None
    )
    if not stored or target is None or target.type != "subscript_expression" or value is None:
        raise NotSplittable(f"the loop's sum is not stored as `y[i] = {accumulator};`")
    pointer = target.child_by_field_name("argument")
    index = target.child_by_field_name("indices") or target.child_by_field_name("index")
    if pointer is None or index is None:
        raise NotSplittable("the store's target is not `y[i]`")
    name = source.text_of(pointer)
    params = {p.name: p for p in kernel.params if p.name}
    param = params.get(name)
    if param is None or param.pointer_depth != 1 or param.is_const:
        raise NotSplittable(f"{name} is not a parameter the kernel writes through")
    direct = source.text_of(strip_parens(value)) == accumulator and param.base_type == "float"
    called = {
        source.text_of(c.child_by_field_name("function") or c)
        for c in source.iter_nodes("call_expression", within=value)
    }
    read = names_in(source, value) - called - {accumulator}
    if accumulator not in names_in(source, value) or not read <= set(params):
        raise NotSplittable(
            f"the stored value {source.text_of(value)} reads more than {accumulator} and the "
            "kernel's parameters"
        )
    text = source.text_of(index).strip("[] ")
    return statement, target, name, text, direct


def _declared_zero(
    source: ParsedSource, kernel: Function, body: list[Node], loop: Node, accumulator: str
) -> None:
    for statement in body:
        if statement.start_byte >= loop.start_byte or statement.type != "declaration":
            continue
        for declarator in statement.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if inner is None or source.text_of(inner) != accumulator:
                continue
            kind = statement.child_by_field_name("type")
            if kind is None or source.text_of(kind) != "float":
                raise NotSplittable(f"{accumulator} is not a float (atomicAdd of a float)")
            if value is None or source.text_of(value).rstrip("fF") not in ("0", "0.0", "0.", ".0"):
                raise NotSplittable(f"{accumulator} does not start at 0 (a sum's identity)")
            return
    raise NotSplittable(f"{accumulator} is not declared before the loop")


def _guard(source: ParsedSource, kernel: Function, index: str) -> tuple[Node, Node, Node]:
    """(the guard, the index's declaration, the bound) of the one-thread-per-element opening
    ``i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;`` for the store's index
    ``i``, with ``n`` reading only integer parameters (``batch * hidden``)."""
    opening = next(
        (
            e
            for e in element_kernels(source)
            if e.function.name == kernel.name and e.name == index and e.form == "return"
        ),
        None,
    )
    if opening is None:
        raise NotSplittable(
            f"the output index {index} is not `blockIdx.x * blockDim.x + threadIdx.x` guarded "
            f"by `if ({index} >= n) return;`"
        )
    integers = {p.name for p in kernel.params if p.name and not p.pointer_depth}
    if not names_in(source, opening.bound) <= integers:
        raise NotSplittable(
            f"the guard's bound {source.text_of(opening.bound)} reads more than the kernel's "
            "parameters"
        )
    return opening.guard, opening.decl, opening.bound


def _one_thread_per_output(source: ParsedSource, kernel: Function, store: Node) -> None:
    assert kernel.body is not None
    text = source.text_of(kernel.body)
    for used in ("blockIdx.y", "gridDim.y", "threadIdx.y", "__syncthreads", "__shared__", "atomic"):
        if used in text:
            raise NotSplittable(f"the kernel uses {used}; the split takes blockIdx.y for itself")
    for node in source.iter_nodes("assignment_expression", within=kernel.body):
        left = node.child_by_field_name("left")
        writes = left is not None and left.type in ("subscript_expression", "pointer_expression")
        if writes and not store.start_byte <= node.start_byte < store.end_byte:
            raise NotSplittable(
                f"the kernel also writes {source.text_of(left)}; the form stores once"
            )


def _written_only(source: ParsedSource, kernel: Function, store: Node, pointer: str) -> None:
    """The output is named only by its store: partials land in it while other blocks run."""
    assert kernel.body is not None
    for node in source.iter_nodes("identifier", within=kernel.body):
        if (
            source.text_of(node) == pointer
            and not store.start_byte <= node.start_byte < store.end_byte
        ):
            raise NotSplittable(
                f"the kernel reads {pointer} at line {source.line_of(node.start_byte)}; the "
                "partials are added into it while other blocks run"
            )


def _only_launch(source: ParsedSource, kernel: Function) -> Launch:
    launches = source.launches_of(kernel)
    if len(launches) != 1:
        raise NotSplittable(f"{kernel.name} is launched {len(launches)} times, not once")
    (launch,) = launches
    host = source.enclosing_function(launch.node)
    if host is None or not host.extern_c or launch.grid is None or launch.block is None:
        raise NotSplittable("the launch is not in the entry `run` with a grid and a block")
    grid = source.text_of(launch.grid)
    if "dim3" in grid or "," in grid:
        raise NotSplittable(f"the grid {grid} is not one-dimensional")
    types = source.local_types(host)
    if launch.grid.type == "identifier" and "dim3" in types.get(grid, ""):
        raise NotSplittable(f"the grid {grid} is a dim3")
    return launch


def _arguments(source: ParsedSource, kernel: Function, launch: Launch) -> dict[str, str]:
    """Kernel parameter -> the launch's argument, each free of side effects."""
    names = [p.name for p in kernel.params]
    if len(names) != len(launch.args) or None in names:
        raise NotSplittable("the launch's arguments do not match the kernel's parameters")
    found: dict[str, str] = {}
    for name, argument in zip(names, launch.args, strict=True):
        if any(
            True
            for _ in source.iter_nodes(
                "assignment_expression", "update_expression", "call_expression", within=argument
            )
        ):
            raise NotSplittable(f"the argument {source.text_of(argument)} is not a plain value")
        found[str(name)] = source.text_of(argument)
    return found
