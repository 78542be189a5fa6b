"""Warp tiles recognized by what the warp index does in the addresses.

A block's warps form a 2-D grid of warp tiles when the warp index is split into two
coordinates (``warp / kWarpsN`` and ``warp % kWarpsN``, however the warp index is spelled:
``threadIdx.x / 32``, ``(threadIdx.y * blockDim.x + threadIdx.x) / 32U``, a warp id passed to a
helper) and each coordinate scales an address by a tile extent. The index analysis sees the
coordinates as atoms that depend on the warp index alone; a kernel whose shared or global
addresses (loads, stores, or addresses handed to ``ldmatrix``/``cp.async``) use two such
coordinates with extents has warp tiles, in its own code or in the helpers it calls.
"""

from __future__ import annotations

from klineage.cuda.analysis import FunctionIndices, analysis
from klineage.cuda.analysis.indices import BLOCK_ATOMS, THREAD_ATOMS, is_loop_atom
from klineage.cuda.source import Function, ParsedSource

__all__ = ["warp_coordinates"]


def _warp_only(indices: FunctionIndices, depends: frozenset[str]) -> bool:
    """Whether an opaque atom depends on the warp index and on nothing else that varies."""
    varying = {a for a in depends if a in THREAD_ATOMS or a in BLOCK_ATOMS or is_loop_atom(a)}
    return varying == {"warp"}


def warp_coordinates(source: ParsedSource, function: Function) -> list[str]:
    """The warp-tile coordinates a kernel's addresses scale by tile extents (sorted); two or
    more make a 2-D grid of warp tiles."""
    indices = analysis(source).indices(function)
    found: set[str] = set()
    for access in indices.accesses():
        if access.buffer.space not in ("shared", "global"):
            continue
        deps = dict(access.offset.opaque)
        for atom, depends in deps.items():
            if not _warp_only(indices, depends):
                continue
            extent = access.offset.coefficient(atom)
            if extent.terms and extent.value not in (1, -1) and indices.is_uniform(extent):
                found.add(atom)
    return sorted(found)
