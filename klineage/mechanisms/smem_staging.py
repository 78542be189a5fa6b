"""Shared-memory staging of tiles vs direct global loads.

A block that reuses a tile of its operands (every row of an output tile reads the same
slice of B) loads the tile once, cooperatively, into ``__shared__`` memory, waits at a
barrier, and computes from there; each global element is then read once per block instead
of once per thread that needs it.

- detect: loops in kernels that store into a ``__shared__`` array and hold a
  ``__syncthreads()``; the canonical staged tile loop (see :mod:`klineage.mechanisms._staging`)
  is removable, and so is a tile staged once by a loop of ``S[i / V] = load(g + i)`` stores
  (through casts of the dynamic buffer too: :mod:`klineage.mechanisms._staging_once`; the
  ``row_vectors`` form below writes vectors staged once again) or a 2-D tile staged once and
  read in another order, the shared-memory transpose (:mod:`klineage.mechanisms._staging_tile`,
  no forward rule), or 2-D tiles stored in a turn by a loader loop that spreads the rows over
  the block, also in a ``__device__`` body the kernel calls
  (:mod:`klineage.mechanisms._staging_loader`, no forward rule); any other staging (tiles
  fed by ``cp.async``, read through ``ldmatrix``, stored by helpers, under a condition...)
  is reported with the reason it is not;
- remove (canonical form): every read ``As[ty][k]`` becomes the stored expression evaluated
  for the thread that stored that element (``tx`` replaced by ``k``); the stores, both
  barriers and the tile declarations go. The loop structure stays: a blocked loop over
  direct global loads, the state this mechanism's ``apply`` starts from;
- apply, two canonical forms:

  * a *blocked loop without staging*, ``for (t...) { for (int k = 0; k < T; ++k) acc += X *
    Y; }`` in a kernel launched with a T x T block, where X varies with the thread only along
    ``threadIdx.y`` and Y only along ``threadIdx.x`` (or the other way round): X is staged
    as ``As[ty][tx] = X[k := tx]`` and read as ``As[ty][k]`` (the inverse of the removal);
  * the *naive GEMM*, one thread per output element of a linear index ``i`` decomposed into
    ``row``/``col`` (and a batch index), with a dot-product loop ``for (p = 0; p < K; ++p)
    acc += X * Y`` (a single or batched matrix product, one output a thread): the kernel is
    re-mapped to T x T blocks of the output (``blockIdx.z`` for the batch), the loop becomes
    a loop over K in steps of T that stages bounds-checked tiles (zero past K), threads
    outside the output clamp their row and column (they still load tiles for the others) and
    do not store, and ``run`` launches a 2-D (3-D) grid of T x T blocks. Carrier
    ``tile_size`` (8, 16 or 32; default 16);
  * the *naive transpose*, one thread per output element ``y[i]`` reading ``x`` with the
    output's fastest index ``i % D`` scaled (a 2-D transpose, NCHW -> NHWC): 32 x 32 tiles
    read along the rows of ``x`` into a padded shared tile and written along the rows of
    ``y``, on a 2-D grid of 32 x 8 blocks (``form=transpose``,
    :mod:`klineage.mechanisms._staging_transpose`);
  * the *tile loop of global reads* a helper's staging leaves when removed: a loop over K
    that moves pointer parameters a tile a turn after reading them as ``P[X % L * g + X / L
    * h]`` (in the kernel or in a helper called once): a generated loader stages each tile
    in shared memory between two barriers and the reads become ``S[X]`` (``form=tile_loop``,
    :mod:`klineage.mechanisms._staging_helper_forward`).
  * the *tile loop of bounds-checked 2-D reads* a 2-D helper's staging leaves when removed:
    a loop counting tiles along K whose reads ``(R < M && C < N ? P[R * L + C] : 0)`` (in the
    kernel, or in a reader helper that takes the row's index) move one coordinate with the
    tile counter and the other with a block index: a generated loader stages each tile in a
    2-D shared array between two barriers, the reads become ``S[I_k][I_b]`` and a reader
    helper gets the row ``S[I_k]`` back (``form=tile_loop_2d``,
    :mod:`klineage.mechanisms._staging_tile_2d_forward`).
  * *row-invariant vectors*, loops over ``c`` whose reads ``g[c]`` (or ``LOAD(g + c)``)
    are the same for every row: the vectors copied once per block into the dynamic shared
    buffer, a barrier, reads from the copy, the launch asking for the bytes
    (``form=row_vectors``, :mod:`klineage.mechanisms._staging_row_vectors`).
  * *a row walked several times*, loops of one header that each load the same global
    element at their index: the first pass stores its loads in the row's slice of the
    dynamic shared buffer, the later passes read the slice, the launch asking for the bytes
    (``form=row_cache``, :mod:`klineage.mechanisms._staging_row_cache_forward`).
  - A register-tiled turn reading its operands from global memory as ``P[U + a*X + Y]``
    gets ``__shared__ S[R][C]`` tiles filled by the whole block (``form=operand_tiles``,
    :mod:`klineage.mechanisms._staging_operands_forward`).

  A top-level loop goes to the first of the loop forms that takes it without a refusal (a
  16 x 16 block walking k 32 at a time is no blocked tile, but its operands are tiles); one
  that every form recognizing it refuses keeps the first one's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from klineage.conditions import (
    AxisAtMost,
    BlockSizeAtMost,
    BlockSizeMultiple,
    Condition,
    SharedMemoryAtMost,
)
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import PRIMARY, SIZEOF, UNARY, fold_int, precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.facts import shared_memory_of
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import FMA_CALLS, NotInForm, assigned_names, declaration_names
from klineage.kernel import KernelSource
from klineage.mechanisms._forms import FoundForm, form_site, removable_form_site
from klineage.mechanisms._rows_forms import NotCanonical
from klineage.mechanisms._staging import (
    NotStaged,
    StagedLoop,
    analyze_staged_loop,
    read_mapping,
    staging_loops,
    thread_names,
    unread_declarations,
    value_type,
    zero_of,
)
from klineage.mechanisms._staging_forms import staging_forms
from klineage.mechanisms._staging_helper import helper_removal
from klineage.mechanisms._staging_helper_forward import (
    advanced_pointers,
    tile_loop,
    tile_loop_edits,
)
from klineage.mechanisms._staging_loader import loader_removal
from klineage.mechanisms._staging_once import once_removal
from klineage.mechanisms._staging_operands_forward import (
    operand_tile_edits,
    operand_tiles,
    reads_tiles,
)
from klineage.mechanisms._staging_row_cache import NEEDED as ROW_NEEDED
from klineage.mechanisms._staging_row_cache import cached_rows, row_cache_removal
from klineage.mechanisms._staging_row_cache_forward import (
    ROW_CACHE,
    row_cache_application,
    row_cache_candidates,
    row_cache_conditions,
)
from klineage.mechanisms._staging_row_vectors import (
    ROW_VECTORS,
    row_vector_application,
    row_vector_candidates,
)
from klineage.mechanisms._staging_threads import ThreadParts
from klineage.mechanisms._staging_tile import stores_tile, tile_once_removal
from klineage.mechanisms._staging_tile_2d_edits import tile_loop_2d_edits
from klineage.mechanisms._staging_tile_2d_forward import has_bounded_reads, tile_loop_2d
from klineage.mechanisms._staging_tile_forward import (
    tiled_transpose,
    tiled_transpose_edits,
    transposed_read,
)
from klineage.mechanisms._staging_transpose import transpose_edits, transpose_kernels
from klineage.mechanisms._tiles_util import (
    STATIC_SHARED_LIMIT,
    Locals,
    asm_statements,
    block_threads,
    fresh_name,
    function_names,
    is_call_statement,
    kernel_block_dims,
    name_of,
    names_in,
    orphaned_declarations,
    rename,
    statements,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

TRANSPOSE = "transpose"
TILE_TRANSPOSE = "tile_transpose"
TILE_LOOP = "tile_loop"
TILE_LOOP_2D = "tile_loop_2d"
OPERAND_TILES = "operand_tiles"

_LoopForm = Callable[[ParsedSource, Function, Node], tuple[str | None, str | None]]
"""A forward form's test of a top-level loop: (the form's name or None, its refusal)."""

TILE_SIZES = (8, 16, 32)
DEFAULT_TILE = 16


class _NoForm(Exception):
    """A loop or kernel is not in a canonical form; the message says why."""


def _strip(node: Node) -> Node:
    """The expression inside parentheses and casts."""
    current = node
    while True:
        if current.type == "parenthesized_expression" and current.named_children:
            current = current.named_children[0]
        elif current.type == "cast_expression":
            value = current.child_by_field_name("value")
            if value is None:
                return current
            current = value
        else:
            return current


def _factors(source: ParsedSource, node: Node) -> list[str] | None:
    """``m * n`` (with parentheses) -> ``["m", "n"]``; None when not a product of names."""
    node = _strip(node)
    if node.type == "identifier":
        return [source.text_of(node)]
    if node.type == "binary_expression":
        op = node.child_by_field_name("operator")
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if op is not None and op.type == "*" and left is not None and right is not None:
            a, b = _factors(source, left), _factors(source, right)
            if a is not None and b is not None:
                return a + b
    return None


def _binary(node: Node | None) -> tuple[str, Node, Node] | None:
    if node is None:
        return None
    node = _strip(node)
    op = node.child_by_field_name("operator")
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if node.type != "binary_expression" or op is None or left is None or right is None:
        return None
    return op.type, left, right


def _accumulation(body: Node | None) -> tuple[Node, Node, Node]:
    """``acc += X * Y;`` or ``acc = fmaf(X, Y, acc);`` (braced or not) -> (acc, X, Y)."""
    if body is not None and body.type == "compound_statement":
        inner = statements(body)
        body = inner[0] if len(inner) == 1 else None
    if body is None or body.type != "expression_statement" or not body.named_children:
        raise _NoForm("the loop body is not one statement 'acc += x * y;'")
    assignment = body.named_children[0]
    fused = _fused(assignment)
    if fused is not None:
        return fused
    op = assignment.child_by_field_name("operator")
    target = assignment.child_by_field_name("left")
    product = _binary(assignment.child_by_field_name("right"))
    if (
        assignment.type != "assignment_expression"
        or op is None
        or op.type != "+="
        or (target is None or product is None or product[0] != "*")
    ):
        raise _NoForm("the loop body is not 'acc += x * y;'")
    return target, product[1], product[2]


def _fused(assignment: Node) -> tuple[Node, Node, Node] | None:
    """(acc, X, Y) of ``acc = fmaf(X, Y, acc)`` (``fma``, ``__fmaf_rn``), else None."""
    op = assignment.child_by_field_name("operator")
    target = assignment.child_by_field_name("left")
    call = assignment.child_by_field_name("right")
    if assignment.type != "assignment_expression" or op is None or op.type != "=":
        return None
    if target is None or call is None or call.type != "call_expression":
        return None
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    args = [a for a in arguments.named_children if a.type != "comment"] if arguments else []
    if callee is None or callee.text is None or len(args) != 3:
        return None
    if callee.text.decode() not in FMA_CALLS or target.text is None:
        return None
    addend = _strip(args[2])
    if addend.text != target.text:
        return None
    return target, args[0], args[1]


def _leading_aliases(
    source: ParsedSource, locals_: Locals, body: Node | None, var: str
) -> tuple[dict[str, str], Node | None]:
    """The copies of outer locals an accumulation loop declares before its one statement
    (``int row = a_row;``: name -> the local copied), and that statement; none where the
    body holds anything else."""
    if body is None or body.type != "compound_statement":
        return {}, body
    items = [s for s in statements(body) if s.type != "preproc_call"]
    aliases: dict[str, str] = {}
    for item in items[:-1]:
        declarators = item.children_by_field_name("declarator")
        if item.type != "declaration" or len(declarators) != 1:
            return {}, body
        value = declarators[0].child_by_field_name("value")
        name = name_of(source, declarators[0].child_by_field_name("declarator") or declarators[0])
        if (
            value is None
            or name is None
            or value.type != "identifier"
            or source.text_of(value) == var
            or name in locals_.assigned
            or source.text_of(value) in locals_.assigned
        ):
            return {}, body
        aliases[name] = source.text_of(value)
    return aliases, items[-1] if aliases and items else body


def _counting_loop(source: ParsedSource, loop: Node) -> tuple[str, str, Node]:
    """``for (T v = 0; v < bound; ++v)`` -> (type, v, bound)."""
    init = loop.child_by_field_name("initializer")
    condition = _binary(loop.child_by_field_name("condition"))
    update = loop.child_by_field_name("update")
    if init is None or init.type != "declaration" or condition is None or update is None:
        raise _NoForm("the loop is not 'for (T v = 0; v < n; ++v)'")
    declarators = init.children_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value") if len(declarators) == 1 else None
    name = declarators[0].child_by_field_name("declarator") if len(declarators) == 1 else None
    if value is None or name is None or source.text_of(value) != "0":
        raise _NoForm("the loop does not start at 0")
    var = source.text_of(name)
    op, left, bound = condition
    if op != "<" or source.text_of(left) != var:
        raise _NoForm(f"the loop condition is not '{var} < n'")
    step = " ".join(source.text_of(update).split())
    if step not in (f"++{var}", f"{var}++", f"{var} += 1"):
        raise _NoForm("the loop does not count up by one")
    type_node = init.child_by_field_name("type")
    type_text = source.text_of((init.start_byte, type_node.end_byte)) if type_node else "int"
    return type_text, var, bound


def _depends(
    locals_: Locals,
    source: ParsedSource,
    node: Node,
    skip: str,
    targets: set[str],
    stop: frozenset[str] = frozenset(),
) -> bool:
    """Whether ``node`` depends on ``targets``, not counting the loop variable ``skip`` and
    not looking through the locals in ``stop``."""
    if (targets - {skip}) & names_in(source, node):
        return True
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "identifier" and source.text_of(current) != skip:
            parent = current.parent
            if (parent is None or parent.type != "field_expression") and locals_.depends_on(
                current, targets, stop
            ):
                return True
            continue
        stack.extend(current.named_children)
    return False


def _role(
    locals_: Locals,
    source: ParsedSource,
    factor: Node,
    skip: str,
    spellings: tuple[set[str], set[str]],
    uniform: frozenset[str],
    atoms: dict[str, str],
) -> str:
    """``a`` when a factor varies with the thread only along y (stage it as S[ty][tx] with
    k := tx, read S[ty][k]), ``b`` when only along x (k := ty, read S[k][tx]). Names in
    ``uniform`` (the outer loop's variable) are the same for every thread; ``atoms`` (local
    -> the one thread component it is) are not looked through for another component."""
    x, y = spellings
    along = {c: frozenset(n for n, a in atoms.items() if a == c) for c in "xy"}
    if not _depends(locals_, source, factor, skip, x, uniform | along["y"]):
        return "a"
    if not _depends(locals_, source, factor, skip, y, uniform | along["x"]):
        return "b"
    raise _NoForm(
        f"{' '.join(source.text_of(factor).split())} varies with both threadIdx.x and "
        "threadIdx.y, so no thread of a tile row or column can load it for the others"
    )


def _spelling(locals_: Locals, function: Function, component: str) -> str:
    """The name the kernel uses for ``threadIdx.<component>``: a top-level local holding
    exactly it, else the field itself."""
    body = function.body
    for name, entries in locals_.declared.items():
        decl = entries[0][0]
        value = locals_.initializer(name)
        if (
            body is not None
            and decl.parent == body
            and value is not None
            and locals_.thread_component(value) == component
        ):
            return name
    return f"threadIdx.{component}"


def _unwrap(node: Node) -> Node:
    """A factor without the parentheses a removal put around it."""
    if node.type == "parenthesized_expression" and node.named_children:
        inner = node.named_children[0]
        if precedence(inner) < PRIMARY:
            return inner
    return node


def _returns_before(source: ParsedSource, function: Function, node: Node) -> bool:
    body = function.body
    return body is not None and any(
        r.start_byte < node.start_byte for r in source.iter_nodes("return_statement", within=body)
    )


def _thread_uniform(
    source: ParsedSource, locals_: Locals, loop: Node, var: str, carried: frozenset[str]
) -> bool:
    """Whether every thread runs the same turns of ``loop``: its header reads no thread
    index, the names it declares (``carried``: ``int a = a0, b = b0`` with ``b += bStep``)
    not looked through, since the header holds all their writes."""
    spellings = set()
    for component in "xyz":
        spellings |= thread_names(locals_, component)
    parts = [loop.child_by_field_name(f) for f in ("initializer", "condition", "update")]
    return not any(
        p is not None and _depends(locals_, source, p, var, spellings, carried) for p in parts
    )


def _header_names(source: ParsedSource, loop: Node, var: str) -> frozenset[str]:
    """The names a loop's header declares (``for (int a = a0, b = b0; ...)``) that its body
    never writes: each moves only with the header, the same for every thread when the header
    is."""
    initializer = loop.child_by_field_name("initializer")
    body = loop.child_by_field_name("body")
    declared = (
        set(declaration_names(source, initializer))
        if initializer is not None and initializer.type == "declaration"
        else set()
    )
    written = assigned_names(source, body) if body is not None else set()
    return frozenset((declared - written) | {var})


# ---------------------------------------------------------------------------------------------
# Form A: a blocked loop without staging
# ---------------------------------------------------------------------------------------------


@dataclass
class _TileLoop:
    function: Function
    loop: Node
    inner: Node
    var: str
    bound: Node
    tile: int
    raw_factors: list[Node]
    """The product's operands as written (a removal leaves them parenthesized)."""
    factors: list[Node]
    roles: list[str]
    types: list[str]
    tx: str
    ty: str
    aliases: dict[str, str] = field(default_factory=dict)
    """Copies of outer locals the inner loop declares (name -> the local): a store before
    the inner loop reads the local itself."""


