"""Block-private histograms in shared memory, flushed to the global histogram.

Counting with ``atomicAdd(&counts[v], 1)`` on global memory sends every increment to L2,
where increments of popular bins serialize. Privatizing the histogram per block moves them to
shared-memory atomics (a few cycles each); each block then adds its non-zero bins to the
global histogram once. The canonical form, in one kernel::

    extern __shared__ int32_t shared_counts[];        // or __shared__ T h[256];
    for (int64_t bin = threadIdx.x; bin < bins; bin += blockDim.x) shared_counts[bin] = 0;
    __syncthreads();
    [&] { ...atomicAdd(&shared_counts[v], 1);... }();  // the counting (a lambda keeps its
    __syncthreads();                                    // early returns off the barriers)
    for (int64_t bin = threadIdx.x; bin < bins; bin += blockDim.x)
      if (shared_counts[bin] != 0) atomicAdd(&counts[bin], shared_counts[bin]);

- remove: count straight into the global array: the shared declaration, the zeroing, the
  barriers and the flush go, the shared atomics target the global array, a counting lambda
  is unwrapped, and the launch's dynamic shared memory is set back to 0. Semantics are kept:
  every increment lands in the same global bin, only earlier.
- apply: the reverse, at a kernel whose only use of a global pointer parameter is as the
  target of ``atomicAdd``. The number of bins is read from a guard on the index
  (``if (v < 0 || v >= bins) return;``) or given as carrier ``bins``. A constant bin count
  gets a static ``__shared__`` array; a run-time one gets dynamic shared memory sized at
  the launch, valid while ``bins`` counters fit in 48 KiB (a condition).

Conditions: blocks must be one-dimensional (the bin loops stride by ``blockDim.x``), and the
counters must fit in the 48 KiB of shared memory a block gets without opting in, beside the
kernel's other static shared memory (``AxisAtMost(bins, 12288)`` for 4-byte counters and a
``bins`` axis). The removal takes the original's word that every counted bin lies in the
flushed range ``[0, bins)``, which a correct privatized kernel guarantees.

A shared-memory histogram that the block itself consumes (the top-k expert's radix digits,
read back by a block-wide scan) is detected and refused: moving it to global memory would
need per-block global scratch, zeroed and synchronized, that a rewrite cannot add safely.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from klineage.conditions import AxisAtMost, Condition, Prose, SharedMemoryAtMost
from klineage.cuda.cexpr import (
    PRIMARY,
    SIZEOF,
    fold_int,
    precedence,
    to_size_expr,
    without_outer_parentheses,
)
from klineage.cuda.edit import Edit
from klineage.cuda.facts import launch_names, static_shared_bytes
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._selection_util import (
    block_statements,
    call_args,
    call_name,
    dedent_lines,
    fresh_name,
    identifiers_in,
    indent_lines,
    iter_descendants,
    node_starting_at,
    normalized,
    shared_base,
    strip_parens,
    within,
)
from klineage.mechanisms.base import Carrier, Mechanism, MechanismError, Site, register
from klineage.problem import Problem

SHARED_CAPACITY = 48 * 1024
"""Bytes of shared memory a block gets without opting in (``cudaFuncSetAttribute``)."""
COUNTER_TYPES = frozenset(
    {"int", "unsigned", "unsigned int", "int32_t", "uint32_t", "unsigned long long", "float"}
)
"""Element types with a shared- and global-memory ``atomicAdd``."""
_INTEGER_PARAMS = frozenset(
    {"int", "unsigned", "unsigned int", "int32_t", "uint32_t", "int64_t", "uint64_t", "long",
     "long long", "size_t", "unsigned long", "unsigned long long"}
)  # fmt: skip
_UNSIGNED = ("unsigned", "uint", "size_t")
_NOT_1D = ("threadIdx.y", "threadIdx.z", "blockDim.y", "blockDim.z")
_EXITS = ("return_statement", "continue_statement")


class _NotCanonical(Exception):
    """The shared histogram is not the flushed canonical form; the message says why."""


# ---------------------------------------------------------------------------------------------
# Reading the privatized form
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Privatized:
    """A canonical block-private histogram in a kernel."""

    function: Function
    declaration: Node
    array: str
    zeroing: tuple[Node, ...]
    barriers: tuple[Node, Node]
    counting: tuple[Node, ...]
    """The statements between the barriers."""
    flush: Node
    target: str
    """The global histogram, e.g. ``counts``."""
    bins: str | None
    """The flush loop's bound, e.g. ``bins`` (None when the flush has none)."""
    dynamic: bool


def _is_barrier(source: ParsedSource, statement: Node) -> bool:
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    return call_name(source, statement.named_children[0]) == "__syncthreads"


