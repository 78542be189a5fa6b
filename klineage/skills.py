"""Skills: accepted removals, reversed into optimizations with their evidence.

A skill says what to do (the mechanism, its carrier, a before/after anchor), where (the
function and code shape), when (conditions: the mechanism's static ones merged with those
learned from probes), what it gained (measured speedup per workload, register and
shared-memory deltas), what went wrong nearby (risks: rejected siblings and failing probes,
each with the gate's status and message) and the evidence behind all of it. Skills are kept
as JSONL (`skills.jsonl`) and as one `SKILL.md` per skill, the format agent tools load.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import fcntl
import json
import re
import shutil
import statistics
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from klineage.cuda.edit import changed_region
from klineage.gate.counters import CounterChange, counter_changes
from klineage.gate.profile import Profile
from klineage.gate.result import geomean, not_slower
from klineage.limits import CARD_PROBE_SHOWN, CARD_RISK_SHOWN, CARD_SNIPPET_SHOWN, DEFAULT_ARCH

NOISE = 0.01
"""Speedups within 1% of 1.0 are timing noise: the gate's own "not slower" bar is 0.99."""


def _near_one(speedup: float) -> str:
    """Three decimals, or four where three would round onto the 1% bar (1.0098 -> 1.0098x)."""
    shown = f"{speedup:.3f}"
    return f"{speedup:.4f}x" if shown in {"0.990", "1.010"} else f"{shown}x"


class Measured(str, enum.Enum):
    """What a step measured: a gain, nothing beyond the timing noise, or a slowdown."""

    GAIN = "gain"
    NO_GAIN = "no measurable gain"
    SLOWER = "slower"


def measured_of(speedups: Sequence[float]) -> Measured:
    """GAIN when every value is at least 1% faster, SLOWER when every one is at least 1%
    slower, else NO_GAIN (the trials disagree, or they sit inside the noise)."""
    # a hair of slack so that a speedup of exactly 1.01 is not lost to float rounding
    if speedups and min(speedups) >= (1 + NOISE) * (1 - 1e-9):
        return Measured.GAIN
    if speedups and max(speedups) <= (1 - NOISE) * (1 + 1e-9):
        return Measured.SLOWER
    return Measured.NO_GAIN


class Anchor(BaseModel):
    """Where the skill applies, shown as code."""

    function: str = Field(description="the function the (first) site is in")
    node_kind: str = Field(description="tree-sitter node kind of the (first) site")
    lines: str = Field(description="line range of the first site in the optimized kernel")
    before: str = Field(description="the simpler code, before applying the skill")
    after: str = Field(description="the optimized code, after applying it")


class WorkloadEffect(BaseModel):
    """What applying the skill did on one workload (simplified -> optimized)."""

    label: str = Field(description="the workload's axis values")
    speedup: float = Field(description="simplified latency / optimized latency")
    trial_speedups: list[float] = Field(description="the same per trial")
    spread: float = Field(description="(max - min) / median of the trial speedups")
    before_ms: float = Field(description="latency of the simpler kernel")
    after_ms: float = Field(description="latency of the optimized kernel")

    @property
    def measured(self) -> Measured:
        """GAIN or SLOWER only when every trial agrees by more than the noise."""
        return measured_of(self.trial_speedups or [self.speedup])


