"""A move whose kernel runs the machine code of one already gated from the same state costs no
gate run: the gate would share that verdict. Real nvcc builds of a register-heavy product,
whose launch bounds (256, 2) and (512, 1) both cap it at 128 registers a thread."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.gate.log import GateLog
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.problem import load_problem
from klineage.replay.methods import SAME_AS_GATED, Materializer, Move
from tests.conftest import REPO
from tests.mining.stand_in_gate import StandInGate
from tests.replay.test_register_cap import HEAVY

UNBOUNDED = KernelSource(HEAVY.replace("__launch_bounds__(256, 4) ", ""))


def _bound(threads: int, blocks: int) -> Move:
    return Move(get("launch_bounds"), Carrier(block_size=threads, min_blocks=blocks), "rule")


@pytest.mark.nvcc
def test_a_kernel_of_machine_code_gated_from_the_state_is_not_gated_again(
    shared_builder: Builder, tmp_path: Path
) -> None:
    problem = load_problem(REPO / "heldout" / "sgemm")  # any problem: only its build options
    log = GateLog(tmp_path / "log.jsonl", StandInGate(shared_builder))
    search = Materializer(log, []).method("blind", problem)
    first = search.realize(UNBOUNDED, _bound(256, 2))
    assert first is not None
    # another text, the same registers, the same SASS: its verdict would be the first one's
    assert search.realize(UNBOUNDED, _bound(512, 1)) is None
    assert search.refusals == [f"rule launch_bounds: {SAME_AS_GATED} (rule launch_bounds)"]
    # another cap, other machine code: gated
    assert search.realize(UNBOUNDED, _bound(256, 1)) is not None
    # from another state, the same machine code is a new comparison
    other = KernelSource(UNBOUNDED.text.replace("k < 64", "k < 32"))
    assert search.realize(other, _bound(512, 1)) is not None
    # raced there as a carrier of a kept move (the sibling path): the same rule
    assert search.realize(other, replace(_bound(256, 2), sibling=True)) is None
    assert len(search.refusals) == 2 and SAME_AS_GATED in search.refusals[1]
