"""Problems: a folder in the FlashInfer-Trace format, loaded and validated with helpful errors.

`klineage.problem` is the import path everyone uses; the models and the loader live in the
modules of this package.
"""

from klineage.problem.models import (
    DEFINITION_FILE,
    KERNEL_FILE,
    PROBES_FILE,
    SUPPORTED_DTYPES,
    WORKLOADS_FILE,
    ConstAxis,
    Definition,
    IndicesOf,
    Problem,
    ProblemError,
    RandomInput,
    ScalarInput,
    TensorSpec,
    Tolerance,
    VarAxis,
    Workload,
    dtype_itemsize,
    dump_definition,
    dump_workloads,
    is_float_dtype,
    load_definition,
    load_problem,
    load_workloads,
    torch_dtype,
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
