"""A problem folder from a kernel: `klineage new NAME --kernel FILE.cu`.

The kernel's `run(...)` says most of the definition (kernel ABI, README): `const T*` parameters
are input tensors, other pointers outputs, values before the first output scalar inputs, the
`int64_t` values after the outputs the var axes, and a `cudaStream_t` last. What it cannot say
is each tensor's shape and what the kernel computes: the scaffold reads each tensor's axes
from how the kernels run launches index it (:mod:`klineage.formats.shape_guess`), guesses the
others over all the axes, writes a reference that raises until it is filled in, one workload
with guessed sizes, and a `TODO.md` listing what to confirm. The folder validates as written,
so the gate can already build the kernel; checking and timing need the reference.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from klineage.formats.run_stub import StubError, run_stub
from klineage.formats.shape_guess import guess_shapes
from klineage.gate.sass import toolkit_roots
from klineage.headers import included_names, inline_local_headers, local_header_paths
from klineage.kernel import KernelSource
from klineage.problem import (
    COMPILE_OPTIONS_FILE,
    DEFINITION_FILE,
    KERNEL_FILE,
    WORKLOADS_FILE,
    Problem,
    load_problem,
)
from klineage.problem.abi import DeclaredParam, declared_run

GUESSED_EXTENT = 1024
"""The size every axis gets in the scaffold's one workload (to be confirmed)."""

TODO_FILE = "TODO.md"

_DTYPES = {
    "float": "float32",
    "double": "float64",
    "__half": "float16",
    "half": "float16",
    "__nv_bfloat16": "bfloat16",
    "nv_bfloat16": "bfloat16",
    "int64_t": "int64",
    "long": "int64",
    "long long": "int64",
    "int": "int32",
    "int32_t": "int32",
    "int16_t": "int16",
    "short": "int16",
    "int8_t": "int8",
    "char": "int8",
    "uint8_t": "uint8",
    "unsigned char": "uint8",
    "bool": "bool",
}
"""C types the ABI knows, by the definition dtype they stand for."""

_STREAMS = {"cudaStream_t", "CUstream"}


class ScaffoldError(ValueError):
    """The kernel's run(...) cannot be read as klineage's ABI; the message says where."""


@dataclass
class Scaffold:
    """What `new_problem` wrote, and what is left to the user."""

    problem: Problem
    todo: list[str] = field(default_factory=list)
    """What to confirm or fill in, in order."""


def _carry_headers(source: KernelSource, out: Path) -> list[str]:
    """Copy the local headers the kernel includes from under its folder into ``out``, at the
    same places (the build finds them there, and mining reads their macros); the to-do lines
    for the quoted includes that are not there."""
    assert source.path is not None
    home = source.path.parent.resolve()
    todo = []
    for path in local_header_paths(source):
        if not path.is_relative_to(home):
            todo.append(
                f"{KERNEL_FILE} includes {path.name} from {path.parent}: copy it into {out}, "
                f'or add "-I{path.parent}" to cuda_cflags in {COMPILE_OPTIONS_FILE}'
            )
            continue
        target = out / path.relative_to(home)
        if target.resolve() != path:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    for name in included_names(source.text):
        if not (source.path.parent / name).is_file() and not _toolkit_header(name):
            todo.append(
                f'{KERNEL_FILE} includes "{name}", found next to neither it nor {out}: unless '
                f'it is a toolkit header, copy it into {out} or add "-I<its folder>" to '
                f"cuda_cflags in {COMPILE_OPTIONS_FILE}"
            )
    return todo


_TOOLKIT_HEADERS = {
    "cuda.h",
    "cuda_runtime.h",
    "cuda_runtime_api.h",
    "device_launch_parameters.h",
    "cuda_fp16.h",
    "cuda_bf16.h",
    "cuda_fp8.h",
    "cooperative_groups.h",
    "mma.h",
    "cublas_v2.h",
}
"""CUDA toolkit headers kernels often include with quotes, known without a toolkit here."""


def _toolkit_header(name: str) -> bool:
    """Whether a quoted include names a CUDA toolkit header (nvcc finds it, nothing to copy)."""
    if name in _TOOLKIT_HEADERS:
        return True
    roots = toolkit_roots()
    folders = [r / "include" for r in roots] + [
        f for r in roots for f in r.glob("targets/*/include")
    ]
    return any((folder / name).is_file() for folder in folders)


def _name_of(param: DeclaredParam) -> str:
    words = re.findall(r"[A-Za-z_]\w*", param.text.split("[")[0])
    return words[-1] if words else ""


def _dtype_of(param: DeclaredParam, kernel: str) -> str:
    dtype = _DTYPES.get(param.type_name)
    if dtype is None:
        raise ScaffoldError(
            f"{kernel}: parameter `{param.text}` has type {param.type_name!r}, which the ABI "
            f"has no dtype for (known: {', '.join(sorted(_DTYPES))})"
        )
    return dtype


def _shapes_said(read: dict[str, list[str]], axes: list[str], tensors: list[str]) -> str:
    """How the scaffold came by the shapes: read from the kernel's indexing, or guessed."""
    parts = []
    shown = [t for t in tensors if t in read]
    if shown:
        parts.append(
            "read from the kernel's indexing: "
            + ", ".join(f"{t} [{', '.join(read[t])}]" for t in shown)
        )
    guessed = [t for t in tensors if t not in read]
    if guessed:
        parts.append(f"guessed over every axis ({', '.join(axes) or 'none'}): {', '.join(guessed)}")
    return "; ".join(parts)


