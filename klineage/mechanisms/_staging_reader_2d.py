"""Rows of a helper-staged 2-D tile read through a reader helper.

A kernel may hand one row ``S[r]`` of a staged 2-D tile to a helper that reads it, whatever
the helper is called or does with the values::

    reader<T, W, N>(S[r], out, t);

    template <typename T, size_t W, size_t N>
    __device__ void reader(T const row[W], T out[N], size_t t) {
      for (size_t i = 0; i < N; ++i) out[i] = row[t * N + i];
    }

With the staging removed there is no row to hand over: each call gets a copy of the helper
that reads global memory instead. The copy takes the row's index where the row was, reads
``row[e]`` as the load that filled slot ``[r][e]`` (:meth:`Tile2d.value`, bounds check and
zero included), and takes the values that load names as parameters appended to its list (a
name the call already passes as a template argument is read from that template parameter).
The original helper goes when every call of it was rewritten. Valid when the helper reads the
row only as ``row[e]``; anything else is refused with the use found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm, call_arguments, callee_name, template_arguments, walk
from klineage.mechanisms._local_util import splice
from klineage.mechanisms._staging_once import is_written
from klineage.mechanisms._tiles_util import fresh_name, function_names

if TYPE_CHECKING:
    from klineage.mechanisms._staging_helper_2d import Tile2d

__all__ = ["RowRead", "reader_copy_edits"]

NEEDED = (
    "a row `S[a]` of a staged 2-D tile passed to a `__device__` helper defined in the file "
    "that reads its parameter only as `row[e]`"
)


@dataclass(frozen=True)
class RowRead:
    """One call that hands a row of a staged tile to a helper."""

    call: Node
    position: int
    """The argument's position."""
    tile: str
    """The shared array the row belongs to."""
    row: Node
    """The row index ``a`` of ``S[a]``."""


def reader_copy_edits(
    source: ParsedSource,
    kernel: Function,
    loader: Function,
    names: dict[str, str],
    tiles: dict[str, Tile2d],
    reads: list[RowRead],
) -> list[Edit]:
    """The copies of the reader helpers (one per call), the calls pointed at them, and the
    originals deleted where every call was rewritten."""
    graph = analysis(source).call_graph
    taken = {f.name for f in source.functions}
    by_helper: dict[int, list[RowRead]] = {}
    helpers: dict[int, Function] = {}
    for read in reads:
        name = source.text_of(read.call.child_by_field_name("function") or read.call)
        helper = graph.definition(callee_name(name))
        if helper is None or helper.body is None or not helper.runs_on_device:
            shown = callee_name(name)
            raise NotInForm(f"a row of {read.tile} passed to `{shown}`, not defined here", NEEDED)
        if len(call_arguments(read.call)) != len(helper.params):
            raise NotInForm(f"a call of {helper.name} with default arguments", NEEDED)
        by_helper.setdefault(helper.node.start_byte, []).append(read)
        helpers[helper.node.start_byte] = helper
    edits: list[Edit] = []
    for key, helper_reads in by_helper.items():
        helper = helpers[key]
        copies = []
        for read in helper_reads:
            copy_name = fresh_name(taken, f"{helper.name}_from_{names[tiles[read.tile].pointer]}")
            text, call_edits = _copy(source, kernel, loader, names, tiles[read.tile], helper, read)
            copies.append(_renamed(source, helper, text, copy_name))
            edits += call_edits
            function = read.call.child_by_field_name("function")
            assert function is not None
            name_node = function.child_by_field_name("name") or function
            edits.append(Edit.replace(name_node, copy_name))
        every_call = {c.start_byte for _, c in graph.call_sites(helper.name)}
        block = "\n\n".join(copies)
        if every_call <= {r.call.start_byte for r in helper_reads}:
            edits.append(Edit.replace(helper.outer, block))  # the original goes
        else:
            edits.append(Edit.insert(helper.outer.end_byte, "\n\n" + block))
    return edits


def _renamed(source: ParsedSource, helper: Function, text: str, name: str) -> str:
    """The copy's text with its declarator's name replaced."""
    declared = helper.declarator.child_by_field_name("declarator")
    assert declared is not None
    offset = declared.start_byte - helper.outer.start_byte
    data = text.encode("utf-8")
    old = source.text_of(declared).encode("utf-8")
    assert data[offset : offset + len(old)] == old
    return (data[:offset] + name.encode("utf-8") + data[offset + len(old) :]).decode("utf-8")


