"""libcu++'s asynchronous copies, ``cuda::memcpy_async``, read for cp_async_pipeline.

A thread's copy ``cuda::memcpy_async(dst, src, size, sync)`` completes through ``sync``:

- a ``cuda::barrier`` (``__shared__ cuda::barrier<cuda::thread_scope_block> bar;``): the
  copy lands before the barrier's phase completes, and every reader waits on the barrier
  (``bar.arrive_and_wait()``). A synchronous copy has landed before its thread arrives, so
  the waits order it as they ordered the asynchronous one, and they stay;
- a pipeline of one thread (``cuda::pipeline<cuda::thread_scope_thread> pipe =
  cuda::make_pipeline();``): only the copying thread waits for its copies
  (``pipe.consumer_wait()``, ``cuda::pipeline_consumer_wait_prior<N>(pipe)``), and its own
  synchronous stores are visible to it at once, so the pipeline's steps
  (``producer_acquire``, ``producer_commit``, ``consumer_wait``, ``consumer_release``) have
  nothing left to order; other threads read the tile after a block barrier, as before.

A pipeline shared by a block (``cuda::make_pipeline(block, &state)``) orders one thread's
copies for another thread's reads through its own waits, so its copies are refused, as are
the group copies (``cuda::memcpy_async(group, ...)``, ``cooperative_groups::memcpy_async``).
The sync object is read from its declaration: a local or ``__shared__`` variable, a
parameter, or a template parameter whose every call site passes one of the two kinds.

A copy whose size is written ``cuda::aligned_size_t<A>(S)`` in the call, with ``S`` 4, 8
or 16 bytes and ``A`` at least ``S``, is written as one vector copy (the alignment is the
copy's contract); any other size, a local holding an aligned size included, as ``memcpy``
(the emulation must follow from the remembered call alone, which does not declare it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Call, Function, Node, ParsedSource
from klineage.cuda.tree import declaration_names, strip_parens, walk
from klineage.kernel import KernelSource

__all__ = [
    "CPP_COPY",
    "CppCopy",
    "cpp_copy",
    "cpp_copy_lines",
    "cpp_kind",
    "pipeline_copies",
    "sync_object",
    "sync_refusal",
]

CPP_COPY = "cuda::memcpy_async"
_STEPS = ("producer_acquire", "producer_commit", "consumer_wait", "consumer_release")
_WAIT_PRIOR = "cuda::pipeline_consumer_wait_prior"
_ALIGNED = re.compile(r"^(?:cuda::)?aligned_size_t\s*<\s*(.+?)\s*>$")
_DEPTH = 3
"""How many call levels a template parameter's sync object is traced through."""


@dataclass(frozen=True)
class CppCopy:
    """A ``cuda::memcpy_async(dst, src, size, sync)`` to make synchronous."""

    destination: str
    source: str
    size: str
    """The byte count as written (``memcpy``'s third argument)."""
    vector_bytes: int | None
    """4, 8 or 16 where the size is an aligned_size_t that aligns that many bytes."""


def _base_name(call: Call) -> str:
    """The callee without template arguments: ``cuda::pipeline_consumer_wait_prior``."""
    return call.name.split("<", 1)[0].strip()


def cpp_kind(call: Call) -> str | None:
    """``copy`` for a thread's ``cuda::memcpy_async`` (four arguments), ``group`` for a
    pipeline step (``pipe.consumer_wait()``, ``cuda::pipeline_consumer_wait_prior<N>(pipe)``),
    None for anything else."""
    name = _base_name(call)
    if name == CPP_COPY and len(call.args) == 4:
        return "copy"
    if name == _WAIT_PRIOR and len(call.args) == 1:
        return "group"
    if "." in name and name.rsplit(".", 1)[1] in _STEPS and not call.args:
        return "group"
    return None


def sync_object(source: ParsedSource, call: Call) -> Node | None:
    """The expression naming the pipeline or barrier a copy or step completes through."""
    name = _base_name(call)
    if name == CPP_COPY:
        return strip_parens(call.args[3])
    if name == _WAIT_PRIOR:
        return strip_parens(call.args[0])
    callee = call.node.child_by_field_name("function")
    target = callee.child_by_field_name("argument") if callee is not None else None
    return strip_parens(target) if target is not None else None


