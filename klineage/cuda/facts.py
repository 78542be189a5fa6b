"""Static facts about a kernel's launches: block size, shared memory, as size expressions.

Conditions such as "the block size must be a multiple of 32" need the block size a kernel is
launched with. It is read from the launches in the file (``k<<<grid, block, smem, s>>>``),
folding file constants (``constexpr int kThreads = 256``), template arguments, and local
variables of the launching function that are never reassigned. Integer parameters of the
launching function are taken as axis names, as the kernel ABI passes every var axis to
``run`` under its own name, so ``<<<rows, min(cols, 1024)>>>`` gives the size expression
``min(cols, 1024)``, evaluated per workload by :mod:`klineage.conditions`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from klineage.conditions import DEFAULT_ARCH, EvalContext, evaluate_size
from klineage.cuda.cexpr import SIZEOF, fold_int, to_size_expr
from klineage.cuda.source import Declaration, Function, Launch, Node, ParsedSource
from klineage.cuda.tree import walk
from klineage.kernel import KernelSource

__all__ = [
    "INTEGER_TYPES",
    "block_size_of",
    "compile_time_bindings",
    "eval_context",
    "launch_block_size",
    "launch_names",
    "never_instantiated",
    "shared_memory_of",
    "static_shared_bytes",
    "template_bindings",
]

INTEGER_TYPES = frozenset(  # integer types as declarations write them (qualifiers removed)
    {
        "int",
        "unsigned",
        "unsigned int",
        "uint",
        "long",
        "long long",
        "int64_t",
        "int32_t",
        "uint32_t",
        "uint64_t",
        "size_t",
        "unsigned long",
        "unsigned long long",
    }
)


def _assigned_names(source: ParsedSource, function: Function) -> set[str]:
    """Names written after their declaration in a function (assignments and ++/--)."""
    written: set[str] = set()
    if function.body is None:
        return written
    for node in source.iter_nodes(
        "assignment_expression", "update_expression", within=function.body
    ):
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is not None and target.type == "identifier":
            written.add(source.text_of(target))
    return written


def launch_names(
    source: ParsedSource, function: Function | None, bound: Mapping[str, int] | None = None
) -> dict[str, int | str]:
    """Names usable in size expressions inside ``function``: file constants, its integer
    parameters (as axis names), and its never-reassigned integer locals (folded), with its
    template parameters as ``bound`` gives them (one instantiation)."""
    names: dict[str, int | str] = {**source.integer_constants, **(bound or {})}
    if function is None:
        return names
    for param in function.params:
        if param.name and not param.is_pointer and param.base_type in INTEGER_TYPES:
            names.setdefault(param.name, param.name)
    if function.body is None:
        return names
    written = _assigned_names(source, function)
    for decl in source.declarations:
        if not (
            function.body.start_byte <= decl.node.start_byte < function.body.end_byte
        ) or decl.type not in INTEGER_TYPES | {"auto", "dim3"}:
            continue
        for name, declarator in zip(decl.names, decl.declarators, strict=True):
            if name in written or name in names:
                continue
            folded = _initial_size(source, decl.type, declarator, names)
            if folded is not None:
                names[name] = folded
    return names


def _initial_size(
    source: ParsedSource, type_name: str, declarator: Node, names: dict[str, int | str]
) -> str | None:
    """The size expression a local starts with: ``int n = rows * 4`` or ``dim3 b(32, 8)``."""
    value = declarator.child_by_field_name("value")
    if type_name != "dim3":
        if value is not None and value.type == "initializer_list" and value.named_child_count == 1:
            value = value.named_children[0]  # `unsigned n{128U}`
        return None if value is None else to_size_expr(source, value, names)
    # `dim3 block(32, 8)` and `dim3 block{32, 8}`: the thread count is the product
    if value is None or value.type not in ("argument_list", "initializer_list"):
        value = next(
            (c for c in declarator.children if c.type in ("argument_list", "initializer_list")),
            value,
        )
    if value is None:
        return None
    if value.type not in ("argument_list", "initializer_list"):
        return to_size_expr(source, value, names)
    parts = [to_size_expr(source, a, names) for a in value.named_children]
    if not parts or any(p is None for p in parts):
        return None
    return " * ".join(f"({p})" for p in parts)


def _vexing_block(source: ParsedSource, launch: Launch) -> str | None:
    """A launch's threads per block where its block is ``dim3 block(THREADS);`` with names
    alone between the parentheses, which parses as a function declaration: each
    "parameter" a name or a number of the launching function."""
    block = launch.block
    caller = source.enclosing_function(launch.node)
    if block is None or block.type != "identifier" or caller is None or caller.body is None:
        return None
    name = source.text_of(block)
    declarators = [
        d
        for decl in source.declarations
        if decl.type == "dim3" and decl.node.parent == caller.body
        for n, d in zip(decl.names, decl.declarators, strict=True)
        if n == name and d.type == "function_declarator"
    ]
    if len(declarators) != 1:
        return None
    names = launch_names(source, caller)
    parameters = declarators[0].child_by_field_name("parameters")
    parts = []
    for parameter in parameters.named_children if parameters is not None else []:
        text = source.text_of(parameter).strip()
        known = names.get(text, text if text.rstrip("uUlL").isdigit() else None)
        if known is None:
            return None
        parts.append(str(known).rstrip("uUlL"))
    return " * ".join(f"({p})" for p in parts) if parts else None


def template_bindings(source: ParsedSource, launch: Launch) -> dict[str, int | str]:
    """Template parameter -> its argument's size expression, for a launch of a template."""
    kernel = source.function(launch.kernel)
    if kernel is None or not kernel.template_params:
        return {}
    names = launch_names(source, source.enclosing_function(launch.node))
    bound: dict[str, int | str] = {}
    for name, arg in zip(kernel.template_params, launch.template_args, strict=False):
        expr = to_size_expr(source, arg, names)
        if expr is not None:
            bound[name] = expr
    return bound


