"""Grid-stride loops: a fixed grid walks any number of elements.

::

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) { ... }

decouples the grid from the problem size: the grid can be capped (to a few waves of the
SMs) so blocks are not launched only to exit, and each thread keeps going.

- remove: one element per thread, ``int64_t i = ...; if (i < n) { ... }`` (or ``if
  (int64_t i = ...; i < n) ...`` when code follows the loop), and every launch of the
  kernel gets a grid that covers ``n``: ``(n + block - 1) / block`` blocks, replacing a
  capped or SM-count-based grid. A ``continue`` or ``break`` of the loop becomes
  ``return`` when the loop ends the kernel. Refused, with the reason, when the loop is in a
  device helper (the grid is chosen at the kernel's launch), a launch is not in the file,
  the bound cannot be written at the launch, the kernel reads ``blockIdx``/``gridDim``
  elsewhere or holds a barrier, the body returns (it would end the thread's other
  elements), or another grid-stride loop in the kernel has a different bound.
- apply: the one-thread-per-element kernel becomes the loop (its ``return``\\ s become
  ``continue``); with the carrier ``max_blocks`` every launch's grid is capped at that many
  blocks, ``(unsigned)min((int64_t)((n + block - 1) / block), (int64_t)max_blocks)``;
  without it the grid stays as it was (still correct, the loop runs once).

Grid-stride loops in other spellings (a ``while`` with the stride in a variable, the y or z
dimension, a stride scaled by another block dimension, a persistent loop fed by a scheduler)
are found by the index analysis (:mod:`klineage.mechanisms._grid_stride_forms`). A ``for``
loop from ``blockIdx.d * S + L`` by ``gridDim.d * S`` (``S`` the block's share of a turn, such
as ``blockDim.e`` or ``4 * blockDim.z``) is removed by
:mod:`klineage.mechanisms._grid_stride_index` (barriers inside allowed, the launch's grid along
``d`` resized, or the host's count of per-block partial slots where the kernel writes them);
a ``while`` loop of a kernel writing one partial per block by
:mod:`klineage.mechanisms._grid_stride_partials` (the host's partial count following); the
others are refused with the form they are in. The one index per thread the ``for`` removal
leaves, along any dimension, is written back into the loop by
:mod:`klineage.mechanisms._grid_stride_guards` (``max_blocks`` capping the grid along ``d``
where the removal sized it); the ``while`` removal has no forward rule: its skills are not
transferable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from klineage.conditions import Condition
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._forms import form_site, removable_form_site
from klineage.mechanisms._grid_stride_forms import grid_stride_forms
from klineage.mechanisms._grid_stride_guards import (
    guarded_edits,
    guarded_indexes,
    guarded_refusal,
    loop_header,
)
from klineage.mechanisms._grid_stride_index import axis_grid_cap, index_loop_removal, stride_of
from klineage.mechanisms._grid_stride_partials import partial_loop_removal
from klineage.mechanisms._local_util import (
    ElementKernel,
    GlobalIndex,
    Refused,
    assigned_names,
    binary,
    builtin_of,
    collective_in,
    element_kernels,
    element_refusal,
    element_returns,
    global_index,
    grid_cap,
    grid_edits,
    identifiers,
    index_bound,
    index_declaration,
    loop_bound_jumps,
    normalize_type,
    shift,
    splice,
    statements,
    strip_casts,
    walk,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem


def _same(source: ParsedSource, a: Node, b: Node) -> bool:
    return " ".join(source.text_of(strip_casts(a)).split()) == " ".join(
        source.text_of(strip_casts(b)).split()
    )


def is_grid_stride(source: ParsedSource, step: Node, index: GlobalIndex) -> bool:
    """``gridDim.x * blockDim.x`` (either order, casts allowed), or ``gridDim.x * D`` with
    ``D`` the block size the index is computed with."""
    product = binary(strip_casts(step), "*")
    if product is None:
        return False
    for grid, block in (product, product[::-1]):
        if builtin_of(source, grid) == "gridDim.x" and (
            builtin_of(source, block) == "blockDim.x" or _same(source, block, index.stride)
        ):
            return True
    return False


@dataclass(frozen=True)
class _GridLoop:
    node: Node
    function: Function
    var: str
    specifiers: str
    index: GlobalIndex
    bound: Node
    body: Node


def grid_loops(source: ParsedSource) -> list[_GridLoop]:
    """Every grid-stride loop in device code."""
    found = []
    for node in source.nodes("for_statement"):
        function = source.enclosing_function(node)
        init = node.child_by_field_name("initializer")
        condition = node.child_by_field_name("condition")
        update = node.child_by_field_name("update")
        body = node.child_by_field_name("body")
        if function is None or not function.runs_on_device:
            continue
        if init is None or condition is None or update is None or body is None:
            continue
        parsed = index_declaration(source, init)
        index = global_index(source, parsed[2]) if parsed is not None else None
        if parsed is None or index is None or update.type != "assignment_expression":
            continue
        var = parsed[0]
        bound = index_bound(source, condition, var, exits=False)
        left = update.child_by_field_name("left")
        operator = update.child_by_field_name("operator")
        step = update.child_by_field_name("right")
        if bound is None or left is None or operator is None or step is None:
            continue
        if source.text_of(left) != var or operator.type != "+=":
            continue
        if is_grid_stride(source, step, index):
            found.append(_GridLoop(node, function, var, parsed[1], index, bound, body))
    return found


def _is_last(loop: _GridLoop) -> bool:
    """Whether the loop is the kernel's last statement (nothing runs after it)."""
    body = loop.function.body
    return body is not None and loop.node.parent == body and statements(body)[-1] == loop.node


