"""Block per row in the cooperative-groups spelling, removed (block -> thread per row).

The form (llm.c's attention backward kernel 8 once its rows per block are gone)::

    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    __shared__ float S[32];
    int r = N - 1 - blockIdx.x;                  // the row, counted down
    if (warp.meta_group_rank() == 0) { S[warp.thread_rank()] = 0; }   // slots zeroed once
    if (r < 0) return;                           // a row past the end exits
    float v = 0;
    for (int c = block.thread_rank(); c <= r; c += BlockSize) v += ...;
    S[warp.meta_group_rank()] = cg::reduce(warp, v, cg::plus<float>{});
    block.sync();
    v = cg::reduce(warp, S[warp.thread_rank()], cg::plus<float>{});
    for (int c = block.thread_rank(); c <= r; c += BlockSize) ... v ...;

``BlockSize`` is a template parameter each launch passes as its block size (or ``blockDim.x``),
and the warp reductions are ``cg::reduce`` over the warp or a warp-sum helper. Every warp
reloads all 32 slots, which the zeroing makes the block's sum. Removed: ``blockIdx.x`` in the
row becomes ``(blockIdx.x * blockDim.x + threadIdx.x)``; the loops start at 0 and step by 1;
the publish, barrier and reload go (one thread's partial is its row's sum), and with them the
zeroing, the scratch, the other block barriers and the group declarations left unused; each
launch's grid x becomes ``ceil(x / block)``. The row, counted down, must be checked by an early
``if (r < 0) return;``, which rejects the threads past the last row. Anything
else tied to the block (another rank query, shared memory, a shuffle) is refused with its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import call_arguments, declaration_names, statements, strip_parens, walk
from klineage.mechanisms._reductions_util import call_name, line_deletion
from klineage.mechanisms._rows_forms import NotCanonical
from klineage.mechanisms._rows_helpers import warp_reduce_functions

__all__ = ["block_size_parameters", "cg_block_rows"]

_BARRIERS = frozenset({"__syncthreads"})
_WARP_CALLS = (
    "__shfl",
    "__syncwarp",
    "__ballot",
    "__any_sync",
    "__all_sync",
    "__match",
    "__reduce",
)
_BLOCK_WORDS = ("threadIdx", "__shared__", "__syncthreads", "__shfl", "thread_rank", ".sync()")


@dataclass
class _Form:
    """What the walk over the kernel found, and the edits it wrote."""

    source: ParsedSource
    kernel: Function
    block: str
    warp: str
    edits: list[Edit] = field(default_factory=list)
    handled: list[Node] = field(default_factory=list)
    """Nodes tied to the block that an edit rewrites or deletes."""

    def line(self, node: Node) -> int:
        return node.start_point[0] + 1

    def text(self, node: Node | None) -> str:
        return "" if node is None else "".join(self.source.text_of(node).split())

    def rank(self, node: Node | None, kind: str, group: str) -> bool:
        """Whether ``node`` is ``group.<kind>()`` (kind ``thread_rank`` or
        ``meta_group_rank``)."""
        return self.text(node) == f"{group}.{kind}()"

    def delete(self, statement: Node) -> None:
        self.edits.append(line_deletion(self.source, statement))
        self.handled.append(statement)


def _groups(source: ParsedSource, kernel: Function) -> tuple[str, str]:
    """The kernel's block and warp group variables."""
    groups = analysis(source).cooperative_groups.groups
    mine = [g for (function, _), g in groups.items() if function == kernel.name]
    blocks = [g.name for g in mine if g.kind == "block"]
    warps = [g.name for g in mine if g.is_warp]
    if len(blocks) != 1 or len(warps) != 1:
        raise NotCanonical(
            f"{kernel.name} does not declare one thread block and one 32-thread tile "
            "(cg::this_thread_block, cg::tiled_partition<32>)"
        )
    return blocks[0], warps[0]


def block_size_parameters(source: ParsedSource, kernel: Function) -> list[str]:
    """The template parameters that every launch of the kernel passes as its block size."""
    launches = source.launches_of(kernel)
    return [
        parameter
        for index, parameter in enumerate(kernel.template_params)
        if launches
        and all(
            index < len(launch.template_args)
            and launch.block is not None
            and source.text_of(launch.template_args[index]).strip()
            == source.text_of(launch.block).strip()
            for launch in launches
        )
    ]


def _block_size_names(source: ParsedSource, kernel: Function, block: str) -> set[str]:
    """Spellings of the block's size: ``blockDim.x``, ``block.size()``, and a template
    parameter that every launch of the kernel passes as its block size."""
    names = {"blockDim.x", f"{block}.size()", f"{block}.num_threads()"}
    return names | set(block_size_parameters(source, kernel))


