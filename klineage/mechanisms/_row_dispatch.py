"""Holding a row in registers when its length is at most a compile-time bound.

A naive kernel reads its row again in every pass, with the row length known only at run time,
so no register array can hold it. Where the passes are loops with one header (``for (T c =
S; c < N; c += STEP)``, ``S`` never negative, ``STEP`` a constant or a block dimension (the
block-strided passes block per row writes), ``N`` the same for every thread), rows with
``N <= K * STEP`` take at most ``K`` turns per thread; for them the kernel
loads the row once into ``float row[K]`` and runs the passes on it, and longer rows run the
passes as they were::

    if (n <= 32 * 32) {
      float in_row[32];
    #pragma unroll
      for (int c_reg = 0; c_reg < 32; ++c_reg) {
        const int64_t c = lane + (int64_t)c_reg * 32;
        if (c < n) in_row[c_reg] = in[c];
      }
      (each pass, fully unrolled over c_reg, guarded by c < n, reading in_row[c_reg])
    } else {
      (the passes as they were)
    }

Why it is the same program: every pass runs the same turns in the same order (turn ``i`` is
``c = S + i * STEP``, skipped past ``N``), and each read ``in[c]`` gets the value the load
read, because nothing in the passes (or between them) stores into the row's memory (other
parameters' memory is taken to be distinct, as the removal takes it) and the first pass read
every element on every turn. ``N`` is the same for every thread, so a warp never splits
between the branches (the passes may hold shuffles), nor does a block when ``STEP`` is a block
dimension (the passes may hold barriers).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import MULTIPLICATIVE, operand
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    BUILTINS,
    NotInForm,
    assigned_names,
    builtin_of,
    declared_names,
    fresh_name,
    integer_literal,
    operator_of,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import (
    element_of,
    expr_type,
    is_pure_call,
    memory_accesses_in,
    names_in_function,
    shift,
    splice,
    strip_casts,
    unshift,
)
from klineage.mechanisms._vector_loops import scalar_loop

__all__ = ["DEFAULT_ELEMENTS", "RowPasses", "row_passes", "row_passes_text"]

DEFAULT_ELEMENTS = 32
"""Row elements a thread holds when the carrier does not say (32 registers)."""

_NEEDED = (
    "two or more loops `for (T c = S; c < N; c += STEP)` with one header in one block, S never "
    "negative, STEP a constant or a block dimension, N the same for every thread, each reading "
    "`p[c]`, the first on "
    "every turn, and nothing storing into p's memory"
)
_CONDITIONAL = (
    "if_statement",
    "conditional_expression",
    "switch_statement",
    "for_statement",
    "while_statement",
    "do_statement",
)
ADDITIVE = MULTIPLICATIVE - 1
"""The precedence of ``+``: a start joined by ``+`` keeps its own parentheses when lower."""
_BLOCK_DIMENSIONS = ("blockDim.x", "blockDim.y", "blockDim.z")
_COLLECTIVES = ("__shfl", "__ballot", "__any_sync", "__all_sync", "__activemask", "__syncwarp")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class RowPasses:
    """Loops of one block, one header, reading one row."""

    function: Function
    loops: tuple[Node, ...]
    region: tuple[Node, ...]
    """The statements from the first loop to the last."""
    var: str
    type: str
    start: Node
    bound: Node
    step: int | str
    """Elements between a thread's turns: a constant, or a block dimension (``blockDim.x``)."""
    pointer: str
    held: str
    """The held element's type: ``float`` for a converted row, else the element type."""
    conversion: str | None
    """``__bfloat162float`` when every read converts, else None."""


def _header(source: ParsedSource, node: Node) -> tuple[str, str, str, int | str] | None:
    """(var, start, bound, step) texts of a counted loop, or None. The step is a positive
    constant or a block dimension (the same for every thread of a block, and at least 1)."""
    loop = scalar_loop(source, node)
    if loop is None:
        return None
    step: int | str | None = 1 if loop.step is None else integer_literal(source.text_of(loop.step))
    if step is None:
        step = analysis(source).constants.get(source.text_of(loop.step or node))
    if step is None and loop.step is not None:
        dimension = builtin_of(source, strip_casts(strip_parens(loop.step)))
        step = dimension if dimension in _BLOCK_DIMENSIONS else None
    if step is None or (isinstance(step, int) and step <= 0):
        return None
    start = " ".join(source.text_of(loop.start).split())
    return loop.var, start, " ".join(source.text_of(loop.bound).split()), step


def _reads(source: ParsedSource, loop: Node, var: str) -> dict[str, list[Node]]:
    """Pointer -> its reads ``p[c]`` in the loop's body."""
    body = loop.child_by_field_name("body")
    found: dict[str, list[Node]] = {}
    for node in walk(body) if body is not None else []:
        if node.type != "subscript_expression":
            continue
        pointer = node.child_by_field_name("argument")
        index = node.child_by_field_name("index")
        if index is None:
            indices = node.child_by_field_name("indices")
            index = indices.named_children[0] if indices and indices.named_children else None
        if pointer is None or index is None or pointer.type != "identifier":
            continue
        if strip_parens(index).type == "identifier" and source.text_of(index).strip() == var:
            found.setdefault(source.text_of(pointer), []).append(node)
    return found


