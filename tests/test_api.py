"""The public Python API as a notebook uses it: names, lazy imports and first calls."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from klineage import SkillLibrary, load_problem, retrieve
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
    assert out == "function klineage.mine function klineage.replay"


def test_the_functions_survive_their_modules_being_imported() -> None:
    # replay's module imports mine's; a second lookup once used to find the module instead
    out = _fresh_python(
        """
        import klineage
        first = klineage.mine
        import klineage.replay, klineage.mine
        from klineage import mine, replay
        print(callable(first), callable(klineage.mine), klineage.mine is first,
              callable(mine), callable(replay), callable(klineage.replay))
        """
    )
    assert out == "True True True True True True"


def test_the_submodules_stay_importable_by_name() -> None:
    out = _fresh_python(
        """
        import sys
        from klineage import mine
        from klineage.mine import MineReport
        print(type(sys.modules["klineage.mine"]).__name__, MineReport.__name__)
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