def _is_warp_sum(form: _Form, node: Node | None) -> Node | None:
    """The summed argument when ``node`` is a warp sum (``cg::reduce(warp, x, cg::plus<..>{})``
    or a call to a warp-sum helper)."""
    if node is None:
        return None
    node = strip_parens(node)
    if node.type != "call_expression":
        return None
    source = form.source
    reduces, _ = analysis(source).cooperative_groups.in_function(form.kernel)
    found: Node | None = None
    for reduce in reduces:
        if reduce.node == node and reduce.group is not None and reduce.group.is_warp:
            found = reduce.value if reduce.op == "sum" else None
    arguments = call_arguments(node)
    if found is None and call_name(source, node) in warp_reduce_functions(source):
        found = arguments[0] if len(arguments) == 1 else None
    return found


def _assignment(node: Node) -> tuple[Node, Node] | None:
    """``left = right;`` as its two sides."""
    if node.type != "expression_statement" or not node.named_children:
        return None
    expression = node.named_children[0]
    if expression.type != "assignment_expression":
        return None
    left, right = expression.child_by_field_name("left"), expression.child_by_field_name("right")
    operator = expression.child_by_field_name("operator")
    if left is None or right is None or (operator is not None and operator.type != "="):
        return None
    return left, right


def _scratch_slot(form: _Form, node: Node, kind: str) -> str | None:
    """The array of ``S[group.<kind>()]`` (kind ``meta_group_rank`` or ``thread_rank`` of the
    warp), else None."""
    node = strip_parens(node)
    if node.type != "subscript_expression":
        return None
    array = node.child_by_field_name("argument")
    indices = node.child_by_field_name("indices") or node.child_by_field_name("index")
    index = indices.named_children[0] if indices is not None and indices.named_children else None
    if array is None or array.type != "identifier" or not form.rank(index, kind, form.warp):
        return None
    return form.source.text_of(array)


def _block_reductions(form: _Form, body: list[Node]) -> set[str]:
    """Publish, barrier, reload runs: ``S[warp.meta_group_rank()] = sum(v); <barrier>;
    v2 = sum(S[warp.thread_rank()]);``. Each goes, the reload becoming ``v2 = v;`` (nothing
    when ``v2`` is ``v``). The scratch arrays they use."""
    scratch: set[str] = set()
    for index, statement in enumerate(body[:-2]):
        publish = _assignment(statement)
        if publish is None:
            continue
        array = _scratch_slot(form, publish[0], "meta_group_rank")
        partial = _is_warp_sum(form, publish[1])
        if array is None or partial is None:
            continue
        barrier, reload = body[index + 1], _assignment(body[index + 2])
        if not _is_barrier(form, barrier) or reload is None:
            raise NotCanonical(
                f"the per-warp sums published at line {form.line(statement)} are not followed "
                "by a block barrier and a reload `v = sum(S[warp.thread_rank()])`"
            )
        reloaded = _is_warp_sum(form, reload[1])
        if reloaded is None or _scratch_slot(form, reloaded, "thread_rank") != array:
            raise NotCanonical(
                f"line {form.line(body[index + 2])} does not reload every slot of {array} "
                "through a warp sum"
            )
        form.delete(statement)
        form.delete(barrier)
        target, value = form.text(reload[0]), form.source.text_of(partial)
        if target == form.text(partial):
            form.delete(body[index + 2])
        else:
            form.edits.append(Edit.replace(reload[1], value))
            form.handled.append(reload[1])
        scratch.add(array)
    return scratch


def _is_barrier(form: _Form, statement: Node) -> bool:
    """``__syncthreads();``, ``block.sync();`` or ``cg::sync(block);``."""
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    call = statement.named_children[0]
    if call.type != "call_expression":
        return False
    if call_name(form.source, call) in _BARRIERS:
        return True
    barrier = analysis(form.source).cooperative_groups.barrier_at(call)
    return barrier is not None and barrier.scope == "block"


def _zeroing(form: _Form, statement: Node, scratch: set[str]) -> bool:
    """``if (warp.meta_group_rank() == 0) { S[warp.thread_rank()] = 0; }``, S a scratch."""
    if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
        return False
    condition = form.text(statement.child_by_field_name("condition"))
    first_warp = f"{form.warp}.meta_group_rank()"
    if condition not in {f"({first_warp}==0)", f"(0=={first_warp})"}:
        return False
    body = statements(statement.child_by_field_name("consequence"))
    store = _assignment(body[0]) if len(body) == 1 else None
    return (
        store is not None
        and _scratch_slot(form, store[0], "thread_rank") in scratch
        and form.text(store[1]).rstrip("f") in {"0", "0.0", "0."}
    )