def _array_declaration(source: ParsedSource, statement: Node) -> tuple[str, bool] | None:
    """``(name, dynamic)`` of ``__shared__ T h[N];`` / ``extern __shared__ T h[];``."""
    if statement.type != "declaration":
        return None
    words = {
        source.text_of(c) for c in statement.children if c.type.endswith(("qualifier", "specifier"))
    }
    type_node = statement.child_by_field_name("type")
    declarators = statement.children_by_field_name("declarator")
    if "__shared__" not in words or type_node is None or len(declarators) != 1:
        return None
    (declarator,) = declarators
    inner = declarator.child_by_field_name("declarator")
    if declarator.type != "array_declarator" or inner is None or inner.type != "identifier":
        return None
    if source.text_of(type_node) not in COUNTER_TYPES:
        return None
    return source.text_of(inner), "extern" in words


def _uses(source: ParsedSource, node: Node, name: str) -> list[Node]:
    return [i for i in iter_descendants(node, "identifier") if source.text_of(i) == name] + (
        [node] if node.type == "identifier" and source.text_of(node) == name else []
    )


def _subscript_of(use: Node) -> Node | None:
    """``h[i]`` for the identifier ``h`` in it."""
    parent = use.parent
    if parent is not None and parent.type == "subscript_expression":
        return parent if parent.child_by_field_name("argument") == use else None
    return None


def _atomic_target(source: ParsedSource, use: Node) -> Node | None:
    """The ``atomicAdd`` whose first argument is ``&use[...]`` or ``use + ...``."""
    access = _subscript_of(use)
    if access is not None:
        address = access.parent
        if address is None or address.type != "pointer_expression":
            return None
    else:
        address = use.parent
        operator = address.child_by_field_name("operator") if address is not None else None
        if address is None or address.type != "binary_expression" or operator is None:
            return None
        if operator.type != "+" or address.child_by_field_name("left") != use:
            return None
    arguments = address.parent
    call = arguments.parent if arguments is not None else None
    if call is None or call_name(source, call) != "atomicAdd":
        return None
    args = call_args(call)
    return call if args and args[0] == address else None


def _single(statement: Node | None) -> Node | None:
    """The one statement of a ``for``/``if`` body or a one-statement block."""
    inner = block_statements(statement)
    return inner[0] if len(inner) == 1 else None


def _is_zeroing(source: ParsedSource, statement: Node, array: str) -> bool:
    """``h[i] = 0;``, possibly under a ``for`` or an ``if``: the statement only clears."""
    inner: Node | None = statement
    while inner is not None and inner.type in ("for_statement", "if_statement"):
        if inner.type == "if_statement" and inner.child_by_field_name("alternative"):
            return False
        field = "body" if inner.type == "for_statement" else "consequence"
        inner = _single(inner.child_by_field_name(field))
    if inner is None or inner.type != "expression_statement" or not inner.named_children:
        return False
    assignment = inner.named_children[0]
    if assignment.type != "assignment_expression":
        return False
    left = assignment.child_by_field_name("left")
    right = assignment.child_by_field_name("right")
    if left is None or right is None or left.type != "subscript_expression":
        return False
    base = left.child_by_field_name("argument")
    return (
        base is not None
        and source.text_of(base) == array
        and normalized(source.text_of(right)) in ("0", "0u", "0U", "0.0f", "0.f")
    )


def _bound_of(source: ParsedSource, condition: Node | None, index: str) -> str | None:
    """``B`` of a loop or ``if`` condition ``index < B``."""
    if condition is not None and condition.type == "condition_clause":
        condition = condition.named_children[-1] if condition.named_children else None
    test = strip_parens(condition) if condition is not None else None
    operator = test.child_by_field_name("operator") if test is not None else None
    if test is None or operator is None or operator.type != "<":
        return None
    left, right = test.child_by_field_name("left"), test.child_by_field_name("right")
    if left is None or right is None or normalized(source.text_of(left)) != index:
        return None
    return source.text_of(right)


def _flush_atomic(source: ParsedSource, statement: Node, array: str) -> tuple[Node, list[Node]]:
    """The ``atomicAdd`` at the heart of a flush, and the ``for``/``if`` statements around it."""
    wrappers: list[Node] = []
    inner: Node | None = statement
    while inner is not None and inner.type in ("for_statement", "if_statement"):
        if inner.type == "if_statement" and inner.child_by_field_name("alternative"):
            raise _NotCanonical("the flush has an else branch")
        wrappers.append(inner)
        field = "body" if inner.type == "for_statement" else "consequence"
        inner = _single(inner.child_by_field_name(field))
    call = inner.named_children[0] if inner is not None and inner.named_children else None
    if call is None or call_name(source, call) != "atomicAdd" or len(call_args(call)) != 2:
        raise _NotCanonical(f"the shared histogram {array} is not flushed with atomicAdd")
    return call, wrappers


