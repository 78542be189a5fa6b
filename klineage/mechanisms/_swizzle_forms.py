"""Shared-memory swizzles that are not an XOR in an index helper.

- a *rotation*: the 16-byte chunk a lane writes or reads is shifted by a row-dependent amount
  modulo the chunks of a row, ``(lane % 4 + (row % 8) / 2) % 4``: a modulo of a sum of two
  parts that vary differently, in a statement that forms a shared-memory address;
- a swizzle done by the *TMA copy engine*: a tensor map encoded with
  ``CU_TENSOR_MAP_SWIZZLE_32B/64B/128B`` (the matching mode is then declared to ``wgmma`` in the
  shared-memory descriptor).

Both permute the chunks of each row so the rows an access touches together land in different
banks; both are reported with their form. A rotation at every access of one array is removed by
:mod:`klineage.mechanisms._swizzle_rotation` (``kind`` ``rotation``); a TMA swizzle is refused.
"""

from __future__ import annotations

import re

from klineage.cuda.analysis import FunctionIndices, analysis
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import binary_operands, identifier_names
from klineage.mechanisms._forms import FoundForm

__all__ = ["ROTATION", "swizzle_forms"]

ROTATION = "rotation"
_NEEDED = "an XOR swizzle `chunk ^ (row & mask)` in a shared-memory index helper"
_TMA_SWIZZLE = re.compile(r"\bCU_TENSOR_MAP_SWIZZLE_(32|64|128)B\b")
_SHARED_ADDRESS = ("__cvta_generic_to_shared",)


def _statement(node: Node, function: Function) -> Node:
    current = node
    while current.parent is not None and current.parent.type != "compound_statement":
        current = current.parent
    return current


def _addresses_shared(source: ParsedSource, function: Function, statement: Node) -> bool:
    names = identifier_names(source, statement)
    if names & set(_SHARED_ADDRESS):
        return True
    shared = {
        name
        for name, buffer in analysis(source).indices(function).buffers.items()
        if buffer.space == "shared"
    }
    return bool(names & shared)


def _rotations(source: ParsedSource, indices: FunctionIndices) -> list[Node]:
    function = indices.function
    assert function.body is not None
    found = []
    for node in indices.nodes("binary_expression"):
        sides = binary_operands(node, "%")
        if sides is None or indices.form(sides[1]).value is None:
            continue
        parts = binary_operands(sides[0], "+")
        if parts is None:
            continue
        atoms = [indices.thread_atoms(indices.form(p)) for p in parts]
        varying = [indices.form(p).base_atoms() for p in parts]
        if not all(atoms) or varying[0] == varying[1]:
            continue
        statement = _statement(node, function)
        if _addresses_shared(source, function, statement):
            found.append(statement)
    return found


def swizzle_forms(source: ParsedSource, skip: set[int]) -> list[FoundForm]:
    """Rotation swizzles of the kernels and TMA swizzle modes, not already reported."""
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        rotations = _rotations(source, analysis(source).indices(function))
        if rotations and rotations[0].start_byte not in skip:
            form = "a rotation of the 16-byte chunks of each row by a row-dependent amount"
            found.append(FoundForm(rotations[0], function, form, _NEEDED, kind=ROTATION))
    for call in source.calls:
        text = source.text_of(call.node)
        match = _TMA_SWIZZLE.search(text)
        caller = source.enclosing_function(call.node)
        if match is None or caller is None or call.node.start_byte in skip:
            continue
        form = f"a {match.group(1)}-byte swizzle applied by the TMA copy engine (its tensor map)"
        found.append(FoundForm(call.node, caller, form, _NEEDED))
        break
    return found
