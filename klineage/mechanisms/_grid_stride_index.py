"""Removing a grid-stride ``for`` loop read by the index analysis, along any grid dimension.

Public kernels stride over rows (or tokens) with whatever block dimension holds them::

    for (int row = blockIdx.x * blockDim.z + threadIdx.z; row < N; row += gridDim.x * blockDim.z)

that is, from ``blockIdx.d * S + threadIdx.e`` by ``gridDim.d * S`` with ``S = blockDim.e``:
the threads of a block along ``e`` cover ``S`` consecutive indices, and the grid along ``d``
covers the rest in turns. Removing the loop gives each thread one index, ``if (row < N)``,
and every launch a grid that covers ``N`` along ``d``: ``(N + S - 1) / S`` blocks, with ``S``
read from the launch's block (``dim3(32, y, z)`` -> ``z``). Barriers inside the loop stay
where they were: a thread past ``N`` skipped them in the loop's last turn as it skips them
now. Refused (with the form) when the index is written in the body, the body returns or leaves
the loop with code after it, the kernel reads ``blockIdx.d`` or ``gridDim.d`` elsewhere, the
bound is not expressible at a launch, or a launch's grid or block is not written out.
"""

from __future__ import annotations

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import NotInForm, assigned_names, call_arguments, strip_parens, walk
from klineage.mechanisms._local_util import (
    Refused,
    builtin_of,
    index_bound,
    index_declaration,
    launches,
    local_types,
    loop_bound_jumps,
    size_at_launch,
    statements,
)

__all__ = ["index_loop_removal"]

_NEEDED = (
    "a `for` loop from `blockIdx.d * blockDim.e + threadIdx.e` by `gridDim.d * blockDim.e` "
    "over `i < n`, whose index only the header writes, in a kernel that reads blockIdx.d and "
    "gridDim.d nowhere else, launched with its grid and block written out"
)
_AXES = "xyz"


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


def _stride_axes(init: IndexForm, step: IndexForm) -> tuple[str, str] | None:
    """``(d, e)`` when ``step = gridDim.d * blockDim.e`` and ``init = blockIdx.d * blockDim.e
    + threadIdx.e``."""
    for d in _AXES:
        for e in _AXES:
            stride = IndexForm.atom(f"blockDim.{e}")
            if step != IndexForm.atom(f"gridDim.{d}") * stride:
                continue
            if init == IndexForm.atom(f"blockIdx.{d}") * stride + IndexForm.atom(f"threadIdx.{e}"):
                return d, e
    return None


def _block_extent(source: ParsedSource, launch: Launch, axis: str) -> str:
    """The launch's block size along ``axis``, as text."""
    block = launch.block
    if block is None:
        raise _refuse("a grid-stride loop launched without a block")
    stripped = strip_parens(block)
    index = _AXES.index(axis)
    if stripped.type == "call_expression" and source.text_of(
        stripped.child_by_field_name("function") or stripped
    ) in ("dim3", "::dim3"):
        args = call_arguments(stripped)
        if index < len(args):
            return _operand(source, args[index])
        return "1"
    function = source.enclosing_function(launch.node)
    declared = local_types(source, function) if function is not None else {}
    if stripped.type == "identifier" and "dim3" in declared.get(source.text_of(stripped), ""):
        return f"{source.text_of(stripped)}.{axis}"
    if axis == "x":
        return _operand(source, block)
    raise _refuse(
        f"a grid-stride loop launched with a block `{source.snippet(block, 40)}` of no {axis} size"
    )


def _operand(source: ParsedSource, node: Node) -> str:
    text = " ".join(source.text_of(node).split())
    return text if precedence(node) >= PRIMARY else f"({text})"


def _grid_edit(source: ParsedSource, launch: Launch, axis: str, blocks: str) -> Edit:
    """The launch's grid with ``blocks`` along ``axis``."""
    grid = launch.grid
    if grid is None:
        raise _refuse("a grid-stride loop launched without a grid")
    stripped = strip_parens(grid)
    if stripped.type == "call_expression" and source.text_of(
        stripped.child_by_field_name("function") or stripped
    ) in ("dim3", "::dim3"):
        args = call_arguments(stripped)
        index = _AXES.index(axis)
        if index < len(args):
            return Edit.replace(args[index], blocks)
        raise _refuse(
            f"a grid-stride loop launched with a grid `{source.snippet(grid, 40)}` of no {axis} "
            "size"
        )
    function = source.enclosing_function(launch.node)
    declared = local_types(source, function) if function is not None else {}
    if stripped.type == "identifier" and "dim3" in declared.get(source.text_of(stripped), ""):
        raise _refuse(
            f"a grid-stride loop launched with the dim3 variable {source.text_of(stripped)} as grid"
        )
    if axis != "x":
        raise _refuse(
            f"a grid-stride loop launched with a grid `{source.snippet(grid, 40)}` of no {axis} "
            "size"
        )
    return Edit.replace(grid, blocks)


