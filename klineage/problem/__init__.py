"""Problems: a folder in the FlashInfer-Trace format, loaded and validated with helpful errors.

- :mod:`.models`: the definition, workloads and problem (pydantic), with the checks that need
  more than one field;
- :mod:`.load`: reading and writing the files, errors with file:line;
- :mod:`.dtypes`: the element types; :mod:`.errors`: :class:`ProblemError`;
- :mod:`.abi`: the `run(...)` signature a definition implies (the kernel ABI).

A problem folder holds ``definition.json``, ``workloads.jsonl`` (the sizes the kernel must
pass), optionally ``probes.jsonl`` (sizes tried but not required), ``kernel.cu`` and
``compile_options.json`` (extra compiler and linker flags, :mod:`.compile_options`).
"""

from klineage.problem.compile_options import COMPILE_OPTIONS_FILE, CompileOptions
from klineage.problem.dtypes import SUPPORTED_DTYPES, dtype_itemsize, is_float_dtype, torch_dtype
from klineage.problem.errors import ProblemError
from klineage.problem.load import (
    dump_compile_options,
    dump_definition,
    dump_workloads,
    load_compile_options,
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
    "COMPILE_OPTIONS_FILE",
    "DEFINITION_FILE",
    "KERNEL_FILE",
    "PROBES_FILE",
    "SUPPORTED_DTYPES",
    "WORKLOADS_FILE",
    "CompileOptions",
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
    "dump_compile_options",
    "dump_definition",
    "dump_workloads",
    "is_float_dtype",
    "load_compile_options",
    "load_definition",
    "load_problem",
    "load_workloads",
    "torch_dtype",
]