def _launch_expr(source: ParsedSource, launch: Launch, node: Node | None) -> str | None:
    if node is None:
        return None
    names = launch_names(source, source.enclosing_function(launch.node))
    return _simplified(to_size_expr(source, node, names))


def launch_block_size(source: ParsedSource, launch: Launch) -> str | None:
    """A launch's threads per block as a size expression (None when not static)."""
    return _launch_expr(source, launch, launch.block)


def _simplified(expr: str | None) -> str | None:
    """A constant expression as its value (``((4) * 32)`` -> ``128``); others unchanged."""
    value = evaluate_size(expr, {})
    return expr if value is None else str(value)


def _common(exprs: list[str | None]) -> str | None:
    """The one expression all launches agree on (after folding constants), else None."""
    if not exprs or None in exprs:
        return None
    first = exprs[0]
    assert first is not None
    return first if all(e == first for e in exprs) else None


def block_size_of(source: ParsedSource, kernel: str | Function) -> str | None:
    """The block size every launch of ``kernel`` in the file uses, as a size expression."""
    return _common([launch_block_size(source, launch) for launch in source.launches_of(kernel)])


def block_size_parameter(
    source: ParsedSource, kernel: Function, before: int | None = None
) -> str | None:
    """A compile-time name of the kernel that equals its threads per block at every launch
    (``k<.., 128><<<grid, 128>>>``, or a ``constexpr`` local of its body declared before
    byte ``before``), so device code may count the block's threads at compile time; None
    when no launch or no name shows it."""
    launches = source.launches_of(kernel)
    common: list[str] | None = None
    for launch in launches:
        threads = evaluate_size(launch_block_size(source, launch) or _vexing_block(source, launch))
        values = _compile_time_values(source, kernel, launch, before)
        equal = [n for n, v in values.items() if threads is not None and v == threads]
        common = equal if common is None else [n for n in common if n in equal]
    if not common:
        return None
    # several may equal it by chance (BM == 128 threads): the launch bounds' name first
    bounds = source.text_of(kernel.launch_bounds) if kernel.launch_bounds is not None else ""
    named = [n for n in common if re.search(rf"\b{re.escape(n)}\b", bounds)]
    return (named or common)[0]


def _compile_time_values(
    source: ParsedSource, kernel: Function, launch: Launch, before: int | None
) -> dict[str, int]:
    """The kernel's template parameters and top-level ``constexpr`` integer locals (declared
    before byte ``before``) as a launch instantiates them."""
    values: dict[str, int] = {}
    for name, expr in template_bindings(source, launch).items():
        bound = evaluate_size(expr)
        if bound is not None:
            values[name] = bound
    body = kernel.body
    if body is None:
        return values
    constants = [
        d
        for d in _constexpr_integers(source, body)
        if d.node.parent == body and (before is None or d.node.start_byte < before)
    ]
    return _folded(source, constants, values)


def _constexpr_integers(source: ParsedSource, body: Node) -> list[Declaration]:
    """The ``constexpr`` integer declarations in a function body, in order."""
    return [
        d
        for d in source.declarations
        if "constexpr" in d.qualifiers
        and d.type in INTEGER_TYPES
        and body.start_byte <= d.node.start_byte < body.end_byte
    ]


