"""Shared memory however the code reaches it, and the copies from global memory into it.

A tile is staged into shared memory by a store ``As[i] = A[j]`` in the kernel, by a helper
that receives the shared arrays as parameters (``loadFromGmem(..., As, Bs, ...)``), through a
pointer cast from ``extern __shared__ char buf[]`` (``reinterpret_cast<x128*>(buf)[k] =
load128(w + i)``), from a struct that hands out the dynamic buffer (``SharedMemory<T>()``), or
asynchronously (``cp.async``, TMA). :class:`SharedMemory` lists, for one function, the
shared buffers, the accesses to them, the *copies* (a store into shared memory of a value
read from global memory), the asynchronous copies and the block barriers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from klineage.cuda.analysis.callgraph import BLOCK_BARRIERS
from klineage.cuda.analysis.indices import Access, FunctionIndices
from klineage.cuda.analysis.ptx import PtxSite
from klineage.cuda.source import Function, Node, call_name
from klineage.cuda.tree import call_arguments, walk

if TYPE_CHECKING:
    from klineage.cuda.analysis import SourceAnalysis

__all__ = ["ASYNC_COPY_FAMILIES", "Copy", "SharedMemory"]

ASYNC_COPY_FAMILIES = ("cp_async", "tma_load")
"""PTX families that copy global memory into shared memory without the registers."""
_ASYNC_CALLS = ("__pipeline_memcpy_async", "memcpy_async", "cuda::memcpy_async")


@dataclass(frozen=True)
class Copy:
    """A store into shared memory of a value read from global memory."""

    store: Access
    loads: tuple[Access, ...]
    """The global loads the stored value comes from."""


class SharedMemory:
    """The shared memory of one function (its helpers' accesses seen at their calls)."""

    def __init__(self, analysis: SourceAnalysis, function: Function) -> None:
        self.analysis = analysis
        self.function = function
        self.indices: FunctionIndices = analysis.indices(function)

    @cached_property
    def accesses(self) -> list[Access]:
        """Loads and stores of shared memory."""
        return [a for a in self.indices.accesses() if a.buffer.space == "shared"]

    @cached_property
    def copies(self) -> list[Copy]:
        """Stores into shared memory of values read from global memory."""
        found = []
        for store in self.accesses:
            if store.direction in ("load", "address"):
                continue
            loads = self._loads_feeding(store)
            if any(load.buffer.space == "global" for load in loads):
                found.append(Copy(store, tuple(loads)))
        return found

    @cached_property
    def async_copies(self) -> list[PtxSite]:
        """cp.async and TMA copies (inline, macro or wrapper) issued in the function."""
        sites = self.analysis.ptx.sites_in(self.function)
        return [s for s in sites if s.families() & set(ASYNC_COPY_FAMILIES)]

    @cached_property
    def async_calls(self) -> list[Node]:
        """Calls of the CUDA C++ asynchronous-copy APIs (``__pipeline_memcpy_async``...)."""
        body = self.function.body
        if body is None:
            return []
        source = self.analysis.source
        return [
            c
            for c in self.indices.nodes("call_expression")
            if (call_name(source, c) or "").split("<")[0] in _ASYNC_CALLS
        ]

    @cached_property
    def barriers(self) -> list[Node]:
        """Block barriers: ``__syncthreads()``, a block group's ``sync``, and calls of helpers
        that hold one."""
        body = self.function.body
        if body is None:
            return []
        source = self.analysis.source
        groups = self.analysis.cooperative_groups
        graph = self.analysis.call_graph
        found = []
        for call in self.indices.nodes("call_expression"):
            name = call_name(source, call) or ""
            barrier = groups.barrier_at(call)
            block_barrier = barrier is not None and barrier.scope == "block"
            helper = graph.definition(name) is not None and graph.summary(name).block_barrier
            if name in BLOCK_BARRIERS or block_barrier or helper:
                found.append(call)
        return found

    def stages(self) -> bool:
        """Whether the function copies global memory into shared memory at all (by stores or
        asynchronously) and holds a block barrier."""
        copies = self.copies or self.async_copies or self.async_calls
        return bool(copies) and bool(self.barriers)

    # -- where a stored value comes from ----------------------------------------------------

    def _loads_feeding(self, store: Access) -> list[Access]:
        if store.helper is None:
            return self._loads_in(self.indices, store.node, None)
        callee = self.analysis.call_graph.definition(store.helper)
        if callee is None or store.inner is None:
            return []
        helper_indices = self.analysis.indices(callee)
        values = self.analysis.binding(self.indices, callee, store.node, call_arguments(store.node))
        inner = self._loads_in(helper_indices, store.inner, None)
        rebound = [self.analysis.rebind(a, values, self.indices, store.node, callee) for a in inner]
        return [a for a in rebound if a is not None]

    def _loads_in(self, indices: FunctionIndices, target: Node, _: None) -> list[Access]:
        """The loads of ``indices``' function that the value assigned at ``target`` reads,
        directly or through the values given to a local it reads."""
        value = _assigned_value(target)
        if value is None:
            return []
        spans = [(value.start_byte, value.end_byte)]
        source = self.analysis.source
        for node in walk(value):
            if node.type == "identifier":
                for definition in _definitions(indices, source.text_of(node)):
                    spans.append((definition.start_byte, definition.end_byte))
        return [
            a
            for a in indices.accesses()
            if a.direction in ("load", "both")
            and any(start <= a.node.start_byte < end for start, end in spans)
        ]


def _assigned_value(target: Node) -> Node | None:
    """The right side of the assignment whose left side holds ``target``."""
    current = target
    while current.parent is not None and current.parent.type in (
        "parenthesized_expression",
        "field_expression",
        "subscript_expression",
        "pointer_expression",
    ):
        current = current.parent
    parent = current.parent
    if parent is None or parent.type != "assignment_expression":
        return None
    return parent.child_by_field_name("right")


def _definitions(indices: FunctionIndices, name: str) -> list[Node]:
    """The values a local is given: its initializer and the right sides of its assignments;
    none for an accumulator (``acc += x[i]`` holds a sum of loads, not a loaded value)."""
    source = indices.source
    found = [value for _, value in indices._defs.declared.get(name, []) if value is not None]
    for write in indices._defs.written.get(name, []):
        right = write.child_by_field_name("right")
        operator = write.child_by_field_name("operator")
        if write.type == "update_expression" or right is None:
            return []
        if operator is not None and operator.type != "=":
            return []
        if any(n.type == "identifier" and source.text_of(n) == name for n in walk(right)):
            return []
        found.append(right)
    return found
