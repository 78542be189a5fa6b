"""A site found by the analysis layer in a form its mechanism's rewrite does not take.

Mechanisms rebuilt on :mod:`klineage.cuda.analysis` recognize an optimization by what the code
does, in every spelling; the rewrite often exists for one canonical form only. A
:class:`FoundForm` is such a site: where it is, and in words what form it is in and what
form the rewrite would need, which together are its refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm

if TYPE_CHECKING:
    from klineage.mechanisms.base import Mechanism, Site

__all__ = ["FoundForm", "form_site", "removable_form_site"]


@dataclass(frozen=True)
class FoundForm:
    """A place where a mechanism is present, in a form no rule rewrites yet."""

    node: Node
    function: Function
    form: str
    """What the site is, in words: "a grid-stride `while` loop over gridDim.x ..."."""
    needed: str
    """The form the mechanism's rewrite takes."""
    kind: str = ""
    """Which of the mechanism's own forms the site is in, where a removal may take it
    (``once``: a tile staged once); empty when none does."""

    @property
    def refusal(self) -> str:
        return str(NotInForm(self.form, self.needed))


def form_site(mechanism: Mechanism, source: ParsedSource, form: FoundForm) -> Site:
    """The refused site of ``form``: its node, its header as the snippet (a loop without its
    body), the kernel and ``form=analysis`` in the detail."""
    return mechanism.site(
        source,
        form.node,
        snippet=source.header(form.node),
        detail={"kernel": form.function.name, "form": "analysis"},
        refusal=form.refusal,
    )


def removable_form_site(
    mechanism: Mechanism,
    source: ParsedSource,
    form: FoundForm,
    removal: Callable[[ParsedSource, Function, Node], object],
    name: str,
    reading: str,
) -> Site:
    """The site of ``form`` when a removal of the mechanism's own may take it: supported, with
    ``form=name`` in the detail, when ``removal`` takes it (raises nothing); else refused
    with its form and, after ``reading`` ("as a tile staged once"), why ``removal`` did not."""
    site = form_site(mechanism, source, form)
    try:
        removal(source, form.function, form.node)
    except NotInForm as why:
        return site.model_copy(update={"refusal": f"{site.refusal} ({reading}, it is {why.form})"})
    return site.model_copy(update={"refusal": None, "detail": {**site.detail, "form": name}})
