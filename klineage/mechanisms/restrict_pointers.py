"""``__restrict__`` on a kernel's pointer parameters.

Promising the compiler that a kernel's pointers do not alias lets it keep loaded values in
registers across stores, reorder loads, and (with ``const``) use the read-only data path.
One site per kernel: the optimization is the no-alias promise for the whole signature.

- remove: drop every ``__restrict__`` from the kernel's parameters;
- apply: add ``__restrict__`` to every single-level pointer parameter of a ``__global__``
  function. Refused when a launch in the file passes the same pointer to two parameters
  (an in-place call), since the promise would then be false.
"""

from __future__ import annotations

from collections.abc import Iterator

from klineage.conditions import Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem


def _restricted(function: Function) -> list[str]:
    return [p.name or "?" for p in function.params if p.restrict]


def _unrestricted(function: Function) -> list[str]:
    return [
        p.name
        for p in function.params
        if p.name and p.pointer_depth == 1 and not p.restrict and p.pointer is not None
    ]


def _aliasing_launch(source: ParsedSource, function: Function) -> str | None:
    """Why a launch makes ``__restrict__`` false: the same argument to two pointer params."""
    pointer_slots = [i for i, p in enumerate(function.params) if p.is_pointer]
    for launch in source.launches_of(function):
        seen: dict[str, str] = {}
        for index in pointer_slots:
            if index >= len(launch.args):
                continue
            text = " ".join(source.text_of(launch.args[index]).split())
            name = function.params[index].name or f"#{index}"
            if text in seen:
                line = source.line_of(launch.node.start_byte)
                return (
                    f"the launch at line {line} passes {text!r} as both {seen[text]} and {name}, "
                    "so the pointers alias"
                )
            seen[text] = name
    return None


@register
class RestrictPointers(Mechanism):
    name = "restrict_pointers"
    category = "memory"
    family = "pointer qualifiers"
    intent = (
        "Promise that a kernel's pointer arguments do not alias, so the compiler can keep "
        "loads in registers, reorder them, and use the read-only cache for const data."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            names = _restricted(function)
            if names:
                yield self.site(
                    source,
                    function.node,
                    span=(function.declarator.start_byte, function.declarator.end_byte),
                    kind="function_definition",
                    detail={"params": ", ".join(names)},
                )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.kernels:
            names = _unrestricted(function)
            if names:
                yield self.site(
                    source,
                    function.node,
                    span=(function.declarator.start_byte, function.declarator.end_byte),
                    kind="function_definition",
                    detail={"params": ", ".join(names)},
                    refusal=_aliasing_launch(source, function),
                )

    def _function(self, source: ParsedSource, site: Site) -> Function:
        function = source.enclosing_function(site.start_byte)
        if function is None or function.name != site.function:
            raise self.refuse(f"no kernel {site.function!r} at line {site.start_line}", site)
        return function

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        function = self._function(source, site)
        return [
            source.deletion(qualifier, spaces="after")
            for param in function.params
            for qualifier in param.restrict
        ]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        function = self._function(source, site)
        edits = []
        for param in function.params:
            if param.name not in _unrestricted(function) or param.pointer is None:
                continue
            inner = param.pointer.child_by_field_name("declarator")
            if inner is None:
                continue
            edits.append(Edit.insert(inner.start_byte, "__restrict__ "))
        return edits

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text=f"the pointer arguments of {site.function} must not overlap in memory",
                why="the harness passes distinct buffers; a launch passing one buffer twice "
                "breaks the promise",
            )
        ]
