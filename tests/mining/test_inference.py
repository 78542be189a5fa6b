"""Conditions learned from probes (klineage.mining.inference), on verdicts written by hand:
which probes the optimized kernel fails and the simpler one passes, and the rule that tells
them from the sizes it handles."""

from __future__ import annotations

import pytest

from klineage.conditions import parse_condition
from klineage.gate.build import BuildResult, BuildStatus
from klineage.gate.result import GateVerdict, Status, WorkloadVerdict
from klineage.mining.inference import infer_condition, why_no_condition
from klineage.problem import Problem, load_problem
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def problem() -> Problem:
    # workloads: rows 128, 1024, 4096 (cols 256, 1024, 512); probes: 1 x 1 and 7 x 33
    return load_problem(FIXTURES / "problems" / "scale_rows")


def _verdict(problem: Problem, failing: set[str]) -> GateVerdict:
    """A verdict on the probes: those in `failing` fail with a misaligned address."""
    rows = [
        WorkloadVerdict(
            workload_uuid=p.uuid,
            label=p.label,
            status=Status.RUNTIME_ERROR if p.uuid in failing else Status.PASSED,
            message="misaligned address" if p.uuid in failing else "",
        )
        for p in problem.probes
    ]
    build = BuildResult(status=BuildStatus.OK, key="stand-in")
    return GateVerdict(
        problem=problem.name, kernel="k.cu", fingerprint="f", build=build, workloads=rows
    )


def test_probes_failed_only_with_the_optimization_teach_a_divisibility(problem: Problem) -> None:
    probes = {p.uuid for p in problem.probes}
    inferred = infer_condition(problem, _verdict(problem, probes), _verdict(problem, set()))
    assert inferred is not None
    condition = parse_condition(inferred.condition)
    assert inferred.condition["kind"] == "axis_divisible"
    assert (inferred.condition["axis"], inferred.condition["k"]) == ("rows", 2)
    assert all(condition.evaluate(problem, w) is True for w in problem.workloads)
    assert all(condition.evaluate(problem, p) is False for p in problem.probes)
    assert [e.workload for e in inferred.supporting] == [p.label for p in problem.probes]
    assert all(e.status == "RUNTIME_ERROR" for e in inferred.supporting)


def test_a_failure_no_single_axis_rule_explains_is_said_in_prose(problem: Problem) -> None:
    # it fails 7 x 33 but handles 1 x 1, smaller on both axes and divisible by nothing
    odd = {problem.probes[1].uuid}
    inferred = infer_condition(problem, _verdict(problem, odd), _verdict(problem, set()))
    assert inferred is not None and inferred.condition["kind"] == "prose"
    assert problem.probes[1].label in inferred.prose


def test_nothing_is_learned_when_both_fail_alike_or_nothing_fails(problem: Problem) -> None:
    everything = {p.uuid for p in problem.probes}
    both = _verdict(problem, everything)
    assert infer_condition(problem, both, both) is None
    assert infer_condition(problem, _verdict(problem, set()), _verdict(problem, set())) is None


def test_why_no_condition_says_what_was_probed(problem: Problem) -> None:
    passing = _verdict(problem, set())
    said = why_no_condition(problem.probes, passing, passing)
    assert said.startswith("the mechanism states none") and "2 passed with and without it" in said
    assert "were not gated" in why_no_condition(problem.probes, None, None)
    assert "no probes" in why_no_condition([], None, None, stated_by="no rule states any")
