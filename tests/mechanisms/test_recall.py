"""Detection recall against hand-written mechanisms.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES

LISTED = [
    {"mechanism": "pragma_unroll", "family": "loop unrolling", "lines": [8, 9], "note": "warp"},
    {"mechanism": "pragma_unroll", "family": "loop unrolling", "lines": [22, 23], "note": "load"},
    {"mechanism": "restrict_pointers", "family": "pointer qualifiers", "lines": [13, 14]},
    {"mechanism": "fast_math", "family": "fast math", "lines": [1, 40], "note": "none here"},
    {"mechanism": "warp_magic", "family": "?", "lines": [1, 2], "note": "not a mechanism"},
]


def test_recall_reports_found_and_missed(tmp_path: Path) -> None:
    kernel = KernelSource.from_file(FIXTURES / "pragma_unroll" / "before.cu")
    (tmp_path / "mechanisms.json").write_text(json.dumps(LISTED))
    report = detection_recall(kernel, tmp_path)
    assert [e.found for e in report.entries] == [True, True, True, False, False]
    assert report.found == 3 and report.recall == pytest.approx(0.6)
    assert "unknown mechanism 'warp_magic'" in (report.entries[4].error or "")
    assert report.entries[0].sites == ["warp_sum:8 preproc_call: #pragma unroll"]
    text = str(report)
    assert "3/5 listed mechanisms detected" in text and "missed fast_math at lines 1-40" in text
    assert detection_recall(kernel, LISTED) == report
    assert detection_recall(kernel, []).recall == 1.0


def test_bad_entries_are_named() -> None:
    kernel = KernelSource("__global__ void k() {}\n")
    with pytest.raises(ValueError, match="entry 0"):
        detection_recall(kernel, [{"mechanism": "fast_math", "lines": [5, 2]}])


EXPERT_LISTS = sorted((REPO / "expert_kernels").glob("*/mechanisms.json"))


@pytest.mark.parametrize("listed", EXPERT_LISTS, ids=[p.parent.name for p in EXPERT_LISTS])
def test_expert_kernels_listed_mechanisms_are_detected(listed: Path) -> None:
    """Every mechanism an expert folder lists is found where it says (known names only:
    families not implemented yet are reported, not failed)."""
    report = detection_recall(KernelSource.from_file(listed.parent / "kernel.cu"), listed)
    missed = [e for e in report.missed if e.error is None]
    assert not missed, str(report)
