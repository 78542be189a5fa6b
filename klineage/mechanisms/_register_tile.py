"""Forward thread coarsening of a staged tile GEMM: a register micro-tile per thread.

Register tiling is thread coarsening in two dimensions: each thread computes a ``TM x TN``
block of the output instead of one element, and the block tile (the grid) grows to match.
The detector already reads an expert's ``threadRow * TM + resIdxM`` as a thread's chunk
(:mod:`klineage.mechanisms._coarsening_forms`), so the skill mined from a register-tiled
expert is a ``thread_coarsening`` skill; its forward rule belongs here, not in
``block_tiling`` (whose rules re-tile wgmma kernels) or ``warp_tiling`` (detect only).

The form taken is a one-output-per-thread shared-memory tiled product with ``T x T`` threads
(what ``smem_staging`` writes on a naive GEMM)::

    row coordinate   Y = blockIdx.y * T + ty      (index form T·blockIdx.y + threadIdx.y)
    column coordinate X = blockIdx.x * T + tx
    float acc = 0.0f;
    __shared__ float SA[T][T], SB[T][T];
    for (p0 = 0; p0 < K; p0 += T) {
      SA[ty][tx] = p0 + tx < K ? <A at row Y, column p0 + tx> : 0;
      SB[ty][tx] = p0 + ty < K ? <B at row p0 + ty, column X> : 0;
      __syncthreads();
      for (kk = 0; kk < T; ++kk) acc += SA[ty][kk] * SB[kk][tx];
      __syncthreads();
    }
    if (Y < EY && X < EX) OUT[...] = f(acc);

It is recognized through the index forms (the tile slots, the operand reads, the coordinates),
not by names. The rewrite gives each thread ``acc[TM][TN]`` for rows ``blockIdx.y * BM + tm *
T + ty`` and columns ``blockIdx.x * BN + tn * T + tx`` (BM = TM·T, BN = TN·T; strided, so a
warp's shared reads and global stores stay contiguous and conflict-free); the tiles become
``SA[BM][BK]`` and ``SB[BK][BN]``, loaded by all threads in a strided loop with the same
zero-fill checks; the inner loop reads TM values of A and TN of B into registers and does the
outer product; the epilogue stores each output under its own check, and every launch's grid
divides by BN and BM instead of T. The sum per output stays in ascending k, so results are
bitwise the same.

The thread-dependent declarations are written again in each scope that needs them (the tile
loads, the epilogue) with the coordinate declared anew, so everything the original computed
from a coordinate (a clamped row, a row pointer, the output index) is computed from the new
one. That is sound when the values read the thread indices only through the coordinates
(the k offset of a tile load aside, always as ``p0 + t``), the rows and columns a load reads
are clamped, the tile loads fill with zero past K, and the output store is guarded by both
coordinates' extents, which the launch's grid is sized by. Anything else is refused with the
form found and the form needed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import NotInForm, binary_operands, strip_parens
from klineage.mechanisms._local_util import names_in_function, splice, statements, walk
from klineage.mechanisms._tiles_util import Locals, fresh_name, name_of, names_in, substitute

__all__ = [
    "NEEDED",
    "RegisterTile",
    "TileWriter",
    "launch_edits",
    "register_tile_edits",
    "register_tile_of",
    "staged_loops",
    "tile_products",
]

NEEDED = (
    "a shared-memory tiled product with T x T threads: coordinates `Y = blockIdx.y * T + ty`, "
    "`X = blockIdx.x * T + tx`; `SA[ty][tx] = p0 + tx < K ? A(Y, p0 + tx) : 0`, "
    "`SB[ty][tx] = p0 + ty < K ? B(p0 + ty, X) : 0`, a barrier, `acc += SA[ty][kk] * "
    "SB[kk][tx]` over kk < T, a barrier; then one store `if (Y < EY && X < EX) OUT[..] = "
    "f(acc)`, and launches of grid `dim3((EX + T - 1) / T, (EY + T - 1) / T[, z])`, block "
    "`dim3(T, T)`"
)
_THREAD = {"threadIdx.x", "threadIdx.y", "threadIdx.z"}
_REMAPPED = _THREAD | {"blockIdx.x", "blockIdx.y", "gridDim.x", "gridDim.y", "gridDim.z"}


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _loop_body(loop: Node) -> list[Node]:
    body = loop.child_by_field_name("body")
    if body is None:
        return []
    if body.type != "compound_statement":
        return [body]
    return [s for s in statements(body) if s.type != "preproc_call"]


def _is_barrier(source: ParsedSource, node: Node) -> bool:
    return " ".join(source.text_of(node).split()) in ("__syncthreads();", "__syncthreads ();")


def staged_loops(source: ParsedSource, function: Function) -> list[Node]:
    """Top-level loops of a kernel whose own statements store into shared memory and wait at
    a barrier, around a nested loop: the shape of a staged tile loop (checked in full by
    :func:`register_tile_of`)."""
    if function.body is None:
        return []
    indices = analysis(source).indices(function)
    shared_stores = [
        a.node for a in indices.accesses() if a.buffer.space == "shared" and a.direction == "store"
    ]
    found = []
    for loop in statements(function.body):
        if loop.type != "for_statement":
            continue
        body = _loop_body(loop)
        direct = [
            s
            for s in body
            if any(s.start_byte <= n.start_byte < s.end_byte for n in shared_stores)
            and s.type == "expression_statement"
        ]
        if (
            direct
            and any(_is_barrier(source, s) for s in body)
            and any(s.type == "for_statement" for s in body)
        ):
            found.append(loop)
    return found


def tile_products(
    source: ParsedSource,
) -> Iterator[tuple[Function, Node, RegisterTile | NotInForm]]:
    """Every kernel's staged tile loops, each read as the tile product the rewrites take, or
    the NotInForm saying what form it is in instead."""
    for function in source.kernels:
        for loop in staged_loops(source, function):
            try:
                yield function, loop, register_tile_of(source, function, loop)
            except NotInForm as why:
                yield function, loop, why


@dataclass(frozen=True)
class _Decl:
    name: str
    node: Node
    value: Node


@dataclass(frozen=True)
class RegisterTile:
    """A staged tile loop in the form taken, with what the rewrite needs."""

    function: Function
    loop: Node
    tile: int
    """T: threads per block side, the tiles' extents and the k loop's step."""
    k_var: str
    k_bound: Node
    tiles: tuple[str, str]
    element: str
    """The tiles' element type."""
    stores: tuple[Node, Node]
    """The statements storing SA and SB."""
    values: tuple[Node, Node]
    inner: Node
    acc: _Decl
    acc_type: str
    epilogue: Node
    prologue: tuple[_Decl, ...]
    """Every declaration before the loop other than the tiles' and the accumulator's."""
    aliases: dict[str, str]
    """``x``/``y`` -> the local holding exactly ``threadIdx.x``/``.y`` (where there is one)."""
    coords: dict[str, _Decl]
    """``x``/``y`` -> the coordinate declaration."""
    extents: dict[str, str]
    """``x``/``y`` -> the extent text the store's guard bounds the coordinate by."""
    launches: tuple[Launch, ...]