def _flush(source: ParsedSource, statement: Node, array: str) -> tuple[str, str | None]:
    """``(target, bins)`` of a flush ``[for (j ...; j < B; ...)] [if (h[j] != 0)]
    atomicAdd(&g[j], h[j]);`` (bins None when no ``j < B`` bounds it)."""
    call, wrappers = _flush_atomic(source, statement, array)
    destination, amount = (strip_parens(a) for a in call_args(call))
    access = destination.child_by_field_name("argument")
    access = strip_parens(access) if access is not None else None
    if (
        destination.type != "pointer_expression"
        or access is None
        or access.type != "subscript_expression"
        or _subscript_of(amount.child_by_field_name("argument") or amount) != amount
    ):
        raise _NotCanonical("the flush does not add h[j] to g[j]")
    base, indices = access.child_by_field_name("argument"), access.child_by_field_name("indices")
    source_indices = amount.child_by_field_name("indices")
    array_node = amount.child_by_field_name("argument")
    if base is None or base.type != "identifier" or indices is None or source_indices is None:
        raise _NotCanonical("the flush does not add h[j] to g[j]")
    if array_node is None or source.text_of(array_node) != array:
        raise _NotCanonical("the flush adds something else than the shared bins")
    index = normalized(source.text_of(indices))[1:-1]
    if normalized(source.text_of(source_indices))[1:-1] != index:
        raise _NotCanonical("the flush maps bin j to another global bin than j")
    allowed = {f"({array}[{index}]!=0)", f"({array}[{index}])", f"({array}[{index}]>0)"}
    bins = None
    for wrapper in wrappers:
        bound = _bound_of(source, wrapper.child_by_field_name("condition"), index)
        condition = normalized(source.text_of(wrapper.child_by_field_name("condition") or wrapper))
        if bound is not None:
            bins = bound
        elif wrapper.type == "if_statement" and condition not in allowed:
            raise _NotCanonical("the flush is guarded by something else than a bound or a count")
    return source.text_of(base), bins


def _read_privatized(source: ParsedSource, function: Function, declaration: Node) -> _Privatized:
    """The canonical form around a shared histogram declaration, or :class:`_NotCanonical`."""
    found = _array_declaration(source, declaration)
    assert found is not None and function.body is not None
    array, dynamic = found
    statements = block_statements(function.body)
    if declaration not in statements:
        raise _NotCanonical("the shared histogram is not declared at the top of the kernel")
    after = statements[statements.index(declaration) + 1 :]
    if len(after) < 4 or not _is_barrier(source, after[-2]):
        raise _NotCanonical("the kernel does not end with a barrier and the flush loop")
    cleared = [i for i, s in enumerate(after) if _is_zeroing(source, s, array)]
    if not cleared:
        raise _NotCanonical("the shared counters are not zeroed")
    first = next(
        (i for i in range(cleared[-1] + 1, len(after) - 2) if _is_barrier(source, after[i])),
        None,
    )
    if first is None:
        raise _NotCanonical("no barrier between the zeroing and the counting")
    zeroing = [s for s in after[:first] if _uses(source, s, array)]
    if not all(_is_zeroing(source, s, array) for s in zeroing):
        raise _NotCanonical("the block uses its counters before they are all zeroed")
    counting = after[first + 1 : -2]
    for statement in counting:
        for use in _uses(source, statement, array):
            if _atomic_target(source, use) is None:
                line = source.line_of(use.start_byte)
                raise _NotCanonical(f"the block reads its histogram at line {line}")
    target, bins = _flush(source, after[-1], array)
    param = function.param(target)
    if param is None or not param.is_pointer:
        raise _NotCanonical(f"the flush target {target} is not a pointer parameter")
    return _Privatized(
        function=function,
        declaration=declaration,
        array=array,
        zeroing=tuple(zeroing),
        barriers=(after[first], after[-2]),
        counting=tuple(counting),
        flush=after[-1],
        target=target,
        bins=bins,
        dynamic=dynamic,
    )


def _privatized(source: ParsedSource) -> Iterator[_Privatized | tuple[Node, str]]:
    """Each shared counter array at the top of a kernel: its canonical form, or (node, why)."""
    for function in source.kernels:
        for statement in block_statements(function.body):
            if _array_declaration(source, statement) is None:
                continue
            try:
                yield _read_privatized(source, function, statement)
            except _NotCanonical as why:
                yield statement, str(why)


# ---------------------------------------------------------------------------------------------
# Shared-memory atomics outside the canonical form
# ---------------------------------------------------------------------------------------------


def _shared_atomics(source: ParsedSource) -> dict[tuple[str, str], list[Node]]:
    """``atomicAdd(&shared[...], ...)`` calls grouped by (function, array)."""
    groups: dict[tuple[str, str], list[Node]] = {}
    for call in source.calls_named("atomicAdd"):
        if not call.args:
            continue
        address = strip_parens(call.args[0])
        access = (
            address.child_by_field_name("argument")
            if address.type == "pointer_expression"
            else None
        )
        if access is None or strip_parens(access).type != "subscript_expression":
            continue
        array = strip_parens(access).child_by_field_name("argument")
        function = source.enclosing_function(call.node)
        if array is None or function is None or shared_base(source, function, array) is None:
            continue
        groups.setdefault((function.name, normalized(source.text_of(array))), []).append(call.node)
    return groups


