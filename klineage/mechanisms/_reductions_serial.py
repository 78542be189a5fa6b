"""A block reduction finished serially by the block's first thread, through per-warp scratch::

    v = warp_max(v);                                   // reduce each warp (shuffles)
    if (lane == 0) scratch[warp] = v;                  // publish one value per warp
    __syncthreads();
    if (threadIdx.x == 0) {                            // one thread walks the warps' values
        float a = scratch[0];
        for (int w = 1; w < warps; w++) a = fmaxf(a, scratch[w]);
        scratch[0] = a;
    }
    __syncthreads();
    float row_max = scratch[0];                        // broadcast

The scratch is a ``__shared__`` array or a local pointer into one (``float* s = &shared[k]``,
halves of one ``extern __shared__`` array). Kernels in this idiom often start with an early
exit for the threads past the row's end, ``if (tid >= n) { scratch[warp] = identity; ...;
return; }``, which publishes neutral values for them.

With one thread per row the block reduction is the thread's own partial: the warp reduction,
the publish, the barriers and the serial block go, and the broadcast reads the partial. This
module finds the runs (:func:`serial_runs`) and the early exits (:func:`early_exit`); the
rewrite is the group walker's (:mod:`klineage.mechanisms._rows_group_walker`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.source import Loop, Node, ParsedSource, plain_assignment
from klineage.mechanisms._local_util import index_declaration
from klineage.mechanisms._reductions_scratch import assigned_value
from klineage.mechanisms._reductions_util import (
    call_name,
    inside,
    is_zero_literal,
    named_statements,
    strip_parens,
)

__all__ = ["SerialRun", "early_exit", "scratch_pointers", "serial_runs"]

Reduction = Callable[[Node], Node | None]
"""The reduced value of a warp-reduction call node, or None when the node is not one."""
Test = Callable[[Node], bool]

_COMBINES: dict[str, str] = {
    "fmaxf": "max",
    "fmax": "max",
    "max": "max",
    "fminf": "min",
    "fmin": "min",
    "min": "min",
}
_IDENTITIES: dict[str, frozenset[str]] = {
    "max": frozenset({"-INFINITY", "-FLT_MAX", "-HUGE_VALF", "__int_as_float(0xff800000)"}),
    "min": frozenset({"INFINITY", "FLT_MAX", "HUGE_VALF", "__int_as_float(0x7f800000)"}),
}


class SerialFormError(Exception):
    """The statements look like a serial block reduction but differ from it; says how."""


@dataclass
class SerialRun:
    """One warp-reduce / publish / barrier / serial block / barrier / broadcast sequence."""

    warp_step: Node
    """The statement ``v = warp_reduce(v);``."""
    variable: str
    """``v``: the thread's partial, which the broadcast reads once the run is gone."""
    scratch: str
    op: str
    """``sum``, ``max`` or ``min``: what the serial block combines the warps' values with."""
    deleted: list[Node]
    """The publish, the barriers and the serial block."""
    broadcast: Node
    """The ``scratch[0]`` read after the last barrier."""


def scratch_pointers(source: ParsedSource, body: Node, shared: set[str]) -> dict[str, Node]:
    """Locals of ``body`` pointing into a ``shared`` array (``T* p = s;``, ``T* p =
    &s[k];``, ``T* p = s + k;``) -> their declarations."""
    found: dict[str, Node] = {}
    for statement in named_statements(body):
        declared = _pointer_declaration(source, statement)
        if declared is None:
            continue
        value = strip_parens(declared[1])
        if value.type == "pointer_expression" and source.text_of(value).startswith("&"):
            value = strip_parens(value.child_by_field_name("argument") or value)
            value = value.child_by_field_name("argument") or value  # s[k] -> s
        elif value.type == "binary_expression" and _op(value) == "+":
            value = strip_parens(value.child_by_field_name("left") or value)
        if value.type == "identifier" and source.text_of(value) in shared:
            found[declared[0]] = statement
    return found


