"""Removing tiles that a device helper stages: the SGEMM tutorial idiom.

A block-tiled GEMM often stages its tiles through a helper that gets the shared arrays as
parameters, and reads them through another one (or in the kernel)::

    for (uint t = 0; t < K; t += BK) {
      loadFromGmem<BM, BN, BK, ...>(N, K, A, B, As, Bs, innerRowA, innerColA, ...);
      __syncthreads();
      processFromSmem<BM, BN, BK, ...>(regM, regN, results, As, Bs, ...);
      A += BK;
      B += BK * N;
      __syncthreads();
    }

where the loader stores ``As[(innerColA * 4 + c) * BM + innerRowA + off] = tmp.<c>`` from a
``float4`` load of ``&A[(innerRowA + off) * K + innerColA * 4]`` (a transposed tile), or
copies ``float4``s ``reinterpret_cast<float4 *>(&Bs[s])[0] = reinterpret_cast<const float4
*>(&B[g])[0]``.

Removing the staging reads global memory where a tile was read. Every store of an array is
read as a slot form and a global offset over the loader's *positions* (its parameters and
loop variables that the slot index uses, and the vector lane): the positions fall into
components whose slot and global coefficients are proportional (``innerColA`` and the lane
step ``BM`` in the slot and ``1`` in the global index, ``innerRowA`` and ``off`` step ``1``
and ``K``), so a store writes ``slot = S_hi * L_hi + L_lo`` with the value
``G[G_hi * L_hi + G_lo * L_lo + rest]``. A read ``As[e]`` then reads
``A[G_lo * (e % S_hi) + G_hi * (e / S_hi) + rest]``. That holds when each store's low
component stays below ``S_hi`` (a tile row stays within its row), which the layout assumes
and this rule does not prove: the gate's check on the GPU catches a tile that overflows.

Reads in the kernel are rewritten in place; a reader helper called once with the arrays gets
the global pointers in their place (the parameter renamed, its reads rewritten) and the
values the offsets need: the loader's template arguments where the reader gets the same ones,
else extra parameters. The loader's call, its definition (when nothing else calls it), the
shared declarations, the barriers of the tile loop (when the kernel has no shared memory
left) and declarations left unused go; the tile loop, its pointer advances and register
caches stay. Valid when the global pointers and the values the offsets name are not written
between the loader's call and the last read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import gcd

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_parameter
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    call_arguments,
    callee_name,
    declaration_names,
    statements,
    strip_parens,
    template_arguments,
    walk,
)
from klineage.mechanisms._local_util import binary
from klineage.mechanisms._staging_helper_2d import is_2d_staging, tile_2d_removal
from klineage.mechanisms._staging_once import is_written, orphan_deletions
from klineage.mechanisms._tiles_util import fresh_name, function_names, statement_deletion

__all__ = ["defined_callee", "helper_removal"]

_NEEDED = (
    "a tile loop `{ loader(.., S, ..); barrier; reads of S (in the kernel or through a helper "
    "called once); barrier }` whose loader stores `S[slot] = G[..]` (a scalar, a float4 "
    "component or a float4 copy) with slot and global index affine in its positions, in at "
    "most two components (a row and a column), S read only as `S[e]`"
)
_VECTOR = re.compile(r"\b(?:float|int|uint|double)([1-4])\b")
_LANES = {"x": 0, "y": 1, "z": 2, "w": 3}


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class _Layout:
    """How a staged array's slots map to global memory: ``slot = high * L_hi + L_lo``, the
    value ``G[g_high * L_hi + g_low * L_lo + rest]`` (``high`` None for one component)."""

    pointer: str
    """The loader's parameter for the global buffer."""
    high: IndexForm | None
    g_high: IndexForm
    g_low: IndexForm
    rest: IndexForm


@dataclass
class _Staged:
    """One shared array the loader stages."""

    name: str
    """The kernel's array."""
    param: str
    """The loader's parameter for it."""
    layout: _Layout


