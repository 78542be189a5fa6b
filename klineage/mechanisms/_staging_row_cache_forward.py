"""Caching a row in shared memory on its first pass: the forward rule of the removal in
:mod:`klineage.mechanisms._staging_row_cache`.

The form it takes: a kernel that walks its row several times with loops of one header, each
loading the same global element at the loop's index::

    for (int c = INIT; c < C; c += STEP) {      // the first pass
      const T v = LOAD;                           // (or LOAD inside a statement)
      ...
    }
    ...
    for (int c = INIT; c < C; c += STEP) {      // a later pass, the same header
      ... LOAD ...
    }

What it writes: each row's slice of the dynamic shared buffer, the first pass storing what it
loads there, and the later passes reading the slice instead of global memory::

    extern __shared__ __align__(16) char cache[];
    T* row_cache = reinterpret_cast<T*>(cache) + OWNER * SLOTS;
    for (...) { const T v = LOAD; row_cache[c / V] = v; ... }
    for (...) { ... row_cache[c / V] ... }

and every launch asks for ``OWNERS * SLOTS * sizeof(T)`` bytes (with the opt-in). SLOTS is
``C`` (``(C + V - 1) / V`` for a V-element vector load). OWNER tells the rows of a block apart:
none for a row a block, ``threadIdx.y`` for a row a ``threadIdx.y``, the warp for a row a warp.

Why no barrier is needed: the loads name only the loop's index and values nothing writes
while the cache lives, so two threads of one row that store one slot store the same value,
and each thread reads back slots it stored itself (the same header walks the same indices).
Threads of different rows (different OWNER) use different slices. The load must sit outside
any condition of the first pass (it is evaluated once an iteration there), which holds no
jump that could skip the store; the later passes come after the first in its block (a pass in
the other branch of an ``if`` is none); and the load reads memory the kernel never writes.
A candidate's condition keeps the slices within the 227 KiB a block can opt in to (the
bound at most what they hold); there is no fallback kernel for longer rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klineage.conditions import AxisAtMost, Condition
from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.analysis.indices import Access, LoopVariable, is_loop_atom
from klineage.cuda.cexpr import SIZEOF, fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import static_shared_bytes
from klineage.cuda.source import Declaration, Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    dim3_extents,
    evaluated_whenever,
    fresh_name,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._dynamic_shared import kernel_byte_buffer, own_launches, request_edits
from klineage.mechanisms._local_util import names_in_function, tensor_name
from klineage.mechanisms._staging_once import multiple_of

if TYPE_CHECKING:
    from klineage.mechanisms.base import Mechanism, Site

__all__ = ["ROW_CACHE", "row_cache_application", "row_cache_candidates", "row_cache_conditions"]

ROW_CACHE = "row_cache"
NEEDED = (
    "loops of one header `for (c = INIT; c < C; c += STEP)` (C a parameter or a constant) "
    "that each load the same global element at c, outside any condition of the first, from "
    "memory the kernel never writes, in a kernel (whose own dynamic buffer, if any, is a byte "
    "array at its top) whose rows are told apart by nothing, threadIdx.y or the warp, "
    "launched in this file as a statement of its own"
)
_CONDITIONAL = frozenset(
    {
        "if_statement",
        "conditional_expression",
        "while_statement",
        "for_statement",
        "switch_statement",
    }
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _normal(text: str) -> str:
    return re.sub(r"\s+", "", text)


@dataclass(frozen=True)
class _Owner:
    """How the rows of a block are told apart (both None: one row a block)."""

    kernel: str | None
    """The row's index within the block, in the kernel (``threadIdx.y``)."""
    rows: str | None
    """The rows a block, in the kernel's terms (``blockDim.y``)."""


@dataclass(frozen=True)
class RowCache:
    """A kernel in the form above."""

    function: Function
    first: LoopVariable
    """The first pass."""
    access: Access
    """The load in the first pass."""
    later: list[Node]
    """The same load in the later passes."""
    element: str
    """The slot's type."""
    width: str | None
    """V as written in the slots; None for V = 1."""
    bound: Node
    """C, the passes' bound."""
    owner: _Owner
    launches: list[Launch]
    """The kernel's launches, each a statement of its own."""
    buffer: Declaration | None
    """The kernel's own dynamic buffer, when it has one: the slices go in front of its data."""


