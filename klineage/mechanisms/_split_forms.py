"""Split-K recognized by what the counts and indices do, whatever they are called.

- a host-side *split count*: a local initialized to 1, raised under a condition (``if (tiles <
  sms) n = ...;``), that becomes the y or z extent of a launch's grid (``dim3(tiles, n)``);
- a kernel-side *K range per block*: a top-level value ``blockIdx.y * S`` (``.z``) with a
  run-time ``S``, in a kernel whose loops start or stop by ``blockIdx.y``;
- a *partial per split*: a loop grid-strided over ``gridDim.y`` (``.z``) whose results are
  stored at offsets that depend on ``blockIdx.y``: each block row writes its own partial;
- a *sum of the partials*: a kernel looping up to a parameter that a launch in the file passes
  the split count for.
"""

from __future__ import annotations

from klineage.cuda.analysis import FunctionIndices, LoopVariable, analysis
from klineage.cuda.source import Function, Launch, Node, ParsedSource, strip_casts
from klineage.cuda.tree import dim3_extents, statements, strip_parens

__all__ = ["grid_split_counts", "k_range_declarations", "partial_loops", "partial_sums"]

_SPLIT_DIMENSIONS = ("y", "z")


def _grid_components(source: ParsedSource, launch: Launch) -> list[str]:
    """The y and z extents of a launch's grid, casts left out: ``dim3(x, y, z)`` written in
    the launch, or a ``dim3`` local it names (``const dim3 grid(x, (unsigned)y);``)."""
    grid = launch.grid
    if grid is None:
        return []
    grid = strip_parens(grid)
    if grid.type == "identifier":
        grid = _dim3_value(source, launch, source.text_of(grid)) or grid
    extents = dim3_extents(grid)
    return [source.text_of(strip_parens(strip_casts(a))).strip() for a in extents[1:]]


def _dim3_value(source: ParsedSource, launch: Launch, name: str) -> Node | None:
    """The initializer of the ``dim3`` local ``name`` declared before ``launch`` in its
    function: ``(x, y)``, ``{x, y}`` or ``dim3(x, y)``."""
    function = source.enclosing_function(launch.node)
    if function is None or function.body is None:
        return None
    found = None
    for declaration in source.iter_nodes("declaration", within=function.body):
        if declaration.start_byte >= launch.node.start_byte:
            break
        kind = declaration.child_by_field_name("type")
        if kind is None or source.text_of(kind).strip() != "dim3":
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            if inner is not None and source.text_of(inner) == name:
                found = declarator.child_by_field_name("value")
    return found


def grid_split_counts(source: ParsedSource) -> set[str]:
    """Names that are the y or z extent of some launch's grid."""
    return {c for launch in source.launches for c in _grid_components(source, launch)}


def k_range_declarations(source: ParsedSource, function: Function) -> list[Node]:
    """Top-level declarations ``begin = blockIdx.y * S`` of a kernel whose loops start or
    stop by that block index (its K range)."""
    if function.body is None:
        return []
    indices = analysis(source).indices(function)
    used = set()
    apart = set()  # dimensions some loop shows to pick rows, not chunks of one range
    for loop in indices.loops:
        bound = indices.form(loop.bound).base_atoms() if loop.bound is not None else frozenset()
        for dimension in _SPLIT_DIMENSIONS:
            step = loop.step.base_atoms() if loop.step is not None else frozenset()
            if f"gridDim.{dimension}" in step:
                continue  # a grid-stride loop, not a range
            if f"blockIdx.{dimension}" in (loop.init.base_atoms() | bound):
                used.add(dimension)
                if _rows_apart(indices, loop, dimension):
                    apart.add(dimension)
    used -= apart
    found = []
    for statement in statements(function.body):
        if statement.type != "declaration":
            continue
        for declarator in statement.children_by_field_name("declarator"):
            value = declarator.child_by_field_name("value")
            if value is None:
                continue
            form = indices.form(value)
            for dimension in used:
                scale = form.coefficient(f"blockIdx.{dimension}")
                rest = form.without({f"blockIdx.{dimension}"})
                ranged = scale.terms and scale.value is None and indices.is_uniform(scale)
                if ranged and not indices.thread_atoms(rest):
                    found.append(statement)
    return found


def _rows_apart(indices: FunctionIndices, loop: LoopVariable, dimension: str) -> bool:
    """Whether the loop's range, started at ``blockIdx.d * S``, is ``S`` divided by a factor
    of two or more: the blocks along ``d`` then walk ranges with gaps between them (the rows
    of a tiled product, ``a`` from ``wA * TILE * blockIdx.y`` to ``a + wA - 1``), not chunks
    of one range split among them, each as long as the step from one block's start to the
    next (or clamped, which reads as opaque and keeps the reading)."""
    if loop.bound is None:
        return False
    scale = loop.init.coefficient(f"blockIdx.{dimension}")
    extent = indices.form(loop.bound) - loop.init
    condition = loop.loop.child_by_field_name("condition")
    operator = condition.child_by_field_name("operator") if condition is not None else None
    if operator is not None and operator.type == "<=":
        extent = extent + 1
    if extent.opaque or scale.opaque or extent.depends_on(f"blockIdx.{dimension}"):
        return False
    if indices.thread_atoms(extent) or len(scale.terms) != 1 or len(extent.terms) != 1:
        return False
    ((scale_atoms, scale_count),) = scale.terms
    ((extent_atoms, extent_count),) = extent.terms
    if extent_count <= 0 or scale_count % extent_count:
        return False
    rest = list(scale_atoms)
    for atom in extent_atoms:
        if atom not in rest:
            return False
        rest.remove(atom)
    return bool(rest) or scale_count // extent_count >= 2


def partial_loops(source: ParsedSource, function: Function) -> list[Node]:
    """Loops grid-strided over gridDim.y (z) whose kernel stores per-``blockIdx.y`` partials."""
    indices = analysis(source).indices(function)
    stores = [
        a for a in indices.accesses() if a.direction == "store" and a.buffer.space == "global"
    ]
    found = []
    for loop in indices.loops:
        step = loop.step
        if step is None:
            continue
        for dimension in _SPLIT_DIMENSIONS:
            if not step.coefficient(f"gridDim.{dimension}").terms:
                continue
            if loop.init.coefficient(f"blockIdx.{dimension}").terms and any(
                s.offset.coefficient(f"blockIdx.{dimension}").terms
                and not loop.loop.start_byte <= s.node.start_byte < loop.loop.end_byte
                for s in stores
            ):
                found.append(loop.loop)
    return found


def partial_sums(source: ParsedSource, function: Function, counts: set[str]) -> bool:
    """Whether a kernel loops up to a parameter that a launch passes a split count for."""
    if function.body is None:
        return False
    indices = analysis(source).indices(function)
    bounds = {
        source.text_of(loop.bound).strip()
        for loop in indices.loops
        if loop.bound is not None and loop.init.value == 0
    }
    params = [p.name for p in function.params]
    for launch in source.launches_of(function):
        for param, arg in zip(params, launch.args, strict=False):
            if param in bounds and source.text_of(arg).strip() in counts:
                return True
    return False
