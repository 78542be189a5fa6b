"""The row held in a register array across passes (``float4 v[kVec]``, ``Pack16 row[kVec]``)
instead of re-read from global memory by each pass.

A kernel that needs its row several times (max, then exp-and-sum, then the store; or the sum
of squares, then the scaled output) can load it once into registers and run every pass on the
registers: the row crosses the memory bus once. Without it, each pass reads the row again.

Detection: a local array whose first use after its declaration *loads* it (a loop assigning
its elements from memory, or a call that fills it), followed by at least two more statements
that use it before any reload.

- remove: put a copy of the load statement before each later pass, so every pass reads the
  row afresh. That is the same program only when (1) no pass before it changes the array
  (else the later pass needs the changed values, which memory does not hold), (2) nothing
  between the load and the copy writes memory the load reads, and (3) the load writes nothing
  but the array (and its own locals). The experts' forms fail (1) on purpose: softmax
  exponentiates the array in place, RMSNorm adds the residual into it; they are refused with
  that reason rather than rewritten into something else.
- apply: the reverse: a load statement repeated word for word before a later pass, with
  nothing in between writing the array or the memory it reads, is deleted. And on naive
  passes that re-read a row whose length is known only at run time (``_row_dispatch.py``):
  rows of at most ``elements`` (carrier, default 32) turns per thread are loaded once into
  ``float row[elements]`` and the passes run on it, fully unrolled; longer rows run the
  passes as they were (``if (n <= K * STEP) {...} else {...}``, ``n`` the same for every
  thread).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, variable_of
from klineage.cuda.tree import NotInForm, declared_names
from klineage.kernel import KernelSource
from klineage.mechanisms._reductions_util import (
    arguments_of,
    call_name,
    inside,
    line_deletion,
    named_statements,
    strip_casts,
    strip_parens,
    within,
)
from klineage.mechanisms._row_dispatch import DEFAULT_ELEMENTS, row_passes, row_passes_text
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

MIN_PASSES = 2
"""Uses after the load that make a held row: one use is just a batched load."""


class _Refused(Exception):
    """The rewrite is not safe here; the message says why."""


@dataclass(frozen=True)
class HeldRow:
    """A register array and the statements of its block that use it."""

    function: Function
    declaration: Node
    name: str
    load: Node
    """The first statement using the array: it fills it from memory."""
    uses: tuple[Node, ...]
    """The later statements using it, in order, reloads included."""

    def segments(self, source: ParsedSource) -> list[list[Node]]:
        """The later uses split at reloads (statements identical to the load)."""
        key = _text(source, self.load)
        parts: list[list[Node]] = [[]]
        for use in self.uses:
            if _text(source, use) == key:
                parts.append([])
            else:
                parts[-1].append(use)
        return parts

    def reloads(self, source: ParsedSource) -> list[Node]:
        key = _text(source, self.load)
        return [u for u in self.uses if _text(source, u) == key]


def _text(source: ParsedSource, node: Node) -> str:
    return " ".join(source.text_of(node).split())


def _array_declarations(source: ParsedSource, function: Function) -> Iterator[tuple[Node, str]]:
    """Local (register) arrays: ``T name[N];`` declared in a function body, not shared."""
    assert function.body is not None
    if not inside(source, function.body, "array_declarator"):
        return
    for declaration in source.declarations:
        if not within(declaration.node, function.body) or declaration.is_shared:
            continue
        if "static" in declaration.qualifiers or declaration.node.parent is None:
            continue
        if declaration.node.parent.type != "compound_statement":
            continue
        for name, declarator in zip(declaration.names, declaration.declarators, strict=True):
            if declarator.type == "array_declarator":
                yield declaration.node, name


def _mentions(source: ParsedSource, node: Node, name: str) -> bool:
    return any(source.text_of(n) == name for n in inside(source, node, "identifier"))


def held_rows(source: ParsedSource) -> Iterator[HeldRow]:
    """Register arrays loaded once and used by later statements of the same block."""
    for function in source.functions:
        if function.body is None or not function.runs_on_device:
            continue
        for declaration, name in _array_declarations(source, function):
            assert declaration.parent is not None
            siblings = named_statements(declaration.parent)
            after = siblings[siblings.index(declaration) + 1 :]
            users = [s for s in after if _mentions(source, s, name)]
            if len(users) < 1 + MIN_PASSES or not _loads(source, users[0], name):
                continue
            yield HeldRow(function, declaration, name, users[0], tuple(users[1:]))


def _loads(source: ParsedSource, statement: Node, name: str) -> bool:
    """Whether a statement fills the array from memory: it assigns an element of it from an
    expression that reads memory, or passes it to a call along with a pointer."""
    for node in inside(source, statement, "assignment_expression"):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None or variable_of(source, left) != name:
            continue
        if _reads_memory(source, right, name):
            return True
    for node in inside(source, statement, "call_expression"):
        args = arguments_of(node)
        if any(source.text_of(strip_parens(a)) == name for a in args) and len(args) > 1:
            return True
    return False


def _reads_memory(source: ParsedSource, node: Node, name: str) -> bool:
    for inner in inside(source, node, "subscript_expression", "call_expression"):
        if inner.type == "call_expression" and call_name(source, inner) in ("__ldg", "__ldcs"):
            return True
        if inner.type == "subscript_expression" and variable_of(source, inner) not in (name, None):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Effects of statements on the array and on memory
# ---------------------------------------------------------------------------------------------


class _Effects:
    """What a statement writes: the array, and which pointers' memory."""

    def __init__(self, source: ParsedSource, function: Function, name: str) -> None:
        self.source = source
        self.function = function
        self.name = name
        self.roots = _pointer_roots(source, function)

    def writes_array(self, statement: Node) -> str | None:
        """How a statement changes the array (None when it does not)."""
        source = self.source
        for node in inside(source, statement, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and variable_of(source, target) == self.name:
                return f"assigns {source.text_of(target)} (line {source.line_of(node.start_byte)})"
        for call in inside(source, statement, "call_expression"):
            why = self.call_writes_array(call)
            if why is not None:
                return why
        return None

    def call_writes_array(self, call: Node) -> str | None:
        source = self.source
        args = arguments_of(call)
        name = call_name(source, call) or "?"
        for index, arg in enumerate(args):
            if source.text_of(strip_parens(arg)) != self.name:
                continue
            callee = source.function(name)
            if callee is None or index >= len(callee.params):
                return f"passes {self.name} to {name}, whose effect is unknown"
            param = callee.params[index]
            if not param.is_const:
                return (
                    f"calls {name}, which takes {self.name} by non-const reference and rewrites it"
                )
        return None

    def memory_written(self, statement: Node) -> set[str]:
        """Root pointers a statement stores through ("?" when a store cannot be traced)."""
        source = self.source
        written: set[str] = set()
        for node in inside(source, statement, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is None:
                continue
            root = variable_of(source, target)
            if root is None:
                written.add("?")
            elif root in self.roots:
                written.add(self.roots[root])
        for call in inside(source, statement, "call_expression"):
            name = call_name(source, call) or ""
            if name.startswith("atomic"):
                written.add("?")
            callee = source.function(name)
            if callee is None:
                continue
            args = arguments_of(call)
            for param, arg in zip(callee.params, args, strict=False):
                if param.is_pointer and not param.is_const:
                    written.add(self.roots.get(_pointer_base(source, arg) or "", "?"))
        return written

    def memory_read(self, statement: Node) -> set[str]:
        source = self.source
        read: set[str] = set()
        for node in inside(source, statement, "identifier"):
            text = source.text_of(node)
            if text in self.roots and text != self.name:
                read.add(self.roots[text])
        return read

    def local_only(self, statement: Node) -> str | None:
        """Why re-running the load would do more than fill the array, or None."""
        if self.memory_written(statement):
            return "the load also writes memory"
        source = self.source
        declared = declared_names(source, statement)
        loop = source.loop_at(statement)
        if loop is not None and loop.variable:
            declared.add(loop.variable)
        for node in inside(source, statement, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            root = variable_of(source, target) if target is not None else None
            if root not in declared and root != self.name:
                return f"the load also assigns {root} (line {source.line_of(node.start_byte)})"
        return None


def _pointer_base(source: ParsedSource, node: Node) -> str | None:
    node = strip_casts(node)
    while node.type in ("binary_expression", "call_expression", "subscript_expression"):
        if node.type == "call_expression":  # reinterpret_cast<T*>(x + o)
            arguments = node.child_by_field_name("arguments")
            if arguments is None or not arguments.named_children:
                return None
            node = strip_casts(arguments.named_children[0])
            continue
        inner = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if inner is None:
            return None
        node = strip_casts(inner)
    return source.text_of(node) if node.type == "identifier" else None


def _pointer_roots(source: ParsedSource, function: Function) -> dict[str, str]:
    """Pointer variable -> the parameter it points into (locals initialized from one)."""
    roots = {p.name: p.name for p in function.params if p.name and p.is_pointer}
    if function.body is None:
        return roots
    for declaration in source.shared_declarations:
        if within(declaration.node, function.body):
            roots.update({name: f"__shared__ {name}" for name in declaration.names})
    types = source.local_types(function)
    for node in inside(source, function.body, "init_declarator"):
        name = node.child_by_field_name("declarator")
        value = node.child_by_field_name("value")
        while name is not None and name.type == "pointer_declarator":
            name = name.child_by_field_name("declarator")
        if name is None or value is None or name.type != "identifier":
            continue
        if "*" not in types.get(source.text_of(name), ""):
            continue
        base = _pointer_base(source, value)
        if base is not None and base in roots:
            roots[source.text_of(name)] = roots[base]
    return roots


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


def _pragmas_start(source: ParsedSource, statement: Node) -> int:
    """Where a statement starts together with the ``#pragma`` lines right before it (a copy
    of an unrolled loop keeps its ``#pragma unroll``; the pass after it keeps its own)."""
    start = statement.start_byte
    node = statement.prev_sibling
    while node is not None and node.type == "preproc_call":
        start = node.start_byte
        node = node.prev_sibling
    return start


def _removal_plan(source: ParsedSource, row: HeldRow) -> list[Node]:
    """The later passes that get a reload; :class:`_Refused` when that is not safe."""
    effects = _Effects(source, row.function, row.name)
    load_key = _text(source, row.load)
    targets: list[Node] = []
    previous: Node | None = None
    for use in row.uses:
        if _text(source, use) == load_key:
            previous = None
            continue
        if previous is not None:
            targets.append(use)
        previous = use
    if not targets:
        raise _Refused("no pass uses the row twice between loads")
    passes = [p for p in row.uses if _text(source, p) != load_key]
    for target in targets:
        for earlier in (p for p in passes if p.start_byte < target.start_byte):
            changed = effects.writes_array(earlier)
            if changed is not None:
                raise _Refused(
                    f"the pass at line {source.line_of(earlier.start_byte)} {changed}, and the "
                    f"pass at line {source.line_of(target.start_byte)} needs those values: "
                    "re-reading the row from memory would not give them"
                )
    why = effects.local_only(row.load)
    if why is not None:
        raise _Refused(why)
    read = effects.memory_read(row.load)
    for target in targets:
        for earlier in (p for p in passes if p.start_byte < target.start_byte):
            clobbered = effects.memory_written(earlier) & (read | {"?"})
            if clobbered:
                raise _Refused(
                    f"the pass at line {source.line_of(earlier.start_byte)} writes memory the "
                    f"load reads ({', '.join(sorted(clobbered))})"
                )
    return targets


def _application_plan(source: ParsedSource, row: HeldRow) -> list[Node]:
    """The reloads to delete; :class:`_Refused` when one is not redundant."""
    reloads = row.reloads(source)
    if not reloads:
        raise _Refused("the row is not re-read")
    effects = _Effects(source, row.function, row.name)
    read = effects.memory_read(row.load)
    for reload in reloads:
        for use in row.uses:
            if use.start_byte >= reload.start_byte:
                break
            if use in reloads:
                continue
            changed = effects.writes_array(use)
            clobbered = effects.memory_written(use) & (read | {"?"})
            if changed is not None or clobbered:
                raise _Refused(
                    f"the pass at line {source.line_of(use.start_byte)} changes the row or its "
                    "memory, so the reload is not redundant"
                )
    return reloads


@register
class RowInRegisters(Mechanism):
    name = "row_in_registers"
    category = "memory"
    family = "registers vs re-reads"
    intent = (
        "Load the row into a register array once and run every pass on the registers, so "
        "the row crosses the memory bus once."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "elements": "row elements a thread holds on the register path of a dispatch (default "
        f"{DEFAULT_ELEMENTS})",
    }

    def _site(self, source: ParsedSource, row: HeldRow, refusal: str | None) -> Site:
        end = row.uses[-1].end_byte
        return self.site(
            source,
            row.declaration,
            span=(row.declaration.start_byte, end),
            kind="declaration",
            snippet=source.snippet(row.declaration),
            detail={"array": row.name},
            refusal=refusal,
        )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for row in held_rows(source):
            if max(len(s) for s in row.segments(source)) < MIN_PASSES:
                continue
            refusal = None
            try:
                _removal_plan(source, row)
            except _Refused as why:
                refusal = str(why)
            yield self._site(source, row, refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for row in held_rows(source):
            if not row.reloads(source):
                continue
            refusal = None
            try:
                _application_plan(source, row)
            except _Refused as why:
                refusal = str(why)
            yield self._site(source, row, refusal)
        for node, passes in row_passes(source):
            refusal = str(passes) if isinstance(passes, NotInForm) else None
            end = node.end_byte if isinstance(passes, NotInForm) else passes.region[-1].end_byte
            detail: dict[str, str | int] = {"kind": "dispatch"}
            if not isinstance(passes, NotInForm):
                detail["pointer"] = passes.pointer
            yield self.site(
                source, node, span=(node.start_byte, end), detail=detail, refusal=refusal
            )

    def _row(self, source: ParsedSource, site: Site) -> HeldRow:
        for row in held_rows(source):
            if row.declaration.start_byte == site.start_byte:
                return row
        raise self.refuse(f"no register array at line {site.start_line}", site)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        row = self._row(source, site)
        try:
            targets = _removal_plan(source, row)
        except _Refused as why:
            raise self.refuse(str(why), site) from None
        start = _pragmas_start(source, row.load)
        text = source.text_of((start, row.load.end_byte))
        edits = []
        for target in targets:
            at = _pragmas_start(source, target)
            line = source.line_start(at) if source.starts_line(at) else at
            indent = source.indent_of(at) if line == at else ""
            edits.append(Edit.insert(line, f"{indent}{text}\n" if line != at else f"{text}\n"))
        return edits

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        array = site.detail.get("array", "the array")
        return [
            Prose(
                text=f"{array} must be indexed by compile-time constants (fully unrolled loops)",
                why="a register array indexed at run time is placed in local memory",
            )
        ]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("kind") == "dispatch":
            elements = carrier.get_int("elements")
            elements = DEFAULT_ELEMENTS if elements is None else elements
            if not 1 <= elements <= 256:
                raise self.refuse(f"elements={elements} is not 1..256", site, "apply")
            for node, passes in row_passes(source):
                if node.start_byte == site.start_byte and not isinstance(passes, NotInForm):
                    first, last = passes.region[0], passes.region[-1]
                    text = row_passes_text(source, passes, elements)
                    return [Edit(first.start_byte, last.end_byte, text)]
            raise self.refuse(f"no row passes at line {site.start_line}", site, "apply")
        row = self._row(source, site)
        try:
            reloads = _application_plan(source, row)
        except _Refused as why:
            raise self.refuse(str(why), site, "apply") from None
        edits = []
        for reload in reloads:
            start = _pragmas_start(source, reload)
            whole = line_deletion(source, reload)
            if start < reload.start_byte and whole.start_byte < reload.start_byte:
                whole = Edit(source.line_start(start), whole.end_byte, "")
            edits.append(whole)
        return edits
