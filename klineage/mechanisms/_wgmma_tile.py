"""The width of a wgmma block tile: one ``m64nNk16`` per warpgroup covering the tile's N.

A Hopper GEMM whose warpgroups each issue ``wgmma.mma_async.m64nNk16`` with ``N`` equal to
the block tile's N extent (``kBN``) has its tile width in four places that must agree:

- the extent constant (``constexpr int kBN = 256;``), from which the loaders, the staged
  epilogue, the shared-memory sizes and the host's grid follow;
- the wrapper around the asm: its instruction shape ``m64nNk16``, its ``float (&d)[N/2]``
  accumulator parameter, the ``N/2`` ``"+f"`` operands and the descriptor operand numbers
  after them (and its name, when the name spells the shape);
- the accumulator array the kernel passes to it (``float d[N/2];``);
- the loops that walk that array with a literal bound (``for (i = 0; i < N/2; ...)``).

:func:`retile` rewrites all four to another N. Loops bounded by the extent (``kBN / 8``)
follow the constant by themselves. A literal subscript of the accumulator outside the new
size, an extent shared with the other tile side, or an accumulator that is not a local array
of exactly ``N/2`` floats is refused with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._tiles_util import (
    AsmStatement,
    asm_statement,
    constant_declaration,
    string_value,
)

WIDEST_N = 256
"""The widest N a single wgmma instruction has (m64n256k16)."""
_SHAPE = re.compile(r"(wgmma\.mma_async\.sync\.aligned\.m64n)(\d+)(k\d+\.f32\.)")
_TOKEN = re.compile(r"%(\d+)")
_ESCAPE = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
_REGISTERS_PER_LINE = 16
_OPERANDS_PER_LINE = 6


class RetileRefused(ValueError):
    """The kernel's tile is not in the form :func:`retile` rewrites; the message says why."""


@dataclass(frozen=True)
class WgmmaWrapper:
    """A device function wrapping one f32-accumulating ``wgmma.mma_async.m64nNk16``."""

    function: Function
    asm: AsmStatement
    n: int
    accumulator: str
    """The name of its ``float (&d)[N/2]`` parameter."""
    size: Node
    """The ``N/2`` literal of that parameter's array declarator."""


def wgmma_wrappers(source: ParsedSource) -> list[WgmmaWrapper]:
    """Device functions whose one asm statement is an f32 ``wgmma.mma_async.m64nNk16`` that
    names ``N/2`` ``"+f"`` elements of one reference-to-array parameter, in order."""
    if "wgmma.mma_async" not in source.kernel.text:
        return []
    found = []
    for function in source.functions:
        if function.is_kernel or not function.runs_on_device or function.body is None:
            continue
        statements = [
            asm_statement(source, node.parent)
            for node in source.iter_nodes("gnu_asm_expression", within=function.body)
            if node.parent is not None
        ]
        wgmma = [s for s in statements if s is not None and _SHAPE.search(s.template)]
        if len(wgmma) != 1:
            continue
        statement = wgmma[0]
        match = _SHAPE.search(statement.template)
        assert match is not None
        n = int(match.group(2))
        wrapper = _wrapper(source, function, statement, n)
        if wrapper is not None:
            found.append(wrapper)
    return found


def _wrapper(
    source: ParsedSource, function: Function, statement: AsmStatement, n: int
) -> WgmmaWrapper | None:
    outputs = [o for o in statement.operands if o.output]
    if n % 8 or len(outputs) != n // 2 or any(o.constraint != "+f" for o in outputs):
        return None
    names = set()
    for index, operand in enumerate(outputs):
        match = re.fullmatch(r"(\w+)\[(\d+)\]", source.text_of(operand.expr).replace(" ", ""))
        if match is None or int(match.group(2)) != index:
            return None
        names.add(match.group(1))
    if len(names) != 1:
        return None
    name = names.pop()
    param = function.param(name)
    if param is None or param.base_type != "float":
        return None
    sizes = [
        d.child_by_field_name("size")
        for d in source.iter_nodes("array_declarator", within=param.node)
    ]
    if len(sizes) != 1 or sizes[0] is None or fold_int(source, sizes[0]) != n // 2:
        return None
    return WgmmaWrapper(function, statement, n, name, sizes[0])


@dataclass(frozen=True)
class Tile:
    """A kernel whose block tile's N extent is the N of the wgmma it issues."""

    kernel: Function
    wrapper: WgmmaWrapper
    extent: str
    """The N extent constant's name (``kBN``)."""
    extent_value: Node
    """The literal that constant is declared with."""
    accumulator: Node
    """The ``N/2`` size literal of the kernel's accumulator array."""
    accumulator_name: str


