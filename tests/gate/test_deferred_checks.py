"""How the time stage reads the checks of verified calls: enqueued behind each call, read
once per trial, the first failure raised with what went wrong. CPU tensors stand in for the
device's (the GPU boundary); the bookkeeping and the messages are the real code."""

from __future__ import annotations

import pytest
import torch

from klineage.gate.audit import AuditFailure
from klineage.gate.check import changed_count, output_fails
from klineage.gate.result import Status
from klineage.gate.targets import KernelTarget, _PendingCheck
from klineage.problem import load_problem
from tests.conftest import FIXTURES


def _target() -> KernelTarget:
    target = KernelTarget.__new__(KernelTarget)  # no device: only the reading side is used
    target.definition = load_problem(FIXTURES / "problems" / "scale_rows").definition
    target._pending = []
    return target


def _check(where: str, x: torch.Tensor, x_after: torch.Tensor, y: torch.Tensor) -> _PendingCheck:
    definition = _target().definition
    reference = {"y": x * 2.0}
    counts = [
        changed_count(x, x_after),
        output_fails(y, reference["y"], definition.tolerance_for("y")),
    ]
    return _PendingCheck(
        where=where,
        counts=torch.stack([c.to(torch.int64) for c in counts]),
        watched_inputs=["x"],
        elementwise=True,
        snapshot={"y": y},
        reference=reference,
        pristine={"x": x},
        decoys={},
    )


def test_passing_checks_raise_nothing_and_are_consumed() -> None:
    target = _target()
    x = torch.randn(4, 8)
    target._pending = [_check(f"timed call {i}", x, x.clone(), x * 2.0) for i in (3, 9)]
    target.settle()
    assert target._pending == []
    target.settle()  # nothing pending: nothing to read


def test_the_first_failing_call_is_named_with_what_went_wrong() -> None:
    target = _target()
    x = torch.randn(4, 8)
    unwritten = torch.full_like(x, float("nan"))
    wrong = x * 2.0
    wrong[1, 2] += 1.0
    target._pending = [
        _check("timed call 4 of trial 1", x, x.clone(), x * 2.0),
        _check("timed call 17 of trial 1", x, x.clone(), unwritten),
        _check("timed call 30 of trial 1", x, x.clone(), wrong),
    ]
    with pytest.raises(AuditFailure) as caught:
        target.settle()
    assert caught.value.status is Status.INCORRECT_NUMERICAL
    assert caught.value.audit == "timed_output"
    assert caught.value.message.startswith("timed call 17 of trial 1 left its output y unwritten")
    assert target._pending == []  # a failed trial leaves nothing behind for the next


def test_an_input_written_by_the_kernel_is_counted() -> None:
    target = _target()
    x = torch.randn(4, 8)
    touched = x.clone()
    touched[0, :3] = 0.0
    target._pending = [_check("timed call 2 of trial 3", x, touched, x * 2.0)]
    with pytest.raises(AuditFailure) as caught:
        target.settle()
    assert caught.value.audit == "input_mutation"
    assert "wrote to its input x (3 elements)" in caught.value.message


def test_a_wrong_element_is_described() -> None:
    target = _target()
    x = torch.randn(4, 8)
    wrong = x * 2.0
    wrong[1, 2] += 1.0
    target._pending = [_check("timed call 5 of trial 2", x, x.clone(), wrong)]
    with pytest.raises(AuditFailure) as caught:
        target.settle()
    assert "y: 1 of 32 elements wrong" in caught.value.message
    assert "first at [1, 2]" in caught.value.message