def _tile_loop(source: ParsedSource, function: Function, loop: Node) -> _TileLoop:
    body = loop.child_by_field_name("body")
    if function.body is None or loop.parent != function.body:
        raise _NoForm("the tile loop is not at the top level of the kernel body")
    if body is None or body.type != "compound_statement":
        raise _NoForm("the tile loop has no braced body")
    items = [s for s in statements(body) if s.type != "preproc_call"]
    if len(items) != 1 or items[0].type != "for_statement":
        raise _NoForm("the tile loop's body is not one inner loop over the tile")
    inner = items[0]
    _, var, bound = _counting_loop(source, inner)
    locals_ = Locals(source, function)
    parts = ThreadParts(source, function, locals_)
    # a template parameter counts where every launch binds it to one value
    tile = fold_int(source, bound) or parts.fold(bound)
    if tile is None:
        raise _NoForm("the inner loop's bound is not a compile-time constant")
    aliases, statement = _leading_aliases(source, locals_, inner.child_by_field_name("body"), var)
    _, x_factor, y_factor = _accumulation(statement)
    factors = [_unwrap(x_factor), _unwrap(y_factor)]
    if not all(var in names_in(source, f) for f in factors):
        raise _NoForm(f"a factor of the product does not depend on {var}")
    outer = source.loop_at(loop)
    outer_var = outer.variable if outer is not None and outer.variable else ""
    carried = _header_names(source, loop, outer_var)
    spellings = (thread_names(locals_, "x"), thread_names(locals_, "y"))
    # a row or column of the thread's flattened place (tid / W) holds no other index
    atoms = parts.atoms
    roles = [_role(locals_, source, f, var, spellings, carried, atoms) for f in factors]
    types = source.local_types(function)
    kinds = [value_type(source, types, f) for f in factors]
    if None in kinds or "int" in kinds:
        raise _NoForm("the type of a factor cannot be told, so its tile's type is unknown")
    if _returns_before(source, function, loop) or not _thread_uniform(
        source, locals_, loop, outer_var, carried
    ):
        raise _NoForm(
            "not every thread of the block reaches every iteration of the tile loop (a return "
            "before it, or a trip count that depends on the thread), so a barrier is unsafe"
        )
    dims = kernel_block_dims(source, function)
    if dims != (tile, tile, 1):
        raise _NoForm(
            f"the block must be {tile} x {tile} threads (one per tile element); it is "
            f"{'unknown' if dims is None else ' x '.join(map(str, dims))}"
        )
    return _TileLoop(
        function,
        loop,
        inner,
        var,
        bound,
        tile,
        [x_factor, y_factor],
        factors,
        roles,
        [k for k in kinds if k is not None],
        _spelling(locals_, function, "x"),
        _spelling(locals_, function, "y"),
        aliases,
    )


