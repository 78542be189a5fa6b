"""Which memory a pointer may point into: global, shared, local, or unknown.

Read-only and asynchronous loads (``__ldg``, ``ld.global.nc``, ``cp.async``) are defined on
global memory only; on a shared or local address the GPU faults ("operation not supported on
global/shared address space"). A pointer's space follows where its value comes from:

- a kernel's pointer parameter is global (the ABI hands kernels device allocations);
- a ``__device__`` helper's pointer parameter is whatever its callers pass;
- ``&x`` of a local variable, a local array, and a pointer into either are local; a
  ``__shared__`` array, ``extern __shared__`` memory and pointers into them are shared;
- a local pointer is what its initializer and assignments make it; casts, ``p + i`` and
  ``&p[i]`` keep the space of ``p``.

Anything else (a pointer loaded from memory, returned by an unknown call) is ``unknown``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from klineage.cuda.source import Function, Node, ParsedSource, call_name, strip_parens
from klineage.cuda.tree import call_arguments, operator_of

if TYPE_CHECKING:
    from klineage.cuda.analysis import SourceAnalysis

PointerSpace = Literal["global", "shared", "local", "unknown"]
CASTS = frozenset({"reinterpret_cast", "static_cast", "const_cast"})
SHARED_ADDRESSES = frozenset({"__cvta_shared_to_generic"})
"""Calls that turn a shared-space address (``cvta``) back into a pointer to shared memory."""
CALLER_DEPTH = 4
"""How many helpers up a parameter's space is followed before it is called unknown."""


