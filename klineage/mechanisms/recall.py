"""Detection recall: does ``detect`` find the optimizations a person listed in a kernel?

An expert kernel folder may hold a ``mechanisms.json`` written by hand, a JSON list of::

    {"mechanism": "fast_math", "family": "fast math intrinsics", "lines": [74, 79],
     "note": "__expf in the exp-and-sum loop"}

:func:`detection_recall` reports, for each entry, whether the named mechanism detects a site
overlapping those lines. It measures the catalog against what a reader sees in the code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from klineage.kernel import KernelSource
from klineage.mechanisms.base import UnknownMechanism, get

__all__ = ["ListedMechanism", "RecallEntry", "RecallReport", "detection_recall"]

MECHANISMS_FILE = "mechanisms.json"


class ListedMechanism(BaseModel):
    """One entry of a ``mechanisms.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mechanism: str = Field(description="the registry name of the mechanism")
    family: str = Field(default="", description="the DESIGN.md family, for people")
    lines: tuple[int, int] = Field(description="1-based first and last line, inclusive")
    note: str = Field(default="", description="what is there, in words")

    @field_validator("lines")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] < 1 or value[1] < value[0]:
            raise ValueError(f"lines {list(value)} must be [first, last] with 1 <= first <= last")
        return value


class RecallEntry(BaseModel):
    """What ``detect`` made of one listed mechanism."""

    listed: ListedMechanism = Field(description="the entry as written")
    found: bool = Field(description="a detected site overlaps the listed lines")
    sites: list[str] = Field(default=[], description="the overlapping sites, printed")
    error: str | None = Field(
        default=None, description="why it could not be checked (an unknown mechanism)"
    )


class RecallReport(BaseModel):
    """Recall of ``detect`` over one kernel's listed mechanisms."""

    kernel: str = Field(description="the kernel's display name")
    entries: list[RecallEntry] = Field(description="one per listed mechanism, in file order")

    @property
    def found(self) -> int:
        return sum(e.found for e in self.entries)

    @property
    def recall(self) -> float:
        """Found / listed (1.0 for an empty list: nothing was missed)."""
        return self.found / len(self.entries) if self.entries else 1.0

    @property
    def missed(self) -> list[RecallEntry]:
        return [e for e in self.entries if not e.found]

    def __str__(self) -> str:
        lines = [f"{self.kernel}: {self.found}/{len(self.entries)} listed mechanisms detected"]
        for entry in self.missed:
            first, last = entry.listed.lines
            why = f" ({entry.error})" if entry.error else ""
            lines.append(f"  missed {entry.listed.mechanism} at lines {first}-{last}{why}")
        return "\n".join(lines)


def _load_listed(
    mechanisms_json: str | Path | Sequence[Mapping[str, Any]],
) -> list[ListedMechanism]:
    if isinstance(mechanisms_json, str | Path):
        path = Path(mechanisms_json)
        if path.is_dir():
            path = path / MECHANISMS_FILE
        data = json.loads(path.read_text(encoding="utf-8"))
        where = str(path)
    else:
        data, where = list(mechanisms_json), "mechanisms list"
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a JSON list of {{mechanism, family, lines, note}}")
    listed = []
    for index, item in enumerate(data):
        try:
            listed.append(ListedMechanism.model_validate(item))
        except ValidationError as err:
            raise ValueError(f"{where}: entry {index}: {err.errors()[0]['msg']}") from None
    return listed


def detection_recall(
    kernel: KernelSource, mechanisms_json: str | Path | Sequence[Mapping[str, Any]]
) -> RecallReport:
    """For each listed mechanism, whether ``detect`` finds a site overlapping its lines.

    ``mechanisms_json`` is a path to a ``mechanisms.json`` (or its folder), or the parsed list.
    """
    entries = []
    detected: dict[str, list[Any]] = {}
    for listed in _load_listed(mechanisms_json):
        try:
            mechanism = get(listed.mechanism)
        except UnknownMechanism as err:
            entries.append(RecallEntry(listed=listed, found=False, error=str(err)))
            continue
        if listed.mechanism not in detected:
            detected[listed.mechanism] = mechanism.detect(kernel)
        first, last = listed.lines
        hits = [s for s in detected[listed.mechanism] if s.overlaps_lines(first, last)]
        entries.append(RecallEntry(listed=listed, found=bool(hits), sites=[str(s) for s in hits]))
    return RecallReport(kernel=kernel.name, entries=entries)