def sync_refusal(source: ParsedSource, call: Call) -> str | None:
    """Why the copy or step ``call`` cannot be made synchronous here, or None: its sync
    object must be a barrier or a one-thread pipeline (see the module's docstring)."""
    target = sync_object(source, call)
    function = source.enclosing_function(call.node)
    if target is None or target.type != "identifier" or function is None:
        return "its pipeline or barrier is not a plain variable"
    kind = _sync_kind(source, function, source.text_of(target), _DEPTH)
    if kind in ("barrier", "thread pipeline"):
        if kind == "barrier" and _base_name(call) != CPP_COPY:
            return "a barrier step, not a pipeline's"
        return None
    return kind


def _sync_kind(source: ParsedSource, function: Function, name: str, depth: int) -> str:
    """``barrier``, ``thread pipeline``, or why the variable is neither."""
    declared = _declared_type(source, function, name)
    if declared is None:
        return f"{name} is not declared in {function.name}"
    text, value = declared
    compact = "".join(text.split())
    if _is_barrier(text):
        return "barrier"
    if "pipeline<cuda::thread_scope_thread>" in compact:
        return "thread pipeline"
    if compact == "auto" and value is not None:
        made = "".join(source.text_of(value).split())
        if made == "cuda::make_pipeline()":
            return "thread pipeline"
        return f"{name} is a pipeline made by `{source.snippet(value, 40)}`, shared by threads"
    if compact in function.template_params and depth > 0:
        return _passed_kind(source, function, name, depth - 1)
    return f"{name} is a `{text}`, neither a cuda::barrier nor a one-thread cuda::pipeline"


def _is_barrier(type_text: str) -> bool:
    """Whether a declared type is a ``cuda::barrier`` (or a pointer to one)."""
    compact = "".join(type_text.split())
    return "cuda::barrier<" in compact or compact.startswith("barrier<")


def _passed_kind(source: ParsedSource, function: Function, name: str, depth: int) -> str:
    """The kind every call of ``function`` passes for its parameter ``name``."""
    index = next((i for i, p in enumerate(function.params) if p.name == name), None)
    calls = [c for c in source.calls if _base_name(c) == function.name]
    if index is None or not calls:
        return f"{name} is a template parameter of {function.name}, which nothing here calls"
    kinds = set()
    for call in calls:
        caller = source.enclosing_function(call.node)
        argument = strip_parens(call.args[index]) if index < len(call.args) else None
        pointer = _dereferenced(argument)
        if caller is not None and pointer is not None:
            kinds.add(_pointee_kind(source, caller, source.text_of(pointer), depth))
            continue
        if caller is None or argument is None or argument.type != "identifier":
            return f"a call of {function.name} passes no plain variable for {name}"
        kinds.add(_sync_kind(source, caller, source.text_of(argument), depth))
    if len(kinds) == 1:
        return kinds.pop()
    return f"the calls of {function.name} pass different kinds of {name}"


def _dereferenced(argument: Node | None) -> Node | None:
    """``p`` of an argument ``*p`` (``(*frontBarrierPtr)``), else None."""
    if argument is None or argument.type != "pointer_expression":
        return None
    operand = argument.child_by_field_name("argument")
    operand = strip_parens(operand) if operand is not None else None
    return operand if operand is not None and operand.type == "identifier" else None


def _pointee_kind(source: ParsedSource, function: Function, name: str, depth: int) -> str:
    """The kind of what the pointer ``name`` points to: a ``cuda::barrier<...>*``, or a
    pointer initialized with ``&x``."""
    declared = _declared_type(source, function, name)
    if declared is None:
        return f"{name} is not declared in {function.name}"
    text, value = declared
    if _is_barrier(text):
        return "barrier"
    value = strip_parens(value) if value is not None else None
    if value is not None and value.type == "pointer_expression":
        target = value.child_by_field_name("argument")
        if target is not None and strip_parens(target).type == "identifier":
            return _sync_kind(source, function, source.text_of(strip_parens(target)), depth)
    return f"{name} points to something other than a cuda::barrier"


