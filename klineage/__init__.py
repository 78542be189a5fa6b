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

__all__ = [
    "BuildResult",
    "Builder",
    "Gate",
    "GatePool",
    "GateSetupError",
    "GateVerdict",
    "KernelAbi",
    "KernelSource",
    "Problem",
    "ProblemError",
    "Status",
    "WorkloadVerdict",
    "load_problem",
]
