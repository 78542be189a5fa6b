"""Warp tiles of a SIMT kernel as a permutation of the block's threads.

In a SIMT tiled kernel (no tensor cores), which thread computes which part of the block tile
is a free choice: any bijection of the block's threads onto the (row, column) places of a
thread grid computes the same outputs, provided the threads meet only through shared memory
across barriers and no warp-collective operation (shuffles, votes, ``mma``) depends on which
threads share a warp. Warp tiling is the choice that gives each warp a compact 2-D patch::

    warp = t / 32;  warp_row = warp / WC;  warp_col = warp % WC
    lane = t % 32;  lane_row = lane / CW;  lane_col = lane % CW

(``>>``/``&`` spellings, constants, template parameters or ``constexpr`` locals for WC and
CW), so a warp reads few distinct rows of one operand tile and few columns of the other.
Without it, threads fill a block-wide grid of ``WC * CW`` columns row by row and a warp
spans a strip of it::

    row = t / (WC * CW);  col = t % (WC * CW)

Both directions rewrite declarations only:

- remove: the warp index and lane index are rebuilt from the block-wide grid (``warp =
  (row / (32 / CW)) * WC + col / CW``, ``lane = (row % (32 / CW)) * CW + col % CW``), so every
  coordinate derived from them keeps its meaning and range while the warps become strips;
- apply: a block-wide grid ``row = t / NC; col = t % NC`` is rebuilt from the warp and lane
  indices with ``lane_cols`` = CW columns of lanes per warp row (``row = (warp / (NC / CW)) *
  (32 / CW) + lane / CW``, ``col = (warp % (NC / CW)) * CW + lane % CW``).

Both are refused where a warp-collective operation appears in the file, and where the warp or
lane index is used other than split by one column count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import WARP_SIZE, NotInForm, binary_operands, operator_of
from klineage.mechanisms._tiles_util import (
    Locals,
    fresh_name,
    function_names,
    names_in,
    strip_casts,
    substitute,
    top_declarations,
)

__all__ = [
    "WARP",
    "GridPair",
    "WarpLaneGrid",
    "block_grid",
    "block_wide_grid",
    "collective",
    "lane_cols_of",
    "warp_lane_grid",
    "warp_tiled_grid",
]

WARP = WARP_SIZE
STRIPS = "// threads fill a block-wide grid row by row, so a warp is a strip of it"
"""The comment the removal writes above the grid it rebuilds the warps from."""
WHOLE_ROWS = "whole rows of lanes in a warp"
_THREAD = frozenset({"threadIdx.x", "threadIdx.y", "threadIdx.z"})
_OTHERS = frozenset({"blockIdx.x", "blockIdx.y", "blockIdx.z", "gridDim.x", "gridDim.y"})
_COLLECTIVE_CALL = re.compile(
    r"\b(__shfl\w*|__ballot_sync|__any_sync|__all_sync|__uni_sync|__syncwarp|__activemask"
    r"|__reduce_\w+_sync|__match_\w+_sync|tiled_partition|coalesced_threads"
    r"|load_matrix_sync|store_matrix_sync|mma_sync)\b"
)
_COLLECTIVE_PTX = re.compile(r'"[^"\n]*\b(mma|wgmma|ldmatrix|stmatrix|shfl|vote|redux)\.[a-z]')


def collective(source: ParsedSource) -> str | None:
    """The first warp-collective operation in the file (a call or an inline-PTX mnemonic, in
    code or in a macro), whose lanes the hardware fixes: with one, which threads share a warp
    matters. Read from the text, comments included (a false alarm only refuses)."""
    text = source.kernel.text
    found = [m for m in (_COLLECTIVE_CALL.search(text), _COLLECTIVE_PTX.search(text)) if m]
    if not found:
        return None
    return min(found, key=lambda m: m.start()).group(1)


def _value(node: Node | None) -> Node | None:
    """A declarator's initializer, a one-element brace list unwrapped."""
    if node is not None and node.type == "initializer_list" and node.named_child_count == 1:
        return node.named_children[0]
    return node