def _walk_loads(source: ParsedSource, function: Function) -> Iterator[tuple[LoopVariable, Access]]:
    """Global loads at a loop's index plus a row offset, in for loops of the kernel."""
    indices = analysis(source).indices(function)
    for access in indices.accesses():
        if access.direction != "load" or access.buffer.space != "global":
            continue
        loops = [indices.loop(a) for a in access.offset.base_atoms() if is_loop_atom(a)]
        if len(loops) != 1 or loops[0] is None or loops[0].loop.type != "for_statement":
            continue
        variable = loops[0]
        if access.offset.coefficient(variable.atom) != IndexForm.constant(1):
            continue
        yield variable, access


def _runs_after(first: Node, later: Node) -> bool:
    """Whether reaching ``later`` means ``first`` ran before it: ``later`` comes after it
    inside the block ``first`` is a statement of (a later pass in another branch of an
    ``if``, or after a first pass under a condition, might read a slice nothing stored)."""
    block = first.parent
    return (
        block is not None
        and block.type == "compound_statement"
        and later.start_byte >= first.end_byte
        and later.end_byte <= block.end_byte
    )


def _unconditional(loop: Node, node: Node) -> bool:
    """Whether ``node`` runs once every iteration of ``loop``: no condition or inner loop
    between them, and no ``&&``, ``||`` or ``?:`` above it."""
    return evaluated_whenever(node, loop, _CONDITIONAL)


def _owner(
    source: ParsedSource, function: Function, access: Access, variable: LoopVariable
) -> _Owner:
    indices = analysis(source).indices(function)
    row = indices.thread_atoms(access.offset.without([variable.atom]))
    walk_atoms = indices.thread_atoms(variable.init)
    if row & walk_atoms:
        raise _refuse(
            f"a row that differs by {', '.join(sorted(row & walk_atoms))}, which also splits the "
            "walk along it"
        )
    if not row:
        return _Owner(None, None)
    if row == {"threadIdx.y"}:
        return _Owner("threadIdx.y", "blockDim.y")
    if row == {"warp"}:
        return _Owner("(threadIdx.x / 32)", "(blockDim.x / 32)")
    raise _refuse(f"rows told apart by {', '.join(sorted(row))}")


_LOAD_INTRINSICS = frozenset({"__ldg", "__ldcg", "__ldca", "__ldcs", "__ldlu", "__ldcv"})


def _declared_type(source: ParsedSource, node: Node) -> str | None:
    """The declared type of the local ``node`` initializes (None: it initializes none, or
    the type is ``auto``)."""
    parent = node.parent
    declaration = parent.parent if parent is not None else None
    if (
        parent is None
        or parent.type != "init_declarator"
        or declaration is None
        or declaration.type != "declaration"
    ):
        return None
    kind = declaration.child_by_field_name("type")
    text = source.text_of(kind) if kind is not None else "auto"
    return None if text == "auto" else text


def _element(source: ParsedSource, access: Access) -> tuple[str, tuple[str, IndexForm] | None]:
    """The slot's type and V (as written, and as a form): the buffer's element for a plain
    load, else the declared type of the local the load initializes, V its elements (written
    ``T::size`` where the kernel names it). A load whose value type is unknown (a helper's
    pack in a statement) is refused rather than guessed at."""
    plain = access.buffer.element_type.replace("const", "").strip()
    node = access.node
    declared = _declared_type(source, node)
    if declared is None or declared.replace("const", "").strip() == plain:
        if access.bytes is not None and SIZEOF.get(plain) != access.bytes:
            raise _refuse(f"a vector load `{source.snippet(node, 50)}` that initializes no local")
        callee = node.child_by_field_name("function") if node.type == "call_expression" else None
        if callee is not None and source.text_of(callee) not in _LOAD_INTRINSICS and not declared:
            raise _refuse(f"a load `{source.snippet(node, 50)}` whose value's type is not declared")
        return plain, None
    element = declared.replace("const", "").strip()
    size, pack = SIZEOF.get(plain), SIZEOF.get(element)
    lanes = (
        access.bytes // size
        if access.bytes is not None and size and access.bytes % size == 0
        else pack // size
        if pack and size and pack % size == 0
        else None
    )
    named = _pack_size(source, access, element)
    if named is not None and (lanes is None or named[1].value in (None, lanes)):
        return element, named
    if lanes is None:
        raise _refuse(f"a vector load `{source.snippet(node, 50)}` of an unknown width")
    return element, (str(lanes), IndexForm.constant(lanes))


