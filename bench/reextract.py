"""Re-extract a problem's skills from its committed lineage with the machine-code check
applied, without a GPU: where an offline re-mine (bench/remine_offline.py) would need a gate
run the log lacks.

    python bench/reextract.py softmax_rows_f32 --skills skills_out

Each skill's two states are built (nvcc + nvdisasm): a skill whose step changes no machine
code is dropped and its edge relabelled `no_machine_code_change` with the reason (the walk
that was recorded did continue from it: `chosen` stays as it was, and the lineage says
`reextracted`); every other skill keeps its recorded verdicts and gains its machine-code
evidence. The lineage's states that were built get their machine code.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from klineage.gate.build import Builder
from klineage.gate.noop import no_machine_code_change
from klineage.lineage import AttemptStatus, LineageGraph
from klineage.mining.extract import machine_code_evidence
from klineage.skills import SkillLibrary

NOTE = (
    "skills re-extracted on a CPU from the lineage mined on the GPU: edges whose two states "
    "run the same machine code were relabelled no_machine_code_change and their skills dropped"
)


def reextract(problem: str, root: Path, builder: Builder) -> tuple[int, int]:
    """(skills kept, skills dropped) for `problem` in the library at `root`."""
    path = root / "lineages" / f"{problem}.json"
    lineage = LineageGraph.load(path)
    skills = [s for s in SkillLibrary.load(root) if s.evidence.problem == problem]
    ends = sorted({fp for s in skills for fp in (s.evidence.optimized, s.evidence.simplified)})
    sources = [lineage.state(fp).source for fp in ends]
    for fp, result in zip(ends, builder.build_many(sources, disassemble=True), strict=True):
        code = result.machine_code
        lineage.graph.nodes[fp]["machine_code"] = code.model_dump(mode="json") if code else None
    kept = []
    for skill in skills:
        parent, child = skill.evidence.optimized, skill.evidence.simplified
        refusal = no_machine_code_change(
            builder, lineage.state(parent).source, lineage.state(child).source
        )
        edge = lineage.graph.edges[parent, child]
        if refusal is not None:
            edge["status"] = AttemptStatus.NO_MACHINE_CODE_CHANGE.value
            edge["no_op"] = refusal.model_dump(mode="json")
            edge["host_changed"] = False
            continue
        evidence = machine_code_evidence(
            skill.mechanism, lineage.state(parent), lineage.state(child)
        )
        if evidence is not None:
            edge["sass_delta"] = evidence.sass_delta
            edge["host_changed"] = evidence.host_changed
            edge["signature_shown"] = evidence.signature_shown
        kept.append(skill.model_copy(update={"machine_code": evidence}))
    lineage.graph.graph["reextracted"] = NOTE
    lineage.save(path)
    SkillLibrary.update_problem(root, problem, kept)
    return len(kept), len(skills) - len(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("problems", nargs="+")
    parser.add_argument("--skills", type=Path, default=Path("skills_out"))
    args = parser.parse_args()
    builder = Builder()
    for problem in args.problems:
        kept, dropped = reextract(problem, args.skills, builder)
        print(f"{problem}: {kept} skills kept, {dropped} dropped (no machine code change)")


if __name__ == "__main__":
    main()