# ---------------------------------------------------------------------------------------------
# Form B: the naive GEMM
# ---------------------------------------------------------------------------------------------


@dataclass
class _NaiveGemm:
    function: Function
    index: Node
    """The declaration of the linear index."""
    index_name: str
    index_type: str
    guard: Node
    loop: Node
    loop_type: str
    var: str
    bound: str
    factors: list[Node]
    roles: list[str]
    element: str
    row: Node
    col: Node
    batch: Node | None
    rows: str
    cols: str
    batches: str | None
    after: Node
    launch: Launch


def _top_declarations(source: ParsedSource, body: Node) -> dict[str, tuple[Node, Node]]:
    """Name -> (declaration, initializer) of the single-name declarations of a block."""
    found: dict[str, tuple[Node, Node]] = {}
    for statement in statements(body):
        if statement.type != "declaration":
            continue
        declarators = statement.children_by_field_name("declarator")
        if len(declarators) != 1:
            continue
        name = declarators[0].child_by_field_name("declarator")
        value = declarators[0].child_by_field_name("value")
        if name is not None and value is not None and name.type == "identifier":
            found[source.text_of(name)] = (statement, value)
    return found


def _is_linear_index(source: ParsedSource, value: Node) -> bool:
    parts = _binary(value)
    if parts is None or parts[0] != "+":
        return False
    _, left, right = parts
    fields = {name_of(source, _strip(left)), name_of(source, _strip(right))}
    product = left if name_of(source, _strip(right)) == "threadIdx.x" else right
    inner = _binary(product)
    if "threadIdx.x" not in fields or inner is None or inner[0] != "*":
        return False
    return {name_of(source, _strip(inner[1])), name_of(source, _strip(inner[2]))} == {
        "blockIdx.x",
        "blockDim.x",
    }