def _declaration(source: ParsedSource, node: Node) -> _Decl | None:
    if node.type != "declaration":
        return None
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    name = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    while name is not None and name.type == "pointer_declarator":
        name = name.child_by_field_name("declarator")
    if name is None or value is None or name.type != "identifier":
        return None
    return _Decl(source.text_of(name), node, value)


def _form_is(form: IndexForm, expected: IndexForm) -> bool:
    return form == expected and not form.opaque


def _atom(name: str) -> IndexForm:
    return IndexForm.atom(name)


def register_tile_of(source: ParsedSource, function: Function, loop: Node) -> RegisterTile:
    """The staged tile loop ``loop`` of ``function`` in the form the rewrite takes; raises
    :class:`NotInForm` with the form found otherwise."""
    assert function.body is not None
    indices = analysis(source).indices(function)
    locals_ = Locals(source, function)
    body = statements(function.body)
    position = next(i for i, s in enumerate(body) if s == loop)
    before, after = body[:position], body[position + 1 :]
    if function.template_params:
        raise _refuse("a template kernel")
    for node in walk(function.body):
        if name_of(source, node) in ("gridDim.x", "gridDim.y", "gridDim.z"):
            raise _refuse("a kernel reading gridDim, which the rewrite shrinks")
    # -- the k loop -------------------------------------------------------------------------
    k_loop = indices.loop_of(loop)
    if k_loop is None or k_loop.step is None or k_loop.step.value is None or k_loop.bound is None:
        raise _refuse("a staged loop that is not `for (p0 = 0; p0 < K; p0 += T)`")
    tile = k_loop.step.value
    if k_loop.init.value != 0 or not k_loop.bound_uniform or tile < 2:
        raise _refuse("a staged loop that is not `for (p0 = 0; p0 < K; p0 += T)`")
    k_atom = k_loop.atom
    statements_in = _loop_body(loop)
    kinds = ["barrier" if _is_barrier(source, s) else s.type for s in statements_in]
    if kinds != [
        "expression_statement",
        "expression_statement",
        "barrier",
        "for_statement",
        "barrier",
    ]:
        raise _refuse(
            "a staged loop whose turn is not two tile stores, a barrier, the product loop and "
            "a barrier"
        )
    x, y = _atom("threadIdx.x"), _atom("threadIdx.y")
    slot = x + y * tile
    # -- the product loop: acc += SA[ty][kk] * SB[kk][tx] --------------------------------------
    inner = statements_in[3]
    inner_var = indices.loop_of(inner)
    product = _loop_body(inner)
    if (
        inner_var is None
        or inner_var.init.value != 0
        or inner_var.step is None
        or inner_var.step.value != 1
        or inner_var.trip != tile
        or len(product) != 1
        or product[0].type != "expression_statement"
    ):
        raise _refuse("a product loop that is not one statement over kk < T")
    update = product[0].named_children[0] if product[0].named_children else None
    if (
        update is None
        or update.type != "assignment_expression"
        or (source.text_of(update.child_by_field_name("operator") or update) != "+=")
    ):
        raise _refuse("an accumulation that is not `acc += ...`")
    target = update.child_by_field_name("left")
    right = update.child_by_field_name("right")
    assert target is not None and right is not None
    sides = binary_operands(strip_parens(right), "*")
    if target.type != "identifier" or sides is None:
        raise _refuse("an accumulation that is not a plain sum of products")
    acc_name = source.text_of(target)
    loads = {a.node: a for a in indices.accesses() if a.buffer.space == "shared"}
    left_load, right_load = (loads.get(strip_parens(s)) for s in sides)
    kk = _atom(inner_var.atom)
    if (
        left_load is None
        or right_load is None
        or not _form_is(left_load.offset, kk + y * tile)
        or not _form_is(right_load.offset, kk * tile + x)
        or left_load.buffer.name == right_load.buffer.name
    ):
        raise _refuse(
            "an accumulation that is not `acc += SA[ty][kk] * SB[kk][tx]` over two shared tiles"
        )
    tiles = (left_load.buffer.name, right_load.buffer.name)
    element = left_load.buffer.element_type
    for load in (left_load, right_load):
        extents = [source.text_of(e) if e is not None else "" for e in load.buffer.extents]
        if extents != [str(tile), str(tile)] or load.buffer.element_type != element:
            raise _refuse(f"a tile {load.buffer.name}[{']['.join(extents)}], not [T][T]")
    # -- the tile stores ----------------------------------------------------------------------
    stored: dict[str, tuple[Node, Node]] = {}
    for statement in statements_in[:2]:
        assignment = statement.named_children[0]
        left = assignment.child_by_field_name("left")
        value = assignment.child_by_field_name("right")
        store = next(
            (
                a
                for a in indices.accesses()
                if a.direction == "store" and left is not None and a.node == left
            ),
            None,
        )
        if (
            assignment.type != "assignment_expression"
            or source.text_of(assignment.child_by_field_name("operator") or assignment) != "="
            or store is None
            or value is None
            or store.buffer.name not in tiles
            or not _form_is(store.offset, slot)
        ):
            raise _refuse("a tile store that is not `S[ty][tx] = value`")
        stored[store.buffer.name] = (statement, value)
    if set(stored) != set(tiles):
        raise _refuse("tile stores that do not fill both tiles the product reads")
    # -- the accumulator, the prologue, the coordinates -----------------------------------------
    prologue: list[_Decl] = []
    acc: _Decl | None = None
    acc_type = ""
    for statement in before:
        if statement.type == "declaration" and "__shared__" in source.text_of(statement):
            names = [n for n in names_in(source, statement) if n in tiles]
            if not names:
                raise _refuse("other shared memory than the two tiles")
            continue
        decl = _declaration(source, statement)
        if decl is None:
            raise _refuse(
                f"a kernel with {source.snippet(statement, 60)!r} before its tile loop, not "
                "only declarations"
            )
        if decl.name in locals_.assigned and decl.name != acc_name:
            raise _refuse(f"a kernel reassigning {decl.name}")
        if decl.name == acc_name:
            acc = decl
            type_node = statement.child_by_field_name("type")
            acc_type = source.text_of(type_node) if type_node is not None else ""
            continue
        prologue.append(decl)
    if acc is None or acc_type != "float" or not _is_constant(indices, acc.value):
        raise _refuse(
            f"an accumulator {acc_name} not declared `float {acc_name} = constant` before the loop"
        )
    aliases: dict[str, str] = {}
    coords: dict[str, _Decl] = {}
    for decl in prologue:
        form = indices.form(decl.value)
        for axis, thread in (("x", x), ("y", y)):
            if _form_is(form, thread):
                aliases.setdefault(axis, decl.name)
            if _form_is(form, _atom(f"blockIdx.{axis}") * tile + thread):
                if axis in coords:
                    raise _refuse(f"two {axis} coordinates, {coords[axis].name} and {decl.name}")
                coords[axis] = decl
    for axis in ("x", "y"):
        if axis not in coords:
            raise _refuse(f"a kernel without a local `blockIdx.{axis} * {tile} + threadIdx.{axis}`")
    by_name = {d.name: d for d in prologue}
    special = {coords["x"].name, coords["y"].name, *aliases.values()}
    for decl in prologue:
        if decl.name in special:
            continue
        direct = names_in(source, decl.value) & _REMAPPED
        if direct:
            raise _refuse(
                f"{decl.name} reading {', '.join(sorted(direct))} itself, not through the "
                "coordinates"
            )
    # -- the store ----------------------------------------------------------------------------
    if len(after) != 1 or after[0].type != "if_statement":
        raise _refuse("a kernel that does not end in one guarded store after its tile loop")
    epilogue = after[0]
    extents = _guard_extents(source, epilogue, coords)
    consequence = epilogue.child_by_field_name("consequence")
    if (
        epilogue.child_by_field_name("alternative") is not None
        or consequence is None
        or consequence.type != "expression_statement"
        or not consequence.named_children
        or consequence.named_children[0].type != "assignment_expression"
    ):
        raise _refuse("an output written otherwise than by one store under the guard")
    acc_uses = [
        n for n in walk(epilogue) if n.type == "identifier" and source.text_of(n) == acc_name
    ]
    out_target = consequence.named_children[0].child_by_field_name("left")
    if len(acc_uses) != 1 or out_target is None or acc_name in names_in(source, out_target):
        raise _refuse(f"a store that does not read {acc_name} once, as the stored value")
    uses = [
        n for n in walk(function.body) if n.type == "identifier" and source.text_of(n) == acc_name
    ]
    if len(uses) != 3:  # the declaration, the product and the store
        raise _refuse(f"{acc_name} used other than in the product and the store")
    # -- what the loads and the store read --------------------------------------------------
    tile_a, tile_b = tiles
    value_a, value_b = stored[tile_a][1], stored[tile_b][1]
    _check_load(
        source,
        indices,
        locals_,
        value_a,
        "y",
        "x",
        k_loop.name,
        k_atom,
        coords,
        aliases,
        extents,
        by_name,
        k_loop.bound,
    )
    _check_load(
        source,
        indices,
        locals_,
        value_b,
        "x",
        "y",
        k_loop.name,
        k_atom,
        coords,
        aliases,
        extents,
        by_name,
        k_loop.bound,
    )
    own = {f"{b}.{a}" for a in "xy" for b in ("threadIdx", "blockIdx")} | set(aliases.values())
    if locals_.depends_on(epilogue, own, stop={coords["x"].name, coords["y"].name, acc_name}):
        raise _refuse("a store reading the thread index other than through the coordinates")
    launches = tuple(source.launches_of(function))
    if not launches:
        raise _refuse(f"a kernel with no launch of {function.name} in this file")
    found = RegisterTile(
        function=function,
        loop=loop,
        tile=tile,
        k_var=k_loop.name,
        k_bound=k_loop.bound,
        tiles=tiles,
        element=element,
        stores=(stored[tile_a][0], stored[tile_b][0]),
        values=(value_a, value_b),
        inner=inner,
        acc=acc,
        acc_type=acc_type,
        epilogue=epilogue,
        prologue=tuple(prologue),
        aliases=aliases,
        coords=coords,
        extents=extents,
        launches=launches,
    )
    for launch in launches:
        launch_edits(source, launch, found, tile, tile)
    return found