# ---------------------------------------------------------------------------------------------
# The loader's stores
# ---------------------------------------------------------------------------------------------


def _vector_width(source: ParsedSource, cast: Node) -> int | None:
    function = cast.child_by_field_name("function")
    text = source.text_of(function) if function is not None else ""
    if not text.startswith("reinterpret_cast"):
        return None
    found = _VECTOR.search(text)
    return int(found.group(1)) if found else None


def _element(source: ParsedSource, node: Node) -> tuple[int, Node, Node] | None:
    """``G[h]`` -> (1, G, h); ``reinterpret_cast<float4 *>(&G[h])[0]`` (or ``*cast``) -> (4,
    G, h); None otherwise."""
    node = strip_parens(node)
    inner = None
    if node.type == "subscript_expression":
        index = node.child_by_field_name("indices")
        argument = node.child_by_field_name("argument")
        index_text = source.text_of(index).strip("[] ") if index is not None else ""
        if argument is not None and strip_parens(argument).type == "call_expression":
            if index_text != "0":
                return None
            inner = strip_parens(argument)
        elif argument is not None and strip_parens(argument).type == "identifier":
            if index is None or not index.named_children:
                return None
            return 1, strip_parens(argument), index.named_children[0]
        else:
            return None
    elif node.type == "pointer_expression" and node.children[0].type == "*":
        argument = node.child_by_field_name("argument")
        inner = strip_parens(argument) if argument is not None else None
    if inner is None or inner.type != "call_expression":
        return None
    width = _vector_width(source, inner)
    args = call_arguments(inner)
    if width is None or len(args) != 1:
        return None
    address = strip_parens(args[0])
    if address.type != "pointer_expression" or address.children[0].type != "&":
        return None
    element = address.child_by_field_name("argument")
    found = _element(source, element) if element is not None else None
    if found is None or found[0] != 1:
        return None
    return width, found[1], found[2]


def _local_vector(source: ParsedSource, loader: Function, name: str) -> tuple[int, Node, Node]:
    """The vector load a local of the loader is declared with."""
    assert loader.body is not None
    for declaration in walk(loader.body):
        if declaration.type != "declaration":
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            if target is None or source.text_of(target) != name:
                continue
            value = declarator.child_by_field_name("value")
            found = _element(source, value) if value is not None else None
            if found is None or found[0] == 1 or name in assigned_names(source, loader.body):
                raise _refuse(
                    f"a staged value from `{name}`, which is not a local loaded once as a "
                    "vector from global memory"
                )
            return found
    raise _refuse(f"a staged value from `{name}`, not declared in the loader")


@dataclass(frozen=True)
class _Store:
    slot: IndexForm
    pointer: str
    offset: IndexForm