def _guard(source: ParsedSource, node: Node, index: str) -> list[str] | None:
    """``if (i >= m * n) return;`` -> ``["m", "n"]``."""
    condition = node.child_by_field_name("condition")
    consequence = node.child_by_field_name("consequence")
    if node.type != "if_statement" or node.child_by_field_name("alternative") is not None:
        return None
    if consequence is None or " ".join(source.text_of(consequence).split()) != "return;":
        return None
    inner = (
        condition.named_children[0] if condition is not None and condition.named_children else None
    )
    parts = _binary(inner)
    if parts is None or parts[0] != ">=" or source.text_of(_strip(parts[1])) != index:
        return None
    return _factors(source, parts[2])


def _decomposition(
    source: ParsedSource, decls: dict[str, tuple[Node, Node]], index: str, total: list[str]
) -> tuple[str, str, str | None, str, str, str | None]:
    """(row, col, batch local or None, rows axis, cols axis, batch axis or None)."""
    for col, (_, value) in decls.items():
        parts = _binary(value)
        if parts is None:
            continue
        op, left, right = parts
        base = source.text_of(_strip(left))
        for row, (_, row_value) in decls.items():
            row_parts = _binary(row_value)
            if (
                row_parts is None
                or row_parts[0] != "/"
                or source.text_of(_strip(row_parts[1])) != base
            ):
                continue
            divisor = _factors(source, row_parts[2])
            if divisor is None or len(divisor) != 1:
                continue
            cols = divisor[0]
            rest = _factors(source, right)
            if not (
                (op == "%" and rest == [cols])
                or (op == "-" and rest is not None and sorted(rest) == sorted([row, cols]))
            ):
                continue
            if base == index:
                if len(total) != 2 or cols not in total:
                    raise _NoForm(f"the guard's total is not rows * {cols}")
                others = list(total)
                others.remove(cols)
                return row, col, None, others[0], cols, None
            return _batched(source, decls, index, total, base, row, col, cols)
    raise _NoForm("no 'row = i / n' and 'col = i - row * n' (or 'i % n') decomposition")


def _batched(
    source: ParsedSource,
    decls: dict[str, tuple[Node, Node]],
    index: str,
    total: list[str],
    rest: str,
    row: str,
    col: str,
    cols: str,
) -> tuple[str, str, str, str, str, str]:
    if rest not in decls or len(total) != 3:
        raise _NoForm("the row and column come from neither the index nor a batch remainder")
    for batch, (_, value) in decls.items():
        parts = _binary(value)
        if parts is None or parts[0] != "/" or source.text_of(_strip(parts[1])) != index:
            continue
        plane = _factors(source, parts[2])
        if plane is None or len(plane) != 2 or cols not in plane:
            continue
        rows = plane[0] if plane[1] == cols else plane[1]
        batches = [t for t in total if t not in (rows, cols)]
        if len(batches) != 1 or sorted(total) != sorted([rows, cols, batches[0]]):
            continue
        rest_parts = _binary(decls[rest][1])
        rest_factors = None if rest_parts is None else _factors(source, rest_parts[2])
        if (
            rest_parts is None
            or source.text_of(_strip(rest_parts[1])) != index
            or not (
                (
                    rest_parts[0] == "%"
                    and rest_factors is not None
                    and sorted(rest_factors) == sorted(plane)
                )
                or (
                    rest_parts[0] == "-"
                    and rest_factors is not None
                    and sorted(rest_factors) == sorted([batch, *plane])
                )
            )
        ):
            continue
        return row, col, batch, rows, cols, batches[0]
    raise _NoForm("no 'batch = i / (m * n)' for the batched decomposition")


