"""The one error a problem folder raises, naming the file, the line, the field and what was
expected, and the helpers validators use to raise it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from pydantic_core import PydanticCustomError

JsonPath = tuple[str | int, ...]


def format_path(path: Iterable[str | int]) -> str:
    """Render ("inputs", "x", "shape", 1) as inputs.x.shape[1]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _display_path(path: Path) -> str:
    # Relative to the working directory when possible: shorter and clickable in terminals.
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


class ProblemError(ValueError):
    """A problem folder is missing something or holds an invalid value.

    ``str(err)`` reads like
    ``expert_kernels/softmax/definition.json:14: inputs.x.shape[1]: unknown axis 'colz';
    expected one of the axes: rows, cols``.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path,
        line: int | None = None,
        field: str | None = None,
        expected: str | None = None,
    ) -> None:
        self.message = message
        self.file = Path(file)
        self.line = line
        self.field = field
        self.expected = expected
        super().__init__(str(self))

    def __str__(self) -> str:
        where = _display_path(self.file)
        if self.line is not None:
            where += f":{self.line}"
        text = f"{where}: "
        if self.field:
            text += f"{self.field}: "
        text += self.message
        if self.expected:
            text += f"; expected {self.expected}"
        return text


def fail(path: JsonPath, message: str, expected: str) -> NoReturn:
    """Raise from inside a validator; the loader turns this into a ProblemError.

    `path` is relative to the model being validated; pydantic adds the model's own location.
    """
    where = f"{format_path(path)}: " if path else ""
    raise PydanticCustomError(
        "problem",
        "{where}{message}; expected {expected}",
        {"where": where, "message": message, "expected": expected, "path": path},
    )


def listed(items: Iterable[str]) -> str:
    listed = ", ".join(items)
    return listed or "(none)"
