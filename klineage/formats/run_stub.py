"""A `run(...)` for an expert file that has none, for `klineage new`.

Public kernels come as `__global__` functions launched from a `main()`, a benchmark harness or
a PyTorch binding; klineage's ABI wants `extern "C" int run(inputs..., outputs..., axes...,
cudaStream_t)`. The kernel's own signature and the index analysis say most of it: a pointer
the kernel stores through (itself or in a helper) is an output, any other pointer an input; a
floating-point value is a scalar input; an integer value is an axis, passed as `int64_t` and
cast back. What they cannot say is the launch configuration, so the stub launches one block
of the kernel's `__launch_bounds__` (or 256 threads) and says, in the file and in the to-do
list, that the grid and block are the user's to set from how the kernel indexes its threads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.source import Function, Param, ParsedSource

__all__ = ["RunStub", "StubError", "run_stub"]

DEFAULT_THREADS = 256
"""The block the stub launches when the kernel states no ``__launch_bounds__``."""

_FLOATS = {"float", "double", "half", "__half", "__nv_bfloat16", "nv_bfloat16"}
_INTEGER = re.compile(r"\b(int|long|short|size_t|int\d+_t|uint\d+_t|unsigned)\b")


class StubError(ValueError):
    """No run(...) can be written for the file; the message says why and what to do."""


@dataclass(frozen=True)
class RunStub:
    """The run(...) written for one kernel."""

    kernel: str
    text: str
    """The C++ to append to the kernel file."""


def run_stub(source: ParsedSource, kernel_name: str | None, path: str) -> RunStub:
    """A run(...) that launches ``kernel_name`` (or the file's only launchable kernel)."""
    kernel = _chosen_kernel(source, kernel_name, path)
    stored = {
        a.buffer.name
        for a in analysis(source).indices(kernel).accesses()
        if a.buffer.space == "global" and a.direction != "load"
    }
    inputs: list[str] = []
    outputs: list[str] = []
    axes: list[str] = []
    arguments: list[str] = []
    for param in kernel.params:
        declared, argument, role = _passed(kernel, param, stored, path)
        {"input": inputs, "output": outputs, "axis": axes}[role].append(declared)
        arguments.append(argument)
    if not outputs:
        raise StubError(
            f"{path}: {kernel.name} stores through none of its pointers, so run(...) would have "
            "no output; write run(...) yourself (kernel ABI, README)"
        )
    threads = _block_threads(source, kernel)
    parameters = ", ".join([*inputs, *outputs, *axes, "cudaStream_t stream"])
    text = (
        "\n// run(...) written by `klineage new` for the kernel ABI. TODO: set the grid and the\n"
        f"// block from how {kernel.name} indexes its threads (one block of {threads} threads\n"
        "// until then, which computes the wrong answer for any real size).\n"
        "#include <cstdint>\n"
        f'extern "C" int run({parameters}) {{\n'
        f"  dim3 block({threads});  // TODO\n"
        "  dim3 grid(1);  // TODO\n"
        f"  {kernel.name}<<<grid, block, 0, stream>>>({', '.join(arguments)});\n"
        "  return (int)cudaGetLastError();\n"
        "}\n"
    )
    return RunStub(kernel.name, text)


def _chosen_kernel(source: ParsedSource, name: str | None, path: str) -> Function:
    kernels = [k for k in source.kernels if k.body is not None]
    if name is not None:
        found = next((k for k in kernels if k.name == name), None)
        if found is None:
            listed = ", ".join(k.name for k in kernels) or "none"
            raise StubError(f"{path}: no __global__ kernel {name} (its kernels: {listed})")
        kernel = found
    else:
        launchable = [k for k in kernels if not _undefaulted(source, k)]
        if len(kernels) == 1:
            launchable = kernels  # a template without defaults: said below
        if len(launchable) != 1:
            listed = ", ".join(k.name for k in kernels) or "none"
            raise StubError(
                f"{path}: no run(...) found, and it has {len(kernels)} kernels ({listed}); "
                "name the one run(...) should launch with --launch KERNEL"
            )
        kernel = launchable[0]
    missing = _undefaulted(source, kernel)
    if missing:
        raise StubError(
            f"{path}: {kernel.name} is a template whose parameters {', '.join(missing)} have no "
            "default, so run(...) cannot launch it as written; write run(...) yourself with "
            "the template arguments the kernel is meant for"
        )
    return kernel


def _undefaulted(source: ParsedSource, kernel: Function) -> list[str]:
    """Template parameters of the kernel with no default argument."""
    if kernel.template is None:
        return []
    found = []
    for parameter in kernel.template.named_children:
        if "optional" in parameter.type or parameter.type == "comment":
            continue
        found.append(source.text_of(parameter).split()[-1].lstrip("*&"))
    return found


def _passed(kernel: Function, param: Param, stored: set[str], path: str) -> tuple[str, str, str]:
    """(run's parameter, the kernel's argument, its role) for one kernel parameter."""
    name = param.name
    if not name:
        raise StubError(f"{path}: a parameter of {kernel.name} has no name")
    base = param.base_type
    if param.pointer_depth == 1:
        if name in stored:
            return f"{base}* {name}", name, "output"
        argument = name if param.is_const else f"const_cast<{base}*>({name})"
        return f"const {base}* {name}", argument, "input"
    if param.pointer_depth == 0 and base in _FLOATS:
        return f"{base} {name}", name, "input"
    if param.pointer_depth == 0 and _INTEGER.search(base):
        return f"int64_t {name}", f"({base}){name}", "axis"
    raise StubError(
        f"{path}: {kernel.name}'s parameter `{param.type} {name}` is neither a tensor, a "
        "floating-point scalar nor an integer axis; write run(...) yourself"
    )


def _block_threads(source: ParsedSource, kernel: Function) -> str:
    """The kernel's ``__launch_bounds__`` threads when run(...) can name them (a number, or a
    constant of the file, not a template parameter), else the default."""
    if kernel.launch_bounds is not None:
        first = re.search(r"\(\s*([^,()]+)", source.text_of(kernel.launch_bounds))
        threads = first.group(1).strip() if first else ""
        if threads.isdigit() or threads in source.integer_constants:
            return threads
    return str(DEFAULT_THREADS)
