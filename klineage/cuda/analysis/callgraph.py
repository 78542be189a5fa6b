"""The call graph of a source, with what each device helper does.

A pattern is often inside a helper: ``wt::loadFromGmem(..., As, Bs, ...)`` stores the tiles,
``warpReduceSum(v)`` shuffles, ``load_async(...)`` issues a TMA copy. The graph (a
``networkx.DiGraph`` over function names, an edge per caller and callee holding the call
nodes) lets a mechanism see such a helper at its call sites' level. Each function gets a
:class:`FunctionSummary` closed over what it calls: whether it holds a block barrier, a warp
collective, which PTX families it issues.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from klineage.cuda.analysis.cooperative_groups import CooperativeGroups
from klineage.cuda.analysis.ptx import PtxModel
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import callee_name

__all__ = ["BLOCK_BARRIERS", "WARP_COLLECTIVES", "CallGraph", "FunctionSummary"]

BLOCK_BARRIERS = frozenset(
    {
        "__syncthreads",
        "__syncthreads_or",
        "__syncthreads_and",
        "__syncthreads_count",
        "__barrier_sync",
    }
)
"""Intrinsics every thread of the block must reach."""
WARP_COLLECTIVES = (
    "__shfl",
    "__ballot",
    "__any_sync",
    "__all_sync",
    "__match",
    "__reduce_",
    "__activemask",
)
"""Prefixes of the warp-wide intrinsics."""


def _short(name: str) -> str:
    return callee_name(name)


@dataclass
class FunctionSummary:
    """What a function does, itself or through what it calls."""

    name: str
    block_barrier: bool = False
    """Holds ``__syncthreads()`` (or a block-group ``sync``)."""
    warp_collective: bool = False
    """Holds a shuffle, vote or warp reduction (intrinsic or cooperative groups)."""
    ptx: set[str] = field(default_factory=set)
    """The PTX instruction families it issues (see :mod:`klineage.cuda.analysis.ptx`)."""


class CallGraph:
    """Functions as nodes, calls as edges (``calls`` holds the call nodes)."""

    def __init__(self, source: ParsedSource, groups: CooperativeGroups, ptx: PtxModel) -> None:
        self.source = source
        self.graph: nx.DiGraph = nx.DiGraph()
        self._functions: dict[str, list[Function]] = {}
        for function in source.functions:
            self._functions.setdefault(function.name, []).append(function)
            self.graph.add_node(function.name)
        for call in source.calls:
            caller = source.enclosing_function(call.node)
            callee = _short(call.name)
            if caller is None or callee not in self._functions or callee == caller.name:
                continue
            if not self.graph.has_edge(caller.name, callee):
                self.graph.add_edge(caller.name, callee, calls=[])
            self.graph.edges[caller.name, callee]["calls"].append(call.node)
        self._bind_function_parameters()
        self.summaries = self._summarize(groups, ptx)

    def _bind_function_parameters(self) -> None:
        """Calls through a kernel's function-pointer template parameter
        (``template <fn_ptr body> __global__ void k(...) { body(...); }``) are calls of each
        function a launch binds to it (``k<tile_body><<<...>>>``): the kernel's work may live
        entirely in the bound ``__device__`` function."""
        source = self.source
        for launch in source.launches:
            for kernel in self.functions_named(launch.kernel):
                if not kernel.is_kernel:
                    continue
                params = kernel.template_params
                for param, argument in zip(params, launch.template_args, strict=False):
                    for bound in self._functions_bound(launch.node, argument):
                        if bound != kernel.name:
                            self._add_parameter_calls(kernel, param, bound)

    def _functions_bound(self, at: Node, argument: Node) -> list[str]:
        """The functions a template argument names: itself (``&body``, ``body``), or, where it
        is a template parameter of the launching function (a launcher templated on the body),
        what that function's callers bind to it."""
        source = self.source
        name = source.text_of(argument).strip().lstrip("&").strip("() ")
        if name in self._functions:
            return [name]
        launcher = source.enclosing_function(at)
        if launcher is None or name not in launcher.template_params:
            return []
        index = launcher.template_params.index(name)
        found = []
        for call in source.calls:
            if call.name != launcher.name or call.template_args is None:
                continue
            arguments = call.template_args.named_children
            if index < len(arguments):
                bound = source.text_of(arguments[index]).strip().lstrip("&").strip("() ")
                if bound in self._functions and bound not in found:
                    found.append(bound)
        return found

    def _add_parameter_calls(self, kernel: Function, param: str, bound: str) -> None:
        source = self.source
        for call in source.calls:
            caller = source.enclosing_function(call.node)
            if call.name != param or caller is None or caller.node != kernel.node:
                continue
            if not self.graph.has_edge(kernel.name, bound):
                self.graph.add_edge(kernel.name, bound, calls=[])
            calls = self.graph.edges[kernel.name, bound]["calls"]
            if call.node not in calls:
                calls.append(call.node)

    # -- queries ----------------------------------------------------------------------------

    def functions_named(self, name: str) -> list[Function]:
        """Every definition under a name (templates and overloads share one)."""
        return self._functions.get(_short(name), [])

    def definition(self, name: str) -> Function | None:
        """The first definition of a function (templates and overloads share a name)."""
        found = self.functions_named(name)
        return found[0] if found else None

    def callees(self, function: str) -> list[str]:
        """The functions ``function`` calls directly."""
        return list(self.graph.successors(function)) if function in self.graph else []

    def call_sites(self, callee: str) -> list[tuple[str, Node]]:
        """Every ``(caller, call node)`` of ``callee``."""
        callee = _short(callee)
        if callee not in self.graph:
            return []
        return [
            (caller, node)
            for caller in self.graph.predecessors(callee)
            for node in self.graph.edges[caller, callee]["calls"]
        ]

    def reachable(self, function: str) -> set[str]:
        """The functions ``function`` calls, directly or not."""
        return set(nx.descendants(self.graph, function)) if function in self.graph else set()

    def summary(self, name: str) -> FunctionSummary:
        """What a function does, its callees included (an empty summary if unknown)."""
        return self.summaries.get(_short(name), FunctionSummary(_short(name)))

    # -- summaries --------------------------------------------------------------------------

    def _summarize(self, groups: CooperativeGroups, ptx: PtxModel) -> dict[str, FunctionSummary]:
        source = self.source
        summaries = {name: FunctionSummary(name) for name in self._functions}
        for call in source.calls:
            function = source.enclosing_function(call.node)
            if function is None:
                continue
            summary = summaries[function.name]
            if call.name in BLOCK_BARRIERS:
                summary.block_barrier = True
            elif call.name.startswith(WARP_COLLECTIVES):
                summary.warp_collective = True
        for barrier in groups.barriers:
            if barrier.scope == "block":
                summaries[barrier.function.name].block_barrier = True
        for reduce in groups.reduces:
            summaries[reduce.function.name].warp_collective = True
        for shuffle in groups.shuffles:
            summaries[shuffle.function.name].warp_collective = True
        for site in ptx.sites:
            if site.function is not None and site.via != "helper":
                summaries[site.function.name].ptx |= site.families()
        # close over calls, callees first (a cycle only delays the fixed point)
        changed = True
        while changed:
            changed = False
            for caller, callee in self.graph.edges:
                mine, theirs = summaries[caller], summaries[callee]
                before = (mine.block_barrier, mine.warp_collective, len(mine.ptx))
                mine.block_barrier |= theirs.block_barrier
                mine.warp_collective |= theirs.warp_collective
                mine.ptx |= theirs.ptx
                changed |= before != (mine.block_barrier, mine.warp_collective, len(mine.ptx))
        return summaries