def _removal_refusal(source: ParsedSource, loop: _GridLoop, loops: list[_GridLoop]) -> str | None:
    function = loop.function
    if not function.is_kernel or function.body is None:
        return "the loop is in a device helper; the grid is chosen where the kernel is launched"
    if loop.var in assigned_names(source, loop.body):
        return f"the body writes the index {loop.var}"
    changed = {source.text_of(n) for n in identifiers(source, loop.bound)}
    changed &= assigned_names(source, function.body)
    if changed:
        return f"the bound uses {', '.join(sorted(changed))}, which the kernel writes"
    barrier = collective_in(source, [function.body])
    if barrier is not None:
        return f"the kernel holds {barrier}, which every thread must reach equally often"
    for n in walk(function.body):
        builtin = builtin_of(source, n) if n.type == "field_expression" else None
        if builtin is None or builtin.split(".")[0] not in ("blockIdx", "gridDim"):
            continue
        if not any(
            other.node.start_byte <= n.start_byte < other.body.start_byte for other in loops
        ):
            return f"the kernel reads {builtin} outside the loop's index, and the grid changes"
    for other in loops:
        if other.function == function and not _same(source, other.bound, loop.bound):
            return (
                "another grid-stride loop of the kernel has a different bound, so one grid "
                "cannot give both one thread per element"
            )
    if [n for n in walk(loop.body) if n.type == "return_statement"]:
        return "the body returns, ending the thread's other elements; one per thread would not"
    jumps = loop_bound_jumps(loop.body, ("break_statement", "continue_statement"))
    if jumps and not _is_last(loop):
        return f"the body leaves the loop ({source.snippet(jumps[0])}) and code follows it"
    return None


def _index_removal_refusal(source: ParsedSource, loop: _GridLoop) -> str | None:
    """Why the removal read by the index analysis does not take the canonical ``loop`` (the
    form it found), or None when it does."""
    try:
        index_loop_removal(source, loop.function, loop.node)
    except NotInForm as why:
        return why.form
    return None


def removal_edits(source: ParsedSource, loop: _GridLoop) -> list[Edit]:
    """One element per thread: the header becomes a declaration and an ``if``."""
    gid = source.text_of(loop.index.node)
    bound = source.text_of(loop.bound)
    close = [c for c in loop.node.children if c.type == ")" and c.end_byte <= loop.body.start_byte]
    if _is_last(loop):
        indent = source.indent_of(loop.node.start_byte)
        text = f"{loop.specifiers} {loop.var} = {gid};\n{indent}if ({loop.var} < {bound})"
    else:
        text = f"if ({loop.specifiers} {loop.var} = {gid}; {loop.var} < {bound})"
    edits = [Edit(loop.node.start_byte, close[-1].end_byte, text)]
    for jump in loop_bound_jumps(loop.body, ("break_statement", "continue_statement")):
        edits.append(Edit.replace(jump, "return;"))
    return edits


# ---------------------------------------------------------------------------------------------
# Candidates: one element per thread
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _IfInit:
    """``if (T i = <global index>; i < n) statement``."""

    node: Node
    function: Function
    var: str
    specifiers: str
    index: GlobalIndex
    bound: Node
    clause: Node