class Effect(BaseModel):
    """Measured effect of the skill, from paired interleaved timing on the H200."""

    workloads: list[WorkloadEffect] = Field(description="per workload")
    geomean_speedup: float | None = Field(description="geometric mean over workloads")
    registers_delta: dict[str, int] = Field(
        default_factory=dict, description="kernel -> registers after minus before"
    )
    shared_bytes_delta: dict[str, int] = Field(
        default_factory=dict, description="kernel -> static shared memory after minus before"
    )
    spill_bytes_delta: dict[str, int] = Field(
        default_factory=dict, description="kernel -> spill bytes after minus before"
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="gain: the geometric mean is at least 1% faster and some workload is, in "
        "every trial; slower: the geometric mean is at least 1% slower; else no measurable gain"
    )
    @property
    def measured(self) -> Measured:
        """What the step measured: a gain, no gain within the noise, or slower."""
        geo = self.geomean_speedup
        if geo is None or not self.workloads:
            return Measured.NO_GAIN
        overall = measured_of([geo])
        if overall is Measured.GAIN and not any(
            w.measured is Measured.GAIN for w in self.workloads
        ):
            return Measured.NO_GAIN
        return overall

    def summary(self) -> str:
        """The effect in words, plainly: a gain, no measurable gain, or slower."""
        geo = f"{self.geomean_speedup:.2f}x" if self.geomean_speedup else "unmeasured"
        if self.measured is Measured.GAIN:
            return f"measured gain: {geo}"
        if self.measured is Measured.SLOWER:
            return f"measured slower: {geo} on these workloads, no gain"
        if self.geomean_speedup and self.geomean_speedup >= 1 + NOISE:
            return (
                f"no measurable gain on these workloads: {self.geomean_speedup:.3f}x overall, "
                "but no workload faster in every trial"
            )
        exact = _near_one(self.geomean_speedup) if self.geomean_speedup else "unmeasured"
        return f"no measurable gain on these workloads: {exact}, within the 1% timing noise"


class Risk(BaseModel):
    """Something the gate rejected near this skill."""

    kind: str = Field(
        description="'rejected_sibling' (another removal from the same state), "
        "'rejected_elsewhere' (this mechanism's removal from another state of the lineage) "
        "or 'failing_probe'"
    )
    mechanism: str = Field(default="", description="the mechanism involved")
    workload: str = Field(default="", description="the workload or probe, when there is one")
    status: str = Field(description="the gate's status")
    message: str = Field(description="the gate's message")


class Evidence(BaseModel):
    """Where the skill's claims come from."""

    problem: str = Field(description="the expert problem it was mined from")
    edge: str = Field(description="the lineage edge (attempt id)")
    optimized: str = Field(description="fingerprint of the optimized state")
    simplified: str = Field(description="fingerprint of the simplified state")
    sites: list[dict[str, Any]] = Field(description="the removed sites")
    gate_status: str = Field(description="the simplified state's gate status")
    hardware: str = Field(default="", description="the GPU the evidence was gathered on")
    other_edges: list[str] = Field(
        default_factory=list,
        description="accepted removals of the same mechanism off the main path",
    )


class Scope(BaseModel):
    """Which kernels the skill was learned on."""

    op_type: str = Field(description="the problem's op_type")
    language: str = Field(default="cuda", description="source language")
    arch: str = Field(default=DEFAULT_ARCH, description="architecture it was measured on")
    dtypes: list[str] = Field(default_factory=list, description="dtypes of the tensors")


class KernelResourceChange(BaseModel):
    """One kernel's registers and spills on both sides of the step (ptxas)."""

    kernel: str = Field(description="demangled kernel name")
    registers_optimized: int = Field(description="registers per thread, optimized state")
    registers_simplified: int = Field(description="registers per thread, simplified state")
    spill_bytes_optimized: int = Field(description="spill bytes, optimized state")
    spill_bytes_simplified: int = Field(description="spill bytes, simplified state")


class MachineCodeEvidence(BaseModel):
    """What the step changes in the machine code (nvcc builds of both states)."""

    sass_delta: list[str] = Field(
        description="per kernel whose SASS changed, optimized -> simplified (the removal): "
        "'`LDG.E.128` x2 -> `LDG.E` x8 in `softmax_rows<256>` (...)'"
    )
    host_changed: bool = Field(description="whether the host code (the launch) changed")
    signature: list[str] = Field(
        default_factory=list, description="the mechanism's declared machine-code signature"
    )
    signature_shown: bool | None = Field(
        default=None, description="whether the delta shows it (None: nothing declared)"
    )
    gained: dict[str, int] = Field(
        default_factory=dict,
        description="features (klineage.gate.sass.feature_counts) the optimization adds: "
        "optimized minus simplified, over the kernels",
    )
    lost: dict[str, int] = Field(
        default_factory=dict, description="features it takes away: simplified minus optimized"
    )
    resources: list[KernelResourceChange] = Field(
        default_factory=list, description="registers and spills of the kernels that changed"
    )


