"""klineage: mine verified GPU-kernel optimization skills from expert CUDA kernels.

The public API: load a problem (or scaffold one from a kernel with `new_problem`), wrap a
kernel, judge it with the gate, mine skills from an expert kernel, retrieve them for a new
kernel and replay them there. `visible_gpus()` says whether the check and time stages (and so
`mine` and `replay`) can run here.

    from klineage import Gate, KernelSource, load_problem, mine, replay, retrieve

`replay` is a function here, although a package of the same name exists (`klineage/replay/`):
reach its modules as `from klineage.replay.run import ...`.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

from klineage.gate.build import Builder, BuildResult
from klineage.gate.gate import Gate, GateSetupError
from klineage.gate.pool import GatePool, visible_gpus
from klineage.gate.result import GateVerdict, Status, WorkloadVerdict
from klineage.kernel import KernelSource, use_parser
from klineage.problem import Problem, ProblemError, load_problem
from klineage.problem.abi import AbiError, KernelAbi

if TYPE_CHECKING:
    from klineage.cuda.source import ParsedSource

__version__ = "0.1.0"


def _parse(kernel: KernelSource) -> ParsedSource:
    # the package wires the source model into KernelSource.parsed, so that kernel.py, the
    # bottom layer, needs no import of it; tree-sitter loads on the first parse, which keeps
    # `import klineage` fast for scripts that only gate kernels
    from klineage.cuda.source import ParsedSource

    return ParsedSource(kernel)


use_parser(_parse)

# Mining pulls in the tree-sitter source model; load it only when asked for, so that
# `import klineage` stays fast for scripts that only gate kernels.
_LAZY = {
    "mine": ("klineage.mining.mine", "mine"),
    "MineReport": ("klineage.mining.mine", "MineReport"),
    "MiningBudget": ("klineage.mining.walk", "MiningBudget"),
    "LineageGraph": ("klineage.lineage", "LineageGraph"),
    "Skill": ("klineage.skills", "Skill"),
    "SkillLibrary": ("klineage.skills", "SkillLibrary"),
    "replay": ("klineage.replay.run", "replay"),
    "ReplayReport": ("klineage.replay.run", "ReplayReport"),
    "ReplayBudget": ("klineage.replay.results", "ReplayBudget"),
    "retrieve": ("klineage.replay.retrieve", "retrieve"),
    "Retrieval": ("klineage.replay.retrieve", "Retrieval"),
    "new_problem": ("klineage.formats.scaffold", "new_problem"),
    "Scaffold": ("klineage.formats.scaffold", "Scaffold"),
    "ScaffoldError": ("klineage.formats.scaffold", "ScaffoldError"),
}


class _Package(types.ModuleType):
    """The package module, guarding the names of its lazy functions.

    Importing a subpackage sets it as an attribute of its package: loading `klineage.replay.run`
    would replace the function `klineage.replay` with the package, and `from klineage import
    replay` would hand out a module that cannot be called. The package stays reachable through
    `sys.modules` and `from klineage.replay.run import ...`.
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