def _pack_size(source: ParsedSource, access: Access, element: str) -> tuple[str, IndexForm] | None:
    """``T::size`` as the kernel writes it, and its form (a symbol where its value is not
    known: the loops' steps are then checked against it as one), when the kernel names it."""
    indices = analysis(source).indices(access.function)
    for node in indices.nodes("qualified_identifier"):
        if source.text_of(node).replace(" ", "") == f"{element}::size":
            return source.text_of(node), indices.form(node)
    return None


def _bound(source: ParsedSource, function: Function, variable: LoopVariable) -> Node:
    condition = variable.loop.child_by_field_name("condition")
    operator = condition.child_by_field_name("operator") if condition is not None else None
    if variable.bound is None or operator is None or operator.type != "<":
        raise _refuse(f"a loop `{source.header(variable.loop)}` whose condition is not `c < C`")
    bound = strip_parens(variable.bound)
    params = {p.name for p in function.params if p.name}
    assert function.body is not None
    if fold_int(source, bound) is None and (
        bound.type != "identifier"
        or source.text_of(bound) not in params
        or source.text_of(bound) in assigned_names(source, function.body)
    ):
        raise _refuse(f"a loop to `{source.text_of(bound)}`, not a parameter the kernel keeps")
    return bound


def _forms(
    source: ParsedSource, function: Function
) -> Iterator[tuple[Node, Node, RowCache | NotInForm]]:
    """Each first pass and load of the kernel with a later pass that loads it again: the
    loop, the load, and its form or why it is not in it."""
    if function.body is None or not function.is_kernel:
        return
    seen: set[tuple[int, str]] = set()
    # each load with what makes another the same pass again: its loop's header and its text
    loads = [
        (v, a, (_normal(source.header(v.loop)), _normal(source.text_of(a.node))))
        for v, a in _walk_loads(source, function)
    ]
    for variable, access, signature in loads:
        key = (variable.loop.start_byte, signature[1])
        later = [
            a.node for v, a, s in loads if s == signature and _runs_after(variable.loop, v.loop)
        ]
        earlier = any(
            s == signature and v.loop.end_byte <= variable.loop.start_byte for v, _, s in loads
        )
        if not later or key in seen or earlier:
            continue  # no later pass, or not the first one
        seen.add(key)
        try:
            yield variable.loop, access.node, _form(source, function, variable, access, later)
        except NotInForm as why:
            yield variable.loop, access.node, why


def _form(
    source: ParsedSource,
    function: Function,
    variable: LoopVariable,
    access: Access,
    later: list[Node],
) -> RowCache:
    assert function.body is not None
    indices = analysis(source).indices(function)
    if not _unconditional(variable.loop, access.node):
        raise _refuse(f"a load `{source.snippet(access.node, 50)}` under a condition of its loop")
    jumps = ("continue_statement", "break_statement", "return_statement", "goto_statement")
    if any(n.type in jumps for n in walk(variable.loop)):
        raise _refuse(f"a first pass `{source.header(variable.loop)}` that can skip its store")
    stored = {a.buffer.name for a in indices.accesses() if a.direction in ("store", "both")}
    if access.buffer.name in stored:
        raise _refuse(f"a load from {access.buffer.name}, which the kernel also writes")
    last = max(later, key=lambda n: n.end_byte)
    between = [
        s
        for s in statements(function.body)
        if s.end_byte > variable.loop.start_byte and s.start_byte < last.end_byte
    ]
    named = {source.text_of(n) for n in walk(access.node) if n.type == "identifier"}
    written = (assigned_names(source, between) & named) - {variable.name}
    if written:
        raise _refuse(
            f"a load over {', '.join(sorted(written))}, written between its first and last pass"
        )
    element, vector_width = _element(source, access)
    width = vector_width[0] if vector_width is not None else None
    if vector_width is not None:
        vector = vector_width[1]
        step = variable.step
        if not (
            step is not None
            and multiple_of(indices, variable.init, vector)
            and multiple_of(indices, step, vector)
        ):
            raise _refuse(
                f"a loop over {variable.name} that does not stay a multiple of the {width} "
                "elements a load takes"
            )
    buffer = kernel_byte_buffer(source, function, NEEDED)
    bound = _bound(source, function, variable)
    owner = _owner(source, function, access, variable)
    return RowCache(
        function,
        variable,
        access,
        later,
        element,
        width,
        bound,
        owner,
        own_launches(source, function, NEEDED),
        buffer,
    )


def _slots(count: str, width: str | None) -> str:
    return count if width is None else f"(({count} + {width} - 1) / {width})"


