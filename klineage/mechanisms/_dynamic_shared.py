"""The host side of a kernel's dynamic shared memory: the launch's request and the opt-in
attribute (``cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, n)``) that
a request past 48 KiB needs, kept in step by the rules that stage data there or take it out."""

from __future__ import annotations

from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import call_arguments, strip_parens

__all__ = ["OPT_IN", "idle_requests", "opt_in_calls", "size_text"]

OPT_IN = "cudaFuncAttributeMaxDynamicSharedMemorySize"


def opt_in_calls(source: ParsedSource, launch: Launch) -> list[Node]:
    """The size arguments of the opt-in calls for the launched kernel in the function that
    launches it."""
    function = source.enclosing_function(launch.node)
    if function is None or function.body is None:
        return []
    found = []
    for call in source.calls_named("cudaFuncSetAttribute"):
        args = call_arguments(call.node)
        if (
            function.body.start_byte <= call.node.start_byte < function.body.end_byte
            and len(args) == 3
            and source.text_of(args[1]).strip() == OPT_IN
            and source.text_of(args[0]).lstrip("&( ").split("<")[0].strip() == launch.kernel
        ):
            found.append(args[2])
    return found


def size_text(source: ParsedSource, node: Node) -> str:
    """A size expression without casts, parentheses or spaces around it."""
    node = strip_parens(node)
    while node.type == "cast_expression" and node.child_by_field_name("value") is not None:
        value = node.child_by_field_name("value")
        assert value is not None
        node = strip_parens(value)
    return "".join(source.text_of(node).split())


def idle_requests(source: ParsedSource, function: Function) -> list[Edit]:
    """Each launch of ``function`` asks for no dynamic shared memory, and an opt-in for the
    launch's size opts in to none: called once none is left in the kernel, so the simpler
    state is not held to the occupancy of a request it no longer uses (llm.c layernorm k6
    without its staging, launched with ``(2 + 8) * C`` floats a block: one block an SM at
    C = 4096, where its threads allow eight). An opt-in for another size stays as it is."""
    edits: dict[int, Edit] = {}
    for launch in source.launches_of(function):
        request = launch.shared_memory
        if request is None or size_text(source, request) == "0":
            continue
        edits[request.start_byte] = Edit.replace(request, "0")
        for size in opt_in_calls(source, launch):
            if size_text(source, size) == size_text(source, request):
                edits[size.start_byte] = Edit.replace(size, "0")
    return list(edits.values())