class ProfileEvidence(BaseModel):
    """What the step did to the hardware counters: the profile stage on both states."""

    workload: str = Field(description="the workload profiled (axis values)")
    changes: list[CounterChange] = Field(
        default_factory=list, description="each figure, simplified -> optimized"
    )
    simplified_bottleneck: str | None = Field(
        default=None, description="the simpler kernel's bottleneck class"
    )
    optimized_bottleneck: str | None = Field(
        default=None, description="the optimized kernel's bottleneck class"
    )
    evidence: list[str] = Field(
        default_factory=list, description="why the simpler kernel got its class"
    )
    relieves: str | None = Field(
        default=None,
        description="the bottleneck the step relieved: the simpler kernel's class, when the "
        "step measured a gain (None otherwise); retrieval favours it on targets with the "
        "same bottleneck",
    )


def profile_evidence(
    simplified: Profile | None, optimized: Profile | None, measured: Measured
) -> ProfileEvidence | None:
    """The counters of a step, when both states were profiled on the same workload."""
    if simplified is None or optimized is None:
        return None
    if not (simplified.profiled and optimized.profiled):
        return None
    if simplified.workload_uuid != optimized.workload_uuid:
        return None
    before, after = simplified.bottleneck, optimized.bottleneck
    return ProfileEvidence(
        workload=simplified.label,
        changes=counter_changes(simplified, optimized),
        simplified_bottleneck=before.kind.value if before else None,
        optimized_bottleneck=after.kind.value if after else None,
        evidence=list(before.evidence) if before else [],
        relieves=before.kind.value if before and measured is Measured.GAIN else None,
    )


class Skill(BaseModel):
    """One verified optimization skill."""

    id: str = Field(description="stable id: mechanism, problem, optimized state")
    intent: str = Field(description="what the optimization does and why, one sentence")
    mechanism: str = Field(description="the catalog mechanism that applies it")
    category: str = Field(default="", description="memory, compute, synchronization, ...")
    family: str = Field(default="", description="DESIGN.md family")
    origin: str = Field(default="rule", description="'rule' or 'llm:...'")
    anchor: Anchor = Field(description="where, as code")
    carrier: dict[str, Any] = Field(
        default_factory=dict, description="instance choices (vector width, unroll, ...)"
    )
    conditions: list[dict[str, Any]] = Field(
        default_factory=list, description="machine-checkable conditions (JSON form)"
    )
    condition_prose: list[str] = Field(
        default_factory=list, description="the same conditions in words, with reasons"
    )
    probe_evidence: list[dict[str, Any]] = Field(
        default_factory=list, description="probes behind conditions learned empirically"
    )
    effect: Effect = Field(description="measured effect")
    risks: list[Risk] = Field(default_factory=list, description="rejections nearby")
    evidence: Evidence = Field(description="edges, fingerprints, gate results")
    scope: Scope = Field(description="where it was learned")
    requires: list[str] = Field(default_factory=list, description="mechanisms it needs")
    provides: list[str] = Field(default_factory=list, description="what it establishes")
    conflicts: list[str] = Field(default_factory=list, description="mechanisms it excludes")
    verified: bool | None = Field(
        default=None,
        description="the round trip reproduced a gain: the step measured a gain (`effect."
        "measured`) and the kernel re-applied by the rule was as fast as the optimized one "
        "(`round_trip_reproduced`); None: no round trip was tried",
    )
    round_trip_reproduced: bool | None = Field(
        default=None,
        description="the re-applied kernel was as fast as the optimized one (ratio >= 0.99 "
        "overall and per trial, or the re-applied source is the optimized one: "
        "`round_trip_exact`), whether or not the step gained anything; None: not tried",
    )
    round_trip_ratio: float | None = Field(
        default=None, description="optimized / re-applied latency (>= 0.99 to verify)"
    )
    round_trip_trial_ratios: list[float] = Field(default_factory=list, description="per trial")
    round_trip_note: str = Field(default="", description="why it was not verified, if not")
    transferable: bool | None = Field(
        default=None,
        description="a forward rule applies it to new code: the mechanism's `apply` re-created "
        "the optimized state from the simplified one. False: no forward rule takes the form "
        "the expert wrote (the round trip restored the source from the lineage edge instead); "
        "replay does not use it. None: not known (no round trip was tried)",
    )
    round_trip_exact: bool | None = Field(
        default=None,
        description="the re-applied source is the optimized one (same fingerprint: equal up to "
        "line endings and trailing spaces; None: nothing was re-applied); the round trip is "
        "then reproduced, and a ratio under 0.99 is the timing noise of one kernel",
    )
    diff: str = Field(default="", description="unified diff, simplified -> optimized")
    machine_code: MachineCodeEvidence | None = Field(
        default=None, description="the step's SASS delta, registers and spills (None: unknown)"
    )
    profile: ProfileEvidence | None = Field(
        default=None,
        description="the step's hardware-counter changes and the bottleneck it relieved "
        "(None: the states were not profiled)",
    )

    def settle_verified(self) -> None:
        """Set `verified` from the round trip and the effect: reproducing a step that gained
        nothing (or was slower) verifies the code, not a gain."""
        if self.round_trip_reproduced is None:
            self.verified = None
            return
        self.verified = self.round_trip_reproduced and self.effect.measured is Measured.GAIN

    def __repr__(self) -> str:
        return f"Skill({self.id!r}, {self.effect.summary()}, verified={self.verified})"

    def __str__(self) -> str:
        verdict = {True: "verified", False: "not verified", None: "no round trip"}
        lines = [
            f"{self.id}: {self.mechanism}, {self.effect.summary()}, {verdict[self.verified]}",
            f"  {self.intent}",
            *(f"  when: {c}" for c in self.condition_prose),
            f"  learned from {self.evidence.problem} ({len(self.effect.workloads)} workloads)",
        ]
        return "\n".join(lines)


