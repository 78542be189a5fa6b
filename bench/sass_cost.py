"""What recording machine code adds to a build: nvcc with and without `-keep`, the fingerprints,
and the nvdisasm histogram (on demand, once per cache entry).

    python bench/sass_cost.py expert_kernels/softmax heldout/gelu_tanh_f32 --repeat 3

Each kernel is built `repeat` times into a fresh cache (never a hit); no GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from klineage.gate.build import Builder, specific_arch_for


def _plain_nvcc(builder: Builder, source: str, work: Path) -> float:
    """The gate's nvcc command as it ran before machine code was recorded (no -keep)."""
    (work / "kernel.cu").write_text(source)
    arch = specific_arch_for(builder.arch, source)
    command = (Builder(arch=arch) if arch else builder).command
    started = time.perf_counter()
    subprocess.run(command, cwd=work, capture_output=True, check=True)
    return time.perf_counter() - started


def measure(kernel: Path, repeat: int) -> dict[str, Any]:
    source = kernel.read_text()
    plain, kept, prints, histogram = [], [], [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            builder = Builder(cache_dir=Path(tmp) / "cache")
            work = Path(tmp) / "plain"
            work.mkdir()
            plain.append(_plain_nvcc(builder, source, work))
            result = builder.build(source)
            assert result.ok and result.machine_code is not None, result.message
            kept.append(result.seconds)
            prints.append(result.machine_code.fingerprint_seconds)
            histogram.append(builder.disassemble(result).machine_code.disassembly_seconds)
    return {
        "kernel": str(kernel),
        "nvcc_s": statistics.median(plain),
        "nvcc_keep_s": statistics.median(kept),
        "fingerprints_s": statistics.median(prints),
        "histograms_s": statistics.median(histogram),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/sass_cost.json"))
    args = parser.parse_args()
    rows = []
    for folder in args.problems:
        rows.append(measure(folder / "kernel.cu", args.repeat))
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