def _text(source: ParsedSource, node: Node) -> str:
    return " ".join(source.text_of(strip_casts(node)).split())


@dataclass(frozen=True)
class _Split:
    """A division of a thread index by a column count: how one use splits a name."""

    row: bool
    """``/`` or ``>>`` (the row); else ``%`` or ``&`` (the column)."""
    count: str
    """The column count, as written or as the power of two a shift or mask implies."""


def _split_of(source: ParsedSource, node: Node) -> _Split | None:
    """``x / C``, ``x % C``, ``x >> s`` or ``x & (2^s - 1)`` (x the left operand): how it
    splits x; None for anything else."""
    operands = binary_operands(node, "/", "%", ">>", "&")
    if operands is None:
        return None
    right = operands[1]
    op = operator_of(strip_casts(node))
    if op in ("/", "%"):
        value = fold_int(source, right)
        return _Split(op == "/", str(value) if value is not None else _text(source, right))
    value = fold_int(source, right)
    if value is None or value < 0:
        return None
    if op == ">>":
        return _Split(True, str(1 << value))
    if value & (value + 1):
        return None  # not a mask of low bits
    return _Split(False, str(value + 1))


def _thread_index(locals_: Locals, node: Node) -> bool:
    """An expression of the thread indices (and block dimensions, constants) alone."""
    if not locals_.depends_on(node, set(_THREAD)):
        return False
    return not locals_.depends_on(node, set(_OTHERS))


def _uses(source: ParsedSource, function: Function, name: str, declaration: Node) -> list[Node]:
    """The identifiers reading `name` in the function, its own declarator aside."""
    assert function.body is not None
    return [
        node
        for node in source.iter_nodes("identifier", within=function.body)
        if source.text_of(node) == name
        and not (declaration.start_byte <= node.start_byte < declaration.end_byte)
    ]


_WRAPPERS = ("subscript_argument_list", "argument_list", "parenthesized_expression")
"""Nodes around a use that show little on their own: the expression they belong to shows."""


def _split_uses(source: ParsedSource, uses: list[Node], what: str) -> str:
    """The one column count every use of a name splits it by (rows and columns both used);
    NotInForm otherwise."""
    counts, kinds = set(), set()
    for use in uses:
        parent = use.parent
        while parent is not None and parent.type == "parenthesized_expression":
            parent = parent.parent
        split = None
        if parent is not None and parent.type == "binary_expression":
            left = parent.child_by_field_name("left")
            if left is not None and strip_casts(left).start_byte == use.start_byte:
                split = _split_of(source, parent)
        if split is None:
            context = parent if parent is not None else use
            while context.parent is not None and context.type in _WRAPPERS:
                context = context.parent
            shown = source.text_of(context)
            raise NotInForm(
                f"the {what} index is used as `{' '.join(shown.split())[:80]}`",
                f"every use of the {what} index split into a row (`/`, `>>`) and a column "
                "(`%`, `&`) by one column count",
            )
        counts.add(split.count)
        kinds.add(split.row)
    if len(counts) != 1 or kinds != {True, False}:
        raise NotInForm(
            f"the {what} index is split by {', '.join(sorted(counts)) or 'nothing'}"
            f"{'' if kinds == {True, False} else ' on one side only'}",
            f"the {what} index split into a row and a column by one column count",
        )
    return counts.pop()


@dataclass(frozen=True)
class _Index:
    name: str
    declaration: Node
    value: Node
    thread: Node


_DIVISORS = {"/": WARP, "%": WARP, ">>": 5, "&": WARP - 1}
"""What a thread index is divided by, per operator, to give its warp (``/``, ``>>``) or its
lane (``%``, ``&``)."""


