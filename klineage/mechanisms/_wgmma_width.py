"""A wgmma block tile whose width is a kernel template parameter.

A Hopper GEMM written for any tile shape can take its block tile's N as a template
parameter (``template <int BM, int BN, ...>``) and hand it, directly or through a
local constant (``constexpr int width = BN;``), to a templated wgmma that picks the
instruction of that width::

    template <int N> __device__ void wgmma(float (&d)[N / 2], uint64_t a, uint64_t b) {
      if constexpr (N == 256) mma_n256(d, a, b);
      if constexpr (N == 128) mma_n128(d, a, b);
    }

Everything that follows the tile (shared tiles, accumulators, loops, and on the host the grid
and tensor maps) is written in terms of the parameter, so the width is one literal where the
host binds it (:mod:`klineage.mechanisms._launch_literal`). Removing the wide tile halves that
literal, where the templated wgmma has the half width; applying doubles it back. As with
the wide wgmma tile (N = 256), the wide tile is the widest width the templated wgmma writes:
a kernel bound to a narrower one is a candidate, not a site, so a walk halves a tile once.
The gate decides whether the kernel really is written for both widths.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.facts import template_values
from klineage.cuda.source import Call, Function, Node, ParsedSource, within
from klineage.mechanisms._launch_literal import launch_literal

_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k\d+")


@dataclass(frozen=True)
class TemplateTile:
    """A kernel whose wgmma width is one of its template parameters."""

    kernel: Function
    parameter: str
    width: int
    """The width every instantiation binds."""
    widths: tuple[int, ...]
    """The widths the templated wgmma writes an instruction for."""
    call: Node
    """The first call of the templated wgmma in the kernel (the site)."""
    literal: Node | None
    """The launch literal to edit; None when it is not written once (``refusal``)."""
    refusal: str | None = None


def _dispatchers(source: ParsedSource) -> dict[str, tuple[int, ...]]:
    """Templated device functions whose first template parameter picks a wgmma width, with
    the widths they compare it to (``if constexpr (N == 256)``, ``static_assert(N == ...)``)
    that name a wrapper of that width in the file."""
    wrapper_widths: dict[str, int] = {}
    for function in source.functions:
        if function.body is None or function.is_kernel:
            continue
        found = {int(m.group(1)) for m in _WGMMA.finditer(source.text_of(function.body))}
        if len(found) == 1:
            wrapper_widths[function.name] = found.pop()
    found_dispatchers: dict[str, tuple[int, ...]] = {}
    for function in source.functions:
        if not function.template_params or function.body is None or function.is_kernel:
            continue
        body = source.text_of(function.body)
        width = function.template_params[0]
        compared = {int(v) for v in re.findall(rf"\b{re.escape(width)}\s*==\s*(\d+)", body)}
        called = {
            wrapper_widths[c.name]
            for c in source.calls
            if c.name in wrapper_widths and within(c.node, function.body)
        }
        widths = tuple(sorted(compared & called))
        if len(widths) >= 2:
            found_dispatchers[function.name] = widths
    return found_dispatchers


def _aliases(source: ParsedSource, kernel: Function) -> dict[str, str]:
    """Local constants of ``kernel`` that name one of its template parameters:
    ``constexpr int width = BN;`` -> {width: BN} (and each parameter to itself)."""
    assert kernel.body is not None
    names = {p: p for p in kernel.template_params}
    for decl in source.declarations:
        if not within(decl.node, kernel.body) or "constexpr" not in decl.qualifiers:
            continue
        for declared, declarator in zip(decl.names, decl.declarators, strict=True):
            value = declarator.child_by_field_name("value")
            if value is not None and source.text_of(value).strip() in kernel.template_params:
                names[declared] = source.text_of(value).strip()
    return names


def _width_argument(source: ParsedSource, call: Call) -> str | None:
    if call.template_args is None:
        return None
    arguments = [c for c in call.template_args.named_children if c.type != "comment"]
    return source.text_of(arguments[0]).strip() if arguments else None


def template_tiles(source: ParsedSource) -> Iterator[TemplateTile]:
    """Every kernel whose templated wgmma's width is one of its template parameters."""
    if "wgmma.mma_async" not in source.kernel.text:
        return
    dispatchers = _dispatchers(source)
    if not dispatchers:
        return
    for kernel in source.kernels:
        if kernel.body is None or not kernel.template_params:
            continue
        aliases = _aliases(source, kernel)
        calls = [c for c in source.calls if c.name in dispatchers and within(c.node, kernel.body)]
        parameters = {aliases.get(_width_argument(source, c) or "") for c in calls}
        if not calls or len(parameters) != 1 or None in parameters:
            continue
        parameter = parameters.pop()
        assert parameter is not None
        widths = tuple(sorted({w for c in calls for w in dispatchers[c.name]}))
        bindings = template_values(source, kernel.name) or []
        bound = {b.get(parameter) for b in bindings}
        if len(bound) != 1 or None in bound:
            yield TemplateTile(
                kernel,
                parameter,
                0,
                widths,
                calls[0].node,
                None,
                f"the tile width {parameter} is not one constant at the launches",
            )
            continue
        width = int(bound.pop() or 0)
        position = kernel.template_params.index(parameter)
        literal, why = launch_literal(source, kernel, position, template_only=False)
        yield TemplateTile(kernel, parameter, width, widths, calls[0].node, literal, why)
