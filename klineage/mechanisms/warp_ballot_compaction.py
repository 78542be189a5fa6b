"""Warp-aggregated slot allocation: one atomic per warp, each lane's slot from a ballot.

Stream compaction hands every element that passes a test a unique output slot from a
counter. Done lane by lane, that is one ``atomicAdd(counter, 1)`` per taking lane, all on one
address. Aggregated per warp, the lanes vote with ``__ballot_sync``, one leader adds the
warp's ``__popc(mask)`` to the counter, ``__shfl_sync`` broadcasts the base, and each lane
takes ``base + __popc(mask & lanemask_lt)``: 32 times fewer atomics on the hot counter.

The canonical sequence (the top-k expert's ``claim_slot``)::

    const unsigned mask = __ballot_sync(0xffffffffu, take);
    if (mask == 0) return NONE;                        // optional, return form only
    const int lane = threadIdx.x & 31;                 // or declared earlier
    const int leader = __ffs(mask) - 1;
    T base = 0;
    if (lane == leader) base = atomicAdd(counter, (T)__popc(mask));
    base = __shfl_sync(0xffffffffu, base, leader);
    return take ? base + __popc(mask & ((1u << lane) - 1u)) : NONE;   // or `T slot = ...;`

- remove: the sequence -> ``return take ? atomicAdd(counter, (T)1) : NONE;`` (or the
  declaration ``T slot = take ? atomicAdd(counter, (T)1) : NONE;``). Each taking lane still
  gets a unique slot and the counter ends at the same value; only the order of the slots
  changes. Other ballot-plus-popcount atomics (a warp-aggregated *count* without slots, a
  partial mask) are detected and refused with the reason.
- apply: at ``return P ? atomicAdd(C, 1) : R;`` in a device function, or a declaration
  ``T s = P ? atomicAdd(C, 1) : R;``, write the sequence. Refused unless every lane of a
  warp reaches the statement (checked across the file's calls, see
  :class:`~klineage.mechanisms._selection_util.Uniformity`), the predicate and the counter
  are free of side effects (they are evaluated by more lanes), and blocks are 1-D.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from klineage.conditions import BlockSizeMultiple, Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_of
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.kernel import KernelSource
from klineage.mechanisms._selection_util import (
    block_statements,
    call_args,
    call_name,
    fresh_name,
    identifiers_in,
    is_full_mask,
    is_one,
    is_pure,
    iter_descendants,
    kernels_reaching,
    node_starting_at,
    normalized,
    strip_parens,
    uniformity,
    within,
)
from klineage.mechanisms.base import Carrier, Mechanism, MechanismError, Site, register
from klineage.problem import Problem

_LANE_FORMS = frozenset(
    {"threadIdx.x&31", "threadIdx.x%32", "threadIdx.x%warpSize", "threadIdx.x&(warpSize-1)"}
)
_NOT_1D = ("threadIdx.y", "threadIdx.z", "blockDim.y", "blockDim.z")


class _NoMatch(Exception):
    """The statements after a ballot are not the canonical sequence; the message says why."""


@dataclass(frozen=True)
class _Claim:
    """A recognized claim-slot sequence, from the ballot to the statement using the slot."""

    first: Node
    """The ballot declaration."""
    final: Node
    """The ``return`` or declaration that hands out the slot."""
    choice: Node
    """The ``take ? base + __popc(...) : none`` expression in ``final``."""
    counter: Node
    increment: Node
    """The atomic's second argument, ``(T)__popc(mask)``."""
    popc: Node
    """The ``__popc(mask)`` inside ``increment``."""


def _declared(source: ParsedSource, statement: Node) -> tuple[str, Node | None] | None:
    """``(name, value)`` of a one-variable declaration (value None without initializer)."""
    if statement.type != "declaration":
        return None
    declarators = statement.children_by_field_name("declarator")
    if len(declarators) != 1:
        return None
    (declarator,) = declarators
    if declarator.type == "identifier":
        return source.text_of(declarator), None
    if declarator.type != "init_declarator":
        return None
    name = declarator.child_by_field_name("declarator")
    value = declarator.child_by_field_name("value")
    if name is None or name.type != "identifier":
        return None
    return source.text_of(name), value


