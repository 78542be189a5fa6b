"""What the rows form of vectorized_access buys on the held-out kernels that split their flat
index by a row length (needs a CUDA GPU).

    python bench/rows_speed.py [heldout/embedding_gather ...] --out bench/results/rows_speed.json

Per problem, the naive kernel is vectorized (the canonical vector form, what a replay's first
vectorized_access move writes), then its lanes are split by row once a vector (`form=rows`),
and the rows kernel is gated against the vector kernel: checked on every workload, then timed
in one interleaved loop with the vector kernel and the PyTorch reference. Kept per workload:
the rows kernel's latency, the vector kernel's and the reference's, the ratio vector / rows
(> 1: the rows form is faster) and both kernels' speed against PyTorch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import command_line, nvidia_smi  # noqa: E402

from klineage.gate.gate import Gate  # noqa: E402
from klineage.gate.result import geomean  # noqa: E402
from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms import Carrier, get  # noqa: E402
from klineage.mining.removal import apply_everywhere  # noqa: E402
from klineage.problem import load_problem  # noqa: E402

SPLITTING = [
    "heldout/embedding_gather",
    "heldout/silu_and_mul",
    "heldout/bias_relu",
    "heldout/rotary_embedding",
    "heldout/causal_conv1d",
    "heldout/mean_pool",
    "heldout/transpose_2d",
    "heldout/sgemm",
]


def forms(naive: KernelSource) -> tuple[KernelSource, KernelSource]:
    """(the vector kernel, the rows kernel) written from the naive one."""
    mechanism = get("vectorized_access")
    vector = apply_everywhere(naive, mechanism, Carrier())
    (site,) = [c for c in mechanism.candidates(vector) if c.detail.get("form") == "rows"]
    return vector, mechanism.apply(vector, site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="*", default=SPLITTING)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report: dict[str, object] = {"command": command_line(sys.argv), "problems": {}}
    verdict = None
    with Gate() as gate:
        for folder in args.problems:
            problem = load_problem(REPO / folder)
            vector, rows = forms(problem.kernel_source())
            verdict = gate.run(problem, rows, against=vector)
            workloads = []
            for w in verdict.workloads:
                pair = w.comparison
                reference = w.reference_latency_ms
                workloads.append(
                    {
                        "workload": w.label,
                        "status": w.status.value,
                        "message": w.message[:300],
                        "rows_ms": pair.candidate_ms if pair else None,
                        "vector_ms": pair.baseline_ms if pair else None,
                        "reference_ms": reference,
                        "rows_over_vector": pair.ratio if pair else None,
                        "rows_vs_pytorch": reference / pair.candidate_ms
                        if pair and reference
                        else None,
                        "vector_vs_pytorch": reference / pair.baseline_ms
                        if pair and reference
                        else None,
                    }
                )
            done = [r for r in workloads if r["rows_over_vector"] is not None]
            summary = {
                key: geomean([float(r[key]) for r in done]) if done else None  # type: ignore[arg-type]
                for key in ("rows_over_vector", "rows_vs_pytorch", "vector_vs_pytorch")
            }
            print(
                f"{problem.name:24s} {verdict.status.value:14s} "
                + "  ".join(f"{k} {v:.3f}" for k, v in summary.items() if v is not None)
            )
            report["problems"][problem.name] = {  # type: ignore[index]
                "folder": folder,
                "status": verdict.status.value,
                "rows_fingerprint": rows.fingerprint,
                "vector_fingerprint": vector.fingerprint,
                "geomean": summary,
                "workloads": workloads,
            }
    report["environment"] = {
        "hardware": verdict.hardware if verdict else None,
        "libs": verdict.libs if verdict else None,
        "nvidia_smi": nvidia_smi(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