def _stores(source: ParsedSource, loader: Function, param: str) -> list[_Store]:
    """Every store of the loader into its parameter ``param``, one per lane."""
    indices = analysis(source).indices(loader)
    found: list[_Store] = []
    assert loader.body is not None
    for node in walk(loader.body):
        if node.type != "identifier" or source.text_of(node) != param:
            continue
        if node.parent is not None and node.parent.type in (
            "pointer_declarator",
            "parameter_declaration",
        ):
            continue
        statement = node
        while statement.parent is not None and statement.type != "expression_statement":
            statement = statement.parent
        pair = plain_assignment(statement)
        if pair is None or not (pair[0].start_byte <= node.start_byte < pair[0].end_byte):
            raise _refuse(
                f"a loader that uses {param} at `{source.snippet(statement, 60)}`, not as the "
                "target of a plain store"
            )
        for other in walk(loader.body):
            if (
                other.type in ("if_statement", "conditional_expression", "switch_statement")
                and other.start_byte <= statement.start_byte < other.end_byte
                and not _uniform_dispatch(source, loader, other, param)
                and not _tail_guard(source, loader, other)
            ):
                raise _refuse(
                    f"a loader whose store `{source.snippet(statement, 60)}` is conditional"
                )
        target = _element(source, pair[0])
        left = strip_parens(pair[0])
        argument = left.child_by_field_name("argument")
        if argument is not None and strip_parens(argument).type == "subscript_expression":
            raise _refuse(
                f"a store `{source.snippet(pair[0], 60)}` into a tile of several dimensions "
                "(a 1-D shared array stored through a parameter of several dimensions; this rule "
                "reads 1-D tiles `S[slot]`)"
            )
        if target is None or source.text_of(target[1]) != param:
            raise _refuse(f"a store `{source.snippet(pair[0], 60)}`, not `{param}[slot]`")
        width, _, slot_node = target
        value = strip_parens(pair[1])
        lanes: list[tuple[int, int]]
        if width > 1:
            loaded = _element(source, value)
            if loaded is None or loaded[0] != width:
                raise _refuse(
                    f"a vector store `{source.snippet(statement, 60)}` of something other than "
                    "a vector load of the same width"
                )
            pointer, offset_node = loaded[1], loaded[2]
            lanes = [(lane, lane) for lane in range(width)]
        elif value.type == "field_expression":
            base = value.child_by_field_name("argument")
            member = value.child_by_field_name("field")
            lane = _LANES.get(source.text_of(member)) if member is not None else None
            if base is None or strip_parens(base).type != "identifier" or lane is None:
                raise _refuse(f"a stored value `{source.snippet(value, 60)}`")
            loaded_width, pointer, offset_node = _local_vector(source, loader, source.text_of(base))
            if lane >= loaded_width:
                raise _refuse(f"a stored value `{source.snippet(value, 60)}` past its vector")
            lanes = [(0, lane)]
        else:
            loaded = _element(source, value)
            if loaded is None or loaded[0] != 1:
                raise _refuse(
                    f"a stored value `{source.snippet(value, 60)}`, not a load from global memory"
                )
            pointer, offset_node = loaded[1], loaded[2]
            lanes = [(0, 0)]
        pointer_name = source.text_of(pointer)
        if pointer_name not in {p.name for p in loader.params if p.is_pointer}:
            raise _refuse(f"a staged value loaded from `{pointer_name}`, not a pointer parameter")
        slot, offset = indices.form(slot_node), indices.form(offset_node)
        found += [_Store(slot + s, pointer_name, offset + g) for s, g in lanes]
    return found


def _uniform_dispatch(source: ParsedSource, loader: Function, branch: Node, param: str) -> bool:
    """Whether ``branch`` is an ``if``/``else`` on the loader's parameters alone (the same
    way for every thread of the block: a vector copy where the addresses allow, else a
    scalar one) that stores into ``param`` on both sides, so the tile is filled either way
    (the stores' one layout is checked with the others)."""
    condition = branch.child_by_field_name("condition")
    alternative = branch.child_by_field_name("alternative")
    consequence = branch.child_by_field_name("consequence")
    if branch.type != "if_statement" or None in (condition, alternative, consequence):
        return False
    assert condition is not None
    known = {p.name for p in loader.params} | set(loader.template_params)
    known |= set(analysis(source).constants)
    casts = []  # `reinterpret_cast<T>`: the one call the test may make (an address's bits)
    for node in walk(condition):
        if node.type in ("assignment_expression", "update_expression"):
            return False
        if node.type == "call_expression":
            function = node.child_by_field_name("function")
            if function is None or not source.text_of(function).startswith("reinterpret_cast<"):
                return False
            casts.append(function)
        inside_cast = any(c.start_byte <= node.start_byte < c.end_byte for c in casts)
        if node.type == "identifier" and not inside_cast and source.text_of(node) not in known:
            return False

    def stores(side: Node | None) -> bool:
        return side is not None and any(
            n.type == "identifier" and source.text_of(n) == param for n in walk(side)
        )

    return stores(consequence) and stores(alternative)