def _loops(form: _Form, sizes: set[str]) -> None:
    """``for (c = block.thread_rank(); c < or <= n; c += S)`` -> from 0 by 1."""
    assert form.kernel.body is not None
    for loop in walk(form.kernel.body):
        if loop.type != "for_statement":
            continue
        initializer = loop.child_by_field_name("initializer")
        update = loop.child_by_field_name("update")
        start = _start_value(initializer)
        if start is None or not form.rank(start, "thread_rank", form.block):
            continue
        step = update.child_by_field_name("right") if update is not None else None
        if (
            update is None
            or update.type != "assignment_expression"
            or form.source.text_of(update.child_by_field_name("operator") or update).strip() != "+="
            or form.text(step) not in sizes
        ):
            raise NotCanonical(
                f"the loop at line {form.line(loop)} starts at the block's rank but does not "
                "step by the block's size"
            )
        assert step is not None
        form.edits += [Edit.replace(start, "0"), Edit.replace(step, "1")]
        form.handled += [start, step]


def _start_value(initializer: Node | None) -> Node | None:
    """The value of ``int c = v`` (or ``c = v``) in a loop's initializer."""
    if initializer is None:
        return None
    if initializer.type == "declaration":
        declarator = initializer.child_by_field_name("declarator")
        return declarator.child_by_field_name("value") if declarator is not None else None
    if initializer.type == "assignment_expression":
        return initializer.child_by_field_name("right")
    return None


def _row(form: _Form, body: list[Node], scratch: set[str]) -> None:
    """The one ``blockIdx.x`` of the kernel, in a row ``N - 1 - blockIdx.x`` checked by an
    early ``if (r < 0) return;`` before any store, becomes the thread's global index."""
    assert form.kernel.body is not None
    uses = [
        n
        for n in walk(form.kernel.body)
        if form.source.text_of(n).strip() == "blockIdx.x" and n.type == "field_expression"
    ]
    if len(uses) != 1:
        raise NotCanonical(
            f"{form.kernel.name} reads blockIdx.x {len(uses)} times; this form takes one row "
            "index `r = N - 1 - blockIdx.x`"
        )
    (use,) = uses
    declaration = use.parent
    while declaration is not None and declaration.type != "declaration":
        declaration = declaration.parent
    declarator = declaration.child_by_field_name("declarator") if declaration else None
    value = declarator.child_by_field_name("value") if declarator else None
    name = declarator.child_by_field_name("declarator") if declarator else None
    if declaration is None or value is None or name is None or declaration not in body:
        raise NotCanonical(
            f"blockIdx.x at line {form.line(use)} is not the value of a row declared at the "
            "top of the kernel"
        )
    if not form.text(value).endswith("-1-blockIdx.x"):
        raise NotCanonical(
            f"the row at line {form.line(declaration)} is `{form.source.text_of(value)}`; this "
            "form takes rows counted down, `N - 1 - blockIdx.x`, whose exit `r < 0` rejects "
            "the threads past the last row"
        )
    aliases = {form.source.text_of(name)}
    checked = False
    for statement in body[body.index(declaration) + 1 :]:
        if not _zeroing(form, statement, scratch) and _stores(statement):
            raise NotCanonical(
                f"line {form.line(statement)} writes memory before the row's exit check; the "
                "threads past the last row would write too"
            )
        alias = _alias_of(form, statement, aliases)
        if alias is not None:
            aliases.add(alias)
        elif statement.type == "if_statement" and form.text(
            statement.child_by_field_name("consequence")
        ) in {"return;", "{return;}"}:
            condition = form.text(statement.child_by_field_name("condition"))
            checked = condition in {f"({a}<0)" for a in aliases}
            if checked:
                break
    if not checked:
        raise NotCanonical(
            f"no `if (r < 0) return;` after line {form.line(declaration)} rejects the threads "
            "past the last row"
        )
    form.edits.append(Edit.replace(use, "(blockIdx.x * blockDim.x + threadIdx.x)"))
    form.handled.append(use)


def _stores(statement: Node) -> bool:
    """Whether ``statement`` writes through a subscript or a pointer."""
    return any(
        n.type in ("assignment_expression", "update_expression")
        and (n.child_by_field_name("left") or n.child_by_field_name("argument") or n).type
        in ("subscript_expression", "pointer_expression", "field_expression")
        for n in walk(statement)
    )


def _alias_of(form: _Form, statement: Node, names: set[str]) -> str | None:
    """``int t = r;`` for ``r`` in ``names``: the alias ``t``."""
    if statement.type != "declaration":
        return None
    declarator = statement.child_by_field_name("declarator")
    value = declarator.child_by_field_name("value") if declarator else None
    name = declarator.child_by_field_name("declarator") if declarator else None
    if value is None or name is None or form.text(value) not in names:
        return None
    return form.source.text_of(name)


