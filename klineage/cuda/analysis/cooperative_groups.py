"""The cooperative-groups API, as the code means it.

``cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block)`` names a warp;
``cg::reduce(warp, v, cg::plus<float>{})`` is a warp-shuffle reduction;
``warp.thread_rank()`` is the lane, ``warp.meta_group_rank()`` the warp's index in the block,
``block.sync()`` and ``cg::sync(cta)`` are ``__syncthreads()``. This module finds the groups
each function declares and classifies every call on them, whatever the namespace alias
(``cg``, ``cooperative_groups``, a ``using namespace``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Node, ParsedSource, call_name
from klineage.cuda.tree import WARP_SIZE, call_arguments

__all__ = [
    "CgBarrier",
    "CgReduce",
    "CgShuffle",
    "CooperativeGroups",
    "Group",
    "RankQuery",
    "cooperative_groups",
]

GroupKind = Literal["block", "tile", "coalesced", "grid", "cluster"]
RankKind = Literal[
    "thread_in_block", "lane", "warp_in_block", "warps_per_block", "group_size", "block_index"
]
ReduceOp = Literal["sum", "max", "min", "custom"]

_NAMESPACE = "cooperative_groups"
_GROUP_MAKERS: dict[str, GroupKind] = {
    "this_thread_block": "block",
    "tiled_partition": "tile",
    "coalesced_threads": "coalesced",
    "this_grid": "grid",
    "this_cluster": "cluster",
}
_OPS: dict[str, ReduceOp] = {"plus": "sum", "greater": "max", "less": "min"}
_SHUFFLES = ("shfl", "shfl_down", "shfl_up", "shfl_xor")
_TEMPLATED_DECLARATION = re.compile(
    r"^\s*[\w:]+\s*<[^;=]*>\s*(\w+)\s*=\s*(?:[\w]+::)*(\w+)\s*(<[^;]*?>)?\s*\(([^;]*)\)\s*;\s*$",
    re.S,
)
_TILE_SIZE = re.compile(r"<\s*(\w+)\s*>|,\s*(\w+)\s*\)?\s*$")
_GROUP_TYPES: dict[str, GroupKind] = {
    "thread_block_tile": "tile",
    "thread_block": "block",
    "coalesced_group": "coalesced",
    "grid_group": "grid",
    "cluster_group": "cluster",
}
_GROUP_TYPE = re.compile(r"^(?:const\s+)?(?:[\w]+::)*(\w+)\s*(?:<\s*(\w+)\s*(?:,[^>]*)?>)?\s*&?$")


def _folded(source: ParsedSource, text: str) -> int | None:
    from klineage.cuda.tree import integer_literal

    value = integer_literal(text)
    return value if value is not None else source.integer_constants.get(text)


@dataclass(frozen=True)
class Group:
    """A group variable: ``block`` (the thread block) or a tile of ``size`` threads."""

    name: str
    kind: GroupKind
    size: int | None
    """Threads in the group: the tile size; None for a block (its size is blockDim)."""
    declaration: Node

    @property
    def is_warp(self) -> bool:
        """Whether the group is a tile of one warp's 32 threads."""
        return self.kind == "tile" and self.size == WARP_SIZE


@dataclass(frozen=True)
class CgReduce:
    """``cg::reduce(group, value, op)``: a reduction across the group's threads."""

    node: Node
    function: Function
    group: Group | None
    value: Node
    op: ReduceOp
    op_node: Node
    op_name: str
    """``cg::plus<float>`` as written, or the custom operator's name."""


@dataclass(frozen=True)
class CgShuffle:
    """``group.shfl_down(value, delta)`` and its siblings."""

    node: Node
    function: Function
    group: Group | None
    kind: str
    """``shfl``, ``shfl_down``, ``shfl_up`` or ``shfl_xor``."""
    args: tuple[Node, ...]


@dataclass(frozen=True)
class CgBarrier:
    """``group.sync()`` or ``cg::sync(group)``: ``__syncthreads()`` for a block, a warp
    barrier for a tile."""

    node: Node
    function: Function
    group: Group | None
    scope: Literal["block", "warp", "grid", "other"]


@dataclass(frozen=True)
class RankQuery:
    """``warp.thread_rank()`` and friends: an index the group API computes."""

    node: Node
    group: Group | None
    kind: RankKind
    component: str = "x"


