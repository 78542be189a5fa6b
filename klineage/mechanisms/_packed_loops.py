"""Pairing a row loop's half-precision reads: ``p[c]`` and ``p[c + 1]`` read as one
``__half2`` (``__nv_bfloat162``) and converted to a ``float2`` at once.

Naive kernels walk a row one element a turn, converting each to float::

    for (int64_t c = 0; c < n; ++c) acc += __bfloat162float(p[c]);

The paired form runs the body twice a turn, on a pair read and converted at once, while the
pair is aligned and complete; the original loop does the rest::

    int64_t c_pair = 0;
    if (reinterpret_cast<size_t>(p + c_pair) % 4 == 0) {
      for (; c_pair + 1 < n; c_pair += 2) {
        const float2 p_pair =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + c_pair));
        acc += p_pair.x;
        acc += p_pair.y;
      }
    }
    for (int64_t c = c_pair; c < n; ++c) acc += __bfloat162float(p[c]);

Why it is the same program, and what the form asks for that:

- the body runs for ``c`` then ``c + 1`` as before, each paired read replaced by the same
  element converted the same way (the paired conversion is exact, as the scalar one is), so
  every float operation is the one it was, in the same order;
- a pair is read only where the loop read both elements: ``c + 1 < n``, and each paired read
  is evaluated on every turn (not under ``if``, ``?:``, ``&&``, ``||`` or a nested loop);
- both elements are read before the body runs for the first of them, so the body may not
  store into the memory a paired read comes from (stores through *another* parameter's
  memory are allowed: parameters are taken to be distinct buffers, as the other rules that
  move reads across stores take them), call anything with unknown effects, or leave the
  turn early (``break``, ``continue``, ``return``, ``goto``);
- the ``__half2`` load needs a 4-byte address: checked when the thread gets there; an
  unaligned row runs the original loop from the start;
- ``c`` is declared by the loop and changed only by its update (``++c``), and the start, the
  bound and the paired pointers are not changed by the body.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    declared_names,
    fresh_name,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import (
    element_of,
    expr_type,
    is_pure_call,
    is_side_effect_free,
    loop_bound_jumps,
    memory_accesses_in,
    names_in_function,
    shift,
    splice,
    unshift,
)
from klineage.mechanisms._vector_loops import scalar_loop

__all__ = ["PairedLoop", "paired_loop_text", "paired_loops"]

_NEEDED = (
    "a loop `for (T c = S; c < N; ++c)` whose body reads `__half2float(p[c])` or "
    "`__bfloat162float(p[c])` on every turn and stores nowhere those reads come from"
)

SCALAR_TO_FLOAT = {"__half2float": "half", "__bfloat162float": "bf16"}
"""The one-element conversions a paired read replaces, and the precision each reads."""
ELEMENTS = {"__half": "half", "half": "half", "__nv_bfloat16": "bf16", "nv_bfloat16": "bf16"}
PAIR_TYPE = {"half": "__half2", "bf16": "__nv_bfloat162"}
PAIR_TO_FLOAT2 = {"half": "__half22float2", "bf16": "__bfloat1622float2"}
LINE_LIMIT = 100
"""A load line longer than this breaks after its ``=``."""
_CONDITIONAL = (
    "if_statement",
    "conditional_expression",
    "switch_statement",
    "for_statement",
    "for_range_loop",
    "while_statement",
    "do_statement",
    "lambda_expression",
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class PairedLoop:
    """A loop whose half-precision reads ``p[c]`` can be paired."""

    function: Function
    node: Node
    var: str
    type: str
    start: Node
    bound: Node
    body: Node
    reads: dict[str, list[Node]]
    """Pointer -> the conversion calls ``__half2float(p[c])`` reading it."""
    precision: dict[str, str]
    """Pointer -> ``half`` or ``bf16``."""


def _read_of(source: ParsedSource, call: Node, var: str) -> tuple[str, str] | None:
    """(pointer, precision) of ``__half2float(p[c])`` with ``c`` the loop variable."""
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    if callee is None or arguments is None:
        return None
    precision = SCALAR_TO_FLOAT.get(source.text_of(callee))
    args = arguments.named_children
    if precision is None or len(args) != 1:
        return None
    element = strip_parens(args[0])
    if element.type != "subscript_expression":
        return None
    pointer = element.child_by_field_name("argument")
    index = element.child_by_field_name("index")
    if index is None:
        indices = element.child_by_field_name("indices")
        index = indices.named_children[0] if indices and len(indices.named_children) == 1 else None
    if pointer is None or index is None or pointer.type != "identifier":
        return None
    index = strip_parens(index)
    if index.type != "identifier" or source.text_of(index) != var:
        return None
    return source.text_of(pointer), precision


def _conditional(node: Node, body: Node) -> Node | None:
    """The ``if``, ``?:``, short-circuit or loop between ``body`` (itself included) and
    ``node``, if any."""
    current = node.parent
    while current is not None:
        if current.type in _CONDITIONAL:
            return current
        if current.type == "binary_expression" and any(
            c.type in ("&&", "||") for c in current.children
        ):
            return current
        if current == body:
            return None
        current = current.parent
    return None


def _candidate_loops(source: ParsedSource) -> Iterator[tuple[Function, Node]]:
    """Loops in device code that read a half-precision element at the loop variable."""
    for function in source.functions:
        if not function.runs_on_device or function.body is None:
            continue
        for node in source.iter_nodes("for_statement", within=function.body):
            loop = scalar_loop(source, node)
            if loop is None or _is_tail(source, node, loop.start):
                continue
            if any(
                _read_of(source, call, loop.var) is not None
                for call in walk(loop.body)
                if call.type == "call_expression"
            ):
                yield function, node


def _is_tail(source: ParsedSource, node: Node, start: Node) -> bool:
    """Whether ``node`` finishes a row a paired loop began: its start is the ``c_pair`` the
    ``if`` right before it stepped by two."""
    previous = node.prev_named_sibling
    while previous is not None and previous.type == "comment":
        previous = previous.prev_named_sibling
    if previous is None or previous.type != "if_statement" or start.type != "identifier":
        return False
    step = f"{source.text_of(start)} += 2"
    return any(
        n.type == "for_statement"
        and n.child_by_field_name("initializer") is None
        and " ".join(source.text_of(n.child_by_field_name("update") or n).split()) == step
        for n in walk(previous)
    )


def paired_loops(source: ParsedSource) -> Iterator[tuple[Node, PairedLoop | NotInForm]]:
    """Every loop reading ``__half2float(p[c])``-style elements: the form, or why not."""
    for function, node in _candidate_loops(source):
        try:
            yield node, _paired_loop(source, function, node)
        except NotInForm as why:
            yield node, why


def _paired_loop(source: ParsedSource, function: Function, node: Node) -> PairedLoop:
    loop = scalar_loop(source, node)
    assert loop is not None
    line = source.line_of(node.start_byte)
    if loop.step is not None:
        raise _refuse(f"a loop stepping by {source.text_of(loop.step)} (line {line})")
    if node.parent is None or node.parent.type != "compound_statement":
        raise _refuse(f"a loop that is not a statement of a block (line {line})")
    if not source.starts_line(node.start_byte):
        raise _refuse(f"a loop that does not start its line (line {line})")
    if source.pragma_before(node) is not None:
        raise _refuse(f"a loop under a #pragma, which would bind to the paired loop (line {line})")
    body = loop.body
    written = assigned_names(source, body)
    if loop.var in written:
        raise _refuse(f"a loop whose body changes {loop.var} (line {line})")
    for part, what in ((loop.start, "start"), (loop.bound, "bound")):
        used = {source.text_of(n) for n in walk(part) if n.type == "identifier"}
        if not is_side_effect_free(source, part) or used & (written | {loop.var}):
            raise _refuse(f"a loop whose {what} {source.text_of(part)!r} the body may change")
    jumps = loop_bound_jumps(
        body, ("break_statement", "continue_statement", "return_statement", "goto_statement")
    )
    if body.type in ("break_statement", "continue_statement", "return_statement"):
        jumps.append(body)
    if jumps:
        raise _refuse(f"a loop whose body leaves a turn early ({source.snippet(jumps[0], 30)})")
    for call in (n for n in walk(body) if n.type == "call_expression"):
        if not is_pure_call(source, call):
            raise _refuse(f"a loop calling {source.snippet(call, 40)}, whose effects are unknown")
    if any(n.type == "reference_declarator" or "asm" in n.type for n in walk(body)):
        raise _refuse(
            f"a loop whose body declares a reference or holds inline assembly (line {line})"
        )

    reads: dict[str, list[Node]] = {}
    precision: dict[str, str] = {}
    refusals: list[str] = []
    for call in (n for n in walk(body) if n.type == "call_expression"):
        found = _read_of(source, call, loop.var)
        if found is None:
            continue
        pointer, kind = found
        element = ELEMENTS.get(
            element_of(expr_type(source, function, _identifier(source, call)) or "") or ""
        )
        if element != kind:
            refusals.append(f"{pointer}, whose element type is not the {kind} the call reads")
        elif pointer in written:
            refusals.append(f"{pointer}, which the body changes")
        elif (guard := _conditional(call, body)) is not None:
            refusals.append(
                f"{source.text_of(call)}, read only when {source.snippet(guard, 40)} says so"
            )
        else:
            reads.setdefault(pointer, []).append(call)
            precision[pointer] = kind
    others = _other_uses(source, body, reads)
    for pointer in others:
        reads.pop(pointer, None)
        refusals.append(f"{pointer}, which the body also uses otherwise")
    if not reads:
        raise _refuse(f"a loop (line {line}) whose reads cannot be paired: {refusals[0]}")
    _check_stores(source, function, body, reads, line)
    return PairedLoop(
        function, node, loop.var, loop.type, loop.start, loop.bound, body, reads, precision
    )


def _identifier(source: ParsedSource, call: Node) -> Node:
    """``p`` of ``__half2float(p[c])``."""
    arguments = call.child_by_field_name("arguments")
    assert arguments is not None
    pointer = strip_parens(arguments.named_children[0]).child_by_field_name("argument")
    assert pointer is not None
    return pointer


def _other_uses(source: ParsedSource, body: Node, reads: dict[str, list[Node]]) -> set[str]:
    """Paired pointers the body also names outside their paired reads."""
    inside = {
        (n.start_byte, n.end_byte) for calls in reads.values() for c in calls for n in walk(c)
    }
    return {
        source.text_of(n)
        for n in walk(body)
        if n.type == "identifier"
        and source.text_of(n) in reads
        and (n.start_byte, n.end_byte) not in inside
    }


def _check_stores(
    source: ParsedSource, function: Function, body: Node, reads: dict[str, list[Node]], line: int
) -> None:
    """NotInForm when the body stores where a paired read comes from, or where the index
    analysis cannot tell."""
    accesses = memory_accesses_in(source, function, body.start_byte, body.end_byte)
    if accesses.unplaced is not None:
        raise _refuse(
            f"a loop storing through {source.snippet(accesses.unplaced, 30)} (line {line}), "
            "memory the index analysis cannot place"
        )
    paired = accesses.loads_within(c for found in reads.values() for c in found)
    clash = set(accesses.stores.values()) & paired
    if clash:
        raise _refuse(
            f"a loop (line {line}) storing into {', '.join(sorted(clash))}, the memory a paired "
            "read comes from: the pair would be read before that store"
        )


# ---------------------------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------------------------


def _copy(
    source: ParsedSource,
    loop: PairedLoop,
    names: dict[str, str],
    field: str,
    indent: str,
    pair_var: str,
) -> str:
    """The body for one element of the pair, at ``indent``."""
    body = loop.body
    inner = statements(body) if body.type == "compound_statement" else [body]
    replaced = [c for calls in loop.reads.values() for c in calls]
    reps = [(c, f"{names[p]}.{field}") for p, calls in loop.reads.items() for c in calls]
    text = splice(source, inner[0].start_byte, inner[-1].end_byte, reps)
    original = (
        source.indent_of(inner[0].start_byte)
        if source.starts_line(inner[0].start_byte)
        else source.indent_of(loop.node.start_byte) + "  "
    )
    uses_var = any(
        n.type == "identifier"
        and source.text_of(n) == loop.var
        and not any(c.start_byte <= n.start_byte and n.end_byte <= c.end_byte for c in replaced)
        for s in inner
        for n in walk(s)
    )
    block = uses_var or bool(declared_names(source, inner))
    inner_indent = indent + "  " if block else indent
    delta = len(inner_indent) - len(original)
    moved = shift(text, delta) if delta >= 0 else unshift(text, -delta)
    if moved is None:
        moved = text
    lines = []
    if uses_var:
        value = pair_var if field == "x" else f"{pair_var} + 1"
        lines.append(f"{inner_indent}const {loop.type} {loop.var} = {value};")
    lines.append(f"{inner_indent}{moved}")
    if block:
        return "\n".join([f"{indent}{{", *lines, f"{indent}}}"])
    return "\n".join(lines)


def paired_loop_text(source: ParsedSource, loop: PairedLoop) -> str:
    """The paired form of ``loop`` (replacing its text)."""
    taken = names_in_function(source, loop.function)
    pair_var = fresh_name(taken, f"{loop.var}_pair")
    taken.add(pair_var)
    names: dict[str, str] = {}
    for pointer in loop.reads:
        names[pointer] = fresh_name(taken, f"{pointer}_pair")
        taken.add(names[pointer])
    indent = source.indent_of(loop.node.start_byte)
    bound = source.text_of(loop.bound)
    guards = [f"reinterpret_cast<size_t>({p} + {pair_var}) % 4 == 0" for p in loop.reads]
    loads = []
    for p in loop.reads:
        precision = loop.precision[p]
        load = (
            f"{PAIR_TO_FLOAT2[precision]}("
            f"*reinterpret_cast<const {PAIR_TYPE[precision]}*>({p} + {pair_var}));"
        )
        line = f"{indent}    const float2 {names[p]} = {load}"
        if len(line) > LINE_LIMIT:
            line = f"{indent}    const float2 {names[p]} =\n{indent}        {load}"
        loads.append(line)
    tail = splice(source, loop.node.start_byte, loop.node.end_byte, [(loop.start, pair_var)])
    lines = [
        f"{loop.type} {pair_var} = {source.text_of(loop.start)};",
        f"{indent}if ({(' &&' + chr(10) + indent + '    ').join(guards)}) {{",
        f"{indent}  for (; {pair_var} + 1 < {bound}; {pair_var} += 2) {{",
        *loads,
        _copy(source, loop, names, "x", indent + "    ", pair_var),
        _copy(source, loop, names, "y", indent + "    ", pair_var),
        f"{indent}  }}",
        f"{indent}}}",
        f"{indent}{tail}",
    ]
    return "\n".join(lines)
