"""The mechanism base shared by ``block_per_row`` and ``warp_per_row``: a group of threads
(a block or a warp) per row against one thread per row. See
:mod:`klineage.mechanisms._rows_forms` for the analyses and the rewrites (and the modules it
names), and :mod:`klineage.mechanisms._row_layout_forms` for the other spellings, found by the
index analysis and refused with their form."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import AxisAtMost, BlockSizeAtMost, BlockSizeMultiple, Condition
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_of
from klineage.cuda.source import Function, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._block_rows_cg import cg_block_rows
from klineage.mechanisms._block_rows_cg_forward import CG_ROWS
from klineage.mechanisms._reductions_util import call_name, fold, inside
from klineage.mechanisms._row_layout_forms import row_layout_forms
from klineage.mechanisms._rows_forms import Group, NotCanonical
from klineage.mechanisms._rows_removal import group_rows
from klineage.mechanisms._rows_spread import MergeReduction, merge_reductions, spread_rows
from klineage.mechanisms._rows_thread import thread_rows, thread_rows_shape
from klineage.mechanisms.base import Carrier, Mechanism, Site
from klineage.problem import Problem

DEFAULT_BLOCK = 256
MAX_BLOCK = 1024
MAX_GRID = 2**31 - 1


class RowLayoutMechanism(Mechanism):
    """Rows spread over a group of threads (present) or one thread per row (absent)."""

    group: ClassVar[Group]
    fills_threads = True
    spreads_loop = "lanes"
    carrier_keys: ClassVar[dict[str, str]] = {
        "block_size": f"threads per block, a multiple of 32 up to {MAX_BLOCK} "
        f"(default {DEFAULT_BLOCK})",
        "merge_variable": "a user-typed accumulator (online softmax's max and sum) the "
        "removed block reduction combined",
        "merge_reduction": "that reduction as written (its merge and identity), to put back",
        "merge_scratch": "the __shared__ declaration it publishes through",
    }

    def detected(self, source: ParsedSource, kernel: Function) -> bool:
        raise NotImplementedError

    def _site(self, source: ParsedSource, kernel: Function, refusal: str | None) -> Site:
        assert kernel.body is not None
        header = source.snippet((kernel.outer.start_byte, kernel.body.start_byte))
        return self.site(
            source,
            kernel.node,
            span=(kernel.outer.start_byte, kernel.outer.end_byte),
            kind="function_definition",
            snippet=header,
            detail={"kernel": kernel.name},
            refusal=refusal,
        )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        seen: set[str] = set()
        for kernel in source.kernels:
            if kernel.body is None or not self.detected(source, kernel):
                continue
            seen.add(kernel.name)
            refusal = None
            try:
                self._group_rows(source, kernel)
            except NotCanonical as why:
                refusal = str(why)
            yield self._site(source, kernel, refusal)
        for form in row_layout_forms(source, self.group, seen):
            seen.add(form.function.name)
            refusal = form.refusal if self._cg_form(source, form.function) is None else None
            yield self._site(source, form.function, refusal)
        for kernel in source.kernels:
            if kernel.name not in seen and self._cg_form(source, kernel) is not None:
                yield self._site(source, kernel, None)

    def _cg_form(self, source: ParsedSource, kernel: Function) -> list[Edit] | None:
        """The removal of a block per row in the cooperative-groups spelling, if ``kernel``
        is one (:mod:`klineage.mechanisms._block_rows_cg`)."""
        if self.group != "block" or kernel.body is None:
            return None
        try:
            return cg_block_rows(source, kernel)
        except NotCanonical:
            return None

    def _group_rows(self, source: ParsedSource, kernel: Function) -> list[Edit]:
        """The canonical removal, else the cooperative-groups one, else the canonical rule's
        refusal."""
        try:
            return group_rows(source, kernel, self.group).edits
        except NotCanonical:
            edits = self._cg_form(source, kernel)
            if edits is None:
                raise
            return edits

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for kernel in source.kernels:
            if kernel.body is None or thread_rows_shape(source, kernel) is None:
                continue
            if not _loops_over_rows(source, kernel):
                continue  # one element per thread: nothing to spread over a group
            refusal = None
            try:
                thread_rows(source, kernel, self.group)
            except NotCanonical as why:
                refusal = str(why)
            yield self._site(source, kernel, refusal)

    def _kernel(self, source: ParsedSource, site: Site) -> Function:
        for kernel in source.kernels:
            if (kernel.outer.start_byte, kernel.outer.end_byte) == (site.start_byte, site.end_byte):
                return kernel
        raise self.refuse(f"no kernel at line {site.start_line}", site)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        try:
            return self._group_rows(source, self._kernel(source, site))
        except NotCanonical as why:
            raise self.refuse(str(why), site) from None

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        block = carrier.get_int("block_size", DEFAULT_BLOCK) or DEFAULT_BLOCK
        if block % 32 or not 32 <= block <= MAX_BLOCK:
            raise self.refuse(
                f"block_size={block} is not a multiple of 32 in 32..{MAX_BLOCK}", site, "apply"
            )
        merges = []
        variable = carrier.get_str("merge_variable")
        text, scratch = carrier.get_str("merge_reduction"), carrier.get_str("merge_scratch")
        if variable and text and scratch:
            merges.append(MergeReduction(variable, text, scratch))
        try:
            rows = thread_rows(source, self._kernel(source, site), self.group)
            return spread_rows(source, rows, self.group, block, merges)
        except NotCanonical as why:
            raise self.refuse(str(why), site, "apply") from None

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        return Carrier(block_size=DEFAULT_BLOCK)

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        sizes = {fold(source, launch.block) for launch in source.launches_of(site.function)}
        size = sizes.pop() if len(sizes) == 1 else None
        if size is None and site.function:  # a named local (`const int block_size = 1024;`)
            common = block_size_of(source, site.function)
            size = int(common) if common is not None and common.isdigit() else None
        extra: dict[str, str] = {}
        kernel_function = source.function(site.function) if site.function else None
        found = merge_reductions(source, kernel_function) if kernel_function else []
        if len(found) == 1 and self.group == "block":  # carried for the round trip
            extra = {
                "merge_variable": found[0].variable,
                "merge_reduction": found[0].text,
                "merge_scratch": found[0].scratch,
            }
        return Carrier(block_size=size, **extra) if size is not None else Carrier(**extra)

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        is_candidate = any(c.id == site.id for c in self.candidates(kernel))
        # a candidate gets the carrier's block, save the cg form's, whose launch keeps its own
        keeps = site.detail.get("form") == CG_ROWS
        block = (
            str(DEFAULT_BLOCK)
            if is_candidate and not keeps
            else block_size_of(source, site.function)
        )
        found: list[Condition] = [
            BlockSizeMultiple(
                k=32,
                block_size=block,
                why=f"the {self.group} reduction uses full-mask warp shuffles",
            ),
            BlockSizeAtMost(n=MAX_BLOCK, block_size=block, why="a block has at most 1024 threads"),
        ]
        rows = self._row_axis(source, site)
        if rows is not None and self.group == "block":
            found.append(
                AxisAtMost(axis=rows, n=MAX_GRID, why="one block per row: the grid holds every row")
            )
        return found

    def _row_axis(self, source: ParsedSource, site: Site) -> str | None:
        """The axis that counts rows, when the launch passes it by name."""
        try:
            kernel = self._kernel(source, site)
        except Exception:
            return None
        shape = thread_rows_shape(source, kernel)
        if shape is None:
            return None
        bound = shape[3]
        if bound.type != "identifier":
            return None
        index = next(
            (i for i, p in enumerate(kernel.params) if p.name == source.text_of(bound)), None
        )
        for launch in source.launches_of(kernel):
            if index is not None and index < len(launch.args):
                arg = launch.args[index]
                if arg.type == "identifier":
                    return source.text_of(arg)
        return None


def _loops_over_rows(source: ParsedSource, kernel: Function) -> bool:
    """Whether the kernel, or a helper it calls, loops (a row a helper walks counts)."""
    assert kernel.body is not None
    if inside(source, kernel.body, "for_statement"):
        return True
    for call in inside(source, kernel.body, "call_expression"):
        helper = source.function(call_name(source, call) or "")
        body = helper.body if helper is not None and helper != kernel else None
        if body is not None and inside(source, body, "for_statement", "while_statement"):
            return True
    return False
