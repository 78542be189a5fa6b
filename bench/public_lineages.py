"""Detection on the public development set: how much of each recorded lineage does the catalog see?

    python bench/public_lineages.py [--public DIR] [--out FILE] [--builds DIR] [--mined DIR]
                                    [--keep-mined FILE]
                                    [--references] [--readme FILE] [--timing-file LABEL=PATH ...]

(defaults: --public bench/public, --out bench/results/public_lineages.json)

For every folder of ``bench/public`` whose git-ignored ``kernel.cu`` is present (written by hand
from the cited commits, bench/public/README.md), ``steps.json`` gives the steps its authors
recorded, each mapped to catalog mechanisms (strict ``mechanisms``; ``near``, ``incidental`` and
``removes`` are not counted). The script walks the steps from the naive version to the expert,
keeps the mapped mechanisms no later step removes ("mapped, present in the expert"), runs
``detect`` on the expert (as ``klineage mechanisms detect`` does) and reports, per lineage:
recorded steps, steps with a mapping, mapped mechanisms present in the expert, those detected
(at least one site anywhere in the file), recall, sites refused with their reasons, what removing
the first site of each detected mechanism does, and the parse and detect CPU time. Alternates
(``alt/*.cu``) are measured against their own path of steps; naive kernels are listed by what
detect finds in them.

Nothing here fetches, writes or builds third-party code. ``--builds DIR`` reads build-only
verdicts that ``bench/public_run.sh build`` wrote with ``klineage gate --build-only --json``;
``--mined DIR`` reads the ``skills.jsonl`` that ``bench/public_run.sh mine`` wrote (GPU); without
it "mined as verified skills" stays null, unless ``--keep-mined FILE`` keeps an earlier output's
figures (detection rerun on the CPU, mining from the last H200 run). ``--references`` runs
each reference on the CPU for its smallest workload. ``--readme`` rewrites the table between
``<!-- table -->`` markers.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms import (  # noqa: E402
    MechanismError,
    MechanismRefused,
    Site,
    all_mechanisms,
    detect_all,
    get,
)

TABLE_START, TABLE_END = "<!-- table -->", "<!-- /table -->"
MINED_NOTE = (
    "mining needs the H200 (klineage mine gates every removal on the GPU); run "
    "bench/public_run.sh mine OUT there and pass --mined OUT"
)
WARMUP = """__global__ void k(float* y, const float* x, int n) {
  int i = threadIdx.x;
  if (i < n) y[i] = __expf(x[i]);
}
"""


# ---------------------------------------------------------------------------------------------
# steps.json: the recorded path from the naive version to a chosen version
# ---------------------------------------------------------------------------------------------


def mechanism_name(entry: str) -> str:
    """The catalog name an entry of ``removes`` (or ``near``) starts with: 'x (why)' -> 'x'."""
    return entry.split()[0].strip(",;") if entry.strip() else ""


def path_to(steps: dict[str, Any], version: str) -> list[dict[str, Any]]:
    """The recorded steps leading from the naive version to ``version``, in order.

    Each version but the naive one must be the ``to`` of exactly one step (the steps form a
    tree rooted at the naive version; side branches are simply not on the path)."""
    naive = steps["naive"]["version"]
    by_target: dict[str, list[dict[str, Any]]] = {}
    for step in steps["steps"]:
        by_target.setdefault(step["to"], []).append(step)
    path: list[dict[str, Any]] = []
    current, seen = version, set()
    while current != naive:
        found = by_target.get(current, [])
        if len(found) != 1:
            what = "no step" if not found else f"{len(found)} steps"
            raise ValueError(f"{what} leading to version {current!r} (from naive {naive!r})")
        if current in seen:
            raise ValueError(f"the steps loop back to version {current!r}")
        seen.add(current)
        path.append(found[0])
        current = found[0]["from"]
    return path[::-1]


def present_after(path: Sequence[dict[str, Any]]) -> list[str]:
    """The strict mechanisms of ``path`` that no later step of it removes, in order of arrival."""
    present: list[str] = []
    for step in path:
        for entry in step.get("removes", []):
            name = mechanism_name(entry)
            if name in present:
                present.remove(name)
        for name in step.get("mechanisms", []):
            if name not in present:
                present.append(name)
    return present


def steps_still_present(path: Sequence[dict[str, Any]], present: Iterable[str]) -> list[dict]:
    """The steps of ``path`` with a mapping whose strict mechanisms are all still present."""
    kept = set(present)
    return [s for s in path if s.get("mechanisms") and set(s["mechanisms"]) <= kept]


def all_mapped(steps: dict[str, Any]) -> list[str]:
    """Every strict mechanism any recorded step names (all branches), sorted."""
    return sorted({m for step in steps["steps"] for m in step.get("mechanisms", [])})


def check_steps(steps: dict[str, Any], catalog: set[str]) -> list[str]:
    """Problems with a steps.json: unknown mechanism names, versions with no path."""
    problems = []
    for i, step in enumerate(steps["steps"]):
        for key in ("mechanisms", "removes"):
            for entry in step.get(key, []):
                name = entry if key == "mechanisms" else mechanism_name(entry)
                if name not in catalog:
                    problems.append(
                        f"steps[{i}] ({step['from']} -> {step['to']}): {key} names "
                        f"{name!r}, not a catalog mechanism"
                    )
    targets = [steps["expert"]["version"]] + [a["version"] for a in steps.get("alternates", [])]
    for version in targets:
        try:
            path_to(steps, version)
        except ValueError as err:
            problems.append(str(err))
    return problems


# ---------------------------------------------------------------------------------------------
# detect and remove, timed
# ---------------------------------------------------------------------------------------------


def timed_detect(text: str, name: str, repeats: int = 3) -> tuple[KernelSource, list[Site], dict]:
    """Parse and detect on fresh copies of ``text``; CPU seconds are the best of ``repeats``."""
    parse_times, detect_times = [], []
    kernel, sites = None, []
    for _ in range(max(1, repeats)):
        t0 = time.process_time()
        kernel = KernelSource(text=text, name=name)
        parsed = kernel.parsed
        t1 = time.process_time()
        sites = detect_all(kernel)
        t2 = time.process_time()
        parse_times.append(t1 - t0)
        detect_times.append(t2 - t1)
    assert kernel is not None
    facts = {
        "lines": text.count("\n") + (not text.endswith("\n")),
        "bytes": len(text.encode("utf-8")),
        "parse_errors": len(parsed.errors),
        "parse_cpu_s": round(min(parse_times), 4),
        "detect_cpu_s": round(min(detect_times), 4),
        "parse_detect_cpu_s": round(
            min(p + d for p, d in zip(parse_times, detect_times, strict=True)), 4
        ),
        "repeats": max(1, repeats),
    }
    return kernel, sites, facts


def first_removals(kernel: KernelSource, sites: Sequence[Site]) -> dict[str, dict]:
    """Remove the first site of each detected mechanism that detection does not refuse."""
    outcome: dict[str, dict] = {}
    for site in sites:
        if site.mechanism in outcome:
            continue
        if site.refusal:
            continue
        t0 = time.process_time()
        try:
            get(site.mechanism).remove(kernel, site)
            result = {"status": "removed"}
        except MechanismRefused as err:
            result = {"status": "refused", "reason": str(err)}
        except MechanismError as err:
            result = {"status": "error", "reason": str(err)}
        result["site"] = f"{site.function}:{site.lines}"
        result["cpu_s"] = round(time.process_time() - t0, 4)
        outcome[site.mechanism] = result
    for site in sites:  # mechanisms whose every site detection refuses
        outcome.setdefault(site.mechanism, {"status": "all sites refused at detection"})
    return outcome


def refused_sites(sites: Sequence[Site]) -> list[dict[str, str]]:
    return [
        {"mechanism": s.mechanism, "site": f"{s.function}:{s.lines}", "reason": s.refusal or ""}
        for s in sites
        if s.refusal
    ]


def refusal_summary(refused: Sequence[dict[str, str]]) -> dict[str, dict]:
    summary: dict[str, dict] = {}
    for r in refused:
        entry = summary.setdefault(r["mechanism"], {"sites": 0, "reasons": []})
        entry["sites"] += 1
        if r["reason"] not in entry["reasons"]:
            entry["reasons"].append(r["reason"])
    return summary


def measure(kernel_file: Path, path: Sequence[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Detection against the mechanisms that ``path`` leaves in ``kernel_file``."""
    text = kernel_file.read_text(encoding="utf-8")
    kernel, sites, facts = timed_detect(text, kernel_file.name, repeats)
    counts = Counter(s.mechanism for s in sites)
    present = present_after(path)
    detected = [m for m in present if counts[m]]
    refused = refused_sites(sites)
    still = steps_still_present(path, present)
    steps_detected = [s for s in still if all(counts[m] for m in s["mechanisms"])]
    return {
        "path": [f"{s['from']} -> {s['to']}" for s in path],
        "mapped_present": present,
        "detected": detected,
        "missed": [m for m in present if not counts[m]],
        "recall": round(len(detected) / len(present), 4) if present else None,
        "steps_present": len(still),
        "steps_detected": len(steps_detected),
        "steps_missed": [f"{s['from']} -> {s['to']}" for s in still if s not in steps_detected],
        "sites": dict(sorted(counts.items())),
        "unmapped_sites": {m: n for m, n in sorted(counts.items()) if m not in present},
        "refused": refused,
        "refused_by_mechanism": refusal_summary(refused),
        "remove_first": first_removals(kernel, sites),
        "file": facts,
    }