def anchor_of(simplified: str, optimized: str, site: dict[str, Any] | None) -> tuple[str, str]:
    """The changed region of each side, trimmed to whole lines. A change made in several
    places far apart (a descriptor, its layout helper and the k steps that use them) shows
    each place with a line of context, the places separated by ``// ...``."""
    hunks = _hunks(simplified, optimized)
    if len(hunks) > 1:
        before = "\n// ...\n".join(b for b, _ in hunks)
        after = "\n// ...\n".join(a for _, a in hunks)
        return _limited(before), _limited(after)
    start_opt, end_opt = changed_region(simplified, optimized)
    start_simple, end_simple = changed_region(optimized, simplified)
    return _lines_around(simplified, start_simple, end_simple), _lines_around(
        optimized, start_opt, end_opt
    )


def _hunks(simplified: str, optimized: str) -> list[tuple[str, str]]:
    """(before, after) lines of each group of changes, with one line of context."""
    old, new = simplified.splitlines(), optimized.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        (
            "\n".join(old[group[0][1] : group[-1][2]]),
            "\n".join(new[group[0][3] : group[-1][4]]),
        )
        for group in matcher.get_grouped_opcodes(1)
    ]


def _limited(chunk: str) -> str:
    """At most CARD_SNIPPET_SHOWN characters, cut after a whole line (never inside a token), with
    a line saying how much was left out."""
    if len(chunk) <= CARD_SNIPPET_SHOWN:
        return chunk
    cut = chunk.rfind("\n", 0, CARD_SNIPPET_SHOWN)
    kept = chunk[: cut if cut > 0 else CARD_SNIPPET_SHOWN]
    left = chunk[len(kept) :].strip("\n").count("\n") + 1
    return f"{kept}\n// ... {left} more lines (the skill's diff has them all)"


def _lines_around(text: str, start: int, end: int) -> str:
    data = text.encode()
    first = data.rfind(b"\n", 0, start) + 1
    last = data.find(b"\n", end)
    return _limited(data[first : len(data) if last < 0 else last].decode("utf-8", "replace"))


def unified_diff(simplified: str, optimized: str, name: str) -> str:
    """The step as a unified diff, simplified -> optimized (what applying the skill does)."""
    return "".join(
        difflib.unified_diff(
            simplified.splitlines(keepends=True),
            optimized.splitlines(keepends=True),
            f"{name} (before)",
            f"{name} (after)",
            n=2,
        )
    )


