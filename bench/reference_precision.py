"""How far a problem's reference is from the exact answer, and kernels from both.

For every required workload and the gate's three seeds, this computes the reference as the
gate runs it (PyTorch defaults), the reference with cuBLAS's reduced-precision reductions
turned off, and the exact answer (the reference on float64 copies of the inputs, rounded to
the output's dtype). It then counts, with the gate's element rule and the definition's
tolerances, how many elements of each reference and of each given kernel fail against each
of the three. A reference that fails against the exact answer cannot judge a kernel at the
edge of the tolerance.

    python bench/reference_precision.py expert_kernels/gemm_bf16 a.cu b.cu --out result.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _environment import nvidia_smi  # noqa: E402

from klineage.gate.build import Builder  # noqa: E402
from klineage.gate.check import compare_output  # noqa: E402
from klineage.gate.inputs import allocate_outputs, make_inputs, run_reference  # noqa: E402
from klineage.gate.runner import DeviceRunner  # noqa: E402
from klineage.problem import load_problem  # noqa: E402

SEEDS = (0, 1, 2)
"""The gate's check seeds (Gate.seed 0, three trials)."""


@contextlib.contextmanager
def full_precision_reductions() -> Iterator[None]:
    """cuBLAS without reduced-precision (fp16 / bf16) split-K reductions."""
    matmul = torch.backends.cuda.matmul
    saved = (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
    )
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (
            matmul.allow_fp16_reduced_precision_reduction,
            matmul.allow_bf16_reduced_precision_reduction,
        ) = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problem", type=Path)
    parser.add_argument("kernels", type=Path, nargs="*")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    problem = load_problem(args.problem)
    definition = problem.definition
    builder = Builder()
    libraries = {}
    for path in args.kernels:
        build = builder.build(path.read_text(), name=path.stem)
        if not build.ok:
            print(f"{path}: does not build\n{build.message}", file=sys.stderr)
            return 1
        libraries[path.stem] = str(build.library)
    runner = DeviceRunner()
    rows = []
    for workload in problem.workloads:
        axis_values = definition.axis_values(workload)
        for seed in SEEDS:
            inputs = make_inputs(definition, workload, seed, "cuda")
            answers = {"reference": run_reference(definition, inputs, axis_values)}
            with full_precision_reductions():
                answers["reference_full_reductions"] = run_reference(
                    definition, inputs, axis_values
                )
            wide = {k: v.double() if hasattr(v, "double") else v for k, v in inputs.items()}
            exact = run_reference(definition, wide, axis_values)
            answers["exact"] = {
                name: exact[name].to(answers["reference"][name].dtype) for name in exact
            }
            for stem, library in libraries.items():
                outputs = allocate_outputs(definition, workload, "cuda")
                call = runner.kernel_call(library, definition, workload, inputs, outputs)
                torch.cuda.synchronize()  # run() goes on the runner's own stream
                with torch.cuda.stream(runner.stream):
                    call()
                torch.cuda.synchronize()
                answers[stem] = outputs
            for judge in ("reference", "reference_full_reductions", "exact"):
                for judged, outputs in answers.items():
                    if judged == judge:
                        continue
                    for name in definition.outputs:
                        c = compare_output(
                            name,
                            outputs[name],
                            answers[judge][name],
                            definition.tolerance_for(name),
                        )
                        rows.append(
                            {
                                "workload": workload.label,
                                "seed": seed,
                                "judged": judged,
                                "against": judge,
                                "output": name,
                                "bad": c.bad,
                                "total": c.total,
                                "max_abs": c.max_abs,
                                "first": c.describe() if c.bad else "",
                            }
                        )
            print(workload.label, seed, flush=True)
    summary: dict[str, int] = {}
    for row in rows:
        key = f"{row['judged']} vs {row['against']}"
        summary[key] = summary.get(key, 0) + row["bad"]
    result = {
        "command": " ".join(sys.argv),
        "environment": {
            "nvidia_smi": nvidia_smi(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "bad_elements": summary,
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1))
    for key, bad in summary.items():
        print(f"{key}: {bad} bad elements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