def _block_dims(source: ParsedSource, launch: Launch) -> list[Node] | None:
    """A launch's block extents: ``dim3(x, y)``'s arguments, or the one expression of a 1-D
    block (None: a call of something other than ``dim3``)."""
    block = launch.block
    assert block is not None
    node = strip_parens(block)
    if node.type != "call_expression":
        return [node]
    callee = node.child_by_field_name("function")
    return dim3_extents(node) if callee is not None and source.text_of(callee) == "dim3" else None


def _block_rows(source: ParsedSource, launch: Launch, owner: _Owner) -> str | None:
    """A launch's rows a block, in the launching function's terms (None: one)."""
    if owner.rows is None:
        return None
    block = launch.block
    assert block is not None
    dims = _block_dims(source, launch)
    if dims is None:
        raise _refuse(f"a launch whose block `{source.text_of(block)}` is not dim3(...)")
    if owner.rows == "blockDim.y":
        if len(dims) < 2:
            raise _refuse(
                f"rows a threadIdx.y, launched with a block `{source.text_of(block)}` not "
                "written dim3(x, y)"
            )
        return f"({source.text_of(dims[1])})"
    return f"(({source.text_of(dims[0])}) / 32)"


def _host_bytes(source: ParsedSource, cache: RowCache, launch: Launch) -> str:
    """The bytes the block's row slices take, in the launching function's terms."""
    bound = source.text_of(cache.bound)
    names = [p.name for p in cache.function.params]
    if bound in names:
        arg = strip_parens(launch.args[names.index(bound)])
        bound = source.text_of(arg) if arg.type == "identifier" else f"({source.text_of(arg)})"
    size = f"(size_t){_slots(bound, cache.width)} * sizeof({cache.element})"
    rows = _block_rows(source, launch, cache.owner)
    size = size if rows is None else f"(size_t){rows} * {size}"
    return size if cache.buffer is None else _aligned(size)  # as the kernel moves its data


def row_cache_edits(source: ParsedSource, cache: RowCache) -> list[Edit]:
    """The edits that cache the row and read the later passes from the cache."""
    function = cache.function
    body = function.body
    assert body is not None
    taken = names_in_function(source, function)
    buffer = cache.buffer.names[0] if cache.buffer is not None else fresh_name(taken, "cache")
    pointer = fresh_name(taken | {buffer}, "row_cache")
    index = cache.first.name
    slot = index if cache.width is None else f"{index} / {cache.width}"
    slots = _slots(source.text_of(cache.bound), cache.width)
    offset = "" if cache.owner.kernel is None else f" + {cache.owner.kernel} * {slots}"
    cast = f"{cache.element}* {pointer} = reinterpret_cast<{cache.element}*>({buffer}){offset};"
    edits: list[Edit] = []
    if cache.buffer is None:
        first = statements(body)[0] if statements(body) else None
        indent = source.indent_of(first.start_byte) if first is not None else "  "
        lines = [f"extern __shared__ __align__(16) char {buffer}[];", cast]
        edits.append(
            Edit.insert(body.start_byte + 1, "".join(f"\n{indent}{line}" for line in lines))
        )
    else:
        # the slices go first; the kernel's own data moves past them, 16-byte aligned
        rows = cache.owner.rows or "1"
        shift = _aligned(f"{rows} * {slots} * sizeof({cache.element})")
        declaration = cache.buffer.node
        for node in walk(body):
            if (
                node.type == "identifier"
                and source.text_of(node) == buffer
                and not declaration.start_byte <= node.start_byte < declaration.end_byte
            ):
                edits.append(Edit.replace(node, f"({buffer} + {shift})"))
        indent = source.indent_of(declaration.start_byte)
        edits.append(Edit.insert(declaration.end_byte, f"\n{indent}{cast}"))
    edits += _store_edits(source, cache, taken | {buffer, pointer}, f"{pointer}[{slot}]")
    edits += [Edit.replace(node, f"{pointer}[{slot}]") for node in cache.later]
    edits += request_edits(
        source, cache.launches, lambda launch: _host_bytes(source, cache, launch), NEEDED
    )
    return edits


def _aligned(size: str) -> str:
    return f"(({size} + 15) / 16 * 16)"


