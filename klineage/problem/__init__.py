"""Problems: a folder in the FlashInfer-Trace format, loaded and validated with helpful errors.

- :mod:`.models`: the definition, workloads and problem (pydantic), with the checks that need
  more than one field;
- :mod:`.load`: reading and writing the files, errors with file:line;
- :mod:`.dtypes`: the element types; :mod:`.errors`: :class:`ProblemError`;
- :mod:`.abi`: the `run(...)` signature a definition implies (the kernel ABI).

A problem folder holds ``definition.json``, ``workloads.jsonl`` (the sizes the kernel must
pass), optionally ``probes.jsonl`` (sizes tried but not required) and ``kernel.cu``.
"""

from klineage.problem.dtypes import SUPPORTED_DTYPES, dtype_itemsize, is_float_dtype, torch_dtype
from klineage.problem.errors import ProblemError
from klineage.problem.load import (
    dump_definition,
    dump_workloads,
    load_definition,
    load_problem,
    load_workloads,
)
from klineage.problem.models import (
    DEFINITION_FILE,
    KERNEL_FILE,
    PROBES_FILE,
    WORKLOADS_FILE,
    ConstAxis,
    Definition,
    IndicesOf,
    Problem,
    RandomInput,
    ScalarInput,
    TensorSpec,
    Tolerance,
    VarAxis,
    Workload,
)

__all__ = [
    "DEFINITION_FILE",
    "KERNEL_FILE",
    "PROBES_FILE",
    "SUPPORTED_DTYPES",
    "WORKLOADS_FILE",
    "ConstAxis",
    "Definition",
    "IndicesOf",
    "Problem",
    "ProblemError",
    "RandomInput",
    "ScalarInput",
    "TensorSpec",
    "Tolerance",
    "VarAxis",
    "Workload",
    "dtype_itemsize",
    "dump_definition",
    "dump_workloads",
    "is_float_dtype",
    "load_definition",
    "load_problem",
    "load_workloads",
    "torch_dtype",
]
