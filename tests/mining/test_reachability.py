"""Dead code after a removal: found by name from the ABI's entry, left alone by mining."""

from __future__ import annotations

import json
from pathlib import Path

from klineage.gatelog import GateLog
from klineage.kernel import KernelSource
from klineage.lineage import Attempt, AttemptStatus, Simplifier
from klineage.mechanisms import get
from klineage.reachability import live_functions
from klineage.removal import DEAD_CODE, remove_mechanism

ROOT = Path(__file__).resolve().parents[2]

SMALL = """
__device__ float twice(float x) { return 2.0f * x; }
__device__ float thrice(float x) { return 3.0f * x; }
__global__ void used(float* y) { y[threadIdx.x] = twice(y[threadIdx.x]); }
__global__ void unused(float* y) { y[threadIdx.x] = thrice(y[threadIdx.x]); }
__global__ void tabled(float* y) { y[0] = 1.0f; }
typedef void (*Kernel)(float*);
static Kernel table[] = {tabled};
extern "C" int run(float* y) {
  used<<<1, 32>>>(y);
  return 0;
}
"""


def _gemm_states() -> tuple[KernelSource, KernelSource]:
    """gemm_bf16's main path before and after its launch-size dispatch was removed (H200 run)."""
    data = json.loads((ROOT / "skills_out" / "lineages" / "gemm_bf16_nt.json").read_text())
    nodes = {n["fingerprint"]: n for n in data["nodes"]}
    edge = next(
        e for e in data["edges"] if e["chosen"] and e["mechanism"] == "launch_size_dispatch"
    )
    return KernelSource(nodes[edge["parent"]]["source"]), KernelSource(
        nodes[edge["child"]]["source"]
    )


def test_live_functions_follow_calls_launches_and_file_scope_tables() -> None:
    live = live_functions(KernelSource(SMALL))
    assert live == {"run", "used", "twice", "tabled"}
    assert live_functions(KernelSource("__global__ void k(float* y) { y[0] = 0.0f; }")) is None


def test_the_gemm_dispatch_removal_leaves_the_skinny_path_dead() -> None:
    expert = KernelSource.from_file(ROOT / "expert_kernels" / "gemm_bf16" / "kernel.cu")
    assert live_functions(expert) == {f.name for f in expert.parsed.functions}
    before, after = _gemm_states()
    dead = {f.name for f in after.parsed.functions} - (live_functions(after) or set())
    assert {"gemm_skinny", "mma_bf16_16816"} <= dead
    assert live_functions(before) == {f.name for f in before.parsed.functions}


def test_a_mechanism_in_dead_code_is_refused_not_removed() -> None:
    _, after = _gemm_states()
    removal = remove_mechanism(after, get("tensor_core_mma"), live_functions(after))
    assert not removal.changed  # the first walk removed it here, at 0.999x
    dead = {site.function for site, reason in removal.refused if reason == DEAD_CODE}
    assert dead == {"mma_bf16_16816", "gemm_skinny"}  # live wgmma sites: their own reasons
    assert remove_mechanism(after, get("tensor_core_mma")).changed


def _attempt(mechanism: str, parent: KernelSource, child: KernelSource, ratio: float) -> Attempt:
    return Attempt(
        id=f"{parent.fingerprint[:8]}-{mechanism}",
        parent=parent.fingerprint,
        child=child.fingerprint,
        mechanism=mechanism,
        sites=[],
        carriers=[],
        status=AttemptStatus.ACCEPTED,
        gate_status="PASSED",
        ratio=ratio,
        step=3,
    )


def test_the_walk_peels_inside_a_path_before_dropping_it(tmp_path: Path) -> None:
    before, after_dispatch = _gemm_states()
    inside = remove_mechanism(before, get("tensor_core_mma"), live_functions(before))
    assert inside.changed
    simplifier = Simplifier(GateLog(tmp_path / "log.jsonl", None))  # type: ignore[arg-type]
    accepted = [
        (_attempt("launch_size_dispatch", before, after_dispatch, 0.993), after_dispatch),
        (_attempt("tensor_core_mma", before, inside.simplified, 0.95), inside.simplified),
    ]
    chosen, _ = simplifier._choose(accepted, before)
    # the dispatch costs less speed, but removing it first would leave the mma path unmeasured
    assert chosen.mechanism == "tensor_core_mma"
