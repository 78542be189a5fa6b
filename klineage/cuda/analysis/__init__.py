"""The semantic analysis of a CUDA source, computed once per parsed source and cached.

``analysis(source)`` gives a :class:`SourceAnalysis` whose parts are built on first use:

- :attr:`~SourceAnalysis.cooperative_groups`: groups and calls of the cooperative-groups API
  (:mod:`~klineage.cuda.analysis.cooperative_groups`);
- :attr:`~SourceAnalysis.ptx`: PTX instructions issued inline, through macros or wrappers
  (:mod:`~klineage.cuda.analysis.ptx`);
- :attr:`~SourceAnalysis.vectors`: packed vector types and their load/store helpers
  (:mod:`~klineage.cuda.analysis.vectors`);
- :attr:`~SourceAnalysis.call_graph`: a networkx call graph with helper summaries
  (:mod:`~klineage.cuda.analysis.callgraph`);
- :meth:`~SourceAnalysis.indices`: the index forms and memory accesses of a function
  (:mod:`~klineage.cuda.analysis.indices`), a helper's accesses seen at its call sites;
- :meth:`~SourceAnalysis.shared`: shared memory however it is reached, and the copies from
  global memory into it (:mod:`~klineage.cuda.analysis.shared`);
- :attr:`~SourceAnalysis.spaces`: which memory a pointer may point into
  (:mod:`~klineage.cuda.analysis.spaces`).

Mechanisms ask these models what the code *does* (which index is a row, what is contiguous
across lanes, which buffer is shared) instead of matching how one kernel spells it.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from functools import cached_property

from klineage.cuda.analysis.callgraph import CallGraph
from klineage.cuda.analysis.cooperative_groups import CooperativeGroups
from klineage.cuda.analysis.forms import IndexForm
from klineage.cuda.analysis.indices import Access, Buffer, FunctionIndices, LoopVariable, is_buffer
from klineage.cuda.analysis.ptx import PtxModel
from klineage.cuda.analysis.shared import Copy, SharedMemory
from klineage.cuda.analysis.spaces import PointerSpace, PointerSpaces
from klineage.cuda.analysis.vectors import VectorModel
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import callee_name, integer_literal, strip_parens, template_arguments

__all__ = [
    "Access",
    "Buffer",
    "Copy",
    "FunctionIndices",
    "IndexForm",
    "LoopVariable",
    "PointerSpace",
    "PointerSpaces",
    "SharedMemory",
    "SourceAnalysis",
    "analysis",
]

_CACHE: weakref.WeakKeyDictionary[ParsedSource, SourceAnalysis] = weakref.WeakKeyDictionary()

_ARITHMETIC = re.compile(r"^[\w\s().+\-*/%<>=!&|^~?:]+$")
"""Names, literals, parentheses and operators only (no braces, strings or statements)."""
_WRITES = re.compile(r"(?<![=!<>])=(?!=)|\+\+|--")
_CALL = re.compile(r"\b\w+\s*\(")


def analysis(source: ParsedSource) -> SourceAnalysis:
    """The analysis of ``source``, built once per parsed source."""
    found = _CACHE.get(source)
    if found is None:
        found = _CACHE[source] = SourceAnalysis(source)
    return found


class SourceAnalysis:
    """The models of one parsed source; each is computed on first use."""

    def __init__(self, source: ParsedSource) -> None:
        self.source = source
        self._indices: dict[int, FunctionIndices] = {}
        self._loops: dict[str, LoopVariable] = {}
        self._binding: set[int] = set()
        self._shared: dict[int, SharedMemory] = {}

    @cached_property
    def cooperative_groups(self) -> CooperativeGroups:
        return CooperativeGroups(self.source)

    @cached_property
    def ptx(self) -> PtxModel:
        return PtxModel(self.source)

    @cached_property
    def vectors(self) -> VectorModel:
        return VectorModel(self.source)

    @cached_property
    def call_graph(self) -> CallGraph:
        return CallGraph(self.source, self.cooperative_groups, self.ptx)

    @cached_property
    def block_functions(self) -> tuple[Function, ...]:
        """The kernels, then the ``__device__`` functions a kernel reaches that declare their
        own static ``__shared__`` arrays: code run by a whole block, whose tiles and barriers
        are the block's even when the kernel only calls it (``body(args)`` bound to it by a
        template argument, as a kernel written once for several tile bodies does)."""
        source = self.source
        reached: set[str] = set()
        for kernel in source.kernels:
            reached |= self.call_graph.reachable(kernel.name)
        owners = set()
        for declaration in source.shared_declarations:
            function = source.enclosing_function(declaration.node)
            if function is not None and not declaration.is_extern:
                owners.add(function.node.start_byte)
        helpers = [
            f
            for f in source.functions
            if not f.is_kernel and f.name in reached and f.node.start_byte in owners
        ]
        return (*source.kernels, *helpers)

    @cached_property
    def spaces(self) -> PointerSpaces:
        return PointerSpaces(self)

    @cached_property
    def arithmetic_macros(self) -> frozenset[str]:
        """Function-like macros whose body is arithmetic on their parameters and constants
        (``#define OFFSET(row, col, ld) ((row) * (ld) + (col))``): no assignment, increment or
        call, so using one is as pure as the expression it expands to."""
        found = set()
        for holder, node in self.source.defines("preproc_function_def"):
            name = node.child_by_field_name("name")
            value = node.child_by_field_name("value")
            if name is None or value is None:
                continue
            body = " ".join(holder.text_of(value).replace("\\\n", " ").split())
            if _ARITHMETIC.match(body) and not _WRITES.search(body) and not _CALL.search(body):
                found.add(holder.text_of(name))
        return frozenset(found)

    @cached_property
    def constants(self) -> dict[str, int]:
        r"""File-scope integer constants: the source's, plus ``#define``\ s whose value is
        followed by a comment (``#define WARPS 2  // 64 / 32``)."""
        found = dict(self.source.integer_constants)
        for holder, node in self.source.defines("preproc_def"):
            name = node.child_by_field_name("name")
            value = node.child_by_field_name("value")
            if name is None or value is None or holder.text_of(name) in found:
                continue
            text = holder.text_of(value).split("//")[0].split("/*")[0]
            number = integer_literal(text.strip().strip("()"))
            if number is not None:
                found[holder.text_of(name)] = number
        return found

    @cached_property
    def _shared_factories(self) -> dict[str, str]:
        """Functions and structs that hand out ``extern __shared__`` memory
        (``SharedMemory<T>()``), by name -> the buffer name their memory gets."""
        found: dict[str, str] = {}
        source = self.source
        for declaration in source.shared_declarations:
            if not declaration.is_extern:
                continue
            owner = source.ancestor(declaration.node, "struct_specifier", "class_specifier")
            name_node = owner.child_by_field_name("name") if owner is not None else None
            if name_node is not None:
                found[source.text_of(name_node)] = f"{source.text_of(name_node)}()"
                continue
            function = source.enclosing_function(declaration.node)
            if function is not None and not function.is_kernel:
                found[function.name] = f"{function.name}()"
        return found

    def shared_factory(self, call: str) -> str | None:
        """The shared buffer a call such as ``SharedMemory<T>()`` returns, if it is one."""
        return self._shared_factories.get(callee_name(call))

    # -- per function -----------------------------------------------------------------------

    def indices(self, function: Function) -> FunctionIndices:
        """The index analysis of ``function``, made on first use and kept."""
        found = self._indices.get(function.node.start_byte)
        if found is None:
            found = self._indices[function.node.start_byte] = FunctionIndices(self, function)
        return found

    def register_loop(self, variable: LoopVariable) -> None:
        """Remember a loop's induction variable under its atom (for ``loop_variable``)."""
        self._loops[variable.atom] = variable

    def loop_variable(self, atom: str) -> LoopVariable | None:
        """The loop induction variable an atom ``name@line`` stands for, if one was seen."""
        return self._loops.get(atom)

    def buffer(self, function: Function, atom: str) -> Buffer | None:
        """The buffer an atom ``buf:name`` names in ``function``."""
        if not is_buffer(atom):
            return None
        name = atom[4:]
        if name.endswith("()") and name[:-2] in self._shared_factories:
            return Buffer(name, "shared", "")
        found = self.indices(function).buffers.get(name)
        if found is not None:
            return found
        owner = name.split(".")[0]
        parent = self.indices(function).buffers.get(owner)
        if parent is not None:
            return Buffer(name, parent.space, "", parent.node)
        return None

    def shared(self, function: Function) -> SharedMemory:
        """Shared memory in ``function`` however it is reached, and the copies into it."""
        found = self._shared.get(function.node.start_byte)
        if found is None:
            found = self._shared[function.node.start_byte] = SharedMemory(self, function)
        return found

    # -- helpers seen from their callers ----------------------------------------------------

    def binding(
        self, caller: FunctionIndices, callee: Function, call: Node, args: list[Node]
    ) -> dict[str, IndexForm]:
        """The callee's parameter atoms (and template parameters) as the caller's forms."""
        values: dict[str, IndexForm] = {}
        callee_indices = self.indices(callee)
        for param, arg in zip(callee.params, args, strict=False):
            if param.name is None:
                continue
            form = caller.form(arg)
            values[param.name] = form
            if param.name in callee_indices.buffers:
                values[f"buf:{param.name}"] = form
        template_args = template_arguments(call)
        if template_args:
            for name, arg in zip(callee.template_params, template_args, strict=False):
                value = strip_parens(arg)
                if value.type == "type_descriptor":
                    inner = value.named_children[0] if value.named_children else None
                    value = inner if inner is not None else value
                values[name] = caller.form(value)
        return values

    def bound_accesses(
        self, caller: FunctionIndices, callee: Function, call: Node, args: list[Node]
    ) -> Iterator[Access]:
        """A helper's accesses as the call ``call`` makes them, in the caller's terms."""
        if callee.node.start_byte in self._binding:
            return
        self._binding.add(callee.node.start_byte)
        try:
            values = self.binding(caller, callee, call, args)
            spaces: dict[str, bool] = {}
            for access in self.indices(callee).accesses():
                atom = access.buffer.atom
                if atom not in spaces:
                    spaces[atom] = self._visible(caller, values.get(atom), access.buffer)
                if not spaces[atom]:
                    continue  # registers (the helper's, or the caller's it was handed)
                rebound = self.rebind(access, values, caller, call, callee)
                if rebound is not None:
                    yield rebound
        finally:
            self._binding.discard(callee.node.start_byte)

    def _visible(self, caller: FunctionIndices, bound: IndexForm | None, buffer: Buffer) -> bool:
        """Whether a helper's buffer is memory the caller's other threads can see: not the
        helper's registers, nor a register array of the caller's handed to it."""
        if buffer.space == "local":
            return False
        if bound is None:
            return True
        for atom in bound.atoms():
            found = self.buffer(caller.function, atom) if is_buffer(atom) else None
            if found is not None and found.space == "local":
                return False
        return True

    def rebind(
        self,
        access: Access,
        values: dict[str, IndexForm],
        caller: FunctionIndices,
        call: Node,
        callee: Function,
    ) -> Access | None:
        """A helper's memory access seen from one of its call sites: its address with the
        parameters replaced by the call's arguments (``values``), in the caller's terms; None
        where the caller cannot say what the address is."""
        address = (IndexForm.atom(access.buffer.atom) + access.offset).substitute(values)
        rebound = caller._access(call, address, access.direction, access.bytes)
        if rebound is None:
            return None
        return Access(
            node=call,
            function=caller.function,
            buffer=rebound.buffer,
            offset=rebound.offset,
            direction=access.direction,
            bytes=access.bytes,
            helper=access.helper or callee.name,
            inner=access.inner or access.node,
        )