def _folded(
    source: ParsedSource, declarations: list[Declaration], values: dict[str, int]
) -> dict[str, int]:
    """``values`` with each declared constant that folds under them (and the file's
    constants) added, in order."""
    for declaration in declarations:
        for name, declarator in zip(declaration.names, declaration.declarators, strict=True):
            names: dict[str, int | str] = {**source.integer_constants, **values}
            folded = evaluate_size(_initial_size(source, declaration.type, declarator, names))
            if folded is not None:
                values[name] = folded
    return values


def static_shared_bytes(
    source: ParsedSource, function: Function, names: dict[str, int | str] | None = None
) -> int | None:
    """Bytes of the static ``__shared__`` arrays declared in a function; None when a size
    is not constant. ``names`` may bind template parameters."""
    if function.body is None:
        return 0
    names = {**source.integer_constants, **(names or {})}
    total = 0
    for decl in source.shared_declarations:
        if decl.is_extern or not (
            function.body.start_byte <= decl.node.start_byte < function.body.end_byte
        ):
            continue
        element = SIZEOF.get(decl.type)
        if element is None:
            return None
        for declarator in decl.declarators:
            count = 1
            current: Node | None = declarator
            while current is not None and current.type == "array_declarator":
                size = current.child_by_field_name("size")
                value = None if size is None else fold_int(source, size, names)
                if value is None:
                    return None
                count *= value
                current = current.child_by_field_name("declarator")
            total += element * count
    return total


def shared_memory_of(source: ParsedSource, kernel: str | Function) -> str | None:
    """Shared memory per block (static arrays + the launch's dynamic bytes), as a size
    expression; None when either part is not static or launches disagree."""
    function = source.function(kernel) if isinstance(kernel, str) else kernel
    launches = source.launches_of(kernel)
    if function is None:
        return None
    if not launches:
        static = static_shared_bytes(source, function)
        return None if static is None else str(static)
    exprs: list[str | None] = []
    for launch in launches:
        static = static_shared_bytes(source, function, template_bindings(source, launch))
        dynamic = (
            _launch_expr(source, launch, launch.shared_memory) if launch.shared_memory else "0"
        )
        exprs.append(
            None if static is None or dynamic is None else _simplified(f"{static} + {dynamic}")
        )
    return _common(exprs)


def eval_context(
    kernel: KernelSource, name: str | None = None, arch: str = DEFAULT_ARCH
) -> EvalContext:
    """The :class:`EvalContext` for one kernel function (default: the first ``__global__``)."""
    source = kernel.parsed
    if name is None:
        name = source.kernels[0].name if source.kernels else None
    if name is None:
        return EvalContext(arch=arch)
    return EvalContext(
        arch=arch,
        block_size=block_size_of(source, name),
        shared_memory_bytes=shared_memory_of(source, name),
    )


TEMPLATE_DEPTH = 8
"""How many enclosing templates :func:`template_values` follows (recursive templates stop)."""


def _type_parameters(source: ParsedSource, function: Function) -> set[str]:
    """The names of a template's type parameters (``typename T``, ``class U = float``)."""
    if function.template is None:
        return set()
    found = set()
    for child in function.template.named_children:
        if "type_parameter" in child.type:
            names = [c for c in child.named_children if c.type == "type_identifier"]
            found |= {source.text_of(c) for c in names}
    return found


