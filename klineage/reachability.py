"""Which functions of a kernel file can still run: those the ABI's entry reaches.

Removing a launch-size dispatch leaves the specialized kernel it chose defined but never
launched. A mechanism inside dead code can be "removed" at no cost, and mining would record a
skill with a ~1.00x effect: measured on code that never ran (gemm_bf16's first walk did exactly
this with the mma.sync path of its skinny kernel). Mining asks this module which functions are
live and leaves the rest alone.

Reachability is by name, conservatively: the roots are the `extern "C"` host functions (the
ABI's `run`), and a function is live when its name appears as an identifier in a live
function's body (a call, a `<<<...>>>` launch, `cudaFuncSetAttribute(kernel, ...)`, a function
pointer). A name that appears at file scope (a table of kernels, say) makes the function live.
"""

from __future__ import annotations

from klineage.kernel import KernelSource

_NAME_KINDS = ("identifier", "field_identifier")


def live_functions(kernel: KernelSource) -> set[str] | None:
    """Names of the functions the entry reaches; None when the file has no `extern "C"`
    entry (then nothing can be called dead)."""
    parsed = kernel.parsed
    functions = parsed.functions
    roots = [f for f in functions if f.extern_c]
    if not roots:
        return None
    defined = {f.name for f in functions}
    inside = [(f.outer.start_byte, f.outer.end_byte) for f in functions]
    referenced_by: dict[str, set[str]] = {}
    for function in functions:
        body = function.body if function.body is not None else function.node
        names = {parsed.text_of(node) for node in parsed.iter_nodes(*_NAME_KINDS, within=body)}
        referenced_by.setdefault(function.name, set()).update(names & defined)
    at_file_scope = {
        parsed.text_of(node)
        for node in parsed.iter_nodes(*_NAME_KINDS)
        if not any(start <= node.start_byte < end for start, end in inside)
    } & defined
    live = {f.name for f in roots} | at_file_scope
    todo = list(live)
    while todo:
        for name in referenced_by.get(todo.pop(), set()):
            if name not in live:
                live.add(name)
                todo.append(name)
    return live
