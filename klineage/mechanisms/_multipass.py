"""The host side of a multi-pass reduction: a kernel that writes one partial per block.

A first pass writes ``out[blockIdx.x]`` once per block, and a second pass (another launch)
reads the partials, as many as the first pass had blocks::

    const unsigned blocks = (unsigned)(n / (NUM_PER_THREAD * kThreads));
    cudaMallocAsync((void**)&partial, blocks * sizeof(float), stream);
    block_sums<kThreads><<<blocks, kThreads, 0, stream>>>(x, partial);
    final_sum<kThreads><<<1, kThreads, 0, stream>>>(partial, total, blocks);

A removal that changes the first pass's grid (thread coarsening, a grid-stride loop) changes
the partial count with it. The count follows when the grid is a local variable of the function
that launches, declared with its value there, and every reader of the count reads that
variable: the removal writes the new grid into the declaration (deleting the reassignments that
capped it before the launch), so the second pass's count and the buffer's size follow. The
buffer must then hold the new count: one allocated with a size that reads the grid variable
does; a fixed ``__device__`` array does only when the new count is a constant within its size
(else the removal would write past its end, and is refused). Refused, naming what is missing:
partials written into the output or into a buffer of a caller, a grid that is a ``dim3`` or
written at the launch, a grid variable another kernel's launch also uses as its grid, no
second pass reading the count. A launch writing into the output is named in every refusal
(a buffer may be resized, the output may not); a buffer that is a parameter of a helper host
function is refused naming what its callers pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.analysis import IndexForm, analysis
from klineage.cuda.cexpr import fold_int, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import (
    NotInForm,
    assigned_names,
    call_arguments,
    declaration_names,
    strip_parens,
    walk,
)
from klineage.mechanisms._local_util import local_types, strip_casts

__all__ = [
    "PartialLaunch",
    "declaration_of",
    "grid_blocks",
    "local_constants",
    "partial_count_edits",
    "partial_destination",
    "partials_param",
    "reassignments",
    "scaled",
]

_NEEDED = (
    "one partial per block written into a buffer of the launching function (allocated with a "
    "size that reads the grid variable, or a `__device__` array large enough for the new "
    "count), the grid a local variable declared there, and a second launch that reads the "
    "count from it"
)

_ALLOCATORS = ("cudaMalloc", "cudaMallocAsync", "cudaMallocManaged")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class PartialLaunch:
    """What a removal asks of one launch of the first pass."""

    launch: Launch
    grid: str
    """The new grid (text, valid where the launch's grid variable is declared)."""
    count: int | None
    """The new number of partials when it is a constant, else None."""


def partials_param(source: ParsedSource, function: Function) -> str:
    """The parameter the kernel writes its one partial per block into (``out[blockIdx.x]``)."""
    indices = analysis(source).indices(function)
    stores = {
        a.buffer.name
        for a in indices.accesses()
        if a.direction == "store"
        and a.buffer.space == "global"
        and a.offset == IndexForm.atom("blockIdx.x")
    }
    params = [p.name for p in function.params if p.name in stores]
    if len(params) != 1:
        raise _refuse(
            f"a kernel that writes {len(params)} buffers at `[blockIdx.x]`, not one partial "
            "per block"
        )
    return params[0]


def _device_array(source: ParsedSource, name: str) -> tuple[Node, int | None] | None:
    """``__device__ T name[C]`` at file scope: its declaration and ``C`` when constant."""
    for decl in source.nodes("declaration"):
        if source.enclosing_function(decl) is not None or name not in declaration_names(
            source, decl
        ):
            continue
        if "__device__" not in source.text_of(decl).split("[")[0]:
            continue
        for node in walk(decl):
            if node.type == "array_declarator":
                size = node.child_by_field_name("size")
                return decl, fold_int(source, size) if size is not None else None
    return None


def partial_destination(
    source: ParsedSource, host: Function, arg: Node, grid_var: str
) -> tuple[str, int | None]:
    """Where a launch's partials go: ``(description, capacity)``; capacity None when the
    buffer's size follows the grid variable. Raises NotInForm for a buffer whose size the
    rule cannot read."""
    stripped = strip_casts(arg)
    name = source.text_of(stripped)
    if stripped.type != "identifier":
        raise _refuse(f"partials written into `{source.snippet(arg, 40)}`, not a named buffer")
    if host.param(name) is not None:
        if host.extern_c:
            raise _refuse(
                f"a launch writing its partials into the output {name}, whose size is fixed "
                "by the problem"
            )
        raise _refuse(
            f"partials written into {name}, a parameter of the host function {host.name} "
            f"({_callers_pass(source, host, name)})"
        )
    assert host.body is not None
    for call in walk(host.body):
        if call.type != "call_expression":
            continue
        callee = call.child_by_field_name("function")
        args = call_arguments(call)
        called = source.text_of(callee) if callee is not None else ""
        if not args or name not in {source.text_of(n) for n in walk(args[0])}:
            continue
        if called == "cudaGetSymbolAddress" and len(args) >= 2:
            symbol = source.text_of(strip_parens(args[1]))
            found = _device_array(source, symbol)
            if found is None:
                raise _refuse(f"partials written into the symbol {symbol}, not a sized array")
            _, capacity = found
            if capacity is None:
                raise _refuse(f"partials written into {symbol}, an array of no constant size")
            return f"`{symbol}[{capacity}]`, a fixed `__device__` array", capacity
        if called in _ALLOCATORS and len(args) >= 2:
            if grid_var not in _names_read_through(source, host, args[1]):
                raise _refuse(
                    f"partials written into {name}, allocated with "
                    f"`{source.snippet(args[1], 40)}`, a size that does not read the grid "
                    f"{grid_var}"
                )
            return f"{name}, allocated by the grid {grid_var}", None
    raise _refuse(f"partials written into {name}, whose size the rule cannot read")


def _names_read_through(source: ParsedSource, host: Function, expression: Node) -> set[str]:
    """The names `expression` reads, and those read by the values assigned in `host` to the
    locals among them, transitively (``bytes = (size_t)cols * turns; cudaMalloc(&p, bytes)``
    reads ``turns``)."""
    assert host.body is not None
    values: dict[str, list[Node]] = {}
    for node in walk(host.body):
        if node.type == "init_declarator":
            name, value = node.child_by_field_name("declarator"), node.child_by_field_name("value")
        elif node.type == "assignment_expression":
            name, value = node.child_by_field_name("left"), node.child_by_field_name("right")
        else:
            continue
        if name is not None and value is not None and name.type == "identifier":
            values.setdefault(source.text_of(name), []).append(value)
    read: set[str] = set()
    todo = [expression]
    while todo:
        for node in walk(todo.pop()):
            name = source.text_of(node) if node.type == "identifier" else ""
            if name and name not in read:
                read.add(name)
                todo += values.get(name, [])
    return read


def _callers_pass(source: ParsedSource, host: Function, param: str) -> str:
    """What the callers of ``host`` pass as its buffer ``param``: an output of the problem
    (a parameter of an ``extern "C"`` caller) on some call is named, as the rule cannot
    grow it."""
    index = [p.name for p in host.params].index(param)
    passed, outputs = [], []
    for _, call in analysis(source).call_graph.call_sites(host.name):
        caller = source.enclosing_function(call)
        args = call_arguments(call)
        if caller is None or index >= len(args):
            continue
        passed.append(f"`{source.snippet(args[index], 40)}`")
        if caller.extern_c:
            names = {source.text_of(n) for n in walk(args[index]) if n.type == "identifier"}
            outputs += [p.name for p in caller.params if p.name in names]
    if not outputs:
        return "its caller chooses the buffer and its size"
    shown = ", ".join(dict.fromkeys(passed))
    return (
        f"its callers pass {shown}: on some passes the output {outputs[0]}, whose size is "
        "fixed by the problem, and the rule does not follow a grid through the call to tell "
        "whether each pass's new grid fits its buffer"
    )


def _output_launch(source: ParsedSource, launches: list[Launch], index: int) -> str | None:
    """A launch whose partials go into an output of the problem (a parameter of the
    ``extern "C"`` function that launches), described: a buffer elsewhere may be resized, the
    output may not, and that pass would need another one after it."""
    for launch in launches:
        host = source.enclosing_function(launch.node)
        if host is None or not host.extern_c or index >= len(launch.args):
            continue
        name = source.text_of(strip_casts(launch.args[index]))
        if host.param(name) is not None:
            return (
                f"a launch writing its partials into the output {name}, whose size is fixed "
                f"by the problem (`{source.snippet(launch.node, 50)}`: a grid that grows "
                "would write past the output, and another pass would have to sum its partials)"
            )
    return None


def _grid_variable(source: ParsedSource, host: Function, launch: Launch) -> str:
    grid = launch.grid
    stripped = strip_casts(grid) if grid is not None else None
    if stripped is None or stripped.type != "identifier":
        shown = source.snippet(grid, 40) if grid is not None else "none"
        raise _refuse(
            f"a grid `{shown}` written at the launch, so the partial count a second pass "
            "reads cannot follow it"
        )
    name = source.text_of(stripped)
    declared = local_types(source, host).get(name, "")
    if "dim3" in declared:
        raise _refuse(f"a grid in the dim3 variable {name}")
    if host.param(name) is not None:
        raise _refuse(f"a grid {name} that is a parameter of the host function {host.name}")
    return name


def declaration_of(source: ParsedSource, host: Function, name: str) -> tuple[Node, Node]:
    """The declaration of ``name`` in ``host`` and its value."""
    assert host.body is not None
    for decl in source.iter_nodes("declaration", within=host.body):
        for declarator in decl.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if (
                declarator.type == "init_declarator"
                and target is not None
                and value is not None
                and source.text_of(target) == name
            ):
                return decl, value
    raise _refuse(f"a grid {name} declared without a value in {host.name}")


def reassignments(source: ParsedSource, host: Function, name: str) -> list[Node]:
    """The statements of ``host`` that write ``name`` after its declaration."""
    assert host.body is not None
    found = []
    for node in walk(host.body):
        if node.type == "expression_statement" and name in assigned_names(source, node):
            found.append(node)
    return found


def _wrapped(text: str) -> bool:
    """Whether ``text`` is one parenthesized expression: ``(a + b)``, not ``(a) + (b)``."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for position, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and position < len(text) - 1:
            return False
    return True


def _operand(text: str) -> str:
    return text if text.isidentifier() or text.isdigit() or _wrapped(text) else f"({text})"


def partial_count_edits(
    source: ParsedSource,
    kernel: Function,
    new_launch: Callable[[Launch], PartialLaunch],
    *,
    caps: bool,
) -> list[Edit]:
    """The host edits that give every launch of ``kernel`` its new grid and let the partial
    count follow (see the module's doc). ``caps``: whether statements reassigning the grid
    variable before the launch (a cap) are deleted (the new grid replaces them); else such a
    statement is refused."""
    param = partials_param(source, kernel)
    index = [p.name for p in kernel.params].index(param)
    found = source.launches_of(kernel)
    if not found:
        raise _refuse(f"no launch of {kernel.name} in this file")
    output = _output_launch(source, found, index)
    try:
        return _launch_edits(source, kernel, found, index, new_launch, caps)
    except NotInForm as why:
        if output is None:
            raise
        if "partials into the output" in why.form:  # the same launch: say it once, in full
            raise _refuse(output) from why
        # the output is the harder limit: name it beside what stopped the rule first
        raise _refuse(f"{why.form}, and {output}") from why


def _launch_edits(
    source: ParsedSource,
    kernel: Function,
    found: list[Launch],
    index: int,
    new_launch: Callable[[Launch], PartialLaunch],
    caps: bool,
) -> list[Edit]:
    planned = []
    for launch in found:
        host = source.enclosing_function(launch.node)
        if host is None or host.body is None or index >= len(launch.args):
            raise _refuse(f"a launch of {kernel.name} outside a host function")
        wanted = new_launch(launch)
        grid = strip_casts(launch.grid) if launch.grid is not None else None
        grid_name = source.text_of(grid) if grid is not None else ""
        where, capacity = partial_destination(source, host, launch.args[index], grid_name)
        if capacity is not None and (wanted.count is None or wanted.count > capacity):
            count = "a number without a bound" if wanted.count is None else str(wanted.count)
            raise _refuse(
                f"partials written into {where}, and `{source.snippet(launch.node, 50)}` with "
                f"its new grid would write {count} of them, more than it holds"
            )
        planned.append((launch, host, wanted))
    edits: dict[tuple[int, int], Edit] = {}
    for launch, host, wanted in planned:
        name = _grid_variable(source, host, launch)
        _, value = declaration_of(source, host, name)
        for other in source.launches:
            if (
                other.kernel != kernel.name
                and other.grid is not None
                and source.text_of(strip_casts(other.grid)) == name
            ):
                raise _refuse(f"a grid {name} that a launch of {other.kernel} also uses")
        readers = [
            other
            for other in source.launches
            if other.node != launch.node
            and source.enclosing_function(other.node) == host
            and any(name in {source.text_of(n) for n in walk(a)} for a in other.args)
            and any(
                source.text_of(strip_casts(a)) == source.text_of(strip_casts(launch.args[index]))
                for a in other.args
            )
        ]
        if not readers:
            raise _refuse(
                f"no second launch in {host.name} reading the partials with the count {name}"
            )
        for statement in reassignments(source, host, name):
            if statement.start_byte > launch.node.start_byte or not caps:
                raise _refuse(
                    f"a grid {name} reassigned (`{source.snippet(statement, 40)}`), so its "
                    "value at the launch is not its declaration's"
                )
            edit = source.deletion(statement, whole_line=True)
            edits[(edit.start_byte, edit.end_byte)] = edit
        key = (value.start_byte, value.end_byte)
        previous = edits.get(key)
        if previous is not None and previous.replacement != wanted.grid:
            raise _refuse(f"a grid {name} that launches needing different grids share")
        edits[key] = Edit(value.start_byte, value.end_byte, wanted.grid)
    return list(edits.values())


def scaled(source: ParsedSource, value: Node, factor: str) -> str:
    """``value * factor`` as text (parenthesized where needed)."""
    text = " ".join(source.text_of(value).split())
    left = text if precedence(value) >= 13 else f"({text})"  # 13: multiplicative
    return f"{left} * {_operand(factor)}"


def grid_value(source: ParsedSource, launch: Launch) -> Node | None:
    """The value of the launch's grid variable, where it is a local declared with one."""
    host = source.enclosing_function(launch.node)
    grid = strip_casts(launch.grid) if launch.grid is not None else None
    if host is None or grid is None or grid.type != "identifier":
        return None
    try:
        return declaration_of(source, host, source.text_of(grid))[1]
    except NotInForm:
        return None


def local_constants(source: ParsedSource, host: Function) -> dict[str, int]:
    """The file's integer constants and the host function's ``const`` locals folded with them."""
    constants = dict(source.integer_constants)
    if host.body is None:
        return constants
    for decl in source.iter_nodes("declaration", within=host.body):
        if "const" not in source.text_of(decl).split("=")[0].split():
            continue
        for declarator in decl.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if declarator.type == "init_declarator" and target is not None and value is not None:
                folded = fold_int(source, value, constants)
                if folded is not None and target.type == "identifier":
                    constants[source.text_of(target)] = folded
    return constants


def grid_blocks(source: ParsedSource, launch: Launch) -> int | None:
    """The launch's number of blocks (along x) when it is a constant: a literal, a constant,
    or a local (``dim3 grid(block_num, 1)``) of constants."""
    host = source.enclosing_function(launch.node)
    grid = strip_casts(launch.grid) if launch.grid is not None else None
    if host is None or grid is None or host.body is None:
        return None
    constants = local_constants(source, host)
    if grid.type != "identifier":
        return fold_int(source, grid, constants)
    name = source.text_of(grid)
    if name in constants:
        return constants[name]
    for decl in source.iter_nodes("declaration", within=host.body):
        for declarator in decl.children_by_field_name("declarator"):
            if source.text_of(declarator.child_by_field_name("declarator") or declarator) != name:
                continue
            value = declarator.child_by_field_name("value")
            if value is not None and value.type == "argument_list":  # dim3 grid(a, b)
                args = [c for c in value.named_children if c.type != "comment"]
                return fold_int(source, args[0], constants) if args else None
            if value is not None and name not in assigned_names(source, host.body):
                return fold_int(source, value, constants)
    return None