def _tail_guard(source: ParsedSource, loader: Function, branch: Node) -> bool:
    """Whether ``branch`` is ``if (i < E) { .. }`` with no else, ``i`` a name and ``E`` over
    the loader's compile-time names: the guard of an unrolled loop's last turn, which skips
    slots past the tile (whose slots the stores' layout says where they come from)."""
    condition = branch.child_by_field_name("condition")
    if branch.type != "if_statement" or condition is None:
        return False
    if branch.child_by_field_name("alternative") is not None:
        return False
    inner = condition.named_children[0] if condition.named_children else None
    parts = binary(strip_parens(inner), "<") if inner is not None else None
    if parts is None or strip_parens(parts[0]).type != "identifier":
        return False
    known = set(loader.template_params) | set(analysis(source).constants)
    return all(
        n.type not in ("call_expression", "field_expression")
        and (n.type != "identifier" or source.text_of(n) in known)
        for n in walk(parts[1])
    )


def _content(form: IndexForm) -> int:
    """The gcd of a form's integer coefficients (its sign that of its first term)."""
    value = 0
    for _, coefficient in form.terms:
        value = gcd(value, coefficient)
    first = form.terms[0][1] if form.terms else 1
    return value if first > 0 else -value


def _layout(source: ParsedSource, loader: Function, param: str) -> _Layout:
    """The one layout of every store of the loader into ``param``."""
    stores = _stores(source, loader, param)
    if not stores:
        raise _refuse(f"a loader that never stores into {param}")
    strides = set(loader.template_params) | set(analysis(source).constants)
    # the stores of one vector load differ by a lane: read them together
    layouts = set()
    for store in stores:
        positions = {a for a in store.slot.atoms() if a not in strides}
        if any(
            a == "<memory>" or (a.startswith("[") and not _flat_split(a, strides))
            for a in positions
        ):
            raise _refuse(f"{param}'s slot `{store.slot}`, not affine in the loader's positions")
        layouts.add(_decompose(param, store, positions))
    if len(layouts) != 1:
        raise _refuse(f"stores into {param} in different layouts")
    return layouts.pop()


_FLAT_SPLIT = re.compile(r"\[(\w+) [%/] (\w+)\]")
"""``[i % R]`` or ``[i / R]``: a position split by a row count."""


def _flat_split(atom: str, strides: set[str]) -> bool:
    """Whether an opaque atom is one coordinate of a flat loop over a tile, ``[i % R]`` or
    ``[i / R]`` for a position ``i`` and a compile-time ``R`` (a loader whose consecutive
    threads take consecutive rows of a transposed tile): as positions they split a slot as
    a loop variable of its own would."""
    found = _FLAT_SPLIT.fullmatch(atom)
    return found is not None and found[2] in strides and found[1] not in strides