def _pointer_declaration(source: ParsedSource, statement: Node) -> tuple[str, Node] | None:
    """``T* p = value;`` (one declarator) -> (p, value)."""
    if statement.type != "declaration":
        return None
    declarators = statement.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    target = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if target is None or value is None or target.type != "pointer_declarator":
        return None
    name = target.child_by_field_name("declarator")
    if name is None or name.type != "identifier":
        return None
    return source.text_of(name), value


def _stored_scratch(source: ParsedSource, statement: Node, scratch: set[str]) -> Node | None:
    """``S[i] = e;`` with ``S`` in ``scratch`` -> ``e``."""
    found = plain_assignment(statement)
    if found is None or found[0].type != "subscript_expression":
        return None
    base = found[0].child_by_field_name("argument")
    return found[1] if base is not None and source.text_of(base) in scratch else None


def _scratch_of(source: ParsedSource, node: Node) -> str | None:
    node = strip_parens(node)
    if node.type != "subscript_expression":
        return None
    base = node.child_by_field_name("argument")
    return source.text_of(base) if base is not None and base.type == "identifier" else None


def _slot_zero(source: ParsedSource, node: Node, scratch: str) -> bool:
    """``scratch[0]``."""
    node = strip_parens(node)
    indices = node.child_by_field_name("indices")
    return (
        _scratch_of(source, node) == scratch
        and indices is not None
        and len(indices.named_children) == 1
        and source.text_of(indices.named_children[0]).strip() == "0"
    )


def _warp_step(
    source: ParsedSource, statement: Node, reduction: Reduction
) -> tuple[str, Node] | None:
    """``v = warp_reduce(v);`` -> (``v``, the call)."""
    found = plain_assignment(statement)
    if found is None or found[0].type != "identifier":
        return None
    call = strip_parens(found[1])
    value = reduction(call)
    name = source.text_of(found[0])
    if value is None or source.text_of(strip_parens(value)) != name:
        return None
    return name, call


def _publish(source: ParsedSource, statement: Node, scratch: set[str], variable: str) -> str | None:
    """``if (c) S[w] = v;`` (or unguarded) -> ``S``."""
    target = statement
    if statement.type == "if_statement" and statement.child_by_field_name("alternative") is None:
        target = statement.child_by_field_name("consequence") or statement
    value = _stored_scratch(source, target, scratch)
    if value is None or source.text_of(strip_parens(value)) != variable:
        return None
    found = plain_assignment(target)
    assert found is not None
    return _scratch_of(source, found[0])


