"""The standard checks every mechanism must pass, given its before/after fixtures.

Fixtures live in ``tests/fixtures/mechanisms/<mechanism>/``: ``before.cu`` (the kernel with
the mechanism) and ``after.cu`` (the same kernel with every site removed), plus any number of
further pairs ``<case>.before.cu`` / ``<case>.after.cu``. Each is a full kernel in the ABI
(``extern "C" int run(...)``), so it compiles on its own.

For each pair the checks are:

- **backward**: removing the detected sites one at a time (always the first supported one)
  gives ``after.cu`` exactly; ``detect`` on ``after.cu`` finds no supported site, and
  ``remove_all`` leaves it unchanged (removing an absent mechanism changes nothing);
- **forward**: walking the same chain back, applying at the candidate that each removal
  created, with the carrier ``carrier_of`` read from the removed site, restores every state
  exactly (or up to indentation, for a mechanism that sets ``exact = False``), and ``detect``
  finds the mechanism again;
- **refusals**: a site of another mechanism, an unknown site, and ``apply`` at a detected
  (not candidate) site are refused, each with a reason;
- **compiles**: every state of the chain compiles with nvcc for sm_90.

To cover a new mechanism, add its fixtures and a test module::

    from tests.mechanisms.roundtrip import RoundTripSuite

    class TestMyMechanism(RoundTripSuite):
        mechanism = "my_mechanism"

and put mechanism-specific tests (refusals with their reasons, odd forms) next to it. The
helpers below (:func:`removal_chain`, :func:`forward_chain`, :func:`compile_ok`) work on any
kernel, for those tests too.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from klineage.cuda.edit import changed_region
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, Mechanism, MechanismRefused, Site, get, remove_all

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mechanisms"
PUBLIC_FORMS = FIXTURES.parent / "public_forms"
"""Before/after pairs in public kernels' idioms whose removal has no forward rule (yet)."""


@dataclass(frozen=True)
class Pair:
    """One before/after fixture pair of a mechanism."""

    mechanism: str
    case: str
    before: KernelSource
    after: KernelSource


def fixture_pairs(mechanism: str, root: Path = FIXTURES) -> list[Pair]:
    """The fixture pairs of a mechanism: ``before.cu``/``after.cu`` and ``<case>.*.cu``."""
    folder = root / mechanism
    pairs = []
    for before in sorted(folder.glob("*before.cu")):
        case = before.name[: -len("before.cu")].rstrip(".") or "main"
        after = before.with_name(before.name.replace("before.cu", "after.cu"))
        if not after.is_file():
            raise FileNotFoundError(f"{after}: the fixture pair of {before.name} is missing")
        pairs.append(
            Pair(mechanism, case, KernelSource.from_file(before), KernelSource.from_file(after))
        )
    if not pairs:
        raise FileNotFoundError(f"{folder}: no before.cu/after.cu fixtures for {mechanism}")
    return pairs


@dataclass
class Chain:
    """The states from a kernel to the kernel without the mechanism, one removal a step."""

    states: list[KernelSource]
    """states[0] is the input; states[-1] has no supported site left."""
    sites: list[Site] = field(default_factory=list)
    """sites[i] is the site removed from states[i]."""
    carriers: list[Carrier] = field(default_factory=list)
    """carriers[i] is carrier_of(states[i], sites[i])."""


def removal_chain(mechanism: Mechanism, kernel: KernelSource, limit: int = 200) -> Chain:
    """Remove the first supported site until none is left, recording every step."""
    chain = Chain(states=[kernel])
    for _ in range(limit):
        current = chain.states[-1]
        supported = [s for s in mechanism.detect(current) if s.supported]
        if not supported:
            return chain
        site = supported[0]
        chain.sites.append(site)
        chain.carriers.append(mechanism.carrier_of(current, site))
        following = mechanism.remove(current, site)
        assert following.text != current.text, f"removing {site} changed nothing"
        chain.states.append(following)
    raise AssertionError(f"{mechanism.name}: more than {limit} removals")


def matching_candidate(mechanism: Mechanism, before: KernelSource, after: KernelSource) -> Site:
    """The candidate of ``after`` where the removal that led from ``before`` happened: the
    smallest one containing the changed region, else the nearest."""
    start, end = changed_region(before.text, after.text)
    candidates = mechanism.candidates(after)
    assert candidates, f"{mechanism.name}: no candidate after a removal"
    containing = [c for c in candidates if c.start_byte <= start and end <= c.end_byte]
    if containing:
        return min(containing, key=lambda c: c.end_byte - c.start_byte)
    return min(candidates, key=lambda c: min(abs(c.start_byte - start), abs(c.end_byte - end)))


def _without_indentation(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines())


def same_source(got: str, want: str, *, exact: bool = True) -> bool:
    return got == want if exact else _without_indentation(got) == _without_indentation(want)


def diff(got: str, want: str) -> str:
    return "\n".join(
        difflib.unified_diff(want.splitlines(), got.splitlines(), "want", "got", lineterm="")
    )


