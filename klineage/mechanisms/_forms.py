"""A site found by the analysis layer in a form its mechanism's rewrite does not take.

Mechanisms rebuilt on :mod:`klineage.cuda.analysis` recognize an optimization by what the code
does, in every spelling; the rewrite often exists for one canonical form only. A
:class:`FoundForm` is such a site: where it is, and in words what form it is in and what
form the rewrite would need, which together are its refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.source import Function, Node
from klineage.cuda.tree import NotInForm

__all__ = ["FoundForm"]


@dataclass(frozen=True)
class FoundForm:
    """A place where a mechanism is present, in a form no rule rewrites yet."""

    node: Node
    function: Function
    form: str
    """What the site is, in words: "a grid-stride `while` loop over gridDim.x ..."."""
    needed: str
    """The form the mechanism's rewrite takes."""

    @property
    def refusal(self) -> str:
        return str(NotInForm(self.form, self.needed))