def effect_of(
    rows: Sequence[dict[str, Any]],
    before: dict[str, dict[str, int]],
    after: dict[str, dict[str, int]],
) -> Effect:
    """Effect from an attempt's per-workload ratios (parent = optimized, child = simplified)."""
    workloads = []
    for row in rows:
        trials = list(row["trial_ratios"])
        median = statistics.median(trials) if trials else row["ratio"]
        workloads.append(
            WorkloadEffect(
                label=row["label"],
                speedup=1.0 / row["ratio"],
                trial_speedups=[1.0 / r for r in trials],
                spread=(max(trials) - min(trials)) / median if trials else 0.0,
                before_ms=row["child_ms"],
                after_ms=row["parent_ms"],
            )
        )
    geo = geomean([w.speedup for w in workloads]) if workloads else None
    deltas: dict[str, dict[str, int]] = {"registers": {}, "shared_bytes": {}, "spill_bytes": {}}
    for kernel in sorted(set(before) | set(after)):
        for key in deltas:
            deltas[key][kernel] = after.get(kernel, {}).get(key, 0) - before.get(kernel, {}).get(
                key, 0
            )
    return Effect(
        workloads=workloads,
        geomean_speedup=geo,
        registers_delta={k: v for k, v in deltas["registers"].items() if v},
        shared_bytes_delta={k: v for k, v in deltas["shared_bytes"].items() if v},
        spill_bytes_delta={k: v for k, v in deltas["spill_bytes"].items() if v},
    )


# ---- the library on disk ---------------------------------------------------------------------


class SkillLookupError(KeyError):
    """No skill has the id asked for, or several start with it."""

    def __init__(self, message: str, candidates: Sequence[str]) -> None:
        super().__init__(message)
        self.message = message
        self.candidates = list(candidates)
        """The ids that matched a prefix, or the closest ids when none did."""

    def __str__(self) -> str:
        return self.message


class SkillLibrary:
    """Skills in a folder: `skills.jsonl` plus `<id>/SKILL.md` for each."""

    def __init__(self, root: str | Path, skills: Iterable[Skill] = ()) -> None:
        self.root = Path(root)
        self.skills: dict[str, Skill] = {s.id: s for s in skills}

    @classmethod
    def load(cls, root: str | Path, *, missing_ok: bool = False) -> SkillLibrary:
        """The skills in folder `root` (its `skills.jsonl`), e.g. ``SkillLibrary.load(
        "skills_out")``. A folder without one raises FileNotFoundError, so that a mistyped
        path does not read as an empty library; `missing_ok` gives an empty library instead
        (a folder mining is about to fill). A line that is not a skill raises ValueError
        naming the file and line."""
        folder = Path(root)
        path = folder / "skills.jsonl"
        if not path.is_file():
            if missing_ok:
                return cls(folder)
            where = "no such folder" if not folder.is_dir() else "no skills.jsonl in this folder"
            raise FileNotFoundError(
                f"{folder}: {where}; give the folder mining wrote (`mine(..., out=...)`, "
                "`klineage mine --out`; default skills_out)"
            )
        skills = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                skills.append(Skill.model_validate_json(line))
            except ValueError as err:
                first = str(err).splitlines()[0]
                raise ValueError(f"{path}:{number}: not a skill ({first})") from err
        return cls(folder, skills)

    def __len__(self) -> int:
        return len(self.skills)

    def __iter__(self) -> Iterator[Skill]:
        return iter(sorted(self.skills.values(), key=lambda s: s.id))

    def get(self, skill_id: str) -> Skill:
        """The skill with this id, or the one whose id starts with it. No match, or a prefix
        several ids share, raises :class:`SkillLookupError` naming the candidates."""
        if skill_id in self.skills:
            return self.skills[skill_id]
        matches = sorted(k for k in self.skills if k.startswith(skill_id))
        if len(matches) == 1:
            return self.skills[matches[0]]
        if matches:
            raise SkillLookupError(
                f"{skill_id!r} is ambiguous: {len(matches)} skill ids start with it; give "
                "more of one:\n" + "\n".join(f"  {m}" for m in matches),
                matches,
            )
        # a misspelt mechanism (`vectorised`) is close to the ids' first part, not the whole
        heads = {k: k.split("--")[0] for k in self.skills}
        near = set(difflib.get_close_matches(skill_id.split("--")[0], set(heads.values())))
        close = sorted(k for k, head in heads.items() if head in near)[:8]
        hint = "; did you mean:\n" + "\n".join(f"  {c}" for c in close) if close else ""
        raise SkillLookupError(
            f"no skill {skill_id!r} in {self.root} ({len(self)} skills, `klineage skills list` "
            f"shows them){hint}",
            close,
        )

    def replace_problem(self, problem: str, skills: Iterable[Skill]) -> None:
        """Drop the skills mined from `problem` and add `skills` in their place."""
        self.skills = {k: s for k, s in self.skills.items() if s.evidence.problem != problem}
        for skill in skills:
            self.skills[skill.id] = skill

    @classmethod
    def update_problem(
        cls, root: str | Path, problem: str, skills: Iterable[Skill]
    ) -> SkillLibrary:
        """Replace `problem`'s skills in the library at `root`, under a lock, so two `mine`
        processes sharing one output folder never lose each other's skills. The folders of
        `problem`'s skills that were not mined again are removed."""
        folder = Path(root)
        with _locked(folder):
            library = cls.load(folder, missing_ok=True)
            before = {k for k, s in library.skills.items() if s.evidence.problem == problem}
            library.replace_problem(problem, skills)
            library.save()
            for stale in sorted(before - set(library.skills)):
                card = folder / stale
                if (card / "SKILL.md").is_file():
                    shutil.rmtree(card)
        return library

    def save(self) -> None:
        """Write `skills.jsonl` and one `<id>/SKILL.md` per skill into the folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        lines = [s.model_dump_json() for s in self]
        tmp = self.root / "skills.jsonl.tmp"
        tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        tmp.replace(self.root / "skills.jsonl")
        for skill in self:
            folder = self.root / skill.id
            folder.mkdir(exist_ok=True)
            (folder / "SKILL.md").write_text(render_skill_md(skill), encoding="utf-8")


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
        yield


def _card_carrier(carrier: dict[str, Any]) -> dict[str, Any]:
    """The carrier for reading: code it carries (a removed dispatch chain) is named by its
    size, since the card's After section shows it; skills.jsonl keeps it whole."""
    return {key: _card_value(value) for key, value in carrier.items() if value is not None}


