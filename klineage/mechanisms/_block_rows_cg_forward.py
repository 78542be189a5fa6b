"""Block per row in the cooperative-groups spelling, written back (thread -> block per row).

The form (what :mod:`klineage.mechanisms._block_rows_cg` leaves: one thread per row, the rows
counted down from the grid's end)::

    int r = N - 1 - (blockIdx.x * blockDim.x + threadIdx.x);
    ...                                  // uniform code: offsets by blockIdx.y, no stores
    int t = r;
    if (t < 0) return;                   // a row past the end exits
    float v = 0.0f;
    for (int c = 0; c <= t; c += 1) v += ...;          // the row's one sum
    for (int c = 0; c <= t; c += 1) p[c] = ... v ...;  // element-wise

each launch's grid x ``ceil(x / block)``. Written back, in the expert's spelling: the block and
32-thread tile groups and a 32-slot ``__shared__`` scratch after the kernel's
``cooperative_groups`` alias; ``blockIdx.x`` alone in the row, so the rows stay counted down;
the scratch zeroed by the first warp before the exit, then a barrier (every warp reloads all 32
slots, and the zeroing must land before any warp publishes); each loop from
``block.thread_rank()`` by the block size (the template parameter every launch passes as it,
else ``blockDim.x``); after the reducing loop ``S[warp.meta_group_rank()] = cg::reduce(warp, v,
cg::plus<float>{}); block.sync(); v = cg::reduce(warp, S[warp.thread_rank()], ...)``; each
launch's grid x back to ``x`` blocks of the same size. Loops and reads are checked as the
canonical thread-per-row form's are (:func:`klineage.mechanisms._rows_thread.
thread_row_walk`). Refused, with the form: more or other reductions than one float sum, stores
outside row loops (every thread of the block would do them), loops unrolled, packed or walked
back, a launch whose grid x is not ``ceil(x / block)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import call_arguments, statements, strip_parens, walk
from klineage.mechanisms._block_rows_cg import block_size_parameters
from klineage.mechanisms._reductions_util import builtin_uses, fresh_name
from klineage.mechanisms._rows_forms import NotCanonical, RowLoop
from klineage.mechanisms._rows_thread import thread_row_walk

__all__ = ["CG_ROWS", "counted_down_rows", "write_cg_block_rows"]

CG_ROWS = "cg_rows"
"""The form name a candidate of this form carries in its detail."""

_NAMESPACE = "cooperative_groups"
_HEADERS = ("cooperative_groups.h", "cooperative_groups/reduce.h")
_UNIFORM_BUILTINS = frozenset({"blockIdx.y", "blockIdx.z", "gridDim.y", "gridDim.z"})
"""Built-ins every thread of a block shares, which the launch's grid x does not change."""
_THREAD_ROW = IndexForm.atom("blockIdx.x") * IndexForm.atom("blockDim.x") + IndexForm.atom(
    "threadIdx.x"
)


@dataclass(frozen=True)
class CountedDownRows:
    """A thread per row, rows counted down: where the block's pieces go back."""

    declaration: Node
    """``int r = N - 1 - (blockIdx.x * blockDim.x + threadIdx.x);``"""
    thread_row: Node
    """The ``(blockIdx.x * blockDim.x + threadIdx.x)`` in it."""
    exit: Node
    """``if (t < 0) return;``, ``t`` the row."""
    zeroing_before: Node
    """The statement the zeroing goes before: the exit, or the run of aliases of the row
    declared right before it."""


def _declared_value(statement: Node) -> Node | None:
    """The value of a declaration of one initialized name."""
    if statement.type != "declaration":
        return None
    declarators = statement.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    return declarators[0].child_by_field_name("value")


def _thread_row_node(indices: FunctionIndices, value: Node) -> Node | None:
    """The outermost node of ``value`` whose form is the thread's global index."""
    return next((n for n in walk(value) if n.is_named and indices.form(n) == _THREAD_ROW), None)


def _exits_below_zero(indices: FunctionIndices, statement: Node, row: IndexForm) -> bool:
    """``if (t < 0) return;`` with ``t`` the row."""
    source = indices.source
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return False
    consequence = statement.child_by_field_name("consequence")
    if consequence is None or "".join(source.text_of(consequence).split()) not in (
        "return;",
        "{return;}",
    ):
        return False
    condition = statement.child_by_field_name("condition")
    test = strip_parens(condition.named_children[0]) if condition is not None else None
    if test is None or test.type != "binary_expression":
        return False
    operator, left = test.child_by_field_name("operator"), test.child_by_field_name("left")
    right = test.child_by_field_name("right")
    return (
        operator is not None
        and operator.type == "<"
        and left is not None
        and right is not None
        and indices.form(left) == row
        and indices.form(right) == IndexForm.constant(0)
    )


