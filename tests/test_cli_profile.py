"""What `klineage gate --profile` prints, for a profile made of counters recorded on the H200,
and for a skipped one."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from klineage.cli import app
from klineage.cli.profile_view import print_profile
from klineage.gate.bottleneck import classify, peaks_for
from klineage.gate.profile import Profile
from tests.conftest import REPO
from tests.recorded_profiles import gelu_launch


def _printed(profile: Profile) -> str:
    console = Console(record=True, width=120)
    print_profile(console, profile)
    return console.export_text()


def test_a_profile_prints_its_launches_traffic_and_bottleneck() -> None:
    profile = Profile(
        workload_uuid="w0",
        label="n=11008",
        launches=[gelu_launch()],
        minimum_bytes=2 * 11008 * 4,
        seconds=12.5,
    )
    profile.bottleneck = classify(profile, latency_ms=0.0064, peaks=peaks_for("NVIDIA H200"))
    text = _printed(profile)
    assert "profile of n=11008 (12.5 s of ncu)" in text
    row = next(line for line in text.splitlines() if "gelu_tanh" in line)
    assert "2.4" in row and "12%/100%" in row and "long_scoreboard 14.19" in row
    # 47,104 DRAM bytes against 88,064 the workload needs at least
    assert "DRAM traffic 0.0471 MB, 0.53x the workload's minimum (0.0881 MB)" in text
    assert "bottleneck: launch-bound" in text
    assert "the GPU idles between launches" in text


def test_a_skipped_profile_prints_why() -> None:
    text = _printed(Profile.skip("ncu was not found (on PATH, or named by $KLINEAGE_NCU)"))
    assert text.strip() == "profile skipped: ncu was not found (on PATH, or named by $KLINEAGE_NCU)"


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_profile_on_a_dask_cluster_is_refused_before_any_gate_run(
    command: str, tmp_path: Path
) -> None:
    folder = "expert_kernels/topk" if command == "mine" else "heldout/gelu"
    result = CliRunner().invoke(
        app,
        [command, str(REPO / folder), "--executor", "dask", "--profile", "--out", str(tmp_path)],
    )
    assert result.exit_code == 2
    assert "--profile needs --executor local" in result.output
    assert not any(tmp_path.iterdir()), "nothing was written"
