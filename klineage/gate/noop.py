"""Removals that change no machine code: refused before any GPU run.

A removal whose simplified state compiles to the same device SASS (every kernel) and the same
host code as the state it came from cannot change a measurement: timing it measures the same
binary twice, and a skill made from it would teach an optimization that does nothing. Two
reasons are told apart from a ``-lineinfo`` build of the optimized state (the same SASS, with
a line table):

- ``never_instantiated``: no SASS instruction comes from the edited lines (a template
  instantiation the kernel never makes, a branch folded away);
- ``compiler_already_does_it``: the edited lines are in the SASS, and the change leaves it as
  it was (the compiler unrolls the loop itself, proves the pointers do not alias, ...).

A change that only moves a host-side choice (a K split, a launch-size dispatch, a block size)
changes the host code, so it is never called a no-op.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import Protocol

from pydantic import BaseModel, Field

from klineage.gate.build import BuildResult
from klineage.gate.sass import MachineCode

__all__ = ["NoMachineCodeChange", "NoOpReason", "edited_lines", "no_machine_code_change"]


class NoOpReason(str, Enum):
    NEVER_INSTANTIATED = "never_instantiated"
    COMPILER_ALREADY_DOES_IT = "compiler_already_does_it"


class NoMachineCodeChange(BaseModel):
    """Why a removal was refused without a gate run."""

    reason: NoOpReason = Field(description="never_instantiated or compiler_already_does_it")
    message: str = Field(description="the reason in words, with the edited lines")
    edited_lines: list[int] = Field(description="lines of the optimized state the edit touches")
    device_fingerprint: str = Field(description="the device SASS both states share")
    host_fingerprint: str = Field(description="the host code both states share")


class LineBuilder(Protocol):
    """What the check needs from a Builder."""

    def build(self, source: str, name: str = ..., *, disassemble: bool = ...) -> BuildResult: ...

    def instantiated_lines(self, source: str) -> set[int] | None: ...


def same_machine_code(a: MachineCode | None, b: MachineCode | None) -> bool:
    """Both known, and the same device SASS and host code."""
    return a is not None and b is not None and a.same_device(b) and a.same_host(b)


def edited_lines(optimized: str, simplified: str) -> list[int]:
    """Lines of `optimized` the change to `simplified` replaces or deletes, each with the
    line after it (a removed `#pragma unroll` is compiled into the loop on the next line); a
    pure insertion counts the lines on both sides of it."""
    old, new = optimized.splitlines(), simplified.splitlines()
    lines: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "insert":
            lines.update({i1, i1 + 1})
        else:
            lines.update(range(i1 + 1, i2 + 2))
    return sorted(n for n in lines if 1 <= n <= len(old))


def no_machine_code_change(
    builder: LineBuilder, optimized: str, simplified: str
) -> NoMachineCodeChange | None:
    """The refusal when `simplified` runs the same machine code as `optimized`, else None
    (also None when either does not build or has no fingerprints: the gate decides)."""
    before = builder.build(optimized)
    after = builder.build(simplified)
    if not (before.ok and after.ok) or not same_machine_code(
        before.machine_code, after.machine_code
    ):
        return None
    code = before.machine_code
    assert code is not None  # same_machine_code checked it
    edited = edited_lines(optimized, simplified)
    used = builder.instantiated_lines(optimized)
    shown = _spans(edited)
    if used is not None and not used & set(edited):
        reason = NoOpReason.NEVER_INSTANTIATED
        message = (
            f"no SASS instruction comes from the edited lines ({shown}): the code is never "
            "instantiated or is folded away, so removing it changes no machine code"
        )
    else:
        reason = NoOpReason.COMPILER_ALREADY_DOES_IT
        message = (
            f"the edited lines ({shown}) compile to the same SASS and host code with and "
            "without the change: the compiler already does it"
        )
    return NoMachineCodeChange(
        reason=reason,
        message=message,
        edited_lines=edited,
        device_fingerprint=code.device_fingerprint,
        host_fingerprint=code.host_fingerprint,
    )


def _spans(lines: list[int]) -> str:
    spans: list[list[int]] = []
    for n in lines:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans) or "none"
