"""Conditions: evaluation against workloads, prose, JSON round trip, merging, size
expressions."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from klineage.conditions import (
    AnyCondition,
    ArchAtLeast,
    AxisAtLeast,
    AxisAtMost,
    AxisDivisible,
    BlockSizeAtMost,
    BlockSizeMultiple,
    Condition,
    DtypeIn,
    EvalContext,
    PointerAlignment,
    Prose,
    SharedMemoryAtMost,
    ToleranceAtLeast,
    check_all,
    conditions_from_json,
    conditions_to_json,
    evaluate_size,
    merge_conditions,
    parse_arch,
    parse_condition,
)
from klineage.problem import Problem, Workload, load_problem
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(FIXTURES / "problems" / "scale_rows")


def _workload(rows: int, cols: int) -> Workload:
    return Workload(
        uuid=f"w{rows}x{cols}",
        axes={"rows": rows, "cols": cols},
        inputs={"x": {"type": "random"}, "alpha": {"type": "scalar", "value": 1.0}},
    )


def test_axis_conditions(problem: Problem) -> None:
    wl = _workload(7, 1001)
    cond = AxisDivisible(axis="cols", k=4, why="float4 loads read 4 elements at a time")
    assert cond.evaluate(problem, wl) is False
    assert cond.evaluate(problem.definition, _workload(7, 1024)) is True
    assert cond.prose == "cols must be divisible by 4 (float4 loads read 4 elements at a time)"
    assert AxisAtMost(axis="cols", n=1024).evaluate(problem, wl) is True
    assert AxisAtLeast(axis="rows", n=8).evaluate(problem, wl) is False
    assert AxisDivisible(axis="nope", k=2).evaluate(problem, wl) is None
    assert AxisDivisible(axis="cols", k=2).evaluate(problem) is None  # var axis, no workload


def test_dtype_tolerance_and_alignment(problem: Problem) -> None:
    assert DtypeIn(tensor="x", dtypes=["float32", "float16"]).evaluate(problem) is True
    assert DtypeIn(tensor="x", dtypes=("bfloat16",)).evaluate(problem) is False
    assert DtypeIn(tensor="missing", dtypes=("float32",)).evaluate(problem) is None
    assert DtypeIn(tensor="x", dtypes=("float32", "float16")).prose == (
        "x must be one of float16, float32"
    )
    assert ToleranceAtLeast(rtol=1e-5).evaluate(problem) is True  # float32 default: 1e-4
    assert ToleranceAtLeast(rtol=1e-3).evaluate(problem) is False
    assert PointerAlignment(tensor="x", bytes=16).evaluate(problem) is True
    assert PointerAlignment(tensor="x", bytes=512).evaluate(problem) is None


def test_arch_conditions_use_the_context(problem: Problem) -> None:
    cp_async = ArchAtLeast(sm=80, why="cp.async needs sm_80")
    assert cp_async.evaluate(problem) is True  # default target sm_90
    assert cp_async.evaluate(problem, context=EvalContext(arch="sm_75")) is False
    wgmma = ArchAtLeast(sm=90, specific=True)
    assert wgmma.evaluate(problem) is False
    assert wgmma.evaluate(problem, context=EvalContext(arch="sm_90a")) is True
    assert wgmma.evaluate(problem, context=EvalContext(arch="sm_100a")) is False
    assert wgmma.prose == "the target must be sm_90a"
    assert parse_arch("sm_90a") == (90, "a") and parse_arch(80) == (80, "")
    with pytest.raises(ValueError, match="unknown architecture"):
        parse_arch("volta")


def test_block_and_shared_memory_conditions(problem: Problem) -> None:
    wl = _workload(4, 96)
    assert BlockSizeMultiple(k=32, block_size="256").evaluate(problem, wl) is True
    assert BlockSizeMultiple(k=32, block_size="min(cols, 1024)").evaluate(problem, wl) is True
    assert BlockSizeMultiple(k=32, block_size="cols // 2").evaluate(problem, wl) is False
    assert BlockSizeMultiple(k=32).evaluate(problem, wl) is None  # unknown block size
    ctx = EvalContext(block_size="cols * 16")
    assert BlockSizeAtMost(n=1024).evaluate(problem, wl, ctx) is False
    assert BlockSizeAtMost(n=1024).evaluate(problem, _workload(4, 64), ctx) is True
    smem = SharedMemoryAtMost(bytes=48 * 1024, usage="cols * 4 + 128")
    assert smem.evaluate(problem, wl) is True
    assert smem.evaluate(problem, _workload(1, 20000)) is False
    assert SharedMemoryAtMost(bytes=1024).evaluate(problem, wl) is None
    assert Prose(text="anything").evaluate(problem, wl) is None


def test_check_names_the_failing_workloads(problem: Problem) -> None:
    conditions = [
        AxisDivisible(axis="cols", k=4, why="float4"),
        AxisAtLeast(axis="rows", n=2),
        DtypeIn(tensor="x", dtypes=("float16",)),
        Prose(text="cannot tell"),
    ]
    violations = check_all(conditions, problem)
    assert [(v.condition.kind, v.workload) for v in violations] == [("dtype_in", None)]
    with_probes = check_all(conditions, problem, probes=True)
    labels = sorted(str(v) for v in with_probes if v.probe)
    assert labels == [
        "probe rows=1,cols=1: cols must be divisible by 4 (float4)",
        "probe rows=1,cols=1: rows must be at least 2",
        "probe rows=7,cols=33: cols must be divisible by 4 (float4)",
    ]
    assert AxisDivisible(axis="cols", k=4).check(problem) == []


ALL = [
    AxisDivisible(axis="cols", k=4, why="float4"),
    AxisAtMost(axis="cols", n=8192),
    AxisAtLeast(axis="rows", n=1),
    DtypeIn(tensor="x", dtypes=("float32",)),
    ArchAtLeast(sm=80),
    BlockSizeMultiple(k=32, block_size="256"),
    BlockSizeAtMost(n=1024),
    SharedMemoryAtMost(bytes=49152, usage="cols * 4"),
    PointerAlignment(tensor="x", bytes=16),
    ToleranceAtLeast(rtol=1e-5),
    Prose(text="pointers must not alias"),
]


def test_json_round_trip_by_kind() -> None:
    data = conditions_to_json(ALL)
    assert [d["kind"] for d in data][:3] == ["axis_divisible", "axis_at_most", "axis_at_least"]
    assert conditions_from_json(data) == ALL
    assert parse_condition({"kind": "prose", "text": "t"}) == Prose(text="t")
    with pytest.raises(ValueError, match=r"unknown condition kind 'nope'; known: .*axis_divisible"):
        parse_condition({"kind": "nope"})

    class Holder(BaseModel):
        conditions: list[AnyCondition]

    holder = Holder(conditions=ALL)
    assert Holder.model_validate_json(holder.model_dump_json()) == holder


def test_every_condition_prints_as_prose() -> None:
    for condition in ALL:
        assert condition.prose and str(condition) == condition.prose


def test_merge_drops_duplicates_and_keeps_the_strictest() -> None:
    merged = merge_conditions(
        [AxisDivisible(axis="cols", k=4, why="float4"), AxisAtMost(axis="cols", n=8192)],
        [
            AxisDivisible(axis="cols", k=8, why="uint4 of half"),
            AxisDivisible(axis="cols", k=4, why="float4"),
            AxisAtMost(axis="cols", n=4096),
            AxisDivisible(axis="rows", k=2),
            ArchAtLeast(sm=80),
            ArchAtLeast(sm=90, specific=True),
            DtypeIn(tensor="x", dtypes=("float32", "float16")),
            DtypeIn(tensor="x", dtypes=("float32",)),
            Prose(text="a"),
            Prose(text="a"),
        ],
    )
    assert merged == [
        AxisDivisible(axis="cols", k=8, why="float4; uint4 of half"),
        AxisAtMost(axis="cols", n=4096),
        AxisDivisible(axis="rows", k=2),
        ArchAtLeast(sm=90, specific=True),
        DtypeIn(tensor="x", dtypes=("float32",)),
        Prose(text="a"),
    ]


def test_size_expressions_are_interpreted_not_evaluated() -> None:
    assert evaluate_size("min(cols, 1024) // 32 * 32", {"cols": 100}) == 96
    assert evaluate_size("(cols + 3) // 4 if cols > 0 else 0", {"cols": 5}) == 2
    assert evaluate_size(256) == 256 and evaluate_size(None) is None
    assert evaluate_size("rows", {}) is None  # unknown name
    assert evaluate_size("cols // 0", {"cols": 1}) is None
    for hostile in ("__import__('os')", "cols.bit_length()", "[1][0]", "1 << 10000", "1.5"):
        assert evaluate_size(hostile, {"cols": 1}) is None, hostile


def test_a_new_condition_kind_registers_itself() -> None:
    class EvenRows(Condition):
        kind: str = "even_rows_test_only"

        def evaluate(self, target, workload=None, context=None):  # type: ignore[no-untyped-def]
            return None if workload is None else workload.axes["rows"] % 2 == 0

        @property
        def statement(self) -> str:
            return "rows must be even"

    parsed = parse_condition({"kind": "even_rows_test_only", "why": "pairs"})
    assert isinstance(parsed, EvenRows) and parsed.prose == "rows must be even (pairs)"
