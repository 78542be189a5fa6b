"""``__launch_bounds__(maxThreads[, minBlocks])`` on a kernel.

Telling the compiler the largest block a kernel is launched with lets it budget registers
for that block size (and, with ``minBlocks``, for that many resident blocks per SM) instead
of the worst case of 1024 threads.

- remove: delete the attribute;
- apply: insert ``__launch_bounds__(N)`` after the return type. ``N`` comes from the
  carrier (``block_size``, or ``bound`` for an expression such as a template parameter), or
  is inferred from the kernel's launches in the file when they all use one compile-time
  block size: a literal, a file constant (kept by name), or a template argument (written as
  the kernel's template parameter). ``min_blocks`` (or ``min_blocks_expr``, an expression)
  adds the second argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import BlockSizeAtMost, Condition, Prose
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import block_size_of, launch_names, template_bindings
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms.base import Carrier, Mechanism, MechanismRefused, Site, register
from klineage.problem import Problem

_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
MAX_THREADS = 1024


def bound_args(node: Node) -> list[Node]:
    """The arguments of a `__launch_bounds__(...)` node (max threads, min blocks, ...)."""
    return [c for c in node.named_children if c.type != "comment"]


class _NoBound(Exception):
    """The block size cannot be inferred; the message says why."""


def _bound_for(source: ParsedSource, kernel: Function, launch: Launch) -> str:
    """The ``__launch_bounds__`` argument matching one launch's block size."""
    block = launch.block
    line = source.line_of(launch.node.start_byte)
    if block is None:
        raise _NoBound(f"the launch at line {line} has no block size")
    text = " ".join(source.text_of(block).split())
    constants = source.integer_constants
    if kernel.template_params and launch.template_args:
        # A block size spelled with the launch's template arguments is written with the
        # kernel's own template parameters: <<<g, kThreads>>> of k<kThreads> -> kThreads.
        mapping = {
            " ".join(source.text_of(arg).split()): param
            for param, arg in zip(kernel.template_params, launch.template_args, strict=False)
        }
        if text in mapping:
            return mapping[text]
        rewritten = _WORD.sub(lambda m: mapping.get(m.group(), m.group()), text)
        known = set(kernel.template_params) | set(constants)
        if rewritten != text and all(w in known for w in _WORD.findall(rewritten)):
            return rewritten
    if block.type == "identifier" and text in constants:
        return text
    value = fold_int(source, block, launch_names(source, source.enclosing_function(launch.node)))
    if value is None:
        raise _NoBound(
            f"the launch at line {line} uses block size {text!r}, not a compile-time constant"
        )
    return str(value)


def infer_bound(source: ParsedSource, kernel: Function) -> str:
    """The bound every launch of ``kernel`` in the file agrees on; :class:`_NoBound` if none."""
    launches = source.launches_of(kernel)
    if not launches:
        raise _NoBound(f"no launch of {kernel.name} in this file")
    bounds = {_bound_for(source, kernel, launch) for launch in launches}
    if len(bounds) > 1:
        raise _NoBound(f"launches of {kernel.name} use different block sizes: {sorted(bounds)}")
    return bounds.pop()