def _divided(
    source: ParsedSource, locals_: Locals, function: Function, ops: tuple[str, str]
) -> list[_Index]:
    """Locals initialized to ``t / 32`` or ``t >> 5`` (`ops` of the warp), or to ``t % 32``
    or ``t & 31`` (of the lane), with t an expression of the thread indices."""
    found = []
    for name, declaration, value in top_declarations(source, function):
        value = _value(value)
        if value is None or name in locals_.assigned:
            continue
        operands = binary_operands(strip_casts(value), *ops)
        op = operator_of(strip_casts(value))
        if operands is None or op is None or fold_int(source, operands[1]) != _DIVISORS[op]:
            continue
        if _thread_index(locals_, operands[0]):
            found.append(_Index(name, declaration, value, operands[0]))
    return found


@dataclass(frozen=True)
class WarpLaneGrid:
    """A kernel's warp and lane indices, each split into a row and a column."""

    function: Function
    warp: _Index
    lane: _Index
    warp_cols: str
    """WC: warps per row of the warp grid (a number, or a parenthesized expression valid
    where the first of the two indices is declared)."""
    lane_cols: str
    """CW: lanes per row of a warp's patch (likewise)."""


def warp_lane_grid(source: ParsedSource, function: Function) -> WarpLaneGrid | None:
    """The kernel's warp grid with lanes split into rows and columns; None where the kernel
    has no warp index; NotInForm where it has one in a form the rules cannot permute."""
    if function.body is None:
        return None
    locals_ = Locals(source, function)
    warps = _divided(source, locals_, function, ("/", ">>"))
    if not warps:
        return None
    lanes = _divided(source, locals_, function, ("%", "&"))
    warp = warps[0]
    lane = next((x for x in lanes if _text(source, x.thread) == _text(source, warp.thread)), None)
    if lane is None:
        raise NotInForm(
            f"the warp index `{warp.name}` has no lane index split beside it (lanes are placed "
            "by a fragment layout or not at all)",
            "a lane index `t % 32` split into a row and a column of the warp's patch",
        )
    found = collective(source)
    if found is not None:
        raise NotInForm(
            f"the file uses the warp-collective `{found}`, whose lanes the hardware fixes",
            "a SIMT kernel without shuffles, votes or mma, whose warps can be regrouped",
        )
    warp_uses = _uses(source, function, warp.name, warp.declaration)
    lane_uses = _uses(source, function, lane.name, lane.declaration)
    warp_cols = _split_uses(source, warp_uses, "warp")
    lane_cols = _split_uses(source, lane_uses, "lane")
    if warp_cols == "1":
        raise NotInForm("the warps form one column", "a 2-D grid of warp tiles")
    # the counts as expressions valid where the first of the two is declared
    at = min(warp.declaration.start_byte, lane.declaration.start_byte)
    return WarpLaneGrid(
        function,
        warp,
        lane,
        _count_text(source, locals_, warp_cols, warp_uses, at),
        _count_text(source, locals_, lane_cols, lane_uses, at),
    )


def _hoisted(source: ParsedSource, locals_: Locals, text_of: Node, before: int) -> str:
    """An expression as written, with the locals it reads that are declared at or after byte
    `before` replaced by their initializers (so it can move up to `before`)."""

    def replace(node: Node) -> str | None:
        if node.type != "identifier":
            return None
        name = source.text_of(node)
        entries = locals_.declared.get(name, [])
        if len(entries) != 1 or entries[0][0].start_byte < before:
            return None
        value = _value(locals_.initializer(name))
        if value is None:
            return None
        return f"({_hoisted(source, locals_, value, before)})"

    return substitute(source, text_of, replace)


def _count_text(
    source: ParsedSource, locals_: Locals, count: str, uses: list[Node], at: int
) -> str:
    """A column count as an expression valid at byte `at`: a number, or the right operand of
    the first use written as a division (hoisted)."""
    if count.isdigit():
        return count
    for use in uses:
        parent = use.parent
        while parent is not None and parent.type == "parenthesized_expression":
            parent = parent.parent
        operands = binary_operands(parent) if parent is not None else None
        if operands is not None:
            return _wrapped(_hoisted(source, locals_, strip_casts(operands[1]), at))
    return _wrapped(count)