# ---------------------------------------------------------------------------------------------
# optional inputs: build verdicts, mined skills, the reference on the CPU
# ---------------------------------------------------------------------------------------------


def build_facts(builds: Path | None, name: str, role: str) -> dict[str, Any] | None:
    """What ``klineage gate --build-only --json`` recorded for one kernel (no machine paths)."""
    if builds is None:
        return None
    file = builds / f"{name}.{role}.json"
    if not file.is_file():
        return {"status": "not built"}
    verdict = json.loads(file.read_text(encoding="utf-8"))
    kernels = (verdict.get("report") or {}).get("kernels", [])
    return {
        "status": verdict.get("status"),
        "arch": verdict.get("arch"),
        "message": (verdict.get("message") or "")[:400],
        "kernels": [
            {
                "name": k["name"],
                "registers": k.get("registers"),
                "shared_bytes": k.get("shared_bytes"),
                "spills": (k.get("spill_store_bytes") or 0) + (k.get("spill_load_bytes") or 0),
            }
            for k in kernels
        ],
    }


def mined_skills(mined: Path | None) -> dict[str, list[dict]] | None:
    """Skills by problem (definition name) from a ``klineage mine --out`` folder."""
    if mined is None:
        return None
    by_problem: dict[str, list[dict]] = {}
    library = mined / "skills.jsonl"
    if library.is_file():
        for line in library.read_text(encoding="utf-8").splitlines():
            if line.strip():
                skill = json.loads(line)
                problem = (skill.get("evidence") or {}).get("problem", "")
                by_problem.setdefault(problem, []).append(skill)
    return by_problem


