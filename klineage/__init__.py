"""klineage: mine verified GPU-kernel optimization skills from expert CUDA kernels.

The public API: load a problem, wrap a kernel, judge it with the gate.

    from klineage import Gate, KernelSource, load_problem
"""

from klineage.gate.build import Builder, BuildResult
from klineage.gate.gate import Gate, GateSetupError
from klineage.gate.pool import GatePool
from klineage.gate.result import GateVerdict, Status, WorkloadVerdict
from klineage.kernel import KernelAbi, KernelSource
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
    "replay": ("klineage.replay", "replay"),
    "ReplayReport": ("klineage.replay", "ReplayReport"),
    "ReplayBudget": ("klineage.materialize", "ReplayBudget"),
    "SkillLibrary": ("klineage.skills", "SkillLibrary"),
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'klineage' has no attribute {name!r}")


__all__ = [
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
    "Skill",
    "SkillLibrary",
    "Status",
    "WorkloadVerdict",
    "load_problem",
    "mine",
    "replay",
]