def _only(statement: Node | None) -> Node | None:
    """The single statement of ``{ s; }`` or ``s;``."""
    inner = block_statements(statement)
    return inner[0] if len(inner) == 1 else None


def _assignment(source: ParsedSource, statement: Node | None) -> tuple[str, Node] | None:
    """``(target, value)`` of ``name = value;``."""
    found = plain_assignment(statement)
    if found is None or found[0].type != "identifier":
        return None
    left, right = found
    return source.text_of(left), right


def _condition(source: ParsedSource, statement: Node) -> str:
    """An ``if``'s condition without spaces or the outer parentheses."""
    condition = statement.child_by_field_name("condition")
    return normalized(source.text_of(condition) if condition is not None else "")[1:-1]


def _popc_of(source: ParsedSource, node: Node, mask: str) -> Node | None:
    """The ``__popc(mask)`` call inside ``node``."""
    for call in [node, *iter_descendants(node, "call_expression")]:
        if call_name(source, call) == "__popc":
            args = call_args(call)
            if len(args) == 1 and normalized(source.text_of(args[0])) == mask:
                return call
    return None


class _Matcher:
    """Reads the statements after one ballot declaration as the canonical sequence."""

    def __init__(self, source: ParsedSource, first: Node) -> None:
        self.source = source
        self.first = first
        declared = _declared(source, first)
        if declared is None or declared[1] is None:
            raise _NoMatch("the ballot is not stored in a variable")
        self.mask, ballot = declared[0], strip_parens(declared[1])
        args = call_args(ballot)
        if call_name(source, ballot) != "__ballot_sync" or len(args) != 2:
            raise _NoMatch("the ballot is not stored in a variable")
        if not is_full_mask(source, args[0]):
            raise _NoMatch("the ballot does not use the full warp mask")
        self.predicate = normalized(source.text_of(args[1]))
        self.lane: str | None = None
        self.leader: str | None = None
        self.base: str | None = None
        self.none: str | None = None
        self.atomic: tuple[Node, Node, Node] | None = None
        self.broadcast = False

    def match(self) -> _Claim:
        block = self.first.parent
        statements = block_statements(block)
        index = statements.index(self.first)
        for statement in statements[index + 1 :]:
            final = self._step(statement)
            if final is not None:
                return final
        raise _NoMatch("the block ends before the slot is handed out")

    def _step(self, statement: Node) -> _Claim | None:
        """Consume one statement; the claim when it is the final one."""
        source = self.source
        line = source.line_of(statement.start_byte)
        declared = _declared(source, statement)
        value = normalized(source.text_of(declared[1])) if declared and declared[1] else None
        if self.broadcast:
            return self._final(statement)
        if statement.type == "if_statement" and _condition(source, statement) in (
            f"{self.mask}==0",
            f"{self.mask}==0u",
            f"!{self.mask}",
        ):
            self._early(statement)
        elif declared is not None and value in _LANE_FORMS:
            self.lane = declared[0]
        elif declared is not None and value == f"__ffs({self.mask})-1":
            self.leader = declared[0]
        elif declared is not None and value in (None, "0", "0u") and self.atomic is None:
            self.base = declared[0]
        elif statement.type == "if_statement" and self.leader and self.base:
            self._leader_atomic(statement)
        elif self.atomic is not None and self._is_broadcast(statement):
            self.broadcast = True
        else:
            raise _NoMatch(f"line {line} is not part of the claim-slot sequence")
        return None

    def _early(self, statement: Node) -> None:
        exit_ = _only(statement.child_by_field_name("consequence"))
        if exit_ is None or exit_.type != "return_statement" or not exit_.named_children:
            raise _NoMatch("the empty-ballot test does not return a value")
        self.none = normalized(self.source.text_of(exit_.named_children[0]))

    def _leader_atomic(self, statement: Node) -> None:
        source = self.source
        condition = _condition(source, statement)
        lane = self.lane or self._outer_lane(condition)
        if condition not in (f"{lane}=={self.leader}", f"{self.leader}=={lane}"):
            raise _NoMatch("the atomic is not taken by the ballot's leader lane")
        if statement.child_by_field_name("alternative") is not None:
            raise _NoMatch("the leader's atomic has an else branch")
        assigned = _assignment(source, _only(statement.child_by_field_name("consequence")))
        if assigned is None or assigned[0] != self.base:
            raise _NoMatch("the leader does not store the atomic's result in the base")
        atomic = strip_parens(assigned[1])
        args = call_args(atomic)
        if call_name(source, atomic) != "atomicAdd" or len(args) != 2:
            raise _NoMatch("the leader's update is not an atomicAdd")
        popc = _popc_of(source, args[1], self.mask)
        if popc is None:
            raise _NoMatch("the leader does not add the ballot's popcount")
        self.lane = lane
        self.atomic = (args[0], args[1], popc)

    def _outer_lane(self, condition: str) -> str:
        """The lane variable, declared before the ballot: the other side of ``x == leader``."""
        assert self.leader is not None
        other = condition.replace(f"=={self.leader}", "").replace(f"{self.leader}==", "")
        function = self.source.enclosing_function(self.first)
        if function is None or function.body is None:
            raise _NoMatch("the ballot is not inside a function")
        for declaration in self.source.iter_nodes("declaration", within=function.body):
            declared = _declared(self.source, declaration)
            value = declared[1] if declared and declared[0] == other else None
            if value is not None and normalized(self.source.text_of(value)) in _LANE_FORMS:
                return other
        raise _NoMatch(f"cannot tell that {other} is the lane index")

    def _is_broadcast(self, statement: Node) -> bool:
        assigned = _assignment(self.source, statement)
        if assigned is None or assigned[0] != self.base:
            return False
        call = strip_parens(assigned[1])
        args = call_args(call)
        return (
            call_name(self.source, call) == "__shfl_sync"
            and len(args) == 3
            and is_full_mask(self.source, args[0])
            and normalized(self.source.text_of(args[1])) == self.base
            and normalized(self.source.text_of(args[2])) == self.leader
        )

    def _final(self, statement: Node) -> _Claim:
        source = self.source
        if statement.type == "return_statement":
            value = statement.named_children[0] if statement.named_children else None
        else:
            declared = _declared(source, statement)
            value = declared[1] if declared else None
        choice = strip_parens(value) if value is not None else None
        if choice is None or choice.type != "conditional_expression":
            raise _NoMatch("the slot is not handed out as `take ? base + rank : none`")
        condition = choice.child_by_field_name("condition")
        consequence = choice.child_by_field_name("consequence")
        alternative = choice.child_by_field_name("alternative")
        assert condition is not None and consequence is not None and alternative is not None
        if normalized(source.text_of(condition)) != self.predicate:
            raise _NoMatch("the slot is handed out under another predicate than the ballot's")
        if self.none is not None and statement.type != "return_statement":
            raise _NoMatch(
                "the empty-ballot test returns early, and the code after the slot would then "
                "run where it did not"
            )
        if self.none is not None and normalized(source.text_of(alternative)) != self.none:
            raise _NoMatch("the empty-ballot return differs from the non-taking lanes' value")
        if not self._is_rank(consequence):
            raise _NoMatch("the slot is not base + popcount of the lanes below")
        assert self.atomic is not None
        counter, increment, popc = self.atomic
        if not is_pure(source, counter):
            raise _NoMatch("the counter expression has side effects")
        return _Claim(self.first, statement, choice, counter, increment, popc)

    def _is_rank(self, node: Node) -> bool:
        node = strip_parens(node)
        operator = node.child_by_field_name("operator")
        if node.type != "binary_expression" or operator is None or operator.type != "+":
            return False
        sides = [node.child_by_field_name("left"), node.child_by_field_name("right")]
        texts = [normalized(self.source.text_of(s)) if s is not None else "" for s in sides]
        if self.base not in texts:
            return False
        rank = sides[1 - texts.index(self.base)]
        if rank is None or call_name(self.source, rank) != "__popc":
            return False
        inner = normalized(self.source.text_of(rank))
        return f"({self.mask}&" in inner and self.lane is not None and self.lane in inner


