"""Removing coarsening by a counted loop over a block's chunk, in a multi-pass reduction.

A block reduction without a grid-stride loop coarsens by a loop over ``K`` elements a block
apart, the block's share scaled by ``K``::

    for (int i = 0; i < NUM_PER_THREAD; i++)
      sum += g[blockIdx.x * NUM_PER_THREAD * blockSize + i * blockSize + tid];

(or ``i = blockIdx.x * (blockSize * K) + threadIdx.x`` before the loop, read as ``g[i + iter *
blockSize]``), so the host launches ``n / (K * blockSize)`` blocks and the kernel writes one
partial per block. Without the coarsening each thread reads one element: the loop goes (its
body stays, the term of the loop variable dropped from the index), the block's share loses the
factor ``K`` (a ``* K`` next to ``blockIdx.x``, in the index or in the initializer of a local it
reads), and every launch gets ``K`` times more blocks, which read exactly the elements the old
grid read, each once. The partial count then grows ``K`` times: the host side
(:mod:`klineage.mechanisms._multipass`) lets the second pass's count and the buffer follow, or
refuses. The rewritten index is checked by the index analysis: the old one with the loop
variable at 0 and the block's coefficient divided by ``K``.
"""

from __future__ import annotations

from klineage.cuda.analysis import Access, IndexForm, LoopVariable, analysis
from klineage.cuda.analysis.indices import is_loop_atom
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit, apply_edits
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    builtin_of,
    descendants,
    operator_of,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import Refused, size_at_launch
from klineage.mechanisms._multipass import (
    PartialLaunch,
    grid_blocks,
    grid_value,
    local_constants,
    partial_count_edits,
    scaled,
)

__all__ = ["chunk_loop_removal"]

