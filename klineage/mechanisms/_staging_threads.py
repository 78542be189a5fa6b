"""Which thread index a staged tile's store index is, however a tiled kernel spells it.

The textbook loop stores ``S[threadIdx.y][threadIdx.x]`` (or through locals of them). Many
public kernels first flatten the thread's place in its block and split it again by the tile's
width::

    int tid = threadIdx.y * blockDim.x + threadIdx.x;
    int row_in_tile = tid / 32;   // threadIdx.y, when the block is 32 wide
    int col_in_tile = tid % 32;   // threadIdx.x

With a block exactly ``W`` threads wide, ``tid / W`` is ``threadIdx.y`` and ``tid % W`` is
``threadIdx.x``, so the tile is stored at two thread indices all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from klineage.cuda.cexpr import fold_int
from klineage.cuda.facts import template_bindings
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.mechanisms._tiles_util import Locals, kernel_block_dims, name_of

_LOOKUPS = 4
"""Locals followed from a use to the expression they hold (``col -> tid % 32 -> ...``)."""


@dataclass
class ThreadParts:
    """The thread components of one kernel's index expressions."""

    source: ParsedSource
    function: Function
    locals_: Locals

    def component(self, node: Node) -> str | None:
        """``"y"`` for ``threadIdx.y``, a local holding it, or the row ``tid / W`` of the
        thread's flattened place in a block ``W`` wide (``"x"`` for its column ``tid % W``);
        None for anything else."""
        exact = self.locals_.thread_component(node)
        if exact is not None:
            return exact
        split = self._held(node)
        if split is None or split.type != "binary_expression":
            return None
        operator = split.child_by_field_name("operator")
        left, right = split.child_by_field_name("left"), split.child_by_field_name("right")
        if operator is None or left is None or right is None or operator.type not in ("/", "%"):
            return None
        width = self.fold(right)
        if width is None or width != self._block_width or not self._flat_place(left):
            return None
        return "y" if operator.type == "/" else "x"

    @cached_property
    def atoms(self) -> dict[str, str]:
        """Locals that are exactly one thread component, by name -> component."""
        found = {}
        for name in self.locals_.declared:
            value = self.locals_.initializer(name)
            if value is None or name in self.locals_.assigned:
                continue
            component = self.component(value)
            if component is not None:
                found[name] = component
        return found

    # -- reading ------------------------------------------------------------------------------

    @cached_property
    def _block_width(self) -> int | None:
        dims = kernel_block_dims(self.source, self.function)
        return dims[0] if dims is not None and dims[2] == 1 else None

    @cached_property
    def _bindings(self) -> list[dict[str, int | str]]:
        launches = self.source.launches_of(self.function)
        bound = [template_bindings(self.source, launch) for launch in launches] or [{}]
        return [{**self.source.integer_constants, **names} for names in bound]

    def fold(self, node: Node) -> int | None:
        """The value every launch gives ``node``, or None where they differ or it is none."""
        values = {fold_int(self.source, node, names) for names in self._bindings}
        return values.pop() if len(values) == 1 else None

    def _held(self, node: Node) -> Node | None:
        """``node`` through parentheses, casts and the initializers of unwritten locals."""
        current: Node | None = node
        for _ in range(_LOOKUPS):
            while current is not None and current.type in (
                "parenthesized_expression",
                "cast_expression",
            ):
                current = (
                    current.child_by_field_name("value")
                    if current.type == "cast_expression"
                    else (current.named_children[0] if current.named_children else None)
                )
            if current is None or current.type != "identifier":
                return current
            name = self.source.text_of(current)
            if name in self.locals_.assigned or len(self.locals_.declared.get(name, [])) != 1:
                return None
            current = self.locals_.initializer(name)
        return None

    def _flat_place(self, node: Node) -> bool:
        """Whether ``node`` is ``threadIdx.y * W + threadIdx.x`` (either order, ``W`` as
        ``blockDim.x`` or the block's width), through locals."""
        return any(
            self.locals_.thread_component(column) == "x" and self._row_times_width(row)
            for row, column in self._operands(node, "+")
        )

    def _row_times_width(self, node: Node) -> bool:
        return any(
            self.locals_.thread_component(row) == "y"
            and (
                name_of(self.source, width) == "blockDim.x"
                or (self.fold(width) is not None and self.fold(width) == self._block_width)
            )
            for row, width in self._operands(node, "*")
        )

    def _operands(self, node: Node, operator: str) -> list[tuple[Node, Node]]:
        """``(a, b)`` and ``(b, a)`` where ``node`` holds ``a <operator> b``; else none."""
        held = self._held(node)
        if held is None or held.type != "binary_expression":
            return []
        found = held.child_by_field_name("operator")
        left, right = held.child_by_field_name("left"), held.child_by_field_name("right")
        if found is None or found.type != operator or left is None or right is None:
            return []
        return [(left, right), (right, left)]