def _naive_gemm(source: ParsedSource, function: Function, loop: Node) -> _NaiveGemm:
    body = function.body
    if body is None or loop.parent != body or not function.is_kernel:
        raise _NoForm("the dot-product loop is not at the top level of a kernel")
    text = source.data[function.node.start_byte : function.node.end_byte]
    if b"__shared__" in text or b"__syncthreads" in text:
        raise _NoForm("the kernel already uses shared memory or barriers")
    loop_type, var, bound_node = _counting_loop(source, loop)
    if bound_node.type != "identifier":
        raise _NoForm("the reduction bound is not a parameter")
    _, x_factor, y_factor = _accumulation(loop.child_by_field_name("body"))
    decls = _top_declarations(source, body)
    index = next((n for n, (_, v) in decls.items() if _is_linear_index(source, v)), None)
    if index is None:
        raise _NoForm("no linear index 'i = blockIdx.x * blockDim.x + threadIdx.x'")
    items = statements(body)
    guards = [s for s in items if _guard(source, s, index) is not None]
    if len(guards) != 1 or len(list(source.iter_nodes("return_statement", within=body))) != 1:
        raise _NoForm(f"no single early return 'if ({index} >= total) return;'")
    total = _guard(source, guards[0], index) or []
    row, col, batch, rows, cols, batches = _decomposition(source, decls, index, total)
    locals_ = Locals(source, function)
    rewritten = {index, row, col} | ({batch} if batch else set())
    if rewritten & locals_.assigned:
        raise _NoForm(f"{', '.join(sorted(rewritten & locals_.assigned))} is reassigned")
    tail = [s for s in items if s.start_byte >= loop.end_byte]
    if len(tail) != 1:
        raise _NoForm("more than one statement follows the dot-product loop")
    roles = []
    leaves = frozenset(n for n in (row, col, batch) if n)
    for factor in (x_factor, y_factor):
        if not _depends(locals_, source, factor, var, {col, index, "threadIdx.x"}, leaves):
            roles.append("a")
        elif not _depends(locals_, source, factor, var, {row, index, "threadIdx.x"}, leaves):
            roles.append("b")
        else:
            raise _NoForm(
                "a factor depends on the output index other than through its row or column"
            )
    types = source.local_types(function)
    kinds = {value_type(source, types, f) for f in (x_factor, y_factor)}
    if len(kinds) != 1 or None in kinds or "int" in kinds:
        raise _NoForm("the factors' types cannot be told or differ")
    geometry = {f"{a}.{c}" for a in ("blockIdx", "blockDim", "gridDim", "threadIdx") for c in "xyz"}
    index_decl = decls[index][0]
    others = [s for s in items if s != index_decl]
    if any(names_in(source, s) & geometry for s in others):
        raise _NoForm("the kernel reads the launch geometry outside its linear index")
    launches = source.launches_of(function)
    if len(launches) != 1 or len(launches[0].args) != len(function.params):
        raise _NoForm(f"{function.name} is not launched exactly once with all its arguments")
    type_node = index_decl.child_by_field_name("type")
    return _NaiveGemm(
        function,
        index_decl,
        index,
        source.text_of(type_node) if type_node is not None else "int",
        guards[0],
        loop,
        loop_type,
        var,
        source.text_of(bound_node),
        [x_factor, y_factor],
        roles,
        kinds.pop() or "float",
        decls[row][1],
        decls[col][1],
        decls[batch][1] if batch else None,
        rows,
        cols,
        batches,
        tail[0],
        launches[0],
    )


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


def _header(source: ParsedSource, loop: Node) -> str:
    return source.header(loop)


def _tile_names(source: ParsedSource, function: Function, carrier: Carrier) -> list[str]:
    given = carrier.get_str("tiles")
    if given:
        names = [n.strip() for n in given.split(",")]
        if len(names) != 2 or not all(n.isidentifier() for n in names):
            raise ValueError(f"tiles={given!r} must be two names, e.g. 'As,Bs'")
        return names
    used = function_names(source, function)
    return [fresh_name(used, "tile_a"), fresh_name(used, "tile_b")]


def _copy_functions(source: ParsedSource) -> dict[str, bool]:
    """Functions that copy into shared memory asynchronously (True), or did before
    cp_async_pipeline's removal made their copies synchronous (False)."""
    found: dict[str, bool] = {}
    for statement in asm_statements(source):
        if any(i.startswith("cp.async.c") for i in statement.instructions):
            function = source.enclosing_function(statement.statement)
            if function is not None:
                found[function.name] = True
    for call in source.calls_named("__pipeline_memcpy_async", "cuda::memcpy_async"):
        function = source.enclosing_function(call.node)
        if function is not None:
            found[function.name] = True
    for comment in source.nodes("comment"):
        text = source.data[comment.start_byte : comment.end_byte]
        if b"klineage:cp_async_pipeline:" in text and b"cp.async.c" in text:
            function = source.enclosing_function(comment)
            if function is not None:
                found.setdefault(function.name, False)
    return found


def _staged_once_removal(source: ParsedSource, function: Function, node: Node) -> list[Edit]:
    """The removal of a tile staged once: a tile of several dimensions (the transpose) by its
    own rule, else the rule for a loop of ``S[i / V]`` stores."""
    if stores_tile(source, node):
        return tile_once_removal(source, function, node)
    return once_removal(source, function, node)


def _calls_within(source: ParsedSource, node: Node) -> set[str]:
    return {c.name for c in source.calls if node.start_byte <= c.node.start_byte < node.end_byte}


