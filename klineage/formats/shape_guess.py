"""Each tensor's shape as the kernel's indexing shows it, for `klineage new`.

`run(...)` names the tensors and the axes but not which axes each tensor spans. The kernels it
launches do, through their index arithmetic: ``a[(blockIdx.y * BM + r) * K + kt * BK + c]``
is a row-major matrix whose rows are ``K`` long, and whose row index walks the grid's ``y``
dimension, which the launch sizes from ``M``: ``a`` is ``[M, K]``. The index analysis writes
every global access as a polynomial over atoms, so the reading is:

- the innermost dimension is the axis whose parameter scales the rest of the offset (what
  is left once that term is taken out names no axis);
- the dimensions above it come from that coefficient, read the same way;
- the outermost index names no axis itself: its extent is the axes that bound what it is made
  of, the grid dimension a ``blockIdx`` spans (as the launch sizes it) or the bound of a loop.

A guess is kept only when every access of a tensor, in every kernel run launches, reads the
same; anything else stays to the user (the scaffold's every-axis guess).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.forms import IndexForm
from klineage.cuda.analysis.indices import MEMORY, FunctionIndices, is_loop_atom
from klineage.cuda.source import Function, Launch, Node, ParsedSource, within
from klineage.cuda.tree import call_arguments, strip_casts, strip_parens

__all__ = ["guess_shapes"]

_NAME = re.compile(r"[A-Za-z_]\w*")
_GRID_ATOMS = {"blockIdx.x": 0, "blockIdx.y": 1, "blockIdx.z": 2}
_CASTS = ("const_cast", "static_cast", "reinterpret_cast")
_DIVIDED = re.compile(r"\[.*(?P<op>[%/])\s*\(?\s*(?P<by>[A-Za-z_]\w*)\s*\)?\s*\]")
"""An opaque atom that ends dividing by a name: ``[i / hidden]``, ``[(i / len) % channels]``."""


def guess_shapes(
    source: ParsedSource, tensors: Iterable[str], axes: list[str]
) -> dict[str, list[str]]:
    """Tensor name -> its axes, outermost first, for the tensors of ``run`` whose indexing
    reads one way in every kernel ``run`` launches; the others are left out."""
    run = source.function("run")
    if run is None or run.body is None or not axes:
        return {}
    locals_ = _run_locals(source, run)
    wanted = set(tensors)
    guesses: dict[str, set[tuple[str, ...]]] = {}
    for launch in source.launches:
        kernel = source.function(launch.kernel)
        if kernel is None or kernel.body is None or not within(launch.node, run.body):
            continue
        passed = {
            param.name: arg
            for param, arg in zip(kernel.params, launch.args, strict=False)
            if param.name
        }
        bound = {name: _named(source, arg) for name, arg in passed.items()}
        axis_of = {
            name: tuple(found)
            for name, arg in passed.items()
            if (found := _axes_in(source, arg, axes, locals_))
        }
        grid = _grid_axes(source, launch, axes, locals_)
        reading = _Reading(source, analysis(source).indices(kernel), axis_of, grid)
        for access in reading.indices.accesses():
            arg = bound.get(access.buffer.name)
            tensor = source.text_of(arg) if arg is not None else None
            if access.buffer.space != "global" or tensor not in wanted:
                continue
            dims = reading.dims(access.offset)
            guesses.setdefault(tensor, set()).add(tuple(dims) if dims else ())
    return {t: list(next(iter(g))) for t, g in guesses.items() if len(g) == 1 and () not in g}


class _Reading:
    """How the axes of one launch show in its kernel's index forms."""

    def __init__(
        self,
        source: ParsedSource,
        indices: FunctionIndices,
        axis_of: dict[str, tuple[str, ...]],
        grid: list[list[str]],
    ) -> None:
        self.source = source
        self.indices = indices
        self.axis_of = axis_of
        """Kernel parameter -> the run axes its argument multiplies."""
        self.grid = grid

    def dims(self, form: IndexForm, inner: tuple[str, ...] = ()) -> list[str] | None:
        """The axes ``form`` indexes, outermost first, above the ``inner`` axes already read;
        None when it reads no one way."""
        scales = [a for a in sorted(form.atoms()) if a in self.axis_of]
        if not scales:
            extent = [a for a in self._extent(form) if a not in inner]
            return extent or None
        for atom in scales:
            row = form.coefficient(atom)
            column = form - row * IndexForm.atom(atom)
            if any(a in self.axis_of for a in column.atoms()) or not row.terms:
                continue
            here = tuple(a for a in self.axis_of[atom] if a not in inner)
            outer = self.dims(row, (*here, *inner)) if here else None
            if outer:
                return [*outer, *here]
        return None

    def _extent(self, form: IndexForm) -> list[str]:
        """The axes bounding an index that names none: the grid dimension of a ``blockIdx`` in
        it or the bound of a loop variable in it, else what an opaque ``x % A`` or ``x / A`` of
        it says; the first reading that names an axis. A value read from memory (a gathered
        row) or any other opaque part says nothing."""
        if MEMORY in form.base_atoms():
            return []
        atoms = sorted(form.atoms())
        readings = [self._atom_extent(a) for a in atoms if not form.is_opaque(a)]
        readings += [self._opaque_extent(form, a) for a in atoms if form.is_opaque(a)]
        return next((r for r in readings if r), [])

    def _atom_extent(self, atom: str) -> list[str]:
        if atom in _GRID_ATOMS:
            return self.grid[_GRID_ATOMS[atom]]
        variable = self.indices.loop(atom) if is_loop_atom(atom) else None
        if variable is None or variable.bound is None:
            return []
        names = _NAME.findall(self.source.text_of(variable.bound))
        return list(dict.fromkeys(a for n in names for a in self.axis_of.get(n, ())))

    def _opaque_extent(self, form: IndexForm, atom: str) -> list[str]:
        """``[x % A]`` spans A; ``[x / A]`` spans what x does, less A."""
        match = _DIVIDED.fullmatch(atom)
        divisor = self.axis_of.get(match.group("by"), ()) if match else ()
        if not match or not divisor:
            return []
        if match.group("op") == "%":
            return list(divisor)
        spanned: list[str] = []
        for dependency in sorted(dict(form.opaque)[atom]):
            spanned = spanned or self._atom_extent(dependency)
        rest = [a for a in spanned if a not in divisor]
        # one axis left is the quotient's; more, and the dividend may be a quotient itself
        return rest if len(rest) == 1 and len(spanned) > 1 else []


