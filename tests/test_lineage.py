"""The lineage graph: states and attempts as plain node-link JSON, and its typed metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.lineage import (
    Attempt,
    AttemptStatus,
    LineageGraph,
    LineageMeta,
    LlmRejection,
    StateInfo,
    Termination,
)
from tests.conftest import REPO


def _state(fingerprint: str, depth: int, status: str = "PASSED") -> StateInfo:
    source = f"// {fingerprint}\n"
    return StateInfo(fingerprint=fingerprint, source=source, depth=depth, status=status)


def _attempt(parent: str, child: str, step: int, *, chosen: bool = False) -> Attempt:
    return Attempt(
        id=f"{parent}-fast_math",
        parent=parent,
        child=child,
        mechanism="fast_math",
        sites=[],
        carriers=[],
        status=AttemptStatus.ACCEPTED,
        gate_status="PASSED",
        ratio=0.8,
        step=step,
        chosen=chosen,
    )


def _walk() -> LineageGraph:
    lineage = LineageGraph("softmax_rows_f32")
    lineage.add_state(_state("expert", 0), root=True)
    lineage.add_state(_state("simpler", 1))
    lineage.add_state(_state("simplest", 2))
    lineage.add_attempt(_attempt("expert", "simpler", 0, chosen=True))
    lineage.add_attempt(_attempt("simpler", "simplest", 1, chosen=True))
    lineage.add_refusal("expert", "vectorized_access", "main:12: not canonical", 0)
    lineage.meta.termination = Termination.COMPLETE
    lineage.meta.final = "simplest"
    return lineage


def test_a_lineage_survives_its_json(tmp_path: Path) -> None:
    lineage = _walk()
    loaded = LineageGraph.load(lineage.save(tmp_path / "lineage.json"))
    assert loaded.meta == lineage.meta
    assert [a.child for a in loaded.main_path()] == ["simpler", "simplest"]
    assert loaded.state("simplest").depth == 2 and loaded.root == "expert"
    assert loaded.termination is Termination.COMPLETE
    assert loaded.to_json() == lineage.to_json()


def test_metadata_is_written_once_set_and_read_typed() -> None:
    lineage = LineageGraph("p")
    assert set(lineage.to_json()["graph"]) == {"problem", "refusals", "termination"}
    lineage.meta.method = "blind"
    lineage.add_refusal("a", "fast_math", "no site", 3)
    graph = lineage.to_json()["graph"]
    assert graph["method"] == "blind" and "gate_runs" not in graph
    assert graph["refusals"] == [
        {"parent": "a", "mechanism": "fast_math", "reason": "no site", "step": 3}
    ]
    assert lineage.meta.refusals[0].mechanism == "fast_math"


def test_llm_rejections_keep_only_what_they_say() -> None:
    lineage = LineageGraph("p")
    assert lineage.llm_rejections == []
    rejection = LlmRejection(
        parent="a",
        step=0,
        origin="llm:anthropic:m",
        stage="parse",
        reason="declined",
        mechanism=None,
        answer="",
        input_tokens=10,
        output_tokens=2,
    )
    lineage.add_llm_rejection(rejection)
    [written] = lineage.to_json()["graph"]["llm_rejections"]
    assert "kind" not in written and "skill" not in written  # a provider error's, replay's
    assert lineage.llm_rejections == [rejection]


def test_an_unknown_metadata_key_is_an_error_naming_the_file(tmp_path: Path) -> None:
    data = _walk().to_json()
    data["graph"]["termnation"] = "complete"
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"typo\.json: not a lineage"):
        LineageGraph.load(path)


def test_a_state_first_met_as_a_no_op_child_takes_the_gate_record() -> None:
    lineage = LineageGraph("p")
    lineage.add_state(_state("child", 1, status=AttemptStatus.NO_MACHINE_CODE_CHANGE.value))
    lineage.add_state(_state("child", 1))
    lineage.add_state(_state("child", 1, status="COMPILE_ERROR"))  # a gated state is kept
    assert lineage.state("child").status == "PASSED"


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "skills_out" / "lineages").glob("*.json"))
    + sorted((REPO / "bench" / "results" / "replay_lineages").glob("*.json"))[:6],
    ids=lambda p: p.name,
)
def test_committed_lineages_load_and_write_back_unchanged(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    lineage = LineageGraph.load(path)
    assert isinstance(lineage.meta, LineageMeta)
    assert lineage.to_json() == data