def tile_of(source: ParsedSource, kernel: Function, extents: list[str]) -> Tile | str:
    """The wgmma tile of ``kernel`` given its block-tile extent names, or why there is none
    that :func:`retile` could rewrite."""
    wrappers = {w.function.name: w for w in wgmma_wrappers(source)}
    if kernel.body is None:
        return f"{kernel.name} has no body"
    if not wrappers:
        return "the file has no device function wrapping one f32 wgmma.mma_async"
    calls = [
        c for c in source.calls_named(*wrappers) if source.enclosing_function(c.node) == kernel
    ]
    if not calls:
        return f"{kernel.name} issues no f32 wgmma through a wrapper"
    used = {c.name for c in calls}
    if len(used) != 1:
        return f"{kernel.name} issues wgmma through {len(used)} wrappers ({', '.join(used)})"
    wrapper = wrappers[used.pop()]
    arrays = {source.text_of(c.args[0]) if c.args else "" for c in calls}
    if len(arrays) != 1:
        return (
            f"{kernel.name} passes {len(arrays)} different accumulators to {wrapper.function.name}"
        )
    accumulator_name = arrays.pop()
    constants = source.integer_constants
    matching = [e for e in extents if constants.get(e) == wrapper.n]
    if len(matching) > 1:  # a square tile: N is the extent the accumulator's loops count
        walking = _loops_walking(source, kernel, accumulator_name)
        matching = [e for e in matching if any(e in source.text_of(c) for c in walking)]
    if len(matching) != 1:
        return (
            f"{kernel.name}: {len(matching)} of the tile extents ({', '.join(extents)}) equal "
            f"the wgmma's N {wrapper.n} and bound the loops over {accumulator_name}; the N "
            "extent must be exactly one of them"
        )
    extent = matching[0]
    declaration = constant_declaration(source, extent)
    value = _literal_initializer(source, declaration, extent) if declaration else None
    if value is None:
        return f"{extent} is not declared with an integer literal"
    accumulator = _local_array_size(source, kernel, accumulator_name)
    if accumulator is None or fold_int(source, accumulator) != wrapper.n // 2:
        return (
            f"{kernel.name}: {accumulator_name} is not a local array of {wrapper.n // 2} "
            "floats declared with a literal size"
        )
    return Tile(kernel, wrapper, extent, value, accumulator, accumulator_name)


def _literal_initializer(source: ParsedSource, declaration: Node, name: str) -> Node | None:
    for init in source.iter_nodes("init_declarator", within=declaration):
        inner = init.child_by_field_name("declarator")
        value = init.child_by_field_name("value")
        if inner is not None and source.text_of(inner) == name and value is not None:
            return value if value.type == "number_literal" else None
    return None


def _local_array_size(source: ParsedSource, kernel: Function, name: str) -> Node | None:
    assert kernel.body is not None
    for declaration in source.iter_nodes("declaration", within=kernel.body):
        for array in source.iter_nodes("array_declarator", within=declaration):
            inner = array.child_by_field_name("declarator")
            size = array.child_by_field_name("size")
            if inner is not None and source.text_of(inner) == name and size is not None:
                base = declaration.child_by_field_name("type")
                if base is None or source.text_of(base) != "float":
                    return None
                return size if size.type == "number_literal" else None
    return None


def retile(
    source: ParsedSource, tile: Tile, new_n: int, wrapper_text: str | None = None
) -> list[Edit]:
    """The edits that make ``tile`` ``new_n`` wide. ``wrapper_text``, when given, replaces
    the wrapper function verbatim (the exact text a removal carried) instead of a rendering."""
    wrapper = tile.wrapper
    old_count, new_count = wrapper.n // 2, new_n // 2
    kernel = tile.kernel
    assert kernel.body is not None
    edits = [
        Edit.replace(tile.extent_value, str(new_n)),
        Edit.replace(tile.accumulator, str(new_count)),
    ]
    for subscript in source.iter_nodes("subscript_expression", within=kernel.body):
        array = subscript.child_by_field_name("argument")
        if array is None or source.text_of(array) != tile.accumulator_name:
            continue
        indices = subscript.child_by_field_name("indices")
        values = [fold_int(source, i) for i in (indices.named_children if indices else [])]
        if any(v is not None and v >= new_count for v in values):
            raise RetileRefused(
                f"{source.text_of(subscript)} in {kernel.name} lies outside {new_count} "
                "accumulators"
            )
    edits += _loop_bounds(source, tile, old_count, new_count)
    new_name = renamed_wrapper(wrapper.function.name, wrapper.n, new_n)
    if new_name != wrapper.function.name:
        for call in source.calls_named(wrapper.function.name):
            callee = call.node.child_by_field_name("function")
            if callee is not None:
                edits.append(Edit.replace(callee, new_name))
    if wrapper_text is not None:
        edits.append(Edit.replace(wrapper.function.outer, wrapper_text))
    else:
        edits += _wrapper_edits(source, wrapper, new_n, new_name)
    return edits