def _wrapped(text: str) -> str:
    """An operand as written, parenthesized unless it is a name or a number."""
    if re.fullmatch(r"[\w.]+", text) or _enclosed(text):
        return text
    return f"({text})"


def _enclosed(text: str) -> bool:
    """Whether the whole text is one parenthesized expression."""
    if not text.startswith("("):
        return False
    depth = 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return index == len(text) - 1
    return False


def lane_cols_of(grid: WarpLaneGrid) -> int | str:
    """The grid's lanes per warp row, a number where it folds."""
    text = grid.lane_cols
    return int(text) if text.isdigit() else text


def _exact(count: str) -> str:
    """A static_assert that WARP divides by `count` (an expression), or nothing when it is a
    number that does (NotInForm when it does not)."""
    if count.isdigit():
        if WARP % int(count):
            raise NotInForm(
                f"{count} lanes per warp row, which leave a partial row",
                "a count of lanes per warp row that divides 32",
            )
        return ""
    return f'static_assert({WARP} % {count} == 0, "{WHOLE_ROWS}");'


def block_wide_grid(source: ParsedSource, grid: WarpLaneGrid) -> list[Edit]:
    """Removal: the warp and lane indices rebuilt from a block-wide thread grid of ``WC *
    CW`` columns, declared before the first of them."""
    function = grid.function
    locals_ = Locals(source, function)
    first = min(grid.warp.declaration, grid.lane.declaration, key=lambda n: n.start_byte)
    at = first.start_byte
    wc, cw = grid.warp_cols, grid.lane_cols
    used = function_names(source, function)
    row = fresh_name(used, "thread_row")
    col = fresh_name(used, "thread_col")
    thread = _wrapped(_hoisted(source, locals_, grid.warp.thread, at))
    lines = [
        STRIPS,
        f"const auto {row} = {thread} / ({wc} * {cw});",
        f"const auto {col} = {thread} % ({wc} * {cw});",
        _exact(cw),
    ]
    rows = f"({WARP} / {cw})"
    return _declared_before(
        first,
        lines,
        (grid.warp.value, f"({row} / {rows}) * {wc} + {col} / {cw}"),
        (grid.lane.value, f"({row} % {rows}) * {cw} + {col} % {cw}"),
    )


def _declared_before(first: Node, lines: list[str], *values: tuple[Node, str]) -> list[Edit]:
    """Lines (empty ones left out) declared before the statement `first`, at its indent, and
    the initializers given new text."""
    indent = " " * first.start_point[1]
    prefix = "".join(f"{line}\n{indent}" for line in lines if line)
    edits = [Edit(first.start_byte, first.start_byte, prefix)]
    return edits + [Edit(node.start_byte, node.end_byte, text) for node, text in values]


@dataclass(frozen=True)
class GridPair:
    """A block-wide thread grid: ``row = t / NC`` and ``col = t % NC``."""

    function: Function
    row: _Index
    col: _Index
    columns: str
    """NC, as written (a number where it folds)."""


def _compile_time(source: ParsedSource, function: Function, node: Node, depth: int = 0) -> bool:
    """A compile-time expression: literals, file constants, template parameters and
    ``constexpr`` locals made of them."""
    if fold_int(source, node) is not None:
        return True
    allowed = set(function.template_params) | set(source.integer_constants)
    names = names_in(source, node)
    if not names:
        return False
    locals_ = Locals(source, function)
    for name in names - allowed:
        entries = locals_.declared.get(name, [])
        if depth > 4 or len(entries) != 1 or entries[0][1] is None:
            return False
        if "constexpr" not in source.text_of(entries[0][0]).split("=")[0].split("{")[0]:
            return False
        if not _compile_time(source, function, _value(entries[0][1]) or node, depth + 1):
            return False
    return True