@register
class SmemStaging(Mechanism):
    name = "smem_staging"
    category = "memory"
    signature = ("LDS", "STS")
    family = "shared-memory staging of tiles"
    stages_loads = True
    intent = (
        "Load each operand tile once per block into shared memory and compute from there, so "
        "a value reused by many threads is read from global memory once."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "tile_size": "tile side (8, 16 or 32) for the naive GEMM form (default 16); must "
        "match the loop bound for the blocked form",
        "tiles": "names of the two shared tiles, in the order of the product's factors, "
        "e.g. 'As,Bs'",
    }

    # -- detection --------------------------------------------------------------------------

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        seen: set[int] = set()
        for function, loop in staging_loops(source):
            refusal, detail = None, {}
            try:
                analyze_staged_loop(source, function, loop)
            except NotStaged as why:
                refusal = str(why)
                try:
                    loader_removal(source, function, loop)
                    refusal, detail = None, {"form": "loader"}
                except NotInForm as other:
                    refusal += f" (as tiles a loader stages, it is {other.form})"
            seen.add(loop.start_byte)
            yield self.site(
                source, loop, snippet=_header(source, loop), refusal=refusal, detail=detail
            )
        yield from self._async_sites(source, seen)
        for form in staging_forms(source, seen):
            # a tile staged once: the once removal may take it
            if form.kind == "once":
                yield removable_form_site(
                    self, source, form, _staged_once_removal, "once", "as a tile staged once"
                )
            elif form.kind == "helper":
                yield removable_form_site(
                    self, source, form, helper_removal, "helper", "as tiles a helper stages"
                )
            else:
                yield form_site(self, source, form)
        for function in source.kernels:
            for store in cached_rows(source, function):
                form = FoundForm(
                    store, function, "a row each thread caches in shared memory", ROW_NEEDED
                )
                yield removable_form_site(
                    self, source, form, row_cache_removal, "row_cache", "as a cached row"
                )

    def _async_sites(self, source: ParsedSource, seen: set[int]) -> Iterator[Site]:
        """Tile loops fed by cp.async copies (directly or through helpers)."""
        copiers = _copy_functions(source)
        if not copiers:
            return
        for function in source.kernels:
            if function.body is None:
                continue
            for loop in source.iter_nodes("for_statement", "while_statement", within=function.body):
                body = loop.child_by_field_name("body")
                if loop.start_byte in seen or body is None or body.type != "compound_statement":
                    continue
                if not any(is_call_statement(source, s, "__syncthreads") for s in statements(body)):
                    continue
                feeding = (_calls_within(source, body) | {function.name}) & copiers.keys()
                if feeding:
                    seen.add(loop.start_byte)
                    arrive = (
                        "cp.async copies into a shared buffer (remove cp_async_pipeline first)"
                        if any(copiers[name] for name in feeding)
                        else "copies into a shared buffer that cp_async_pipeline's removal made "
                        "synchronous"
                    )
                    yield self.site(
                        source,
                        loop,
                        snippet=_header(source, loop),
                        refusal=f"the tiles arrive through {arrive}; the staged layout is "
                        "read through address arithmetic (and ldmatrix), not as S[i][j] reads "
                        "that a global expression can replace",
                    )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for transpose in transpose_kernels(source):
            element = transpose.element
            yield self.site(
                source,
                element.decl,
                span=(element.start_byte, transpose.store.end_byte),
                snippet=f"{element.function.name}: {source.snippet(element.decl)}",
                detail={"form": TRANSPOSE, "kernel": element.function.name},
            )
        kernel_forms = (
            self._candidate_form,
            _tile_transpose_form,
            _tile_loop_form,
            _tile_loop_2d_form,
            _operand_tiles_form,
        )
        for function in source.kernels:
            yield from self._loop_candidates(source, function, kernel_forms)
        for function in source.functions:
            # a __device__ function's turn (the kernel calls it with the whole block)
            if not function.is_kernel and function.runs_on_device:
                yield from self._loop_candidates(source, function, (_operand_tiles_form,))
        yield from row_vector_candidates(self, source)
        yield from row_cache_candidates(self, source)

    def _loop_candidates(
        self, source: ParsedSource, function: Function, forms: tuple[_LoopForm, ...]
    ) -> Iterator[Site]:
        """A site for each top-level ``for`` loop of ``function`` in the first of ``forms``
        that takes it without a refusal, else in the first that recognizes it (with that
        form's refusal): a loop one form refuses may be in another's form."""
        if function.body is None:
            return
        for loop in statements(function.body):
            if loop.type != "for_statement":
                continue
            found: tuple[str, str | None] | None = None
            for form_of in forms:
                form, refusal = form_of(source, function, loop)
                if form is not None and (found is None or refusal is None):
                    found = (form, refusal)
                if found is not None and found[1] is None:
                    break
            if found is not None:
                yield self.site(
                    source,
                    loop,
                    snippet=_header(source, loop),
                    detail={"form": found[0]},
                    refusal=found[1],
                )

    def _candidate_form(
        self, source: ParsedSource, function: Function, loop: Node
    ) -> tuple[str | None, str | None]:
        """("blocked" | "naive" | None, refusal) for a top-level loop of a kernel."""
        body = loop.child_by_field_name("body")
        inner = [s for s in statements(body) if s.type != "preproc_call"] if body else []
        if body is not None and len(inner) == 1 and inner[0].type == "for_statement":
            inner_body = inner[0].child_by_field_name("body")
            header = source.loop_at(inner[0])
            var = header.variable if header is not None and header.variable else ""
            _, statement = _leading_aliases(source, Locals(source, function), inner_body, var)
            try:
                _accumulation(statement)
            except _NoForm:
                return None, None
            try:
                _tile_loop(source, function, loop)
            except _NoForm as why:
                return "blocked", str(why)
            return "blocked", None
        try:
            _accumulation(body)
        except _NoForm:
            return None, None
        try:
            _naive_gemm(source, function, loop)
        except _NoForm as why:
            return "naive", str(why)
        return "naive", None

    # -- removal ----------------------------------------------------------------------------

    def _staged(self, source: ParsedSource, site: Site) -> StagedLoop:
        loop = self.node_at(source, site, "for_statement", "while_statement")
        function = source.enclosing_function(loop)
        if function is None:
            raise self.refuse("the loop is not in a function", site)
        try:
            return analyze_staged_loop(source, function, loop)
        except NotStaged as why:
            raise self.refuse(str(why), site) from None

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == "row_cache":
            store = self.node_at(source, site)
            function = source.enclosing_function(store)
            assert function is not None
            return row_cache_removal(source, function, store)
        if site.detail.get("form") == "loader":
            loop = self.node_at(source, site, "for_statement")
            function = source.enclosing_function(loop)
            assert function is not None
            return loader_removal(source, function, loop)
        if site.detail.get("form") in ("once", "helper"):
            loop = self.node_at(source, site)
            function = source.enclosing_function(loop)
            assert function is not None
            if site.detail.get("form") == "helper":
                return helper_removal(source, function, loop)
            return _staged_once_removal(source, function, loop)
        staged = self._staged(source, site)
        types = source.local_types(staged.function)
        edits: list[Edit] = []
        for array in staged.arrays:
            kind = value_type(source, types, array.value)
            for read in array.reads:
                mapping = read_mapping(source, staged, array, read)
                text = rename(source, array.value, mapping)
                strength = precedence(array.value)
                if kind != array.element:
                    text, strength = f"({array.element})({text})", UNARY
                edits.append(Edit.replace(read, wrap_at(read, text, strength)))
            edits.append(source.deletion(array.store, whole_line=True))
            edits.append(source.deletion(array.declaration, whole_line=True))
        written = [edit.replacement for edit in edits]
        for node in unread_declarations(source, staged, written):
            edits.append(source.deletion(node, whole_line=True))
        edits.append(source.deletion(staged.first_sync, whole_line=True))
        edits.append(source.deletion(staged.last_sync, whole_line=True))
        return edits

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("form") in ("once", "helper", "row_cache", "loader"):
            return Carrier()  # their forward rules (if any) take no instance choices
        staged = self._staged(kernel.parsed, site)
        ordered = sorted(staged.arrays, key=lambda a: a.reads[0].start_byte)
        values: dict[str, int | str] = {"tiles": ",".join(a.name for a in ordered)}
        dims = {d for a in staged.arrays for d in a.dims}
        if len(dims) == 1:
            values["tile_size"] = dims.pop()
        return Carrier(**values)

    # -- application ------------------------------------------------------------------------

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == TRANSPOSE:
            found = [
                t for t in transpose_kernels(source) if t.element.start_byte == site.start_byte
            ]
            if not found:
                raise self.refuse(f"no transpose kernel at line {site.start_line}", site, "apply")
            try:
                return transpose_edits(source, found[0])
            except NotCanonical as why:
                raise self.refuse(str(why), site, "apply") from None
        if site.detail.get("form") == ROW_VECTORS:
            return row_vector_application(self, source, site)
        if site.detail.get("form") == ROW_CACHE:
            return row_cache_application(self, source, site)
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        if function is None:
            raise self.refuse("the loop is not in a function", site, "apply")
        if site.detail.get("form") == TILE_TRANSPOSE:
            try:
                return tiled_transpose_edits(source, tiled_transpose(source, function, loop))
            except NotInForm as why:
                raise self.refuse(str(why), site, "apply") from None
        if site.detail.get("form") == TILE_LOOP:
            try:
                tiles = tile_loop(source, function, loop)
                return tile_loop_edits(source, tiles, _loop_tile_names(len(tiles.operands)))
            except NotInForm as why:
                raise self.refuse(str(why), site, "apply") from None
        if site.detail.get("form") == TILE_LOOP_2D:
            try:
                tiles_2d = tile_loop_2d(source, function, loop)
                names = _loop_tile_names(len(tiles_2d.operands))
                return tile_loop_2d_edits(source, tiles_2d, names)
            except NotInForm as why:
                raise self.refuse(str(why), site, "apply") from None
        if site.detail.get("form") == OPERAND_TILES:
            try:
                return operand_tile_edits(source, operand_tiles(source, function, loop))
            except NotInForm as why:
                raise self.refuse(str(why), site, "apply") from None
        try:
            names = _tile_names(source, function, carrier)
            if site.detail.get("form") == "naive":
                tile = carrier.get_int("tile_size", DEFAULT_TILE) or DEFAULT_TILE
                if tile not in TILE_SIZES:
                    raise _NoForm(f"tile_size={tile} is not one of {TILE_SIZES}")
                return _naive_edits(source, _naive_gemm(source, function, loop), tile, names)
            blocked = _tile_loop(source, function, loop)
            wanted = carrier.get_int("tile_size")
            if wanted is not None and wanted != blocked.tile:
                raise _NoForm(
                    f"the tile loop's bound fixes the tile at {blocked.tile}, not {wanted}"
                )
            return _blocked_edits(source, blocked, names)
        except (_NoForm, ValueError) as why:
            raise self.refuse(str(why), site, "apply") from None

    # -- conditions -------------------------------------------------------------------------

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        function = source.enclosing_function(site.start_byte)
        if site.detail.get("form") == ROW_CACHE and "load" in site.detail:
            return row_cache_conditions(source, site)  # a forward candidate, not a cache
        forms = (TRANSPOSE, TILE_TRANSPOSE, TILE_LOOP, TILE_LOOP_2D, OPERAND_TILES, ROW_VECTORS)
        if function is None or site.detail.get("form") in forms:
            # the transpose forms set their own block (32 x 8) or keep the kernel's, and stage
            # one padded tile of the block's (4.2 KB for 32 x 32 floats)
            return []
        if site.detail.get("form") == "naive":
            return self._naive_conditions(source, function, site)
        block = block_threads(source, function.name)
        usage = shared_memory_of(source, function)
        tile, extra = self._tile_and_extra(source, function, site)
        found: list[Condition] = []
        if tile is not None:
            why = f"one thread per element of a {tile} x {tile} tile"
            found += [
                BlockSizeAtMost(n=tile * tile, block_size=block, why=why),
                BlockSizeMultiple(k=tile * tile, block_size=block, why=why),
            ]
        if usage is not None:
            found.append(
                SharedMemoryAtMost(
                    bytes=STATIC_SHARED_LIMIT,
                    usage=f"({usage}) + {extra}" if extra else usage,
                    why="static shared memory is limited to 48 KiB per block",
                )
            )
        return found

    def _tile_and_extra(
        self, source: ParsedSource, function: Function, site: Site
    ) -> tuple[int | None, int]:
        """The tile side, and the shared bytes an application would add."""
        loop = self.node_at(source, site, "for_statement", "while_statement")
        if site.detail.get("form") == "blocked":
            try:
                blocked = _tile_loop(source, function, loop)
            except _NoForm:
                return None, 0
            extra = sum(blocked.tile**2 * SIZEOF.get(t, 4) for t in blocked.types)
            return blocked.tile, extra
        try:
            staged = analyze_staged_loop(source, function, loop)
        except NotStaged:
            return None, 0
        dims = {d for a in staged.arrays for d in a.dims}
        return (dims.pop() if len(dims) == 1 else None), 0

    def _naive_conditions(
        self, source: ParsedSource, function: Function, site: Site
    ) -> list[Condition]:
        loop = self.node_at(source, site, "for_statement")
        try:
            gemm = _naive_gemm(source, function, loop)
        except _NoForm:
            return []
        tile = DEFAULT_TILE
        found: list[Condition] = [
            SharedMemoryAtMost(
                bytes=STATIC_SHARED_LIMIT,
                usage=str(2 * tile * tile * SIZEOF.get(gemm.element, 4)),
                why="two staged tiles must fit in static shared memory",
            )
        ]
        rows = _run_axis(source, gemm, gemm.rows)
        if rows is not None:
            found.append(AxisAtMost(axis=rows, n=65535 * tile, why="grid.y counts row tiles"))
        batches = None if gemm.batches is None else _run_axis(source, gemm, gemm.batches)
        if batches is not None:
            found.append(AxisAtMost(axis=batches, n=65535, why="grid.z counts the batch"))
        return found


