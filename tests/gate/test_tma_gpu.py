"""The TMA fixture through `klineage gate` on a Hopper GPU: its compile_options.json links
-lcuda for cuTensorMapEncodeTiled, the kernel copies through cp.async.bulk.tensor, and every
workload passes the check and is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, REPO

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]

TMA = FIXTURES / "problems" / "tma_copy"


def test_the_tma_kernel_links_the_driver_and_passes_the_gate(tmp_path: Path) -> None:
    verdict_path = tmp_path / "verdict.json"
    env = {**os.environ, "KLINEAGE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "klineage", "gate", str(TMA), "--json", str(verdict_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    verdict = json.loads(verdict_path.read_text())
    assert verdict["build"]["status"] == "OK"
    assert "-lcuda" in verdict["build"]["command"]
    statuses = {w["label"]: w["status"] for w in verdict["workloads"]}
    assert len(statuses) == 3 and set(statuses.values()) == {"PASSED"}, statuses
    assert all(w["timing"] is not None for w in verdict["workloads"])