def _claim(source: ParsedSource, first: Node) -> _Claim | str:
    """The claim starting at a ballot declaration, or why it is not canonical."""
    try:
        claim = _Matcher(source, first).match()
    except _NoMatch as why:
        return str(why)
    leftover = _used_after(source, claim, first)
    if leftover:
        return f"{leftover} is used after the slot is handed out"
    return claim


def _used_after(source: ParsedSource, claim: _Claim, first: Node) -> str | None:
    """A local of the sequence that code after it still reads (removal would drop it)."""
    declared = set()
    for statement in block_statements(first.parent):
        if first.start_byte <= statement.start_byte < claim.final.start_byte:
            found = _declared(source, statement)
            if found is not None:
                declared.add(found[0])
    function = source.enclosing_function(first)
    if function is None or function.body is None:
        return None
    rest = source.text_of((claim.final.end_byte, function.body.end_byte))
    return next(
        (name for name in sorted(declared) if re.search(rf"\b{re.escape(name)}\b", rest)), None
    )


def _slot_type(source: ParsedSource, statement: Node, function: Function) -> str | None:
    """The slot's type: the declaration's type, or the function's return type."""
    owner = statement if statement.type == "declaration" else function.node
    type_node = owner.child_by_field_name("type")
    if type_node is None:
        return None
    text = source.text_of(type_node)
    return None if text in ("auto", "void", "decltype(auto)") else text