def _is_constant(indices: FunctionIndices, node: Node) -> bool:
    text = indices.source.text_of(node).rstrip("fF")
    try:
        float(text)
    except ValueError:
        return False
    return True


def _conjuncts(node: Node) -> list[Node]:
    node = strip_parens(node)
    sides = binary_operands(node, "&&")
    if sides is None:
        return [node]
    return _conjuncts(sides[0]) + _conjuncts(sides[1])


def _guard_extents(
    source: ParsedSource, epilogue: Node, coords: dict[str, _Decl]
) -> dict[str, str]:
    clause = epilogue.child_by_field_name("condition")
    values = statements(clause) if clause is not None else []
    found: dict[str, str] = {}
    for term in _conjuncts(values[0]) if len(values) == 1 else []:
        sides = binary_operands(term, "<")
        if sides is None:
            continue
        for axis, decl in coords.items():
            if source.text_of(strip_parens(sides[0])) == decl.name:
                found[axis] = source.text_of(sides[1])
    if set(found) != {"x", "y"}:
        raise _refuse("an output store whose guard is not `Y < EY && X < EX` over both coordinates")
    return found


def _check_load(
    source: ParsedSource,
    indices: FunctionIndices,
    locals_: Locals,
    value: Node,
    axis: str,
    k_axis: str,
    k_var: str,
    k_atom: str,
    coords: dict[str, _Decl],
    aliases: dict[str, str],
    extents: dict[str, str],
    by_name: dict[str, _Decl],
    k_bound: Node,
) -> None:
    """A tile load ``p0 + t < K ? G(coordinate, p0 + t) : 0``: the thread's ``axis``
    coordinate read only through a clamp of it, the other axis not at all, the k offset
    ``t`` (``threadIdx.<k_axis>``) and ``p0`` only in ``p0 + t``."""
    other = "y" if axis == "x" else "x"
    load = source.snippet(value, 60)
    others = {f"threadIdx.{other}", f"blockIdx.{other}", coords[other].name}
    if other in aliases:
        others.add(aliases[other])
    if other != k_axis and locals_.depends_on(value, others):
        raise _refuse(f"a tile load {load!r} reading the other axis' coordinate")
    own = {f"threadIdx.{axis}", f"blockIdx.{axis}"} | (
        {aliases[axis]} if axis in aliases else set()
    )
    if locals_.depends_on(value, own, stop={coords[axis].name, k_var}):
        raise _refuse(
            f"a tile load {load!r} reading the thread index other than through the "
            f"{coords[axis].name} coordinate"
        )
    # zero fill past K: `p0 + t < K ? ... : 0`
    node = strip_parens(value)
    condition = node.child_by_field_name("condition")
    alternative = node.child_by_field_name("alternative")
    sides = binary_operands(strip_parens(condition), "<") if condition is not None else None
    k_sum = _atom(k_atom) + _atom(f"threadIdx.{k_axis}")
    if (
        node.type != "conditional_expression"
        or sides is None
        or alternative is None
        or not _is_constant(indices, alternative)
        or float(source.text_of(alternative).rstrip("fF")) != 0.0
        or not _form_is(indices.form(sides[0]), k_sum)
        or source.text_of(sides[1]) != source.text_of(k_bound)
    ):
        raise _refuse(f"a tile load {load!r} not zero-filled past K as `p0 + t < K ? ... : 0`")
    k_names = {k_var, f"threadIdx.{k_axis}"} | ({aliases[k_axis]} if k_axis in aliases else set())
    for use in walk(value):
        if name_of(source, use) not in k_names or use.type not in (
            "identifier",
            "field_expression",
        ):
            continue
        parent = use.parent
        while parent is not None and parent.type == "parenthesized_expression":
            parent = parent.parent
        if parent is None or not _form_is(indices.form(parent), k_sum):
            raise _refuse(
                f"a tile load {load!r} reading {name_of(source, use)} other than in `p0 + t`"
            )
    # the coordinate reaches the load only clamped to its extent
    coordinate = coords[axis].name
    for name in _needed(source, value, by_name):
        decl = by_name[name]
        if coordinate in names_in(source, decl.value) and not _is_clamp(
            source, decl.value, coordinate, extents[axis]
        ):
            raise _refuse(
                f"a tile load reading {coordinate} through {name} unclamped; a larger block "
                "tile would read rows or columns the original never read"
            )
    if coordinate in names_in(source, value):
        raise _refuse(f"a tile load {load!r} reading {coordinate} unclamped")