def _named(source: ParsedSource, node: Node) -> Node | None:
    """The identifier an argument passes, under casts (``(int)M``, ``const_cast<float*>(a)``)."""
    node = strip_parens(strip_casts(node))
    while node.type == "call_expression":
        callee = node.child_by_field_name("function")
        name = callee.child_by_field_name("name") if callee is not None else None
        arguments = call_arguments(node)
        if name is None or source.text_of(name) not in _CASTS or len(arguments) != 1:
            break
        node = strip_parens(strip_casts(arguments[0]))
    return node if node.type == "identifier" else None


def _run_locals(source: ParsedSource, run: Function) -> dict[str, Node]:
    """run's locals with an initializer (``int C = (int)(NH * HS);``, ``dim3 grid(N / 64)``):
    name -> the declarator."""
    assert run.body is not None
    found: dict[str, Node] = {}
    for declarator in source.iter_nodes("init_declarator", within=run.body):
        name = declarator.child_by_field_name("declarator")
        if name is not None and name.type == "identifier":
            found[source.text_of(name)] = declarator
    return found


def _axes_in(
    source: ParsedSource, node: Node, axes: list[str], locals_: dict[str, Node], depth: int = 0
) -> list[str]:
    """The axes an expression of run names, through run's locals, in the order written."""
    found: list[str] = []
    for name in _NAME.findall(source.text_of(node)):
        if name in axes:
            found.append(name)
        elif name in locals_ and depth < 8:
            value = locals_[name].child_by_field_name("value")
            if value is not None:
                found += _axes_in(source, value, axes, locals_, depth + 1)
    return list(dict.fromkeys(found))


def _grid_axes(
    source: ParsedSource, launch: Launch, axes: list[str], locals_: dict[str, Node]
) -> list[list[str]]:
    """The axes each grid dimension (x, y, z) of a launch is sized from."""
    grid = launch.grid
    if grid is None:
        return [[], [], []]
    grid = strip_parens(grid)
    parts: list[Node] = [grid]
    if grid.type == "identifier" and source.text_of(grid) in locals_:
        value = locals_[source.text_of(grid)].child_by_field_name("value")
        if value is not None and value.type in ("argument_list", "initializer_list"):
            parts = [c for c in value.named_children if c.type != "comment"]
        elif value is not None:
            parts = _dim3_parts(value)
    elif grid.type == "call_expression":
        parts = _dim3_parts(grid)
    dims = [_axes_in(source, p, axes, locals_) for p in parts[:3]]
    return [*dims, *([[]] * (3 - len(dims)))]


def _dim3_parts(node: Node) -> list[Node]:
    """The components of ``dim3(x, y, z)``; the node itself for any other expression."""
    if node.type == "call_expression":
        callee = node.child_by_field_name("function")
        if callee is not None and callee.type == "identifier" and callee.text == b"dim3":
            return list(call_arguments(node))
    if node.type == "initializer_list":
        return [c for c in node.named_children if c.type != "comment"]
    return [node]
