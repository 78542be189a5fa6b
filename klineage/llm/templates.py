"""Prompt templates: Markdown files under ``klineage/llm/prompts/``, rendered into messages.

A template holds a header (ignored), then sections that start with a marker line
``<!-- system -->``, ``<!-- user -->`` or ``<!-- assistant -->``; each section becomes one
message. Placeholders are :class:`string.Template` ones (``$kernel``, ``${kernel_name}``);
``$$`` is a literal dollar. Every placeholder must be given a value, and every value must be
used, so a template and its caller cannot drift apart silently.
"""

from __future__ import annotations

import re
import string
from functools import cache
from importlib import resources

from klineage.llm.base import Message

__all__ = ["PROMPT_NAMES", "TemplateError", "render", "template_text"]

PROMPT_NAMES = ("propose_removal", "materialize_skill", "skill_prose")

_MARKER = re.compile(r"^<!--\s*(system|user|assistant)\s*-->\s*$", re.MULTILINE)


class TemplateError(ValueError):
    """A prompt template is missing, malformed, or was given the wrong values."""


@cache
def template_text(name: str) -> str:
    """The raw text of ``prompts/<name>.md`` (shipped as package data)."""
    try:
        file = resources.files("klineage.llm").joinpath("prompts").joinpath(f"{name}.md")
        return file.read_text(encoding="utf-8")
    except (FileNotFoundError, OSError):
        raise TemplateError(
            f"no prompt template {name!r}; have: {', '.join(PROMPT_NAMES)}"
        ) from None


def _placeholders(template: string.Template) -> set[str]:
    names: set[str] = set()
    for match in template.pattern.finditer(template.template):
        name = match.group("named") or match.group("braced")
        if name:
            names.add(name)
        elif match.group("invalid") is not None:
            raise TemplateError(f"stray '$' in a prompt template at offset {match.start()}")
    return names


def render(name: str, **values: str) -> list[Message]:
    """The messages of template ``name`` with ``values`` substituted."""
    text = template_text(name)
    markers = list(_MARKER.finditer(text))
    if not markers:
        raise TemplateError(f"prompt template {name!r} has no <!-- system/user --> sections")
    used: set[str] = set()
    messages: list[Message] = []
    for i, marker in enumerate(markers):
        end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
        template = string.Template(text[marker.end() : end].strip("\n"))
        wanted = _placeholders(template)
        missing = sorted(wanted - set(values))
        if missing:
            raise TemplateError(f"prompt {name!r} needs a value for: {', '.join(missing)}")
        used |= wanted
        content = template.substitute(values).strip() + "\n"
        messages.append(Message(marker.group(1), content))  # type: ignore[arg-type]
    unused = sorted(set(values) - used)
    if unused:
        raise TemplateError(f"prompt {name!r} has no placeholder for: {', '.join(unused)}")
    return messages