def _tile_transpose_form(
    source: ParsedSource, function: Function, loop: Node
) -> tuple[str | None, str | None]:
    """("tile_transpose", refusal) for a loop of a tiled kernel that reads its input
    transposed (:mod:`klineage.mechanisms._staging_tile_forward`); (None, None) otherwise."""
    if transposed_read(analysis(source).indices(function), loop) is None:
        return None, None
    try:
        tiled_transpose(source, function, loop)
    except NotInForm as why:
        return TILE_TRANSPOSE, str(why)
    return TILE_TRANSPOSE, None


def _tile_loop_form(
    source: ParsedSource, function: Function, loop: Node
) -> tuple[str | None, str | None]:
    """("tile_loop", refusal) for a loop that moves pointer parameters of the kernel a tile a
    turn (:mod:`klineage.mechanisms._staging_helper_forward`); (None, None) otherwise."""
    if not advanced_pointers(source, function, loop):
        return None, None
    try:
        tile_loop(source, function, loop)
    except NotInForm as why:
        return TILE_LOOP, str(why)
    return TILE_LOOP, None


def _tile_loop_2d_form(
    source: ParsedSource, function: Function, loop: Node
) -> tuple[str | None, str | None]:
    """("tile_loop_2d", refusal) for a loop that reads pointer parameters under a bounds check,
    in the kernel or in a helper it calls (:mod:`klineage.mechanisms._staging_tile_2d_forward`);
    (None, None) otherwise."""
    if not has_bounded_reads(source, function, loop):
        return None, None
    try:
        tile_loop_2d(source, function, loop)
    except NotInForm as why:
        return TILE_LOOP_2D, str(why)
    return TILE_LOOP_2D, None


def _operand_tiles_form(
    source: ParsedSource, function: Function, loop: Node
) -> tuple[str | None, str | None]:
    """("operand_tiles", refusal) for a loop whose turn reads pointer parameters inside
    inner loops, a register micro-tile per thread (:mod:`klineage.mechanisms.
    _staging_operands_forward`); (None, None) otherwise."""
    if not reads_tiles(source, function, loop):
        return None, None
    try:
        operand_tiles(source, function, loop)
    except NotInForm as why:
        return OPERAND_TILES, str(why)
    return OPERAND_TILES, None


