"""Vector accesses a kernel makes through a helper its header defines (llm.c's ``load128``
in a shared ``common.h``): the optimization is in the header, which rules do not edit, so
each call is a site that says so, and how to mine it instead."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.vectors import VectorHelper
from klineage.cuda.source import Node, ParsedSource, call_name


@dataclass(frozen=True)
class HeaderHelperCall:
    """A call of a header's vector load or store helper."""

    call: Node
    helper: VectorHelper
    header: str
    """The header's file name."""

    @property
    def refusal(self) -> str:
        return (
            f"the {self.helper.bytes}-byte {self.helper.kind} is in {self.helper.name}, which "
            f"{self.header} defines; rules edit the kernel's own file, not its headers: make "
            "its problem with `klineage new --inline-headers` (the header written into "
            "kernel.cu) to mine it"
        )


def header_helper_calls(source: ParsedSource) -> list[HeaderHelperCall]:
    """Calls in ``source`` of vector helpers that only a local header defines."""
    if not source.headers:
        return []
    own = {function.name for function in source.functions}
    homes: dict[str, str] = {}
    for header in source.headers:
        for function in header.functions:
            homes.setdefault(function.name, header.kernel.name)
    helpers = analysis(source).vectors.helpers
    found = []
    for call in source.nodes("call_expression"):
        name = call_name(source, call) or ""
        helper = helpers.get(name)
        if helper is not None and name not in own and name in homes:
            found.append(HeaderHelperCall(call, helper, homes[name]))
    return found
