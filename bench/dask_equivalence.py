"""The Dask executor against the local one on one GPU: the same verdicts, and what a gate run
costs in scheduling (issue 20). Needs a CUDA GPU, nvcc, torch and the `dask` extra; the Dask
side is what `--executor dask` starts on this host (dask-cuda's LocalCUDACluster where
installed, else one worker process per GPU from distributed alone).

    python bench/dask_equivalence.py mine [--problem expert_kernels/softmax]
    python bench/dask_equivalence.py replay [--skills skills_out] [--budget 10] [PROBLEM_DIR...]

Each part runs the same job twice from an empty gate log, with the local executor on GPU 0
and then through Dask on the same GPU, and merges into `--out` (default
bench/results/dask_equivalence.json): wall times, gate runs, the verdicts compared one by one
(mining: every attempt's mechanism, kernel and status; replay: every gate run's action and
outcome per problem and method), and per worker the gate runs, their time on the worker and
the time outside it (scheduling and transfers), the overhead the issue asks to keep under 5%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # _environment, also when a test loads this file

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.executors import Executor, LocalExecutor  # noqa: E402
from klineage.lineage import LineageGraph  # noqa: E402
from klineage.replay.results import ReplayBudget  # noqa: E402
from klineage.replay.run import ReplayReport  # noqa: E402

HELDOUT = ["gelu", "row_sum", "l2_normalize", "cast_f32_to_bf16", "bias_relu"]
"""Five held-out problems the skills improve, cheap to gate."""


def attempts_of(lineage: LineageGraph) -> list[tuple[str, str, str, str]]:
    """Every attempt as (parent, child, mechanism, status), sorted."""
    return sorted((a.parent, a.child, a.mechanism, a.status.value) for a in lineage.attempts())


def compare_lineages(local: LineageGraph, dask: LineageGraph) -> dict[str, Any]:
    """Attempts both made with the same status, those only one made, the kernels both gated
    whose verdicts differ, and the main paths."""
    ours, theirs = set(attempts_of(local)), set(attempts_of(dask))
    status_ours = {attempt[:3]: attempt[3] for attempt in ours}
    status_theirs = {attempt[:3]: attempt[3] for attempt in theirs}
    both = status_ours.keys() & status_theirs.keys()
    return {
        "attempts_local": len(ours),
        "attempts_dask": len(theirs),
        "same_verdict": len(ours & theirs),
        "both_made": len(both),
        "verdicts_differ": sorted(
            [*key, status_ours[key], status_theirs[key]]
            for key in both
            if status_ours[key] != status_theirs[key]
        ),
        "only_local": sorted(ours - theirs),
        "only_dask": sorted(theirs - ours),
        "main_path_local": [a.mechanism for a in local.main_path()],
        "main_path_dask": [a.mechanism for a in dask.main_path()],
        "identical": ours == theirs and local.meta.final == dask.meta.final,
    }


def compare_replays(local: ReplayReport, dask: ReplayReport) -> dict[str, Any]:
    """Per problem and method: the gate runs' actions and outcomes, and the speedups."""
    rows = []
    theirs = {(r.problem, r.method): r for r in dask.results}
    for ours in local.results:
        other = theirs[(ours.problem, ours.method)]
        runs_ours = [(r.action, r.outcome) for r in ours.runs]
        runs_theirs = [(r.action, r.outcome) for r in other.runs]
        # the gate's status is the verdict; kept or slower is also a timing against the state
        statuses_ours = [(r.action, r.gate_status) for r in ours.runs]
        statuses_theirs = [(r.action, r.gate_status) for r in other.runs]
        rows.append(
            {
                "problem": ours.problem,
                "method": ours.method,
                "same_verdicts": statuses_ours == statuses_theirs,
                "same_runs": runs_ours == runs_theirs,
                "outcomes_local": [r.outcome for r in ours.runs],
                "outcomes_dask": [r.outcome for r in other.runs],
                "same_final": ours.final == other.final,
                "speedup_local": round(ours.speedup, 4),
                "speedup_dask": round(other.speedup, 4),
            }
        )
    return {"rows": rows, "identical": all(r["same_runs"] and r["same_final"] for r in rows)}


def workers_of(executor: Executor) -> list[dict[str, Any]]:
    """Per worker: gate runs, seconds on the worker and outside it, the overhead share."""
    return [
        {
            "worker": w.worker,
            "gate_runs": w.gate_runs,
            "builds": w.builds,
            "busy_seconds": round(w.busy_seconds, 3),
            "overhead_seconds": round(w.overhead_seconds, 3),
            "overhead_per_gate_run_ms": round(1e3 * w.overhead_seconds / max(1, w.gate_runs), 2),
            "overhead_share": round(w.overhead_share, 5),
        }
        for w in executor.tally.workers()
    ]


@contextlib.contextmanager
def executor_on_gpu0(name: str, part: dict[str, Any]) -> Iterator[Executor]:
    """`local` or `dask` on GPU 0, its wall time and tasks per worker kept in `part[name]`."""
    from klineage.executors.dask_cluster import DaskExecutor

    started = time.perf_counter()
    with LocalExecutor([0]) if name == "local" else DaskExecutor(devices=[0]) as executor:
        yield executor
        part[name] = {
            "executor": executor.describe(),
            "wall_seconds": round(time.perf_counter() - started, 1),
            "workers": workers_of(executor),
        }


