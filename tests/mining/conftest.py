"""Fixtures shared by the mining tests: one build cache, and the standard walk mined once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.mining.mine import MineReport


@pytest.fixture(scope="session")
def builder(shared_builder: Builder) -> Builder:
    """The session's nvcc builder: every walk passes through the same states, built once."""
    return shared_builder


@dataclass(frozen=True)
class Mined:
    """exp_scale mined once with the stand-in gate's default rules, gating every removal
    (`mine_gated`)."""

    out: Path
    """The skills folder (read it; a test that writes mines into its own)."""
    report: MineReport
    """What `mine` returned."""


@pytest.fixture(scope="session")
def mined(builder: Builder, tmp_path_factory: pytest.TempPathFactory) -> Mined:
    from tests.mining.stand_in_gate import mine_gated
    from tests.mining.test_mine import PROBLEM, _gate

    out = tmp_path_factory.mktemp("skills_out")
    return Mined(out, mine_gated(PROBLEM, out, gate=_gate(builder)))
