"""Removing a row each thread caches in shared memory (llm.c layernorm k6's idiom).

A kernel that walks its row several times may keep the first pass's loads in shared memory
and read them back in the later passes, each thread its own slots, so no barrier is needed::

    x128* s_in = reinterpret_cast<x128*>(buf) + threadIdx.y * C / x128::size;
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
      const x128 in_data = load128cs(inp + c);
      ...
      s_in[c / x128::size] = in_data;
    }
    ...
    for (int c = lane * x128::size; c < C; c += 32 * x128::size) {
      const x128 in_data = s_in[c / x128::size];   // the same slot, the same thread
      ...
    }

Removing the cache loads global memory again where the cache was read: the store goes, each
read ``S[e]`` becomes the expression the stored value was loaded with, and the declarations
nothing uses any more go. Valid when ``S`` (shared memory) is stored once, in a loop, at
``c`` or ``c / V`` (``c`` the loop's variable, a multiple of ``V``), and read only as the same
``S[e]`` in later loops with the same header; the loaded expression names only ``c`` and
values nothing writes between the store and the last read. The same header and slot mean the
thread that reads a slot is the one that stored it, which is why the expert needs no barrier.
The forward rule (:mod:`klineage.mechanisms._staging_row_cache_forward`) writes the cache
back in this form, so the removal reads what it writes.
"""

from __future__ import annotations

import re

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, call_name
from klineage.cuda.tree import NotInForm, assigned_names, statements, walk
from klineage.mechanisms._dynamic_shared import idle_requests
from klineage.mechanisms._staging_once import (
    is_written,
    loop_store,
    multiple_of,
    no_shared_left,
    orphan_deletions,
)
from klineage.mechanisms._tiles_util import is_call_statement

__all__ = ["cached_rows", "row_cache_removal"]

NEEDED = (
    "a shared buffer stored once, `S[c] = v` or `S[c / V] = v` in a loop over c, and read only "
    "as the same `S[e]` in later loops with the same header, v loaded from values nothing "
    "writes in between"
)


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, NEEDED)


def _header(source: ParsedSource, loop: Node) -> str:
    """A for loop's header with spaces dropped (init; condition; update)."""
    parts = [loop.child_by_field_name(f) for f in ("initializer", "condition", "update")]
    return ";".join(re.sub(r"\s+", "", source.text_of(p)) if p is not None else "" for p in parts)


def _uses(source: ParsedSource, function: Function, name: str) -> list[Node]:
    assert function.body is not None
    return [
        n
        for n in walk(function.body)
        if n.type == "identifier"
        and source.text_of(n) == name
        and (n.parent is None or n.parent.type not in ("init_declarator", "pointer_declarator"))
    ]


def cached_rows(source: ParsedSource, function: Function) -> list[Node]:
    """The store statements of shared buffers that look like a per-thread row cache: one store
    in a for loop, every other use in a later for loop with the same header (a tile staged for
    the block is read by other loops, after a barrier)."""
    found = []
    if function.body is None:
        return found
    spaces = analysis(source).spaces
    for statement in walk(function.body):
        if statement.type != "expression_statement" or not statement.named_children:
            continue
        target = statement.named_children[0]
        if target.type != "assignment_expression":
            continue
        left = target.child_by_field_name("left")
        base = left.child_by_field_name("argument") if left is not None else None
        if left is None or left.type != "subscript_expression" or base is None:
            continue
        if base.type != "identifier" or spaces.of(function, base) != {"shared"}:
            continue
        loop = statement.parent.parent if statement.parent is not None else None
        if loop is None or loop.type != "for_statement":
            continue
        uses = _uses(source, function, source.text_of(base))
        later = [u for u in uses if u.start_byte > loop.end_byte]
        header = _header(source, loop)
        walks = [ParsedSource.ancestor(u, "for_statement") for u in later]
        if (
            later
            and len(uses) == len(later) + 1
            and all(w is not None and _header(source, w) == header for w in walks)
        ):
            found.append(statement)  # read back by later walks of the same slots
    return found