def template_values(
    source: ParsedSource, function: str, depth: int = 0, *, skip_types: bool = False
) -> list[dict[str, int]] | None:
    """Every binding of `function`'s template parameters the file instantiates, followed out
    through enclosing templates: a helper `f<D>` called in a kernel `k<D>`, launched from a
    host `launch<D>`, which `run` calls as `launch<64>` and `launch<128>`, gives D = 64 and 128.
    `[{}]` for a function that is not a template; None when an instantiation cannot be
    folded to integers (a type argument, a runtime value) or there is none. With
    ``skip_types``, type parameters (``typename T``) are left out of the bindings instead."""
    found = source.function(function)
    if found is None or not found.template_params:
        return [{}]
    if depth >= TEMPLATE_DEPTH:
        return None
    types = _type_parameters(source, found) if skip_types else set()
    if set(found.template_params) <= types:
        return [{}]  # only types: nothing to bind, however it is instantiated
    uses: list[tuple[Node, tuple[Node, ...]]] = [
        (launch.node, launch.template_args) for launch in source.launches_of(function)
    ]
    for call in source.calls_named(function):
        if call.template_args is not None:
            arguments = tuple(c for c in call.template_args.named_children if c.type != "comment")
            uses.append((call.node, arguments))
    if not uses:
        # instantiated only where macros write it (a launch inside a binding macro)
        expanded = source.macro_expanded
        if expanded is None or expanded.function(function) is None:
            return None
        return template_values(expanded, function, depth + 1, skip_types=skip_types)
    bindings: list[dict[str, int]] = []
    for node, arguments in uses:
        if len(arguments) != len(found.template_params):
            return None  # defaulted or deduced arguments: not followed
        enclosing = source.enclosing_function(node)
        if enclosing is not None and never_instantiated(source, enclosing):
            continue  # a template nothing instantiates is never compiled: it binds nothing
        # arguments that fold without the enclosing template's parameters (`f<WARP_SIZE>`)
        # need none of its instantiations
        direct = _use_bindings(source, found, arguments, types, enclosing)
        if direct is None and enclosing is not None and enclosing.template_params:
            outer = template_values(source, enclosing.name, depth + 1, skip_types=skip_types)
            direct = (
                None
                if outer is None
                else _use_bindings(source, found, arguments, types, enclosing, outer)
            )
        if direct is None:
            return None
        bindings += [b for b in direct if b not in bindings]
    return bindings or None


def _use_bindings(
    source: ParsedSource,
    found: Function,
    arguments: tuple[Node, ...],
    types: set[str],
    enclosing: Function | None,
    outer: list[dict[str, int]] | None = None,
) -> list[dict[str, int]] | None:
    """The bindings of ``found``'s parameters one use gives, per binding of the enclosing
    function's own parameters (``outer``; without it, arguments that name none of them); None
    when an argument does not fold. The enclosing function's constexpr locals count:
    ``constexpr int STAGES = 3;``, and ``constexpr int WARPS = THREADS / 32;`` under each
    binding of its own parameters."""
    if outer is None:
        # a template argument may parse as a type (`f<W>`): its names are type identifiers
        kinds = ("identifier", "type_identifier")
        named = {source.text_of(n) for a in arguments for n in walk(a) if n.type in kinds}
        if enclosing is not None and named & set(enclosing.template_params):
            return None  # names the enclosing template's parameters: needs its bindings
        outer = [{}]
    found_bindings: list[dict[str, int]] = []
    for names in outer:
        local_sizes = launch_names(source, enclosing, names)
        folded_locals = {name: evaluate_size(size, names) for name, size in local_sizes.items()}
        known = {**{k: v for k, v in folded_locals.items() if v is not None}, **names}
        pairs = [
            (name, fold_int(source, argument, known))
            for name, argument in zip(found.template_params, arguments, strict=True)
            if name not in types
        ]
        binding = {name: value for name, value in pairs if value is not None}
        if len(binding) != len(pairs):
            return None
        if binding not in found_bindings:
            found_bindings.append(binding)
    return found_bindings


def never_instantiated(source: ParsedSource, function: Function) -> bool:
    """A template whose name appears nowhere but in its own definitions, in the file or in its
    macros' expansion: nothing launches, calls, explicitly instantiates (``template void
    f<float>(...);``) or takes the address of it, so it is never compiled."""
    if not function.template_params or _mentions_outside_definitions(source, function.name):
        return False
    expanded = source.macro_expanded  # expanded only when the file itself names it nowhere
    return expanded is None or not _mentions_outside_definitions(expanded, function.name)


def _mentions_outside_definitions(source: ParsedSource, name: str) -> bool:
    functions = source.functions
    definitions = [(f.outer.start_byte, f.outer.end_byte) for f in functions if f.name == name]
    for match in re.finditer(rb"\b" + re.escape(name.encode()) + rb"\b", source.data):
        if not any(start <= match.start() < end for start, end in definitions):
            return True
    return False


def compile_time_bindings(source: ParsedSource, function: Function) -> list[dict[str, int]] | None:
    """Per instantiation of ``function``, the values of its integer template parameters and
    of the ``constexpr`` integer locals of its body (``constexpr unsigned TILES{W / T};``);
    None when an instantiation cannot be folded (:func:`template_values`)."""
    bindings = template_values(source, function.name, skip_types=True)
    body = function.body
    if bindings is None or body is None:
        return bindings
    constants = _constexpr_integers(source, body)
    return [_folded(source, constants, dict(binding)) for binding in bindings]
