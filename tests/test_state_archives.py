"""The committed gate logs (bench/state/) load as logs and carry no machine paths."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest

from klineage.gate.log import GATE_PROTOCOL, GateLog

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
        records = [json.loads(line) for line in lines]
        current = [r for r in records if r["verdict"].get("protocol") == GATE_PROTOCOL]
        assert len(audited) == len({r["key"] for r in current})
        assert audited.stale == len(lines) - len(current)
        # an audited key logged twice is a line logged before the problem field, logged again
        # with the problem it was first served for
        seen: dict[str, list[dict]] = {}
        for record in current:
            seen.setdefault(record["key"], []).append(record)
        for again in (r for r in seen.values() if len(r) > 1):
            assert not again[0].get("problem") and all(r.get("problem") for r in again[1:])
