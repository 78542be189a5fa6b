"""Dead code after a removal: found by name from the ABI's entry, left alone by mining."""

from __future__ import annotations

from pathlib import Path

from klineage.cuda.reachability import live_functions, run_by_workloads
from klineage.gate.log import GateLog
from klineage.kernel import KernelSource
from klineage.lineage import Attempt, AttemptStatus
from klineage.mechanisms import get
from klineage.mining.removal import DEAD_CODE, remove_mechanism
from klineage.mining.walk import Simplifier
from klineage.problem import load_problem

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
    """gemm_bf16's expert before and after its launch-size dispatch is removed (the first H200
    walk took that step while the skinny path still held its mma.sync)."""
    expert = KernelSource.from_file(ROOT / "expert_kernels" / "gemm_bf16" / "kernel.cu")
    removal = remove_mechanism(expert, get("launch_size_dispatch"), live_functions(expert))
    assert removal.changed
    return expert, removal.simplified


def test_live_functions_follow_calls_launches_and_file_scope_tables() -> None:
    live = live_functions(KernelSource(SMALL))
    assert live == {"run", "used", "twice", "tabled"}
    assert live_functions(KernelSource("__global__ void k(float* y) { y[0] = 0.0f; }")) is None


BODY_PARAMETER = """
using body_fn = void (*)(float* y);
__device__ void scale_body(float* y) { y[threadIdx.x] *= 2.0f; }
__device__ void shift_body(float* y) { y[threadIdx.x] += 1.0f; }
template <body_fn body>
__global__ void each(float* y) { body(y); }
extern "C" int run(float* y) {
  each<scale_body><<<1, 32>>>(y);
  return 0;
}
"""


def test_a_body_a_launch_binds_to_a_template_parameter_runs() -> None:
    """`each<scale_body><<<...>>>`: the kernel's work is the bound `__device__` body, whose
    name parses as a type in the template argument list; the unbound body stays dead."""
    kernel = KernelSource(BODY_PARAMETER)
    assert live_functions(kernel) == {"run", "each", "scale_body"}
    assert run_by_workloads(kernel, [{}]) == {"run", "each", "scale_body"}


def test_the_gemm_dispatch_removal_leaves_the_skinny_path_dead() -> None:
    before, after = _gemm_states()
    dead = {f.name for f in after.parsed.functions} - (live_functions(after) or set())
    assert {"gemm_skinny", "mma_bf16_16816"} <= dead
    assert live_functions(before) == {f.name for f in before.parsed.functions}  # the expert


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
    gemm = load_problem(ROOT / "expert_kernels" / "gemm_bf16")
    simplifier._workload_axes = [dict(w.axes) for w in gemm.workloads]
    accepted = [
        (_attempt("launch_size_dispatch", before, after_dispatch, 0.993), after_dispatch),
        (_attempt("tensor_core_mma", before, inside.simplified, 0.95), inside.simplified),
    ]
    chosen, _ = simplifier._choose(accepted, before)
    # the dispatch costs less speed, but removing it first would leave the mma path unmeasured
    assert chosen.mechanism == "tensor_core_mma"


def test_softmax_fallback_runs_for_no_workload_until_rows_are_long() -> None:
    softmax = load_problem(ROOT / "expert_kernels" / "softmax")
    expert = KernelSource.from_file(softmax.kernel_path)
    axes = [dict(w.axes) for w in softmax.workloads]  # every row at most 32768 long, aligned
    ran = run_by_workloads(expert, axes) or set()
    assert "softmax_online_rows" not in ran  # where the first walk measured block_per_row
    assert {"run", "softmax_warp_rows", "softmax_block_rows"} <= ran
    longer = run_by_workloads(expert, [*axes, {"rows": 8, "cols": 65536}]) or set()
    assert "softmax_online_rows" in longer
    unaligned = run_by_workloads(expert, [{"rows": 8, "cols": 1001}]) or set()
    assert "softmax_online_rows" in unaligned and "softmax_warp_rows" not in unaligned


def test_a_condition_that_does_not_fold_keeps_both_branches() -> None:
    source = KernelSource(
        """
__global__ void small(float* y) { y[0] = 0.0f; }
__global__ void large(float* y) { y[0] = 1.0f; }
__global__ void never(float* y) { y[0] = 2.0f; }
int query();
extern "C" int run(float* y, int n) {
  if (n < 0) { never<<<1, 1>>>(y); return 1; }
  const int limit = query();
  if (n <= limit) small<<<1, 1>>>(y);
  else large<<<1, 1>>>(y);
  return 0;
}
"""
    )
    ran = run_by_workloads(source, [{"n": 4}]) or set()
    assert {"small", "large"} <= ran and "never" not in ran


