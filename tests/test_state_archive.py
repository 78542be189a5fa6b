"""bench/state_archive.sh: a device call's state leaves as xz parts no larger than the limit
on returned files, and the next call unpacks exactly what was packed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "state_archive.sh"


def _bash(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"source {SCRIPT} && {command}"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )


def test_a_state_too_big_for_one_file_leaves_in_parts_and_comes_back_whole(tmp_path: Path) -> None:
    work = tmp_path / "call"
    (work / "replay_out" / "gatelog").mkdir(parents=True)
    payload = os.urandom(300_000)  # incompressible: xz keeps its size
    (work / "replay_out" / "gatelog" / "p.jsonl").write_bytes(payload)
    (work / "replay_out" / "finished.json").write_text("{}\n")
    out = tmp_path / "out"
    out.mkdir()
    packed = _bash("state_pack replay_out replay_out", work, OUT=str(out), STATE_PART_BYTES="100k")
    assert packed.returncode == 0, packed.stderr
    parts = sorted(out.glob("replay_out.tar.xz.part-*"))
    assert len(parts) >= 3 and all(p.stat().st_size <= 100 * 1024 for p in parts)

    nxt = tmp_path / "next"
    (nxt / ".state").mkdir(parents=True)
    for part in parts:
        (nxt / ".state" / part.name).write_bytes(part.read_bytes())
    unpacked = _bash("state_unpack replay_out", nxt)
    assert unpacked.returncode == 0, unpacked.stderr
    assert (nxt / "replay_out" / "gatelog" / "p.jsonl").read_bytes() == payload
    assert (nxt / "replay_out" / "finished.json").read_text() == "{}\n"


def test_no_state_to_unpack_says_so(tmp_path: Path) -> None:
    (tmp_path / ".state").mkdir()
    assert _bash("state_unpack replay_out", tmp_path).returncode == 1
