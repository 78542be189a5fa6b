"""Rows of a staged 2-D tile given back to the reader helper that reads them: the forward
twin of :mod:`klineage.mechanisms._staging_reader_2d`.

Where the removal left a helper that takes a row's index ``r`` and reads the bounds-checked
load of slot ``[r][e]`` (:mod:`klineage.mechanisms._staging_tile_2d_forward`), the staging
hands it the row instead::

    reader_from_A<T, BM>(kk, out, .., A, BK, k, lda, m, t);   // reads (... ? A[..] : zero)
    ->  reader_from_A<T, BM>(tile_a[kk], out, ..);              // reads row[e]

the parameter ``r`` becomes ``T const row[E_b]`` (``E_b`` the helper's name for the block
side's extent), each read ``row[I_b]``, and the last parameters that only the reads used go
with their arguments (the values the removal appended). Copies named ``<helper>_from_<P>``
that end up the same but for that name are one helper again, under the name they were
copied from (unless something else has that name), which is what the removal started from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from klineage.cuda.analysis import analysis
from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource, within
from klineage.cuda.tree import NotInForm, call_arguments, fresh_name, strip_parens, walk
from klineage.mechanisms._tiles_util import function_names, statement_deletion

if TYPE_CHECKING:
    from klineage.mechanisms._staging_tile_2d_forward import Operand2d

__all__ = ["check_reader", "reader_row_edits"]

NEEDED = (
    "a reader helper whose reads of the operand all take their K-side index from one of its "
    "parameters (the row's index), used nowhere else, with the block side's extent a template "
    "parameter, a file constant or a number"
)


def _row_param(source: ParsedSource, operand: Operand2d) -> int:
    """The position of the helper's parameter the reads take their row from."""
    helper = operand.scope
    names = {source.text_of(strip_parens(i)) for r in operand.reads for i in r.k.copies}
    position = next((i for i, p in enumerate(helper.params) if p.name in names), None)
    if len(names) != 1 or position is None:
        raise NotInForm(
            f"{helper.name}, whose reads index the K side by `{', '.join(sorted(names))}`", NEEDED
        )
    return position


def check_reader(source: ParsedSource, operand: Operand2d) -> None:
    """NotInForm when the reader helper cannot get the tile's rows."""
    helper = operand.scope
    assert helper.body is not None
    name = helper.params[_row_param(source, operand)].name
    indices = [strip_parens(i) for r in operand.reads for i in r.k.copies]
    for node in walk(helper.body):
        if node.type == "identifier" and source.text_of(node) == name and node not in indices:
            raise NotInForm(
                f"{helper.name}, which uses its row index {name} as "
                f"`{source.snippet(node.parent or node, 50)}` besides the reads",
                NEEDED,
            )
    extent = operand.reads[0].b.extent
    text = source.text_of(extent)
    if not (
        extent.type == "number_literal"
        or text in helper.template_params
        or text in analysis(source).constants
    ):
        raise NotInForm(f"{helper.name}'s rows `{text}` wide, a value of run time", NEEDED)


def _used(source: ParsedSource, operand: Operand2d, name: str) -> bool:
    """Whether ``name`` is still read in the helper once its reads keep only ``I_b``."""
    helper = operand.scope
    assert helper.body is not None
    for node in walk(helper.body):
        if node.type != "identifier" or source.text_of(node) != name:
            continue
        read = next((r for r in operand.reads if within(node, r.node)), None)
        if read is None or any(within(node, i) for i in read.b.copies):
            return True
    return False


def _spliced(source: ParsedSource, start: int, end: int, pieces: list[tuple[int, int, str]]) -> str:
    out, cursor = [], start
    for a, b, text in sorted(pieces):
        out += [source.data[cursor:a].decode("utf-8"), text]
        cursor = b
    return "".join(out) + source.data[cursor:end].decode("utf-8")


def _rewrite(
    source: ParsedSource, operand: Operand2d, tile: str, name: str
) -> tuple[str, list[Edit]]:
    """The helper's text with the row for the index, under ``name``, and the call's edits."""
    helper, call = operand.scope, operand.reader
    assert helper.body is not None and call is not None
    position = _row_param(source, operand)
    param = helper.params[position]
    assert param.name is not None
    taken = function_names(source, helper) | set(helper.template_params)
    stem = param.name.removesuffix("_index")
    row = stem if stem != param.name and stem not in taken else fresh_name(taken, "row")
    element = helper.param(operand.local)
    declared = helper.declarator.child_by_field_name("declarator")
    assert element is not None and declared is not None
    width = source.text_of(operand.reads[0].b.extent)
    pieces = [
        (declared.start_byte, declared.end_byte, name),
        (param.node.start_byte, param.node.end_byte, f"{element.base_type} const {row}[{width}]"),
    ]
    for read in operand.reads:
        index = source.text_of(strip_parens(read.b.index))
        pieces.append((read.node.start_byte, read.node.end_byte, f"{row}[{index}]"))
    params, args = helper.params, call_arguments(call)
    keep = len(params)
    while keep > position + 1 and not _used(source, operand, params[keep - 1].name or ""):
        keep -= 1
    edits = [Edit.replace(args[position], f"{tile}[{source.text_of(args[position])}]")]
    if keep < len(params) and len(args) == len(params):
        pieces.append((params[keep - 1].node.end_byte, params[-1].node.end_byte, ""))
        edits.append(Edit.delete(args[keep - 1].end_byte, args[-1].end_byte))
    callee = _callee_name(call)
    if name != helper.name and callee is not None:
        edits.append(Edit.replace(callee, name))
    text = _spliced(source, helper.outer.start_byte, helper.outer.end_byte, pieces)
    return text, edits


def _callee_name(call: Node) -> Node | None:
    function = call.child_by_field_name("function")
    if function is not None and function.type == "template_function":
        return function.child_by_field_name("name")
    return function


def _stems(source: ParsedSource, operands: list[Operand2d], tiles: dict[str, str]) -> list[str]:
    """Each reader's name once its row is back: the name it was copied from, where every copy
    of that name comes out the same and nothing else has it; else its own."""
    defined = {f.name for f in source.functions}
    wanted = [o.scope.name.removesuffix(f"_from_{o.pointer}") for o in operands]
    names = []
    for operand, stem in zip(operands, wanted, strict=True):
        group = [o for o, s in zip(operands, wanted, strict=True) if s == stem]
        same = len({_rewrite(source, o, tiles[o.pointer], stem)[0] for o in group}) == 1
        free = stem not in defined
        names.append(stem if stem != operand.scope.name and same and free else operand.scope.name)
    return names


def reader_row_edits(
    source: ParsedSource, operands: list[Operand2d], tiles: dict[str, str]
) -> list[Edit]:
    """The readers' rewrites (see the module docstring); ``tiles``: each pointer's tile."""
    edits: list[Edit] = []
    kept: dict[str, Node] = {}  # the definition each name keeps, the last one written
    ordered = sorted(operands, key=lambda o: o.scope.outer.start_byte)
    for operand, name in zip(ordered, _stems(source, ordered, tiles), strict=True):
        text, call_edits = _rewrite(source, operand, tiles[operand.pointer], name)
        edits += call_edits
        outer = operand.scope.outer
        previous = kept.get(name)
        if previous is None:
            edits.append(Edit.replace(outer, text))
        elif source.data[previous.end_byte : outer.start_byte].strip():
            edits.append(statement_deletion(source, outer))
        else:  # the copy right after the one kept, with the blank line between
            edits.append(Edit.delete(previous.end_byte, outer.end_byte))
        kept[name] = outer
    return edits
