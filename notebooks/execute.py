"""Execute the notebooks top to bottom and save them with their outputs, as they are committed.

    python notebooks/execute.py                      # every notebook here, in place
    python notebooks/execute.py notebooks/02_mine.ipynb

Needs the `notebooks` extra (`pip install -e '.[notebooks]'`). On a machine with a CUDA GPU the
GPU cells run for real (minutes: mining and replay); without one they load the kept H200
results and say so. `tests/test_notebooks.py` executes them the same way, without saving.

What is saved is kept small and portable: no execution timings, no kernel or Python versions
in the metadata, and an output naming a machine path (a home, /tmp, /work) is an error.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

NOTEBOOK_TIMEOUT_S = 900.0
"""Wall time one notebook may take here (GPU cells mine and replay for real)."""

MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home|tmp|Users|opt|usr)/[^\s'\"]*")
"""An absolute path of this machine in an output: the notebooks print paths relative to the
repository root (or to their scratch folder)."""


def notebooks() -> list[Path]:
    """The notebooks in this folder, in reading order."""
    return sorted(HERE.glob("[0-9][0-9]_*.ipynb"))


def execute(
    path: Path, timeout_s: float = NOTEBOOK_TIMEOUT_S, env: dict[str, str] | None = None
) -> nbformat.NotebookNode:
    """Run the notebook at `path` in a fresh kernel, in its own folder; raises
    nbclient.exceptions.CellExecutionError on the first failing cell, and CellTimeoutError when
    the whole notebook runs past `timeout_s`. `env` is set for the kernel (and restored)."""
    notebook = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + timeout_s
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        # one deadline for the whole notebook: each cell gets what is left of it
        timeout_func=lambda _cell: max(1, int(deadline - time.monotonic())),
        startup_timeout=120,
        record_timing=False,
        coalesce_streams=True,  # one stream output per cell however the kernel chunked it
    )
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return notebook


def clean(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip what changes from run to run and machine to machine: execution metadata, the
    kernel's Python version."""
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    return notebook


def output_text(notebook: nbformat.NotebookNode) -> str:
    """Every text an output holds (streams, plain text, HTML, Markdown, errors), joined."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.extend(output.get("traceback", []))
            for kind, value in output.get("data", {}).items():
                if kind.startswith("text/"):
                    parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def machine_paths(notebook: nbformat.NotebookNode) -> list[str]:
    """Absolute machine paths in the notebook's outputs (none in a notebook fit to commit)."""
    return sorted(set(MACHINE_PATH.findall(output_text(notebook))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks (default: all of them)")
    parser.add_argument("--timeout", type=float, default=NOTEBOOK_TIMEOUT_S)
    args = parser.parse_args(argv)
    # the checkout's klineage, whatever is installed
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # tqdm (imported by a dependency where it is installed) warns from its own file's path
        # when ipywidgets is missing: a machine path in the output, and nothing about klineage
        "PYTHONWARNINGS": "ignore:IProgress not found",
    }
    failed = 0
    for path in args.paths or notebooks():
        started = time.monotonic()
        notebook = clean(execute(path.resolve(), args.timeout, env))
        found = machine_paths(notebook)
        if found:
            print(f"{path}: outputs name machine paths: {', '.join(found)}", file=sys.stderr)
            failed += 1
            continue
        nbformat.write(notebook, path)
        size = path.stat().st_size // 1024
        shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        print(f"{shown}: {time.monotonic() - started:.1f} s, {size} KiB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