def _launches(form: _Form) -> None:
    """Each launch's grid x: ``ceil(x / block)``."""
    source = form.source
    launches: list[Launch] = source.launches_of(form.kernel)
    if not launches:
        raise NotCanonical(f"{form.kernel.name} is never launched in this file")
    for launch in launches:
        grid, block = launch.grid, launch.block
        if grid is None or block is None:
            raise NotCanonical(f"the launch at line {form.line(launch.node)} has no block size")
        if form.text(block).startswith("dim3"):
            raise NotCanonical(
                f"the launch at line {form.line(launch.node)} has a {form.text(block)} block; "
                "this form takes a one-dimensional block"
            )
        grid = strip_parens(grid)
        x = grid
        callee = grid.child_by_field_name("function")
        if grid.type == "call_expression" and form.text(callee) == "dim3":
            x = call_arguments(grid)[0]
        size, count = _operand(source.text_of(block)), _operand(source.text_of(x))
        form.edits.append(Edit.replace(x, f"({count} + {size} - 1) / {size}"))


def _operand(text: str) -> str:
    """``text`` as an operand of ``+`` and ``/``: a name or number as is, else parenthesized."""
    text = text.strip()
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _leftovers(form: _Form, scratch: set[str]) -> None:
    """Deletes the scratch, the zeroing, the block barriers and the unused group declarations,
    and refuses anything else tied to the block."""
    assert form.kernel.body is not None
    body = statements(form.kernel.body)
    for statement in body:
        if _zeroing(form, statement, scratch) or _is_barrier(form, statement):
            form.delete(statement)
        elif statement.type == "declaration" and "__shared__" in form.source.text_of(statement):
            if not set(declaration_names(form.source, statement)) <= scratch:
                raise NotCanonical(
                    f"the block shares memory beyond its reductions (line {form.line(statement)})"
                )
            form.delete(statement)

    def handled(node: Node) -> bool:
        return any(h.start_byte <= node.start_byte < h.end_byte for h in form.handled)

    for node in walk(form.kernel.body):
        text = form.source.text_of(node).strip()
        tied = node.type == "field_expression" and text.startswith(("threadIdx", "blockDim"))
        called = call_name(form.source, node) or ""
        helper = form.source.function(called) if node.type == "call_expression" else None
        tied |= node.type == "call_expression" and (
            "thread_rank" in text.split("(")[0]
            or "meta_group_rank" in text.split("(")[0]
            or called in _BARRIERS
            or called.startswith(_WARP_CALLS)
            or analysis(form.source).cooperative_groups.barrier_at(node) is not None
            or any(s.node == node for s in analysis(form.source).cooperative_groups.shuffles)
            or _is_warp_sum(form, node) is not None
            or (
                helper is not None
                and helper.name != form.kernel.name
                and any(w in form.source.text_of(helper.node) for w in _BLOCK_WORDS)
            )
        )
        if tied and not handled(node):
            raise NotCanonical(
                f"line {form.line(node)} still ties the kernel to the block (`{text[:60]}`)"
            )


def _unused_groups(form: _Form) -> None:
    """The warp and then the block declarations, once nothing else names them."""
    assert form.kernel.body is not None
    groups = analysis(form.source).cooperative_groups
    body = statements(form.kernel.body)
    deleted: list[Node] = []

    def outside(node: Node, spans: list[Node]) -> bool:
        return not any(s.start_byte <= node.start_byte < s.end_byte for s in spans)

    for name in (form.warp, form.block):
        group = groups.group(form.kernel, name)
        statement = next(
            (
                s
                for s in body
                if group is not None and s.start_byte <= group.declaration.start_byte < s.end_byte
            ),
            None,
        )
        if statement is None:
            continue
        spans = [statement, *form.handled, *deleted]
        if not any(
            n.type == "identifier" and form.source.text_of(n) == name and outside(n, spans)
            for n in walk(form.kernel.body)
        ):
            form.delete(statement)
            deleted.append(statement)


def cg_block_rows(source: ParsedSource, kernel: Function) -> list[Edit]:
    """The edits that make ``kernel`` (block per row, cooperative-groups spelling) one thread
    per row; NotCanonical, with the line, for anything else."""
    if kernel.body is None:
        raise NotCanonical(f"{kernel.name} has no body")
    block, warp = _groups(source, kernel)
    form = _Form(source, kernel, block, warp)
    body = statements(kernel.body)
    scratch = _block_reductions(form, body)
    if not scratch:
        raise NotCanonical(
            f"{kernel.name} has no block reduction `S[warp.meta_group_rank()] = sum(v); "
            "barrier; v = sum(S[warp.thread_rank()]);`"
        )
    _loops(form, _block_size_names(source, kernel, block))
    _row(form, body, scratch)
    _leftovers(form, scratch)
    _unused_groups(form)
    _launches(form)
    return form.edits