def _aliases(indices: FunctionIndices, statement: Node, row: IndexForm) -> bool:
    """``int t = r;``: a declaration whose value is the row."""
    value = _declared_value(statement)
    return value is not None and indices.form(value) == row


def counted_down_rows(source: ParsedSource, kernel: Function) -> CountedDownRows | None:
    """The rows of a thread-per-row kernel counted down from ``N - 1`` (``N`` the same for
    every thread; the removal writes that form back, ``N - 1 - blockIdx.x``) and left by
    ``if (r < 0) return;``; None for another kernel (no candidate of this form)."""
    if kernel.body is None:
        return None
    indices = analysis(source).indices(kernel)
    body = statements(kernel.body)
    for position, statement in enumerate(body):
        value = _declared_value(statement)
        thread_row = _thread_row_node(indices, value) if value is not None else None
        if value is None or thread_row is None:
            continue
        row = indices.form(value)
        top = row + _THREAD_ROW  # N - 1
        if not indices.is_uniform(top) or top.constant_term != -1:
            return None  # the thread's index enters otherwise than counted down from N - 1
        exit_at = next(
            (i for i in range(position + 1, len(body)) if _exits_below_zero(indices, body[i], row)),
            None,
        )
        if exit_at is None:
            return None
        first = exit_at
        while first - 1 > position and _aliases(indices, body[first - 1], row):
            first -= 1
        return CountedDownRows(statement, thread_row, body[exit_at], body[first])
    return None


@dataclass
class _Writer:
    """The kernel, its rows, and the names and edits the rewrite makes."""

    source: ParsedSource
    kernel: Function
    rows: CountedDownRows
    namespace: str
    block: str
    warp: str
    scratch: str
    unit: str
    """One level of indentation."""

    def indent(self, node: Node) -> str:
        return self.source.indent_of(node.start_byte)

    def reduce(self, value: str) -> str:
        return f"{self.namespace}::reduce({self.warp}, {value}, {self.namespace}::plus<float>{{}})"


def _check_layout(source: ParsedSource, kernel: Function, rows: CountedDownRows) -> list[Node]:
    """The nodes that may use the thread layout: the row, and built-ins a block shares. No
    return may come before the exit check: the barrier after the zeroing waits for every
    thread."""
    assert kernel.body is not None
    allowed = [rows.declaration]
    for use in builtin_uses(source, kernel.body):
        if "".join(source.text_of(use).split()) in _UNIFORM_BUILTINS:
            allowed.append(use)
    for node in walk(kernel.body):
        before_exit = rows.declaration.start_byte <= node.start_byte < rows.exit.start_byte
        if node.type == "return_statement" and before_exit:
            raise NotCanonical(
                f"line {source.line_of(node.start_byte)} returns before the row's exit check "
                f"(line {source.line_of(rows.exit.start_byte)}); this form zeroes the block's "
                "scratch and waits for every thread there"
            )
    return allowed


def _the_sum(source: ParsedSource, kernel: Function, loops: list[RowLoop]) -> tuple[RowLoop, str]:
    """The one loop that reduces, and its one float sum."""
    reduced = [(loop, name, op) for loop in loops for name, op in loop.accumulators.items()]
    if len(reduced) != 1 or reduced[0][2] != "sum":
        found = ", ".join(f"{name} ({op})" for _, name, op in reduced) or "none"
        raise NotCanonical(
            f"{kernel.name} reduces {found} over its row; this form writes back one float sum "
            "per row (cg::reduce with cg::plus<float>)"
        )
    loop, name, _ = reduced[0]
    return loop, name


def _check_loops(source: ParsedSource, loops: list[RowLoop], rows: CountedDownRows) -> None:
    """Plain loops, after the exit check (the slots are zeroed before it)."""
    for loop in loops:
        line = source.line_of(loop.node.start_byte)
        if loop.unrolled is not None or loop.unit is not None or loop.down:
            raise NotCanonical(
                f"the loop at line {line} is unrolled, packed or walks back; this form takes "
                "for (T c = 0; c < n or c <= n; c += 1)"
            )
        if loop.node.start_byte < rows.exit.end_byte:
            raise NotCanonical(
                f"the loop at line {line} comes before the row's exit check (line "
                f"{source.line_of(rows.exit.start_byte)}); this form zeroes the block's scratch "
                "there and reduces after it"
            )


