"""``#pragma unroll [N]`` before a loop in device code.

Unrolling removes the loop's branch and index updates, lets independent iterations' loads
overlap, and turns indexing of small register arrays into fixed registers (without it, a
``float v[4]`` indexed by the loop variable can fall back to local memory).

- remove: delete the ``#pragma unroll`` line (``#pragma unroll 1``, which *forbids*
  unrolling, is not this mechanism and is left alone);
- apply: put ``#pragma unroll`` (or ``#pragma unroll N`` with carrier ``unroll=N``, or an
  expression with ``factor=...``) on its own line before a ``for`` loop that sits directly
  in a block of a device-side function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource, Pragma
from klineage.kernel import KernelSource
from klineage.mechanisms.base import Carrier, Mechanism, Site, register

_LOOPS = ("for_statement", "for_range_loop")


def _factor(pragma: Pragma) -> str:
    """``unroll 4`` -> ``4``; ``unroll (kVec)`` -> ``kVec``; ``unroll`` -> ``""``."""
    text = pragma.argument.strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    return text


def _is_unroll(pragma: Pragma) -> bool:
    return pragma.name == "unroll" and pragma.target is not None and pragma.target.type in _LOOPS


def _pragma_operator_before(source: ParsedSource, loop: Node) -> bool:
    """Whether a masked ``_Pragma("unroll")`` sits right before the loop."""
    previous = loop.prev_sibling
    start = previous.end_byte if previous is not None else source.line_start(loop.start_byte)
    return b"_Pragma" in source.data[start : loop.start_byte]


@register
class PragmaUnroll(Mechanism):
    name = "pragma_unroll"
    category = "compute"
    family = "loop unrolling"
    intent = (
        "Unroll a loop so its branch and index math disappear, independent iterations "
        "overlap, and small register arrays stay in registers."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "unroll": "unroll factor (default: unroll completely)",
        "factor": "the unroll factor as an expression, e.g. a template parameter",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for pragma in source.pragmas:
            if not _is_unroll(pragma) or _factor(pragma) == "1":
                continue
            start = pragma.node.start_byte
            end = start + len(source.text_of(pragma.node).rstrip())
            detail: dict[str, str | int] = {"factor": _factor(pragma)}
            assert pragma.target is not None
            detail["loop_line"] = source.line_of(pragma.target.start_byte)
            yield self.site(source, pragma.node, span=(start, end), detail=detail)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for loop in source.iter_nodes(*_LOOPS):
            function = source.enclosing_function(loop)
            if function is None or not function.runs_on_device:
                continue
            parent = loop.parent
            if parent is None or parent.type != "compound_statement":
                continue  # `if (c) for (...)`: a pragma line there would change the parse
            if source.pragma_before(loop, "unroll") or _pragma_operator_before(source, loop):
                continue
            yield self.site(source, loop, snippet=source.header(loop))

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        node = self.node_at(source, site, "preproc_call")
        return [source.deletion(node, whole_line=True)]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        factor = str(site.detail.get("factor", ""))
        if not factor:
            return Carrier()
        if factor.isdigit():
            return Carrier(unroll=int(factor))
        return Carrier(factor=factor)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        loop = self.node_at(source, site, *_LOOPS)
        unroll = carrier.get_int("unroll")
        factor = carrier.get_str("factor")
        if unroll is not None and factor:
            raise self.refuse("give either unroll or factor, not both", site, "apply")
        chosen = str(unroll) if unroll is not None else (factor or "")
        if chosen == "1":
            raise self.refuse("unroll=1 forbids unrolling; it is not this mechanism", site, "apply")
        line = f"#pragma unroll {chosen}".rstrip()
        return [source.line_insertion(loop, line)]
