"""The edits of the 2-D tile loop's forward rule (:mod:`klineage.mechanisms.
_staging_tile_2d_forward`): the generated loader, the shared tiles, the barriers and the
reads of the kernel; a reader helper's rows are :mod:`klineage.mechanisms.
_staging_reader_2d_forward`'s.

The loader is written the way the removal reads a 2-D loader back (one loop per tile over
the block's linear thread index, the slot split into ``X % C`` and ``X / C``, the value a
load under ``if (cond)`` into a local that holds the zero otherwise), with the read's own
texts for the condition, the load and the zero (the in-tile indices replaced by the slot's
parts, the scope's names by the loader's), so removing the staging again writes the reads
back as they were. Its names are the scope's (a helper's parameters where the reads were in
one), so the removal's reader copies get them back too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_parameter
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import fresh_name, statements, strip_parens
from klineage.mechanisms._staging_reader_2d_forward import reader_row_edits
from klineage.mechanisms._staging_tile_2d_forward import (
    BoundedRead,
    Operand2d,
    TileLoop2d,
    read_names,
)
from klineage.mechanisms._tiles_util import function_names, substitute, with_comments_above

__all__ = ["tile_loop_2d_edits"]


@dataclass
class _Loader:
    """The generated loader's template and function parameters and its body's lines."""

    templates: dict[str, tuple[str, str]] = field(default_factory=dict)
    """name -> (declaration, kernel argument), in order."""
    params: dict[str, tuple[str, str]] = field(default_factory=dict)
    """name -> (declaration, kernel argument), in order."""
    lines: list[str] = field(default_factory=list)

    def taken(self) -> set[str]:
        return set(self.templates) | set(self.params)

    def add(self, wanted: str, declaration: str, argument: str, template: bool) -> str:
        """The loader's name for a kernel argument a scope calls ``wanted`` (``declaration``
        with ``\\x00`` where the name goes)."""
        table = self.templates if template else self.params
        if wanted in table and table[wanted][1] == argument:
            return wanted
        name = fresh_name(self.taken(), wanted)
        table[name] = (declaration.replace("\x00", name), argument)
        return name


def _rename(text: str, names: dict[str, str]) -> str:
    return re.sub(r"\b\w+\b", lambda m: names.get(m.group(0), m.group(0)), text)


def _loader_names(loader: _Loader, operand: Operand2d) -> dict[str, str]:
    """The scope's names as the loader calls them (added to its parameters): types first,
    the pointer first of the values."""
    names: dict[str, str] = {}
    for name, resolved in operand.names.items():
        if resolved.kind == "type":
            names[name] = loader.add(name, "typename \x00", resolved.argument, True)
    values = sorted(
        ((n, r) for n, r in operand.names.items() if r.kind != "type"),
        key=lambda item: item[0] != operand.local,
    )
    for name, resolved in values:
        declared = _rename(resolved.type, names)
        template = resolved.kind == "template"
        names[name] = loader.add(name, f"{declared} \x00", resolved.argument, template)
    return names


def _kernel_text(source: ParsedSource, operand: Operand2d, node: Node) -> str:
    """A scope's expression in the kernel's terms."""
    text = source.text_of(node)
    arguments = {
        n: r.argument if re.fullmatch(r"[\w.]+", r.argument) else f"({r.argument})"
        for n, r in operand.names.items()
    }
    return _rename(text, arguments)


@dataclass(frozen=True)
class _Locals:
    """The loader's own names."""

    thread: str
    threads: str
    slot: str
    value: str
    slot_k: str
    slot_b: str
    fixed: bool = False
    """``threads`` is a compile-time name of the loader: its loops count turns (and unroll)."""


def _fill(
    source: ParsedSource,
    operand: Operand2d,
    read: BoundedRead,
    names: dict[str, str],
    tile: str,
    own: _Locals,
) -> list[str]:
    """The loader's loop that fills one tile."""
    renamed = {
        n.start_byte: names[source.text_of(n)]
        for n in read_names(source, operand.scope, read)
        if source.text_of(n) in names
    }

    def replace(node: Node) -> str | None:
        if node in read.k.copies:
            return own.slot_k
        if node in read.b.copies:
            return own.slot_b
        if node.type in ("identifier", "type_identifier") and node.start_byte in renamed:
            return renamed[node.start_byte]
        return None

    cond, load, zero = (substitute(source, n, replace) for n in (read.cond, read.load, read.zero))
    rows, cols = (_rename(source.text_of(e), names) for e in (read.k.extent, read.b.extent))
    fast = rows if read.k_contiguous else cols
    parts = {
        own.slot_k: "%" if read.k_contiguous else "/",
        own.slot_b: "/" if read.k_contiguous else "%",
    }
    element = _element(operand, names)
    slot = own.slot
    if own.fixed:
        # a compile-time number of turns: unrolled, every load of a thread is in flight
        # before its first store (the experts' loaders count threads at compile time too)
        linear = f"({own.thread} + {slot} * {own.threads})"
        head = [
            "  #pragma unroll",
            f"  for (int {slot} = 0; {slot} < {rows} * {cols} / {own.threads}; ++{slot}) {{",
            f"    static_assert({rows} * {cols} % {own.threads} == 0, "
            '"the block fills a tile in whole turns");',
        ]
    else:
        linear = slot
        head = [
            f"  for (int {slot} = {own.thread}; {slot} < {rows} * {cols}; {slot} += "
            f"{own.threads}) {{",
        ]
    return [
        *head,
        # `=`, not braces: a size_t extent would narrow into the int slot
        *(f"    int const {part} = {linear} {op} {fast};" for part, op in parts.items()),
        f"    {element} {own.value} = {zero};",
        f"    if ({cond}) {{",
        f"      {own.value} = {load};",
        "    }",
        f"    {tile}[{own.slot_k}][{own.slot_b}] = {own.value};",
        "  }",
    ]


