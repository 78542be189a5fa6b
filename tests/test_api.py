"""The public Python API as a notebook uses it: names, lazy imports and first calls."""

from __future__ import annotations

import functools
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from klineage import SkillLibrary, load_problem, retrieve
from klineage.skills import SkillLookupError
from tests.conftest import REPO


def _fresh_python(code: str) -> str:
    """Run `code` in a new interpreter (import order matters here) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_from_klineage_import_mine_and_replay_gives_the_functions() -> None:
    out = _fresh_python(
        """
        from klineage import mine, replay
        print(type(mine).__name__, mine.__module__, type(replay).__name__, replay.__module__)
        """
    )
    assert out == "function klineage.mining.mine function klineage.replay.run"


def test_the_functions_survive_their_modules_being_imported() -> None:
    # the replay package shares the function's name; a second lookup once found the package
    out = _fresh_python(
        """
        import klineage
        first = klineage.replay
        import klineage.replay.run, klineage.mining.mine
        from klineage import mine, replay
        print(callable(first), callable(klineage.replay), klineage.replay is first,
              callable(mine), callable(replay), callable(klineage.mine))
        """
    )
    assert out == "True True True True True True"


def test_the_submodules_stay_importable_by_name() -> None:
    out = _fresh_python(
        """
        import sys
        from klineage import mine
        from klineage.mining.mine import MineReport
        print(type(sys.modules["klineage.mining.mine"]).__name__, MineReport.__name__)
        """
    )
    assert out == "module MineReport"


def test_retrieve_takes_a_library_and_the_problems_own_kernel() -> None:
    library = SkillLibrary.load(REPO / "skills_out")
    problem = load_problem(REPO / "heldout" / "gelu")
    by_default = retrieve(library, problem)
    given = retrieve(list(library), problem, problem.kernel_source())
    as_text = retrieve(library, problem, problem.kernel_source().text)
    assert by_default.ranked, "the library has skills for gelu"
    assert [r.skill for r in by_default.ranked] == [r.skill for r in given.ranked]
    assert [r.skill for r in as_text.ranked] == [r.skill for r in given.ranked]


def test_a_mistyped_skills_folder_is_an_error_not_an_empty_library(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="skill_out: no such folder"):
        SkillLibrary.load(tmp_path / "skill_out")
    assert len(SkillLibrary.load(tmp_path / "skill_out", missing_ok=True)) == 0


def test_an_ambiguous_skill_prefix_names_every_match() -> None:
    library = SkillLibrary.load(REPO / "skills_out")
    with pytest.raises(SkillLookupError, match="ambiguous") as info:
        library.get("vectorized")
    matching = [i for i in library.skills if i.startswith("vectorized")]
    assert len(matching) > 1 and sorted(info.value.candidates) == sorted(matching)
    with pytest.raises(SkillLookupError, match="did you mean") as info:
        library.get("vectorised")
    assert all(c.startswith("vectorized_access--") for c in info.value.candidates)


def _undocumented(obj: object, prefix: str) -> list[str]:
    missing = [] if obj.__doc__ else [prefix]
    if not inspect.isclass(obj):
        return missing
    for attr, value in vars(obj).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        elif isinstance(value, property):
            value = value.fget
        elif isinstance(value, functools.cached_property):
            value = value.func
        if inspect.isfunction(value) and not value.__doc__:
            missing.append(f"{prefix}.{attr}")
    return missing


def test_every_public_name_and_method_has_a_docstring() -> None:
    import klineage

    missing = [m for name in klineage.__all__ for m in _undocumented(getattr(klineage, name), name)]
    assert missing == []


def test_torch_is_an_extra_and_reading_never_imports_it() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("torch") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("torch") for d in extras["torch"])
    assert any(d.startswith("torch") for d in extras["dev"])  # the tests run references
    out = _fresh_python(
        """
        import sys
        sys.modules["torch"] = None  # import torch fails, as where it is not installed
        from typer.testing import CliRunner
        from klineage import SkillLibrary, load_problem, retrieve
        from klineage.cli import app
        ranked = retrieve(SkillLibrary.load("skills_out"), load_problem("heldout/gelu")).ranked
        listed = CliRunner().invoke(app, ["skills", "list"])
        mechanisms = CliRunner().invoke(app, ["mechanisms", "list"])
        print(bool(ranked), listed.exit_code, mechanisms.exit_code)
        """
    )
    assert out == "True 0 0"


def test_kept_results_read_back_as_models_without_a_gpu() -> None:
    from klineage import ReplayReport

    report = ReplayReport.load(REPO / "bench" / "results" / "replay.json")
    methods = ["skills", "blind", "memory", "tree", "profiled"]
    assert {r.method for r in report.results} == set(methods)
    assert [s.method for s in report.summary] == methods
    with pytest.raises(ValueError, match=r"mine\.json: not a report written by `klineage replay`"):
        ReplayReport.load(REPO / "bench" / "results" / "mine.json")


def test_a_problem_is_scaffolded_from_a_kernel_through_the_top_level_name(tmp_path: Path) -> None:
    from klineage import Scaffold, new_problem

    kernel = tmp_path / "scale.cu"
    kernel.write_text(
        '#include <cstdint>\n#include <cuda_runtime.h>\nextern "C" int run(const float* x, '
        "float* y, int64_t n, cudaStream_t stream) { return 0; }\n"
    )
    made = new_problem("scale_f32", kernel, tmp_path / "scale_f32")
    assert isinstance(made, Scaffold)
    assert list(made.problem.definition.inputs) == ["x"]
    assert made.problem.definition.var_axes() == ["n"]


def test_visible_gpus_is_zero_without_torch() -> None:
    out = _fresh_python(
        """
        import sys
        sys.modules["torch"] = None  # import torch fails, as where it is not installed
        from klineage import visible_gpus
        print(visible_gpus())
        """
    )
    assert out == "0"


def test_a_kept_lineage_reads_as_a_graph_with_its_path_and_refusals() -> None:
    from klineage import LineageGraph

    lineage = LineageGraph.load(REPO / "skills_out" / "lineages" / "softmax_rows_f32.json")
    path = lineage.main_path()
    assert path[0].parent == lineage.root
    assert lineage.graph.has_edge(path[-1].parent, path[-1].child)
    assert lineage.refusals
    assert {"parent", "mechanism", "reason", "step"} <= set(lineage.refusals[0].model_dump())
    assert all(r.parent in lineage.graph for r in lineage.refusals)