def _first_thread_block(statement: Node, is_first: Test) -> Node | None:
    """``if (first) { ... }`` -> the braced block."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return None
    condition = statement.child_by_field_name("condition")
    value = condition.child_by_field_name("value") if condition is not None else None
    block = statement.child_by_field_name("consequence")
    if value is None or block is None or block.type != "compound_statement":
        return None
    return block if is_first(value) else None


def _serial_op(source: ParsedSource, block: Node, scratch: str) -> str:
    """What the serial block combines with; :class:`SerialFormError` when it reads anything
    but the scratch slots, calls anything but a min or max, or does not end by storing its
    result into ``scratch[0]``."""
    line = source.line_of(block.start_byte)
    for read in inside(source, block, "subscript_expression", "pointer_expression"):
        if read.type == "pointer_expression" or _scratch_of(source, read) != scratch:
            raise SerialFormError(
                f"the serial reduction at line {line} reads {source.text_of(read)}, not only the "
                f"{scratch} slots"
            )
    ops = set()
    for call in inside(source, block, "call_expression"):
        name = call_name(source, call) or ""
        if name not in _COMBINES:
            raise SerialFormError(f"the serial reduction at line {line} calls {name}")
        ops.add(_COMBINES[name])
    for node in inside(source, block, "assignment_expression"):
        operator = node.child_by_field_name("operator")
        if operator is not None and operator.type == "+=":
            ops.add("sum")
        elif operator is not None and operator.type != "=":
            raise SerialFormError(
                f"the serial reduction at line {line} combines with {operator.type}"
            )
    statements = named_statements(block)
    last = _stored_scratch(source, statements[-1], {scratch}) if statements else None
    found = plain_assignment(statements[-1]) if statements else None
    if last is None or found is None or not _slot_zero(source, found[0], scratch):
        raise SerialFormError(f"the serial reduction at line {line} does not end in {scratch}[0]")
    if len(ops) != 1:
        raise SerialFormError(f"the serial reduction at line {line} is not one sum, max or min")
    return ops.pop()


def _combine_of(source: ParsedSource, call: Node) -> str | None:
    """``sum``, ``max`` or ``min`` for a call of a helper of this file that combines with
    exactly one of them; None when that is not known."""
    helper = source.function(call_name(source, call) or "")
    if helper is None or helper.body is None:
        return None
    ops = {
        _COMBINES[name]
        for node in inside(source, helper.body, "call_expression")
        if (name := call_name(source, node) or "") in _COMBINES
    }
    for node in inside(source, helper.body, "assignment_expression"):
        operator = node.child_by_field_name("operator")
        if operator is not None and operator.type == "+=":
            ops.add("sum")
    return ops.pop() if len(ops) == 1 else None


def _check_covers_every_warp(
    source: ParsedSource, guard: Node, block: Node, scratch: str, op: str, is_warp_count: Test
) -> None:
    """The serial block combines each warp's slot once: ``a = s[0]`` then ``w`` from 1, or
    ``a = identity`` then ``w`` from 0, up to the block's warp count, one ``s[w]`` a trip;
    :class:`SerialFormError` otherwise."""
    line = source.line_of(block.start_byte)
    statements = [
        n
        for n in named_statements(block)
        if n.type != "comment" and not n.type.startswith("preproc")
    ]
    loop = source.loop_at(statements[1]) if len(statements) == 3 else None
    start = assigned_value(source, statements[0]) if statements else None
    if loop is None or loop.variable is None or loop.initializer is None or start is None:
        raise SerialFormError(
            f"the serial reduction at line {line} is not a start value, one loop over the "
            f"warps and the store to {scratch}[0]"
        )
    first = _first_slot(source, loop, scratch, op, start[1], _guard_rank(source, guard))
    declared = index_declaration(source, loop.initializer)
    condition = strip_parens(loop.condition) if loop.condition is not None else None
    count = condition.child_by_field_name("right") if condition is not None else None
    update = "".join(source.text_of(loop.update).split()) if loop.update is not None else ""
    variable = loop.variable
    if (
        declared is None
        or source.text_of(declared[2]).strip() != str(first)
        or condition is None
        or _op(condition) != "<"
        or count is None
        or not is_warp_count(count)
        or update not in (f"++{variable}", f"{variable}++", f"{variable}+=1")
    ):
        raise SerialFormError(
            f"the loop at line {source.line_of(statements[1].start_byte)} does not walk the "
            f"slots {first} .. warps - 1 one by one (warps = blockDim.x / 32)"
        )
    assert loop.body is not None
    for read in inside(source, loop.body, "subscript_expression"):
        indices = read.child_by_field_name("indices")
        if indices is None or source.text_of(indices).strip("[] ") != variable:
            raise SerialFormError(
                f"the serial reduction at line {line} reads {source.text_of(read)}, not "
                f"{scratch}[{variable}]"
            )


def _guard_rank(source: ParsedSource, guard: Node) -> str:
    """``if (tid == 0)`` -> ``tid``."""
    condition = guard.child_by_field_name("condition")
    value = condition.child_by_field_name("value") if condition is not None else None
    left = strip_parens(value).child_by_field_name("left") if value is not None else None
    return "".join(source.text_of(left).split()) if left is not None else ""


def _first_slot(
    source: ParsedSource, loop: Loop, scratch: str, op: str, start: Node, rank: str
) -> int:
    """The slot the loop starts at, given the start value: 1 after ``s[0]`` (or ``s[rank]``,
    rank 0 under the guard), 0 after the identity."""
    start = strip_parens(start)
    if _scratch_of(source, start) == scratch:
        indices = start.child_by_field_name("indices")
        slot = "".join(source.text_of(indices).split()).strip("[]") if indices else ""
        if slot in ("0", rank):
            return 1
    text = "".join(source.text_of(start).split())
    if is_zero_literal(source, start) if op == "sum" else text in _IDENTITIES[op]:
        return 0
    raise SerialFormError(
        f"the serial reduction at line {source.line_of(loop.node.start_byte)} starts from "
        f"{source.text_of(start)}, neither {scratch}[0] nor the identity of its {op}"
    )


def _op(node: Node) -> str:
    operator = node.child_by_field_name("operator")
    return operator.type if operator is not None else ""


def _broadcast(source: ParsedSource, statement: Node, scratch: str) -> Node | None:
    """``T r = S[0];`` or ``r = S[0];`` -> the ``S[0]`` node."""
    declared = index_declaration(source, statement)
    found = plain_assignment(statement)
    value = declared[2] if declared is not None else found[1] if found is not None else None
    if value is None or not _slot_zero(source, value, scratch):
        return None
    return strip_parens(value)


def serial_runs(
    source: ParsedSource,
    statements: list[Node],
    scratch: set[str],
    reduction: Reduction,
    is_barrier: Test,
    is_first: Test,
    is_warp_count: Test,
) -> list[SerialRun]:
    """The runs in ``statements`` (one block's); :class:`SerialFormError` when a publish, a
    barrier and a first-thread block start one that does not finish as the form does."""
    runs = []
    for index, statement in enumerate(statements[: max(len(statements) - 5, 0)]):
        step = _warp_step(source, statement, reduction)
        if step is None:
            continue
        variable, call = step
        publish, barrier, serial, barrier2, read = statements[index + 1 : index + 6]
        name = _publish(source, publish, scratch, variable)
        block = _first_thread_block(serial, is_first)
        if name is None or not is_barrier(barrier) or block is None:
            continue
        op = _serial_op(source, block, name)
        _check_covers_every_warp(source, serial, block, name, op, is_warp_count)
        warp_op = _combine_of(source, call)
        if warp_op is not None and warp_op != op:
            raise SerialFormError(
                f"the warp reduction at line {source.line_of(statement.start_byte)} combines "
                f"with {warp_op}, the serial one after it with {op}"
            )
        broadcast = _broadcast(source, read, name)
        if not is_barrier(barrier2) or broadcast is None:
            raise SerialFormError(
                f"the serial reduction at line {source.line_of(serial.start_byte)} is not "
                f"followed by a barrier and a read of {name}[0]"
            )
        deleted = [publish, barrier, serial, barrier2]
        runs.append(SerialRun(statement, variable, name, op, deleted, broadcast))
    return runs


def early_exit(
    source: ParsedSource, statement: Node, scratch: dict[str, str], is_rank: Test
) -> Node | None:
    """For ``if (rank >= n) { S[w] = identity; ...; return; }`` whose stores publish the
    identity of each scratch's reduction (``scratch``: name -> op), the bound ``n``."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return None
    condition = statement.child_by_field_name("condition")
    test = condition.child_by_field_name("value") if condition is not None else None
    block = statement.child_by_field_name("consequence")
    if test is None or block is None or block.type != "compound_statement":
        return None
    test = strip_parens(test)
    operator = test.child_by_field_name("operator")
    rank = test.child_by_field_name("left")
    if operator is None or operator.type != ">=" or rank is None or not is_rank(rank):
        return None
    inner = named_statements(block)
    if not inner or " ".join(source.text_of(inner[-1]).split()) != "return;":
        return None
    for store in inner[:-1]:
        value = _stored_scratch(source, store, set(scratch))
        found = plain_assignment(store)
        if value is None or found is None:
            return None
        op = scratch[_scratch_of(source, found[0]) or ""]
        text = "".join(source.text_of(strip_parens(value)).split())
        neutral = is_zero_literal(source, value) if op == "sum" else text in _IDENTITIES[op]
        if not neutral:
            return None
    return test.child_by_field_name("right")
