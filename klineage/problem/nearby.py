"""Which problem folders beside a missing one the user may have meant: a folder name close to
the one typed, or a folder whose definition carries the typed name (held-out folders are
named for the op, their definitions for the op and dtype: `heldout/gelu` holds
`gelu_tanh_f32`)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from klineage.problem.models import DEFINITION_FILE

MAX_SUGGESTIONS = 3
"""At most this many folders are named."""


def _definition_name(folder: Path) -> str | None:
    """The `name` in a folder's definition, or None where it cannot be read."""
    try:
        data = json.loads((folder / DEFINITION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def nearby_problem_folders(missing: Path) -> list[Path]:
    """Problem folders (holding a definition) beside `missing` that its name may have meant,
    best first (an exact folder or definition name scores highest)."""
    parent = missing.parent
    try:
        folders = sorted(d for d in parent.iterdir() if (d / DEFINITION_FILE).is_file())
    except OSError:
        return []
    by_label: dict[str, Path] = {}
    for folder in folders:
        by_label.setdefault(folder.name, folder)
        name = _definition_name(folder)
        if name is not None:
            by_label.setdefault(name, folder)
    close = difflib.get_close_matches(
        missing.name, list(by_label), n=MAX_SUGGESTIONS * 2, cutoff=0.6
    )
    # a folder may match by its name and by its definition's: name it once
    return list(dict.fromkeys(by_label[label] for label in close))[:MAX_SUGGESTIONS]