def renamed_wrapper(name: str, n: int, new_n: int) -> str:
    """A wrapper's name at ``new_n``: the shape it spells (``m64n256k16``) follows."""
    return re.sub(rf"n{n}(?=k)", f"n{new_n}", name)


def _loops_walking(source: ParsedSource, kernel: Function, array: str) -> list[Node]:
    """The conditions of the kernel's for loops whose bodies subscript ``array``."""
    conditions = []
    assert kernel.body is not None
    for loop in source.iter_nodes("for_statement", within=kernel.body):
        body = loop.child_by_field_name("body")
        condition = loop.child_by_field_name("condition")
        if body is None or condition is None:
            continue
        if any(
            source.text_of(s.child_by_field_name("argument") or s) == array
            for s in source.iter_nodes("subscript_expression", within=body)
        ):
            conditions.append(condition)
    return conditions


def _loop_bounds(source: ParsedSource, tile: Tile, old: int, new: int) -> list[Edit]:
    """``i < N/2`` in the loops of the kernel that subscript the accumulator."""
    return [
        Edit.replace(literal, str(new))
        for condition in _loops_walking(source, tile.kernel, tile.accumulator_name)
        for literal in source.iter_nodes("number_literal", within=condition)
        if fold_int(source, literal) == old
    ]


def _wrapper_edits(
    source: ParsedSource, wrapper: WgmmaWrapper, new_n: int, new_name: str
) -> list[Edit]:
    """Rename, resize the parameter, and render the asm's template and outputs anew."""
    function = wrapper.function
    edits = [Edit.replace(wrapper.size, str(new_n // 2))]
    name = function.declarator.child_by_field_name("declarator")
    if name is not None and new_name != function.name:
        edits.append(Edit.replace(name, new_name))
    asm = next(c for c in wrapper.asm.statement.named_children if c.type == "gnu_asm_expression")
    template = asm.child_by_field_name("assembly_code") or next(
        c for c in asm.named_children if c.type in ("string_literal", "concatenated_string")
    )
    indent = source.indent_of(template.start_byte)
    value = string_value(source, template) or ""
    edits.append(
        Edit.replace(template, render_template(_retemplate(value, wrapper.n, new_n), indent))
    )
    outputs = next(c for c in asm.children if c.type == "gnu_asm_output_operand_list")
    operands = [c for c in outputs.named_children if c.type == "gnu_asm_output_operand"]
    first, last = operands[0], operands[-1]
    column = first.start_byte - source.line_start(first.start_byte)
    rendered = _render_operands(wrapper.accumulator, new_n // 2, " " * column)
    edits.append(Edit(first.start_byte, last.end_byte, rendered))
    return edits


def _retemplate(template: str, n: int, new_n: int) -> str:
    """The instruction for ``new_n``: its shape, its register list, and the operand numbers
    after the accumulators shifted to follow them."""
    old_count, new_count = n // 2, new_n // 2
    registers = ", ".join(f"%{i}" for i in range(old_count))
    if "{" + registers + "}" not in template:
        raise RetileRefused("the wgmma's accumulator list is not {%0, ..., %N/2-1} in order")
    text = _SHAPE.sub(lambda m: f"{m.group(1)}{new_n}{m.group(3)}", template)
    text = text.replace("{" + registers + "}", "\0")

    def shift(match: re.Match[str]) -> str:
        number = int(match.group(1))
        return f"%{number - old_count + new_count}" if number >= old_count else match.group(0)

    text = _TOKEN.sub(shift, text)
    return text.replace("\0", "{" + ", ".join(f"%{i}" for i in range(new_count)) + "}")


def render_template(template: str, indent: str) -> str:
    """A template as adjacent string literals: one per line of assembly, the register list
    broken every 16 registers."""
    pieces: list[str] = []
    for line in template.splitlines(keepends=True):
        start, end = line.find("{%"), line.find("}", line.find("{%") + 1)
        if start < 0 or end < 0:
            pieces.append(line)
            continue
        registers = line[start + 1 : end].split(", ")
        pieces.append(line[: start + 1])
        for i in range(0, len(registers), _REGISTERS_PER_LINE):
            chunk = registers[i : i + _REGISTERS_PER_LINE]
            more = i + _REGISTERS_PER_LINE < len(registers)
            pieces.append(", ".join(chunk) + (", " if more else ""))
        pieces.append(line[end:])
    literals = ['"' + "".join(_ESCAPE.get(ch, ch) for ch in p) + '"' for p in pieces if p]
    return f"\n{indent}".join(literals)


def _render_operands(array: str, count: int, indent: str) -> str:
    operands = [f'"+f"({array}[{i}])' for i in range(count)]
    lines = [
        ", ".join(operands[i : i + _OPERANDS_PER_LINE]) for i in range(0, count, _OPERANDS_PER_LINE)
    ]
    return f",\n{indent}".join(lines)