def _copy(
    source: ParsedSource,
    kernel: Function,
    loader: Function,
    names: dict[str, str],
    tile: Tile2d,
    helper: Function,
    read: RowRead,
) -> tuple[str, list[Edit]]:
    """The copy's text (the original name still in it) and the edits of its call."""
    assert helper.body is not None
    param = helper.params[read.position]
    if param.name is None:
        raise NotInForm(f"{helper.name}'s parameter {read.position + 1} has no name", NEEDED)
    taken = function_names(source, helper) | set(helper.template_params)
    # the loader's names as the copy sees them: the call's template arguments, else parameters
    templates = {
        source.text_of(arg).strip(): name
        for name, arg in zip(helper.template_params, template_arguments(read.call), strict=False)
    }
    copy_names: dict[str, str] = {}
    extra: list[tuple[str, str, str]] = []  # (type, name, argument)
    needed = sorted(tile.names | {tile.pointer})
    for name in needed:
        argument = names[name].strip("()")
        if argument in templates:
            copy_names[name] = templates[argument]
            continue
        kind = _type_of(source, loader, name, names, templates)
        fresh = name if name not in taken else fresh_name(taken, name)
        taken.add(fresh)
        copy_names[name] = fresh
        extra.append((kind, fresh, argument))
    row_name = fresh_name(taken, f"{param.name}_index")
    row_type = _row_type(source, kernel, read.row)
    replacements: list[tuple[Node, str]] = []
    for node in walk(helper.body):
        if node.type != "identifier" or source.text_of(node) != param.name:
            continue
        parent = node.parent
        indices = parent.child_by_field_name("indices") if parent is not None else None
        if (
            parent is None
            or parent.type != "subscript_expression"
            or parent.child_by_field_name("argument") != node
            or indices is None
            or len(indices.named_children) != 1
            or is_written(parent)
        ):
            shown = parent or node
            if parent is not None and is_written(parent) and parent.parent is not None:
                shown = parent.parent  # the assignment, not just its target
            raise NotInForm(
                f"{helper.name} uses {param.name} as `{source.snippet(shown, 60)}`, "
                f"not read as `{param.name}[e]`",
                NEEDED,
            )
        index = source.text_of(indices.named_children[0])
        second = index if re.fullmatch(r"[\w.]+", index) else f"({index})"
        replacements.append((parent, tile.value(row_name, second, copy_names)))
    replacements.append((param.node, f"{row_type} {row_name}"))
    parameters = helper.declarator.child_by_field_name("parameters")
    assert parameters is not None
    if extra:
        last = helper.params[-1].node
        tail = "".join(f", {kind} {name}" for kind, name, _ in extra)
        if last == param.node:
            replacements[-1] = (param.node, f"{row_type} {row_name}{tail}")
        else:
            replacements.append((last, source.text_of(last) + tail))
    text = splice(source, helper.outer.start_byte, helper.outer.end_byte, replacements)
    args = call_arguments(read.call)
    call_edits = [Edit.replace(args[read.position], source.text_of(read.row))]
    if extra:
        arguments = read.call.child_by_field_name("arguments")
        assert arguments is not None
        added = "".join(f", {argument}" for _, _, argument in extra)
        call_edits.append(Edit.insert(arguments.end_byte - 1, added))
    return text, call_edits


def _type_of(
    source: ParsedSource,
    loader: Function,
    name: str,
    names: dict[str, str],
    templates: dict[str, str],
) -> str:
    """The declared type of the loader's parameter or template parameter ``name``, written in
    the copy's terms (a loader template type the call passes on as the helper's)."""
    param = loader.param(name)
    written = param.type if param is not None else _template_value_type(source, loader, name)

    def mapped(match: re.Match[str]) -> str:
        word = match.group(0)
        if word not in loader.template_params:
            return word
        argument = names.get(word, word).strip("()")
        if argument in templates:
            return templates[argument]
        if argument in loader.template_params or not re.fullmatch(r"[\w:]+", argument):
            raise NotInForm(f"a load over {name} of type {written}, which {argument} fixes", NEEDED)
        return argument

    return re.sub(r"[A-Za-z_]\w*", mapped, written)


def _template_value_type(source: ParsedSource, loader: Function, name: str) -> str:
    """``size_t`` for ``template <..., size_t N, ...>``'s ``N``."""
    if loader.template is not None:
        for declaration in loader.template.named_children:
            declarator = declaration.child_by_field_name("declarator")
            kind = declaration.child_by_field_name("type")
            if declarator is not None and kind is not None and source.text_of(declarator) == name:
                return source.text_of(kind)
    raise NotInForm(f"a load over {name}, neither a parameter nor a value template", NEEDED)


def _row_type(source: ParsedSource, kernel: Function, row: Node) -> str:
    """The declared type of the row index (``size_t k_i``), else ``long long``."""
    declared = source.local_types(kernel).get(source.text_of(row), "")
    kept = " ".join(w for w in declared.split() if w not in ("const", "constexpr"))
    return kept if kept and "*" not in kept and "[" not in kept else "long long"
