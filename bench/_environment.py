"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import subprocess


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