def mined_facts(
    skills: dict[str, list[dict]] | None,
    problem: str,
    present: Sequence[str],
    walk: dict[str, Any] | None = None,
):
    """What mining recovered for one expert: counts, then each skill's figures (no code: the
    cards quote the public kernel, so they stay out of git) and the walk's report."""
    if skills is None:
        return None
    mine = skills.get(problem, [])
    verified = [s for s in mine if s.get("verified")]
    facts: dict[str, Any] = {
        "skills": len(mine),
        "verified": len(verified),
        "verified_mechanisms": sorted({s["mechanism"] for s in verified}),
        "verified_mapped": sorted({s["mechanism"] for s in verified} & set(present)),
    }
    if any("effect" in s for s in mine):
        facts["skill_figures"] = [_skill_figures(s) for s in mine]
    if walk is not None:
        facts["walk"] = walk
    return facts


def _skill_figures(skill: dict) -> dict[str, Any]:
    effect = skill.get("effect") or {}
    return {
        "id": skill.get("id"),
        "mechanism": skill["mechanism"],
        "measured": effect.get("measured"),
        "geomean_speedup": effect.get("geomean_speedup"),
        "verified": skill.get("verified"),
        "transferable": skill.get("transferable"),
        "round_trip_ratio": skill.get("round_trip_ratio"),
        "round_trip_reproduced": skill.get("round_trip_reproduced"),
    }


