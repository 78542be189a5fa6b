"""Register fragment streaming: tensor-core operands loaded from global memory straight into
registers, with no shared-memory staging.

For skinny products (a handful of rows of A against a large B, as in LLM decoding) each
element of B is used once, so staging it through shared memory buys no reuse: a kernel loads
B with wide read-once loads directly into the registers of an MMA fragment, many loads in
flight, and reduces across warps at the end.

- detect: a kernel that issues tensor-core MMA (`mma.sync`, or a call of a device function
  whose body does) and whose operands come from global-memory loads (`__ldg`, `__ldcs`,
  `__ldcg`, `__ldlu`, `__ldcv`), directly or through helpers, while the kernel stages nothing
  for them (no ldmatrix, cp.async or wgmma; a shared buffer that only combines the warps'
  partial sums is allowed); the site spans the kernel;
- remove and apply: refused. Staging the operands through shared memory (or the reverse)
  re-tiles the kernel: the fragment layout, the loads and the cross-warp reduction change
  together, which rules do not do.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from klineage.conditions import ArchAtLeast, Condition, Prose
from klineage.cuda.analysis import analysis
from klineage.cuda.source import Function, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms.base import DetectOnly, Site, register
from klineage.problem import Problem

REFUSAL = (
    "moving tensor-core operands between global-to-register streaming and shared-memory "
    "staging re-tiles the kernel (fragments, loads and the reduction change together), "
    "which rules do not do"
)
_MMA = re.compile(r"\bmma\.sync\b")
_STAGING_PTX = frozenset(
    {"ldmatrix", "cp_async", "cp_async_commit", "cp_async_wait", "wgmma", "tma_load"}
)
_STREAM = re.compile(r"\b__ld(g|cs|cg|lu|cv)\s*\(")


def _mma_functions(source: ParsedSource) -> set[str]:
    """Device functions whose body issues mma.sync (directly)."""
    names = set()
    for function in source.functions:
        if function.body is not None and _MMA.search(source.text_of(function.body)):
            names.add(function.name)
    return names


def _stages_operands(source: ParsedSource, kernel: Function) -> bool:
    """Whether a kernel stages operands through shared memory: it (or a helper it calls)
    issues ldmatrix, cp.async, wgmma or TMA copies, or stores global values into shared
    memory."""
    model = analysis(source)
    if model.call_graph.summary(kernel.name).ptx & _STAGING_PTX:
        return True
    return bool(model.shared(kernel).copies)


def _streams_into_mma(source: ParsedSource, kernel: Function, mma: set[str]) -> bool:
    if kernel.body is None:
        return False
    body = source.text_of(kernel.body)
    issues_mma = bool(_MMA.search(body)) or any(re.search(rf"\b{n}\s*\(", body) for n in mma)
    # staged kernels feed fragments from shared memory (ldmatrix, cp.async or TMA tiles, or
    # tiles stored from global memory, in the kernel or its helpers); a shared buffer used only
    # to combine the warps' partial sums at the end does not count
    if not issues_mma or _stages_operands(source, kernel):
        return False
    helpers = [f for f in source.functions if f.body is not None and f.name != kernel.name]
    loads = _STREAM.search(body) or any(
        _STREAM.search(source.text_of(f.body)) and re.search(rf"\b{f.name}\s*\(", body)
        for f in helpers
    )
    return bool(loads)


@register
class RegisterFragmentStreaming(DetectOnly):
    name = "register_fragment_streaming"
    refusal = REFUSAL
    category = "memory"
    family = "tensor-core MMA vs scalar FMA"
    intent = (
        "Stream read-once tensor-core operands from global memory straight into MMA "
        "fragments, skipping shared memory, when the product has too few rows to reuse them."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        mma = _mma_functions(source)
        for kernel in source.kernels:
            if _streams_into_mma(source, kernel, mma):
                yield self.site(
                    source,
                    kernel.node,
                    snippet=f"{kernel.name}: MMA operands loaded from global memory",
                    detail={"kernel": kernel.name},
                    refusal=REFUSAL,
                )

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            ArchAtLeast(sm=80, why="bf16 mma.sync"),
            Prose(text="the operand streamed is read once (few rows of the other operand)"),
        ]