def _candidate_choice(source: ParsedSource, statement: Node) -> Node | None:
    """The ``P ? atomicAdd(C, 1) : R`` of a return or one-variable declaration."""
    if statement.type == "return_statement":
        value = statement.named_children[0] if statement.named_children else None
    else:
        declared = _declared(source, statement)
        value = declared[1] if declared else None
    choice = strip_parens(value) if value is not None else None
    if choice is None or choice.type != "conditional_expression":
        return None
    consequence = choice.child_by_field_name("consequence")
    if consequence is None:
        return None
    atomic = strip_parens(consequence)
    args = call_args(atomic)
    if call_name(source, atomic) != "atomicAdd" or len(args) != 2:
        return None
    return choice if is_one(source, args[1]) is not None else None


@register
class WarpBallotCompaction(Mechanism):
    name = "warp_ballot_compaction"
    category = "synchronization"
    family = "warp-level ballots and prefix sums"
    intent = (
        "Hand out compaction slots with one atomic per warp: lanes vote with __ballot_sync, "
        "a leader reserves the warp's popcount, and each lane ranks itself by popcount."
    )

    # -- backward -----------------------------------------------------------------------------

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for call in source.calls_named("__ballot_sync"):
            function = source.enclosing_function(call.node)
            if function is None or function.body is None or not function.runs_on_device:
                continue
            statement = _statement_of(call.node)
            declared = _declared(source, statement) if statement is not None else None
            if statement is None:
                continue
            if declared is None or declared[1] is None or strip_parens(declared[1]) != call.node:
                atomic = _enclosing_atomic(source, call.node)
                if atomic is not None:
                    yield self.site(
                        source,
                        statement,
                        refusal="the ballot's popcount only counts (no per-lane slot is "
                        "handed out); this form is not rewritten",
                    )
                continue
            atomic = _aggregating_atomic(source, function.body, declared[0])
            if atomic is None:
                continue  # a vote, not a warp-aggregated atomic
            found = _claim(source, statement)
            if isinstance(found, _Claim):
                yield self.site(
                    source,
                    statement,
                    span=(statement.start_byte, found.final.end_byte),
                    kind="compound_statement",
                )
            else:
                end = max(statement.end_byte, (_statement_of(atomic) or atomic).end_byte)
                yield self.site(
                    source,
                    statement,
                    span=(statement.start_byte, end),
                    kind="compound_statement",
                    refusal=f"not the canonical claim-slot sequence: {found}",
                )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        first = _declaration_at(source, site)
        found = _claim(source, first)
        if not isinstance(found, _Claim):
            raise self.refuse(found, site)
        one = _one_for(source, found.increment, found.popc)
        atomic = f"atomicAdd({source.text_of(found.counter)}, {one})"
        consequence = found.choice.child_by_field_name("consequence")
        assert consequence is not None
        final = _replace_within(source, found.final, consequence, atomic)
        return [Edit(first.start_byte, found.final.end_byte, final)]

    # -- forward ------------------------------------------------------------------------------

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for statement in source.iter_nodes("return_statement", "declaration"):
            function = source.enclosing_function(statement)
            if function is None or function.body is None or not function.device_only:
                continue
            if statement.type == "return_statement" and function.is_kernel:
                continue
            if statement.parent is None or statement.parent.type != "compound_statement":
                continue
            choice = _candidate_choice(source, statement)
            if choice is None:
                continue
            yield self.site(
                source,
                statement,
                refusal=self._apply_refusal(source, statement, choice, function),
            )

    def _apply_refusal(
        self, source: ParsedSource, statement: Node, choice: Node, function: Function
    ) -> str | None:
        condition = choice.child_by_field_name("condition")
        atomic = strip_parens(choice.child_by_field_name("consequence") or choice)
        counter = call_args(atomic)[0]
        if condition is None or not is_pure(source, condition):
            return "the predicate has side effects, and the warp version evaluates it twice"
        if not is_pure(source, counter):
            return "the counter expression has side effects"
        if _slot_type(source, statement, function) is None:
            return "cannot tell the slot's type (auto or void)"
        text = source.kernel.text
        axis = next((form for form in _NOT_1D if form in text), None)
        if axis is not None:
            return (
                f"the file uses {axis}: with a multi-dimensional block the lane index "
                "threadIdx.x & 31 is not the lane"
            )
        reason = uniformity(source).reached(statement)
        if reason is not None:
            return f"not every lane of a warp is known to reach it ({reason})"
        return None

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        statement = self.node_at(source, site, "return_statement", "declaration")
        function = source.enclosing_function(statement)
        choice = _candidate_choice(source, statement)
        assert function is not None and choice is not None
        slot_type = _slot_type(source, statement, function)
        assert slot_type is not None
        condition = choice.child_by_field_name("condition")
        consequence = choice.child_by_field_name("consequence")
        alternative = choice.child_by_field_name("alternative")
        assert condition is not None and consequence is not None and alternative is not None
        atomic = strip_parens(consequence)
        counter, increment = call_args(atomic)
        one = is_one(source, increment)
        assert one is not None
        names = self._names(source, statement, function)
        take, none = source.text_of(condition), source.text_of(alternative)
        lines = [f"const unsigned {names['mask']} = __ballot_sync(0xffffffffu, {take});"]
        if statement.type == "return_statement":
            lines.append(f"if ({names['mask']} == 0) return {none};")
        add = _popc_for(source, increment, one, f"__popc({names['mask']})")
        lines += [
            f"const int {names['lane']} = threadIdx.x & 31;",
            f"const int {names['leader']} = __ffs({names['mask']}) - 1;",
            f"{slot_type} {names['base']} = 0;",
            f"if ({names['lane']} == {names['leader']}) "
            f"{names['base']} = atomicAdd({source.text_of(counter)}, {add});",
            f"{names['base']} = __shfl_sync(0xffffffffu, {names['base']}, {names['leader']});",
        ]
        rank = f"{names['base']} + __popc({names['mask']} & ((1u << {names['lane']}) - 1u))"
        lines.append(_replace_within(source, statement, consequence, rank))
        indent = source.indent_of(statement.start_byte)
        return [Edit.replace(statement, f"\n{indent}".join(lines))]

    @staticmethod
    def _names(source: ParsedSource, statement: Node, function: Function) -> dict[str, str]:
        """Fresh local names; prefixed with the slot variable's name in a declaration."""
        taken = identifiers_in(source, function.node)
        prefix = ""
        if statement.type == "declaration":
            declared = _declared(source, statement)
            prefix = f"{declared[0]}_" if declared else "slot_"
        names: dict[str, str] = {}
        for role in ("mask", "lane", "leader", "base"):
            names[role] = fresh_name(taken, prefix + role)
            taken.add(names[role])
        return names

    # -- conditions ---------------------------------------------------------------------------

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        kernels = kernels_reaching(source, site.function)
        block = block_size_of(source, kernels[0]) if len(kernels) == 1 else None
        return [
            BlockSizeMultiple(
                k=32, block_size=block, why="a full-mask ballot and shuffle need whole warps"
            ),
            Prose(
                text="every lane of a warp must reach the slot claim together "
                "(warp-uniform control flow)",
                why="__ballot_sync and __shfl_sync with the full mask wait for all 32 lanes",
            ),
            Prose(
                text="blocks must be one-dimensional",
                why="the lane index is computed as threadIdx.x & 31",
            ),
            Prose(
                text="the consumer must not depend on slot order",
                why="one atomic per warp reserves consecutive slots in lane order, where one "
                "atomic per lane hands them out in arrival order; each slot stays unique",
            ),
        ]


