"""klineage: mine verified GPU-kernel optimization skills from expert CUDA kernels.

The public API: load a problem (or scaffold one from a kernel with `new_problem`), wrap a
kernel, judge it with the gate, mine skills from an expert kernel, retrieve them for a new
kernel and replay them there. `visible_gpus()` says whether the check and time stages (and so
`mine` and `replay`) can run here.

    from klineage import Gate, KernelSource, load_problem, mine, replay, retrieve

`mine` and `replay` are functions here, although modules of the same names exist
(`klineage/mine.py`, `klineage/replay.py`): reach those as `from klineage.mine import ...`.
"""

from __future__ import annotations

import importlib
import sys
import types

from klineage.gate.build import Builder, BuildResult
from klineage.gate.gate import Gate, GateSetupError
from klineage.gate.pool import GatePool, visible_gpus
from klineage.gate.result import GateVerdict, Status, WorkloadVerdict
from klineage.kernel import AbiError, KernelAbi, KernelSource
from klineage.problem import Problem, ProblemError, load_problem

__version__ = "0.1.0"

# Mining pulls in the tree-sitter source model; load it only when asked for, so that
# `import klineage` stays fast for scripts that only gate kernels.
_LAZY = {
    "mine": ("klineage.mine", "mine"),
    "MineReport": ("klineage.mine", "MineReport"),
    "MiningBudget": ("klineage.lineage", "MiningBudget"),
    "LineageGraph": ("klineage.lineage", "LineageGraph"),
    "Skill": ("klineage.skills", "Skill"),
    "SkillLibrary": ("klineage.skills", "SkillLibrary"),
    "replay": ("klineage.replay", "replay"),
    "ReplayReport": ("klineage.replay", "ReplayReport"),
    "ReplayBudget": ("klineage.materialize", "ReplayBudget"),
    "retrieve": ("klineage.retrieve", "retrieve"),
    "Retrieval": ("klineage.retrieve", "Retrieval"),
    "new_problem": ("klineage.scaffold", "new_problem"),
    "Scaffold": ("klineage.scaffold", "Scaffold"),
    "ScaffoldError": ("klineage.scaffold", "ScaffoldError"),
}


class _Package(types.ModuleType):
    """The package module, guarding the names of its lazy functions.

    Importing a submodule sets it as an attribute of its package: loading `klineage.mine`
    (which `klineage.replay` does, too) would replace the function `klineage.mine` with the
    module, and `from klineage import mine` would hand out a module that cannot be called.
    The submodule stays reachable through `sys.modules` and `from klineage.mine import ...`.
    """

    def __setattr__(self, name: str, value: object) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'klineage' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package

__all__ = [
    "AbiError",
    "BuildResult",
    "Builder",
    "Gate",
    "GatePool",
    "GateSetupError",
    "GateVerdict",
    "KernelAbi",
    "KernelSource",
    "LineageGraph",
    "MineReport",
    "MiningBudget",
    "Problem",
    "ProblemError",
    "ReplayBudget",
    "ReplayReport",
    "Retrieval",
    "Scaffold",
    "ScaffoldError",
    "Skill",
    "SkillLibrary",
    "Status",
    "WorkloadVerdict",
    "load_problem",
    "mine",
    "new_problem",
    "replay",
    "retrieve",
    "visible_gpus",
]
