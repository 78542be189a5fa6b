"""A launch-size dispatch between two kernels replay measured: the split read from their
per-workload latencies, the source that holds both (real nvcc builds of log_softmax's block-
and warp-per-row rewrites), and a replay that gates it after a race (a stand-in gate at the
GPU boundary, timing each kernel by the rows it is fast on)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from klineage.gate.build import Builder
from klineage.gate.result import Comparison, GateVerdict, WorkloadVerdict
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.mining.removal import apply_everywhere
from klineage.problem import Problem, Workload, load_problem
from klineage.problem.abi import KernelAbi
from klineage.replay.dispatch import (
    NAMESPACES,
    DispatchRefused,
    Split,
    best_split,
    write_dispatch,
)
from klineage.replay.run import ReplayBudget, ReplayReport
from klineage.skills import SkillLibrary
from tests.bench_scripts import load_bench_script
from tests.conftest import REPO
from tests.mining.stand_in_gate import BASE_MS, StandInGate, _timing, replay_gated

LOG_SOFTMAX = REPO / "heldout" / "log_softmax"
AXES = ["rows", "cols"]  # log_softmax's var axes, in definition order
# its workloads, in order: rows x cols 4096 x 128, 4096 x 1024, 4096 x 4096, 2048 x 32000,
# 1024 x 50257
BLOCK = [12.6, 16.7, 43.9, 206.0, 260.0]  # a block per row: slow on short rows
WARP = [6.0, 13.0, 60.0, 400.0, 600.0]  # a warp per row: fast on short rows only


def _by_label(problem: Problem, values: Sequence[float]) -> dict[str, float]:
    return {w.label: v for w, v in zip(problem.workloads, values, strict=True)}


def test_the_split_runs_each_kernel_where_it_wins_and_only_past_noise() -> None:
    problem = load_problem(LOG_SOFTMAX)
    split = best_split(problem, [_by_label(problem, BLOCK), _by_label(problem, WARP)])
    assert split is not None
    assert (split.axis, split.threshold, split.low) == ("cols", 1024, 1)  # warp up to 1024
    assert split.gain == pytest.approx(
        ((12.6 * 16.7) / (6.0 * 13.0)) ** (1 / 5), rel=1e-6
    )  # the two short-row workloads, over the block alone
    # 3% on one workload is within two verdicts' noise: no split
    close = [v * (0.97 if i == 0 else 1.2) for i, v in enumerate(BLOCK)]
    assert best_split(problem, [_by_label(problem, BLOCK), _by_label(problem, close)]) is None
    # a workload without a latency (not timed): no split
    partial = _by_label(problem, WARP)
    partial.pop(problem.workloads[0].label)
    assert best_split(problem, [_by_label(problem, BLOCK), partial]) is None


def _rivals() -> tuple[Problem, KernelSource, KernelSource]:
    problem = load_problem(LOG_SOFTMAX)
    naive = problem.kernel_source()
    block = apply_everywhere(naive, get("block_per_row"), Carrier())
    warp = apply_everywhere(naive, get("warp_per_row"), Carrier())
    assert len({naive.fingerprint, block.fingerprint, warp.fingerprint}) == 3
    return problem, block, warp


@pytest.mark.nvcc
def test_the_dispatch_holds_both_kernels_and_builds(shared_builder: Builder) -> None:
    problem, block, warp = _rivals()
    kernel = write_dispatch([block, warp], Split("cols", 1024, 1, 1.2), AXES)
    low, high = NAMESPACES
    assert f"if (cols <= 1024) return {low}::run_variant(x, y, rows, cols, stream);" in kernel.text
    assert f"return {high}::run_variant(x, y, rows, cols, stream);" in kernel.text
    assert kernel.text.count('extern "C"') == 1
    low_part = kernel.text[kernel.text.index(f"namespace {low}") :]
    assert "__shfl" in low_part.split(f"namespace {high}")[0]  # the warp kernel runs low
    assert KernelAbi.from_definition(problem.definition).mismatch(kernel.text) is None
    build = shared_builder.build(kernel.text, kernel.name)
    assert build.ok, build.message
    assert build.report is not None and len(build.report.kernels) == 2
    # later moves reach both kernels: fast math rewrites the expf of each
    faster = apply_everywhere(kernel, get("fast_math"), Carrier())
    for namespace in NAMESPACES:
        part = faster.text.split(f"namespace {namespace}")[1]
        assert "__expf" in part.split("}  // namespace")[0]


def test_a_kernel_without_run_or_the_axis_is_refused() -> None:
    _, block, warp = _rivals()
    no_run = KernelSource("__global__ void k(float* y) { y[0] = 1.f; }\n")
    with pytest.raises(DispatchRefused, match="defines no run"):
        write_dispatch([no_run, warp], Split("cols", 1024, 0, 1.2), AXES)
    with pytest.raises(DispatchRefused, match="no parameter for the axis tokens"):
        write_dispatch([block, warp], Split("tokens", 8, 0, 1.2), AXES)
    # the ABI passes the axes by place: a `run` that names its column count otherwise
    renamed = KernelSource(re.sub(r"\bcols\b", "width", warp.text), warp.name)
    kernel = write_dispatch([block, renamed], Split("cols", 1024, 1, 1.2), AXES)
    assert "if (width <= 1024) return" in kernel.text
    once = write_dispatch([block, warp], Split("cols", 1024, 1, 1.2), AXES)
    with pytest.raises(DispatchRefused, match="a dispatch already"):
        write_dispatch([once, block], Split("cols", 4096, 0, 1.2), AXES)


class _RowLengthGate(StandInGate):
    """The GPU boundary: a block-per-row kernel takes `BLOCK` on each workload, a warp-per-row
    one `WARP`, a dispatch between them the faster of the two, anything else 100 x `BLOCK`."""

    def run(self, problem: Problem, kernel: KernelSource, **options: Any) -> GateVerdict:
        self._times = (self._model(problem, kernel), options.get("against"))
        return super().run(problem, kernel, **options)

    def _model(self, problem: Problem, kernel: KernelSource | None) -> dict[str, float]:
        block, warp = _by_label(problem, BLOCK), _by_label(problem, WARP)
        text = "" if kernel is None else kernel.text
        if "run_variant" in text:
            return {label: min(block[label], warp[label]) for label in block}
        if "__shfl" in text and "__syncthreads" in text:
            return block
        if "__shfl" in text:
            return warp
        return {label: 100 * value for label, value in block.items()}

    def _one(self, workload: Workload, *args: Any, **kwargs: Any) -> WorkloadVerdict:
        result = super()._one(workload, *args, **kwargs)
        model, against = self._times
        if result.timing is not None:
            result.timing = _timing(BASE_MS * model[workload.label])
            if against is not None:
                base = self._model_for(against)
                result.comparison = Comparison.of(
                    result.timing, _timing(BASE_MS * base[workload.label])
                )
        return result

    def _model_for(self, kernel: KernelSource) -> dict[str, float]:
        return self._model(load_problem(LOG_SOFTMAX), kernel)


def _replay_with_rivals(builder: Builder, tmp_path: Path) -> ReplayReport:
    """The skills method on log_softmax with the committed block-per-row, warp-per-row and
    dispatch skills, on the stand-in gate above (6 gate runs; out: tmp_path/out)."""
    committed = SkillLibrary.load(REPO / "skills_out")
    wanted = {"block_per_row", "warp_per_row", "launch_size_dispatch"}
    SkillLibrary(tmp_path / "lib", [s for s in committed if s.mechanism in wanted]).save()
    return replay_gated(
        [LOG_SOFTMAX],
        tmp_path / "lib",
        tmp_path / "out",
        gate=_RowLengthGate(builder),
        methods=["skills"],
        budget=ReplayBudget(gate_runs=6),
    )


@pytest.mark.nvcc
def test_after_a_race_the_skills_method_gates_a_dispatch_between_the_rivals(
    shared_builder: Builder, tmp_path: Path
) -> None:
    report = _replay_with_rivals(shared_builder, tmp_path)
    [result] = report.results
    actions = [(r.action, r.outcome) for r in result.runs]
    assert ("launch_size_dispatch", "kept") in actions
    [dispatch] = [r for r in result.runs if r.action == "launch_size_dispatch"]
    assert dispatch.carrier == {"axis": "cols", "threshold": 1024}
    assert dispatch.intent.startswith("warp_per_row where cols <= 1024, block_per_row above")
    # the rivals' skills are used too, each once, before the dispatch's
    used = [u.skill.split("--")[0] for u in result.skills_used]
    assert used[-1] == "launch_size_dispatch"
    assert sorted(used[:-1]) == ["block_per_row", "warp_per_row"]
    # the walk went on from the dispatch: as fast as the faster kernel on every workload
    best = {
        w.label: min(b, v)
        for w, b, v in zip(load_problem(LOG_SOFTMAX).workloads, BLOCK, WARP, strict=True)
    }
    assert result.best_ms == pytest.approx({k: BASE_MS * v for k, v in best.items()}, rel=0.01)


@pytest.mark.nvcc
def test_a_served_replay_that_stops_for_a_dispatch_names_its_split(
    shared_builder: Builder, tmp_path: Path
) -> None:
    """bench/replay_served.py on the log of the replay above, its dispatch's verdict cut: it
    stops there and says which split it needed and what the split predicts."""
    _replay_with_rivals(shared_builder, tmp_path)
    lineage = json.loads((tmp_path / "out/lineages/log_softmax_f32.skills.json").read_text())
    [dispatch] = [e["target"] for e in lineage["edges"] if e["mechanism"] == "launch_size_dispatch"]
    log = tmp_path / "out" / "gatelog" / "log_softmax_f32.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["verdict"]["fingerprint"] != dispatch]
    assert len(kept) == len(lines) - 1
    log.write_text("".join(kept))
    served = load_bench_script("replay_served").served
    row = served(
        LOG_SOFTMAX,
        "skills",
        log.parent,
        skills=tmp_path / "lib",
        budget=6,
        skip_no_ops=False,
        builder=shared_builder,
    )
    assert "needs the GPU" in row["missing"]
    assert row["missing_dispatch"].startswith("cols <= 1024: the kernel faster there")
    assert "predicted 1.22x" in row["missing_dispatch"]  # (12.6 * 16.7 / 6 / 13) ** (1 / 5)