class CooperativeGroups:
    """Every cooperative-groups group and call of a source (computed once, on demand)."""

    def __init__(self, source: ParsedSource) -> None:
        self.source = source
        self.groups: dict[tuple[str, str], Group] = {}
        self.reduces: list[CgReduce] = []
        self.shuffles: list[CgShuffle] = []
        self.barriers: list[CgBarrier] = []
        self.ranks: dict[int, RankQuery] = {}
        self.uses_api = b"cooperative_groups" in source.data
        if self.uses_api:
            self._scan()

    # -- queries ----------------------------------------------------------------------------

    def group(self, function: Function, name: str) -> Group | None:
        """The group a variable of ``function`` holds, if it holds one."""
        return self.groups.get((function.name, name))

    def rank_of(self, call: Node) -> RankQuery | None:
        """What an index-returning call on a group means (``warp.thread_rank()`` -> lane)."""
        return self.ranks.get(call.start_byte)

    def barrier_at(self, call: Node) -> CgBarrier | None:
        """The barrier a call node is (``cg::sync(block)``, ``block.sync()``), if it is one."""
        return next((b for b in self.barriers if b.node == call), None)

    def in_function(self, function: Function) -> tuple[list[CgReduce], list[CgBarrier]]:
        """The reductions and the barriers written in ``function``."""

        def inside(node: Node) -> bool:
            return function.node.start_byte <= node.start_byte < function.node.end_byte

        return [r for r in self.reduces if inside(r.node)], [
            b for b in self.barriers if inside(b.node)
        ]

    # -- scanning ---------------------------------------------------------------------------

    def _is_api(self, name: str, member: str) -> bool:
        """Whether ``name`` is ``member`` of the namespace (``cg::``, ``cooperative_groups::``,
        or bare under a ``using namespace``)."""
        parts = name.replace(" ", "").split("::")
        return parts[-1] == member

    def _scan(self) -> None:
        source = self.source
        for function in source.functions:
            if function.body is None or not function.runs_on_device:
                continue
            self._declare_groups(function)
        for call in source.calls:
            caller = source.enclosing_function(call.node)
            if caller is not None and caller.runs_on_device:
                self._classify(caller, call.node, call.name)

    def _declare_groups(self, function: Function) -> None:
        source = self.source
        assert function.body is not None
        # a helper handed a group: `prepare(cg::thread_block_tile<32>& warp, ...)`
        for param in function.params:
            match = _GROUP_TYPE.match(param.type)
            if param.name is None or match is None or match.group(1) not in _GROUP_TYPES:
                continue
            kind = _GROUP_TYPES[match.group(1)]
            threads = _folded(source, match.group(2)) if match.group(2) else None
            if kind == "tile" and threads is None:
                continue  # a tile of a size the helper does not fix
            self.groups[(function.name, param.name)] = Group(param.name, kind, threads, param.node)
        for declaration in source.iter_nodes("declaration", within=function.body):
            for declarator in declaration.children_by_field_name("declarator"):
                if declarator.type != "init_declarator":
                    continue
                name_node = declarator.child_by_field_name("declarator")
                value = declarator.child_by_field_name("value")
                if name_node is None or value is None or value.type != "call_expression":
                    continue
                group = self._group_made_by(value, source.text_of(name_node), declaration, function)
                if group is not None:
                    self.groups[(function.name, group.name)] = group
        # `cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);` reads as an
        # expression (a comparison) to the grammar: recognize it by its text
        for statement in source.iter_nodes("expression_statement", within=function.body):
            match = _TEMPLATED_DECLARATION.match(source.text_of(statement))
            if match is None or match.group(2) not in _GROUP_MAKERS:
                continue
            size = _TILE_SIZE.search(match.group(3) or match.group(4))
            tile = None if size is None else _folded(source, size.group(1) or size.group(2))
            kind = _GROUP_MAKERS[match.group(2)]
            self.groups[(function.name, match.group(1))] = Group(
                match.group(1), kind, tile, statement
            )

    def _group_made_by(
        self, call: Node, name: str, declaration: Node, function: Function
    ) -> Group | None:
        source = self.source
        callee = call_name(source, call) or ""
        short = callee.replace(" ", "").split("::")[-1]
        kind = _GROUP_MAKERS.get(short)
        if kind is None:
            return None
        size: int | None = None
        if kind == "tile":
            size = self._tile_size(call)
        return Group(name=name, kind=kind, size=size, declaration=declaration)

    def _tile_size(self, call: Node) -> int | None:
        source = self.source
        function = call.child_by_field_name("function")
        if function is not None and function.type == "template_function":
            arguments = function.child_by_field_name("arguments")
            for argument in arguments.named_children if arguments is not None else []:
                value = fold_int(source, argument)
                if value is not None:
                    return value
        args = call_arguments(call)
        if len(args) >= 2:
            return fold_int(source, args[1])
        return None

    def _receiver(self, call: Node, function: Function) -> tuple[Group | None, str] | None:
        """``(group, method)`` of ``warp.thread_rank()``; None when the call is no method."""
        callee = call.child_by_field_name("function")
        if callee is None or callee.type != "field_expression":
            return None
        base = callee.child_by_field_name("argument")
        member = callee.child_by_field_name("field")
        if base is None or member is None:
            return None
        method = self.source.text_of(member)
        if base.type == "identifier":
            group = self.group(function, self.source.text_of(base))
            return (group, method) if group is not None else None
        if base.type == "call_expression":  # `cg::this_thread_block().sync()`
            made = self._group_made_by(base, "", base, function)
            return (made, method) if made is not None else None
        return None

    def _classify(self, function: Function, node: Node, name: str) -> None:
        received = self._receiver(node, function)
        if received is not None:
            self._method(function, node, *received)
            return
        args = call_arguments(node)
        if self._is_api(name, "reduce") and len(args) == 3:
            group = self._group_arg(function, args[0])
            op, op_name = self._operator(args[2])
            self.reduces.append(CgReduce(node, function, group, args[1], op, args[2], op_name))
        elif self._is_api(name, "sync") and len(args) == 1 and "::" in name:
            group = self._group_arg(function, args[0])
            self.barriers.append(CgBarrier(node, function, group, _scope(group)))

    def _group_arg(self, function: Function, node: Node) -> Group | None:
        if node.type == "identifier":
            return self.group(function, self.source.text_of(node))
        return None

    def _operator(self, node: Node) -> tuple[ReduceOp, str]:
        """``cg::plus<float>{}`` -> sum; any other callable -> custom (with its name)."""
        source = self.source
        text = "".join(source.text_of(node).split())
        head = text.split("<")[0].split("{")[0].split("(")[0]
        short = head.split("::")[-1]
        if short in _OPS and ("::" in head or short == head):
            return _OPS[short], head
        return "custom", head

    def _method(self, function: Function, node: Node, group: Group | None, method: str) -> None:
        args = tuple(call_arguments(node))
        if method == "sync":
            self.barriers.append(CgBarrier(node, function, group, _scope(group)))
        elif method in _SHUFFLES:
            self.shuffles.append(CgShuffle(node, function, group, method, args))
        elif method == "thread_rank":
            kind: RankKind = "lane" if group is not None and group.is_warp else "thread_in_block"
            if group is not None and group.kind == "block":
                kind = "thread_in_block"
            self.ranks[node.start_byte] = RankQuery(node, group, kind)
        elif method == "meta_group_rank" and group is not None and group.is_warp:
            self.ranks[node.start_byte] = RankQuery(node, group, "warp_in_block")
        elif method == "meta_group_size" and group is not None and group.is_warp:
            self.ranks[node.start_byte] = RankQuery(node, group, "warps_per_block")
        elif method in ("size", "num_threads"):
            self.ranks[node.start_byte] = RankQuery(node, group, "group_size")
        elif method in ("group_index", "thread_index"):
            kind = "block_index" if method == "group_index" else "thread_in_block"
            self.ranks[node.start_byte] = RankQuery(node, group, kind)


def _scope(group: Group | None) -> Literal["block", "warp", "grid", "other"]:
    if group is None:
        return "other"
    if group.kind == "block":
        return "block"
    if group.kind == "grid":
        return "grid"
    if group.is_warp or (group.kind == "tile" and group.size is not None and group.size <= 32):
        return "warp"
    return "other"


def cooperative_groups(source: ParsedSource) -> CooperativeGroups:
    """The cooperative-groups model of ``source`` (cached with the source's analysis)."""
    from klineage.cuda.analysis import analysis

    return analysis(source).cooperative_groups
