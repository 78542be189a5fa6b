"""The device scripts (bench/*.sh) start the modules they name: a `python3 -m X` whose X cannot
run as a program fails at once on the device, after a machine start (`-m klineage.cli` did,
once klineage.cli became a package). Each module is run here with `--help`, as the scripts'
Python would find it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

MODULE = re.compile(r"python3? -m ([\w.]+)")


def _modules() -> list[tuple[str, str]]:
    found = set()
    for script in sorted((REPO / "bench").glob("*.sh")):
        for name in MODULE.findall(script.read_text(encoding="utf-8")):
            found.add((script.name, name))
    return sorted(found)


def test_the_scripts_name_modules() -> None:
    assert ("mine_chunk.sh", "klineage") in _modules()


@pytest.mark.parametrize(("script", "module"), _modules())
def test_a_module_a_device_script_runs_starts(script: str, module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{script}: python3 -m {module} --help\n{done.stderr[-2000:]}"


@pytest.mark.parametrize("card", ["NVIDIA H100 80GB HBM3", ""])
@pytest.mark.parametrize(
    ("chunk", "state"), [("replay_chunk.sh", "replay_out"), ("public_chunk.sh", "public_mine")]
)
def test_a_chunk_on_another_card_stops_before_the_state(
    tmp_path, card: str, chunk: str, state: str
) -> None:
    # a stand-in nvidia-smi (the GPU boundary's test double) names the card the call landed on;
    # the script runs from a copy, so a guard that fails cannot touch this checkout's state
    (tmp_path / "bench").mkdir()
    for name in (chunk, "state_archive.sh"):
        shutil.copy(REPO / "bench" / name, tmp_path / "bench" / name)
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ -n '{card}' ] && echo '{card}'\n")
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "bench" / chunk)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "GPU_MATCH": "H200", "OUT": str(tmp_path)},
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "not a H200 GPU" in done.stdout
    assert not list(tmp_path.glob(f"{state}.*"))  # no state written
    assert not (tmp_path / "build").exists()  # nothing unpacked


def test_the_adaptive_call_runs_nothing_without_a_gpu(tmp_path) -> None:
    # the stand-in nvidia-smi (the GPU boundary's test double) finds no card
    (tmp_path / "bench").mkdir()
    shutil.copy(REPO / "bench" / "adaptive_call.sh", tmp_path / "bench" / "adaptive_call.sh")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 9\n")
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(tmp_path / "bench" / "adaptive_call.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "OUT": str(tmp_path / "out")},
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no GPU: nothing run" in done.stdout
    assert not (tmp_path / "replay_out").exists()