def test_the_walk_refuses_block_per_row_where_no_softmax_workload_runs(tmp_path: Path) -> None:
    from klineage.lineage import LineageGraph

    softmax = load_problem(ROOT / "expert_kernels" / "softmax")
    expert = KernelSource.from_file(softmax.kernel_path)
    simplifier = Simplifier(GateLog(tmp_path / "log.jsonl", None))  # type: ignore[arg-type]
    simplifier._workload_axes = [dict(w.axes) for w in softmax.workloads]
    lineage = LineageGraph(softmax.name)
    removals = {r.mechanism.name: r for r in simplifier._removals(lineage, expert, 0)}
    refused = [r for r in lineage.meta.refusals if r.mechanism == "block_per_row"]
    assert "block_per_row" not in removals
    [dead] = [r.reason for r in refused if "none of the workloads runs" in r.reason]
    assert dead.startswith("softmax_online_rows:")


def test_a_value_set_in_one_unknown_branch_does_not_leak_into_the_other() -> None:
    source = KernelSource(
        """
__global__ void a(float* y) { y[0] = 0.0f; }
__global__ void b(float* y) { y[0] = 1.0f; }
int query();
extern "C" int run(float* y, int n) {
  int mode = 0;
  if (query() > 0) { const int mode = 1; (void)mode; } else { if (mode == 0) a<<<1, 1>>>(y); }
  if (mode == 1) b<<<1, 1>>>(y);
  return 0;
}
"""
    )
    ran = run_by_workloads(source, [{"n": 4}]) or set()
    # the else branch sees the outer mode == 0, not the then-branch's; after the if, mode is
    # unknown, so b may run
    assert {"a", "b"} <= ran


def test_the_walk_defers_a_removal_that_strands_another_mechanism(tmp_path: Path) -> None:
    """At the softmax state where fast_math, block_per_row, online softmax and the warp
    shuffles can all go (H200 lineage), removing online softmax leaves block_per_row's live
    site refused and removing the warp shuffles leaves online softmax's refused; fast_math and
    block_per_row strand nothing, so they go first, cheapest first. (The first H200 walk took
    online softmax here; the committed re-mined walk took fast_math, then block_per_row.)"""
    from klineage.lineage import LineageGraph

    softmax = load_problem(ROOT / "expert_kernels" / "softmax")
    lineage = LineageGraph.load(ROOT / "skills_out" / "lineages" / "softmax_rows_f32.json")
    four = {"block_per_row", "fast_math", "online_softmax", "warp_shuffle_reduction"}

    def accepted_at(parent: str) -> list[tuple[Attempt, KernelSource]]:
        return [
            (a, KernelSource(lineage.state(a.child).source))
            for a in lineage.attempts_from(parent)
            if a.status is AttemptStatus.ACCEPTED
        ]

    step = next(
        a for a in lineage.main_path() if {b.mechanism for b, _ in accepted_at(a.parent)} == four
    )
    current = KernelSource(lineage.state(step.parent).source)
    accepted = accepted_at(step.parent)
    simplifier = Simplifier(GateLog(tmp_path / "log.jsonl", None))  # type: ignore[arg-type]
    simplifier._workload_axes = [dict(w.axes) for w in softmax.workloads]
    removable = simplifier._live_status(current, refused_only=False)
    children = {a.mechanism: child for a, child in accepted}
    assert simplifier._closes("online_softmax", removable, children["online_softmax"]) == {
        "block_per_row"
    }
    assert simplifier._closes(
        "warp_shuffle_reduction", removable, children["warp_shuffle_reduction"]
    ) == {"online_softmax"}
    # block_per_row takes the warp shuffles with it: gone, not stranded
    assert simplifier._closes("block_per_row", removable, children["block_per_row"]) == set()
    chosen, _ = simplifier._choose(accepted, current)
    assert chosen.mechanism == "fast_math"  # the first H200 walk took online_softmax here
    without_fast_math = [pair for pair in accepted if pair[0].mechanism != "fast_math"]
    chosen, _ = simplifier._choose(without_fast_math, current)
    assert chosen.mechanism == "block_per_row"
