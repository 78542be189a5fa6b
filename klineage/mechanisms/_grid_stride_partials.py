"""Removing a grid-stride ``while`` loop of a multi-pass reduction.

The reductions that "add during load" walk the input with a fixed grid (``64`` blocks, or
``min(maxBlocks, ...)``) and write one partial per block::

    unsigned int gridSize = blockSize * gridDim.x;
    unsigned int i = blockIdx.x * blockSize * 2 + threadIdx.x;
    gridSize = gridSize << 1;
    while (i < n) {
      mySum += g_idata[i];
      if ((i + blockSize) < n) mySum += g_idata[i + blockSize];
      i += gridSize;
    }

The loop starts at ``S * blockIdx.x + threadIdx.x`` and steps by ``S * gridDim.x`` (``S``, the
block's share of one turn, here ``2 * blockSize``). Without it each thread handles its turn's
elements once: ``while`` becomes ``if``, the step statement goes (and the step's variable, when
nothing else reads it), and every launch gets a grid of ``(n + S - 1) / S`` blocks, so the
blocks together cover what the loop's turns covered, each element once. The partial count
grows with the grid: the host side (:mod:`klineage.mechanisms._multipass`) writes the new
grid into the grid variable's declaration (deleting the cap), so the second pass's count and
the buffer follow, or refuses (a fixed ``__device__`` array: the new count has no bound).
"""

from __future__ import annotations

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    builtin_of,
    declaration_names,
    operator_of,
    statements,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import (
    Refused,
    index_bound,
    loop_bound_jumps,
    size_at_launch,
)
from klineage.mechanisms._multipass import PartialLaunch, partial_count_edits

__all__ = ["partial_loop_removal"]

_NEEDED = (
    "a `while (i < n)` loop from `S * blockIdx.x + threadIdx.x` whose last statement is `i += "
    "S * gridDim.x` (S the block's share of a turn), in a kernel writing one partial per block "
    "and reading gridDim.x only for that step"
)
_AXES = "xyz"


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def _share_text(source: ParsedSource, kernel: Function, launch: Launch, share: IndexForm) -> str:
    """The block's share ``S`` written at a launch (template parameters by their arguments,
    ``blockDim.x`` by the launch's block)."""
    products = []
    for monomial, coefficient in share.terms:
        factors = [] if coefficient == 1 else [str(coefficient)]
        for atom in monomial:
            if atom in kernel.template_params:
                index = kernel.template_params.index(atom)
                if index >= len(launch.template_args):
                    raise _refuse(f"a launch giving no template argument for {atom}")
                text = " ".join(source.text_of(launch.template_args[index]).split())
                factors.append(text if text.isidentifier() or text.isdigit() else f"({text})")
            elif atom == "blockDim.x" and launch.block is not None:
                factors.append(f"({' '.join(source.text_of(launch.block).split())})")
            elif atom in source.integer_constants:
                factors.append(atom)
            else:
                raise _refuse(f"a block share {share} whose {atom} cannot be written at a launch")
        products.append(" * ".join(factors) or "1")
    if len(products) != 1:
        raise _refuse(f"a block share {share} of several terms")
    return products[0]


def _step_variables(source: ParsedSource, function: Function) -> set[str]:
    """Names the kernel's grid-stride loops step by (``i += gridSize``)."""
    found = set()
    for variable in analysis(source).indices(function).loops:
        if variable.step is None or not variable.step.coefficient("gridDim.x").terms:
            continue
        for node in walk(variable.loop):
            if node.type == "assignment_expression" and operator_of(node) == "+=":
                left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
                if (
                    left is not None
                    and right is not None
                    and source.text_of(left) == variable.name
                    and strip_parens(right).type == "identifier"
                ):
                    found.add(source.text_of(strip_parens(right)))
    return found


def _statement_of(node: Node, body: Node) -> Node:
    current = node
    while (
        current.parent is not None
        and current.parent != body
        and current.type
        not in (
            "expression_statement",
            "declaration",
        )
    ):
        current = current.parent
    return current


def _grid_reads(source: ParsedSource, function: Function, steps: set[str]) -> None:
    """Refuse a read of gridDim.x that is not in a step variable's statements."""
    assert function.body is not None
    for node in walk(function.body):
        if node.type != "field_expression" or builtin_of(source, node) != "gridDim.x":
            continue
        statement = _statement_of(node, function.body)
        names = set(assigned_names(source, statement))
        if statement.type == "declaration":
            names |= set(declaration_names(source, statement))
        if not names or not names <= steps:
            raise _refuse(
                f"a kernel reading gridDim.x in `{source.snippet(statement, 40)}`, which the "
                "new grid would change"
            )


