"""The host side of a kernel's dynamic shared memory: the launch's request and the opt-in
attribute (``cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, n)``) that
a request past 48 KiB needs, kept in step by the rules that stage data there or take it out."""

from __future__ import annotations

from collections.abc import Callable

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Declaration, Function, Launch, Node, ParsedSource
from klineage.cuda.tree import NotInForm, call_arguments, strip_parens, walk

__all__ = [
    "OPT_IN",
    "idle_requests",
    "kernel_byte_buffer",
    "opt_in_calls",
    "own_launches",
    "request_edits",
    "size_text",
]

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


def request_edits(
    source: ParsedSource, launches: list[Launch], extra: Callable[[Launch], str], needed: str
) -> list[Edit]:
    """Each launch asks for ``extra(launch)`` more bytes of dynamic shared memory, and its
    opt-in opts in to the new total (one is added where there is none: data-sized bytes may
    pass 48 KiB). Raises NotInForm (with ``needed``, the rule's form) for an opt-in of another
    size than its launch's, which the new request could not keep in step with."""
    edits: dict[int, Edit] = {}
    for launch in launches:
        more = extra(launch)
        current = launch.shared_memory
        if current is None:
            block = launch.block
            assert block is not None
            total = more
            edits[block.end_byte] = Edit.insert(block.end_byte, f", {total}")
        else:
            text = source.text_of(current)
            total = more if fold_int(source, current) == 0 else f"{text} + {more}"
            edits[current.start_byte] = Edit.replace(current, total)
        opt_ins = opt_in_calls(source, launch)
        for size in opt_ins:
            if current is None or size_text(source, size) != size_text(source, current):
                raise NotInForm(
                    f"an opt-in `{source.snippet(size, 40)}` for another size than the launch's",
                    needed,
                )
            edits[size.start_byte] = Edit.replace(size, f"(int)({total})")
        if not opt_ins:
            statement = launch.node.parent
            assert statement is not None
            callee = launch.node.child_by_field_name("function")
            name = source.text_of(callee) if callee is not None else launch.kernel
            line = f"cudaFuncSetAttribute({name}, {OPT_IN}, (int)({total}));"
            edits[statement.start_byte] = source.line_insertion(statement, line)
    return list(edits.values())


def own_launches(source: ParsedSource, function: Function, needed: str) -> list[Launch]:
    """The kernel's launches in this file, each a statement of its own passing every argument
    (a rule rewrites their request, or puts an opt-in before them); NotInForm (with
    ``needed``, the rule's form) names one that is not, or says there is none."""
    launches = source.launches_of(function)
    if not launches:
        raise NotInForm(f"{function.name}, never launched in this file", needed)
    for launch in launches:
        statement = launch.node.parent
        if (
            len(launch.args) != len(function.params)
            or len(launch.config) < 2
            or statement is None
            or statement.type != "expression_statement"
            or statement.parent is None
            or statement.parent.type != "compound_statement"
        ):
            raise NotInForm(
                f"a launch `{source.snippet(launch.node, 50)}` that is not a statement of its "
                "own passing every argument",
                needed,
            )
    return launches


def kernel_byte_buffer(source: ParsedSource, function: Function, needed: str) -> Declaration | None:
    """The kernel's own dynamic shared buffer, a byte array declared at the top of its body
    (None: the kernel has none), which a staging rule can put its data in front of; NotInForm
    (with ``needed``, the rule's form) for several, another type, or one declared outside."""
    body = function.body
    assert body is not None
    mine = [
        d
        for d in source.shared_declarations
        if d.is_extern and body.start_byte <= d.node.start_byte < body.end_byte
    ]
    if len(mine) > 1:
        raise NotInForm(f"{function.name}, with {len(mine)} dynamic shared buffers", needed)
    if not mine:
        for declaration in source.shared_declarations:
            if declaration.is_extern and any(
                source.text_of(n) in declaration.names for n in walk(body) if n.type == "identifier"
            ):
                raise NotInForm(
                    "a kernel using a dynamic shared buffer declared outside it", needed
                )
        return None
    buffer = mine[0]
    if buffer.node.parent != body or buffer.type.replace("unsigned", "").strip() not in (
        "char",
        "uint8_t",
    ):
        raise NotInForm(
            f"a dynamic buffer `{source.snippet(buffer.node, 50)}` not a byte array declared "
            "at the top of the kernel",
            needed,
        )
    return buffer