def _is_clamp(source: ParsedSource, value: Node, coordinate: str, extent: str) -> bool:
    """``Y < E ? Y : E - 1``."""
    node = strip_parens(value)
    if node.type != "conditional_expression":
        return False
    condition = node.child_by_field_name("condition")
    chosen = node.child_by_field_name("consequence")
    alternative = node.child_by_field_name("alternative")
    sides = binary_operands(strip_parens(condition), "<") if condition is not None else None

    def text(node: Node | None) -> str:
        return " ".join(source.text_of(strip_parens(node)).split()) if node else ""

    return (
        sides is not None
        and text(sides[0]) == coordinate
        and text(sides[1]) == extent
        and text(chosen) == coordinate
        and text(alternative).replace(" ", "") == f"{extent}-1".replace(" ", "")
    )


def _needed(source: ParsedSource, node: Node, by_name: dict[str, _Decl]) -> list[str]:
    """The prologue locals ``node`` reads, directly or through others, in declaration order."""
    seen: set[str] = set()
    stack = [n for n in names_in(source, node) if n in by_name]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack += [n for n in names_in(source, by_name[name].value) if n in by_name]
    order = list(by_name)
    return sorted(seen, key=order.index)


# ---------------------------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------------------------


def _thread_dependent(source: ParsedSource, tile: RegisterTile) -> set[str]:
    """The prologue locals that differ between threads or blocks of a row or column."""
    dependent: set[str] = set()
    for decl in tile.prologue:  # in order: a later one depends on earlier ones
        names = names_in(source, decl.value)
        if names & _REMAPPED or names & dependent:
            dependent.add(decl.name)
    return dependent