def _consumer(source: ParsedSource, array: str) -> Node | None:
    """A read of the shared histogram other than an atomic increment or a clearing store."""
    for node in source.nodes("subscript_expression"):
        base = node.child_by_field_name("argument")
        if base is None or normalized(source.text_of(base)) != array:
            continue
        parent = node.parent
        if parent is not None and parent.type == "pointer_expression":
            continue  # &h[i]: an atomic's address
        if (
            parent is not None
            and parent.type == "assignment_expression"
            and parent.child_by_field_name("left") == node
        ):
            continue  # a store (the zeroing)
        return node
    return None


def _statement(node: Node) -> Node:
    current = node
    while current.parent is not None and current.parent.type != "compound_statement":
        current = current.parent
    return current


# ---------------------------------------------------------------------------------------------
# Candidates: global atomics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Global:
    """A kernel counting into a global array with atomicAdd."""

    function: Function
    target: str
    atomics: tuple[Node, ...]


def _global_histograms(source: ParsedSource, function: Function) -> list[_Global]:
    found: dict[str, list[Node]] = {}
    for param in function.params:
        if not param.name or param.pointer_depth != 1 or param.is_const:
            continue
        uses = _uses(source, function.body, param.name) if function.body is not None else []
        atomics = [_atomic_target(source, use) for use in uses]
        if uses and any(a is not None for a in atomics):
            found[param.name] = [a for a in atomics if a is not None]
    return [_Global(function, name, tuple(calls)) for name, calls in found.items()]


def _index_of(source: ParsedSource, atomic: Node) -> Node | None:
    """``v`` of ``atomicAdd(&g[v], ...)`` (or of ``g + v``)."""
    address = strip_parens(call_args(atomic)[0])
    if address.type == "pointer_expression":
        access = address.child_by_field_name("argument")
        indices = access.child_by_field_name("indices") if access is not None else None
        inner = [c for c in indices.named_children] if indices is not None else []
        return inner[0] if len(inner) == 1 else None
    return address.child_by_field_name("right")


def _comparisons(source: ParsedSource, node: Node, joiner: str) -> list[str]:
    """The comparisons of a condition split on ``&&`` or ``||``, spaces removed."""
    node = strip_parens(node)
    operator = node.child_by_field_name("operator")
    if node.type == "binary_expression" and operator is not None and operator.type == joiner:
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        assert left is not None and right is not None
        return _comparisons(source, left, joiner) + _comparisons(source, right, joiner)
    return [normalized(source.text_of(node))]


def _inferred_bins(source: ParsedSource, function: Function, atomic: Node) -> str | None:
    """The bound ``B`` of a guard proving ``0 <= v < B`` before ``atomicAdd(&g[v], ...)``."""
    index = _index_of(source, atomic)
    if index is None or strip_parens(index).type != "identifier":
        return None
    name = source.text_of(strip_parens(index))
    if _written(source, function, name) or _declarations_of(source, function, name) > 1:
        return None  # a guard on a variable that changes (or is shadowed) proves nothing
    unsigned = (
        source.local_types(function).get(name, "").replace("const ", "").startswith(_UNSIGNED)
    )
    child = atomic
    current = atomic.parent
    while current is not None and current != function.node:
        if current.type == "if_statement" and child == current.child_by_field_name("consequence"):
            condition = current.child_by_field_name("condition")
            bound = _bound(condition, name, unsigned, "&&", source) if condition else None
            if bound is not None:
                return bound
        if current.type == "compound_statement":
            for statement in block_statements(current):
                if statement.start_byte >= child.start_byte:
                    break
                bound = _exit_guard(source, statement, name, unsigned)
                if bound is not None:
                    return bound
        child, current = current, current.parent
    return None