def new_problem(
    name: str,
    kernel_path: str | Path,
    out: str | Path,
    *,
    inline_headers: bool = False,
    launch: str | None = None,
) -> Scaffold:
    """Write a problem folder at `out` for the kernel at `kernel_path`, guessed from its
    `run(...)`; refuses to overwrite a folder that already holds a definition. The local
    headers the kernel includes come along as files beside it, or with `inline_headers`
    written into kernel.cu in place of their includes (what a header holds can then be
    mined: a vector load inside a shared helper, say). A file without a `run(...)` (a public
    expert launched from its own harness) gets one that launches its kernel, or `launch`,
    with the grid and block left to the user (:mod:`klineage.formats.run_stub`)."""
    kernel_path, out = Path(kernel_path), Path(out)
    source = KernelSource.from_file(kernel_path)
    if inline_headers:
        source = source.with_text(inline_local_headers(source))
    stub_todo: list[str] = []
    declared = declared_run(source.text)
    if declared is None:
        try:
            stub = run_stub(source.parsed, launch, str(kernel_path))
        except StubError as err:
            raise ScaffoldError(str(err)) from None
        source = source.with_text(source.text.rstrip("\n") + "\n" + stub.text)
        declared = declared_run(source.text)
        assert declared is not None  # the stub is a run(...)
        stub_todo.append(
            f"{KERNEL_FILE}: set the grid and the block of the run(...) written for "
            f"{stub.kernel} (its TODO lines; one block until then), and check which pointers "
            "it took for outputs"
        )
    params = list(declared.params)
    if not params or params[-1].type_name not in _STREAMS:
        raise ScaffoldError(f"{kernel_path}:{declared.line}: run(...) must end with a cudaStream_t")
    params = params[:-1]
    inputs: dict[str, dict[str, object]] = {}
    outputs: dict[str, dict[str, object]] = {}
    axes: list[str] = []
    seen_output = False
    for param in params:
        pname = _name_of(param)
        if param.is_pointer:
            constant = re.search(r"\bconst\b", param.text.split("*")[0]) is not None
            if constant and seen_output:
                raise ScaffoldError(
                    f"{kernel_path}:{declared.line}: `{param.text}` is an input after an "
                    "output; the ABI passes inputs, then outputs"
                )
            seen_output = seen_output or not constant
            target = inputs if constant else outputs
            target[pname] = {"dtype": _dtype_of(param, str(kernel_path))}
        elif seen_output:
            if _DTYPES.get(param.type_name) != "int64":
                raise ScaffoldError(
                    f"{kernel_path}:{declared.line}: `{param.text}` follows the outputs, where "
                    "the ABI has the var axes, each an int64_t"
                )
            axes.append(pname)
        else:
            inputs[pname] = {"shape": None, "dtype": _dtype_of(param, str(kernel_path))}
    if not outputs:
        raise ScaffoldError(
            f"{kernel_path}:{declared.line}: run(...) has no output (a non-const pointer)"
        )
    read = guess_shapes(source.parsed, [*inputs, *outputs], axes)
    for tensor, spec in [*inputs.items(), *outputs.items()]:
        if "shape" in spec:
            continue
        if tensor in read:
            spec["shape"] = read[tensor]
            spec["description"] = "TODO: shape read from how the kernel indexes it; confirm it"
        else:
            spec["shape"] = list(axes)
            spec["description"] = "TODO: shape guessed over every axis; confirm it"
    reference = (
        "import torch\n\n\n"
        f"def run({', '.join(inputs)}):\n"
        f'    raise NotImplementedError("fill in the PyTorch reference of {name} '
        f'(definition.json, reference)")\n'
    )
    definition = {
        "name": name,
        "op_type": "TODO",
        "description": "TODO: what the kernel computes",
        "tags": ["scaffold"],
        "axes": {a: {"type": "var", "description": "TODO: confirm"} for a in axes},
        "inputs": inputs,
        "outputs": outputs,
        "reference": reference,
    }
    workload = {
        "uuid": f"{name}-0001",
        "axes": {a: GUESSED_EXTENT for a in axes},
        "inputs": {
            n: ({"type": "scalar", "value": 1.0} if s["shape"] is None else {"type": "random"})
            for n, s in inputs.items()
        },
    }
    if (out / DEFINITION_FILE).exists():
        raise ScaffoldError(f"{out} already holds a {DEFINITION_FILE}; choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / DEFINITION_FILE).write_text(json.dumps(definition, indent=2) + "\n", encoding="utf-8")
    (out / WORKLOADS_FILE).write_text(json.dumps(workload) + "\n", encoding="utf-8")
    if inline_headers or stub_todo or kernel_path.resolve() != (out / KERNEL_FILE).resolve():
        (out / KERNEL_FILE).write_text(source.text, encoding="utf-8")
    header_todo = _carry_headers(source, out)
    scalars = [n for n, spec in inputs.items() if spec["shape"] is None]
    pointers = [n for n in [*inputs, *outputs] if n not in scalars]
    todo = [
        *stub_todo,
        f"{DEFINITION_FILE}: write the reference's body (it raises until then)",
        f"{DEFINITION_FILE}: confirm each tensor's shape ({_shapes_said(read, axes, pointers)})",
        f"{DEFINITION_FILE}: set op_type and the description",
        f"{WORKLOADS_FILE}: real sizes for the axes (guessed {GUESSED_EXTENT} each)"
        + (f" and the values of {', '.join(scalars)} (guessed 1.0)" if scalars else ""),
        *header_todo,
        "then: klineage gate " + str(out),
    ]
    (out / TODO_FILE).write_text(
        "# To do\n\n" + "".join(f"- {t}\n" for t in todo), encoding="utf-8"
    )
    return Scaffold(problem=load_problem(out), todo=todo)
