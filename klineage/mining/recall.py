"""Recall: how many of the mechanisms a person listed in an expert (its ``mechanisms.json``)
mining turned into skills. Detection recall, whether ``detect`` finds them at all, is
:mod:`klineage.mechanisms.recall`."""

from __future__ import annotations

import json

from klineage.mechanisms.recall import MECHANISMS_FILE
from klineage.problem import Problem
from klineage.skills import Skill


def skill_recall(problem: Problem, skills: list[Skill]) -> tuple[float | None, list[str]]:
    """The share of the listed mechanisms that became skills, and the listed ones that did not
    (None and [] when the problem lists none)."""
    listed_path = problem.root / MECHANISMS_FILE
    if not listed_path.is_file():
        return None, []
    listed = {entry["mechanism"] for entry in json.loads(listed_path.read_text())}
    found = {s.mechanism for s in skills}
    missed = sorted(listed - found)
    return (len(listed) - len(missed)) / len(listed) if listed else None, missed