class TileWriter:
    """Pieces of a rewritten tile kernel: coordinates declared anew at a position within a
    larger block tile, the thread-dependent declarations an expression needs, names
    replaced."""

    def __init__(self, source: ParsedSource, tile: RegisterTile) -> None:
        self.source = source
        self.tile = tile
        self.by_name = {d.name: d for d in tile.prologue}
        self.dependent = _thread_dependent(source, tile)

    def uniform(self) -> list[str]:
        """The prologue declarations the same for every thread of the grid (and the thread
        index aliases): kept once at the top of the kernel."""
        return [
            self.source.text_of(decl.node)
            for decl in self.tile.prologue
            if decl.name not in self.dependent or decl.name in self.tile.aliases.values()
        ]

    def coordinate(self, axis: str, position: str, extent: int) -> str:
        """The coordinate's declaration at ``position`` within a block tile of ``extent``."""
        decl = self.tile.coords[axis]
        type_node = decl.node.child_by_field_name("type")
        kind = self.source.text_of(type_node) if type_node is not None else "int64_t"
        text = f"({kind})blockIdx.{axis} * {extent} + {position}"
        return splice(self.source, decl.node.start_byte, decl.node.end_byte, [(decl.value, text)])

    def scoped(self, node: Node, rebind: dict[str, str], pad: str) -> list[str]:
        """The thread-dependent declarations ``node`` needs, the coordinates rebound."""
        lines = []
        for name in _needed(self.source, node, self.by_name):
            if name not in self.dependent:
                continue
            if name in rebind:
                lines.append(pad + rebind[name])
            elif name not in self.tile.aliases.values():
                lines.append(pad + self.source.text_of(self.by_name[name].node))
        return lines

    def tile_loads(
        self,
        names: tuple[str, str, str],
        first: str,
        sizes: tuple[int, int, int],
        pad: str,
        write: Callable[[Node, Callable[[Node], str]], str] | None = None,
    ) -> list[str]:
        """The loops filling both tiles (``bm x bk`` of A, ``bk x bn`` of B) with the
        original loads, every thread from its linear index ``first`` by ``T * T``. ``names``:
        the loop's index, row and column. ``write(value, rename)`` writes a value another way
        (``rename`` gives a node's text with the thread's k offset replaced)."""
        tile, (load, row, col), (bm, bn, bk) = self.tile, names, sizes
        t = tile.tile
        taken = names_in_function(self.source, tile.function) | {load, row, col}
        turn = fresh_name(taken, f"{load}0")
        lines: list[str] = []
        for target, value, rows, cols, axis in (
            (tile.tiles[0], tile.values[0], bm, bk, "y"),
            (tile.tiles[1], tile.values[1], bk, bn, "x"),
        ):
            k_axis = "x" if axis == "y" else "y"
            k_position, position = (col, row) if axis == "y" else (row, col)
            rebind = {
                tile.coords[axis].name: self.coordinate(axis, position, bm if axis == "y" else bn)
            }
            mapping = {f"threadIdx.{k_axis}": k_position}
            if k_axis in tile.aliases:
                mapping[tile.aliases[k_axis]] = k_position

            def rename(node: Node, mapping: dict[str, str] = mapping) -> str:
                return self.renamed(node, mapping)

            loaded = write(value, rename) if write is not None else rename(value)
            total, turn_step = f"{rows} * {cols}", f"{t} * {t}"
            if rows * cols % (t * t) == 0:
                # turns counted from 0: a compile-time trip count, so the loop unrolls and a
                # thread's loads are in flight together (from its own index, each turn's store
                # waited for its load)
                head = [
                    f"{pad}for (int {turn} = 0; {turn} < {total}; {turn} += {turn_step}) {{",
                    f"{pad * 2}const int {load} = {turn} + {first};",
                ]
            else:
                head = [
                    f"{pad}for (int {load} = {first}; {load} < {total}; {load} += {turn_step}) {{"
                ]
            lines += [
                f"{pad}#pragma unroll",
                *head,
                f"{pad * 2}const int {row} = {load} / {cols};",
                f"{pad * 2}const int {col} = {load} % {cols};",
                *self.scoped(value, rebind, pad * 2),
                f"{pad * 2}{target}[{row}][{col}] = {loaded};",
                f"{pad}}}",
            ]
        return lines

    def renamed(self, node: Node, mapping: dict[str, str]) -> str:
        """``node``'s text with the names (and built-ins) of ``mapping`` replaced."""
        source = self.source

        def replace(current: Node) -> str | None:
            name = name_of(source, current)
            if name in mapping and not (
                current.type == "identifier"
                and current.parent is not None
                and current.parent.type == "field_expression"
            ):
                return mapping[name]
            return None

        return substitute(source, node, replace)


