"""The bench scripts (bench/*.py are scripts, not a package), loaded for the tests of them."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import REPO


def load_bench_script(name: str) -> ModuleType:
    """bench/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic models resolve their annotations through it
    spec.loader.exec_module(module)
    return module