class PointerSpaces:
    """The spaces a pointer expression may point into, per function of one source."""

    def __init__(self, analysis: SourceAnalysis) -> None:
        self.analysis = analysis
        self.source: ParsedSource = analysis.source
        self._shared_names = {n for d in self.source.shared_declarations for n in d.names}

    def of(self, function: Function, node: Node) -> frozenset[PointerSpace]:
        """Every space the address ``node`` (in ``function``) may point into; empty for an
        expression that is not an address (an integer index)."""
        return frozenset(self._expression(function, node, set(), 0))

    # -- expressions ------------------------------------------------------------------------

    def _expression(
        self, function: Function, node: Node, seen: set[tuple[int, str]], depth: int
    ) -> set[PointerSpace]:
        node = strip_parens(node)
        kind = node.type
        if kind == "cast_expression":
            value = node.child_by_field_name("value")
            return self._expression(function, value, seen, depth) if value else {"unknown"}
        if kind == "call_expression":
            name = call_name(self.source, node) or ""
            args = call_arguments(node)
            if name in CASTS and len(args) == 1:
                return self._expression(function, args[0], seen, depth)
            if self.analysis.shared_factory(name) is not None or name in SHARED_ADDRESSES:
                return {"shared"}
            return {"unknown"}
        if kind == "identifier":
            return self._name(function, self.source.text_of(node), seen, depth)
        if kind == "pointer_expression":
            argument = node.child_by_field_name("argument")
            if argument is None:
                return {"unknown"}
            if operator_of(node) == "&":
                return self._addressed(function, argument, seen, depth)
            return {"unknown"}  # `*pp`: a pointer loaded from memory
        if kind == "binary_expression" and operator_of(node) in ("+", "-"):
            sides = [node.child_by_field_name(side) for side in ("left", "right")]
            parts = [part for part in sides if part is not None]
            # `p + i`: the space is the pointer's; the index is no address
            addresses = [part for part in parts if self._is_address(function, part)] or parts
            found: set[PointerSpace] = set()
            for part in addresses:
                found |= self._expression(function, part, seen, depth)
            return found
        if kind == "conditional_expression":
            found = set()
            for side in ("consequence", "alternative"):
                branch = node.child_by_field_name(side)
                if branch is not None:
                    found |= self._expression(function, branch, seen, depth)
            return found
        if kind in ("number_literal", "sizeof_expression"):
            return set()
        return {"unknown"}

    def _addressed(
        self, function: Function, target: Node, seen: set[tuple[int, str]], depth: int
    ) -> set[PointerSpace]:
        """The space of ``&target``."""
        target = strip_parens(target)
        if target.type == "subscript_expression":
            base = target.child_by_field_name("argument")
            return self._expression(function, base, seen, depth) if base else {"unknown"}
        if target.type == "pointer_expression" and operator_of(target) == "*":
            inner = target.child_by_field_name("argument")
            return self._expression(function, inner, seen, depth) if inner else {"unknown"}
        if target.type == "identifier":
            name = self.source.text_of(target)
            if name in self._shared_names:
                return {"shared"}
            if self._is_array(function, name):
                return self._name(function, name, seen, depth)
            if self._is_local(function, name):
                return {"local"}  # a variable of this function: registers or the stack
            return {"unknown"}
        if target.type == "field_expression":
            base = target.child_by_field_name("argument")
            if base is None:
                return {"unknown"}
            if self.source.text_of(target).split(".")[0] == self.source.text_of(base):
                return self._addressed(function, base, seen, depth)  # `&s.f`: where s is
            return self._expression(function, base, seen, depth)  # `&p->f`: where p points
        return {"unknown"}

    # -- names ------------------------------------------------------------------------------

    def _name(
        self, function: Function, name: str, seen: set[tuple[int, str]], depth: int
    ) -> set[PointerSpace]:
        key = (function.node.start_byte, name)
        if key in seen:
            return set()
        seen.add(key)
        if name in self._shared_names:
            return {"shared"}
        param = function.param(name)
        types = self.source.local_types(function)
        declared = types.get(name, "")
        if param is not None:
            if not (param.is_pointer or "[" in declared or "&" in self.source.text_of(param.node)):
                return set()
            if function.is_kernel:
                return {"global"}
            return self._from_callers(function, name, seen, depth)
        if not declared:
            return {"unknown"} if name not in self.analysis.constants else set()
        if declared.endswith("[]"):
            return {"local"}
        if "*" not in declared:
            return set()
        found: set[PointerSpace] = set()
        for value in self._values(function, name):
            found |= self._expression(function, value, seen, depth)
        return found or {"unknown"}

    def _from_callers(
        self, function: Function, name: str, seen: set[tuple[int, str]], depth: int
    ) -> set[PointerSpace]:
        """The spaces the callers of a helper pass for its parameter ``name``."""
        if depth >= CALLER_DEPTH:
            return {"unknown"}
        index = next(i for i, p in enumerate(function.params) if p.name == name)
        found: set[PointerSpace] = set()
        graph = self.analysis.call_graph
        for caller_name, call in graph.call_sites(function.name):
            args = call_arguments(call)
            caller = self.source.enclosing_function(call)
            if index >= len(args) or caller is None or caller.name != caller_name:
                found.add("unknown")
                continue
            found |= self._expression(caller, args[index], seen, depth + 1)
        return found or {"unknown"}

    def _values(self, function: Function, name: str) -> list[Node]:
        """The initializers and assigned values of the local ``name``."""
        source = self.source
        values = []
        body = function.body
        for declarator in source.iter_nodes("init_declarator", within=body):
            inner = declarator.child_by_field_name("declarator")
            while inner is not None and inner.type != "identifier":
                inner = inner.child_by_field_name("declarator") or next(
                    (c for c in inner.named_children if c.type == "identifier"), None
                )
            value = declarator.child_by_field_name("value")
            if inner is not None and value is not None and source.text_of(inner) == name:
                values.append(value)
        for assignment in source.iter_nodes("assignment_expression", within=body):
            left = assignment.child_by_field_name("left")
            right = assignment.child_by_field_name("right")
            if left is None or right is None or source.text_of(left) != name:
                continue
            if operator_of(assignment) in ("=", "+=", "-="):
                values.append(right)
        return values

    def _is_address(self, function: Function, node: Node) -> bool:
        """Whether ``node`` has a pointer or array type, as far as declarations show."""
        node = strip_parens(node)
        source = self.source
        if node.type == "identifier":
            name = source.text_of(node)
            declared = source.local_types(function).get(name, "")
            param = function.param(name)
            by_reference = param is not None and "&" in source.text_of(param.node)
            return name in self._shared_names or "*" in declared or "[" in declared or by_reference
        if node.type == "pointer_expression":
            return operator_of(node) == "&"
        if node.type == "cast_expression":
            target = node.child_by_field_name("type")
            return target is not None and "*" in source.text_of(target)
        if node.type == "call_expression":
            name = call_name(source, node) or ""
            if self.analysis.shared_factory(name) is not None:
                return True
            function_node = node.child_by_field_name("function")
            written = source.text_of(function_node) if function_node is not None else ""
            return name in CASTS and "*" in written
        if node.type == "binary_expression" and operator_of(node) in ("+", "-"):
            return any(
                self._is_address(function, part)
                for part in (node.child_by_field_name("left"), node.child_by_field_name("right"))
                if part is not None
            )
        if node.type == "conditional_expression":
            return any(
                self._is_address(function, part)
                for part in (
                    node.child_by_field_name("consequence"),
                    node.child_by_field_name("alternative"),
                )
                if part is not None
            )
        return False

    def _is_array(self, function: Function, name: str) -> bool:
        declared = self.source.local_types(function).get(name, "")
        return declared.endswith("[]")

    def _is_local(self, function: Function, name: str) -> bool:
        return name in self.source.local_types(function)
