"""How far a walk can go on the public experts without a GPU: which mapped mechanisms some
order of removals takes out of each expert, and why the others stay.

    python bench/public_walk_reach.py [--public DIR] [--out FILE] [--build]

(defaults: --public bench/public, --out bench/results/public_walk_reach.json)

CPU only (parsing and rewriting, nothing is built or timed). Per expert whose git-ignored
``kernel.cu`` is present, the walk removes one detected mechanism a step (every site its rule
takes), from the state the last removal left, in mining's order where it does not depend on
timing (a removal that strands another removable mechanism goes after it), until no removal
takes a site. That is an upper bound on what mining can recover: mining gates each step, keeps
only what the gate accepts, and a verified skill also needs a measured gain. The mapped
mechanisms come from ``bench/results/public_lineages.json`` (run ``bench/public_lineages.py``
first). For each mapped mechanism no step removed, the refusal of its site in the last state
is kept (or that it is no longer detected there). With ``--build``, each expert's last state
is built with nvcc under its problem's compile options (no GPU): every removal of the walk
must leave code that compiles, or mining would spend a gate run on a compile error.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all
from klineage.mining.plan import MAX_STEPS, plan_walk
from klineage.problem import load_problem

ROOT = Path(__file__).resolve().parents[1]
STEPS = MAX_STEPS
"""At most this many removals a walk (each removes one mechanism everywhere)."""


def walk(kernel: KernelSource) -> tuple[KernelSource, list[str]]:
    """The state no removal changes any more, and the mechanisms removed, in order
    (:func:`klineage.mining.plan.plan_walk`)."""
    plan, final = plan_walk(kernel, max_steps=STEPS)
    return final, plan.removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--public", type=Path, default=ROOT / "bench" / "public")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "public_walk_reach.json"
    )
    parser.add_argument("--build", action="store_true", help="build each last state (nvcc)")
    args = parser.parse_args()
    lineages = json.loads((ROOT / "bench" / "results" / "public_lineages.json").read_text())
    rows = []
    for name, lineage in lineages["lineages"].items():
        path = args.public / name / "kernel.cu"
        if not path.is_file():
            continue
        mapped = sorted(lineage["expert"]["mapped_present"])
        started = time.process_time()
        plan, final = plan_walk(KernelSource.from_file(path), max_steps=STEPS)
        removed = plan.removed
        forward = {s.mechanism: s for s in plan.steps}
        left = {}
        for site in detect_all(final):
            left.setdefault(site.mechanism, site.refusal or "removable, but no step took it")
        built = None
        if args.build:
            options = load_problem(args.public / name).compile_options
            result = Builder().with_options(options).build(final.text, f"{name}/walk.cu")
            built = "OK" if result.ok else result.message[:400]
        rows.append(
            {
                "expert": name,
                "mapped": mapped,
                "removed_in_order": removed,
                "mapped_removed": sorted(set(mapped) & set(removed)),
                "mapped_forward": sorted(
                    m for m in mapped if m in forward and forward[m].transferable
                ),
                "forward_refused": {
                    m: forward[m].forward_refusal
                    for m in mapped
                    if m in forward and not forward[m].transferable
                },
                "mapped_left": {
                    m: left.get(m, "not detected in the last state")
                    for m in mapped
                    if m not in removed
                },
                "cpu_s": round(time.process_time() - started, 2),
                "last_state_build": built,
            }
        )
        print(f"{name}: {len(rows[-1]['mapped_removed'])} of {len(mapped)} mapped removed")
    total = sum(len(r["mapped"]) for r in rows)
    reached = sum(len(r["mapped_removed"]) for r in rows)
    transferable = sum(len(r["mapped_forward"]) for r in rows)
    payload = {
        "command": "python bench/public_walk_reach.py" + (" --build" if args.build else ""),
        "note": "CPU only: an upper bound on what mining recovers (no gate, no timing)",
        "mapped": total,
        "mapped_removed": reached,
        "mapped_forward": transferable,
        "experts": rows,
    }
    args.out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(
        f"{reached} of {total} mapped mechanisms removed by some walk, {transferable} of them "
        f"with a forward rule that applies again; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
