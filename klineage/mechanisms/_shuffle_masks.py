"""The lane mask of a shuffle in a helper that takes the mask from its callers.

A warp-sum helper may take its mask as a parameter::

    template <class T> __device__ T lane_total(unsigned int lanes, T v) {
      for (int o = warpSize / 2; o > 0; o /= 2) v += __shfl_down_sync(lanes, v, o);
      return v;
    }

The exchange through shared memory that replaces a shuffle step (every lane publishes its
value, ``__syncwarp()``, every lane reads its partner's slot) is exact only when the whole warp
takes part, as with a full mask: a full-warp constant (a literal or a file constant folding to
``0xffffffff``), a local declared with one and never written again (``unsigned int mask =
0xffffffff;``), or a mask parameter that every call of the helper in the file passes such a
constant. What a caller computes instead is refused, naming the caller and what it passes: a
``__ballot_sync(m, p)`` holds only the lanes where ``p`` is true, so lanes outside it publish
nothing and their partners would read stale slots; a shift such as ``0xffffffff >> s`` is full
only for some ``s``.
"""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    FULL_WARP_MASK,
    assigned_names,
    call_arguments,
    strip_parens,
    walk,
)

__all__ = ["mask_refusal"]


def _full(source: ParsedSource, node: Node) -> bool:
    value = fold_int(source, node)
    return value is not None and value & FULL_WARP_MASK == FULL_WARP_MASK


def _initializer(source: ParsedSource, caller: Function, name: str) -> Node | None:
    """The initializer of the local ``name`` of ``caller``, when it is declared with one."""
    if caller.body is None:
        return None
    for declarator in walk(caller.body):
        if declarator.type != "init_declarator":
            continue
        target = declarator.child_by_field_name("declarator")
        if target is not None and source.text_of(target) == name:
            return declarator.child_by_field_name("value")
    return None


def _full_local(source: ParsedSource, function: Function, name: str) -> bool:
    """``unsigned mask = 0xffffffff;``: a local of ``function`` declared with a full-warp
    constant and never written again."""
    if function.body is None or function.param(name) is not None:
        return False
    value = _initializer(source, function, name)
    written = assigned_names(source, function.body)
    return value is not None and _full(source, value) and name not in written


def _passed(source: ParsedSource, caller: Function, argument: Node) -> str:
    """What a caller passes, with the local's initializer and what a ballot leaves out."""
    text = " ".join(source.text_of(argument).split())
    stripped = strip_parens(argument)
    value = _initializer(source, caller, text) if stripped.type == "identifier" else None
    shown = f"{text} (`{' '.join(source.text_of(value).split())}`)" if value else f"`{text}`"
    ballot = next(
        (
            n
            for n in walk(value if value is not None else argument)
            if n.type == "call_expression"
            and source.text_of(n.child_by_field_name("function") or n) == "__ballot_sync"
        ),
        None,
    )
    if ballot is not None:
        args = call_arguments(ballot)
        if len(args) == 2:
            predicate = " ".join(source.text_of(args[1]).split())
            shown += f", a ballot holding only the lanes where `{predicate}`"
    return f"{caller.name} passes {shown}"


def mask_refusal(source: ParsedSource, function: Function, mask: Node) -> str | None:
    """Why the shuffle mask ``mask`` of ``function`` is not known to be full, or None when it
    is a parameter every call of ``function`` passes a full-warp constant."""
    plain = f"the mask {source.text_of(mask)} is not a full-warp constant"
    if _full(source, mask):
        return None
    node = strip_parens(mask)
    name = source.text_of(node)
    if node.type == "identifier" and _full_local(source, function, name):
        return None
    if node.type != "identifier" or function.param(name) is None:
        return plain
    index = [p.name for p in function.params].index(name)
    sites = analysis(source).call_graph.call_sites(function.name)
    if not sites:
        return plain
    partial = []
    for caller_name, call in sites:
        caller = source.enclosing_function(call)
        args = call_arguments(call)
        if caller is None or index >= len(args):
            partial.append(f"{caller_name} calls it with {len(args)} arguments")
        elif not _full(source, args[index]):
            partial.append(_passed(source, caller, args[index]))
    if not partial:
        return None
    return (
        f"the mask {name} is a parameter of {function.name} that its callers do not all pass "
        f"as a full-warp constant ({'; '.join(partial)}), and the exchange through shared "
        "memory needs every lane of the warp"
    )