def _declaration_at(source: ParsedSource, site: Site) -> Node:
    """The ballot declaration a site starts with."""
    node = node_starting_at(source, site.start_byte, "declaration")
    if node is None:
        raise MechanismError(f"no ballot declaration at {site}")
    return node


def _statement_of(node: Node) -> Node | None:
    """The statement containing an expression."""
    current: Node | None = node
    while current is not None and not (
        current.type.endswith("_statement") or current.type == "declaration"
    ):
        current = current.parent
    return current


def _enclosing_atomic(source: ParsedSource, node: Node) -> Node | None:
    current = node.parent
    while current is not None and current.type != "compound_statement":
        if call_name(source, current) == "atomicAdd":
            return current
        current = current.parent
    return None


def _aggregating_atomic(source: ParsedSource, body: Node, mask: str) -> Node | None:
    """An ``atomicAdd`` whose arguments hold ``__popc(mask)`` (the warp's count)."""
    for call in source.calls_named("atomicAdd"):
        if within(call.node, body) and any(_popc_of(source, a, mask) for a in call.args):
            return call.node
    return None


# `atomicAdd(c, 1u)` <-> `atomicAdd(c, (unsigned)__popc(mask))`: the literal's type travels
# as a cast, so that removing an applied ballot gives the literal back as it was written.
_SUFFIX_TYPES = {
    "u": "unsigned",
    "l": "long",
    "ul": "unsigned long",
    "ll": "long long",
    "ull": "unsigned long long",
}
_TYPE_SUFFIXES = {**{v: k for k, v in _SUFFIX_TYPES.items()}, "unsigned int": "u"}