@contextlib.contextmanager
def following(lineage: LineageGraph | None) -> Iterator[None]:
    """While open, the walk takes, among the removals the gate accepted from a state, the one
    `lineage` took from that state. Which accepted removal goes first is ranked by measured
    cost, and two runs on one executor already split on removals whose costs lie within the
    timing noise; the executors' comparison is about verdicts, so the second run is held to
    the first one's choices (a removal the first run did not take is ranked as usual)."""
    from klineage.mining.walk import Simplifier

    if lineage is None:
        yield
        return
    taken = {(attempt.parent, attempt.child) for attempt in lineage.main_path()}
    original = Simplifier._choose

    def choose(self: Simplifier, accepted: list[tuple[Any, Any]], current: Any) -> tuple[Any, Any]:
        for pair in accepted:
            if (pair[0].parent, pair[0].child) in taken:
                return pair
        return original(self, accepted, current)

    Simplifier._choose = choose  # type: ignore[method-assign]
    try:
        yield
    finally:
        Simplifier._choose = original  # type: ignore[method-assign]


def run_mine(problem: str, work: Path, *, follow: bool = True) -> dict[str, Any]:
    from klineage.mining.mine import mine

    part: dict[str, Any] = {"problem": problem, "dask_follows_local_choices": follow}
    lineages: dict[str, LineageGraph] = {}
    for name in ("local", "dask"):
        held = lineages.get("local") if follow else None
        with executor_on_gpu0(name, part) as executor, following(held):
            report = mine(problem, work / name, executor=executor, resume=False)
        part[name]["report"] = report.model_dump(mode="json", exclude={"folder"})
        lineages[name] = LineageGraph.load(work / name / "lineages" / f"{report.problem}.json")
    part["comparison"] = compare_lineages(lineages["local"], lineages["dask"])
    return part


Decision = tuple[bool, float | None]
"""What the keep rule made of a verdict: kept, and the ratio the choice among carriers used."""


@contextlib.contextmanager
def keep_decisions(decisions: dict[tuple[str, ...], Decision], *, hold: bool) -> Iterator[None]:
    """While open, replay's keep rule and its choice among kept carriers are recorded into
    `decisions` per (problem, method, state, kernel), or, with `hold`, taken from them for a
    kernel the gate passed. Both rest on timings (faster by the keep ratio in every trial, the
    fastest carrier), and a kernel within the noise of the ratio is kept in one run and not in
    the next on the same executor; the executors' comparison is about verdicts, so the second
    run takes the first one's decisions on the kernels both gated."""
    from klineage.replay.methods import ForwardSearch

    def key(search: ForwardSearch, verdict: Any) -> tuple[str, ...]:
        state = verdict.baseline_fingerprint or ""
        return (search.problem.name, search.name, state, verdict.fingerprint)

    accepts, choose = ForwardSearch.accepts, ForwardSearch.choose

    def held_accepts(self: ForwardSearch, verdict: Any) -> bool:
        kept = accepts(self, verdict)
        if hold and verdict.passed and key(self, verdict) in decisions:
            return decisions[key(self, verdict)][0]
        ratio = verdict.comparison.ratio if verdict.comparison is not None else None
        decisions.setdefault(key(self, verdict), (kept, ratio))
        return kept

    def held_choose(self: ForwardSearch, state: Any, accepted: Any) -> Any:
        if not hold:
            return choose(self, state, accepted)

        def ratio(one: Any) -> float:
            held = decisions.get(key(self, one.verdict), (True, None))[1]
            return held if held is not None else one.verdict.comparison.ratio

        return max(accepted, key=ratio)

    ForwardSearch.accepts = held_accepts  # type: ignore[method-assign]
    ForwardSearch.choose = held_choose  # type: ignore[method-assign]
    try:
        yield
    finally:
        ForwardSearch.accepts = accepts  # type: ignore[method-assign]
        ForwardSearch.choose = choose  # type: ignore[method-assign]


def run_replay(
    problems: list[str], skills: str, budget: int, work: Path, *, follow: bool = True
) -> dict[str, Any]:
    from klineage.replay.run import replay

    part: dict[str, Any] = {
        "problems": problems,
        "skills": skills,
        "budget": budget,
        "dask_follows_local_keep_decisions": follow,
    }
    reports = {}
    decisions: dict[tuple[str, ...], Decision] = {}
    for name in ("local", "dask"):
        hold = follow and name == "dask"
        with executor_on_gpu0(name, part) as executor, keep_decisions(decisions, hold=hold):
            reports[name] = replay(
                problems,
                skills,
                work / name,
                executor=executor,
                methods=["skills", "blind"],
                budget=ReplayBudget(gate_runs=budget),
                resume=False,
            )
    part["comparison"] = compare_replays(reports["local"], reports["dask"])
    return part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["mine", "replay"])
    parser.add_argument("problems", nargs="*", help="replay's problem folders")
    parser.add_argument("--problem", default="expert_kernels/softmax", help="mine's problem")
    parser.add_argument("--skills", default="skills_out")
    parser.add_argument("--budget", type=int, default=10, help="replay's gate runs per method")
    parser.add_argument(
        "--free",
        action="store_true",
        help="let the Dask run decide by its own timings what the local run decided by its "
        "timings (mining: which accepted removal goes first; replay: keep or not, which "
        "carrier); by default it takes the local run's decisions, see `following` and "
        "`keep_decisions`",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/dask_equivalence.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dask-equivalence-") as tmp:
        if args.part == "mine":
            part = run_mine(args.problem, Path(tmp), follow=not args.free)
        else:
            chosen = args.problems or [f"heldout/{name}" for name in HELDOUT]
            part = run_replay(chosen, args.skills, args.budget, Path(tmp), follow=not args.free)
    part["command"] = command_line(sys.argv)
    part["gpu"] = nvidia_smi()
    kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
    kept[f"{args.part}_free" if args.free else args.part] = part
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(kept, indent=1) + "\n")
    print(json.dumps(part["comparison"], indent=1)[:2000])
    for name in ("local", "dask"):
        print(name, part[name]["wall_seconds"], "s", part[name]["workers"])


if __name__ == "__main__":
    main()