REPRODUCED_RATIO = 0.99
"""A round trip's optimized / re-applied latency at or above which the rule's kernel ran as
fast as the expert's (the card's `round_trip_reproduced` also asks it of every trial)."""


def reproduced_mapped(mined: dict[str, Any], present: Sequence[str]) -> list[str]:
    """Mapped mechanisms whose skill's forward rule wrote a kernel as fast as the expert's,
    whether or not the step gained anything on the H200: the card's flag, or, in figures
    kept from before it was recorded, the overall round-trip ratio."""
    found = set()
    for skill in mined.get("skill_figures", []):
        flag = skill.get("round_trip_reproduced")
        ratio = skill.get("round_trip_ratio")
        if flag is None and ratio is not None:
            flag = ratio >= REPRODUCED_RATIO
        if flag:
            found.add(skill["mechanism"])
    return sorted(found & set(present))


WALK_FIGURES = (
    "termination",
    "walk_gate_runs",
    "probe_gate_runs",
    "round_trip_gate_runs",
    "accepted",
    "rejected",
    "steps",
    "skills",
    "verified",
    "no_machine_code_change",
    "remaining",
    "wall_seconds",
)


def walk_report(mined: Path | None, folder: str) -> dict[str, Any] | None:
    """The figures of ``klineage mine --report`` that bench/public_run.sh wrote for a folder
    (the last run's; a resumed run counts only the gate runs it made itself)."""
    path = mined / f"report_{folder}.json" if mined is not None else None
    if path is None or not path.is_file():
        return None
    problems = json.loads(path.read_text(encoding="utf-8")).get("problems") or [{}]
    return {k: problems[0][k] for k in WALK_FIGURES if k in problems[0]}


def reference_on_cpu(folder: Path) -> dict[str, Any]:
    """Load the problem and run its reference on the CPU for the smallest workload."""
    from klineage.gate.inputs import check_reference_outputs, make_inputs, run_reference
    from klineage.problem import load_problem

    problem = load_problem(folder)
    definition = problem.definition

    def size(workload) -> int:
        total = 1
        for value in definition.axis_values(workload).values():
            total *= value
        return total

    workload = min(problem.workloads, key=size)
    t0 = time.perf_counter()
    inputs = make_inputs(definition, workload, 0, "cpu")
    outputs = run_reference(definition, inputs, definition.axis_values(workload))
    check_reference_outputs(definition, workload, outputs)
    return {"workload": workload.uuid, "ok": True, "seconds": round(time.perf_counter() - t0, 2)}


# ---------------------------------------------------------------------------------------------
# the set
# ---------------------------------------------------------------------------------------------


