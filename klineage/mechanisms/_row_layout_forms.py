"""A warp or a block per row, recognized by what the indices do.

A group of threads handles a row when a loop's index starts at the thread's rank in the group
and strides by the group's size (``c = lane; c < n; c += 32``, ``i = threadIdx.x; i < n; i +=
blockDim.x``, in elements or in packed vectors), the row it walks is the same for every thread
of the group (built from ``blockIdx``, the warp index, ``threadIdx.y`` of a 32-wide block), and
the partial results are combined across the group (a warp shuffle, ``cg::reduce``, a helper
that shuffles; for a block, also a barrier). The index analysis reads that however the row is
spelled: ``blockIdx.x * blockDim.y + threadIdx.y`` in a 32 x y block, ``blockIdx.x *
warpsPerBlock + warpId``, ``warp.meta_group_rank()``, rows per block in a loop.

The rewrite (:mod:`klineage.mechanisms._rows_forms`) takes its canonical forms; these
kernels are reported and refused with the form they are in.
"""

from __future__ import annotations

from typing import Literal

from klineage.cuda.analysis import FunctionIndices, IndexForm, LoopVariable, analysis
from klineage.cuda.analysis.indices import BLOCK_ATOMS, is_loop_atom
from klineage.cuda.source import Function, ParsedSource
from klineage.cuda.tree import WARP_SIZE
from klineage.mechanisms._forms import FoundForm

__all__ = ["row_layout_forms"]

Group = Literal["block", "warp"]
_NEEDED: dict[Group, str] = {
    "warp": (
        "the canonical warp-per-row kernel: row `blockIdx.x * kWarps + (threadIdx.x >> 5)`, "
        "loops `for (c = lane; c < n; c += 32)`, a warp-sum helper"
    ),
    "block": (
        "the canonical block-per-row kernel: row `blockIdx.x`, loops `for (c = threadIdx.x; "
        "c < n; c += blockDim.x)`, a block-reduction helper or the inline warp-reduce / "
        "publish / __syncthreads() / reload sequence"
    ),
}


def _rank_and_unit(indices: FunctionIndices, loop: LoopVariable, group: Group) -> bool:
    """Whether the loop starts at the thread's rank in ``group`` times a unit ``u`` (1, or a
    vector's width) and strides by the group's size times ``u``."""
    step = loop.step
    if step is None or not indices.is_uniform(step):
        return False
    ranks = ["threadIdx.x"]
    if group == "warp":
        ranks = ["lane"] + (["threadIdx.x"] if indices.lane_is_thread_x() else [])
    for rank in ranks:
        unit = loop.init.coefficient(rank)
        if not unit.terms or not indices.is_uniform(unit):
            continue
        rest = loop.init - unit * IndexForm.atom(rank)
        others = indices.thread_atoms(rest) - (
            {"threadIdx.y", "threadIdx.z"} if group == "warp" else set()
        )
        if others:
            continue
        if group == "warp":
            return step == unit * WARP_SIZE
        return step != unit * WARP_SIZE and _block_sized(step, unit)
    return False


def _block_sized(step: IndexForm, unit: IndexForm) -> bool:
    """``blockDim.x * u`` (times an unroll factor), or a template block size times ``u``."""
    if step.coefficient("blockDim.x").terms:
        return True
    return bool(step.atoms() - unit.atoms())


def _row_uniform(
    indices: FunctionIndices, offset: IndexForm, loop: LoopVariable, group: Group
) -> bool:
    """Whether ``offset`` walks the loop along a row the whole group shares (and that differs
    between groups)."""
    deps = dict(offset.opaque)
    walking = {
        atom
        for atom in offset.atoms()
        if atom == loop.atom or loop.atom in deps.get(atom, frozenset())
    }
    if not walking:
        return False
    row = offset.without(walking)
    threads = indices.thread_atoms(row)
    allowed = {"warp", "threadIdx.y", "threadIdx.z"} if group == "warp" else set()
    if group == "warp" and not indices.lane_is_thread_x():
        allowed = {"warp"}
    if threads - allowed:
        return False
    owners = BLOCK_ATOMS | ({"warp", "threadIdx.y", "threadIdx.z"} if group == "warp" else set())
    return bool(row.base_atoms() & owners) or any(
        is_loop_atom(a) and indices.loop(a) is not None for a in row.base_atoms()
    )


def _combines(source: ParsedSource, function: Function, group: Group) -> bool:
    summary = analysis(source).call_graph.summary(function.name)
    if not summary.warp_collective:
        return False
    return group == "warp" or summary.block_barrier


def _describe(indices: FunctionIndices, loop: LoopVariable, group: Group) -> str:
    source = indices.source
    header_end = loop.loop.child_by_field_name("body")
    end = header_end.start_byte if header_end is not None else loop.loop.end_byte
    header = source.snippet((loop.loop.start_byte, end), 70).rstrip(" {")
    return (
        f"a {group}-per-row kernel in another spelling (the loop `{header}` strides by the "
        f"{group}: {loop.step} from {loop.init})"
    )


def row_layout_forms(source: ParsedSource, group: Group, skip: set[str]) -> list[FoundForm]:
    """The kernels (not named in ``skip``) that give each row a ``group`` of threads."""
    found = []
    for function in source.kernels:
        if function.body is None or function.name in skip:
            continue
        if not _combines(source, function, group):
            continue
        indices = analysis(source).indices(function)
        for loop in indices.loops:
            if not _rank_and_unit(indices, loop, group):
                continue
            accesses = [
                a
                for a in indices.accesses()
                if a.buffer.space == "global"
                and loop.loop.start_byte <= a.node.start_byte < loop.loop.end_byte
            ]
            if any(_row_uniform(indices, a.offset, loop, group) for a in accesses):
                found.append(
                    FoundForm(
                        function.node, function, _describe(indices, loop, group), _NEEDED[group]
                    )
                )
                break
    return found