def _never_negative(source: ParsedSource, node: Node) -> bool:
    node = strip_casts(strip_parens(node))
    value = integer_literal(source.text_of(node))
    if value is not None:
        return True
    if builtin_of(source, node) is not None:
        return source.text_of(node).split(".")[0] in BUILTINS and "Idx" in source.text_of(node)
    if node.type == "binary_expression" and operator_of(node) in ("&", "%", "+", "*", ">>", "/"):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        return (
            left is not None
            and right is not None
            and _never_negative(source, left)
            and _never_negative(source, right)
        )
    return False


def row_passes(source: ParsedSource) -> Iterator[tuple[Node, RowPasses | NotInForm]]:
    """Per block, the first loop of every run of same-header loops reading one pointer."""
    for function in source.functions:
        if not function.runs_on_device or function.body is None:
            continue
        for block in source.iter_nodes("compound_statement", within=function.body):
            body = statements(block)
            headers = {id(n): _header(source, n) for n in body if n.type == "for_statement"}
            seen: set[tuple[str, str, str, int | str]] = set()
            for node in body:
                header = headers.get(id(node))
                if header is None or header in seen:
                    continue
                seen.add(header)
                loops = [n for n in body if headers.get(id(n)) == header]
                shared = set(_reads(source, loops[0], header[0]))
                for other in loops[1:]:
                    shared &= set(_reads(source, other, header[0]))
                if len(loops) < 2 or not shared:
                    continue
                try:
                    yield node, _passes(source, function, body, loops, sorted(shared)[0])
                except NotInForm as why:
                    yield node, why


def _passes(
    source: ParsedSource, function: Function, body: list[Node], loops: list[Node], pointer: str
) -> RowPasses:
    first = scalar_loop(source, loops[0])
    assert first is not None
    header = _header(source, loops[0])
    assert header is not None
    var, _, _, step = header
    line = source.line_of(loops[0].start_byte)
    region = tuple(body[body.index(loops[0]) : body.index(loops[-1]) + 1])
    for loop in loops:
        if source.pragma_before(loop) is not None:
            raise _refuse(f"a pass under a #pragma (line {source.line_of(loop.start_byte)})")
        if not source.starts_line(loop.start_byte):
            raise _refuse(f"a pass that does not start its line (line {line})")
    if not _never_negative(source, first.start):
        raise _refuse(f"passes starting at {source.text_of(first.start)!r}, maybe negative")
    written = assigned_names(source, region)
    for part in (first.start, first.bound):
        used = {source.text_of(n) for n in walk(part) if n.type == "identifier"}
        if used & (written | {pointer}):
            raise _refuse(f"passes whose header {source.text_of(part)!r} the passes change")
    if pointer in written:
        raise _refuse(f"passes that change {pointer}")
    indices = analysis(source).indices(function)
    if not indices.is_uniform(indices.form(first.bound)):
        raise _refuse(
            f"passes bounded by {source.text_of(first.bound)!r}, which differs between threads"
        )
    element = element_of(
        expr_type(source, function, _pointer_node(source, loops[0], pointer)) or ""
    )
    if not element:
        raise _refuse(f"a row {pointer} whose element type is unknown")
    reads = [r for loop in loops for r in _reads(source, loop, var)[pointer]]
    for loop in loops:
        loop_body = loop.child_by_field_name("body")
        assert loop_body is not None
        if var in assigned_names(source, loop_body):
            raise _refuse(f"a pass changing {var} (line {source.line_of(loop.start_byte)})")
        uses = [
            n for n in walk(loop_body) if n.type == "identifier" and source.text_of(n) == pointer
        ]
        if len(uses) != len(_reads(source, loop, var)[pointer]):
            raise _refuse(f"a pass using {pointer} other than as {pointer}[{var}]")
    for read in reads:
        parent = read.parent
        if (
            parent is not None
            and parent.type == "assignment_expression"
            and parent.child_by_field_name("left") == read
        ):
            raise _refuse(f"a pass storing into {pointer}[{var}]")
    if not any(
        _unconditional(r, loops[0].child_by_field_name("body"))
        for r in _reads(source, loops[0], var)[pointer]
    ):
        raise _refuse(f"a first pass that reads {pointer}[{var}] only on some turns")
    for node in (n for s in region for n in walk(s) if n.type == "call_expression"):
        callee = node.child_by_field_name("function")
        name = source.text_of(callee) if callee is not None else ""
        if not (
            is_pure_call(source, node) or name.startswith(_COLLECTIVES) or source.function(name)
        ):
            raise _refuse(f"passes calling {name or '?'}, whose effects are unknown")
    accesses = memory_accesses_in(source, function, region[0].start_byte, region[-1].end_byte)
    if accesses.unplaced is not None:
        raise _refuse(f"a store through {source.snippet(accesses.unplaced, 30)}, memory unknown")
    row_buffers = accesses.loads_within(reads)
    clash = set(accesses.stores.values()) & row_buffers
    if clash or not row_buffers:
        raise _refuse(
            f"passes storing into {', '.join(sorted(clash)) or pointer}, the row's memory"
        )
    after = body[body.index(loops[-1]) + 1 :]
    used_after = {source.text_of(n) for s in after for n in walk(s) if n.type == "identifier"}
    leaking = declared_names(source, region) & used_after
    if leaking:
        raise _refuse(f"passes declaring {', '.join(sorted(leaking))}, used after them")
    conversions = {_conversion(source, r) for r in reads}
    conversion = conversions.pop() if len(conversions) == 1 else None
    return RowPasses(
        function,
        tuple(loops),
        region,
        var,
        first.type,
        first.start,
        first.bound,
        step,
        pointer,
        "float" if conversion else element,
        conversion,
    )


