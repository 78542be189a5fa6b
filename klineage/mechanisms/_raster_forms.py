"""Block orders other than row-major, recognized by what the block index goes through.

A kernel rasterizes when the tile a block computes is not ``blockIdx`` times the tile size but
a remapping of it: a serpentine order (``blockIdx.z % 2 ? gridDim.y - blockIdx.y - 1 :
blockIdx.y``: a condition on the block index choosing between block-dependent values), a
diagonal order (``(blockIdx.x + blockIdx.y) % gridDim.x``: a modulo of a sum of block
indices), or an order read from a table the host fills, handed out by a scheduler object in a
persistent loop. Each is reported with its form and refused: any bijection of blocks to tiles
computes the same output, but turning one into row-major order needs the tile counts and
origins identified, which no rule does.
"""

from __future__ import annotations

from klineage.cuda.analysis import FunctionIndices, analysis
from klineage.cuda.analysis.indices import BLOCK_ATOMS, THREAD_ATOMS, is_loop_atom
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import binary_operands, descendants, operator_of
from klineage.mechanisms._forms import FoundForm
from klineage.mechanisms._grid_stride_forms import scheduler_loops

__all__ = ["raster_forms"]

_SERPENTINE = "a serpentine block order (a condition on the block index)"
_NEEDED = "a grouped order whose group size is a file constant read in a `min(...)` (set to 1)"


def _block_only(indices: FunctionIndices, node: Node) -> set[str]:
    """The block atoms ``node`` depends on, when it depends on nothing thread- or loop-
    dependent; empty otherwise."""
    atoms = indices.form(node).base_atoms()
    if any(a in THREAD_ATOMS or is_loop_atom(a) for a in atoms):
        return set()
    return {a for a in atoms if a in BLOCK_ATOMS}


def _address_atoms(indices: FunctionIndices) -> set[str]:
    """The atoms global addresses are made of (opaque atoms' dependencies included)."""
    found: set[str] = set()
    for access in indices.accesses():
        if access.buffer.space == "global":
            found |= access.offset.atoms()
            for _, depends in access.offset.opaque:
                found |= depends
    return found


def _used_in_addresses(indices: FunctionIndices, node: Node, atoms: set[str]) -> bool:
    return f"[{' '.join(indices.source.text_of(node).split())}]" in atoms


def _remaps(indices: FunctionIndices, function: Function) -> list[tuple[Node, str]]:
    assert function.body is not None
    found = []
    atoms: set[str] | None = None
    for node in indices.nodes("conditional_expression", "binary_expression"):
        if node.type == "conditional_expression":
            condition = node.child_by_field_name("condition")
            branches = [node.child_by_field_name(f) for f in ("consequence", "alternative")]
            if condition is None or None in branches or not _block_only(indices, condition):
                continue
            blocks = all(_block_only(indices, b) for b in branches if b is not None)
            if blocks and atoms is None:
                atoms = _address_atoms(indices)
            if blocks and _used_in_addresses(indices, node, atoms or set()):
                found.append((node, _SERPENTINE))
            continue
        sides = binary_operands(node, "%")
        if sides is None or operator_of(node) != "%":
            continue
        if len(_block_only(indices, sides[0])) >= 2:
            found.append((node, "a diagonal block order (a modulo of a sum of block indices)"))
    return found


def _table_orders(source: ParsedSource, function: Function) -> list[tuple[Node, str]]:
    found = []
    for scheduled in scheduler_loops(source, function):
        method = scheduled.method
        if method.body is not None and any(descendants(method.body, "subscript_expression")):
            form = f"a tile order read from a table by the scheduler's {method.name}"
            found.append((scheduled.loop, form))
    return found


def raster_forms(source: ParsedSource, skip: set[str]) -> list[FoundForm]:
    """Remapped block orders of the kernels not named in ``skip``, one site per kernel."""
    found = []
    for function in source.kernels:
        if function.body is None or function.name in skip:
            continue
        indices = analysis(source).indices(function)
        remaps = _remaps(indices, function) + _table_orders(source, function)
        if remaps:
            node, form = remaps[0]
            statement = node
            while statement.type != "while_statement" and statement.parent not in (
                None,
                function.body,
            ):
                statement = statement.parent
            kind = "serpentine" if form == _SERPENTINE else ""
            found.append(FoundForm(statement, function, form, _NEEDED, kind))
    return found