def _linear_thread(locals_: Locals, node: Node, depth: int = 0) -> bool:
    """The block's linear thread index: ``threadIdx.x``, ``threadIdx.y * blockDim.x +
    threadIdx.x``, or a local holding one (not a warp, lane or other split of it)."""
    source = locals_.source
    node = strip_casts(node)
    text = " ".join(source.text_of(node).split())
    if text == "threadIdx.x":
        return True
    if node.type == "identifier" and depth < 4:
        value = _value(locals_.initializer(text))
        return value is not None and _linear_thread(locals_, value, depth + 1)
    operands = binary_operands(node, "+")
    if operands is None:
        return False
    terms = {" ".join(source.text_of(strip_casts(x)).split()) for x in operands}
    rows = {"threadIdx.y * blockDim.x", "blockDim.x * threadIdx.y"}
    return "threadIdx.x" in terms and bool(terms & rows)


def _pointers(source: ParsedSource, locals_: Locals) -> set[str]:
    """The function's pointer parameters and the pointer locals made from them."""
    function = locals_.function
    pointers = {p.name for p in function.params if p.name and "*" in p.type}
    for name, entries in locals_.declared.items():
        value = entries[0][1] if len(entries) == 1 else None
        if value is None or not names_in(source, value) & pointers:
            continue
        declarators = entries[0][0].children_by_field_name("declarator")
        if any(_is_pointer(d) for d in declarators):
            pointers.add(name)
    return pointers


def _stores(source: ParsedSource, locals_: Locals) -> list[tuple[str, Node]]:
    """(pointer, address expression) of the function's stores through its pointer parameters
    (or pointer locals made from them): subscripts and dereferences on the left of an
    assignment, and the offsets added to the pointers themselves."""
    function = locals_.function
    assert function.body is not None
    pointers = _pointers(source, locals_)
    found = []
    for node in source.iter_nodes("assignment_expression", within=function.body):
        left = node.child_by_field_name("left")
        right = node.child_by_field_name("right")
        if left is None or right is None:
            continue
        if left.type == "identifier" and source.text_of(left) in pointers:
            found.append((source.text_of(left), right))  # `C += offset`
            continue
        base = left
        while base.type in ("subscript_expression", "pointer_expression", "field_expression"):
            inner = base.child_by_field_name("argument") or base.child_by_field_name("value")
            if inner is None:
                break
            base = strip_casts(inner)
        if base is not left:
            for name in sorted(names_in(source, base) & pointers):
                found.append((name, left))
    return found


def _global_stores(source: ParsedSource, locals_: Locals) -> list[Node]:
    """The address expressions of a kernel's stores to global memory (its pointer parameters
    are global), and the arguments of its calls to the file's functions that store through a
    pointer the kernel passes from one of them."""
    function = locals_.function
    assert function.body is not None
    found = [address for _, address in _stores(source, locals_)]
    pointers = _pointers(source, locals_)
    for call in source.iter_nodes("call_expression", within=function.body):
        callee = call.child_by_field_name("function")
        name = source.text_of(callee).split("<")[0].split("::")[-1].strip() if callee else ""
        helper = source.function(name)
        arguments = call.child_by_field_name("arguments")
        if helper is None or helper is function or helper.body is None or arguments is None:
            continue
        written = {pointer for pointer, _ in _stores(source, Locals(source, helper))}
        passed = arguments.named_children
        for index, param in enumerate(helper.params):
            global_ = index < len(passed) and names_in(source, passed[index]) & pointers
            if param.name in written and global_:
                found.extend(passed)
                break
    return found


def _is_pointer(declarator: Node) -> bool:
    """A declarator of a pointer (``float *p = ...``)."""
    inner = declarator.child_by_field_name("declarator")
    return declarator.type == "pointer_declarator" or (
        inner is not None and inner.type == "pointer_declarator"
    )