def _pointer_node(source: ParsedSource, loop: Node, pointer: str) -> Node:
    return next(n for n in walk(loop) if n.type == "identifier" and source.text_of(n) == pointer)


def _conversion(source: ParsedSource, read: Node) -> str | None:
    """``__bfloat162float`` of ``__bfloat162float(p[c])``."""
    parent = read.parent
    if parent is not None and parent.type == "argument_list" and len(parent.named_children) == 1:
        call = parent.parent
        callee = call.child_by_field_name("function") if call is not None else None
        name = source.text_of(callee) if callee is not None else ""
        if name in ("__half2float", "__bfloat162float"):
            return name
    return None


def _unconditional(node: Node, body: Node | None) -> bool:
    current = node.parent
    while current is not None:
        if current.type in _CONDITIONAL:
            return False
        if current.type == "binary_expression" and operator_of(current) in ("&&", "||"):
            return False
        if current == body:
            return True
        current = current.parent
    return False


# ---------------------------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------------------------


def _moved(text: str, delta: int) -> str:
    moved = shift(text, delta) if delta >= 0 else unshift(text, -delta)
    return moved if moved is not None else text


def _register_loop(
    source: ParsedSource,
    passes: RowPasses,
    loop: Node,
    names: tuple[str, str],
    k: int,
    indent: str,
) -> str:
    array, turn = names
    body = loop.child_by_field_name("body")
    assert body is not None
    inner = statements(body) if body.type == "compound_statement" else [body]
    reps = []
    for read in _reads(source, loop, passes.var)[passes.pointer]:
        node = read.parent.parent if passes.conversion else read
        assert node is not None
        reps.append((node, f"{array}[{turn}]"))
    text = splice(source, inner[0].start_byte, inner[-1].end_byte, reps)
    original = (
        source.indent_of(inner[0].start_byte)
        if source.starts_line(inner[0].start_byte)
        else source.indent_of(loop.start_byte) + "  "
    )
    text = _moved(text, len(indent) + 4 - len(original))
    return "\n".join(
        [
            "#pragma unroll",
            f"{indent}for (int {turn} = 0; {turn} < {k}; ++{turn}) {{",
            f"{indent}  const {passes.type} {passes.var} = {_turn_index(source, passes, turn)};",
            f"{indent}  if ({passes.var} < {source.text_of(passes.bound)}) {{",
            f"{indent}    {text}",
            f"{indent}  }}",
            f"{indent}}}",
        ]
    )


def _turn_index(source: ParsedSource, passes: RowPasses, turn: str) -> str:
    scaled = f"({passes.type}){turn}" + (f" * {passes.step}" if passes.step != 1 else "")
    if source.text_of(passes.start) == "0":
        return scaled
    return f"{operand(source, passes.start, ADDITIVE)} + {scaled}"


def row_passes_text(source: ParsedSource, passes: RowPasses, k: int) -> str:
    """The dispatch replacing the passes' region."""
    taken = names_in_function(source, passes.function)
    array = fresh_name(taken, f"{passes.pointer}_row")
    turn = fresh_name(taken | {array}, f"{passes.var}_reg")
    indent = source.indent_of(passes.region[0].start_byte)
    inner = indent + "  "
    first, last = passes.region[0], passes.region[-1]
    original = _moved(source.text_of((first.start_byte, last.end_byte)), 2)
    reps = []
    for loop in passes.loops:
        reps.append((loop, _register_loop(source, passes, loop, (array, turn), k, indent)))
    registered = _moved(splice(source, first.start_byte, last.end_byte, reps), 2)
    read = f"{passes.pointer}[{passes.var}]"
    value = f"{passes.conversion}({read})" if passes.conversion else read
    limit = f"{k} * {passes.step}" if passes.step != 1 else str(k)
    bound = source.text_of(passes.bound)
    return "\n".join(
        [
            f"if ({bound} <= {limit}) {{",
            f"{inner}{passes.held} {array}[{k}];",
            f"{inner}#pragma unroll",
            f"{inner}for (int {turn} = 0; {turn} < {k}; ++{turn}) {{",
            f"{inner}  const {passes.type} {passes.var} = {_turn_index(source, passes, turn)};",
            f"{inner}  if ({passes.var} < {bound}) {array}[{turn}] = {value};",
            f"{inner}}}",
            f"{inner}{registered}",
            f"{indent}}} else {{",
            f"{inner}{original}",
            f"{indent}}}",
        ]
    )
