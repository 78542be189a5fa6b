"""Kernels and model answers shared by the LLM tests (scale_rows: y = x * alpha)."""

from __future__ import annotations

from klineage import KernelSource, load_problem
from klineage.problem import Problem
from tests.conftest import FIXTURES

KERNEL_FILE = FIXTURES / "kernels" / "scale_rows" / "correct.cu"
PROBLEM_DIR = FIXTURES / "problems" / "scale_rows"


def kernel() -> KernelSource:
    return KernelSource.from_file(KERNEL_FILE)


def problem() -> Problem:
    return load_problem(PROBLEM_DIR)


def simplified_source() -> str:
    """The fixture kernel with its 256-thread block replaced by a plain 128-thread one."""
    text = KERNEL_FILE.read_text()
    new = text.replace("(n + 255) / 256), 256,", "(n + 127) / 128), 128,")
    assert new != text
    return new


def broken_source() -> str:
    """A simplification that does not compile (an undeclared identifier)."""
    return simplified_source().replace("(x, alpha, y, n);", "(x, alpha, y, n_elems);")


def answer(
    source: str | None = None,
    *,
    mechanism: str | None = "tuned_block_size",
    intent: str | None = "use a plain 128-thread block instead of the tuned 256",
    language: str = "cuda",
) -> str:
    """A model answer in the format the prompts ask for (fields left out when None)."""
    lines = ["Here is the simplified kernel.", ""]
    if mechanism is not None:
        lines.append(f"MECHANISM: {mechanism}")
    if intent is not None:
        lines.append(f"INTENT: {intent}")
    code = source if source is not None else simplified_source()
    lines += ["", f"```{language}", code.rstrip("\n"), "```", ""]
    return "\n".join(lines)


PROSE = """## When to apply
When the row length is a multiple of 4 and the tensors are 16-byte aligned.

## How
Load and store `float4` instead of `float`.

## Risks
Fails on probes where `cols % 4 != 0` (WRONG_ANSWER).
"""
