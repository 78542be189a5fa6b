"""A large realistic CUDA source, shared by the source-model test and its benchmark
(`bench/source_speed.py`)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES


def thousand_line_blocks() -> list[str]:
    """About 1,000 lines of realistic CUDA in blocks: the expert softmax and the mechanism
    fixtures' `before.cu`, each in its own namespace, repeated."""
    parts = [(REPO / "expert_kernels" / "softmax" / "kernel.cu").read_text()]
    parts += [p.read_text() for p in sorted(Path(FIXTURES).glob("*/before.cu"))]
    blocks: list[str] = []
    while sum(b.count("\n") for b in blocks) < 1000:
        i = len(blocks)
        blocks.append(f"namespace v{i} {{\n{parts[i % len(parts)]}}}  // namespace v{i}\n")
    return blocks


def thousand_line_kernel() -> str:
    """The blocks as one source."""
    return "".join(thousand_line_blocks())
