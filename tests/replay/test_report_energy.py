"""Replay's report with energy per call: the kept H200 report, its best kernels given the
joules per call a gate with `--energy` records, printed beside their latencies."""

from __future__ import annotations

from rich.console import Console

from klineage.cli.replay import print_report
from klineage.replay.run import ReplayReport
from tests.conftest import REPO


def test_energy_per_call_is_printed_only_where_it_was_measured() -> None:
    report = ReplayReport.load(REPO / "bench" / "results" / "replay.json")
    wide = Console(record=True, width=240)
    print_report(report, wide)
    assert "mJ/call" not in wide.export_text()
    first = report.results[0]
    joules = {label: 0.0021 for label in first.best_ms}
    report.results[0] = first.model_copy(update={"best_joules": joules})
    again = ReplayReport.model_validate_json(report.model_dump_json())
    assert again.results[0].best_joules == joules
    measured = Console(record=True, width=240)
    print_report(again, measured)
    text = measured.export_text()
    assert "best mJ/call" in text
    assert f"{len(joules) * 2.1:.4g}" in text  # summed over the workloads, in millijoules
