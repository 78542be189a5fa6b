"""Which functions of a kernel file can still run: those the ABI's entry reaches.

Removing a launch-size dispatch leaves the specialized kernel it chose defined but never
launched. A mechanism inside dead code can be "removed" at no cost, and mining would record a
skill with a ~1.00x effect, measured on code that never ran. Mining asks this module which
functions are live and leaves the rest alone.

Reachability is by name, conservatively: the roots are the `extern "C"` host functions (the
ABI's `run`), and a function is live when its name appears as an identifier in a live
function's body (a call, a `<<<...>>>` launch, `cudaFuncSetAttribute(kernel, ...)`, a function
pointer). A name that appears at file scope (a table of kernels, say) makes the function live.

:func:`run_by_workloads` goes one step further: it follows the entry's branches with each
workload's axis values and keeps only the functions some workload runs. A fallback kernel
for rows longer than any workload's is live code that no workload runs; a removal there would
be a skill measured on a path no timing covered. Branch conditions are evaluated where they
fold to integers (entry parameters named after an axis take the workload's value; file
constants and earlier `const` locals count; a pointer parameter is a nonzero 256-byte-aligned
address, as the harness allocates); a condition that does not fold keeps both branches, so the
answer errs toward running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tree_sitter import Node

from klineage.conditions import evaluate_size
from klineage.cuda.cexpr import to_size_expr
from klineage.cuda.source import Function, ParsedSource
from klineage.kernel import KernelSource

# a function named as a template argument (`k<body><<<...>>>`) parses as a type name
_NAME_KINDS = ("identifier", "field_identifier", "type_identifier")


def live_functions(kernel: KernelSource) -> set[str] | None:
    """Names of the functions the entry reaches; None when the file has no `extern "C"`
    entry (then nothing can be called dead)."""
    parsed = kernel.parsed
    roots = [f for f in parsed.functions if f.extern_c]
    if not roots:
        return None
    return _closure(parsed, {f.name for f in roots} | _named_at_file_scope(parsed))


def run_by_workloads(
    kernel: KernelSource, workloads: Sequence[Mapping[str, int]]
) -> set[str] | None:
    """Names of the functions some workload (its axis values) runs; None without an entry."""
    parsed = kernel.parsed
    entries = [f for f in parsed.functions if f.extern_c]
    if not entries:
        return None
    defined = {f.name for f in parsed.functions}
    roots = _named_at_file_scope(parsed)  # the entries' own references follow the branches
    for axes in workloads:
        for entry in entries:
            roots |= _Branches(parsed, entry, axes, defined).reached()
    return _closure(parsed, roots) | {f.name for f in entries}


def reached_from_each(kernel: KernelSource, names: Sequence[str]) -> dict[str, set[str]]:
    """For each name, the functions it reaches by calls and launches, itself included."""
    references = _references(kernel.parsed)
    return {name: _closure(kernel.parsed, {name}, references) for name in names}


def _names_in(parsed: ParsedSource, node: Node) -> set[str]:
    return {parsed.text_of(n) for n in parsed.iter_nodes(*_NAME_KINDS, within=node)}


def _named_at_file_scope(parsed: ParsedSource) -> set[str]:
    inside = [(f.outer.start_byte, f.outer.end_byte) for f in parsed.functions]
    defined = {f.name for f in parsed.functions}
    return {
        parsed.text_of(node)
        for node in parsed.iter_nodes(*_NAME_KINDS)
        if not any(start <= node.start_byte < end for start, end in inside)
    } & defined


def _references(parsed: ParsedSource) -> dict[str, set[str]]:
    """Function name -> the defined functions its body names."""
    defined = {f.name for f in parsed.functions}
    references: dict[str, set[str]] = {}
    for function in parsed.functions:
        body = function.body if function.body is not None else function.node
        references.setdefault(function.name, set()).update(_names_in(parsed, body) & defined)
    return references


def _closure(
    parsed: ParsedSource, roots: set[str], references: dict[str, set[str]] | None = None
) -> set[str]:
    references = _references(parsed) if references is None else references
    live = set(roots) & set(references)
    todo = list(live)
    while todo:
        for name in references.get(todo.pop(), set()):
            if name not in live:
                live.add(name)
                todo.append(name)
    return live


POINTER_ADDRESS = 256
"""What a pointer parameter evaluates to: nonzero, and aligned as the harness allocates."""


class _Branches:
    """The entry's statements followed with one workload's values: the names it reaches."""

    def __init__(
        self, parsed: ParsedSource, entry: Function, axes: Mapping[str, int], defined: set[str]
    ) -> None:
        self.parsed = parsed
        self.defined = defined
        self.values: dict[str, int | str] = dict(parsed.integer_constants)
        for param in entry.params:
            if param.name is None:
                continue  # an unnamed parameter (a prototype) holds no value
            if param.name in axes:
                self.values[param.name] = int(axes[param.name])
            elif param.is_pointer:
                self.values[param.name] = POINTER_ADDRESS
        self.entry = entry
        self.names: set[str] = set()

    def reached(self) -> set[str]:
        if self.entry.body is not None:
            self._block(self.entry.body)
        return self.names & self.defined

    def _value(self, node: Node | None) -> int | None:
        if node is None:
            return None
        expr = to_size_expr(self.parsed, node, self.values)
        return None if expr is None else evaluate_size(expr, {})

    def _block(self, block: Node) -> bool:
        """Follow a block's statements; True when it surely returned."""
        return any(self._statement(statement) for statement in block.named_children)

    def _statement(self, node: Node) -> bool:
        kind = node.type
        if kind == "compound_statement":
            return self._block(node)
        if kind == "if_statement":
            return self._if(node)
        if kind == "declaration":
            self.names |= _names_in(self.parsed, node)
            for declarator in node.named_children:
                if declarator.type != "init_declarator":
                    continue
                name = declarator.child_by_field_name("declarator")
                value = self._value(declarator.child_by_field_name("value"))
                if name is None:
                    continue
                if value is None:
                    self.values.pop(self.parsed.text_of(name), None)
                else:
                    self.values[self.parsed.text_of(name)] = value
            return False
        # anything else (an expression, a loop): every name inside may run, and an assignment
        # makes what was known about its target unknown
        self.names |= _names_in(self.parsed, node)
        if kind == "return_statement":
            return True
        for assigned in self.parsed.iter_nodes("assignment_expression", within=node):
            target = assigned.child_by_field_name("left")
            if target is not None:
                self.values.pop(self.parsed.text_of(target), None)
        return False

    def _if(self, node: Node) -> bool:
        clause = node.child_by_field_name("condition")
        parts = [c for c in clause.named_children if c.type != "comment"] if clause else []
        taken = self._value(parts[0]) if len(parts) == 1 else None
        if len(parts) == 1:
            self.names |= _names_in(self.parsed, parts[0])
        consequence = node.child_by_field_name("consequence")
        alternative = node.child_by_field_name("alternative")
        if alternative is not None and alternative.type == "else_clause":
            inner = [c for c in alternative.named_children if c.type != "comment"]
            alternative = inner[0] if inner else None
        if taken is not None:
            chosen = consequence if taken else alternative
            return self._statement(chosen) if chosen is not None else False
        saved = dict(self.values)
        returned, after = [], []
        for branch in (consequence, alternative):
            self.values = dict(saved)  # each branch starts from what was known before the if
            returned.append(self._statement(branch) if branch is not None else False)
            after.append(self.values)
        # after an unknown branch, a name either branch assigns is unknown
        self.values = {k: v for k, v in saved.items() if all(a.get(k) == v for a in after)}
        return all(returned) and alternative is not None
