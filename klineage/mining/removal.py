"""Removing a mechanism everywhere in a kernel, and putting it back.

Mining takes one mechanism out of a kernel at a time: every removable site of it, one site per
edit, recording each site and its carrier (`#pragma unroll 4` -> unroll=4). The record is
enough to walk the same chain forward again: each application happens at the candidate the
matching removal created, with the carrier read from the removed site. That forward walk is
what a skill's round trip replays.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from klineage.cuda.edit import changed_region
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, Refusal, Site
from klineage.mechanisms.base import FILE_SCOPE

REMOVAL_LIMIT = 500
"""More removals than this of one mechanism means the mechanism is broken, not the kernel."""
APPLY_LIMIT = 64
"""Applications of one mechanism to one kernel at most (one per candidate site)."""


@dataclass
class Removal:
    """A mechanism taken out of a kernel, site by site."""

    mechanism: Mechanism
    states: list[KernelSource]
    """states[0] is the kernel given; states[-1] has no removable site left."""
    sites: list[Site] = field(default_factory=list)
    """The site removed at each step (in the state before that step)."""
    carriers: list[Carrier] = field(default_factory=list)
    """The instance choices read from each removed site."""
    refused: list[tuple[Site, str]] = field(default_factory=list)
    """Detected sites that could not be removed, with the reason."""
    alone: bool = False
    """One site taken out on its own, after removing the mechanism everywhere failed."""

    @property
    def original(self) -> KernelSource:
        """The kernel the mechanism was removed from."""
        return self.states[0]

    @property
    def simplified(self) -> KernelSource:
        """The kernel with every removable site taken out."""
        return self.states[-1]

    @property
    def changed(self) -> bool:
        """Whether any site was removed."""
        return len(self.states) > 1


DEAD_CODE = (
    "in a function none of the workloads runs (the entry never reaches it with their axis "
    "values, or an earlier removal left it unlaunched): a removal there changes no measurement"
)


def remove_mechanism(
    kernel: KernelSource, mechanism: Mechanism, live: set[str] | None = None
) -> Removal:
    """Remove every supported site of `mechanism`, recording sites, carriers and refusals.
    With `live` (the functions that run, klineage.cuda.reachability), sites in others are
    refused."""
    removal = Removal(mechanism=mechanism, states=[kernel])
    refused_ids: set[str] = set()
    for _ in range(REMOVAL_LIMIT):
        current = removal.states[-1]
        chosen = None
        # detection's refusals are read again in every state: a removal may lift one (a
        # pipeline's wait, refused while a copy remained, once the copies are synchronous)
        unsupported: list[tuple[Site, str]] = []
        for site in mechanism.detect(current):
            if site.id in refused_ids:
                continue
            if live is not None and site.function != FILE_SCOPE and site.function not in live:
                removal.refused.append((site, DEAD_CODE))
                refused_ids.add(site.id)
                continue
            if not site.supported:
                unsupported.append((site, site.refusal or "unsupported"))
                continue
            try:
                following = mechanism.remove(current, site)
            except MechanismRefused as err:
                removal.refused.append((site, err.reason))
                refused_ids.add(site.id)
                continue
            chosen = (site, following)
            break
        if chosen is None:
            removal.refused.extend(unsupported)
            return removal
        site, following = chosen
        removal.carriers.append(mechanism.carrier_of(current, site))
        removal.sites.append(site)
        removal.states.append(following)
    raise RuntimeError(f"{mechanism.name}: more than {REMOVAL_LIMIT} removals in one kernel")


def remove_each_site(kernel: KernelSource, removal: Removal) -> list[Removal]:
    """One single-site removal from `kernel` per site `removal` took out of it (sites matched
    by id, since the later ones were found in later states). When taking a mechanism out
    everywhere fails the gate, these find the sites that can go on their own: a K split that
    only a long-K path needs for accuracy, say, while another path can do without."""
    mechanism = removal.mechanism
    detected = {site.id: site for site in mechanism.detect(kernel)}
    singles = []
    for removed in removal.sites:
        site = detected.get(removed.id)
        if site is None:
            continue
        try:
            following = mechanism.remove(kernel, site)
        except MechanismRefused:
            continue
        singles.append(
            Removal(
                mechanism=mechanism,
                states=[kernel, following],
                sites=[site],
                carriers=[mechanism.carrier_of(kernel, site)],
                alone=True,
            )
        )
    return singles


def matching_candidate(
    mechanism: Mechanism,
    before: KernelSource,
    after: KernelSource,
    foreign: Collection[str] = (),
) -> Site | None:
    """The candidate of `after` where the removal that led from `before` happened: the smallest
    candidate containing the changed bytes, else the nearest one; None without candidates.
    A pure deletion belongs to the code after it: a deleted line (a pragma at column 0 before
    an indented loop, or before a comment over the loop) leaves its point in the whitespace or
    comments before that code, not inside it.

    The nearest one never comes from a `foreign` function: the walk's other functions (not
    the removed site's, nor a helper its removals wrote), whose candidates belong to another
    kernel, where applying re-applies nothing."""
    start, end = changed_region(before.text, after.text)
    if start == end:
        start = end = _code_after(after.text.encode(), end)
    candidates = [c for c in mechanism.candidates(after) if c.supported]
    containing = [c for c in candidates if c.start_byte <= start and end <= c.end_byte]
    if containing:
        return min(containing, key=lambda c: c.end_byte - c.start_byte)
    candidates = [c for c in candidates if c.function not in foreign]
    if not candidates:
        return None
    return min(candidates, key=lambda c: min(abs(c.start_byte - start), abs(c.end_byte - end)))


def _code_after(data: bytes, at: int) -> int:
    """The offset of the first code at or after `at`: whitespace and comments skipped."""
    while at < len(data):
        if data[at : at + 1].isspace():
            at += 1
        elif data.startswith(b"//", at):
            line_end = data.find(b"\n", at)
            at = len(data) if line_end < 0 else line_end + 1
        elif data.startswith(b"/*", at):
            comment_end = data.find(b"*/", at + 2)
            at = len(data) if comment_end < 0 else comment_end + 2
        else:
            break
    return at


def _changed_functions(before: KernelSource, after: KernelSource) -> set[str]:
    """The functions of ``after`` whose text a step changed (a caller a removal rewrote when
    it wrote a helper's body out in its loop is where that removal happened)."""
    old = {f.name: before.parsed.text_of(f.node) for f in before.parsed.functions}
    return {
        f.name
        for f in after.parsed.functions
        if f.name in old and old[f.name] != after.parsed.text_of(f.node)
    }


def restore(removal: Removal) -> KernelSource:
    """Undo the removal, driven by what the lineage edge removed: the state the walk started
    from, as it was. The round trip's undo for a form no forward rule writes; it says nothing
    about transfer to new code (that is :func:`reapply`'s question)."""
    return removal.original


def reapply(removal: Removal) -> KernelSource:
    """Walk the removal forward again from its simplified state: apply the mechanism at the
    candidate each removal created, with the carrier read from the removed site. Raises
    MechanismRefused when a step cannot be applied."""
    current = removal.simplified
    mechanism = removal.mechanism
    for i in reversed(range(len(removal.sites))):
        target = removal.states[i]
        site = removal.sites[i]
        if current.fingerprint != removal.states[i + 1].fingerprint and not any(
            c.supported and site.function in (c.function, FILE_SCOPE)
            for c in mechanism.candidates(current)
        ):
            # an earlier application rewrote code these sites shared (the one helper that
            # several cg::reduce calls were removed into, the kernel whose vectors one
            # staging took): nothing is left to apply there (candidates in other functions
            # are not this site's), and the gate judges what the forward rule made
            break
        foreign = {f.name for f in removal.original.parsed.functions} - {site.function}
        foreign -= _changed_functions(target, removal.states[i + 1])
        candidate = matching_candidate(mechanism, target, removal.states[i + 1], foreign)
        if candidate is None:
            raise MechanismRefused(
                Refusal(
                    mechanism=mechanism.name,
                    action="apply",
                    site=str(removal.sites[i]),
                    reason="no candidate site where the removal happened",
                )
            )
        candidate = candidate_in(mechanism, candidate, removal.states[i + 1], current)
        current = mechanism.apply(current, candidate, removal.carriers[i])
    return current


def candidate_in(
    mechanism: Mechanism, candidate: Site, found_in: KernelSource, current: KernelSource
) -> Site:
    """`candidate`, found in `found_in`, as a candidate of `current`.

    After exact re-applications the two texts are equal and the site is valid as it is. A
    forward rule may spell what it puts back differently from what the removal took out (a
    split vector access merges into the file's first macro of its type, where the expert
    used another of the same body): then the candidate is the one of `current` of the same
    function and kind on the same lines, mapped through the lines the texts share. Raises
    MechanismRefused when no single candidate is there."""
    if current.text == found_in.text:
        return candidate
    lines = _line_map(found_in.text, current.text)
    first, last = lines.get(candidate.start_line), lines.get(candidate.end_line)
    same = [
        c
        for c in mechanism.candidates(current)
        if c.supported
        and (c.function, c.node_kind, c.start_line, c.end_line)
        == (candidate.function, candidate.node_kind, first, last)
    ]
    if len(same) != 1:
        raise MechanismRefused(
            Refusal(
                mechanism=mechanism.name,
                action="apply",
                site=str(candidate),
                reason="an earlier application rewrote the lines of this candidate",
            )
        )
    return same[0]


def _line_map(old: str, new: str) -> dict[int, int]:
    """1-based line numbers of `old` to those of `new`, for lines in blocks the texts share
    or in replaced blocks of equal length (a line respelled in place)."""
    matcher = SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    mapped = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            mapped.update({i + 1: j1 + (i - i1) + 1 for i in range(i1, i2)})
    return mapped


def apply_everywhere(kernel: KernelSource, mechanism: Mechanism, carrier: Carrier) -> KernelSource:
    """Apply the mechanism at every supported candidate, one at a time; refuse if none took.

    The forward twin of :func:`remove_mechanism`: the round trip of an LLM-proposed removal
    re-applies a catalog rule this way, and replay applies a skill's mechanism this way."""
    current = kernel
    refused: set[str] = set()
    reasons = []
    sites = _open_sites(mechanism, current, refused)
    for _ in range(APPLY_LIMIT):
        if not sites:
            break
        try:
            current = mechanism.apply(current, sites[0], carrier)
        except MechanismRefused as err:
            refused.add(sites[0].id)
            reasons.append(err.reason)
            sites = sites[1:]
            continue
        left = _open_sites(mechanism, current, refused)
        if len(left) >= len(sites):
            # the rewrite holds a site again (a dispatch whose fallback keeps the loop it
            # specialized): applying on would nest the same rewrite in itself
            break
        sites = left
    if current is kernel:
        reason = reasons[0] if reasons else "no candidate site in this kernel"
        raise MechanismRefused(Refusal(mechanism=mechanism.name, action="apply", reason=reason))
    return current


def _open_sites(mechanism: Mechanism, kernel: KernelSource, refused: set[str]) -> list[Site]:
    """The supported candidate sites of `mechanism` on `kernel` not yet refused."""
    return [s for s in mechanism.candidates(kernel) if s.supported and s.id not in refused]