def row_cache_removal(source: ParsedSource, function: Function, node: Node) -> list[Edit]:
    """The edits that remove the row cache whose store statement is ``node``."""
    assert function.body is not None
    body = node.parent
    loop = body.parent if body is not None else None
    if body is None or loop is None or loop.type != "for_statement":
        raise _refuse(f"a cache store `{source.snippet(node, 50)}` outside a for loop's body")
    indices = analysis(source).indices(function)
    variable = next((v for v in indices.loops if v.loop == loop), None)
    if variable is None:
        raise _refuse(f"a loop `{source.snippet(loop, 50)}` with no induction variable")
    store = loop_store(source, node, variable.name)
    if store.divisor is not None:
        divisor = indices.form(store.divisor)
        if not (
            multiple_of(indices, variable.init, divisor)
            and variable.step is not None
            and multiple_of(indices, variable.step, divisor)
        ):
            raise _refuse(
                f"a store at `{variable.name} / {source.text_of(store.divisor)}` with "
                f"{variable.name} not a multiple of it (two turns could share a slot)"
            )
    value = _loaded(source, body, node, store.value, variable.name)
    header = _header(source, loop)
    slot = re.sub(r"\s+", "", source.text_of(node.named_children[0].child_by_field_name("left")))
    reads = [u for u in _uses(source, function, store.buffer) if u.start_byte > loop.end_byte]
    last = loop
    edits = [source.deletion(node, whole_line=True)]
    for use in reads:
        read = use.parent
        if read is None or read.type != "subscript_expression" or is_written(read):
            raise _refuse(f"{store.buffer} used as `{source.snippet(read or use, 50)}`")
        if re.sub(r"\s+", "", source.text_of(read)) != slot:
            raise _refuse(f"a read `{source.text_of(read)}` of another slot than `{slot}`")
        around = ParsedSource.ancestor(read, "for_statement")
        if around is None or _header(source, around) != header:
            raise _refuse(f"a read `{source.text_of(read)}` outside a loop like the store's")
        last = max(last, around, key=lambda n: n.end_byte)
        edits.append(Edit.replace(read, wrap_at(read, source.text_of(value), precedence(value))))
    if not reads:
        raise _refuse(f"a cache {store.buffer} nothing reads back")
    _check_unwritten(source, function, loop, last, value, variable.name)
    replaced = [u.parent for u in reads if u.parent is not None]
    deletions = orphan_deletions(source, function, [node, *replaced])
    edits += [d for d in deletions if not any(d.start_byte == e.start_byte for e in edits)]
    deleted = [(e.start_byte, e.end_byte) for e in deletions]
    if no_shared_left(source, function, {store.buffer}, [node, *replaced], deleted):
        edits += [
            source.deletion(b, whole_line=True)
            for b in _idle_barriers(source, function, edits)
            if not any(e.start_byte <= b.start_byte < e.end_byte for e in edits)
        ]
        edits += idle_requests(source, function)
    return edits


def _idle_barriers(source: ParsedSource, function: Function, edits: list[Edit]) -> list[Node]:
    """Top-level ``__syncthreads();`` statements with no memory access before them (statements
    the edits delete aside): with no shared memory left they order nothing (a staged tile's
    wait, once the tile is gone)."""
    assert function.body is not None
    found = []
    deleted = [(e.start_byte, e.end_byte) for e in edits if not e.replacement]
    for statement in statements(function.body):
        if any(start <= statement.start_byte < end for start, end in deleted):
            continue
        if is_call_statement(source, statement, "__syncthreads"):
            found.append(statement)
            continue
        for node in walk(statement):
            if node.type in ("subscript_expression", "pointer_expression", "field_expression"):
                if node.type != "field_expression" or source.text_of(node).split(".")[0] in (
                    "threadIdx",
                    "blockIdx",
                    "blockDim",
                    "gridDim",
                ):
                    continue
                return found
            if node.type == "call_expression":
                name = call_name(source, node) or ""
                if name not in ("assert", "__syncthreads"):
                    return found
    return found


def _loaded(source: ParsedSource, body: Node, store: Node, value: Node, variable: str) -> Node:
    """The expression the stored value was loaded with: a local's initializer, else the
    stored expression itself."""
    if value.type != "identifier":
        return value
    name = source.text_of(value)
    for statement in statements(body):
        if statement.start_byte >= store.start_byte:
            break
        if statement.type != "declaration":
            continue
        for declarator in statement.children_by_field_name("declarator"):
            target = declarator.child_by_field_name("declarator")
            initial = declarator.child_by_field_name("value")
            if target is not None and source.text_of(target) == name and initial is not None:
                if name in assigned_names(source, statements(body)):
                    raise _refuse(f"a cached value {name} assigned again in the loop")
                if initial.type == "initializer_list" and len(initial.named_children) == 1:
                    initial = initial.named_children[0]
                return initial
    raise _refuse(f"a cached value {name} not declared with its load in the loop")


def _check_unwritten(
    source: ParsedSource, function: Function, first: Node, last: Node, value: Node, variable: str
) -> None:
    """Nothing the loaded expression names (but the loop variable) is written from the store's
    loop to the last read's."""
    named = {source.text_of(n) for n in walk(value) if n.type == "identifier"} - {variable}
    assert function.body is not None
    between = [
        s
        for s in statements(function.body)
        if s.end_byte > first.start_byte and s.start_byte < last.end_byte
    ]
    written = assigned_names(source, between) & named
    if written:
        raise _refuse(f"a load over {', '.join(sorted(written))}, written while the cache lives")
