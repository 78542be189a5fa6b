"""Removing a serpentine block order: ``cond ? (gridDim.y - blockIdx.y - 1) * T : blockIdx.y * T``.

A serpentine order walks every other column of blocks backwards (a condition on another block
index picks the reversed branch), so consecutive blocks share operand tiles in L2. Both
branches enumerate the same tiles as ``blockIdx.d`` runs over the grid: the reversed one is the
plain one with ``blockIdx.d`` replaced by ``gridDim.d - 1 - blockIdx.d``. Taking the plain
branch for every block is therefore still a bijection of blocks to tiles, and the kernel
computes the same output in row-major order. The index analysis checks that relation on the
two branches' forms, whatever the spelling.
"""

from __future__ import annotations

from klineage.cuda.analysis import FunctionIndices, IndexForm, analysis
from klineage.cuda.cexpr import precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm, descendants, strip_parens

__all__ = ["serpentine_removal"]

_NEEDED = (
    "a serpentine order `c ? R : P` whose branch R is P with blockIdx.d replaced by "
    "`gridDim.d - 1 - blockIdx.d`"
)


def _reversal_of(indices: FunctionIndices, plain: Node, reversed_: Node) -> str | None:
    """The grid axis along which ``reversed_`` walks ``plain`` backwards, if it does."""
    plain_form, reversed_form = indices.form(plain), indices.form(reversed_)
    for axis in "xyz":
        block, grid = f"blockIdx.{axis}", f"gridDim.{axis}"
        if not plain_form.depends_on(block) or plain_form.depends_on(grid):
            continue
        flipped = IndexForm.atom(grid) - 1 - IndexForm.atom(block)
        if reversed_form.substitute({block: flipped}) == plain_form:
            return axis
    return None


def serpentine_removal(source: ParsedSource, function: Function, statement: Node) -> list[Edit]:
    """The edits that give every block the plain branch of the serpentine order in
    ``statement``; NotInForm when its branches are not a reversal of each other."""
    indices = analysis(source).indices(function)
    choices = [statement] if statement.type == "conditional_expression" else []
    choices += list(descendants(statement, "conditional_expression"))
    for node in choices:
        branches = [node.child_by_field_name(f) for f in ("consequence", "alternative")]
        if branches[0] is None or branches[1] is None:
            continue
        for plain, reversed_ in (branches, branches[::-1]):
            if _reversal_of(indices, plain, reversed_) is not None:
                kept = strip_parens(plain)
                return [Edit.replace(node, wrap_at(node, source.text_of(kept), precedence(kept)))]
    raise NotInForm(
        f"a block order `{source.snippet(statement, 60)}` whose branches are not one walked "
        "backwards",
        _NEEDED,
    )
