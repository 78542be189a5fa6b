"""The notebooks run top to bottom on a machine without a GPU, from the committed results.

Each notebook is executed in a fresh kernel with no GPU visible (`CUDA_VISIBLE_DEVICES=""`), so
its GPU cells take their fallback and load the kept H200 results, as in CI; a failing cell
fails the test with its traceback. The committed notebooks are checked too: executed, small,
free of machine paths and volatile metadata. Needs the `notebooks` extra
(`pip install -e '.[notebooks]'`); skips without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from types import ModuleType

import pytest

from klineage import Builder
from tests.conftest import REPO

for _module in ("nbclient", "nbformat", "ipykernel", "pandas", "matplotlib"):
    pytest.importorskip(
        _module, reason=f"{_module} missing: the notebooks extra (pip install -e '.[notebooks]')"
    )

NOTEBOOKS = REPO / "notebooks"
EXPECTED = ["01_gate", "02_mine", "03_skills", "04_replay", "05_your_expert"]
NEED_NVCC = {"01_gate", "05_your_expert"}  # they build a kernel: the point is the build
NEED_GPU = {"01_gate", "02_mine", "04_replay", "05_your_expert"}  # cells with a fallback
NOTEBOOK_TIMEOUT_S = 180
"""Wall time a notebook may take on the CPU path (about 20 s each on an idle 2-core machine)."""
MAX_KIB = 400
"""A committed notebook's size: figures inline, but no huge outputs."""


def _runner() -> ModuleType:
    """notebooks/execute.py, the script that makes the committed outputs."""
    spec = importlib.util.spec_from_file_location("notebook_runner", NOTEBOOKS / "execute.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()


def _cases() -> list[pytest.param]:
    return [
        pytest.param(name, marks=[pytest.mark.nvcc] if name in NEED_NVCC else [], id=name)
        for name in EXPECTED
    ]


def test_the_notebooks_are_the_five_of_the_workflow() -> None:
    assert [p.stem for p in RUNNER.notebooks()] == EXPECTED


@pytest.mark.parametrize("name", _cases())
def test_a_notebook_runs_top_to_bottom_without_a_gpu(name: str, shared_builder: Builder) -> None:
    path = NOTEBOOKS / f"{name}.ipynb"
    env = {
        "CUDA_VISIBLE_DEVICES": "",  # the CPU path, even on a GPU machine
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        # the run's nvcc cache, not the user's: the experts' tests have built softmax already
        "KLINEAGE_CACHE_DIR": str(shared_builder.cache_dir),
    }
    executed = RUNNER.execute(path, NOTEBOOK_TIMEOUT_S, env)  # raises on a failing cell
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every code cell ran"
    text = RUNNER.output_text(executed)
    if name in NEED_GPU:
        assert "No CUDA GPU here" in text, "the GPU cells said they fell back"
    assert RUNNER.machine_paths(executed) == []


@pytest.mark.parametrize("name", EXPECTED)
def test_the_committed_notebook_is_executed_small_and_clean(name: str) -> None:
    path = NOTEBOOKS / f"{name}.ipynb"
    notebook = json.loads(path.read_text(encoding="utf-8"))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), "executed once, top to bottom, in order"
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    assert not [c for c in code if "execution" in c["metadata"]], "no execution timestamps"
    assert notebook["metadata"]["language_info"] == {"name": "python"}
    assert path.stat().st_size < MAX_KIB * 1024
    assert RUNNER.machine_paths(RUNNER.nbformat.reads(path.read_text(), as_version=4)) == []