def _written(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether ``name`` is assigned or incremented anywhere in the function."""
    assert function.body is not None
    for node in source.iter_nodes(
        "assignment_expression", "update_expression", within=function.body
    ):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and normalized(source.text_of(target)) == name:
            return True
    return False


def _declarations_of(source: ParsedSource, function: Function, name: str) -> int:
    """How many times the function declares ``name`` (parameters included)."""
    assert function.body is not None
    count = sum(1 for p in function.params if p.name == name)
    for declaration in source.declarations:
        if within(declaration.node, function.body):
            count += declaration.names.count(name)
    return count


def _exit_guard(source: ParsedSource, statement: Node, name: str, unsigned: bool) -> str | None:
    """``B`` of ``if (v < 0 || v >= B) return;`` (or ``continue;``)."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return None
    exits = block_statements(statement.child_by_field_name("consequence"))
    if len(exits) != 1 or exits[0].type not in _EXITS or exits[0].named_children:
        return None
    condition = statement.child_by_field_name("condition")
    return _bound(condition, name, unsigned, "||", source) if condition is not None else None


def _bound(
    condition: Node, name: str, unsigned: bool, joiner: str, source: ParsedSource
) -> str | None:
    """``B`` when a condition proves ``0 <= name < B`` (joined by ``&&``, guarding the
    atomic) or its negation (joined by ``||``, guarding an exit); the lower bound may come
    from an unsigned type."""
    parts = _comparisons(
        source, condition.named_children[-1] if condition.named_children else condition, joiner
    )
    if joiner == "&&":
        lower = unsigned or f"{name}>=0" in parts or f"0<={name}" in parts
        uppers = [
            p[len(name) + 1 :]
            for p in parts
            if p.startswith(f"{name}<") and p[len(name) + 1 : len(name) + 2] != "="
        ]
    else:
        lower = unsigned or f"{name}<0" in parts or f"0>{name}" in parts
        uppers = [p[len(name) + 2 :] for p in parts if p.startswith(f"{name}>=")]
    return uppers[0] if lower and len(uppers) == 1 and uppers[0] else None


def _launch_block_refusal(source: ParsedSource, launch: Launch) -> str | None:
    block = launch.block
    if block is None:
        return None
    text = source.text_of(block)
    launcher = source.enclosing_function(launch.node)
    declared = source.local_types(launcher) if launcher is not None else {}
    if "dim3" in text or declared.get(text, "").endswith("dim3"):
        line = source.line_of(launch.node.start_byte)
        return f"the launch at line {line} uses a dim3 block; the bin loops assume 1-D blocks"
    return None


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


@register
class SmemHistogram(Mechanism):
    name = "smem_histogram"
    category = "memory"
    signature = ("ATOMS",)
    family = "radix or bucket selection in shared memory"
    intent = (
        "Count into a block-private histogram with shared-memory atomics and add it to the "
        "global histogram once per block, instead of sending every increment to L2."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "bins": "the number of bins as an expression of the kernel (a parameter or a "
        "constant); default: read from a guard `if (v < 0 || v >= bins) return;`",
    }

    # -- backward -----------------------------------------------------------------------------

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        covered: set[tuple[str, str]] = set()
        for found in _privatized(source):
            if isinstance(found, _Privatized):
                covered.add((found.function.name, found.array))
                yield self.site(
                    source,
                    found.declaration,
                    span=(found.declaration.start_byte, found.flush.end_byte),
                    detail={
                        "array": found.array,
                        "target": found.target,
                        **({"bins": found.bins} if found.bins else {}),
                    },
                )
        for (function, array), atomics in _shared_atomics(source).items():
            if (function, array) in covered:
                continue
            first, last = _statement(atomics[0]), _statement(atomics[-1])
            yield self.site(
                source,
                first,
                span=(first.start_byte, last.end_byte),
                kind="compound_statement",
                detail={"array": array},
                refusal=self._refusal(source, array),
            )

    def _refusal(self, source: ParsedSource, array: str) -> str:
        for found in _privatized(source):
            if not isinstance(found, _Privatized) and normalized(array) == _declared_name(
                source, found[0]
            ):
                return f"the shared histogram {array} is not in the canonical form: {found[1]}"
        consumer = _consumer(source, array)
        if consumer is not None:
            line = source.line_of(consumer.start_byte)
            return (
                f"the shared histogram {array} is consumed inside the block (read at line "
                f"{line}), not flushed to a global histogram; counting in global memory would "
                "need per-block global scratch, zeroed and synchronized, which a rewrite "
                "cannot add safely"
            )
        return (
            f"the shared histogram {array} is not in the canonical form (zeroed counters, a "
            "barrier, shared atomics, a barrier, a flush loop adding them to a global array)"
        )

    def _canonical(self, source: ParsedSource, site: Site) -> _Privatized:
        declaration = node_starting_at(source, site.start_byte, "declaration")
        function = source.enclosing_function(site.start_byte)
        if declaration is None or function is None:
            raise MechanismError(f"{self.name}: no shared histogram at {site}")
        try:
            return _read_privatized(source, function, declaration)
        except _NotCanonical as why:
            raise self.refuse(str(why), site) from None

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        found = self._canonical(source, site)
        keep_barriers = _other_shared(source, found)
        edits = [source.deletion(found.declaration, whole_line=True)]
        edits += [source.deletion(s, whole_line=True) for s in found.zeroing]
        edits.append(source.deletion(found.flush, whole_line=True))
        if not keep_barriers:
            edits += [source.deletion(b, whole_line=True) for b in found.barriers]
        retarget = [
            (use.start_byte, use.end_byte, found.target)
            for statement in found.counting
            for use in _uses(source, statement, found.array)
        ]
        lam = _counting_lambda(source, found.counting)
        if lam is not None and not (keep_barriers and _has_exits(source, lam[1])):
            statement, body = lam
            edits.append(
                Edit(
                    statement.start_byte,
                    statement.end_byte,
                    _unwrapped(source, statement, body, retarget),
                )
            )
        else:
            edits += [Edit(start, end, text) for start, end, text in retarget]
        if found.dynamic and not _other_dynamic(source, found):
            for launch in source.launches_of(found.function):
                memory = launch.shared_memory
                if memory is not None and source.text_of(memory).strip() != "0":
                    edits.append(Edit.replace(memory, "0"))
        return edits

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        bins = site.detail.get("bins")
        return Carrier(bins=str(bins)) if bins else Carrier()

    # -- forward ------------------------------------------------------------------------------

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        privatized = {f.function.name for f in _privatized(source) if isinstance(f, _Privatized)}
        for function in source.kernels:
            if function.body is None or function.name in privatized:
                continue
            histograms = _global_histograms(source, function)
            if not histograms:
                continue
            refusal = self._candidate_refusal(source, function, histograms)
            yield self.site(
                source,
                function.body,
                detail={"target": histograms[0].target},
                refusal=refusal,
            )

    def _candidate_refusal(
        self, source: ParsedSource, function: Function, histograms: list[_Global]
    ) -> str | None:
        if len(histograms) > 1:
            names = ", ".join(h.target for h in histograms)
            return f"the kernel counts into several global arrays ({names}); one at a time only"
        (histogram,) = histograms
        assert function.body is not None
        uses = _uses(source, function.body, histogram.target)
        if len(uses) != len(histogram.atomics):
            line = next(
                source.line_of(u.start_byte) for u in uses if _atomic_target(source, u) is None
            )
            return (
                f"{histogram.target} is also read or written otherwise (line {line}); only a "
                "pure atomicAdd target can be privatized"
            )
        param = function.param(histogram.target)
        element = param.base_type if param is not None else "?"
        if element not in COUNTER_TYPES:
            return f"no shared-memory atomicAdd for {element} counters"
        text = source.text_of(function.node)
        axis = next((form for form in _NOT_1D if form in text), None)
        if axis is not None:
            return f"the kernel uses {axis}; the bin loops stride by blockDim.x over 1-D blocks"
        if any(True for _ in iter_descendants(function.body, "goto_statement")):
            return "the kernel uses goto"
        exits = any(True for _ in _exits_outside_lambdas(source, function.body))
        if exits and "__shared__" in source.text_of(function.body):
            return (
                "the kernel returns early and declares shared memory: its body cannot move "
                "into the lambda that keeps the returns off the barriers"
            )
        launches = source.launches_of(function)
        if not launches:
            return f"no launch of {function.name} in this file to size its shared memory"
        for launch in launches:
            reason = _launch_block_refusal(source, launch)
            if reason is not None:
                return reason
        return None

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        function = source.enclosing_function(site.start_byte)
        if function is None or function.body is None:
            raise MechanismError(f"{self.name}: no kernel at {site}")
        (histogram,) = _global_histograms(source, function)
        bins = carrier.get_str("bins") or self._guarded_bins(source, function, histogram)
        if bins is None:
            raise self.refuse(
                "cannot tell the number of bins: no guard `if (v < 0 || v >= bins) return;` "
                "before the atomic; pass --carrier bins=<expression>",
                site,
                "apply",
            )
        plan = _Plan.make(self, source, function, histogram, bins, site)
        return plan.edits()

    def _guarded_bins(
        self, source: ParsedSource, function: Function, histogram: _Global
    ) -> str | None:
        bounds = {_inferred_bins(source, function, atomic) for atomic in histogram.atomics}
        return bounds.pop() if len(bounds) == 1 else None

    # -- conditions ---------------------------------------------------------------------------

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        if "target" not in site.detail:
            return []  # a histogram the block consumes: nothing is rewritten
        function = source.enclosing_function(site.start_byte)
        if function is None:
            return []
        bins = site.detail.get("bins")
        if bins is None:
            histograms = _global_histograms(source, function)
            bins = (
                self._guarded_bins(source, function, histograms[0])
                if len(histograms) == 1
                else None
            )
        found: list[Condition] = [
            Prose(text="blocks must be one-dimensional", why="the bin loops stride by blockDim.x")
        ]
        target = str(site.detail.get("target", ""))
        param = function.param(target)
        size = SIZEOF.get(param.base_type, 4) if param is not None else 4
        if bins is not None:
            array = site.detail.get("array")
            found.append(
                _capacity_condition(
                    source, function, str(bins), size, str(array) if array else None
                )
            )
        return found


def _declared_name(source: ParsedSource, declaration: Node) -> str | None:
    found = _array_declaration(source, declaration)
    return found[0] if found else None


def _other_static_bytes(source: ParsedSource, function: Function, array: str | None) -> int:
    """Static shared memory the kernel declares besides the histogram ``array`` (0 when
    unknown: the launch then reports what does not fit)."""
    total = static_shared_bytes(source, function) or 0
    if array is None:
        return total
    body = function.body
    for declaration in source.shared_declarations:
        if array not in declaration.names or declaration.is_extern or body is None:
            continue
        if within(declaration.node, body):
            (declarator,) = declaration.declarators
            size = declarator.child_by_field_name("size")
            count = fold_int(source, size) if size is not None else None
            own = SIZEOF.get(declaration.type, 4) * (count or 0)
            return max(0, total - own)
    return total


def _capacity_condition(
    source: ParsedSource, function: Function, bins: str, size: int, array: str | None
) -> Condition:
    """``bins`` counters must fit in the shared memory a block gets without opting in."""
    other = _other_static_bytes(source, function, array)
    most = (SHARED_CAPACITY - other) // size
    why = f"{most} counters of {size} bytes fill the 48 KiB of shared memory per block"
    if other:
        why += f" beside the kernel's other {other} bytes"
    constant = _fold_text(source, bins)
    if constant is not None:
        used = str(constant * size + other)
        return SharedMemoryAtMost(bytes=SHARED_CAPACITY, usage=used, why=why)
    expr = _launch_expr(source, function, bins)
    expr = without_outer_parentheses(expr) if expr is not None else None
    if expr is not None and expr.isidentifier():
        return AxisAtMost(axis=expr, n=most, why=why)
    if expr is not None:
        usage = f"({expr}) * {size} + {other}"
        return SharedMemoryAtMost(bytes=SHARED_CAPACITY, usage=usage, why=why)
    return Prose(text=f"{bins} must be at most {most}", why=why)


def _launch_expr(source: ParsedSource, function: Function, bins: str) -> str | None:
    """``bins`` (a parameter of the kernel) as a size expression of the launch."""
    exprs = set()
    for launch in source.launches_of(function):
        index = next((i for i, p in enumerate(function.params) if p.name == bins), None)
        if index is None or index >= len(launch.args):
            return None
        launcher = source.enclosing_function(launch.node)
        exprs.add(to_size_expr(source, launch.args[index], launch_names(source, launcher)))
    return exprs.pop() if len(exprs) == 1 else None


def _fold_text(source: ParsedSource, text: str) -> int | None:
    snippet = KernelSource(f"int klineage_value = {text};\n").parsed
    declarators = snippet.nodes("init_declarator")
    value = declarators[0].child_by_field_name("value") if declarators else None
    if value is None or snippet.errors:
        return None
    return fold_int(snippet, value, source.integer_constants)


def _other_shared(source: ParsedSource, found: _Privatized) -> bool:
    """Whether the barriers may also guard other shared memory of the kernel (then they stay)."""
    body = found.function.body
    assert body is not None
    for declaration in source.shared_declarations:
        if declaration.node != found.declaration and within(declaration.node, body):
            return True
    for call in source.calls:
        callee = source.function(call.name)
        if within(call.node, body) and callee is not None and callee.body is not None:
            text = source.text_of(callee.body)
            if "__shared__" in text or "__syncthreads" in text:
                return True
    return False


def _other_dynamic(source: ParsedSource, found: _Privatized) -> bool:
    """Whether another ``extern __shared__`` array in the file shares the launch's dynamic
    shared memory (then its size stays)."""
    return any(d.is_extern and d.node != found.declaration for d in source.shared_declarations)


def _counting_lambda(source: ParsedSource, counting: tuple[Node, ...]) -> tuple[Node, Node] | None:
    """``(statement, body)`` when the counting is one ``[&] { ... }();``."""
    if len(counting) != 1 or counting[0].type != "expression_statement":
        return None
    call = counting[0].named_children[0] if counting[0].named_children else None
    if call is None or call.type != "call_expression" or call_args(call):
        return None
    lam = call.child_by_field_name("function")
    if lam is None or lam.type != "lambda_expression":
        return None
    declarator = lam.child_by_field_name("declarator")
    if declarator is not None and normalized(source.text_of(declarator)) != "()":
        return None
    body = lam.child_by_field_name("body")
    return (counting[0], body) if body is not None else None


def _has_exits(source: ParsedSource, body: Node) -> bool:
    return any(True for _ in iter_descendants(body, "return_statement"))


def _unwrapped(
    source: ParsedSource, statement: Node, body: Node, retarget: list[tuple[int, int, str]]
) -> str:
    """The lambda body's statements, dedented to the statement's level, with the histogram
    accesses retargeted."""
    inner = [c for c in body.named_children]
    start, end = inner[0].start_byte, inner[-1].end_byte
    pieces, cursor = [], start
    for left, right, text in sorted(retarget):
        if start <= left and right <= end:
            pieces.append(source.data[cursor:left].decode())
            pieces.append(text)
            cursor = right
    pieces.append(source.data[cursor:end].decode())
    depth = len(source.indent_of(inner[0].start_byte)) - len(source.indent_of(statement.start_byte))
    return dedent_lines("".join(pieces), max(0, depth))


@dataclass(frozen=True)
class _Plan:
    """How to privatize one kernel's global histogram."""

    source: ParsedSource
    function: Function
    histogram: _Global
    bins: str
    element: str
    shared: str
    loop: str
    loop_type: str
    static: bool

    @classmethod
    def make(
        cls,
        mechanism: SmemHistogram,
        source: ParsedSource,
        function: Function,
        histogram: _Global,
        bins: str,
        site: Site,
    ) -> _Plan:
        param = function.param(histogram.target)
        assert param is not None
        constant = _fold_text(source, bins)
        size = SIZEOF.get(param.base_type, 4)
        other = _other_static_bytes(source, function, None)
        if constant is not None and constant * size + other > SHARED_CAPACITY:
            beside = f" beside {other} bytes of other shared memory" if other else ""
            raise mechanism.refuse(
                f"{constant} bins of {size} bytes{beside} exceed the {SHARED_CAPACITY} bytes "
                "of shared memory per block",
                site,
                "apply",
            )
        bound = function.param(bins)
        if constant is None and (bound is None or bound.is_pointer):
            raise mechanism.refuse(
                f"the bin count {bins!r} is neither a constant nor a parameter of "
                f"{function.name}, so the launch cannot size the shared histogram",
                site,
                "apply",
            )
        if bound is not None and constant is None:
            index = function.params.index(bound)
            for launch in source.launches_of(function):
                if index >= len(launch.args):
                    line = source.line_of(launch.node.start_byte)
                    raise mechanism.refuse(
                        f"the launch at line {line} passes no {bins}", site, "apply"
                    )
                memory = launch.shared_memory
                if memory is not None and source.text_of(memory).strip() != "0":
                    line = source.line_of(launch.node.start_byte)
                    raise mechanism.refuse(
                        f"the launch at line {line} already passes dynamic shared memory",
                        site,
                        "apply",
                    )
        taken = identifiers_in(source, function.node)
        loop_type = "int"
        if bound is not None and bound.base_type in _INTEGER_PARAMS:
            loop_type = bound.base_type
        return cls(
            source=source,
            function=function,
            histogram=histogram,
            bins=bins,
            element=param.base_type,
            shared=fresh_name(taken, f"shared_{histogram.target}"),
            loop=fresh_name(taken, "bin"),
            loop_type=loop_type,
            static=constant is not None,
        )

    def _loop(self) -> str:
        return (
            f"for ({self.loop_type} {self.loop} = threadIdx.x; {self.loop} < {self.bins}; "
            f"{self.loop} += blockDim.x)"
        )

    def edits(self) -> list[Edit]:
        source, body = self.source, self.function.body
        assert body is not None
        inner = [c for c in body.named_children]
        first, last = inner[0], inner[-1]
        indent = source.indent_of(first.start_byte)
        h, b = self.shared, self.loop
        declaration = (
            f"__shared__ {self.element} {h}[{self.bins}];"
            if self.static
            else f"extern __shared__ {self.element} {h}[];"
        )
        prologue = [declaration, f"{self._loop()} {h}[{b}] = 0;", "__syncthreads();"]
        epilogue = [
            "__syncthreads();",
            f"{self._loop()}\n{indent}  if ({h}[{b}] != 0) "
            f"atomicAdd(&{self.histogram.target}[{b}], {h}[{b}]);",
        ]
        retarget = [
            (use.start_byte, use.end_byte) for use in _uses(source, body, self.histogram.target)
        ]
        text = _with_replacements(source, first.start_byte, last.end_byte, retarget, h)
        if any(True for _ in _exits_outside_lambdas(source, body)):
            text = f"[&] {{\n{indent}  {indent_lines(text, '  ')}\n{indent}}}();"
        joined = f"\n{indent}".join([*prologue, text, *epilogue])
        edits = [Edit(first.start_byte, last.end_byte, joined)]
        if not self.static:
            edits += self._launch_edits()
        return edits

    def _launch_edits(self) -> list[Edit]:
        source = self.source
        index = next(i for i, p in enumerate(self.function.params) if p.name == self.bins)
        edits = []
        for launch in source.launches_of(self.function):
            argument = launch.args[index]
            count = source.text_of(argument)
            if precedence(argument) < PRIMARY:
                count = f"({count})"
            bytes_ = f"(size_t){count} * sizeof({self.element})"
            if launch.shared_memory is not None:
                edits.append(Edit.replace(launch.shared_memory, bytes_))
            elif launch.block is not None:
                edits.append(Edit.insert(launch.block.end_byte, f", {bytes_}"))
        return edits


def _exits_outside_lambdas(source: ParsedSource, body: Node) -> Iterator[Node]:
    for node in iter_descendants(body, "return_statement"):
        current = node.parent
        while current is not None and current != body and current.type != "lambda_expression":
            current = current.parent
        if current == body:
            yield node


def _with_replacements(
    source: ParsedSource, start: int, end: int, ranges: list[tuple[int, int]], text: str
) -> str:
    pieces, cursor = [], start
    for left, right in sorted(ranges):
        if start <= left and right <= end:
            pieces += [source.data[cursor:left].decode(), text]
            cursor = right
    pieces.append(source.data[cursor:end].decode())
    return "".join(pieces)
