"""The committed gate logs (bench/state/) load as logs and carry no machine paths."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from klineage.gate.log import GateLog

STATE = Path(__file__).resolve().parents[1] / "bench" / "state"
MACHINE_PATH = re.compile(r'"/(root|home|tmp|work|Users)/')


@pytest.mark.parametrize("archive", ["replay_gatelog.tar.xz", "mine_gatelog.tar.xz"])
def test_archived_gate_logs_load_and_are_scrubbed(archive: str, tmp_path: Path) -> None:
    with tarfile.open(STATE / archive) as tar:
        tar.extractall(tmp_path, filter="data")
    logs = sorted(tmp_path.glob("*/gatelog/*.jsonl"))
    assert logs, f"{archive} holds no gate log"
    for path in logs:
        text = path.read_text(encoding="utf-8")
        assert not MACHINE_PATH.search(text), f"{path.name} carries a machine path"
        lines = [line for line in text.splitlines() if line.strip()]
        # every line loads (none torn); a kernel the audited gate judged again after the gate
        # before the audits is logged twice, and the later verdict is the one served
        keys = {json.loads(line)["key"] for line in lines}
        log = GateLog(path, None, resume=True, accept_older=True)  # type: ignore[arg-type]
        assert len(log) == len(keys)
        audited = GateLog(path, None, resume=True)  # type: ignore[arg-type]
        assert len(audited) + audited.stale == len(lines)