def register_tile_edits(
    source: ParsedSource, tile: RegisterTile, tm: int, tn: int, bk: int
) -> list[Edit]:
    """The edits writing ``tile``'s kernel with a ``tm x tn`` register tile per thread and
    ``bk`` columns of A (rows of B) a stage, and its launches' grids."""
    t = tile.tile
    bm, bn = tm * t, tn * t
    function = tile.function
    assert function.body is not None
    used = names_in_function(source, function)
    i_m, i_n = fresh_name(used, "tm"), fresh_name(used, "tn")
    load, row, col = fresh_name(used, "ld"), fresh_name(used, "ld_row"), fresh_name(used, "ld_col")
    frag_a, frag_b = fresh_name(used, "frag_a"), fresh_name(used, "frag_b")
    indent = source.indent_of(tile.loop.start_byte)
    unit = "  "
    tx = tile.aliases.get("x", "threadIdx.x")
    ty = tile.aliases.get("y", "threadIdx.y")
    acc = tile.acc.name
    tile_a, tile_b = tile.tiles

    writer = TileWriter(source, tile)
    coordinate, scoped, renamed = writer.coordinate, writer.scoped, writer.renamed

    # the declarations kept in the kernel's scope: those the same for every thread (and aliases)
    out: list[str] = writer.uniform()
    init = source.text_of(tile.acc.value)
    out += [
        f"float {acc}[{tm}][{tn}];",
        "#pragma unroll",
        f"for (int {i_m} = 0; {i_m} < {tm}; ++{i_m}) {{",
        f"{unit}#pragma unroll",
        f"{unit}for (int {i_n} = 0; {i_n} < {tn}; ++{i_n}) {acc}[{i_m}][{i_n}] = {init};",
        "}",
        f"__shared__ {tile.element} {tile_a}[{bm}][{bk}];",
        f"__shared__ {tile.element} {tile_b}[{bk}][{bn}];",
    ]
    k_var = tile.k_var
    k_step = tile.loop.child_by_field_name("update")
    k_body = tile.loop.child_by_field_name("body")
    assert k_step is not None and k_body is not None
    header = splice(
        source, tile.loop.start_byte, k_body.start_byte, [(k_step, f"{k_var} += {bk}")]
    ).rstrip()
    flat = f"{ty} * {t} + {tx}"
    loads = writer.tile_loads((load, row, col), flat, (bm, bn, bk), unit)
    inner_body = tile.inner.child_by_field_name("body")
    inner_bound = tile.inner.child_by_field_name("condition")
    inner_var = analysis(source).indices(function).loop_of(tile.inner)
    assert inner_body is not None and inner_bound is not None and inner_var is not None
    sides = binary_operands(inner_bound, "<")
    if sides is None or source.text_of(sides[1]) != str(t):
        raise _refuse("a product loop whose bound is not written `kk < T`")
    inner_header = splice(
        source, tile.inner.start_byte, inner_body.start_byte, [(sides[1], str(bk))]
    ).rstrip()
    k_inner = inner_var.name
    out += [
        f"{header} {{",
        *loads,
        f"{unit}__syncthreads();",
        f"{unit}#pragma unroll",
        f"{unit}{inner_header} {{",
        f"{unit * 2}{tile.element} {frag_a}[{tm}];",
        f"{unit * 2}{tile.element} {frag_b}[{tn}];",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {i_m} = 0; {i_m} < {tm}; ++{i_m}) "
        f"{frag_a}[{i_m}] = {tile_a}[{i_m} * {t} + {ty}][{k_inner}];",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {i_n} = 0; {i_n} < {tn}; ++{i_n}) "
        f"{frag_b}[{i_n}] = {tile_b}[{k_inner}][{i_n} * {t} + {tx}];",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {i_m} = 0; {i_m} < {tm}; ++{i_m}) {{",
        f"{unit * 3}#pragma unroll",
        f"{unit * 3}for (int {i_n} = 0; {i_n} < {tn}; ++{i_n}) "
        f"{acc}[{i_m}][{i_n}] += {frag_a}[{i_m}] * {frag_b}[{i_n}];",
        f"{unit * 2}}}",
        f"{unit}}}",
        f"{unit}__syncthreads();",
        "}",
    ]
    rebind = {
        tile.coords["y"].name: coordinate("y", f"{i_m} * {t} + {ty}", bm),
        tile.coords["x"].name: coordinate("x", f"{i_n} * {t} + {tx}", bn),
    }
    out += [
        "#pragma unroll",
        f"for (int {i_m} = 0; {i_m} < {tm}; ++{i_m}) {{",
        f"{unit}#pragma unroll",
        f"{unit}for (int {i_n} = 0; {i_n} < {tn}; ++{i_n}) {{",
        *scoped(tile.epilogue, rebind, unit * 2),
        f"{unit * 2}{renamed(tile.epilogue, {acc: f'{acc}[{i_m}][{i_n}]'})}",
        f"{unit}}}",
        "}",
    ]
    body = statements(function.body)
    start, end = body[0].start_byte, body[-1].end_byte
    text = ("\n" + indent).join(line.rstrip() for line in out)
    edits = [Edit(start, end, text)]
    for launch in tile.launches:
        edits += launch_edits(source, launch, tile, bm, bn)
    return edits


def launch_edits(
    source: ParsedSource, launch: Launch, tile: RegisterTile, bm: int, bn: int
) -> list[Edit]:
    """The launch's grid for a block tile of ``bm x bn`` outputs instead of ``T x T``; raises
    NotInForm unless its block is ``dim3(T, T)`` and its grid ``dim3((EX + T - 1) / T, (EY + T
    - 1) / T[, z])``."""
    t = tile.tile
    grid, block = launch.grid, launch.block
    found = "a launch " + (source.snippet(launch.node, 80) if launch.node else "")
    if grid is None or block is None:
        raise _refuse(f"{found} without a grid and a block")
    block_args = _dim3_args(source, block)
    if (
        block_args is None
        or [source.text_of(a) for a in block_args[:2]] != [str(t), str(t)]
        or (len(block_args) == 3 and source.text_of(block_args[2]) != "1")
    ):
        raise _refuse(f"{found} whose block is not dim3({t}, {t})")
    grid_args = _dim3_args(source, grid)
    if grid_args is None or len(grid_args) < 2:
        raise _refuse(f"{found} whose grid is not dim3(gx, gy[, gz])")
    edits = []
    for argument, axis, extent in ((grid_args[0], "x", bn), (grid_args[1], "y", bm)):
        divisions = []
        for node in walk(argument):
            sides = binary_operands(node, "/") if node.type == "binary_expression" else None
            if sides is None or source.text_of(sides[1]) != str(t):
                continue
            total = binary_operands(strip_parens(sides[0]), "+")
            if total is None or source.text_of(total[1]) != str(t - 1):
                continue
            if " ".join(source.text_of(total[0]).split()) != tile.extents[axis]:
                continue
            divisions.append((node, source.text_of(total[0])))
        if len(divisions) != 1:
            raise _refuse(
                f"{found} whose grid {axis} is not ({tile.extents[axis]} + {t - 1}) / {t}"
            )
        node, total_text = divisions[0]
        edits.append(Edit.replace(node, f"({total_text} + {extent - 1}) / {extent}"))
    return edits


def _dim3_args(source: ParsedSource, node: Node) -> list[Node] | None:
    node = strip_parens(node)
    if node.type != "call_expression":
        return None
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    if callee is None or arguments is None or source.text_of(callee) != "dim3":
        return None
    return [a for a in arguments.named_children if a.type != "comment"]
