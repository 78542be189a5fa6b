"""bench/public_walk_gate.py on the CPU: the states a walk of a public-style expert leaves and
the forward rule writes back, built under their problem's options (nvcc; the GPU check of the
same states is the script without --build-only)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from klineage.kernel import KernelSource
from klineage.mining.plan import plan_walk
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES

walk_gate = load_bench_script("public_walk_gate")
TOY = FIXTURES / "public_lineage" / "toy_row_sum"


def test_the_walk_states_follow_the_plan_each_removal_then_its_forward_kernel() -> None:
    expert = KernelSource.from_file(TOY / "kernel.cu")
    plan, final = plan_walk(expert)
    states = list(walk_gate.walk_states(expert))
    removed = [(m, k) for m, role, k in states if role == "removed"]
    assert [m for m, _ in removed] == plan.removed and plan.removed
    assert removed[-1][1].fingerprint == final.fingerprint
    forward = [m for m, role, _ in states if role == "forward"]
    assert forward == [s.mechanism for s in plan.steps if s.transferable]
    # a forward kernel is not the state it was written from
    for (mechanism, role, kernel), (_, _, before) in zip(states[1:], states, strict=False):
        if role == "forward":
            assert kernel.fingerprint != before.fingerprint, mechanism


@pytest.mark.nvcc
def test_build_only_writes_a_row_per_state(tmp_path: Path, monkeypatch) -> None:
    public = tmp_path / "public"
    shutil.copytree(TOY, public / "toy_row_sum")
    out = tmp_path / "walk_gate.json"
    argv = ["public_walk_gate.py", "--out", str(out), "--public", str(public), "--build-only"]
    monkeypatch.setattr(sys, "argv", argv)
    walk_gate.main()
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["kernels"] == len(result["rows"]) > 0
    assert result["passed"] == result["kernels"], result["rows"]
    assert {row["kernel"] for row in result["rows"]} >= {"removed"}
    assert result["forward"] == sum(row["kernel"] == "forward" for row in result["rows"])