def forward_chain(mechanism: Mechanism, chain: Chain, *, exact: bool = True) -> list[KernelSource]:
    """Re-apply every removal of ``chain`` in reverse; check each state comes back.

    Returns the re-created states (for compiling). Each application uses the candidate the
    removal created and the carrier read from the removed site.
    """
    rebuilt = []
    for i in reversed(range(len(chain.sites))):
        simpler, original = chain.states[i + 1], chain.states[i]
        candidate = matching_candidate(mechanism, original, simpler)
        result = mechanism.apply(simpler, candidate, chain.carriers[i])
        assert same_source(result.text, original.text, exact=exact), (
            f"{mechanism.name}: apply at {candidate} with {chain.carriers[i]} did not restore "
            f"the state before removing {chain.sites[i]}:\n{diff(result.text, original.text)}"
        )
        found = mechanism.detect(result)
        assert len(found) == len(mechanism.detect(original)), (
            f"{mechanism.name}: detect after apply finds {len(found)} sites"
        )
        rebuilt.append(result)
    return rebuilt


def compile_ok(builder: Builder, sources: list[KernelSource]) -> None:
    """Compile every distinct source in parallel; fail with nvcc's message for the first bad
    one."""
    unique = list({s.text: s for s in sources}.values())
    results = builder.build_many([(s.text, s.name) for s in unique])
    for source, result in zip(unique, results, strict=True):
        assert result.ok, f"{source.name} does not compile:\n{result.message}\n{source.text}"


# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


class RoundTripSuite:
    """Subclass as ``TestX`` with ``mechanism = "x"`` to run the standard checks."""

    mechanism: ClassVar[str]
    exact: ClassVar[bool] = True
    """Whether apply(remove(k)) must give k byte for byte (else: up to indentation)."""

    @property
    def subject(self) -> Mechanism:
        return get(self.mechanism)

    def pairs(self) -> list[Pair]:
        return fixture_pairs(self.mechanism)

    def test_metadata(self) -> None:
        m = self.subject
        assert m.name == self.mechanism
        assert m.category in ("memory", "compute", "synchronization", "parallelism", "launch")
        assert m.family and m.intent.endswith(".")

    def test_fixtures_have_the_mechanism(self) -> None:
        for pair in self.pairs():
            assert self.subject.detect(pair.before), f"{pair.case}: detect finds nothing"
            assert not pair.before.parsed.errors and not pair.after.parsed.errors

    def test_backward_gives_after(self) -> None:
        for pair in self.pairs():
            chain = removal_chain(self.subject, pair.before)
            got = chain.states[-1].text
            assert got == pair.after.text, f"{pair.case}:\n{diff(got, pair.after.text)}"

    def test_remove_on_a_kernel_without_it_changes_nothing(self) -> None:
        for pair in self.pairs():
            assert not [s for s in self.subject.detect(pair.after) if s.supported]
            assert remove_all(pair.after, self.subject) is pair.after

    def test_forward_restores_before(self) -> None:
        for pair in self.pairs():
            chain = removal_chain(self.subject, pair.before)
            forward_chain(self.subject, chain, exact=self.exact)

    def test_refusals_carry_a_reason(self) -> None:
        pair = self.pairs()[0]
        site = self.subject.detect(pair.before)[0]
        alien = site.model_copy(update={"mechanism": "not_" + self.mechanism})
        moved = site.model_copy(update={"snippet": "nowhere", "start_byte": 0, "end_byte": 0})
        for bad in (alien, moved):
            with pytest.raises(MechanismRefused) as refused:
                self.subject.remove(pair.before, bad)
            assert refused.value.reason.strip()
        if not any(c.id == site.id for c in self.subject.candidates(pair.before)):
            with pytest.raises(MechanismRefused) as refused:
                self.subject.apply(pair.before, site)
            assert "not a candidate" in refused.value.reason

    def test_conditions_print_as_prose(self) -> None:
        for pair in self.pairs():
            for site in self.subject.detect(pair.before):
                for condition in self.subject.conditions(pair.before, site):
                    assert condition.prose.strip() and str(condition) == condition.prose

    def test_sites_are_printable_and_stable(self) -> None:
        pair = self.pairs()[0]
        sites = self.subject.detect(pair.before)
        again = self.subject.detect(KernelSource("// a new first line\n" + pair.before.text))
        assert [s.id for s in sites] == [s.id for s in again]
        for site in sites:
            assert str(site).startswith(f"{site.function}:{site.lines} {site.node_kind}: ")
            assert Site.model_validate_json(site.model_dump_json()) == site

    @pytest.mark.nvcc
    def test_every_state_compiles(self, mechanism_builder: Builder) -> None:
        """``mechanism_builder`` comes from tests/mechanisms/conftest.py."""
        sources: list[KernelSource] = []
        for pair in self.pairs():
            chain = removal_chain(self.subject, pair.before)
            sources += chain.states
        compile_ok(mechanism_builder, sources)