def lineage_report(folder: Path, args: argparse.Namespace, skills, catalog: set[str]) -> dict:
    steps = json.loads((folder / "steps.json").read_text(encoding="utf-8"))
    problem = json.loads((folder / "definition.json").read_text(encoding="utf-8"))["name"]
    problems = check_steps(steps, catalog)
    if problems:
        raise SystemExit(f"{folder}/steps.json: " + "; ".join(problems))
    name = folder.name
    expert = measure(folder / "kernel.cu", path_to(steps, steps["expert"]["version"]), args.repeats)
    report: dict[str, Any] = {
        "problem": problem,
        "repository": steps["lineage"].split()[0],
        "commit": steps["commit"],
        "expert_version": steps["expert"]["version"],
        "naive_version": steps["naive"]["version"],
        "recorded_steps": len(steps["steps"]),
        "recorded_steps_with_mapping": sum(bool(s.get("mechanisms")) for s in steps["steps"]),
        "mapped_any_branch": all_mapped(steps),
        "expert": expert,
        "build": {"expert": build_facts(args.builds, name, "expert")},
        "mined": mined_facts(
            skills, problem, expert["mapped_present"], walk_report(args.mined, name)
        ),
    }
    naive = folder / "naive" / "kernel.cu"
    if naive.is_file():
        _, sites, facts = timed_detect(naive.read_text(encoding="utf-8"), naive.name, 1)
        report["naive"] = {
            "sites": dict(sorted(Counter(s.mechanism for s in sites).items())),
            "refused": refused_sites(sites),
            "file": facts,
        }
        report["build"]["naive"] = build_facts(args.builds, name, "naive")
    report["alternates"] = []
    for alt in steps.get("alternates", []):
        file = folder / alt["file"]
        if not file.is_file():
            continue
        measured = measure(file, path_to(steps, alt["version"]), args.repeats)
        report["alternates"].append({"version": alt["version"], "file": alt["file"], **measured})
        role = f"alt-{Path(alt['file']).stem}"
        report["build"][role] = build_facts(args.builds, name, role)
    if args.references:
        report["reference_cpu"] = reference_on_cpu(folder)
    return report


def totals(lineages: dict[str, dict]) -> dict[str, Any]:
    experts = [r["expert"] for r in lineages.values()]
    alts = [a for r in lineages.values() for a in r["alternates"]]

    def pooled(items: list[dict]) -> dict[str, Any]:
        present = sum(len(i["mapped_present"]) for i in items)
        detected = sum(len(i["detected"]) for i in items)
        steps_present = sum(i["steps_present"] for i in items)
        steps_detected = sum(i["steps_detected"] for i in items)
        return {
            "mapped_present": present,
            "detected": detected,
            "recall": round(detected / present, 4) if present else None,
            "steps_present": steps_present,
            "steps_detected": steps_detected,
            "step_recall": round(steps_detected / steps_present, 4) if steps_present else None,
            "refused_sites": sum(len(i["refused"]) for i in items),
        }

    return {
        "lineages": len(lineages),
        "recorded_steps": sum(r["recorded_steps"] for r in lineages.values()),
        "recorded_steps_with_mapping": sum(
            r["recorded_steps_with_mapping"] for r in lineages.values()
        ),
        "experts": pooled(experts),
        "experts_and_alternates": pooled(experts + alts),
        "mined_verified_mapped": mined_total(lineages),
        "max_parse_detect_cpu_s": max(
            (i["file"]["parse_detect_cpu_s"] for i in experts + alts), default=None
        ),
    }


def keep_mined(lineages: dict[str, dict], earlier: Path) -> str:
    """Fill each lineage's missing mined figures from an earlier output; the note that says
    where they came from."""
    old = json.loads(earlier.read_text(encoding="utf-8"))
    kept = []
    for name, report in lineages.items():
        before = old.get("lineages", {}).get(name)
        if report["mined"] is None and before is not None and before.get("mined") is not None:
            report["mined"] = before["mined"]
            kept.append(name)
    note, command = mining_origin(old)
    return f"kept from {relative(earlier)} for {len(kept)} lineages (mined {note}; by: {command})"


_CARRIED = re.compile(r"\(mined (?P<note>.*?); by: (?P<command>.*)\)$")
_CARRIED_BEFORE = re.compile(  # the nested form of older outputs
    r"its mining: (?P<note>from [^;(]+); its command: (?P<command>[^)]+)\)"
)


def mining_origin(output: dict[str, Any]) -> tuple[str, str]:
    """Where an output's mined figures were made, and by what command: its own note, or,
    where it kept them from a still earlier output, that output's origin (so notes carried
    from run to run name the mining once instead of nesting)."""
    note = output.get("mined_note", "unknown")
    for pattern in (_CARRIED, _CARRIED_BEFORE):
        found = pattern.search(note)
        if note.startswith("kept from") and found:
            return found["note"], found["command"]
    return note, output.get("command", "unknown")


