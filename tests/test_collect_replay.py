"""bench/collect_replay.py's counts of the gate logs (logs written here)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_scripts import load_bench_script

collect = load_bench_script("collect_replay")


def test_verdicts_shared_by_machine_code_are_counted(tmp_path: Path) -> None:
    timed = {"key": "a", "verdict": {}, "shared_from": None}
    shared = {"key": "b", "verdict": {}, "shared_from": "a"}
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in (timed, shared)) + "\n")
    (tmp_path / "q.jsonl").write_text(json.dumps(timed) + "\n\n")
    assert collect._log_counts(tmp_path) == {"verdicts": 3, "shared_by_machine_code": 1}