def block_grid(source: ParsedSource, function: Function) -> list[GridPair]:
    """The kernel's block-wide thread grids: the linear thread index split into a row and
    a column that place the thread's outputs (they reach a global store's address). A warp
    index (``t / 32``) is not one, nor a split of it, nor the coordinates of a tile load."""
    if function.body is None:
        return []
    locals_ = Locals(source, function)
    declarations = [
        (name, declaration, _value(value))
        for name, declaration, value in top_declarations(source, function)
        if name not in locals_.assigned
    ]
    rows: dict[tuple[str, str], _Index] = {}
    cols: dict[tuple[str, str], _Index] = {}
    for name, declaration, value in declarations:
        if value is None:
            continue
        operands = binary_operands(strip_casts(value), "/", "%")
        if operands is None or not _compile_time(source, function, operands[1]):
            continue
        if not _linear_thread(locals_, operands[0]):
            continue
        count = fold_int(source, operands[1])
        if count == WARP:
            continue
        key = (_text(source, operands[0]), str(count) if count else _text(source, operands[1]))
        index = _Index(name, declaration, value, operands[0])
        target = rows if operator_of(strip_casts(value)) == "/" else cols
        target.setdefault(key, index)
    stores = _global_stores(source, locals_)
    pairs = []
    for key, row in rows.items():
        col = cols.get(key)
        if col is None:
            continue
        places = {row.name, col.name}
        # loop counters and advanced pointers are not looked through: a heuristic of which
        # grid places outputs (any grid may be permuted soundly; only this one is worth it)
        if any(locals_.depends_on(store, places, locals_.assigned) for store in stores):
            pairs.append(GridPair(function, row, col, key[1]))
    return pairs


def warp_tiled_grid(source: ParsedSource, pair: GridPair, lane_cols: int | str) -> list[Edit]:
    """Application: the grid's row and column rebuilt from the warp and lane indices, each
    warp a ``32 / CW`` by ``CW`` patch of the grid."""
    function = pair.function
    cw = str(lane_cols).strip()
    if not cw.isdigit():
        if not re.fullmatch(r"[A-Za-z_(][\w ()*/+-]*", cw):
            raise NotInForm(f"lane_cols `{cw}`", "lane_cols a number or a constant expression")
        cw = _wrapped(cw)
    checks = [_exact(cw)]
    nc = pair.columns
    if nc.isdigit() and cw.isdigit():
        if int(nc) % int(cw) or int(nc) == int(cw):
            raise NotInForm(
                f"a grid of {nc} columns with {cw} lanes per warp row",
                "a grid whose columns hold two or more warp rows' worth (a multiple of "
                "lane_cols, larger than it)",
            )
    else:
        checks.append(
            f'static_assert({_wrapped(nc)} % {cw} == 0, "whole warps across a grid row");'
        )
    first = min(pair.row.declaration, pair.col.declaration, key=lambda n: n.start_byte)
    at = first.start_byte
    used = function_names(source, function)
    warp = fresh_name(used, "warp")
    lane = fresh_name(used, "lane")
    locals_ = Locals(source, function)
    thread = _wrapped(_hoisted(source, locals_, pair.row.thread, at))
    lines = [f"const auto {warp} = {thread} / {WARP};", f"const auto {lane} = {thread} % {WARP};"]
    warps = f"({_wrapped(nc)} / {cw})"
    return _declared_before(
        first,
        lines + checks,
        (pair.row.value, f"({warp} / {warps}) * ({WARP} / {cw}) + {lane} / {cw}"),
        (pair.col.value, f"({warp} % {warps}) * {cw} + {lane} % {cw}"),
    )


@dataclass(frozen=True)
class RebuiltGrid:
    """Warp and lane indices rebuilt from a block-wide grid (what the removal writes)."""

    function: Function
    grid: GridPair
    warp: _Index
    lane: _Index
    span: tuple[int, int]
    """From the removal's comment (or the grid's first declaration) to the statement after
    the grid and its checks: what restoring deletes."""