def mined_total(lineages: dict[str, dict]) -> dict[str, Any] | None:
    """Mapped mechanisms still present that mining recovered as verified skills, over every
    expert (None until mined on the GPU): the issue's target is 70%."""
    mined = [r for r in lineages.values() if r["mined"] is not None]
    if not mined:
        return None
    recovered = sum(len(r["mined"]["verified_mapped"]) for r in mined)
    present = sum(len(r["expert"]["mapped_present"]) for r in mined)
    reproduced = sum(
        len(reproduced_mapped(r["mined"], r["expert"]["mapped_present"])) for r in mined
    )
    return {
        "recovered": recovered,
        "mapped_present": present,
        "share": round(recovered / present, 4) if present else None,
        "round_trip_reproduced": reproduced,
        "round_trip_share": round(reproduced / present, 4) if present else None,
        "experts_mined": len(mined),
    }


def timing_files(specs: Sequence[str], repeats: int) -> list[dict[str, Any]]:
    """Parse and detect on whole files named LABEL=PATH (for the 1,000-line figure)."""
    rows = []
    for spec in specs:
        label, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--timing-file {spec!r}: expected LABEL=PATH")
        file = Path(path)
        _, sites, facts = timed_detect(file.read_text(encoding="utf-8"), file.name, repeats)
        rows.append({"file": label, "sites": len(sites), **facts})
    return rows