def _card_value(value: Any) -> Any:
    if isinstance(value, str) and "\n" in value:
        lines = value.count("\n") + 1
        return f"<{lines} lines of code, shown under After>"
    return value


def _yaml_value(value: Any) -> str:
    # JSON scalars and lists are valid YAML flow values: no YAML library needed
    return json.dumps(value, ensure_ascii=False)


# the marks a rule leaves in a simplified state so that it can restore it (`1 /* klineage:
# rasterization kGroupM */`, a stashed `asm` statement): internal, not code a reader writes
_INTERNAL_MARK = re.compile(r"[ \t]*/\*\s*klineage:.*?\*/", re.DOTALL)


def card_code(code: str) -> str:
    """An anchor as a card shows it: without the rules' internal restore marks."""
    return _INTERNAL_MARK.sub("", code)


def _where(anchor: Anchor) -> str:
    if not anchor.function:
        return ""
    if anchor.function == "<file>":  # a site outside every function: a constant, a type
        return " at file scope"
    return f" in `{anchor.function}`"


def _effect_lines(effect: Effect) -> list[str]:
    """What the measurements say, in a sentence or two, naming the workloads that disagree."""
    faster = [w for w in effect.workloads if w.measured is Measured.GAIN]
    slower = [w for w in effect.workloads if w.measured is Measured.SLOWER]
    count = len(effect.workloads)
    lines = [f"{_sentence(effect.summary())} (the geometric mean of the speedups below)."]
    parts = []
    if faster and effect.measured is not Measured.GAIN:
        parts.append(f"faster in every trial on {len(faster)} of {count} workloads")
    if slower:
        parts.append(f"slower in every trial on {len(slower)} of {count} (see Risks)")
    if parts:
        lines.append(_sentence("; ".join(parts)) + ".")
    return lines


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _ratio_clears_bar(skill: Skill) -> bool:
    """The round trip's ratio passes the gate's "not slower" rule; True where no ratio was
    measured."""
    ratio = skill.round_trip_ratio
    return ratio is None or not_slower(ratio, skill.round_trip_trial_ratios)


