"""Build each skill's optimized and simplified states (from the lineages) and compare their
machine code: which skills run the same SASS and host code on both sides of their step.

    python bench/sass_audit.py skills_out --out bench/results/sass_audit.json

Needs nvcc; histograms and the no-op reason need nvdisasm (`pip install nvidia-cuda-nvdisasm`).
No GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from klineage.gate.build import Builder
from klineage.gate.noop import no_machine_code_change, same_machine_code
from klineage.gate.sass import delta, render_delta
from klineage.lineage import LineageGraph
from klineage.skills import SkillLibrary


def audit(skills_dir: Path, jobs: int) -> dict[str, Any]:
    library = SkillLibrary.load(skills_dir)
    lineages = {
        p.stem: LineageGraph.load(p) for p in sorted((skills_dir / "lineages").glob("*.json"))
    }
    sources: dict[str, str] = {}
    for skill in library:
        lineage = lineages[skill.evidence.problem]
        for fp in (skill.evidence.optimized, skill.evidence.simplified):
            sources[fp] = lineage.state(fp).source
    builder = Builder()
    started = time.perf_counter()
    order = sorted(sources)
    results = builder.build_many([sources[fp] for fp in order], jobs=jobs, disassemble=True)
    built = dict(zip(order, results, strict=True))
    rows = []
    for skill in library:
        opt, simple = built[skill.evidence.optimized], built[skill.evidence.simplified]
        row: dict[str, Any] = {
            "skill": skill.id,
            "mechanism": skill.mechanism,
            "geomean_speedup": skill.effect.geomean_speedup,
        }
        if opt.machine_code is None or simple.machine_code is None:
            row["error"] = opt.machine_code_note or simple.machine_code_note or opt.message
            rows.append(row)
            continue
        row["same_device"] = opt.machine_code.same_device(simple.machine_code)
        row["same_host"] = opt.machine_code.same_host(simple.machine_code)
        row["no_op"] = same_machine_code(opt.machine_code, simple.machine_code)
        row["delta"] = render_delta(delta(simple.machine_code, opt.machine_code))
        if row["no_op"]:
            refusal = no_machine_code_change(
                builder, sources[skill.evidence.optimized], sources[skill.evidence.simplified]
            )
            row["reason"] = refusal.reason.value if refusal else None
            row["message"] = refusal.message if refusal else None
        rows.append(row)
    no_ops = [r for r in rows if r.get("no_op")]
    return {
        "skills": len(rows),
        "states_built": len(sources),
        "build_seconds": time.perf_counter() - started,
        "no_ops": len(no_ops),
        "device_only_same": sum(bool(r.get("same_device")) and not r["no_op"] for r in rows),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("skills", type=Path, nargs="?", default=Path("skills_out"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/sass_audit.json"))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    report = audit(args.skills, args.jobs)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for row in report["rows"]:
        if row.get("no_op") or row.get("same_device"):
            what = "NO-OP" if row["no_op"] else "device same, host differs"
            print(f"{what:26} {row['skill']:55} {row.get('reason') or ''}")
    print(f"{report['no_ops']} of {report['skills']} skills run the same machine code")


if __name__ == "__main__":
    main()