def _declared_type(
    source: ParsedSource, function: Function, name: str
) -> tuple[str, Node | None] | None:
    """The declared type of ``name`` (a parameter, or a local declared in the function's
    body) and its initializer, if any."""
    for param in function.params:
        if param.name == name:
            kind = param.node.child_by_field_name("type")
            return (source.text_of(kind) if kind is not None else param.type), None
    if function.body is None:
        return None
    for node in walk(function.body):
        if node.type != "declaration" or name not in declaration_names(source, node):
            continue
        kind = node.child_by_field_name("type")
        value = None
        for declarator in node.children_by_field_name("declarator"):
            if declarator.type == "init_declarator":
                value = declarator.child_by_field_name("value")
        return (source.text_of(kind) if kind is not None else ""), value
    return None


def cpp_copy(source: ParsedSource, call: Call) -> CppCopy:
    """The copy ``cuda::memcpy_async(dst, src, size, sync)`` stands for."""
    destination, origin, size = call.args[:3]
    return CppCopy(
        destination=source.text_of(destination),
        source=source.text_of(origin),
        size=" ".join(source.text_of(size).split()),
        vector_bytes=_aligned_bytes(source, strip_parens(size)),
    )


def _aligned_bytes(source: ParsedSource, size: Node) -> int | None:
    """4, 8 or 16 where ``size`` is ``cuda::aligned_size_t<A>(S)``, written in the call, with
    ``S`` that many bytes and ``A >= S``. A size held in a local is not read: the emulation
    is read again from the remembered call alone, where the local is not declared."""
    if size.type != "call_expression":
        return None
    callee = size.child_by_field_name("function")
    match = _ALIGNED.match(" ".join(source.text_of(callee).split())) if callee else None
    arguments = size.child_by_field_name("arguments")
    values = [a for a in arguments.named_children if a.type != "comment"] if arguments else []
    if match is None or len(values) != 1:
        return None
    bytes_ = fold_int(source, values[0])
    alignment = _fold_text(match.group(1))
    if bytes_ in (4, 8, 16) and alignment is not None and alignment >= bytes_:
        return bytes_
    return None


_ALIGNOF = re.compile(r"^alignof\s*\((.+)\)$")


def _fold_text(text: str) -> int | None:
    """The value of a constant expression written as text (``sizeof(float4)``, ``16``); the
    alignment of a type whose size is a power of two is its size (the scalar and vector
    types; ``float3``, 12 bytes, is aligned to 4 and is not read)."""
    aligned = _ALIGNOF.match(text.strip())
    if aligned is not None:
        size = _fold_text(f"sizeof({aligned.group(1)})")
        return size if size is not None and size & (size - 1) == 0 else None
    probe = KernelSource(f"constexpr unsigned long klineage_probe = {text};").parsed
    values = list(probe.nodes("init_declarator"))
    value = values[0].child_by_field_name("value") if values else None
    return fold_int(probe, value) if value is not None else None


def cpp_copy_lines(copy: CppCopy) -> list[str]:
    """The synchronous copy's statements."""
    lines = [
        "// cuda::memcpy_async made synchronous: the bytes land now, before this thread",
        "// arrives at the barrier or waits on its pipeline, which order them as before.",
    ]
    if copy.vector_bytes is None:
        return [*lines, f"memcpy({copy.destination}, {copy.source}, {copy.size});"]
    vector = {4: "unsigned", 8: "uint2", 16: "uint4"}[copy.vector_bytes]
    return [
        *lines,
        f"*reinterpret_cast<{vector}*>({copy.destination}) =",
        f"    *reinterpret_cast<const {vector}*>({copy.source});",
    ]


def pipeline_copies(source: ParsedSource, step: Call) -> list[Call]:
    """The asynchronous copies a pipeline step of one thread still orders: the
    ``cuda::memcpy_async`` calls through the same pipeline in the step's function, and the
    calls there that hand the pipeline to a function making such copies."""
    target = sync_object(source, step)
    function = source.enclosing_function(step.node)
    if target is None or function is None or function.body is None:
        return []
    name = source.text_of(target)
    copying = {  # the functions that make a thread's copies
        f.name
        for c in source.calls_named(CPP_COPY)
        if cpp_kind(c) == "copy" and (f := source.enclosing_function(c.node)) is not None
    }
    found = []
    for call in source.calls:
        if source.enclosing_function(call.node) != function:
            continue
        passed = [source.text_of(strip_parens(a)) for a in call.args]
        own_copy = cpp_kind(call) == "copy" and passed[3] == name
        if own_copy or (_base_name(call) in copying and name in passed):
            found.append(call)
    return found