def _round_trip_lines(skill: Skill) -> list[str]:
    ratio = f"{skill.round_trip_ratio:.3f}" if skill.round_trip_ratio else "-"
    verdict = "verified" if skill.verified else "NOT verified"
    lines = [f"Round trip: {verdict} (optimized / re-applied latency {ratio})"]
    if skill.round_trip_reproduced and not skill.verified:
        lines.append(
            "The re-applied kernel is as fast as the optimized one, but the step itself "
            f"measured {skill.effect.measured.value}: the round trip reproduced the code, "
            "not a gain."
        )
    if skill.round_trip_note:
        lines.append(skill.round_trip_note)
    if skill.round_trip_exact and not (skill.round_trip_reproduced and _ratio_clears_bar(skill)):
        settled = (
            "so it counts as reproduced"
            if skill.round_trip_reproduced
            else "which the older rule this card was written under did not count as reproduced"
        )
        lines.append(
            "The re-applied source is the optimized source (same fingerprint): this ratio "
            "is one kernel timed twice, so the 0.99 bar (overall and in every trial) fell "
            f"inside its timing noise; the rewrite itself is reproduced exactly, {settled}."
        )
    if skill.transferable is False:
        lines.append(
            "Not transferable: no forward rule writes the form the expert used, so replay does "
            "not apply this skill; it records what the step gained."
        )
    return lines


def _risk_lines(skill: Skill) -> list[str]:
    lines = []
    effect = skill.effect
    slower = [w for w in effect.workloads if w.measured is Measured.SLOWER]
    if effect.measured is Measured.SLOWER:
        lines.append(f"- measured slower: {effect.geomean_speedup:.2f}x geometric mean")
    lines += [f"- slower on {w.label}: {w.speedup:.3f}x in every trial" for w in slower]
    lines += [
        f"- {r.kind}: {' '.join(filter(None, (r.mechanism, r.workload)))} -> {r.status}: "
        f"{r.message[:CARD_RISK_SHOWN]}"
        for r in skill.risks
    ]
    return lines or ["- none observed"]


def render_skill_md(skill: Skill) -> str:
    """YAML front matter (id, intent, conditions, measured effect, scope) then the card."""
    when = "; ".join(skill.condition_prose) or "no conditions were found"
    description = (
        f"{skill.intent} Use when: {when}. "
        f"{_sentence(skill.effect.summary())} ({skill.scope.op_type})."
    )
    front = {
        "name": skill.id,
        "description": description,
        "id": skill.id,
        "intent": skill.intent,
        "mechanism": skill.mechanism,
        "conditions": skill.condition_prose,
        "measured": skill.effect.measured.value,
        "geomean_speedup": (
            round(skill.effect.geomean_speedup, 4) if skill.effect.geomean_speedup else None
        ),
        "scope": skill.scope.model_dump(),
        "verified": skill.verified,
    }
    if skill.profile is not None:
        front["relieves"] = skill.profile.relieves
    if skill.transferable is not None:  # cards mined before the split do not say
        front["transferable"] = skill.transferable
    lines = ["---"] + [f"{k}: {_yaml_value(v)}" for k, v in front.items()] + ["---", ""]
    lines += [f"# {skill.id}", "", "## Overview", "", skill.intent, ""]
    proposed = f", proposed by {skill.origin}" if skill.origin != "rule" else ""
    lines += [
        f"Mechanism `{skill.mechanism}` ({skill.category or '-'}, {skill.family or '-'}), "
        f"learned from `{skill.evidence.problem}` on {skill.evidence.hardware or 'the GPU'}"
        f"{proposed}. Apply it{_where(skill.anchor)} where the code looks like *Before* below.",
        "",
    ]
    carrier = _card_carrier(skill.carrier)
    if carrier:
        lines += [f"Carrier (instance choices): `{json.dumps(carrier)}`", ""]
    lines += ["## When it is valid", ""]
    lines += [f"- {c}" for c in skill.condition_prose] or ["- no conditions were found"]
    for probe in skill.probe_evidence:
        shown = probe["message"][:CARD_PROBE_SHOWN]
        lines.append(f"  - probe {probe['workload']}: {probe['status']} ({shown})")
    lines += ["", "## Effect", "", *_effect_lines(skill.effect), ""]
    lines += ["| workload | speedup | trials | before (ms) | after (ms) |", "|---|---|---|---|---|"]
    for w in skill.effect.workloads:
        trials = ", ".join(f"{t:.3f}" for t in w.trial_speedups)
        lines.append(
            f"| {w.label} | {w.speedup:.3f}x | {trials} | {w.before_ms:.4f} | {w.after_ms:.4f} |"
        )
    deltas = []
    for name, values in (
        ("registers", skill.effect.registers_delta),
        ("shared memory (bytes)", skill.effect.shared_bytes_delta),
        ("spills (bytes)", skill.effect.spill_bytes_delta),
    ):
        for kernel, delta in values.items():
            deltas.append(f"- {name}: {delta:+d} in `{kernel}`")
    lines += ["", *deltas] if deltas else []
    if skill.verified is not None:
        lines += ["", *_round_trip_lines(skill)]
    elif skill.round_trip_note:
        lines += ["", f"Round trip: not tried ({skill.round_trip_note})"]
    lines += machine_code_lines(skill.machine_code)
    lines += profile_lines(skill.profile)
    lines += ["", "## Risks", "", *_risk_lines(skill)]
    lines += ["", "## Before", "", "```cuda", card_code(skill.anchor.before), "```", ""]
    lines += ["## After", "", "```cuda", card_code(skill.anchor.after), "```", ""]
    return "\n".join(lines)