def _popc_for(source: ParsedSource, increment: Node, one: Node, popc: str) -> str:
    """The warp's increment for a lane's ``1``: ``1u`` -> ``(unsigned)__popc(mask)``."""
    if strip_parens(increment) == one:
        suffix = source.text_of(one).lstrip("0123456789").lower()
        cast = _SUFFIX_TYPES.get(suffix)
        return f"({cast}){popc}" if cast else popc
    return _replace_within(source, increment, one, popc)


def _one_for(source: ParsedSource, increment: Node, popc: Node) -> str:
    """A lane's ``1`` for the warp's increment: ``(unsigned)__popc(mask)`` -> ``1u``."""
    cast = strip_parens(increment)
    value = cast.child_by_field_name("value") if cast.type == "cast_expression" else None
    type_node = cast.child_by_field_name("type") if value is not None else None
    if value is not None and strip_parens(value) == popc and type_node is not None:
        suffix = _TYPE_SUFFIXES.get(" ".join(source.text_of(type_node).split()))
        if suffix is not None:
            return f"1{suffix}"
    return _replace_within(source, increment, popc, "1")


def _replace_within(source: ParsedSource, outer: Node, inner: Node, text: str) -> str:
    """The text of ``outer`` with the part ``inner`` replaced by ``text``."""
    start = inner.start_byte - outer.start_byte
    end = inner.end_byte - outer.start_byte
    data = source.data[outer.start_byte : outer.end_byte]
    return (data[:start] + text.encode() + data[end:]).decode()