def _reads_elsewhere(source: ParsedSource, function: Function, loop: Node, axis: str) -> str | None:
    """A read of ``blockIdx.axis`` or ``gridDim.axis`` outside the loop's header."""
    assert function.body is not None
    body = loop.child_by_field_name("body")
    for node in walk(function.body):
        builtin = builtin_of(source, node) if node.type == "field_expression" else None
        if builtin not in (f"blockIdx.{axis}", f"gridDim.{axis}"):
            continue
        in_header = body is not None and loop.start_byte <= node.start_byte < body.start_byte
        if not in_header:
            return builtin
    return None


def index_loop_removal(source: ParsedSource, function: Function, loop: Node) -> list[Edit]:
    """One index per thread instead of the grid-stride loop ``loop``, and launches whose grid
    covers the bound; NotInForm when the loop is not in the form above."""
    variable = analysis(source).indices(function).loop_of(loop)
    init = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    body = loop.child_by_field_name("body")
    header = source.snippet((loop.start_byte, body.start_byte if body else loop.end_byte), 60)
    declared = index_declaration(source, init) if init is not None else None
    if variable is None or variable.step is None or declared is None or body is None:
        raise _refuse(f"a grid-stride loop `{header}` without a declared index")
    axes = _stride_axes(variable.init, variable.step)
    if axes is None:
        raise _refuse(
            f"a grid-stride loop from {variable.init} by {variable.step}, not by a block dimension"
        )
    name, specifiers, value = declared
    bound = index_bound(source, condition, name, exits=False) if condition is not None else None
    if bound is None:
        raise _refuse(f"a grid-stride loop `{header}` whose condition is not `{name} < n`")
    if not function.is_kernel or function.body is None:
        raise _refuse("a grid-stride loop in a device helper")
    if name in assigned_names(source, body):
        raise _refuse(f"a grid-stride loop whose body writes its index {name}")
    written = {source.text_of(n) for n in walk(bound) if n.type == "identifier"}
    written &= assigned_names(source, function.body)
    if written:
        raise _refuse(f"a grid-stride loop whose bound uses {', '.join(sorted(written))}, written")
    if loop_bound_jumps(body, ("return_statement",)):
        raise _refuse("a grid-stride loop whose body returns")
    last = loop.parent == function.body and statements(function.body)[-1] == loop
    jumps = loop_bound_jumps(body, ("break_statement", "continue_statement"))
    if jumps and not last:
        raise _refuse(f"a grid-stride loop left by `{source.snippet(jumps[0])}` with code after it")
    grid_axis, block_axis = axes
    elsewhere = _reads_elsewhere(source, function, loop, grid_axis)
    if elsewhere is not None:
        raise _refuse(f"a grid-stride loop in a kernel that also reads {elsewhere}")
    edits: list[Edit] = []
    for launch in _launches(source, function):
        try:
            size = size_at_launch(source, function, launch, bound)
        except Refused as why:
            raise _refuse(
                f"a grid-stride loop whose bound cannot be written at a launch ({why})"
            ) from why
        extent = _block_extent(source, launch, block_axis)
        size = size if precedence(bound) >= PRIMARY and " " not in size else f"({size})"
        blocks = f"(unsigned)(({size} + {extent} - 1) / {extent})"
        edits.append(_grid_edit(source, launch, grid_axis, blocks))
    close = [c for c in loop.children if c.type == ")" and c.end_byte <= body.start_byte]
    gid = source.text_of(value)
    if last:
        indent = source.indent_of(loop.start_byte)
        text = f"{specifiers} {name} = {gid};\n{indent}if ({name} < {source.text_of(bound)})"
    else:
        text = f"if ({specifiers} {name} = {gid}; {name} < {source.text_of(bound)})"
    edits.append(Edit(loop.start_byte, close[-1].end_byte, text))
    edits += [Edit.replace(jump, "return;") for jump in jumps]
    return edits


def _launches(source: ParsedSource, function: Function) -> list[Launch]:
    try:
        return launches(source, function)
    except Refused as why:
        raise _refuse(f"a grid-stride loop whose kernel is not launched here ({why})") from why