def _loop_tile_names(count: int) -> list[str]:
    return [f"tile_{chr(ord('a') + i)}" if i < 26 else f"tile_{i}" for i in range(count)]


def _launch_arg(gemm: _NaiveGemm, param: str) -> Node:
    index = next(i for i, p in enumerate(gemm.function.params) if p.name == param)
    return gemm.launch.args[index]


def _run_axis(source: ParsedSource, gemm: _NaiveGemm, param: str) -> str | None:
    """The axis name behind a kernel parameter: the ``run`` parameter passed for it."""
    arg = _strip(_launch_arg(gemm, param))
    return source.text_of(arg) if arg.type == "identifier" else None


def _arg_text(source: ParsedSource, gemm: _NaiveGemm, param: str) -> str:
    arg = _launch_arg(gemm, param)
    text = source.text_of(arg)
    return text if arg.type == "identifier" else f"({text})"


def _naive_edits(source: ParsedSource, gemm: _NaiveGemm, tile: int, names: list[str]) -> list[Edit]:
    """Re-map the naive GEMM to tile x tile blocks with staged tiles."""
    used = function_names(source, gemm.function)
    tx, ty = fresh_name(used, "tx"), fresh_name(used, "ty")
    tile_row, tile_col = fresh_name(used, "tile_row"), fresh_name(used, "tile_col")
    start, kk = fresh_name(used, f"{gemm.var}0"), fresh_name(used, "kk")
    names = [fresh_name(used, n) for n in names]
    indent = source.indent_of(gemm.index.start_byte)
    type_node = gemm.index.child_by_field_name("type")
    prefix = source.text_of((gemm.index.start_byte, type_node.end_byte)) if type_node else "int"
    cast = f"({gemm.index_type})"
    rows, cols = gemm.rows, gemm.cols
    clamp_row = f"{tile_row} < {rows} ? {tile_row} : {rows} - 1"
    clamp_col = f"{tile_col} < {cols} ? {tile_col} : {cols} - 1"
    if gemm.batch is not None:
        plane = f"({cast}blockIdx.z * {rows} + ({clamp_row})) * {cols} + ({clamp_col})"
    else:
        plane = f"({clamp_row}) * {cols} + ({clamp_col})"
    prologue = [
        f"const int {tx} = threadIdx.x;",
        f"const int {ty} = threadIdx.y;",
        f"{prefix} {tile_row} = {cast}blockIdx.y * {tile} + {ty};",
        f"{prefix} {tile_col} = {cast}blockIdx.x * {tile} + {tx};",
        f"{prefix} {gemm.index_name} = {plane};",
    ]
    zero = zero_of(gemm.element)
    loads, reads = [], []
    for name, factor, role in zip(names, gemm.factors, gemm.roles, strict=True):
        along = tx if role == "a" else ty
        moved = rename(source, factor, {gemm.var: f"({start} + {along})"})
        loads.append(f"  {name}[{ty}][{tx}] = {start} + {along} < {gemm.bound} ? {moved} : {zero};")
        reads.append(f"{name}[{ty}][{kk}]" if role == "a" else f"{name}[{kk}][{tx}]")
    accumulate = _accumulation(gemm.loop.child_by_field_name("body"))[0]
    loop = [
        *(f"__shared__ {gemm.element} {n}[{tile}][{tile}];" for n in names),
        f"for ({gemm.loop_type} {start} = 0; {start} < {gemm.bound}; {start} += {tile}) {{",
        *loads,
        "  __syncthreads();",
        f"  for (int {kk} = 0; {kk} < {tile}; ++{kk}) "
        f"{source.text_of(accumulate)} += {reads[0]} * {reads[1]};",
        "  __syncthreads();",
        "}",
    ]
    grid = [
        f"(unsigned)(({_arg_text(source, gemm, cols)} + {tile - 1}) / {tile})",
        f"(unsigned)(({_arg_text(source, gemm, rows)} + {tile - 1}) / {tile})",
    ]
    if gemm.batches is not None:
        grid.append(f"(unsigned){_arg_text(source, gemm, gemm.batches)}")
    launch = gemm.launch
    if launch.grid is None or launch.block is None:
        raise _NoForm("the launch has no grid or block")
    edits = [
        Edit.replace(gemm.index, ("\n" + indent).join(prologue)),
        source.deletion(gemm.guard, whole_line=True),
        Edit.replace(gemm.row, clamp_row),
        Edit.replace(gemm.col, clamp_col),
        Edit.replace(gemm.loop, ("\n" + indent).join(loop)),
        Edit.insert(gemm.after.start_byte, f"if ({tile_row} < {rows} && {tile_col} < {cols}) "),
        Edit.replace(launch.grid, f"dim3({', '.join(grid)})"),
        Edit.replace(launch.block, f"dim3({tile}, {tile})"),
    ]
    if gemm.batch is not None:
        edits.append(Edit.replace(gemm.batch, "blockIdx.z"))
    replaced = [gemm.row, gemm.col, launch.grid, launch.block]
    replaced += [gemm.batch] if gemm.batch is not None else []
    edits += orphaned_declarations(source, replaced)
    return edits


def _blocked_edits(source: ParsedSource, blocked: _TileLoop, names: list[str]) -> list[Edit]:
    """Stage the factors of a blocked loop in shared tiles (the inverse of the removal)."""
    indent = source.indent_of(blocked.loop.start_byte)
    inner_indent = source.indent_of(blocked.inner.start_byte)
    bound = source.text_of(blocked.bound)
    body = blocked.loop.child_by_field_name("body")
    assert body is not None
    declarations = "".join(
        f"__shared__ {kind} {name}[{bound}][{bound}];\n{indent}"
        for kind, name in zip(blocked.types, names, strict=True)
    )
    stores = []
    edits = [Edit.insert(blocked.loop.start_byte, declarations)]
    for name, raw, factor, role in zip(
        names, blocked.raw_factors, blocked.factors, blocked.roles, strict=True
    ):
        along = blocked.tx if role == "a" else blocked.ty
        value = rename(source, factor, {**blocked.aliases, blocked.var: along})
        stores.append(f"{name}[{blocked.ty}][{blocked.tx}] = {value};")
        read = (
            f"{name}[{blocked.ty}][{blocked.var}]"
            if role == "a"
            else f"{name}[{blocked.var}][{blocked.tx}]"
        )
        edits.append(Edit.replace(raw, read))
    stores.append("__syncthreads();")
    first = next(c for c in body.children if c.type != "{")
    if source.starts_line(first.start_byte):
        text = "".join(f"{inner_indent}{s}\n" for s in stores)
        edits.append(Edit.insert(source.line_start(first.start_byte), text))
    else:
        joined = "".join(f"{s}\n{inner_indent}" for s in stores)
        edits.append(Edit.insert(first.start_byte, joined))
    edits.append(Edit.insert(blocked.inner.end_byte, f"\n{inner_indent}__syncthreads();"))
    return edits
