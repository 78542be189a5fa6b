"""The PyTorch reference a replay report measures every method against: the median of its
timings over the problem's gate log, not the one run beside a method's best kernel."""

from __future__ import annotations

import tarfile
from pathlib import Path

from klineage.gate.log import GateLog
from klineage.replay.results import MethodResult, against_reference
from tests.conftest import REPO

ONE_TOKEN = "tokens=1,hidden=4096"


def _layernorm_log(tmp_path: Path) -> GateLog:
    """The H200's verdicts on layernorm_bf16 (the committed replay gate log), read only."""
    member = "replay_out/gatelog/layernorm_bf16.jsonl"
    with tarfile.open(REPO / "bench/state/replay_gatelog.tar.xz") as archive:
        archive.extractall(tmp_path, members=[archive.getmember(member)], filter="data")
    return GateLog(tmp_path / member, None, resume=True)


def test_the_median_over_the_log_is_not_moved_by_a_slowed_run(tmp_path: Path) -> None:
    log = _layernorm_log(tmp_path)
    medians = log.reference_medians("layernorm_bf16")
    assert len(medians) == 5 and ONE_TOKEN in medians
    timings = [
        w.reference_latency_ms
        for v in log._verdicts.values()
        for w in v.workloads
        if w.label == ONE_TOKEN and w.reference_latency_ms
    ]
    assert len(timings) > 50
    # one run timed the launch-bound one-token reference at several times its usual latency
    assert max(timings) > 3 * medians[ONE_TOKEN] > 3 * min(timings)
    assert log.reference_medians("some_other_problem") == {}


def _result(best: dict[str, float], reference: dict[str, float]) -> MethodResult:
    ratios = [reference[k] / best[k] for k in best]
    own = (ratios[0] * ratios[1]) ** 0.5
    return MethodResult(
        method="blind", problem="p", start_ms=best, best_ms=best, reference_ms=reference,
        speedup=1.0, speedup_vs_reference=own, runs_to_90=0, wasted=0, final="f",
        seconds=0.0,
    )  # fmt: skip


def test_a_result_is_measured_against_the_shared_reference_and_keeps_its_own() -> None:
    result = _result({"a": 1.0, "b": 2.0}, {"a": 4.0, "b": 2.0})  # a's reference ran slow
    shared = against_reference(result, {"a": 1.0, "b": 2.0, "c": 9.0})
    assert shared.reference_ms == {"a": 1.0, "b": 2.0}  # only the result's workloads
    assert shared.reference_ms_own == {"a": 4.0, "b": 2.0}
    assert shared.speedup_vs_reference == 1.0
    assert shared.speedup_vs_reference_own == result.speedup_vs_reference == 2.0
    assert against_reference(result, {}) is result  # nothing shared: the result as it was
