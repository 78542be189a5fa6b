"""A rule that fails on someone else's code is skipped at that state, not fatal: the walk
goes on with the others, and the lineage keeps the fault as a refusal naming the rule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from klineage.cuda.source import ParsedSource
from klineage.gate.log import GateLog
from klineage.kernel import KernelSource
from klineage.lineage import LineageGraph
from klineage.mechanisms import Site, get
from klineage.mechanisms.pragma_unroll import PragmaUnroll
from klineage.mining.walk import Simplifier

KERNEL = """\
__global__ void scale(float* __restrict__ y, const float* __restrict__ x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
#pragma unroll 4
  for (int k = 0; k < 4; ++k) y[i] += x[i] * k;
}
"""


class _FailingRule(PragmaUnroll):
    """A rule with a bug: its detection raises on this code (a test double of a faulty rule,
    never registered)."""

    name = "failing_rule_stand_in"

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        raise IndexError("list index out of range")


def test_a_failing_rule_is_skipped_and_its_fault_recorded(tmp_path: Path) -> None:
    kernel = KernelSource(KERNEL)
    simplifier = Simplifier(
        GateLog(tmp_path / "log.jsonl", None),  # type: ignore[arg-type]
        mechanisms=[_FailingRule(), get("pragma_unroll"), get("restrict_pointers")],
    )
    lineage = LineageGraph("scale")
    removals = simplifier._removals(lineage, kernel, 0)
    # the other rules still removed what they know
    assert {r.mechanism.name for r in removals} == {"pragma_unroll", "restrict_pointers"}
    (fault,) = [r for r in lineage.refusals if r.mechanism == "failing_rule_stand_in"]
    assert fault.reason.startswith("internal error in the rule's removal (IndexError: list index")
    assert simplifier._detected(kernel) == ["pragma_unroll", "restrict_pointers"]
    assert list(simplifier.rule_faults) == [("failing_rule_stand_in", kernel.fingerprint)]
