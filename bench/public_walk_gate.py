"""Check on the GPU what the public walks write: every state a removal leaves and, where the
forward rule applies again, the kernel it writes back, each checked on every workload of its
public problem against the PyTorch reference (no timing: correctness is card-independent).

    python bench/public_walk_gate.py --out bench/results/public_walk_gate.json [--build-only]

`bench/public_walk_reach.py` says on the CPU that a removal takes a site and that the forward
rule applies there again; this says whether both kernels still compute the problem: a wrong
removal would be mined as a skill with a false "before", a wrong forward rule would be replay
gate runs lost on a kernel the gate rejects. The walk is `plan_walk`'s (the same removals in
the same order); only the git-ignored kernels already in bench/public are used. With
`--build-only` (no GPU) every state is built under its problem's compile options instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _environment import nvidia_smi

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mining.plan import MAX_STEPS, plan_walk
from klineage.mining.removal import reapply, remove_mechanism
from klineage.problem import Problem, load_problem

PUBLIC = Path(__file__).resolve().parent / "public"


def walk_states(kernel: KernelSource) -> Iterator[tuple[str, str, KernelSource]]:
    """(mechanism, role, kernel) along the walk: the state each removal leaves ("removed"),
    then the forward rule's kernel written back from it ("forward"), where it applies."""
    plan, _ = plan_walk(kernel, max_steps=MAX_STEPS)
    for step in plan.steps:
        removal = remove_mechanism(kernel, get(step.mechanism))
        yield step.mechanism, "removed", removal.simplified
        forward = None
        if step.transferable:
            try:
                forward = reapply(removal)
            except MechanismRefused:
                forward = None  # the plan said it applies: a difference shows as a missing row
        if forward is not None:
            yield step.mechanism, "forward", forward
        kernel = removal.simplified


def judged(gate: Any, builder: Builder, problem: Problem, kernel: KernelSource) -> dict[str, Any]:
    """A row for one kernel: its build, or its check on every workload (`gate` None: build)."""
    started = time.perf_counter()
    if gate is None:
        built = builder.with_options(problem.compile_options).build(kernel.text, kernel.name)
        status, failure = ("BUILT" if built.ok else "BUILD_FAILED"), built.message[:300]
    else:
        verdict = gate.run(problem, kernel, time_it=False)
        failed = [w for w in verdict.workloads if not w.passed]
        status = verdict.status.value
        failure = (
            f"{failed[0].label}: {failed[0].message[:300]}"
            if failed
            else ""
            if verdict.build.ok
            else verdict.build.message[:300]
        )
    seconds = round(time.perf_counter() - started, 2)
    return {"status": status, "failure": failure, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--public", type=Path, default=PUBLIC)
    parser.add_argument("--build-only", action="store_true", help="no GPU: build every state")
    parser.add_argument("experts", nargs="*", help="folder names (default: every one present)")
    args = parser.parse_args()
    present = sorted(p.parent for p in args.public.glob("*/steps.json"))
    folders = [
        folder
        for folder in present
        if (folder / "kernel.cu").is_file() and (not args.experts or folder.name in args.experts)
    ]
    builder = Builder()
    rows: list[dict[str, Any]] = []
    jobs = []
    for folder in folders:
        problem = load_problem(folder)
        expert = KernelSource.from_file(folder / "kernel.cu")
        for mechanism, role, kernel in walk_states(expert):
            named = KernelSource(kernel.text, name=f"{folder.name}.{mechanism}.{role}.cu")
            jobs.append((folder.name, problem, mechanism, role, named))
    # every build first, in parallel: the checks then find them in the cache
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(
            pool.map(
                lambda job: builder.with_options(job[1].compile_options).build(
                    job[4].text, job[4].name
                ),
                jobs,
            )
        )
    if args.build_only:
        judge: Any = contextlib.nullcontext()
    else:
        from klineage.gate.gate import Gate  # the GPU side, imported only to run

        judge = Gate(builder)
    with judge as gate:
        for name, problem, mechanism, role, kernel in jobs:
            row = {"expert": name, "mechanism": mechanism, "kernel": role}
            row.update(judged(gate, builder, problem, kernel))
            rows.append(row)
            print(f"{name:34} {mechanism:24} {role:8} {row['status']}", flush=True)
    passing = {"PASSED", "BUILT"}
    payload = {
        "command": " ".join(
            ["python bench/public_walk_gate.py --out OUT"]
            + (["--build-only"] if args.build_only else [])
            + list(args.experts)
        ),
        "environment": {"nvidia_smi": "" if args.build_only else nvidia_smi()},
        "kernels": len(rows),
        "passed": sum(row["status"] in passing for row in rows),
        "forward": sum(row["kernel"] == "forward" for row in rows),
        "forward_passed": sum(
            row["kernel"] == "forward" and row["status"] in passing for row in rows
        ),
        "rows": rows,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"{payload['passed']} of {len(rows)} states pass; wrote {args.out}")


if __name__ == "__main__":
    main()
