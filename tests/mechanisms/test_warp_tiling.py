"""The warp_tiling mechanism: detected in tiled GEMMs; removal and application refused."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("warp_tiling")


class TestWarpTiling(RoundTripSuite):
    mechanism = "warp_tiling"

    def test_forward_restores_before(self) -> None:
        """Nothing is removed, and there is nowhere to apply it: both refused."""
        for pair in self.pairs():
            assert pair.before.text == pair.after.text
            (site,) = self.subject.detect(pair.before)
            with pytest.raises(MechanismRefused, match="re"):
                self.subject.remove(pair.before, site)
            assert self.subject.candidates(pair.before) == []


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("warp_tiling") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "warp_tiling", expect_some=False)


def test_the_site_spans_the_warp_grid_and_offsets() -> None:
    before = fixture_pairs("warp_tiling")[0].before
    (site,) = mechanism.detect(before)
    assert (site.start_line, site.end_line) == (22, 37)
    (condition,) = mechanism.conditions(before, site)
    assert "multiple of 32" in condition.prose