def if_inits(source: ParsedSource) -> list[_IfInit]:
    found = []
    for node in source.nodes("if_statement"):
        function = source.enclosing_function(node)
        clause = node.child_by_field_name("condition")
        if function is None or not function.is_kernel or clause is None:
            continue
        if node.child_by_field_name("alternative") is not None:
            continue
        init = clause.child_by_field_name("initializer")
        values = [c for c in clause.named_children if c.type not in ("comment", "init_statement")]
        decl = init.named_children[0] if init is not None and init.named_children else None
        parsed = index_declaration(source, decl) if decl is not None else None
        if parsed is None or len(values) != 1:
            continue
        index = global_index(source, parsed[2])
        bound = index_bound(source, values[0], parsed[0], exits=False)
        if index is not None and bound is not None:
            found.append(_IfInit(node, function, parsed[0], parsed[1], index, bound, clause))
    return found


def _stride(source: ParsedSource, index_type: str, index: GlobalIndex) -> str:
    return f"({index_type})gridDim.x * {operand(source, index.stride, 14)}"


def _header(
    source: ParsedSource, var: str, index_type: str, index: GlobalIndex, bound: Node, indent: str
) -> str:
    """``for (T i = <global index>; i < n; i += <grid stride>)``."""
    first, limit = source.text_of(index.node), source.text_of(bound)
    step = _stride(source, index_type, index)
    return loop_header(var, index_type, first, limit, step, indent)


def element_edits(source: ParsedSource, element: ElementKernel) -> list[Edit]:
    """The one-thread-per-element kernel as a grid-stride loop."""
    refusal = element_refusal(source, element, returns="nested")
    if refusal is not None:
        raise Refused(refusal)
    indent = source.indent_of(element.decl.start_byte)
    header = _header(source, element.name, element.index_type, element.index, element.bound, indent)
    returns = element_returns(element)
    if element.form == "if":
        clause = element.guard.child_by_field_name("condition")
        assert clause is not None
        edits = [Edit(element.decl.start_byte, clause.end_byte, header)]
        return edits + [Edit.replace(node, "continue;") for node in returns]
    code = splice(
        source,
        element.guard.end_byte,
        element.end_byte,
        [(node, "continue;") for node in returns],
    )
    text = f"{header} {{{shift(code, 2)}\n{indent}}}"
    return [Edit(element.start_byte, element.end_byte, text)]


def if_init_refusal(source: ParsedSource, found: _IfInit) -> str | None:
    function = found.function
    assert function.body is not None
    if found.var in assigned_names(source, found.node):
        return f"the index {found.var} is written"
    barrier = collective_in(source, [function.body])
    if barrier is not None:
        return f"the kernel holds {barrier}, which every thread must reach equally often"
    if [n for n in walk(found.node) if n.type == "return_statement"]:
        return "the guarded code returns, which would end the thread's other elements"
    for n in walk(function.body):
        if found.clause.start_byte <= n.start_byte < found.clause.end_byte:
            continue
        builtin = builtin_of(source, n) if n.type == "field_expression" else None
        if builtin is not None and builtin.split(".")[0] in ("blockIdx", "gridDim"):
            return f"the kernel reads {builtin} outside the index, and the rewrite changes the grid"
    return None


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