def _store_edits(source: ParsedSource, cache: RowCache, taken: set[str], slot: str) -> list[Edit]:
    """The first pass stores the value it loads: after the local the load initializes, or
    through a new local for a load inside a statement."""
    load = cache.access.node
    parent = load.parent
    declaration = parent.parent if parent is not None else None
    loop_body = cache.first.loop.child_by_field_name("body")
    assert loop_body is not None
    if (
        parent is not None
        and parent.type == "init_declarator"
        and declaration is not None
        and declaration.parent == loop_body
        and loop_body.type == "compound_statement"
    ):
        target = parent.child_by_field_name("declarator")
        assert target is not None
        name = source.text_of(target)
        if name in assigned_names(source, loop_body):
            raise _refuse(f"a loaded local {name} assigned again in the first pass")
        indent = source.indent_of(declaration.start_byte)
        return [Edit.insert(declaration.end_byte, f"\n{indent}{slot} = {name};")]
    value = fresh_name(taken, "cached")
    indent = source.indent_of(cache.first.loop.start_byte) + "  "
    head = f"const {cache.element} {value} = {source.text_of(load)};"
    store = f"{slot} = {value};"
    if loop_body.type == "compound_statement":
        return [
            Edit.insert(loop_body.start_byte + 1, f"\n{indent}{head}\n{indent}{store}"),
            Edit.replace(load, value),
        ]
    inner = source.text_of(loop_body).replace(source.text_of(load), value, 1)
    close = indent[:-2]
    text = f"{{\n{indent}{head}\n{indent}{store}\n{indent}{inner}\n{close}}}"
    return [Edit.replace(loop_body, text)]


def row_cache_candidates(mechanism: Mechanism, source: ParsedSource) -> Iterator[Site]:
    """A candidate per first pass and load that a later pass loads again, refused with the
    reason when the kernel is not in the form."""
    for function in source.kernels:
        for loop, load, found in _forms(source, function):
            refusal = str(found) if isinstance(found, NotInForm) else None
            end = loop.end_byte if isinstance(found, NotInForm) else found.later[-1].end_byte
            yield mechanism.site(
                source,
                loop,
                span=(loop.start_byte, end),
                snippet=f"{function.name}: {source.header(loop)} caches {source.snippet(load, 40)}",
                detail={"form": ROW_CACHE, "load": _normal(source.text_of(load))},
                refusal=refusal,
            )


def _at_site(source: ParsedSource, site: Site) -> RowCache | NotInForm | None:
    """The form of a candidate site found again (None: no such first pass and load)."""
    function = source.enclosing_function(site.start_byte)
    if function is None:
        return None
    for loop, load, found in _forms(source, function):
        if loop.start_byte == site.start_byte and _normal(source.text_of(load)) == site.detail.get(
            "load"
        ):
            return found
    return None


def row_cache_application(mechanism: Mechanism, source: ParsedSource, site: Site) -> list[Edit]:
    found = _at_site(source, site)
    if found is None:
        raise mechanism.refuse(f"no row to cache at line {site.start_line}", site, "apply")
    try:
        if isinstance(found, NotInForm):
            raise found
        return row_cache_edits(source, found)
    except NotInForm as why:
        raise mechanism.refuse(str(why), site, "apply") from None


OPT_IN_LIMIT = 227 * 1024
"""Shared memory a block can opt in to on sm_90 (static and dynamic together)."""


def row_cache_conditions(source: ParsedSource, site: Site) -> list[Condition]:
    """Where the slices fit: the passes' bound at most what 227 KiB hold a block, less the
    kernel's static shared memory (a 128K-float row does not fit a block). None known (no
    condition) when the bound is no ``run`` parameter or the rows a block are not a
    constant."""
    found = _at_site(source, site)
    if not isinstance(found, RowCache):
        return []
    function = found.function
    axis = tensor_name(source, function, source.text_of(found.bound))
    element = SIZEOF.get(found.access.buffer.element_type.replace("const", "").strip())
    rows = _constant_rows(source, found)
    static = static_shared_bytes(source, function)
    if axis is None or element is None or rows is None or static is None:
        return []
    why = (
        f"{rows} row slice(s) of {element}-byte elements a block, within the 227 KiB of shared "
        "memory a block can opt in to"
    )
    return [AxisAtMost(axis=axis, n=(OPT_IN_LIMIT - static) // (rows * element), why=why)]


def _constant_rows(source: ParsedSource, cache: RowCache) -> int | None:
    """The rows a block, the same constant at every launch (1 for a row a block)."""
    if cache.owner.rows is None:
        return 1
    counts = set()
    for launch in cache.launches:
        dims = _block_dims(source, launch)
        if dims is None:
            return None
        dim = dims[1] if cache.owner.rows == "blockDim.y" and len(dims) > 1 else dims[0]
        value = fold_int(source, dim)
        if value is None:
            return None
        counts.add(value if cache.owner.rows == "blockDim.y" else value // 32)
    return counts.pop() if len(counts) == 1 and min(counts) > 0 else None