def _decompose(param: str, store: _Store, positions: set[str]) -> _Layout:
    """Split a store into components (see the module docstring)."""
    slot, offset = store.slot, store.offset
    groups: list[tuple[IndexForm, IndexForm]] = []  # (slot unit, global unit)
    for atom in sorted(positions):
        c_atom, g_atom = slot.coefficient(atom), offset.coefficient(atom)
        if any(a in positions for a in c_atom.base_atoms() | g_atom.base_atoms()):
            raise _refuse(f"{param}'s slot `{slot}`, not affine in the loader's positions")
        k = _content(c_atom)
        unit = c_atom.exact_division(k) if k else None
        g_unit = g_atom.exact_division(k) if k else None
        if unit is None or g_unit is None or g_unit == IndexForm():
            raise _refuse(f"a store into {param} at `{slot}` whose value does not follow {atom}")
        known = next((g for u, g in groups if u == unit), None)
        if known is None:
            groups.append((unit, g_unit))
        elif known != g_unit:
            raise _refuse(
                f"a store into {param} at `{slot}` from `{offset}`: positions of one slot "
                "stride move the global index differently"
            )
    linear = IndexForm()
    for atom in positions:
        linear = linear + offset.coefficient(atom) * IndexForm.atom(atom)
    if offset.only(positions) != linear:
        raise _refuse(f"a store into {param} from `{offset}`, not affine in its positions")
    rest = offset.without(positions)
    constant = slot.without(positions)
    if constant != IndexForm():
        # a vector lane's step: the slot's constant is a multiple of one component's stride
        k = _content(constant)
        unit = constant.exact_division(k)
        g_unit = next((g for u, g in groups if u == unit), None)
        if g_unit is None:
            raise _refuse(f"a store into {param} at `{slot}`, with a constant slot offset")
        rest = rest - g_unit * k
    if any(a.startswith("[") or "@" in a for a in rest.base_atoms()):
        raise _refuse(f"a store into {param} from `{offset}`, whose base is not uniform")
    unit_one = [g for g in groups if g[0] == IndexForm.constant(1)]
    others = [g for g in groups if g[0] != IndexForm.constant(1)]
    if len(unit_one) != 1 or len(others) > 1:
        raise _refuse(
            f"a store into {param} at `{slot}` in {len(groups)} components; this rule reads a "
            "column (unit stride) and at most one row stride"
        )
    high = others[0] if others else None
    return _Layout(
        store.pointer,
        high[0] if high else None,
        high[1] if high else IndexForm(),
        unit_one[0][1],
        rest,
    )


# ---------------------------------------------------------------------------------------------
# The tile loop, its loader and its readers
# ---------------------------------------------------------------------------------------------


def _form_text(form: IndexForm, names: dict[str, str]) -> str:
    """C text of a form over the loader's names, each written as ``names`` says."""
    if form == IndexForm():
        return "0"
    parts = []
    for monomial, coefficient in sorted(form.terms):
        factors = [names[a] for a in monomial]
        if abs(coefficient) != 1 or not factors:
            factors.insert(0, str(abs(coefficient)))
        parts.append(("- " if coefficient < 0 else "+ ") + " * ".join(factors))
    return " ".join(parts).removeprefix("+ ").replace("- ", "-", 1 if parts[0][0] == "-" else 0)