@register
class GridStrideLoop(Mechanism):
    name = "grid_stride_loop"
    category = "parallelism"
    family = "grid-stride loops"
    intent = (
        "Let a capped grid walk any number of elements with a grid-stride loop, so no block "
        "is launched just to exit and the grid can be sized to the GPU."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "max_blocks": "cap every launch's grid at this many blocks (e.g. a multiple of the "
        "SM count); default: leave the grid as it is",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        loops = grid_loops(source)
        for form in grid_stride_forms(source, {loop.node.start_byte for loop in loops}):
            # a for loop by the index analysis: the general removal may take it
            if form.kind == "index_for":
                yield removable_form_site(
                    self, source, form, index_loop_removal, "index", "read by its index"
                )
            elif form.kind == "partials":
                yield removable_form_site(
                    self,
                    source,
                    form,
                    partial_loop_removal,
                    "partials",
                    "as a loop writing one partial per block",
                )
            else:
                yield form_site(self, source, form)
        for loop in loops:
            refusal = _removal_refusal(source, loop, loops)
            if refusal is None:
                try:
                    grid_edits(source, loop.function, loop.bound, 1)
                except Refused as refused:
                    refusal = str(refused)
            detail = {"kernel": loop.function.name}
            if refusal is not None:
                # the general removal writes launches the canonical one cannot (a dim3 grid)
                general = _index_removal_refusal(source, loop)
                if general is None:
                    refusal, detail = None, {**detail, "form": "index"}
                else:
                    refusal = f"{refusal} (read by its index, it is {general})"
            header = source.snippet((loop.node.start_byte, loop.body.start_byte)).rstrip(" {")
            yield self.site(source, loop.node, snippet=header, detail=detail, refusal=refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for element in element_kernels(source):
            refusal = element_refusal(source, element, returns="nested")
            yield self.site(
                source,
                element.decl,
                span=(element.start_byte, element.end_byte),
                snippet=f"{element.function.name}: {source.snippet(element.decl)}",
                detail={"kernel": element.function.name, "form": element.form},
                refusal=refusal,
            )
        taken = {e.start_byte for e in element_kernels(source)}
        for found in if_inits(source):
            taken.add(found.node.start_byte)
            yield self.site(
                source,
                found.node,
                snippet=source.snippet((found.node.start_byte, found.clause.end_byte)),
                detail={"kernel": found.function.name, "form": "if_init"},
                refusal=if_init_refusal(source, found),
            )
        # an index along any grid dimension, read by the index analysis
        for guarded in guarded_indexes(source):
            if guarded.start_byte in taken:
                continue
            yield self.site(
                source,
                guarded.decl or guarded.guard,
                span=(guarded.start_byte, guarded.guard.end_byte),
                snippet=source.snippet((guarded.start_byte, guarded.clause.end_byte)),
                detail={"kernel": guarded.function.name, "form": "guarded"},
                refusal=guarded_refusal(source, guarded),
            )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == "index":
            node = self.node_at(source, site, "for_statement")
            function = source.enclosing_function(node)
            assert function is not None
            return index_loop_removal(source, function, node)
        if site.detail.get("form") == "partials":
            node = self.node_at(source, site, "while_statement")
            function = source.enclosing_function(node)
            assert function is not None
            return partial_loop_removal(source, function, node)
        loop = next(g for g in grid_loops(source) if g.node.start_byte == site.start_byte)
        try:
            grids = grid_edits(source, loop.function, loop.bound, 1)
        except Refused as refused:
            raise self.refuse(str(refused), site) from refused
        return removal_edits(source, loop) + [Edit.replace(n, t) for n, t in grids]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        name = site.detail.get("kernel")
        canonical = any(g.node.start_byte == site.start_byte for g in grid_loops(source))
        if site.detail.get("form") == "index" and not canonical:  # the grid along its axis
            cap = self._axis_cap(source, site)
            return Carrier() if cap is None or cap < 1 else Carrier(max_blocks=cap)
        caps = {grid_cap(source, launch) for launch in source.launches_of(str(name))}
        if len(caps) == 1:
            cap = caps.pop()
            if cap is not None:
                return Carrier(max_blocks=cap)
        return Carrier()

    def _axis_cap(self, source: ParsedSource, site: Site) -> int | None:
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        assert function is not None
        variable = analysis(source).indices(function).loop_of(loop)
        stride = stride_of(variable.init, variable.step) if variable and variable.step else None
        return None if stride is None else axis_grid_cap(source, function, stride.axis)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        cap = carrier.get_int("max_blocks")
        if cap is not None and cap < 1:
            raise self.refuse(f"max_blocks={cap} must be at least 1", site, "apply")
        if site.detail.get("form") == "guarded":
            guarded = next(g for g in guarded_indexes(source) if g.start_byte == site.start_byte)
            try:
                return guarded_edits(source, guarded, cap)
            except NotInForm as why:
                raise self.refuse(str(why), site, "apply") from why
        try:
            if site.detail.get("form") == "if_init":
                found = next(f for f in if_inits(source) if f.node.start_byte == site.start_byte)
                function, bound = found.function, found.bound
                header = _header(
                    source,
                    found.var,
                    normalize_type(found.specifiers),
                    found.index,
                    found.bound,
                    source.indent_of(found.node.start_byte),
                )
                edits = [Edit(found.node.start_byte, found.clause.end_byte, header)]
            else:
                element = next(
                    e for e in element_kernels(source) if e.start_byte == site.start_byte
                )
                function, bound = element.function, element.bound
                edits = element_edits(source, element)
            if cap is not None:
                edits += [
                    Edit.replace(n, t)
                    for n, t in grid_edits(source, function, bound, 1, cap, flat_dim3=True)
                ]
        except Refused as refused:
            raise self.refuse(str(refused), site, "apply") from refused
        return edits

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        """None: a grid-stride loop is correct for any grid, and its removal sizes the grid
        to the bound at every launch."""
        return []
