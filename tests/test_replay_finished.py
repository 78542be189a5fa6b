"""bench/replay_finished.py: a chunked replay skips the problems a chunk finished with the
same skill library and methods, and runs them all again when the library changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.bench_scripts import load_bench_script
from tests.conftest import REPO

finished = load_bench_script("replay_finished")
METHODS = ["skills", "blind"]


def _repo(tmp_path: Path) -> Path:
    """A repo with three held-out problems of different naive costs and a skill library."""
    problems = {}
    for name, ms in (("slow", 9.0), ("fast", 1.0), ("middle", 4.0)):
        folder = tmp_path / "heldout" / name
        folder.mkdir(parents=True)
        (folder / "definition.json").write_text(json.dumps({"name": f"{name}_f32"}))
        problems[name] = {"folder": f"heldout/{name}", "workloads": [{"latency_ms": ms}]}
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench/results/heldout_baseline.json").write_text(
        json.dumps({"problems": problems})
    )
    (tmp_path / "skills_out").mkdir()
    (tmp_path / "skills_out/skills.jsonl").write_text('{"id": "a"}\n')
    return tmp_path


def _finish(out: Path, name: str, methods: list[str], when: float) -> None:
    (out / "lineages").mkdir(parents=True, exist_ok=True)
    for method in methods:
        path = out / "lineages" / f"{name}.{method}.json"
        path.write_text("{}")
        os.utime(path, (when, when))


def test_a_chunk_skips_what_an_earlier_chunk_finished(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    out = repo / "replay_out"
    assert finished.to_run(repo, out, METHODS) == ["heldout/fast", "heldout/middle", "heldout/slow"]
    _finish(out, "fast_f32", METHODS, 2000.0)  # both methods, during the chunk
    _finish(out, "middle_f32", ["skills"], 2000.0)  # cut before its blind search ended
    _finish(out, "slow_f32", METHODS, 500.0)  # an older chunk's lineages
    assert finished.mark(repo, out, METHODS, since=1000.0) == ["fast_f32"]
    assert finished.to_run(repo, out, METHODS) == ["heldout/middle", "heldout/slow"]
    # the last chunk lists them all, to write the report over every problem
    assert len(finished.to_run(repo, out, METHODS, everything=True)) == 3


def test_another_library_or_other_methods_run_everything_again(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    out = repo / "replay_out"
    _finish(out, "fast_f32", METHODS, 2000.0)
    finished.mark(repo, out, METHODS, since=1000.0)
    assert "heldout/fast" not in finished.to_run(repo, out, METHODS)
    assert "heldout/fast" in finished.to_run(repo, out, [*METHODS, "tree"])
    (repo / "skills_out/skills.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    assert "heldout/fast" in finished.to_run(repo, out, METHODS)


def test_problems_finished_with_another_library_go_after_new_work(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    out = repo / "replay_out"
    _finish(out, "fast_f32", METHODS, 2000.0)
    finished.mark(repo, out, METHODS, since=1000.0)
    (repo / "skills_out/skills.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    # fast was finished with the old library: rerun, but after the two never finished
    assert finished.to_run(repo, out, METHODS) == ["heldout/middle", "heldout/slow", "heldout/fast"]


def test_changed_rules_run_a_finished_problem_again(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "klineage" / "mechanisms").mkdir(parents=True)
    rule = repo / "klineage" / "mechanisms" / "rule.py"
    rule.write_text("SITES = 1\n")
    out = repo / "replay_out"
    _finish(out, "fast_f32", METHODS, 2000.0)
    finished.mark(repo, out, METHODS, since=1000.0)
    assert "heldout/fast" not in finished.to_run(repo, out, METHODS)
    rule.write_text("SITES = 2\n")  # a rule that now offers other moves
    assert finished.to_run(repo, out, METHODS)[-1] == "heldout/fast"


def test_the_chunk_script_orders_only_unfinished_problems() -> None:
    """The committed repo: the script's order command lists held-out folders that exist."""
    done = subprocess.run(
        [sys.executable, "bench/replay_finished.py", "order", "skills,blind"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "ALL": "1"},
    )
    expected = {f"heldout/{p.parent.name}" for p in (REPO / "heldout").glob("*/definition.json")}
    assert len(expected) == 22 and set(done.stdout.split()) == expected


def test_settle_marks_what_the_log_serves_and_names_what_it_lacks(tmp_path: Path) -> None:
    """A real offline replay (nvcc builds, the committed gate log of one problem): the problem
    the log serves whole is finished without a GPU; the one without a log needs the GPU."""
    for name in ("histogram", "gelu"):
        (tmp_path / "heldout").mkdir(exist_ok=True)
        (tmp_path / "heldout" / name).symlink_to(REPO / "heldout" / name)
    (tmp_path / "skills_out").symlink_to(REPO / "skills_out")
    (tmp_path / "bench/results").mkdir(parents=True)
    baseline = REPO / "bench/results/heldout_baseline.json"
    (tmp_path / "bench/results/heldout_baseline.json").write_bytes(baseline.read_bytes())
    member = "replay_out/gatelog/histogram_i32.jsonl"
    with tarfile.open(REPO / "bench/state/replay_gatelog.tar.xz") as archive:
        archive.extractall(tmp_path, members=[archive.getmember(member)], filter="data")

    settled, needs_gpu = finished.settle(tmp_path, ["skills"], profile=False)

    assert settled == ["heldout/histogram"]
    assert list(needs_gpu) == ["heldout/gelu"]
    assert "no logged verdict" in needs_gpu["heldout/gelu"]
    assert finished.to_run(tmp_path, tmp_path / "replay_out", ["skills"]) == ["heldout/gelu"]