def environment() -> dict[str, Any]:
    def run(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text(encoding="utf-8"))
        cpu = found.group(1).strip() if found else ""
    versions = {}
    for package in ("tree-sitter", "tree-sitter-cuda", "torch", "pydantic"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    nvcc = run(["nvcc", "--version"]).splitlines()
    return {
        "klineage_commit": run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "nvcc": nvcc[-1] if nvcc else "",
        "gpu": None,
        "packages": versions,
        "catalog_size": len(all_mechanisms()),
        "timer": "time.process_time (CPU seconds of this process), best of --repeats fresh parses",
    }


# ---------------------------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------------------------


def table(lineages: dict[str, dict], sums: dict[str, Any]) -> str:
    head = (
        "| lineage | recorded steps (mapped) | mapped, present in expert | detected | recall "
        "| steps detected | mined as verified skills | round trip at the expert's speed "
        "| refused sites | parse+detect CPU s (lines) |"
    )
    rows = [head, "|" + "---|" * 10]

    def row(label: str, r: dict, m: dict, steps: str, mined: str, reproduced: str) -> str:
        refused = (
            ", ".join(f"{k} {v['sites']}" for k, v in m["refused_by_mechanism"].items()) or "none"
        )
        recall = f"{len(m['detected'])}/{len(m['mapped_present'])}"
        return (
            f"| {label} | {steps} | {', '.join(m['mapped_present']) or '-'} | "
            f"{', '.join(m['detected']) or 'none'} | {recall} | "
            f"{m['steps_detected']}/{m['steps_present']} | {mined} | {reproduced} | {refused} | "
            f"{m['file']['parse_detect_cpu_s']:.3f} ({m['file']['lines']}) |"
        )

    for name, r in lineages.items():
        mined = (
            "null (H200)"
            if r["mined"] is None
            else (f"{r['mined']['verified']} ({', '.join(r['mined']['verified_mapped']) or '-'})")
        )
        reproduced = (
            "null (H200)"
            if r["mined"] is None
            else ", ".join(reproduced_mapped(r["mined"], r["expert"]["mapped_present"])) or "-"
        )
        steps = f"{r['recorded_steps']} ({r['recorded_steps_with_mapping']})"
        label = f"`{name}` ({r['expert_version']})"
        rows.append(row(label, r, r["expert"], steps, mined, reproduced))
        for alt in r["alternates"]:
            rows.append(row(f"`{name}` alt {alt['version']}", r, alt, "", "", ""))
    e = sums["experts"]
    m = sums.get("mined_verified_mapped")
    mined_all = (
        "-"
        if m is None
        else f"**{m['recovered']}/{m['mapped_present']} ({100 * (m['share'] or 0):.0f}%)**"
    )
    reproduced_all = (
        "-"
        if m is None or m.get("round_trip_reproduced") is None
        else f"{m['round_trip_reproduced']}/{m['mapped_present']} "
        f"({100 * (m['round_trip_share'] or 0):.0f}%)"
    )
    rows.append(
        f"| **all {sums['lineages']} experts** | {sums['recorded_steps']} "
        f"({sums['recorded_steps_with_mapping']}) | {e['mapped_present']} | {e['detected']} | "
        f"**{e['detected']}/{e['mapped_present']} ({100 * (e['recall'] or 0):.0f}%)** | "
        f"{e['steps_detected']}/{e['steps_present']} | {mined_all} | {reproduced_all} | "
        f"{e['refused_sites']} | "
        f"max {sums['max_parse_detect_cpu_s']:.3f} |"
    )
    return "\n".join(rows)


def rewrite_readme(readme: Path, text: str) -> None:
    current = readme.read_text(encoding="utf-8")
    start, end = current.find(TABLE_START), current.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no {TABLE_START} ... {TABLE_END} markers")
    updated = current[: start + len(TABLE_START)] + "\n" + text + "\n" + current[end:]
    readme.write_text(updated, encoding="utf-8")


def relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--public", type=Path, default=REPO / "bench" / "public")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "public_lineages.json"
    )
    parser.add_argument("--builds", type=Path, help="build-only verdicts (bench/public_run.sh)")
    parser.add_argument("--mined", type=Path, help="a klineage mine --out folder")
    parser.add_argument(
        "--keep-mined",
        type=Path,
        help="an earlier output of this script: keep its mined figures (mining ran on the "
        "H200; detection reruns here) for the lineages --mined does not give",
    )
    parser.add_argument(
        "--references",
        action="store_true",
        help="run each reference on the CPU for its smallest workload",
    )
    parser.add_argument("--readme", type=Path, help="rewrite the table in this file")
    parser.add_argument("--timing-file", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    detect_all(KernelSource(text=WARMUP, name="warmup.cu"))  # grammar and queries, once
    catalog = {m.name for m in all_mechanisms()}
    skills = mined_skills(args.mined)
    lineages: dict[str, dict] = {}
    skipped: list[str] = []
    for folder in sorted(p for p in args.public.iterdir() if (p / "steps.json").is_file()):
        if not (folder / "kernel.cu").is_file():
            skipped.append(folder.name)
            continue
        print(f"{folder.name} ...", file=sys.stderr, flush=True)
        lineages[folder.name] = lineage_report(folder, args, skills, catalog)
    if not lineages:
        raise SystemExit(f"no folder of {args.public} has its kernel.cu (see its README.md)")
    kept_from = keep_mined(lineages, args.keep_mined) if args.keep_mined else None
    sums = totals(lineages)
    command = ["python", "bench/public_lineages.py"]
    for flag, value in (
        ("--public", args.public),
        ("--out", args.out),
        ("--builds", args.builds),
        ("--mined", args.mined),
        ("--keep-mined", args.keep_mined),
        ("--readme", args.readme),
    ):
        if value is not None:
            command += [flag, relative(value)]
    if args.references:
        command.append("--references")
    command += [f"--timing-file {spec.partition('=')[0]}=..." for spec in args.timing_file]
    result = {
        "command": " ".join(command),
        "environment": environment(),
        "counting": (
            "mapped = strict 'mechanisms' of the recorded steps on the path from the naive "
            "version to the expert (or alternate), minus those a later step on it 'removes'; "
            "detected = at least one site of that mechanism anywhere in the file (refused or "
            "not); a step is detected when every mechanism it maps to is"
        ),
        "mined_note": (
            ("from " + relative(args.mined))
            if skills is not None
            else kept_from
            if kept_from
            else MINED_NOTE
        ),
        "skipped_without_kernel": skipped,
        "totals": sums,
        "timing_files": timing_files(args.timing_file, args.repeats),
        "lineages": lineages,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    text = table(lineages, sums)
    print(text)
    if args.readme:
        rewrite_readme(args.readme, text)
    print(f"wrote {relative(args.out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
