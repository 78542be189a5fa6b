"""Removing 2-D tiles that a device helper stages element by element (leimao's V06 idiom).

The helper walks each tile by the block's linear thread index, one element per thread per
turn, splits the index into a tile row and column, loads the element under a bounds check
(zero past the matrix) and stores it, transposed or not, into a 2-D shared array::

    for (size_t load_idx{0U}; load_idx < (BLOCK_TILE_SIZE_Y * BLOCK_TILE_SIZE_K + NUM_THREADS
                                          - 1U) / NUM_THREADS; ++load_idx) {
      size_t const row{(thread_linear_idx + load_idx * NUM_THREADS) / BLOCK_TILE_SIZE_K};
      size_t const col{(thread_linear_idx + load_idx * NUM_THREADS) % BLOCK_TILE_SIZE_K};
      size_t const A_row_idx{blockIdx.y * BLOCK_TILE_SIZE_Y + row};
      size_t const A_col_idx{thread_block_tile_idx * BLOCK_TILE_SIZE_K + col};
      T val{static_cast<T>(0)};
      if (A_row_idx < m && A_col_idx < k) { val = A[A_row_idx * lda + A_col_idx]; }
      A_tile_T[col][row] = val;
    }

The slot ``[col][row]`` is one of the two parts ``X % C``, ``X / C`` of one linear index, so
the pair determines ``X``; the stored value, with the loop body's locals inlined, names the
thread and the turn only through ``row`` and ``col`` (checked: any other local, the loop
variable or a parameter that differs between threads refuses). So slot ``[a][b]`` holds that
value with ``col = a`` and ``row = b``: each read ``A_tile_T[a][b]`` in the tile loop becomes
``(cond ? A[off] : T{0})`` over the kernel's names (the call's arguments for the loader's
parameters and template parameters). That every slot read was stored (the turns cover the
tile, the block has ``NUM_THREADS`` threads) is what the tile loop is for and is not proved
here; the fixture's test enumerates it, the gate's check catches a tile left short. Valid
when the pointers and the offsets' names are not written between the call and the last read.
The call, its definition (called once), the arrays, the loop's barriers (no shared memory
left) and declarations left unused go.
"""

from __future__ import annotations

import re

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.indices import MEMORY
from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Declaration, Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    binary_operands,
    call_arguments,
    statements,
    strip_parens,
    template_arguments,
    walk,
)
from klineage.mechanisms._staging_once import is_written
from klineage.mechanisms._staging_reader_2d import RowRead, reader_copy_edits
from klineage.mechanisms._tiles_util import name_of, statement_deletion, substitute

__all__ = ["Tile2d", "tile_2d_removal", "tile_of"]

