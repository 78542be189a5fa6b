"""What a forward form buys over the state it is written on, on the held-out kernels (needs a
CUDA GPU).

    python bench/form_speed.py --out bench/results/form_speed.json [--forms rows,coarsen,mma]
        [--problems heldout/cast_f32_to_bf16 ...] [--log replay_out/gatelog]

Each form is a pair of moves a replay makes: the first written on the naive kernel (every
site, the rule's default carrier), the second on that state at its candidate of the form:

- ``rows``: vectorized_access, then its rows form (a vector's lanes split by row once);
- ``coarsen``: vectorized_access, then thread_coarsening (several vectors a thread);
- ``mma``: smem_staging, then tensor_core_mma (the staged f16 tiles on mma.sync), and the
  same tiles with thread_coarsening's register tile beside it (4 x 4, and the experts' 8 x 8
  a replay races beside it), the rivals a replay races;
- ``raster``: smem_staging, then rasterization's grouped block order written from scratch
  (groups of 8 tile-rows over the 2-D grid of tiles);
- ``checked_loops``: block_per_row, then vectorized_access at every loop behind its run-time
  alignment test (rows of 50,257 floats).

The second state is gated against the first: checked on every workload, then timed in one
interleaved loop with the first and the PyTorch reference. Kept per workload: both latencies,
the reference's, the ratio first / second (> 1: the form is faster) and both states' speed
against PyTorch.

With ``--log DIR`` every verdict goes through the gate log ``DIR/<problem>.jsonl`` (served
when there, written when not): the replay's log, whose key (the state, the state it is timed
against, the workloads) is the same for these pairs, so a replay chunk after this run finds
their verdicts made, and a rerun of this script costs no gate run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # _environment, when loaded as a module

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.gate.gate import Gate  # noqa: E402
from klineage.gate.log import GateLog  # noqa: E402
from klineage.gate.result import GateVerdict, geomean  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms import Carrier, get  # noqa: E402
from klineage.mining.removal import apply_everywhere  # noqa: E402
from klineage.problem import load_problem  # noqa: E402


@dataclass(frozen=True)
class Form:
    """A pair of moves: the first on the naive kernel, the second on what it wrote."""

    first: str
    second: str
    candidate: str | None
    """The second rule's candidate form (``detail["form"]``), None for its plain one."""
    problems: list[str]
    carrier: dict[str, Any] = field(default_factory=dict)
    """The second move's choices (its rule's defaults for the rest)."""
    everywhere: bool = False
    """Apply the second at every candidate (as a replay's skill move does), not at one."""


FORMS: dict[str, Form] = {
    "rows": Form(
        "vectorized_access",
        "vectorized_access",
        "rows",
        [
            "heldout/embedding_gather",
            "heldout/silu_and_mul",
            "heldout/bias_relu",
            "heldout/rotary_embedding",
            "heldout/causal_conv1d",
            "heldout/mean_pool",
            "heldout/transpose_2d",
            "heldout/sgemm",
        ],
    ),
    "coarsen": Form(
        "vectorized_access",
        "thread_coarsening",
        None,
        ["heldout/cast_f32_to_bf16", "heldout/gelu", "heldout/nchw_to_nhwc"],
    ),
    "mma": Form("smem_staging", "tensor_core_mma", "mma_tile", ["heldout/batched_hgemm"]),
    "register_tile": Form(
        "smem_staging",
        "thread_coarsening",
        "register_tile",
        ["heldout/batched_hgemm", "heldout/sgemm"],
    ),
    "register_tile_8x8": Form(
        "smem_staging",
        "thread_coarsening",
        "register_tile",
        ["heldout/batched_hgemm", "heldout/sgemm"],
        {"tm": 8, "tn": 8},
    ),
    "raster": Form(
        "smem_staging",
        "rasterization",
        "grid_2d",
        ["heldout/sgemm", "heldout/batched_hgemm", "heldout/transpose_2d"],
    ),
    "checked_loops": Form(
        "block_per_row",
        "vectorized_access",
        "loop",
        ["heldout/log_softmax", "heldout/cross_entropy"],
        {"check": "aligned"},
        everywhere=True,
    ),
}


def pair(naive: KernelSource, form: Form) -> tuple[KernelSource, KernelSource]:
    """(the first move's state, the second's) written from the naive kernel."""
    parent = apply_everywhere(naive, get(form.first), Carrier())
    rule, carrier = get(form.second), Carrier.model_validate(form.carrier)
    if form.everywhere:
        return parent, apply_everywhere(parent, rule, carrier)
    (site,) = [
        c for c in rule.candidates(parent) if c.supported and c.detail.get("form") == form.candidate
    ]
    return parent, rule.apply(parent, site, carrier)


def workloads(verdict: GateVerdict) -> Iterator[dict[str, Any]]:
    for w in verdict.workloads:
        timed = w.comparison
        reference = w.reference_latency_ms
        yield {
            "workload": w.label,
            "status": w.status.value,
            "message": w.message[:300],
            "form_ms": timed.candidate_ms if timed else None,
            "parent_ms": timed.baseline_ms if timed else None,
            "reference_ms": reference,
            "form_over_parent": timed.ratio if timed else None,
            "form_vs_pytorch": reference / timed.candidate_ms if timed and reference else None,
            "parent_vs_pytorch": reference / timed.baseline_ms if timed and reference else None,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--forms", default=",".join(FORMS), help="comma-separated, of " + ", ".join(FORMS)
    )
    parser.add_argument("--problems", nargs="*", help="only these folders")
    parser.add_argument("--log", type=Path, help="serve and keep verdicts in DIR/<problem>.jsonl")
    args = parser.parse_args()
    report: dict[str, Any] = {"command": command_line(sys.argv), "forms": {}}
    verdict = None
    with Gate() as gate:
        for name in args.forms.split(","):
            form = FORMS[name]
            for folder in args.problems or form.problems:
                if args.problems and folder not in form.problems:
                    continue
                problem = load_problem(REPO / folder)
                parent, child = pair(problem.kernel_source(), form)
                if args.log is not None:
                    log = GateLog(args.log / f"{problem.name}.jsonl", gate, resume=True, share=True)
                    verdict = log.run(problem, child, against=parent)
                else:
                    verdict = gate.run(problem, child, against=parent)
                rows = list(workloads(verdict))
                done = [r for r in rows if r["form_over_parent"] is not None]
                summary = {
                    key: geomean([float(r[key]) for r in done]) if done else None
                    for key in ("form_over_parent", "form_vs_pytorch", "parent_vs_pytorch")
                }
                print(
                    f"{name:14s} {problem.name:24s} {verdict.status.value:14s} "
                    + "  ".join(f"{k} {v:.3f}" for k, v in summary.items() if v is not None),
                    flush=True,
                )
                report["forms"].setdefault(name, {})[problem.name] = {
                    "folder": folder,
                    "moves": [form.first, form.second, form.candidate, form.carrier],
                    "status": verdict.status.value,
                    "form_fingerprint": child.fingerprint,
                    "parent_fingerprint": parent.fingerprint,
                    "geomean": summary,
                    "workloads": rows,
                }
                Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    report["environment"] = {
        "hardware": verdict.hardware if verdict else None,
        "libs": verdict.libs if verdict else None,
        "nvidia_smi": nvidia_smi(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