def _step_variable_edits(
    source: ParsedSource, function: Function, name: str, update: Node
) -> list[Edit]:
    """Deleting the statements of the step variable ``name`` when only they and ``update``
    read it."""
    assert function.body is not None
    own = []
    for node in walk(function.body):
        if node.type in ("declaration", "expression_statement") and (
            name in assigned_names(source, node)
            or (node.type == "declaration" and name in declaration_names(source, node))
        ):
            own.append(node)
    for node in walk(function.body):
        if node.type != "identifier" or source.text_of(node) != name:
            continue
        if update.start_byte <= node.start_byte < update.end_byte:
            continue
        if not any(s.start_byte <= node.start_byte < s.end_byte for s in own):
            return []  # another loop reads it: it stays
    if any(s.type == "declaration" and len(declaration_names(source, s)) != 1 for s in own):
        return []
    return [source.deletion(s, whole_line=True) for s in own]


def partial_loop_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """One turn per thread instead of the grid-stride ``while`` loop ``loop``, and launches
    whose grid covers the bound with the partial count following; NotInForm when not."""
    variable = analysis(source).indices(function).loop_of(loop)
    body = loop.child_by_field_name("body")
    condition = loop.child_by_field_name("condition")
    if loop.type != "while_statement" or variable is None or variable.step is None:
        raise _refuse(f"`{source.snippet(loop, 40)}`, not a `while` loop with a step")
    if body is None or condition is None or function.body is None or not function.is_kernel:
        raise _refuse(f"`{source.snippet(loop, 40)}`, not a loop of a kernel")
    share = variable.step.coefficient("gridDim.x")
    if variable.step != share * IndexForm.atom("gridDim.x") or variable.init != (
        share * IndexForm.atom("blockIdx.x") + IndexForm.atom("threadIdx.x")
    ):
        raise _refuse(
            f"a grid-stride loop from {variable.init} by {variable.step}, not from S·blockIdx.x "
            "+ threadIdx.x by S·gridDim.x"
        )
    values = [c for c in condition.named_children if c.type != "comment"]
    bound = index_bound(source, values[0], variable.name, exits=False) if values else None
    if bound is None:
        raise _refuse(f"a loop whose condition is not `{variable.name} < n`")
    written = {source.text_of(n) for n in walk(bound) if n.type == "identifier"}
    written &= assigned_names(source, function.body)
    if written:
        raise _refuse(f"a loop whose bound uses {', '.join(sorted(written))}, written")
    last = statements(body)[-1] if statements(body) else None
    update = last.named_children[0] if last is not None and last.named_children else None
    if (
        last is None
        or update is None
        or last.type != "expression_statement"
        or update.type != "assignment_expression"
        or operator_of(update) != "+="
        or source.text_of(update.child_by_field_name("left") or update) != variable.name
    ):
        raise _refuse(f"a loop whose last statement is not `{variable.name} += step`")
    others = [s for s in statements(body) if s != last]
    if variable.name in assigned_names(source, others):
        raise _refuse(f"a loop whose body writes its index {variable.name} elsewhere")
    jumps = loop_bound_jumps(body, ("break_statement", "continue_statement", "return_statement"))
    if jumps:
        raise _refuse(f"a loop left by `{source.snippet(jumps[0])}`")
    _grid_reads(source, function, _step_variables(source, function))
    keyword = loop.children[0]
    edits = [Edit.replace(keyword, "if"), source.deletion(last, whole_line=True)]
    step = strip_parens(update.child_by_field_name("right") or update)
    if step.type == "identifier":
        edits += _step_variable_edits(source, function, source.text_of(step), update)

    def launch_of(launch: Launch) -> PartialLaunch:
        try:
            size = size_at_launch(source, function, launch, bound)
        except Refused as why:
            raise _refuse(f"a loop bound that cannot be written at a launch ({why})") from why
        text = _share_text(source, function, launch, share)
        divisor = text if text.isidentifier() or text.isdigit() else f"({text})"
        return PartialLaunch(launch, f"(unsigned)(({size} + {text} - 1) / {divisor})", None)

    return edits + partial_count_edits(source, function, launch_of, caps=True)
