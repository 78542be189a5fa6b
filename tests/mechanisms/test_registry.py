"""The registry, sites, carriers and the protocol's own checks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms import (
    CATEGORIES,
    Carrier,
    Mechanism,
    MechanismError,
    MechanismRefused,
    Site,
    UnknownMechanism,
    all_mechanisms,
    detect_all,
    get,
    mechanism_names,
    register,
    remove_all,
    remove_first,
)
from klineage.mechanisms.base import _REGISTRY
from tests.mechanisms.roundtrip import FIXTURES

FIRST_FIVE = {"restrict_pointers", "readonly_ldg", "launch_bounds", "pragma_unroll", "fast_math"}


def test_the_catalog_is_registered_with_complete_metadata() -> None:
    names = mechanism_names()
    assert set(names) >= FIRST_FIVE and names == sorted(names)
    for mechanism in all_mechanisms():
        assert mechanism.category in CATEGORIES
        assert mechanism.family and mechanism.intent.endswith(".")
        assert get(mechanism.name) is mechanism
        assert set(mechanism.requires) | set(mechanism.conflicts) <= set(names)
        assert (FIXTURES / mechanism.name / "before.cu").is_file(), (
            f"{mechanism.name} has no fixtures in {FIXTURES}"
        )


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownMechanism) as err:
        get("fastmath")
    message = str(err.value)
    assert "did you mean 'fast_math'?" in message
    assert all(name in message for name in FIRST_FIVE)


def test_register_checks_the_class() -> None:
    class Nameless(Mechanism):
        category = "compute"
        family = "x"
        intent = "x."

    with pytest.raises(TypeError, match="must set 'name'"):
        register(Nameless)  # type: ignore[type-abstract]

    class BadCategory(Nameless):
        name = "bad_category"
        category = "magic"  # type: ignore[assignment]

    with pytest.raises(TypeError, match="category 'magic' is not one of memory"):
        register(BadCategory)  # type: ignore[type-abstract]

    class Taken(Nameless):
        name = "fast_math"

    with pytest.raises(TypeError, match="already taken"):
        register(Taken)  # type: ignore[type-abstract]


def test_detect_all_is_in_document_order_across_mechanisms() -> None:
    kernel = KernelSource.from_file(FIXTURES / "pragma_unroll" / "before.cu")
    sites = detect_all(kernel)
    assert [s.start_byte for s in sites] == sorted(s.start_byte for s in sites)
    assert {s.mechanism for s in sites} >= {"pragma_unroll", "restrict_pointers"}
    only = detect_all(kernel, ["pragma_unroll"])
    assert {s.mechanism for s in only} == {"pragma_unroll"}


def test_remove_on_a_kernel_without_the_mechanism_changes_nothing() -> None:
    kernel = KernelSource("__global__ void k(float* y) { y[0] = 1.0f; }\n")
    for mechanism in all_mechanisms():
        assert mechanism.detect(kernel) == []
        assert remove_first(kernel, mechanism) is kernel
        assert remove_all(kernel, mechanism.name) is kernel


def test_site_ids_survive_unrelated_edits_and_count_occurrences() -> None:
    body = "__device__ float f(float a) { return __expf(a) + __expf(a); }\n"
    sites = get("fast_math").detect(KernelSource(body))
    assert [s.occurrence for s in sites] == [0, 1] and sites[0].id != sites[1].id
    moved = get("fast_math").detect(KernelSource("// header\n\n" + body))
    assert [s.id for s in moved] == [s.id for s in sites]
    assert moved[0].start_byte != sites[0].start_byte
    assert str(sites[0]) == "f:1 call_expression: __expf(a)"
    # a site from an older version of the kernel is found again by its id
    simpler = get("fast_math").remove(KernelSource("// header\n\n" + body), sites[1])
    assert simpler.text.count("__expf") == 1


def test_site_json_round_trip_keeps_the_id() -> None:
    site = get("fast_math").detect(
        KernelSource("__device__ float f(float a) { return __expf(a); }")
    )[0]
    data = site.model_dump(mode="json")
    assert data["id"] == site.id
    assert Site.model_validate(data) == site


def test_carrier_reads_and_checks_choices() -> None:
    carrier = Carrier.from_pairs(["unroll=4", "vector_width=8", "bound=kThreads", "fast=true"])
    assert carrier.get_int("unroll") == 4 and carrier.vector_width == 8
    assert carrier.get_str("bound") == "kThreads" and carrier["fast"] is True
    assert "unroll" in carrier and "tile_size" not in carrier
    assert carrier.merged({"unroll": 2}).unroll == 2
    assert str(Carrier()) == "(defaults)"
    with pytest.raises(ValueError, match="must be an integer"):
        carrier.get_int("bound")
    with pytest.raises(ValueError, match="is not key=value"):
        Carrier.from_pairs(["unroll"])
    with pytest.raises(ValidationError):
        Carrier(unroll=0)
    with pytest.raises(KeyError, match="carrier has no 'stages'"):
        carrier["stages"]


class _Liar(Mechanism):
    """A broken mechanism: its 'removal' edits nothing relevant."""

    name = "liar_test_only"
    category = "compute"
    family = "test"
    intent = "Test the protocol's checks."

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for call in source.calls_named("__expf"):
            yield self.site(source, call.node)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        return iter(())

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        return [Edit.insert(0, "// touched\n")]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        return []


def test_the_protocol_catches_a_removal_that_removes_nothing() -> None:
    liar = _Liar()
    kernel = KernelSource("__device__ float f(float a) { return __expf(a); }\n")
    with pytest.raises(MechanismError, match="left as many detected sites"):
        liar.remove(kernel, liar.detect(kernel)[0])
    assert "liar_test_only" not in _REGISTRY


def test_a_rewrite_that_would_not_parse_is_refused_with_the_reason() -> None:
    class Breaker(_Liar):
        name = "breaker_test_only"

        def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
            return [Edit(site.start_byte, site.end_byte, "expf(")]

    kernel = KernelSource("__device__ float f(float a) { return __expf(a); }\n")
    with pytest.raises(MechanismRefused) as refused:
        Breaker().remove(kernel, Breaker().detect(kernel)[0])
    assert "would not parse" in refused.value.reason and "kernel.cu:1" in refused.value.reason
