"""How the skills method sequences retrieved skills on a target and instantiates their carriers.

Two lessons of the first replay experiment (bench/results/replay.json, `misses`):

- **Keep options open.** Applying one skill can rewrite away the code another skill's rule
  looks for: vectorizing a one-thread-per-row loop left `block_per_row` no candidate site on
  layernorm and l2_normalize, and the skills method lost a 12-33x step that blind search (which
  happened to try `block_per_row` first) kept. :func:`keep_options_open` checks this on the
  target itself, by applying each retrieved mechanism once and asking which other mechanisms
  still have sites; what a skill would close is tried just before it, and nothing else moves
  (until 2026-12-06 the closing skill went after every skill that closes nothing, so on gemv
  the vectors waited behind four weaker skills). It costs CPU time, no gate run.
- **Vectors are bytes.** A `vector_width` learned on float32 (4 elements, 16 bytes) is 8 bytes
  on bfloat16. :func:`transfer_carrier` keeps the bytes: the width is scaled by the ratio of
  the widest element of the skill's dtypes to the widest of the target's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import networkx as nx

from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, UnknownMechanism, get
from klineage.problem import Problem, dtype_itemsize

VECTOR_WIDTHS = (1, 2, 4, 8, 16)

T = TypeVar("T")


def _has_sites(mechanism: Mechanism, kernel: KernelSource) -> bool:
    return any(site.supported for site in mechanism.candidates(kernel))


def closes(
    mechanisms: Sequence[str],
    kernel: KernelSource,
    apply: Callable[[KernelSource, Mechanism, Carrier], KernelSource],
) -> dict[str, set[str]]:
    """For each mechanism, the others whose every candidate site its rewrite (default carrier)
    removes from `kernel`. A mechanism the catalog lacks, or whose rule refuses, closes none."""
    rules: dict[str, Mechanism] = {}
    for name in dict.fromkeys(mechanisms):
        try:
            rules[name] = get(name)
        except UnknownMechanism:
            continue
    open_now = {name for name, rule in rules.items() if _has_sites(rule, kernel)}
    closed: dict[str, set[str]] = {}
    for name, rule in rules.items():
        try:
            after = apply(kernel, rule, Carrier())
        except MechanismRefused:
            continue
        closed[name] = {
            other for other in open_now if other != name and not _has_sites(rules[other], after)
        }
    return closed


def _would_close(
    mechanism: str,
    closed: dict[str, set[str]],
    waiting: set[str],
    cycle_of: dict[str, frozenset[str]],
) -> set[str]:
    """The waiting mechanisms outside its cycle that `mechanism`'s rewrite would close."""
    outside = cycle_of.get(mechanism, frozenset({mechanism}))
    return (closed.get(mechanism, set()) & waiting) - outside


def _pulled_forward(
    remaining: Sequence[T],
    mechanism_of: Callable[[T], str],
    closed: dict[str, set[str]],
    waiting: set[str],
    cycle_of: dict[str, frozenset[str]],
) -> T:
    """The best-ranked item, or where its mechanism would close waiting ones, the best-ranked
    item of those (and so on down)."""
    pick, seen = remaining[0], set()
    # down the closing edges between cycles: they form no loop, so this ends
    while (blocked := _would_close(mechanism_of(pick), closed, waiting, cycle_of)) and mechanism_of(
        pick
    ) not in seen:
        seen.add(mechanism_of(pick))
        pick = next(item for item in remaining if mechanism_of(item) in blocked)
    return pick


def keep_options_open(
    ranked: Sequence[T],
    mechanism_of: Callable[[T], str],
    closed: dict[str, set[str]],
    *,
    pull: bool = True,
) -> list[T]:
    """`ranked` reordered so that no mechanism goes before one still waiting (none of whose
    items has been placed yet) that its rewrite would close, outside its own cycle. The next
    item is the best-ranked one, unless its mechanism would close a waiting one: then the
    best-ranked item of the mechanisms it would close goes first (and so on down, should
    that one close others too). What it closes is pulled forward; nothing unrelated is: a
    skill ranked lower that closes nothing waits its turn, as it would without the closing
    one. Within a cycle (a closes b, b closes a) one of them is lost whichever goes first,
    so the cycle keeps rank order. With `pull` False, as replays before 2026-12-06 ran: the
    next item is the best-ranked one whose mechanism would close none waiting, so a closing
    skill waits behind every lower-ranked skill that closes nothing."""
    remaining = list(ranked)
    ordered: list[T] = []
    while remaining:
        placed = {mechanism_of(item) for item in ordered}
        waiting = {mechanism_of(item) for item in remaining} - placed
        graph = nx.DiGraph()
        graph.add_nodes_from(waiting)
        graph.add_edges_from(
            (a, b) for a in waiting for b in closed.get(a, set()) & waiting if a != b
        )
        cycle_of = {m: frozenset(c) for c in nx.strongly_connected_components(graph) for m in c}
        if pull:
            pick = _pulled_forward(remaining, mechanism_of, closed, waiting, cycle_of)
        else:  # the best-ranked item whose mechanism would close none waiting
            pick = next(
                (
                    item
                    for item in remaining
                    if not _would_close(mechanism_of(item), closed, waiting, cycle_of)
                ),
                remaining[0],
            )
        ordered.append(pick)
        remaining.remove(pick)
    return ordered


def widest_itemsize(dtypes: Sequence[str]) -> int | None:
    """The largest element size among `dtypes` in bytes, or None when none is known."""
    sizes = []
    for dtype in dtypes:
        try:
            sizes.append(dtype_itemsize(dtype))
        except ValueError:
            continue
    return max(sizes) if sizes else None


def transfer_carrier(carrier: Carrier, source_dtypes: Sequence[str], problem: Problem) -> Carrier:
    """The carrier for `problem`: a vector width keeps its bytes across element sizes (when the
    result is a valid width); everything else is kept as learned."""
    if carrier.vector_width is None:
        return carrier
    definition = problem.definition
    target = widest_itemsize(
        [s.dtype for s in [*definition.inputs.values(), *definition.outputs.values()]]
    )
    source = widest_itemsize(source_dtypes)
    if target is None or source is None or source == target:
        return carrier
    width_bytes = carrier.vector_width * source
    if width_bytes % target or width_bytes // target not in VECTOR_WIDTHS:
        return carrier
    return carrier.model_copy(update={"vector_width": width_bytes // target})


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def without_foreign_names(carrier: Carrier, target_text: str) -> Carrier:
    """`carrier` without its expression choices (a bound written `kThreads`, a block count
    `kD == 128 ? 2 : 4`) that name something the target's source never mentions: written
    there they would not compile, and the rule's own inference does better."""
    known = set(_IDENTIFIER.findall(target_text))
    foreign = {
        key
        for key, value in (carrier.model_extra or {}).items()
        if isinstance(value, str) and not set(_IDENTIFIER.findall(value)) <= known
    }
    if not foreign:
        return carrier
    return Carrier.model_validate({k: v for k, v in carrier.as_dict().items() if k not in foreign})
