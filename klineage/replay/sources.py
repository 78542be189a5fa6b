"""Skills from several mined folders, each skill remembered with the folder it came from.

    sources = SkillSources.load(["skills_out", "my_public_skills"])
    sources.skills                      # every skill, in folder order
    sources.folder_of["fast_math--..."] # "skills_out"

Replay takes skills from any number of folders (``klineage replay --skills A --skills B``): our
own ``skills_out/`` beside skills a user mined from public code, say. A skill id two folders
both hold is read once, from the first, when the two are the same skill; two different skills
under one id are refused, naming both folders, since a report could not say which one ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from klineage.skills import Skill, SkillLibrary

__all__ = ["SkillSources"]


@dataclass
class SkillSources:
    """Skills read from several folders, in the order the folders were given."""

    folders: list[str]
    """The folders, as given."""
    skills: list[Skill] = field(default_factory=list)
    """Every distinct skill, the first folder's first, each folder's in id order."""
    folder_of: dict[str, str] = field(default_factory=dict)
    """Skill id -> the folder it was read from."""

    @classmethod
    def load(cls, folders: str | Path | Sequence[str | Path]) -> SkillSources:
        """The skills of each folder's ``skills.jsonl``. A folder without one raises
        FileNotFoundError (as :meth:`SkillLibrary.load`); an id two folders give different
        skills raises ValueError naming both; no folder at all raises ValueError."""
        given = [folders] if isinstance(folders, str | Path) else list(folders)
        if not given:
            raise ValueError("no skills folder given; name at least one (default skills_out)")
        sources = cls(folders=[str(f) for f in given])
        seen: dict[str, Skill] = {}
        for folder in sources.folders:
            for skill in SkillLibrary.load(folder):
                earlier = seen.get(skill.id)
                if earlier is None:
                    seen[skill.id] = skill
                    sources.skills.append(skill)
                    sources.folder_of[skill.id] = folder
                elif earlier != skill:
                    raise ValueError(
                        f"skill {skill.id!r} is in {sources.folder_of[skill.id]} and in {folder} "
                        "with different contents; give only one of them, or re-mine one "
                        "folder so its ids differ"
                    )
        return sources

    def __len__(self) -> int:
        return len(self.skills)