def _wrapped(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _offset_text(layout: _Layout, index: str, names: dict[str, str]) -> str:
    """The global offset slot ``index`` (a primary expression) holds."""
    terms = []
    if layout.high is None:
        low = index
    else:
        stride = _wrapped(_form_text(layout.high, names))
        low, high = f"{index} % {stride}", f"{index} / {stride}"
        g_high = _form_text(layout.g_high, names)
        terms.append(high if g_high == "1" else f"{high} * {_wrapped(g_high)}")
    g_low = _form_text(layout.g_low, names)
    terms.insert(0, low if g_low == "1" else f"{low} * {_wrapped(g_low)}")
    if layout.rest != IndexForm():
        terms.append(_form_text(layout.rest, names))
    return " + ".join(terms)


def _atoms_of(layout: _Layout) -> set[str]:
    found: set[str] = set()
    for form in (layout.high, layout.g_high, layout.g_low, layout.rest):
        if form is not None:
            found |= set(form.atoms())
    return found


def _call_of(statement: Node) -> Node | None:
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    call = statement.named_children[0]
    return call if call.type == "call_expression" else None


def defined_callee(source: ParsedSource, call: Node) -> Function | None:
    """The helper defined in the source that ``call`` calls."""
    function = call.child_by_field_name("function")
    if function is None:
        return None
    return analysis(source).call_graph.definition(callee_name(source.text_of(function)))


def _subscript_index(node: Node) -> Node | None:
    """``S[e]`` for an identifier ``node`` that is ``S``: ``e``; None otherwise."""
    parent = node.parent
    if parent is None or parent.type != "subscript_expression" or parent.children[0] != node:
        return None
    indices = parent.child_by_field_name("indices")
    if indices is None or len(indices.named_children) != 1:
        return None
    if parent.parent is not None and parent.parent.type == "subscript_expression":
        return None
    return indices.named_children[0]


def _index_text(source: ParsedSource, index: Node) -> str:
    text = source.text_of(index)
    return text if precedence(strip_parens(index)) == PRIMARY else f"({text})"


def _parameter_index(function: Function, name: str) -> int:
    return next(i for i, p in enumerate(function.params) if p.name == name)


def helper_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """The edits that remove the tiles a helper stages in ``loop``; NotInForm when the site
    is not in the form this rule reads (see the module docstring)."""
    an = analysis(source)
    graph = an.call_graph
    barriers = an.shared(function).barriers
    body = loop.child_by_field_name("body")
    items = [s for s in statements(body) if s.type != "comment"] if body is not None else []
    shared = {
        name: d
        for d in source.shared_declarations
        if function.node.start_byte <= d.node.start_byte < function.node.end_byte
        for name in d.names
    }
    is_barrier = [bool(s.named_children) and s.named_children[0] in barriers for s in items]
    if len(items) < 3 or not is_barrier[1] or sum(is_barrier) > 2:
        raise _refuse(
            "a tile loop that is not `loader(...); barrier; ...; barrier` (the loader's call "
            "first, one barrier after it, at most one more)"
        )
    call = _call_of(items[0])
    loader = defined_callee(source, call) if call is not None else None
    if call is None or loader is None or loader.body is None:
        raise _refuse(
            f"a tile loop whose first statement `{source.snippet(items[0], 60)}` is not a "
            "call of a helper defined here"
        )
    args = call_arguments(call)
    if len(args) != len(loader.params):
        raise _refuse(f"a call of {loader.name} with default arguments")
    if is_2d_staging(source, call, shared):
        edits, removed = tile_2d_removal(source, function, items, is_barrier, call, loader, shared)
        return edits + _unused_deletions(source, function, call, loader, removed, edits)
    staged: list[_Staged] = []
    for position, arg in enumerate(args):
        text = source.text_of(strip_parens(arg))
        if text in shared:
            param = loader.params[position].name
            assert param is not None
            staged.append(_Staged(text, param, _layout(source, loader, param)))
    if not staged:
        raise _refuse(f"a call of {loader.name} that is given no shared array")
    params = {a.param for a in staged}
    for access in an.indices(loader).accesses():
        if access.direction in ("store", "both") and access.buffer.name not in params:
            raise _refuse(
                f"a loader that also writes {access.buffer.name} "
                f"(`{source.snippet(access.node, 60)}`)"
            )
    # what the loader's names are in the kernel
    kernel_names: dict[str, str] = {}
    for position, arg in enumerate(args):
        name = loader.params[position].name
        if name is not None:
            kernel_names[name] = _wrapped(source.text_of(arg))
    for name, arg in zip(loader.template_params, template_arguments(call), strict=False):
        kernel_names[name] = _wrapped(source.text_of(arg))
    for name in an.constants:
        kernel_names.setdefault(name, name)
    needed = set()
    for array in staged:
        needed |= _atoms_of(array.layout) | {array.layout.pointer}
    missing = sorted(a for a in needed if a not in kernel_names)
    if missing:
        raise _refuse(f"a layout over {', '.join(missing)}, which the call does not pass")
    pointers = {kernel_names[a.layout.pointer] for a in staged}
    if any(not re.fullmatch(r"\w+", p) for p in pointers):
        raise _refuse("a loader given a global pointer that is an expression")
    edits: list[Edit] = []
    removed: list[Node] = [items[0]]
    last_read = items[0]
    readers: dict[str, tuple[Function, Node, list[tuple[_Staged, int]]]] = {}
    by_name = {a.name: a for a in staged}
    for node in walk(function.body) if function.body is not None else []:
        if node.type != "identifier" or source.text_of(node) not in by_name:
            continue
        if call.start_byte <= node.start_byte < call.end_byte:
            continue
        array = by_name[source.text_of(node)]
        if node.parent is not None and node.parent.type in ("array_declarator", "init_declarator"):
            continue
        if not (body is not None and items[1].end_byte <= node.start_byte < body.end_byte):
            raise _refuse(
                f"{array.name} used at line {node.start_point[0] + 1}, outside the tile "
                "loop's reads"
            )
        index = _subscript_index(node)
        parent = node.parent
        if index is not None and parent is not None and not is_written(parent):
            pointer = kernel_names[array.layout.pointer]
            offset = _offset_text(array.layout, _index_text(source, index), kernel_names)
            text = f"{pointer}[{offset}]"
            edits.append(Edit.replace(parent, text))
            last_read = max(last_read, parent, key=lambda n: n.end_byte)
            continue
        outer = parent.parent if parent is not None else None
        if parent is None or parent.type != "argument_list" or outer is None:
            raise _refuse(
                f"{array.name} used as `{source.snippet(parent or node, 60)}`, not read as "
                f"`{array.name}[e]` nor passed to a reader"
            )
        reader = defined_callee(source, outer)
        if reader is None or reader.body is None or len(graph.call_sites(reader.name)) != 1:
            raise _refuse(
                f"{array.name} passed to `{source.snippet(outer, 60)}`, not a helper called "
                "only here"
            )
        position = next(i for i, a in enumerate(call_arguments(outer)) if a == node)
        entry = readers.setdefault(reader.name, (reader, outer, []))
        entry[2].append((array, position))
        last_read = max(last_read, outer, key=lambda n: n.end_byte)
    for reader, reader_call, arrays in readers.values():
        edits += _reader_edits(source, loader, call, reader, reader_call, arrays, kernel_names)
    # the values the reads name must be those the loader saw
    between = [s for s in items[1:] if s.start_byte < last_read.end_byte]
    written = assigned_names(source, between)
    names_used = {kernel_names[a] for a in needed}
    clash = sorted(n for n in names_used if n.strip("()") in written)
    if clash:
        raise _refuse(
            f"a tile loop that writes {', '.join(clash)} between the loader's call and the "
            "last read"
        )
    edits.append(statement_deletion(source, items[0]))
    for array in staged:
        declaration = shared[array.name]
        edits.append(statement_deletion(source, declaration.node))
        removed.append(declaration.node)
    others = [n for n in shared if n not in by_name]
    if not others:
        for statement, barrier in zip(items, is_barrier, strict=True):
            if barrier:
                edits.append(statement_deletion(source, statement))
                removed.append(statement)
    return edits + _unused_deletions(source, function, call, loader, removed, edits)


def _unused_deletions(
    source: ParsedSource,
    function: Function,
    call: Node,
    loader: Function,
    removed: list[Node],
    edits: list[Edit],
) -> list[Edit]:
    """Deletions of what the removal leaves unused: declarations, compile-time locals only
    the loader's template arguments named, the loader (called once)."""
    found = [
        e
        for e in orphan_deletions(source, function, removed)
        if not any(e.start_byte == d.start_byte for d in edits)
    ]
    found += [
        e
        for e in _template_orphans(source, function, call, removed)
        if not any(e.start_byte == d.start_byte for d in edits + found)
    ]
    # the block's thread count stays (a forward rule's loader counts by it, as the expert's did)
    count = block_size_parameter(source, function, before=call.start_byte)
    assert function.body is not None
    kept = [
        s
        for s in statements(function.body)
        if s.type == "declaration" and count in declaration_names(source, s)
    ]
    found = [e for e in found if not any(e.start_byte <= s.start_byte < e.end_byte for s in kept)]
    if len(analysis(source).call_graph.call_sites(loader.name)) == 1:
        found.append(statement_deletion(source, loader.outer))
    return found


def _template_orphans(
    source: ParsedSource, function: Function, call: Node, removed: list[Node]
) -> list[Edit]:
    """Deletions of the kernel's compile-time locals only the loader's template arguments
    named (``constexpr uint rowStrideA = ...``)."""
    named = {
        source.text_of(n)
        for arg in template_arguments(call)
        for n in walk(arg)
        if n.type in ("identifier", "type_identifier")
    }
    edits = []
    for statement in statements(function.body):
        if statement.type != "declaration":
            continue
        declared = [n for n in declaration_names(source, statement) if n in named]
        if len(declared) != 1 or len(declaration_names(source, statement)) != 1:
            continue
        uses = [
            n
            for n in walk(function.node)
            if n.type in ("identifier", "type_identifier")
            and source.text_of(n) == declared[0]
            and not statement.start_byte <= n.start_byte < statement.end_byte
            and not any(r.start_byte <= n.start_byte < r.end_byte for r in removed)
        ]
        if not uses:
            edits.append(statement_deletion(source, statement))
    return edits


def _reader_edits(
    source: ParsedSource,
    loader: Function,
    loader_call: Node,
    reader: Function,
    call: Node,
    arrays: list[tuple[_Staged, int]],
    kernel_names: dict[str, str],
) -> list[Edit]:
    """A reader helper gets the global pointers instead of the shared arrays, and the values
    their layouts name."""
    assert reader.body is not None
    edits: list[Edit] = []
    taken = function_names(source, reader) | set(reader.template_params)
    # the loader's names as the reader sees them: a template argument it gets too, or a new
    # parameter
    reader_templates = {
        source.text_of(arg).strip(): name
        for name, arg in zip(reader.template_params, template_arguments(call), strict=False)
    }
    names: dict[str, str] = {}
    extra: list[tuple[str, str, str]] = []  # (type, name, argument)
    needed: list[str] = []
    for array, _ in arrays:
        for atom in sorted(_atoms_of(array.layout)):
            if atom not in needed:
                needed.append(atom)
    for atom in needed:
        argument = kernel_names[atom].strip("()") if atom in kernel_names else atom
        if argument in reader_templates:
            names[atom] = reader_templates[argument]
            continue
        if atom in loader.template_params or atom in analysis(source).constants:
            kind = "int"
        else:
            kind = loader.params[_parameter_index(loader, atom)].type
        name = atom if atom not in taken else fresh_name(taken, atom)
        taken.add(name)
        names[atom] = name
        extra.append((kind, name, kernel_names.get(atom, atom)))
    args = call_arguments(call)
    for array, position in arrays:
        param = reader.params[position]
        pointer = array.layout.pointer
        new = pointer if pointer not in taken else fresh_name(taken, pointer)
        taken.add(new)
        loader_param = loader.params[_parameter_index(loader, pointer)]
        if loader_param.base_type != param.base_type:
            raise _refuse(
                f"{reader.name} reads {param.name} as {param.base_type}, staged from "
                f"{loader_param.base_type}"
            )
        for node in walk(param.node):
            if node.type == "identifier" and source.text_of(node) == param.name:
                edits.append(Edit.replace(node, new))
        for node in walk(reader.body):
            if node.type != "identifier" or source.text_of(node) != param.name:
                continue
            index = _subscript_index(node)
            parent = node.parent
            if index is None or parent is None or is_written(parent):
                raise _refuse(
                    f"{reader.name} uses {param.name} as `{source.snippet(parent or node, 60)}`"
                    f", not read as `{param.name}[e]`"
                )
            offset = _offset_text(array.layout, _index_text(source, index), names)
            edits.append(Edit.replace(parent, f"{new}[{offset}]"))
        edits.append(Edit.replace(args[position], kernel_names[pointer].strip("()")))
    if extra:
        parameters = reader.declarator.child_by_field_name("parameters")
        assert parameters is not None
        close = parameters.end_byte - 1
        edits.append(Edit.insert(close, "".join(f", {t} {n}" for t, n, _ in extra)))
        arguments = call.child_by_field_name("arguments")
        assert arguments is not None
        edits.append(Edit.insert(arguments.end_byte - 1, "".join(f", {a}" for _, _, a in extra)))
    return edits