def _namespace(source: ParsedSource, kernel: Function) -> tuple[str, Node | None]:
    """The kernel's alias of cooperative_groups (the statement, when the body declares it),
    else a file-scope one, else ``cg`` with no statement (it is then written)."""
    assert kernel.body is not None
    aliases = [
        n
        for n in walk(source.tree.root_node)
        if n.type == "namespace_alias_definition"
        and "".join(source.text_of(n).split()).endswith(f"={_NAMESPACE};")
    ]
    for alias in aliases:
        if alias.parent == kernel.body:
            name = alias.child_by_field_name("name")
            return (source.text_of(name) if name else "cg"), alias
    for alias in aliases:
        if source.enclosing_function(alias) is None:
            name = alias.child_by_field_name("name")
            return (source.text_of(name) if name else "cg"), None
    return "cg", None


def _includes(source: ParsedSource) -> list[Edit]:
    """The cooperative-groups headers the file lacks, after its last include."""
    root = source.tree.root_node
    includes = [n for n in root.children if n.type == "preproc_include"]
    present = {"".join(source.text_of(n).split()) for n in includes}
    missing = [h for h in _HEADERS if f"#include<{h}>" not in present]
    if not missing:
        return []
    at = includes[-1].end_byte if includes else 0
    text = "".join(f"#include <{h}>\n" for h in missing)
    if includes and not source.text_of(includes[-1]).endswith("\n"):
        text = "\n" + text
    return [Edit.insert(at, text)]


def _declarations(writer: _Writer, alias: Node | None) -> Edit:
    """The groups and the scratch, after the alias (written first when there is none)."""
    body = writer.kernel.body
    assert body is not None
    first = statements(body)[0]
    indent = writer.indent(first)
    ns = writer.namespace
    lines = [
        f"{ns}::thread_block {writer.block} = {ns}::this_thread_block();",
        f"{ns}::thread_block_tile<32> {writer.warp} = {ns}::tiled_partition<32>({writer.block});",
        f"__shared__ float {writer.scratch}[32];",
    ]
    if alias is None:
        lines.insert(0, f"namespace {ns} = {_NAMESPACE};")
        return Edit.insert(
            writer.source.line_start(first.start_byte), "".join(f"{indent}{s}\n" for s in lines)
        )
    return Edit.insert(alias.end_byte, "".join(f"\n{indent}{s}" for s in lines))


def _zeroing(writer: _Writer) -> Edit:
    """The first warp zeroes every slot, then the block waits for it."""
    at = writer.rows.zeroing_before
    indent, w = writer.indent(at), writer.warp
    text = (
        f"if ({w}.meta_group_rank() == 0) {{\n"
        f"{indent}{writer.unit}{writer.scratch}[{w}.thread_rank()] = 0.0f;\n"
        f"{indent}}}\n"
        f"{indent}{writer.block}.sync();\n"
        f"{indent}"
    )
    return Edit.insert(at.start_byte, text)


def _block_sum(writer: _Writer, loop: RowLoop, name: str) -> Edit:
    """Publish each warp's sum, wait, and reload every slot into the sum."""
    indent, w = writer.indent(loop.node), writer.warp
    text = (
        f"\n{indent}{writer.scratch}[{w}.meta_group_rank()] = {writer.reduce(name)};"
        f"\n{indent}{writer.block}.sync();"
        f"\n{indent}{name} = {writer.reduce(f'{writer.scratch}[{w}.thread_rank()]')};"
    )
    return Edit.insert(loop.node.end_byte, text)


def _strided(writer: _Writer, loop: RowLoop, stride: str) -> list[Edit]:
    """From the block's rank, by its size."""
    edits = [Edit.replace(loop.start, f"{writer.block}.thread_rank()")]
    update = loop.update
    step = update.child_by_field_name("right") if update.type == "assignment_expression" else None
    if step is not None and writer.source.text_of(step).strip() == "1":
        return [*edits, Edit.replace(step, stride)]
    return [*edits, Edit.replace(update, f"{loop.variable} += {stride}")]


