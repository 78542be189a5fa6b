"""Checks of the reductions family against the expert kernels and the held-out naive kernels.

Each reductions test module calls these for its mechanism: ``detect`` must find every
``mechanisms.json`` entry of the mechanism where it is listed, and ``remove`` on every detected
site of those experts must either compile or refuse with a reason. Forward, ``apply`` on the
held-out naive kernels must compile.
"""

from __future__ import annotations

import json
from pathlib import Path

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import compile_ok

EXPERTS = REPO / "expert_kernels"
HELDOUT = REPO / "heldout"


def experts_listing(mechanism: str) -> list[Path]:
    """The expert folders whose ``mechanisms.json`` lists ``mechanism``."""
    found = []
    for listed in sorted(EXPERTS.glob("*/mechanisms.json")):
        entries = json.loads(listed.read_text(encoding="utf-8"))
        if any(e["mechanism"] == mechanism for e in entries):
            found.append(listed.parent)
    return found


def assert_detected_where_listed(mechanism: str) -> None:
    """Every listed entry of ``mechanism`` overlaps a detected site."""
    folders = experts_listing(mechanism)
    assert folders, f"no expert lists {mechanism}"
    for folder in folders:
        entries = [
            e
            for e in json.loads((folder / "mechanisms.json").read_text(encoding="utf-8"))
            if e["mechanism"] == mechanism
        ]
        report = detection_recall(KernelSource.from_file(folder / "kernel.cu"), entries)
        assert report.recall == 1.0, str(report)


def expert_removals(mechanism: str) -> tuple[list[KernelSource], list[str]]:
    """Each detected site of each expert listing ``mechanism`` removed on its own: the
    results (for compiling) and the refusal reasons."""
    subject = get(mechanism)
    results: list[KernelSource] = []
    refusals: list[str] = []
    for folder in experts_listing(mechanism):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        for site in subject.detect(kernel):
            try:
                removed = subject.remove(kernel, site)
            except MechanismRefused as refused:
                assert refused.reason.strip(), f"{site}: a refusal without a reason"
                refusals.append(f"{folder.name}: {site.function}: {refused.reason}")
                continue
            assert not site.refusal, f"{site} was reported refused but removal worked"
            assert len(subject.detect(removed)) == len(subject.detect(kernel)) - 1
            results.append(KernelSource(removed.text, name=f"{folder.name}-{site.function}.cu"))
    return results, refusals


def check_expert_removals_compile(mechanism: str, builder: Builder) -> list[str]:
    """Compile every supported removal of the experts; return the refusals."""
    results, refusals = expert_removals(mechanism)
    compile_ok(builder, results)
    return refusals


def heldout_applications(mechanism: str, names: list[str]) -> list[KernelSource]:
    """``apply`` with the default carrier at every supported candidate of the named held-out
    kernels; each result has the mechanism."""
    subject = get(mechanism)
    results = []
    for name in names:
        kernel = KernelSource.from_file(HELDOUT / name / "kernel.cu")
        candidates = [c for c in subject.candidates(kernel) if c.supported]
        assert candidates, f"{name}: no supported {mechanism} candidate"
        for candidate in candidates:
            applied = subject.apply(kernel, candidate)
            assert subject.detect(applied), f"{name}: apply did not create a detected site"
            results.append(KernelSource(applied.text, name=f"{name}-{mechanism}.cu"))
    return results
