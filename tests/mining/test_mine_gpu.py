"""Mining the softmax expert and replaying its skills on two held-out problems, on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.mining.mine import mine
from klineage.mining.walk import MiningBudget
from klineage.replay.methods import ReplayBudget
from klineage.replay.run import replay
from klineage.skills import SkillLibrary
from tests.conftest import REPO

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]


@pytest.fixture(scope="module")
def mined(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("skills_out")
    report = mine(REPO / "expert_kernels" / "softmax", out, budget=MiningBudget(wall_seconds=900))
    return out, report


def test_mine_softmax_end_to_end(mined) -> None:
    out, report = mined
    assert report.termination in ("complete", "stuck")
    assert report.skills >= 3
    for skill in SkillLibrary.load(out):
        assert skill.conditions and skill.effect.workloads
        assert skill.evidence.hardware.startswith("NVIDIA")
    assert (out / "lineages" / "softmax_rows_f32.json").is_file()


def test_replay_two_heldout_problems(mined, tmp_path: Path) -> None:
    out, _ = mined
    problems = [REPO / "heldout" / "mean_pool", REPO / "heldout" / "gelu"]
    report = replay(problems, out, tmp_path, budget=ReplayBudget(gate_runs=6))
    assert {r.problem for r in report.results} == {"mean_pool_f16", "gelu_tanh_f32"}
    for result in report.results:
        assert len(result.runs) <= 6 and result.speedup >= 1.0
        assert all(u["source"] == "softmax_rows_f32" for u in result.skills_used)