def _grid_count(source: ParsedSource, launch: Launch) -> tuple[Node, str] | None:
    """(grid x node, x) when the grid x is ``(x + B - 1) / B``, ``B`` the launch's block."""
    grid, block = launch.grid, launch.block
    if grid is None or block is None:
        return None
    grid = strip_parens(grid)
    callee = grid.child_by_field_name("function")
    if grid.type == "call_expression" and callee is not None and source.text_of(callee) == "dim3":
        grid = call_arguments(grid)[0]
    size = "".join(source.text_of(block).split())

    def parts(node: Node | None, operator: str) -> tuple[Node, str] | None:
        """(left, right's text) of ``left <operator> right``."""
        node = strip_parens(node) if node is not None else None
        if node is None or node.type != "binary_expression":
            return None
        op, left = node.child_by_field_name("operator"), node.child_by_field_name("left")
        right = node.child_by_field_name("right")
        if op is None or op.type != operator or left is None or right is None:
            return None
        return left, "".join(source.text_of(right).split())

    quotient = parts(grid, "/")
    rounded = parts(quotient[0], "-") if quotient is not None and quotient[1] == size else None
    count = parts(rounded[0], "+") if rounded is not None and rounded[1] == "1" else None
    if count is None or count[1] != size:
        return None
    return grid, source.text_of(strip_parens(count[0]))


def _launches(writer: _Writer) -> list[Edit]:
    """Each launch's grid x: ``ceil(x / block)`` back to ``x``, one block per row."""
    source = writer.source
    launches = source.launches_of(writer.kernel)
    if not launches:
        raise NotCanonical(f"{writer.kernel.name} is never launched in this file")
    edits = []
    for launch in launches:
        block = launch.block
        if block is None or "".join(source.text_of(block).split()).startswith("dim3"):
            raise NotCanonical(
                f"the launch at line {source.line_of(launch.node.start_byte)} has no "
                "one-dimensional block; this form takes <<<ceil(x / B), B>>>"
            )
        found = _grid_count(source, launch)
        if found is None:
            grid = source.text_of(launch.grid) if launch.grid is not None else "none"
            raise NotCanonical(
                f"the launch at line {source.line_of(launch.node.start_byte)} has grid `{grid}`; "
                f"this form takes grid x (x + B - 1) / B with B its block size "
                f"`{source.text_of(block)}`"
            )
        edits.append(Edit.replace(found[0], found[1]))
    return edits


def _merged(edits: list[Edit]) -> list[Edit]:
    """Insertions at one place joined in order (an edit set holds one per place)."""
    joined: dict[tuple[int, int], str] = {}
    for edit in edits:
        key = (edit.start_byte, edit.end_byte)
        if key in joined and edit.is_insertion:
            joined[key] += edit.replacement
        else:
            joined[key] = edit.replacement
    return [Edit(start, end, text) for (start, end), text in joined.items()]


def write_cg_block_rows(source: ParsedSource, kernel: Function) -> list[Edit]:
    """The edits that give each row of ``kernel`` (a thread per row, counted down) a block
    in the cooperative-groups spelling; NotCanonical, with the form, for anything else."""
    rows = counted_down_rows(source, kernel)
    if rows is None or kernel.body is None:
        raise NotCanonical(
            f"{kernel.name} has no row `r = N - 1 - (blockIdx.x * blockDim.x + threadIdx.x)` "
            "left by `if (r < 0) return;`"
        )
    allowed = _check_layout(source, kernel, rows)
    walked = [
        s
        for s in statements(kernel.body)
        if s != rows.declaration and s.type != "namespace_alias_definition"
    ]
    loops, stores = thread_row_walk(source, kernel, walked, allowed)
    if stores:
        raise NotCanonical(
            f"line {source.line_of(stores[0].start_byte)} stores outside a row loop; every "
            "thread of the block would repeat it (this form takes stores in row loops only)"
        )
    _check_loops(source, loops, rows)
    loop, name = _the_sum(source, kernel, loops)
    namespace, alias = _namespace(source, kernel)
    taken = {source.text_of(n) for n in walk(kernel.node) if n.type == "identifier"}
    first = statements(kernel.body)[0]
    outer = source.indent_of(kernel.outer.start_byte)
    writer = _Writer(
        source,
        kernel,
        rows,
        namespace,
        fresh_name(taken, "block"),
        fresh_name(taken, "warp"),
        fresh_name(taken, "warp_sums"),
        source.indent_of(first.start_byte)[len(outer) :] or "  ",
    )
    stride = next(iter(block_size_parameters(source, kernel)), "blockDim.x")
    edits = [*_includes(source), _declarations(writer, alias), _zeroing(writer)]
    edits.append(Edit.replace(rows.thread_row, "blockIdx.x"))
    for each in loops:
        edits += _strided(writer, each, stride)
    edits.append(_block_sum(writer, loop, name))
    return _merged([*edits, *_launches(writer)])