_NEEDED = (
    "a counted loop `for (k = 0; k < K; k++)` (K fixed at compile time) whose body reads "
    "`x[blockIdx.x * K * B + k * B + t]` once, with no grid-stride loop, in a kernel writing "
    "one partial per block"
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def _chunk_access(
    source: ParsedSource, function: Function, loop: Node
) -> tuple[LoopVariable, Access]:
    indices = analysis(source).indices(function)
    variable = indices.loop_of(loop)
    header = source.snippet(loop, 50)
    if (
        loop.type != "for_statement"
        or variable is None
        or variable.bound is None
        or variable.init.value != 0
        or variable.step is None
        or variable.step.value != 1
    ):
        raise _refuse(f"`{header}`, not a loop from 0 by 1")
    templates = set(function.template_params)
    trip = indices.form(variable.bound)
    if not all(a in templates for a in trip.base_atoms()):
        raise _refuse(f"a loop to {trip}, not a count fixed at compile time")
    inside = [
        a
        for a in indices.accesses()
        if a.offset.depends_on(variable.atom)
        and loop.start_byte <= a.node.start_byte < loop.end_byte
    ]
    if len(inside) != 1 or inside[0].direction != "load" or inside[0].buffer.space != "global":
        raise _refuse(f"a loop making {len(inside)} accesses by {variable.name}, not one load")
    access = inside[0]
    step = access.offset.coefficient(variable.atom)
    if access.offset.coefficient("blockIdx.x") != trip * step or not step.terms:
        raise _refuse(
            f"a loop reading {access.buffer.name}[{access.offset}], whose block share is not "
            f"{trip} times the loop's step {step}"
        )
    if any(is_loop_atom(a) and a != variable.atom for a in access.offset.atoms()):
        raise _refuse(f"a load {access.buffer.name}[{access.offset}] inside another loop")
    return variable, access


def _term_edit(source: ParsedSource, access: Node, name: str) -> Edit:
    """Dropping the loop variable's term ``+ k * B`` from the load's index."""
    uses = [n for n in walk(access) if n.type == "identifier" and source.text_of(n) == name]
    if len(uses) != 1:
        raise _refuse(f"a load using the loop variable {name} {len(uses)} times")
    term = uses[0]
    while term.parent is not None and strip_parens(term.parent).type == "binary_expression":
        parent = term.parent
        if operator_of(parent) != "*":
            break
        term = parent
    while term.parent is not None and term.parent.type == "parenthesized_expression":
        term = term.parent
    plus = term.parent
    if plus is None or plus.type != "binary_expression" or operator_of(plus) != "+":
        raise _refuse(f"a load whose term `{source.text_of(term)}` is not added")
    left, right = plus.child_by_field_name("left"), plus.child_by_field_name("right")
    assert left is not None and right is not None
    if right == term:
        return Edit(left.end_byte, term.end_byte, "")
    return Edit(term.start_byte, right.start_byte, "")


def _factor_edits(
    source: ParsedSource, function: Function, loop: Node, access: Node, bound: Node
) -> list[tuple[Edit, Node | None]]:
    """Candidate edits dropping ``* K`` (K the loop's bound) from the load's index or the
    initializer of a local it reads; with the declaration edited (None for the index)."""
    wanted = " ".join(source.text_of(strip_parens(bound)).split())
    roots: list[tuple[Node, Node | None]] = [(access, None)]
    assert function.body is not None
    names = {source.text_of(n) for n in walk(access) if n.type == "identifier"}
    for decl in descendants(function.body, "declaration"):
        if decl.end_byte > loop.start_byte:
            continue
        for declarator in decl.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if target is not None and value is not None and source.text_of(target) in names:
                roots.append((value, decl))
    found = []
    for root, decl in roots:
        for node in [root, *descendants(root, "binary_expression")]:
            node = strip_parens(node)
            if node.type != "binary_expression" or operator_of(node) != "*":
                continue
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if left is None or right is None:
                continue
            for kept, factor in ((left, right), (right, left)):
                if " ".join(source.text_of(strip_parens(factor)).split()) == wanted:
                    found.append((Edit.replace(node, source.text_of(kept)), decl))
    return found


def _local_read_elsewhere(source: ParsedSource, function: Function, decl: Node, loop: Node) -> bool:
    assert function.body is not None
    names = {
        source.text_of(d.child_by_field_name("declarator") or d)
        for d in decl.children_by_field_name("declarator")
    }
    for node in walk(function.body):
        if node.type != "identifier" or source.text_of(node) not in names:
            continue
        if decl.start_byte <= node.start_byte < decl.end_byte:
            continue
        if not loop.start_byte <= node.start_byte < loop.end_byte:
            return True
    return bool(names & assigned_names(source, function.body))


def _kernel_edits(source: ParsedSource, function: Function, loop: Node) -> tuple[list[Edit], Node]:
    variable, access = _chunk_access(source, function, loop)
    assert variable.bound is not None
    body = loop.child_by_field_name("body")
    assert body is not None
    if access.helper is not None:
        raise _refuse(f"a load made in the helper {access.helper}")
    for node in walk(function.body) if function.body is not None else []:
        if node.type == "field_expression" and builtin_of(source, node) == "gridDim.x":
            raise _refuse("a kernel that reads gridDim.x, which more blocks would change")
    edits = [
        Edit(loop.start_byte, body.start_byte, ""),
        _term_edit(source, access.node, variable.name),
    ]
    pragma = source.pragma_before(loop, "unroll")
    if pragma is not None:
        edits.append(source.deletion(pragma.node, whole_line=True))
    old = access.offset
    trip = analysis(source).indices(function).form(variable.bound)
    for factor, decl in _factor_edits(source, function, loop, access.node, variable.bound):
        if decl is not None and _local_read_elsewhere(source, function, decl, loop):
            continue
        candidate = [*edits, factor]
        try:
            rewritten = apply_edits(source, candidate).parsed
        except Exception:
            continue
        again = rewritten.function(function.name)
        if again is None:
            continue
        loads = {
            a.offset
            for a in analysis(rewritten).indices(again).accesses()
            if a.buffer.name == access.buffer.name and a.direction == "load"
        }
        block = old.coefficient("blockIdx.x")
        rest = old.substitute({variable.atom: IndexForm.constant(0)}).without(["blockIdx.x"])
        for offset in loads:
            if offset.coefficient("blockIdx.x") * trip == block and (
                offset.without(["blockIdx.x"]) == rest
            ):
                return candidate, variable.bound
    raise _refuse(
        f"a load {access.buffer.name}[{old}] whose block share has no factor `* "
        f"{source.text_of(variable.bound)}` the rule can drop"
    )


def _factor_value(
    source: ParsedSource, kernel: Function, launch: Launch, bound: Node
) -> int | None:
    """The loop count at a launch when it is a constant."""
    host = source.enclosing_function(launch.node)
    constants = local_constants(source, host) if host is not None else source.integer_constants
    name = source.text_of(strip_parens(bound))
    if name in kernel.template_params:
        index = kernel.template_params.index(name)
        if index >= len(launch.template_args):
            return None
        return fold_int(source, launch.template_args[index], constants)
    return fold_int(source, bound, constants)


def chunk_loop_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """One element per thread instead of the counted loop ``loop``, and every launch ``K``
    times more blocks with the partial count following; NotInForm when not in the form."""
    edits, bound = _kernel_edits(source, function, loop)

    def launch_of(launch: Launch) -> PartialLaunch:
        try:
            factor = size_at_launch(source, function, launch, bound)
        except Refused as why:
            raise _refuse(f"a loop count that cannot be written at a launch ({why})") from why
        value = grid_value(source, launch)
        blocks = grid_blocks(source, launch)
        folded = _factor_value(source, function, launch, bound)
        grid = scaled(source, value, factor) if value is not None else f"grid * {factor}"
        count = blocks * folded if blocks is not None and folded is not None else None
        return PartialLaunch(launch, grid, count)

    return edits + partial_count_edits(source, function, launch_of, caps=False)