def machine_code_lines(evidence: MachineCodeEvidence | None) -> list[str]:
    """The card's "Machine code" section: the step's SASS delta, registers and spills."""
    if evidence is None:
        return []
    lines = ["", "## Machine code", "", "Removing it (optimized -> simplified), in SASS:", ""]
    lines += [f"- {line}" for line in evidence.sass_delta] or ["- no kernel's SASS changed"]
    lines.append(f"- host code (the launch): {'changed' if evidence.host_changed else 'same'}")
    if evidence.signature:
        shown = {True: "shown", False: "NOT shown by the delta", None: "not known"}
        lines.append(
            f"- declared signature `{', '.join(evidence.signature)}`: "
            f"{shown[evidence.signature_shown]}"
        )
    for r in evidence.resources:
        lines.append(
            f"- `{r.kernel}`: registers {r.registers_optimized} -> {r.registers_simplified}, "
            f"spills {r.spill_bytes_optimized} -> {r.spill_bytes_simplified} bytes"
        )
    return lines


def profile_lines(evidence: ProfileEvidence | None) -> list[str]:
    """The card's "Counters" section: the step's hardware-counter changes (Nsight Compute)
    and the bottleneck it relieved."""
    if evidence is None:
        return []
    before = evidence.simplified_bottleneck or "unclassified"
    after = evidence.optimized_bottleneck or "unclassified"
    relieved = (
        f"It relieves: **{evidence.relieves}**."
        if evidence.relieves
        else "It relieves no bottleneck on record (the step measured no gain)."
    )
    lines = [
        "",
        "## Counters",
        "",
        f"Profiled on `{evidence.workload}` (Nsight Compute), simplified -> optimized: the "
        f"simpler kernel was {before}, the optimized one is {after}. {relieved}",
        "",
    ]
    if evidence.evidence:
        lines += [f"Why the simpler kernel was {before}:", ""]
        lines += [f"- {line}" for line in evidence.evidence]
    lines += ["", "| counter | simplified | optimized | change |", "|---|---|---|---|"]
    for change in evidence.changes:
        lines.append(
            f"| {change.figure} | {change.simplified:.4g} | {change.optimized:.4g} | "
            f"{_change_cell(change)} |"
        )
    return lines


def _change_cell(change: CounterChange) -> str:
    """'same' within NOTABLE_CHANGE, else optimized / simplified as a factor."""
    if not change.notable:
        return "same"
    if change.simplified == 0:
        return "from 0"
    return f"{change.optimized / change.simplified:.3g}x"
