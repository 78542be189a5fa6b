"""The block_tiling mechanism: detected in tiled GEMMs; removal and application refused."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("block_tiling")


class TestBlockTiling(RoundTripSuite):
    mechanism = "block_tiling"

    def test_forward_restores_before(self) -> None:
        """Nothing is removed, and there is nowhere to apply it: both refused."""
        for pair in self.pairs():
            assert pair.before.text == pair.after.text
            (site,) = self.subject.detect(pair.before)
            with pytest.raises(MechanismRefused, match="re"):
                self.subject.remove(pair.before, site)
            assert self.subject.candidates(pair.before) == []


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("block_tiling") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "block_tiling", expect_some=False)


def test_the_site_is_the_tile_extents() -> None:
    before = fixture_pairs("block_tiling")[0].before
    (site,) = mechanism.detect(before)
    assert site.detail["extents"] == "kBM,kBN" and (site.start_line, site.end_line) == (8, 9)


def test_one_origin_is_not_a_tile() -> None:
    from klineage.kernel import KernelSource

    source = KernelSource(
        "constexpr int kThreads = 256;\n__global__ void k(float* y) {\n"
        "  const int i = blockIdx.x * kThreads + threadIdx.x;\n  y[i] = 0.0f;\n}\n"
    )
    assert mechanism.detect(source) == []