def _element(operand: Operand2d, names: dict[str, str]) -> str:
    """The tile's element type in the loader's terms."""
    param = operand.scope.param(operand.local)
    assert param is not None
    return _rename(param.base_type, names)


def _loader_text(loader: _Loader, name: str, own: _Locals) -> str:
    template = ", ".join(d for d, _ in loader.templates.values())
    params = ", ".join(d for d, _ in loader.params.values())
    lines = [f"template <{template}>"] if template else []
    lines += [
        f"__device__ void {name}({params}) {{",
        "  // each thread of the block fills its share of every tile's slots, zero outside the",
        "  // matrix",
        f"  int const {own.thread} = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + "
        "threadIdx.x;",
        *(
            []
            if own.fixed
            else [f"  int const {own.threads} = blockDim.x * blockDim.y * blockDim.z;"]
        ),
        *loader.lines,
        "}",
    ]
    return "\n".join(lines) + "\n\n"


def _template_argument(text: str) -> str:
    stripped = text.strip()
    return f"({stripped})" if ">" in stripped else stripped


def tile_loop_2d_edits(source: ParsedSource, tiles: TileLoop2d, wanted: list[str]) -> list[Edit]:
    """The edits that stage each operand's tile (see the module docstring); ``wanted``
    suggests the tiles' names, one per operand in order."""
    function, loop = tiles.function, tiles.loop
    body = loop.child_by_field_name("body")
    assert body is not None
    taken = set(function_names(source, function)) | {f.name for f in source.functions}
    for operand in tiles.operands:
        taken |= function_names(source, operand.scope)
    loader_name = fresh_name(taken, "stage_tiles_2d")
    taken.add(loader_name)
    loader = _Loader()
    chosen: dict[str, str] = {}
    per_operand = []
    for operand, suggested in zip(tiles.operands, wanted, strict=True):
        tile = fresh_name(taken, suggested)
        taken.add(tile)
        chosen[operand.pointer] = tile
        loader.params[tile] = ("", tile)  # declared below, once its names are known
        per_operand.append(_loader_names(loader, operand))
    inner = taken | loader.taken()
    own = _Locals(
        *(fresh_name(inner, n) for n in ("thread", "threads", "slot", "value", "slot_k", "slot_b"))
    )
    # the block's thread count as a compile-time name of the kernel, where one is
    threads = block_size_parameter(source, function, before=loop.start_byte)
    if threads is not None:
        count = loader.add(threads, "unsigned int \x00", threads, True)
        own = replace(own, threads=count, fixed=True)
    declarations = []
    indent = source.indent_of(loop.start_byte)
    edits: list[Edit] = []
    for operand, names in zip(tiles.operands, per_operand, strict=True):
        tile, read = chosen[operand.pointer], operand.reads[0]
        kernel_param = function.param(operand.pointer)
        assert kernel_param is not None
        rows, cols = (_rename(source.text_of(e), names) for e in (read.k.extent, read.b.extent))
        loader.params[tile] = (f"{_element(operand, names)} {tile}[{rows}][{cols}]", tile)
        loader.lines += _fill(source, operand, read, names, tile, own)
        extents = [_kernel_text(source, operand, e) for e in (read.k.extent, read.b.extent)]
        declarations.append(
            f"__shared__ {kernel_param.base_type} {tile}[{extents[0]}][{extents[1]}];\n{indent}"
        )
        if operand.reader is None:
            for each in operand.reads:
                k, b = (source.text_of(strip_parens(s.index)) for s in (each.k, each.b))
                edits.append(Edit.replace(each.node, f"{tile}[{k}][{b}]"))
    edits += reader_row_edits(source, [o for o in tiles.operands if o.reader], chosen)
    definition = _loader_text(loader, loader_name, own)
    edits.append(Edit.insert(with_comments_above(source, function.outer).start_byte, definition))
    edits.append(Edit.insert(loop.start_byte, "".join(declarations)))
    return edits + _call_edits(source, body, loader, loader_name)


def _call_edits(source: ParsedSource, body: Node, loader: _Loader, name: str) -> list[Edit]:
    """The loader's call and a barrier at the top of the turn, a barrier at its end."""
    items = statements(body)
    first = items[0]
    step_in = source.indent_of(
        next((s for s in items if s.type != "preproc_call"), first).start_byte
    )
    template = ", ".join(_template_argument(a) for _, a in loader.templates.values())
    arguments = ", ".join(a for _, a in loader.params.values())
    call = f"{name}<{template}>({arguments});" if template else f"{name}({arguments});"
    last = [c for c in body.children if c.type != "}"][-1]
    if source.starts_line(first.start_byte):  # above a pragma at column 0 too
        at, text = (
            source.line_start(first.start_byte),
            f"{step_in}{call}\n{step_in}__syncthreads();\n",
        )
    else:
        at, text = first.start_byte, f"{call}\n{step_in}__syncthreads();\n{step_in}"
    return [
        Edit.insert(at, text),
        Edit.insert(last.end_byte, f"\n{step_in}__syncthreads();"),
    ]
