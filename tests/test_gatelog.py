"""The append-only gate log: verdicts are served back by what was asked, a torn line is made
again, and verdicts timed before the audits are not served to an audited run."""

from __future__ import annotations

import json
from pathlib import Path

from klineage.gate.build import BuildResult, BuildStatus
from klineage.gate.log import GateLog
from klineage.gate.result import GATE_PROTOCOL, GateVerdict


def _verdict(fingerprint: str, protocol: str) -> GateVerdict:
    build = BuildResult(status=BuildStatus.COMPILE_ERROR, key="k" * 64, message="stand-in")
    return GateVerdict(
        problem="p", kernel="k.cu", fingerprint=fingerprint, build=build, protocol=protocol
    )


def _write(path: Path, records: list[tuple[str, GateVerdict]], torn: bool = False) -> None:
    lines = [
        json.dumps({"key": key, "verdict": json.loads(v.model_dump_json())}) for key, v in records
    ]
    if torn:
        lines.append('{"key": "torn", "verdict": {"prob')
    path.write_text("\n".join(lines) + "\n")


def test_verdicts_from_before_the_audits_are_not_served_to_an_audited_run(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    _write(path, [("old", _verdict("a", "")), ("new", _verdict("b", GATE_PROTOCOL))], torn=True)
    log = GateLog(path, None)  # type: ignore[arg-type]
    assert len(log) == 1 and log.stale == 1
    older = GateLog(path, None, accept_older=True)  # type: ignore[arg-type]
    assert len(older) == 2 and older.stale == 0