NEEDED = (
    "a tile loop `{ loader(.., S, ..); barrier; reads S[a][b] in the kernel; barrier }` whose "
    "loader stores each 2-D tile once, `S[X % C][X / C] = val` (or `[X / C][X % C]`) in a loop, "
    "`val` a global load `G[off]`, directly or under `if (cond)` with a zero default, over the "
    "slot's two parts and values the same for every thread"
)
_SLOTS = ("\x00slot0\x00", "\x00slot1\x00")
_BUILTINS = re.compile(r"(?:blockIdx|gridDim|blockDim)\.[xyz]")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _wrapped(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


class Tile2d:
    """What slot ``[s0][s1]`` of one staged array holds: ``cond ? pointer[offset] : zero``
    over the loader's names, the slot's parts written as ``_SLOTS``."""

    def __init__(
        self, param: str, pointer: str, offset: str, cond: str | None, zero: str, names: set[str]
    ) -> None:
        self.param = param
        self.pointer = pointer
        self.offset = offset
        self.cond = cond
        self.zero = zero
        self.names = names
        """The loader's parameters and template parameters the value names."""

    def value(self, first: str, second: str, names: dict[str, str]) -> str:
        """The value of slot ``[first][second]`` (primary expressions) over ``names``."""

        def text(form: str) -> str:
            out = form.replace(_SLOTS[0], first).replace(_SLOTS[1], second)
            return re.sub(r"\x00name:(\w+)\x00", lambda m: names[m.group(1)], out)

        load = f"{names[self.pointer]}[{text(self.offset)}]"
        if self.cond is None:
            return load
        return f"({text(self.cond)} ? {load} : {text(self.zero)})"


def _initializer(declaration: Node) -> tuple[str, Node] | None:
    """``T x{e}`` or ``T x = e`` with one name: (x, e)."""
    declarators = declaration.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    target = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if target is None or target.type != "identifier" or value is None:
        return None
    if value.type == "initializer_list":
        if len(value.named_children) != 1:
            return None
        value = value.named_children[0]
    return target.text.decode() if target.text else "", value


def _guarded(source: ParsedSource, statement: Node) -> tuple[Node, str, Node] | None:
    """``if (cond) { v = e; }`` (no else): (cond, v, e)."""
    if statement.child_by_field_name("alternative") is not None:
        return None
    condition = statement.child_by_field_name("condition")
    branch = statement.child_by_field_name("consequence")
    if condition is None or branch is None:
        return None
    inner = [s for s in statements(branch) if s.type != "comment"]
    if branch.type != "compound_statement":
        inner = [branch]
    if len(inner) != 1:
        return None
    pair = plain_assignment(inner[0])
    if pair is None or strip_parens(pair[0]).type != "identifier":
        return None
    value = condition.child_by_field_name("value") or condition
    return strip_parens(value), source.text_of(pair[0]).strip(), pair[1]


def _parts(source: ParsedSource, node: Node) -> tuple[str, str, str] | None:
    """``X / C`` or ``X % C``: (operator, X, C) with parentheses and spaces dropped."""
    node = strip_parens(node)
    for operator in ("/", "%"):
        pair = binary_operands(node, operator)
        if pair is not None:
            left, right = (re.sub(r"\s+", "", source.text_of(strip_parens(n))) for n in pair)
            return operator, left, right
    return None


def tile_of(source: ParsedSource, loader: Function, param: str) -> Tile2d:
    """The one store of the loader into its 2-D parameter ``param``, read as a ``Tile2d``."""
    assert loader.body is not None
    uses = [n for n in walk(loader.body) if n.type == "identifier" and source.text_of(n) == param]
    if len(uses) != 1:
        raise _refuse(f"a loader that uses {param} {len(uses)} times, not in one store")
    inner = uses[0].parent
    outer = inner.parent if inner is not None else None
    if (
        inner is None
        or outer is None
        or inner.type != "subscript_expression"
        or outer.type != "subscript_expression"
        or outer.child_by_field_name("argument") != inner
        or outer.parent is None
        or outer.parent.type != "assignment_expression"
        or outer.parent.child_by_field_name("left") != outer
        or outer.parent.parent is None
        or outer.parent.parent.type != "expression_statement"
    ):
        raise _refuse(
            f"a loader that uses {param} at `{source.snippet(uses[0].parent or uses[0], 60)}`, "
            f"not as the target of a plain store `{param}[i][j] = v`"
        )
    store = outer.parent.parent
    pair = plain_assignment(store)
    assert pair is not None
    # the first dimension's index is the inner subscript's
    indices = [n.child_by_field_name("indices") for n in (inner, outer)]
    slot = [
        i.named_children[0] if i is not None and len(i.named_children) == 1 else None
        for i in indices
    ]
    loop = store.parent.parent if store.parent is not None else None
    if (
        store.parent is None
        or store.parent.type != "compound_statement"
        or loop is None
        or loop.type != "for_statement"
        or loop.parent != loader.body
    ):
        raise _refuse(
            f"a store `{source.snippet(pair[0], 60)}` that is not a statement of a loop at the "
            "top of the loader"
        )
    # the loop body's locals, in order, up to the store
    locals_: dict[str, Node] = {}
    guarded: dict[str, tuple[Node, Node]] = {}
    body = [s for s in statements(store.parent) if s.type not in ("comment", "preproc_call")]
    for item in body:
        if item == store:
            continue
        if item.start_byte > store.start_byte:
            raise _refuse(f"a loader loop with `{source.snippet(item, 60)}` after its store")
        if item.type == "static_assert_declaration":
            continue
        if item.type == "declaration":
            found = _initializer(item)
            if found is None:
                raise _refuse(f"a loader local `{source.snippet(item, 60)}` without one value")
            locals_[found[0]] = found[1]
            continue
        if item.type == "if_statement":
            found_if = _guarded(source, item)
            if found_if is None or found_if[1] not in locals_ or found_if[1] in guarded:
                raise _refuse(
                    f"a loader branch `{source.snippet(item, 60)}` that is not "
                    "`if (cond) { v = load; }` over a local with a default"
                )
            guarded[found_if[1]] = (found_if[0], found_if[2])
            continue
        raise _refuse(f"a loader statement `{source.snippet(item, 60)}` in the store's loop")
    written = assigned_names(source, store.parent) - set(guarded)
    reassigned = sorted(n for n in written if n in locals_)
    if reassigned:
        raise _refuse(f"a loader local reassigned ({', '.join(reassigned)})")
    # the slot: the two parts of one linear index
    names = [source.text_of(s) if s is not None else "" for s in slot]
    split = [_parts(source, locals_[n]) if n in locals_ else None for n in names]
    if (
        split[0] is None
        or split[1] is None
        or {split[0][0], split[1][0]} != {"/", "%"}
        or split[0][1:] != split[1][1:]
    ):
        raise _refuse(
            f"a slot `{source.snippet(pair[0], 60)}` that is not `[X % C][X / C]` (or "
            "`[X / C][X % C]`) of one linear index X, each part a local"
        )
    # the stored value
    value = strip_parens(pair[1])
    cond: Node | None = None
    zero: Node | None = None
    if value.type == "identifier" and source.text_of(value) in guarded:
        cond, load = guarded[source.text_of(value)]
        zero = locals_[source.text_of(value)]
    else:
        load = value
    load = strip_parens(load)
    argument = load.child_by_field_name("argument") if load.type == "subscript_expression" else None
    offset_list = load.child_by_field_name("indices") if argument is not None else None
    pointers = {p.name for p in loader.params if p.is_pointer}
    if (
        argument is None
        or offset_list is None
        or len(offset_list.named_children) != 1
        or source.text_of(argument) not in pointers
    ):
        raise _refuse(
            f"a stored value `{source.snippet(load, 60)}` that is not a load `G[off]` from a "
            "pointer parameter (directly, or under `if (cond)` into a local with a default)"
        )
    params = {p.name for p in loader.params if p.name is not None} | set(loader.template_params)
    constants = set(analysis(source).constants)
    used: set[str] = set()

    def expand(node: Node, depth: int = 0) -> str:
        def replace(current: Node) -> str | None:
            if current.type == "type_identifier":
                name = source.text_of(current)
                if name in loader.template_params:
                    used.add(name)
                    return f"\x00name:{name}\x00"
                return None
            name = name_of(source, current)
            if name is None:
                return None
            parent = current.parent
            if (
                parent is not None
                and parent.type == "template_function"
                and current.type == "identifier"
            ):
                return None  # static_cast and the like
            if (
                parent is not None
                and parent.type == "call_expression"
                and (parent.child_by_field_name("function") == current)
            ):
                return None
            if _BUILTINS.fullmatch(name) or name in constants:
                return name
            if name == names[0] or name == names[1]:
                return _SLOTS[names.index(name)]
            if name in locals_ and name not in guarded and depth < 32:
                return _wrapped(expand(locals_[name], depth + 1))
            if name in params:
                used.add(name)
                return f"\x00name:{name}\x00"
            raise _refuse(
                f"a value stored into {param} that names `{name}` other than through the slot "
                "(a loop variable, a local set more than once or an unknown name)"
            )

        return substitute(source, node, replace)

    offset = expand(offset_list.named_children[0])
    cond_text = expand(cond) if cond is not None else None
    zero_text = expand(zero) if zero is not None else ""
    return Tile2d(param, source.text_of(argument), offset, cond_text, zero_text, used)


def _dimensions(declaration: Declaration, name: str) -> int:
    declarator = declaration.declarators[declaration.names.index(name)]
    count = 0
    while declarator is not None and declarator.type in ("array_declarator", "init_declarator"):
        if declarator.type == "array_declarator":
            count += 1
        declarator = declarator.child_by_field_name("declarator")
    return count


def is_2d_staging(source: ParsedSource, call: Node, shared: dict[str, Declaration]) -> bool:
    """Whether the loader's call is given a shared array of several dimensions."""
    for arg in call_arguments(call):
        text = source.text_of(strip_parens(arg))
        if text in shared and _dimensions(shared[text], text) > 1:
            return True
    return False


def _index_text(source: ParsedSource, index: Node) -> str:
    text = source.text_of(index)
    return text if precedence(strip_parens(index)) == PRIMARY else f"({text})"


def _row_of(use: Node, name: Node) -> Node | None:
    """The index ``a`` of a row ``S[a]`` (``use``, with ``name`` its array), else None."""
    if use.type != "subscript_expression" or use.child_by_field_name("argument") != name:
        return None
    indices = use.child_by_field_name("indices")
    if indices is None or len(indices.named_children) != 1:
        return None
    return indices.named_children[0]


def tile_2d_removal(
    source: ParsedSource,
    function: Function,
    items: list[Node],
    is_barrier: list[bool],
    call: Node,
    loader: Function,
    shared: dict[str, Declaration],
) -> tuple[list[Edit], list[Node]]:
    """The edits that rewrite the reads of the 2-D tiles the loader stages and delete the call,
    the arrays and (no shared memory left) the barriers, with the statements they delete (see
    the module docstring); the caller deletes what is left unused."""
    an = analysis(source)
    kernel_indices = an.indices(function)
    args = call_arguments(call)
    names: dict[str, str] = {}
    for param, arg in zip(loader.params, args, strict=True):
        if param.name is not None:
            names[param.name] = _wrapped(source.text_of(arg))
    for name, arg in zip(loader.template_params, template_arguments(call), strict=False):
        names[name] = _wrapped(source.text_of(arg))
    given = [
        (position, text)
        for position, arg in enumerate(args)
        if (text := source.text_of(strip_parens(arg))) in shared
    ]
    dimensions = {text: _dimensions(shared[text], text) for _, text in given}
    if set(dimensions.values()) != {2}:
        listed = ", ".join(f"{t}: {d}" for t, d in dimensions.items())
        raise _refuse(
            f"a loader given shared arrays of several dimensions in one call ({listed}); "
            "this rule reads tiles of 2 dimensions, the 1-D one tiles `S[slot]`"
        )
    tiles: dict[str, Tile2d] = {}
    for position, text in given:
        param = loader.params[position].name
        assert param is not None
        tiles[text] = tile_of(source, loader, param)
    for access in an.indices(loader).accesses():
        if access.direction in ("store", "both") and access.buffer.name not in {
            t.param for t in tiles.values()
        }:
            raise _refuse(
                f"a loader that also writes {access.buffer.name} "
                f"(`{source.snippet(access.node, 60)}`)"
            )
    # the values the reads name: passed by the call, the same for every thread
    needed: set[str] = set()
    for tile in tiles.values():
        needed |= tile.names | {tile.pointer}
    missing = sorted(n for n in needed if n not in names)
    if missing:
        raise _refuse(f"a stored value over {', '.join(missing)}, which the call does not pass")
    by_param = {p.name: i for i, p in enumerate(loader.params)}
    for name in sorted(needed):
        if name not in by_param:
            continue
        form = kernel_indices.form(args[by_param[name]])
        if kernel_indices.thread_atoms(form) or MEMORY in form.base_atoms():
            raise _refuse(
                f"a stored value over {name}, given `{source.snippet(args[by_param[name]], 40)}`"
                ", which may differ between threads"
            )
    if any(not re.fullmatch(r"\w+", names[t.pointer]) for t in tiles.values()):
        raise _refuse("a loader given a global pointer that is an expression")
    loop_body = items[0].parent
    assert loop_body is not None
    edits: list[Edit] = []
    last_read = items[0]
    row_reads: list[RowRead] = []
    for node in walk(function.body) if function.body is not None else []:
        if node.type != "identifier" or source.text_of(node) not in tiles:
            continue
        if call.start_byte <= node.start_byte < call.end_byte:
            continue
        if node.parent is not None and node.parent.type in ("array_declarator", "init_declarator"):
            continue
        name = source.text_of(node)
        if not (items[1].end_byte <= node.start_byte < loop_body.end_byte):
            raise _refuse(
                f"{name} used at line {node.start_point[0] + 1}, outside the tile loop's reads"
            )
        inner = node.parent
        outer = inner.parent if inner is not None else None
        if (
            inner is not None
            and outer is not None
            and inner.type == "subscript_expression"
            and outer.type == "subscript_expression"
            and outer.child_by_field_name("argument") == inner
            and (outer.parent is None or outer.parent.type != "subscript_expression")
            and not is_written(outer)
        ):
            first_list = inner.child_by_field_name("indices")
            second_list = outer.child_by_field_name("indices")
            assert first_list is not None and second_list is not None
            first = _index_text(source, first_list.named_children[0])
            second = _index_text(source, second_list.named_children[0])
            edits.append(Edit.replace(outer, tiles[name].value(first, second, names)))
            last_read = max(last_read, outer, key=lambda n: n.end_byte)
            continue
        use = inner if inner is not None and inner.type == "subscript_expression" else node
        row = _row_of(use, node)
        if row is not None and use.parent is not None and use.parent.type == "argument_list":
            call = use.parent.parent
            assert call is not None
            position = [a.start_byte for a in call_arguments(call)].index(use.start_byte)
            row_reads.append(RowRead(call, position, name, row))
            last_read = max(last_read, call, key=lambda n: n.end_byte)
            continue
        if use.parent is not None and use.parent.type == "argument_list":
            callee = use.parent.parent
            raise _refuse(
                f"{name} passed on as `{source.snippet(use, 40)}` to "
                f"`{source.snippet(callee.child_by_field_name('function') or callee, 60)}` "
                "(rows of a 2-D tile read through a helper; this rule rewrites reads "
                f"`{name}[a][b]` in the kernel; a reader helper needs a copy per tile that "
                "takes the global pointer and the tile's offsets)"
                if callee is not None
                else f"{name} passed on as `{source.snippet(use, 40)}`"
            )
        raise _refuse(
            f"{name} used as `{source.snippet(use.parent or use, 60)}`, not read as `{name}[a][b]`"
        )
    if row_reads:
        edits += reader_copy_edits(source, function, loader, names, tiles, row_reads)
    between = [s for s in items[1:] if s.start_byte < last_read.end_byte]
    written = assigned_names(source, between)
    kernel_names = {w for name in needed for w in re.findall(r"\w+", names[name])}
    clash = sorted(n for n in kernel_names if n in written)
    if clash:
        raise _refuse(
            f"a tile loop that writes {', '.join(clash)} between the loader's call and the "
            "last read"
        )
    removed: list[Node] = [items[0]]
    edits.append(statement_deletion(source, items[0]))
    for name in tiles:
        edits.append(statement_deletion(source, shared[name].node))
        removed.append(shared[name].node)
    if not [n for n in shared if n not in tiles]:
        for statement, barrier in zip(items, is_barrier, strict=True):
            if barrier:
                edits.append(statement_deletion(source, statement))
                removed.append(statement)
    return edits, removed