@register
class LaunchBounds(Mechanism):
    name = "launch_bounds"
    category = "launch"
    family = "launch bounds"
    intent = (
        "Declare the largest block size a kernel is launched with, so the compiler budgets "
        "registers for it instead of for 1024 threads."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "block_size": "max threads per block (default: inferred from the launches)",
        "bound": "the max-threads expression to write, e.g. a template parameter",
        "min_blocks": "minimum resident blocks per SM (second argument)",
        "min_blocks_expr": "the min-blocks expression to write, e.g. `kD == 128 ? 2 : 4`",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for kernel in source.kernels:
            node = kernel.launch_bounds
            if node is None:
                continue
            args = bound_args(node)
            detail: dict[str, str | int] = {}
            if args:
                detail["max_threads"] = source.text_of(args[0])
            if len(args) > 1:
                detail["min_blocks"] = source.text_of(args[1])
            yield self.site(source, node, detail=detail)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for kernel in source.kernels:
            if kernel.launch_bounds is None:
                yield self.site(
                    source,
                    kernel.node,
                    span=(kernel.declarator.start_byte, kernel.declarator.end_byte),
                    kind="function_definition",
                )

    def _kernel(self, source: ParsedSource, site: Site) -> Function:
        kernel = source.enclosing_function(site.start_byte)
        if kernel is None or not kernel.is_kernel:
            raise self.refuse(f"no kernel at line {site.start_line}", site)
        return kernel

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        node = self.node_at(source, site, "launch_bounds")
        before = source.data[node.start_byte - 1 : node.start_byte]
        return [source.deletion(node, spaces="before" if before in (b" ", b"\t") else "after")]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        node = self.node_at(source, site, "launch_bounds")
        args = bound_args(node)
        values: dict[str, int | str] = {}
        if args:
            value = fold_int(source, args[0])
            if value is not None:
                values["block_size"] = value
            else:
                values["bound"] = " ".join(source.text_of(args[0]).split())
        if len(args) > 1:
            minimum = fold_int(source, args[1])
            if minimum is not None:
                values["min_blocks"] = minimum
            else:  # a template-dependent count: kept as written, or re-applying would drop it
                values["min_blocks_expr"] = " ".join(source.text_of(args[1]).split())
        return Carrier(**values)

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        try:
            bound = infer_bound(source, self._kernel(source, site))
        except (_NoBound, MechanismRefused):
            return Carrier()
        value = _fold_text(source, bound)
        return Carrier(block_size=value) if value is not None else Carrier(bound=bound)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        kernel = self._kernel(source, site)
        bound = self._choose_bound(source, kernel, site, carrier)
        minimum = carrier.get_int("min_blocks")
        expression = carrier.get_str("min_blocks_expr")
        if minimum and expression:
            raise self.refuse("give either min_blocks or min_blocks_expr, not both", site, "apply")
        second = str(minimum) if minimum else expression
        text = f"__launch_bounds__({bound}{f', {second}' if second else ''})"
        type_node = kernel.node.child_by_field_name("type")
        if type_node is None:
            raise self.refuse(f"{kernel.name} has no return type to place the bound after", site)
        return [Edit.insert(type_node.end_byte, f" {text}")]

    def _choose_bound(
        self, source: ParsedSource, kernel: Function, site: Site, carrier: Carrier
    ) -> str:
        explicit = carrier.get_str("bound")
        size = carrier.get_int("block_size")
        reason = ""
        try:
            inferred: str | None = infer_bound(source, kernel)
        except _NoBound as why:
            inferred, reason = None, str(why)
        if size is not None:
            if not 0 < size <= MAX_THREADS:
                raise self.refuse(f"block_size={size} is not in 1..{MAX_THREADS}", site, "apply")
            launched = _fold_text(source, inferred) if inferred is not None else None
            # Keep the kernel's own spelling (kThreads) when it means the same number.
            if launched == size:
                return inferred
            if launched is not None and launched > size:
                # a block larger than the bound fails to launch (cudaErrorInvalidValue)
                raise self.refuse(
                    f"block_size={size} is below the {launched} threads {kernel.name} is "
                    "launched with; the launch would fail",
                    site,
                    "apply",
                )
            return str(size)
        if explicit:
            return explicit
        if inferred is None:
            raise self.refuse(
                f"cannot infer the block size of {kernel.name}: {reason}; "
                "pass --carrier block_size=N",
                site,
                "apply",
            )
        return inferred

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        if site.node_kind == "launch_bounds":
            carrier = self.carrier_of(kernel, site)
        else:
            carrier = self.default_carrier(kernel, site)
        size = carrier.get_int("block_size")
        bound = carrier.get_str("bound")
        # the kernel itself, not every kernel of its name (a dispatch has one per namespace)
        function = source.enclosing_function(site.start_byte)
        launched: str | Function = site.function if function is None else function
        if size is None and bound is not None:
            size = _bound_value(source, launched, bound)
        found: list[Condition] = []
        if size is not None:
            found.append(
                BlockSizeAtMost(
                    n=size,
                    block_size=block_size_of(source, launched),
                    why=f"a launch with more threads than __launch_bounds__({bound or size}) fails",
                )
            )
        else:
            found.append(
                Prose(
                    text=f"every launch of {site.function} must use at most "
                    f"{bound or 'the bound'} threads per block"
                )
            )
        minimum = carrier.get_int("min_blocks")
        if minimum:
            found.append(
                Prose(
                    text=f"{minimum} resident blocks per SM must fit in the register file",
                    why="the compiler caps registers per thread to make them fit and may spill",
                )
            )
        return found


def _bound_value(source: ParsedSource, kernel: str | Function, bound: str) -> int | None:
    """The number a bound such as ``kThreads`` stands for, when every launch of the kernel
    binds its template parameters to the same value."""
    value = _fold_text(source, bound)
    if value is not None:
        return value
    values = set()
    for launch in source.launches_of(kernel):
        names = {**source.integer_constants, **template_bindings(source, launch)}
        snippet = KernelSource(f"int klineage_value = {bound};\n").parsed
        declarators = snippet.nodes("init_declarator")
        node = declarators[0].child_by_field_name("value") if declarators else None
        values.add(None if node is None else fold_int(snippet, node, names))
    return values.pop() if len(values) == 1 else None


def _fold_text(source: ParsedSource, text: str) -> int | None:
    """The value of a bound written as text (``kThreads``, ``256``), with the file's
    constants; None when it is not constant (a template parameter)."""
    snippet = KernelSource(f"int klineage_value = {text};\n").parsed
    declarators = snippet.nodes("init_declarator")
    value = declarators[0].child_by_field_name("value") if declarators else None
    if value is None or snippet.errors:
        return None
    return fold_int(snippet, value, source.integer_constants)
