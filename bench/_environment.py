"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def nvidia_smi() -> str:
    """GPU name, driver and clocks as nvidia-smi reports them ('' when unavailable)."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.mem",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def command_line(argv: Sequence[str]) -> str:
    """The command as run, fit to keep: a path inside the repository relative to it, one in
    the device's output folder (`$OUT`) written `$OUT/...`, any other absolute path by name."""
    out = os.environ.get("OUT")
    words = ["python"]
    for word in argv:
        path = Path(word)
        if path.is_absolute():
            if path.is_relative_to(REPO):
                word = str(path.relative_to(REPO))
            elif out and path.is_relative_to(out):
                word = str(Path("$OUT") / path.relative_to(out))
            else:
                word = path.name
        words.append(word)
    return " ".join(words)