def _divided_name(source: ParsedSource, node: Node | None, op: str) -> str | None:
    """``X op Y`` (parentheses and casts stripped) with X a name: the name."""
    operands = binary_operands(strip_casts(node), op) if node is not None else None
    if operands is None or strip_casts(operands[0]).type != "identifier":
        return None
    return source.text_of(strip_casts(operands[0]))


def _rebuilt_from(source: ParsedSource, value: Node, op: str) -> tuple[str, str] | None:
    """``(R op (32 / CW)) * WC + C op CW``: the names R and C. (The application writes the
    mirror image, ``(W op (NC / CW)) * (32 / CW) + L op CW``: there the lanes per warp sit in
    the multiplier, not in R's divisor.)"""
    operands = binary_operands(strip_casts(value), "+")
    if operands is None:
        return None
    scaled = binary_operands(strip_casts(operands[0]), "*")
    if scaled is None or _per_warp(source, scaled[1]):
        return None
    divided = binary_operands(strip_casts(scaled[0]), op)
    if divided is None or not _per_warp(source, divided[1]):
        return None
    row = _divided_name(source, scaled[0], op)
    col = _divided_name(source, operands[1], op)
    return (row, col) if row and col else None


def _per_warp(source: ParsedSource, node: Node) -> bool:
    """``32 / X``: rows of lanes per warp."""
    operands = binary_operands(strip_casts(node), "/")
    return operands is not None and fold_int(source, operands[0]) == WARP


def rebuilt_grid(source: ParsedSource, function: Function) -> RebuiltGrid | None:
    """The warp and lane indices rebuilt from a block-wide grid of the kernel, if any."""
    if function.body is None:
        return None
    locals_ = Locals(source, function)
    grids = {}
    for name, declaration, value in top_declarations(source, function):
        value = _value(value)
        operands = binary_operands(strip_casts(value), "/", "%") if value is not None else None
        # any thread expression the removal divided into warps (``ty * TX + tx`` with TX the
        # block's width written as a constant): the grid is only a relabeling of it
        if operands is not None and _thread_index(locals_, operands[0]):
            grids[name] = _Index(name, declaration, value, operands[0])
    found: dict[str, tuple[_Index, tuple[str, str]]] = {}
    for name, declaration, value in top_declarations(source, function):
        value = _value(value)
        for kind, op in (("warp", "/"), ("lane", "%")):
            names = _rebuilt_from(source, value, op) if value is not None else None
            if names and names[0] in grids and names[1] in grids and kind not in found:
                found[kind] = (_Index(name, declaration, value, value), names)
    if set(found) != {"warp", "lane"} or found["warp"][1] != found["lane"][1]:
        return None
    row, col = grids[found["warp"][1][0]], grids[found["warp"][1][1]]
    pair = GridPair(function, row, col, "")
    first = min(row.declaration, col.declaration, key=lambda n: n.start_byte)
    last = max(row.declaration, col.declaration, key=lambda n: n.start_byte)
    start = first.start_byte
    before = first.prev_sibling
    if before is not None and before.type == "comment" and source.text_of(before) == STRIPS:
        start = before.start_byte
    after = last.next_sibling
    while after is not None and WHOLE_ROWS in source.text_of(after):
        after = after.next_sibling
    if after is None:
        return None
    return RebuiltGrid(
        function, pair, found["warp"][0], found["lane"][0], (start, after.start_byte)
    )


def warp_lane_restored(source: ParsedSource, rebuilt: RebuiltGrid) -> list[Edit]:
    """Application on the removal's form: the grid and its checks deleted, the warp and lane
    indices divided from the thread index again."""
    thread = _wrapped(source.text_of(strip_casts(rebuilt.grid.row.thread)))
    return [
        Edit(*rebuilt.span, ""),
        Edit(rebuilt.warp.value.start_byte, rebuilt.warp.value.end_byte, f"{thread} / {WARP}"),
        Edit(rebuilt.lane.value.start_byte, rebuilt.lane.value.end_byte, f"{thread} % {WARP}"),
    ]
