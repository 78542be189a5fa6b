"""Reduction helpers of the row layouts: the float warp and block reductions a spread emits
(every thread gets the result) and their deletion, and the recognition of an expert's own
warp and block reduction functions, whatever they are called."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._reductions_exchange import exchange_steps, shuffle_steps
from klineage.mechanisms._reductions_util import (
    builtin_uses,
    cached,
    call_name,
    inside,
    named_statements,
    plain_type,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    SYNC_CALLS,
    WARP_INTRINSICS,
    Group,
    NotCanonical,
    single_init,
)

_COMBINE: dict[str, str] = {
    "sum": "v += __shfl_xor_sync(0xffffffffu, v, offset);",
    "max": "v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));",
    "min": "v = fminf(v, __shfl_xor_sync(0xffffffffu, v, offset));",
}


_IDENTITY: dict[str, str] = {
    "sum": "0.0f",
    "max": "__int_as_float(0xff800000)",  # -inf, without needing math.h
    "min": "__int_as_float(0x7f800000)",  # +inf
}


HELPERS: tuple[str, ...] = tuple(
    f"{group}_reduce_{op}" for group in ("warp", "block") for op in ("sum", "max", "min")
)


def helper_text(name: str) -> str:
    """The source of one emitted helper (``warp_reduce_max``...), with its comment line and a
    blank line after it."""
    group, _, op = name.split("_")
    if group == "warp":
        return (
            f"// The {op} of v over the warp; every lane gets it.\n"
            f"__device__ __forceinline__ float warp_reduce_{op}(float v) {{\n"
            f"  for (int offset = 16; offset > 0; offset >>= 1) {_COMBINE[op]}\n"
            "  return v;\n"
            "}\n\n"
        )
    return (
        f"// The {op} of v over the block (a multiple of 32 threads); every thread gets it.\n"
        f"__device__ __forceinline__ float block_reduce_{op}(float v) {{\n"
        "  __shared__ float partial[32];\n"
        "  const int lane = threadIdx.x & 31;\n"
        "  const int warp = threadIdx.x >> 5;\n"
        f"  v = warp_reduce_{op}(v);\n"
        "  if (lane == 0) partial[warp] = v;\n"
        "  __syncthreads();\n"
        f"  v = lane < (int)(blockDim.x >> 5) ? partial[lane] : {_IDENTITY[op]};\n"
        f"  v = warp_reduce_{op}(v);\n"
        "  __syncthreads();  // partial is reused by the next reduction\n"
        "  return v;\n"
        "}\n\n"
    )


def _helpers_needed(group: Group, ops: list[str]) -> list[str]:
    names = [f"warp_reduce_{op}" for op in ops]
    if group == "block":
        names += [f"block_reduce_{op}" for op in ops]
    return list(dict.fromkeys(names))


def _insertion_point(source: ParsedSource, kernel: Function) -> int:
    """Where helpers go: before the kernel and the comment lines directly above it."""
    start = kernel.outer.start_byte
    node = kernel.outer.prev_sibling
    while node is not None and node.type == "comment":
        if source.line_of(node.end_byte - 1) + 1 < source.line_of(start):
            break
        start = node.start_byte
        node = node.prev_sibling
    return source.line_start(start)


def helper_insertions(
    source: ParsedSource, kernel: Function, group: Group, ops: list[str]
) -> list[Edit]:
    """Insert the helpers a rewrite calls that the file does not define yet."""
    text = ""
    for name in _helpers_needed(group, ops):
        existing = source.function(name)
        if existing is None:
            text += helper_text(name)
        elif helper_text(name).encode() not in source.data:
            raise NotCanonical(f"the file defines its own {name}; it is not klineage's helper")
    return [Edit.insert(_insertion_point(source, kernel), text)] if text else []


def helper_deletions(source: ParsedSource, removed: list[tuple[int, int]]) -> list[Edit]:
    """Delete emitted helpers nothing calls once the ``removed`` byte ranges are gone."""
    spans: dict[str, tuple[int, int]] = {}
    for name in HELPERS:
        text = helper_text(name).encode()
        at = source.data.find(text)
        if at >= 0 and source.function(name) is not None:
            spans[name] = (at, at + len(text))
    if not spans:
        return []
    gone = list(removed)
    deleted: list[str] = []
    changed = True
    while changed:
        changed = False
        for name, span in spans.items():
            if name in deleted:
                continue
            calls = [
                c
                for c in source.calls_named(name)
                if not any(a <= c.node.start_byte and c.node.end_byte <= b for a, b in gone)
            ]
            if not calls:
                deleted.append(name)
                gone.append(span)
                changed = True
    return [Edit(*spans[name], "") for name in deleted]


def _value_function(source: ParsedSource, function: Function) -> bool:
    """A device function ``T f(T v, ...)``: the shape of a reduction helper."""
    if function.is_kernel or not function.runs_on_device or not function.params:
        return False
    first = function.params[0]
    return_type = function.node.child_by_field_name("type")
    return (
        not first.is_pointer
        and "&" not in first.type
        and return_type is not None
        and plain_type(source.text_of(return_type)) == plain_type(first.type)
    )


def _returns(source: ParsedSource, function: Function) -> list[Node]:
    """The returned expressions of a function."""
    assert function.body is not None
    found = []
    for node in inside(source, function.body, "return_statement"):
        if node.named_children:
            found.append(node.named_children[0])
    return found


def _returns_loop_result(source: ParsedSource, function: Function, loops: list[Node]) -> bool:
    """Whether every return gives back a variable the reduction loops assign (``return v;``
    after ``v += shfl(v)``, not ``return v / 32;``)."""
    assigned = set()
    for loop in loops:
        for node in inside(source, loop, "assignment_expression"):
            left = node.child_by_field_name("left")
            if left is not None and left.type == "identifier":
                assigned.add(source.text_of(left))
    returns = _returns(source, function)
    return bool(returns) and all(
        strip_parens(r).type == "identifier" and source.text_of(strip_parens(r)) in assigned
        for r in returns
    )


def _is_warp_call(source: ParsedSource, node: Node, warp: set[str]) -> bool:
    """``w(x)`` or ``c ? w1(x) : w2(x)`` with warp-reduction helpers."""
    node = strip_parens(node)
    if node.type == "conditional_expression":
        branches = [node.child_by_field_name(f) for f in ("consequence", "alternative")]
        return all(b is not None and _is_warp_call(source, b, warp) for b in branches)
    return node.type == "call_expression" and call_name(source, node) in warp


def _returns_warp_result(source: ParsedSource, function: Function, warp: set[str]) -> bool:
    """Whether every return gives back a warp reduction's result: ``return warp_sum(v);``,
    or ``return r;`` where the last top-level write of ``r`` is ``r = warp_sum(...)``."""
    assert function.body is not None
    statements = named_statements(function.body)
    for returned in _returns(source, function):
        returned = strip_parens(returned)
        if _is_warp_call(source, returned, warp):
            continue
        if returned.type != "identifier":
            return False
        name = source.text_of(returned)
        last: Node | None = None
        for statement in statements:
            if statement.start_byte >= returned.start_byte:
                break
            for node in inside(source, statement, "assignment_expression"):
                left = node.child_by_field_name("left")
                if left is not None and source.text_of(left) == name:
                    last = node.child_by_field_name("right")
            declared = single_init(source, statement)
            if declared is not None and declared[0] == name:
                last = declared[1]
        if last is None or not _is_warp_call(source, last, warp):
            return False
    return bool(_returns(source, function))


def warp_reduce_functions(source: ParsedSource) -> set[str]:
    """Device functions ``T f(T v)`` that reduce over a warp with xor/down shuffles (or the
    shared-memory exchange of :mod:`._reductions_exchange`), with no block barrier, returning
    the reduced variable itself."""
    return set(cached(source, "warp_reducers", lambda: frozenset(_warp_reducers(source))))


def _warp_reducers(source: ParsedSource) -> set[str]:
    found: set[str] = set()
    steps = [s for s in shuffle_steps(source) if s.kinds <= {"xor", "down"}]
    exchanges = [s for s in exchange_steps(source) if s.kinds <= {"xor", "down"}]
    for function in source.functions:
        if not _value_function(source, function) or _calls_any(source, function, SYNC_CALLS):
            continue
        loops = [s.node for s in [*steps, *exchanges] if s.function.node == function.node]
        if loops and _returns_loop_result(source, function, loops):
            found.add(function.name)
    return found


def block_reduce_functions(source: ParsedSource) -> set[str]:
    """Device functions ``T f(T v, ...)`` that reduce over a block: a ``__syncthreads()``, and
    every return gives back the result of a warp-reduction helper."""
    return set(cached(source, "block_reducers", lambda: frozenset(_block_reducers(source))))


def _block_reducers(source: ParsedSource) -> set[str]:
    warp = warp_reduce_functions(source)
    found: set[str] = set()
    for function in source.functions:
        if not _value_function(source, function) or function.name in warp:
            continue
        if not _calls_any(source, function, SYNC_CALLS):
            continue
        bound = warp | _warp_template_params(source, function, warp)
        if _returns_warp_result(source, function, bound):
            found.add(function.name)
    return found


def _warp_template_params(source: ParsedSource, function: Function, warp: set[str]) -> set[str]:
    """The template parameters of ``function`` that stand for a warp reduction: every call
    that names one (``block_reduce<warp_max>(v)``) passes a warp-reduction helper there, or
    forwards a template parameter of its own caller (an overload with default arguments)."""
    bound = set()
    calls = analysis(source).call_graph.call_sites(function.name)
    for position, name in enumerate(function.template_params):
        passed = []
        for caller, call in calls:
            arguments = _template_arguments(source, call)
            if arguments is None or position >= len(arguments):
                passed = []
                break
            definition = source.function(caller)
            if definition is None or arguments[position] not in definition.template_params:
                passed.append(arguments[position])
        if passed and all(argument in warp for argument in passed):
            bound.add(name)
    return bound


def _template_arguments(source: ParsedSource, call: Node) -> list[str] | None:
    """The template arguments of ``f<a, b>(...)`` as written; None without any."""
    callee = call.child_by_field_name("function")
    if callee is None or callee.type != "template_function":
        return None
    arguments = callee.child_by_field_name("arguments")
    return [source.text_of(a) for a in arguments.named_children] if arguments else None


def _calls_any(source: ParsedSource, function: Function, names: frozenset[str]) -> bool:
    if function.body is None:
        return False
    return any(
        call_name(source, n) in names for n in inside(source, function.body, "call_expression")
    )


def layout_bound(source: ParsedSource, function: Function) -> str | None:
    """Why a function depends on the thread layout (built-ins, barriers, shuffles, shared
    memory), or None."""
    if function.body is None:
        return None
    uses = builtin_uses(source, function.body)
    if uses:
        return f"uses {source.text_of(uses[0])} (line {source.line_of(uses[0].start_byte)})"
    for node in inside(source, function.body, "call_expression"):
        name = call_name(source, node)
        if name in SYNC_CALLS or name in WARP_INTRINSICS:
            return f"calls {name} (line {source.line_of(node.start_byte)})"
    for declaration in source.shared_declarations:
        if within(declaration.node, function.body):
            return f"declares __shared__ {', '.join(declaration.names)}"
    return None
