"""Candidate filtering: a capacity-guarded fast path that stages a subset in shared memory.

Multi-pass selection (top-k, radix select, sampling) often narrows the input after a first
pass: the elements that can still matter (the *candidates*) are copied into a shared-memory
buffer, and the later passes run over that buffer instead of re-reading the whole input from
global memory. The buffer has a fixed capacity, so the kernel keeps a general path for
inputs whose candidates do not fit::

    if (crowd > (uint32_t)kCapacity) {      // the guard: candidates would not fit
      select_from_row<kVec4>(sh, row, n, top, k, out);   // general path: handles any input
      return;
    }
    ...stage candidates: sh.cand_key[slot] = key;...     // fast path (kCapacity-sized arrays)
    select_from_candidates(sh, top, k, out);

Recognized: an ``if`` whose condition compares a value with a capacity (a constant or a
template parameter), where one path writes a shared-memory array declared with that capacity
and the other does not. Both the early-return form above (with the general path in the
``if`` or after it) and the ``if``/``else`` form are read.

- remove: keep only the general path. Semantics are kept because the general path handles
  every input; the guard only chose the faster path (stated as a condition). The fast path's
  helpers stay in the file, unused.
- apply: a rule cannot write a staging pass, so ``apply`` needs the kernel's own fast path:
  it wraps a general-path call that ends a device function (and takes shared memory) as
  ``if (guard) { general; return; } fast_path`` with ``guard`` and ``fast_path`` from the
  carrier (``carrier_of`` a detected site records them). Without them it refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

from klineage.conditions import Condition, Prose
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import statement_after
from klineage.kernel import KernelSource
from klineage.mechanisms._selection_util import (
    block_statements,
    call_name,
    declared_names,
    dedent_lines,
    is_pure,
    iter_descendants,
    node_starting_at,
    normalized,
    shared_array_size,
    shared_base,
    strip_parens,
)
from klineage.mechanisms.base import Carrier, Mechanism, MechanismError, Site, register
from klineage.problem import Problem

Form = Literal["return", "return_fast", "else"]
_COMPARISONS = frozenset({"<", "<=", ">", ">="})
_INDENT = "  "


@dataclass(frozen=True)
class _Filter:
    """A capacity-guarded fast path and its general fallback."""

    guard: Node
    """The ``if`` statement."""
    form: Form
    """``return``: ``if (too many) { general; return; } fast...``; ``return_fast``:
    ``if (fits) { fast; return; } general...``; ``else``: ``if (...) {...} else {...}``."""
    general: tuple[Node, ...]
    """The general path's statements (a trailing ``return;`` left out)."""
    general_block: Node | None
    """The general path's compound statement, when it is one."""
    end_byte: int
    """Where the site ends: after the fast path (``return`` form) or the ``if``."""
    capacity: str
    staged: str
    """A shared array the fast path fills, e.g. ``sh.cand_key``."""


def _capacity(source: ParsedSource, function: Function, node: Node) -> int | str | None:
    """The value (or template parameter name) of a capacity operand."""
    node = strip_parens(node)
    while node.type == "cast_expression":
        value = node.child_by_field_name("value")
        if value is None:
            return None
        node = strip_parens(value)
    if node.type == "identifier" and source.text_of(node) in function.template_params:
        return source.text_of(node)
    if node.type not in ("identifier", "number_literal"):
        return None
    return fold_int(source, node)


def _staging(
    source: ParsedSource, function: Function, statements: list[Node], capacity: int | str
) -> str | None:
    """A shared array sized by ``capacity`` that the statements write, e.g. ``sh.cand_key``."""
    for statement in statements:
        for node in [statement, *iter_descendants(statement, "assignment_expression")]:
            if node.type != "assignment_expression":
                continue
            left = node.child_by_field_name("left")
            if left is None:
                continue
            size = shared_array_size(source, function, left)
            if size is None:
                continue
            value: int | str | None = _capacity(source, function, size)
            if value == capacity:
                array = strip_parens(left).child_by_field_name("argument")
                return normalized(source.text_of(array)) if array is not None else None
    return None


def _ends_with_return(statements: list[Node]) -> bool:
    last = statements[-1] if statements else None
    return last is not None and last.type == "return_statement" and not last.named_children


def _paths(source: ParsedSource, guard: Node) -> list[tuple[Form, list[Node], list[Node]]]:
    """Possible (form, general, fast) readings of an ``if``."""
    consequence = guard.child_by_field_name("consequence")
    alternative = guard.child_by_field_name("alternative")
    then = block_statements(consequence)
    if alternative is not None:
        other = alternative.named_children[-1] if alternative.named_children else None
        otherwise = block_statements(other)
        return [("else", then, otherwise), ("else", otherwise, then)]
    parent = guard.parent
    if parent is None or parent.type != "compound_statement" or not _ends_with_return(then):
        return []
    siblings = block_statements(parent)
    following = siblings[siblings.index(guard) + 1 :]
    return [("return", then[:-1], following), ("return_fast", following, then)]


def _find(source: ParsedSource, guard: Node) -> _Filter | None:
    """The filter an ``if`` statement guards, if it is one."""
    function = source.enclosing_function(guard)
    condition = guard.child_by_field_name("condition")
    if function is None or not function.runs_on_device or condition is None:
        return None
    test = strip_parens(condition.named_children[-1]) if condition.named_children else None
    operator = test.child_by_field_name("operator") if test is not None else None
    if test is None or operator is None or operator.type not in _COMPARISONS:
        return None
    sides = [test.child_by_field_name("left"), test.child_by_field_name("right")]
    for side in sides:
        capacity = _capacity(source, function, side) if side is not None else None
        if capacity is None:
            continue
        for form, general, fast in _paths(source, guard):
            staged = _staging(source, function, fast, capacity)
            if not general or staged is None or _staging(source, function, general, capacity):
                continue
            return _Filter(
                guard=guard,
                form=form,
                general=tuple(general),
                general_block=_block_of(guard, general, form),
                end_byte=fast[-1].end_byte if form == "return" else guard.end_byte,
                capacity=str(capacity),
                staged=staged,
            )
    return None


def _block_of(guard: Node, general: list[Node], form: Form) -> Node | None:
    parent = general[0].parent
    if form == "return_fast" or parent is None or parent.type != "compound_statement":
        return None
    return parent if parent != guard.parent else None


@register
class CandidateFiltering(Mechanism):
    name = "candidate_filtering"
    category = "memory"
    family = "multi-pass filtering"
    intent = (
        "Copy the elements that can still matter into shared memory after a first pass, and "
        "finish there instead of re-reading the input, with a general path when they do "
        "not fit."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "guard": "the condition under which the general path runs (e.g. crowd > kCapacity)",
        "fast_path": "the source text of the filtered fast path that follows the guard",
        "form": "how the paths were written: return (supported by apply), return_fast, else",
    }

    # -- backward -----------------------------------------------------------------------------

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for guard in source.nodes("if_statement"):
            found = _find(source, guard)
            if found is None:
                continue
            yield self.site(
                source,
                guard,
                span=(guard.start_byte, found.end_byte),
                detail={"form": found.form, "capacity": found.capacity, "staged": found.staged},
                refusal=self._removal_refusal(source, found),
            )

    def _filter(self, source: ParsedSource, site: Site) -> _Filter:
        guard = node_starting_at(source, site.start_byte, "if_statement")
        found = _find(source, guard) if guard is not None else None
        if found is None:
            raise MechanismError(f"{self.name}: no capacity-guarded filter at {site}")
        return found

    def _removal_refusal(self, source: ParsedSource, found: _Filter) -> str | None:
        condition = found.guard.child_by_field_name("condition")
        if condition is None or not is_pure(source, condition):
            return "the guard has side effects, which removing it would drop"
        if found.form == "return_fast":
            return None
        names = declared_names(source, _span_node(found))
        if not names or found.form == "else":
            return None
        earlier = _declared_before(source, found.guard)
        clash = sorted(names & earlier)
        if clash:
            return f"the general path declares {', '.join(clash)}, already declared before it"
        return None

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        found = self._filter(source, site)
        guard = found.guard
        if found.form == "return_fast":
            return [source.deletion(guard, whole_line=True)]
        indent = source.indent_of(guard.start_byte)
        first, last = found.general[0], found.general[-1]
        inner = source.indent_of(first.start_byte)
        keeps_return = found.form == "return" and not _ends_function(source, guard)
        in_block = guard.parent is not None and guard.parent.type == "compound_statement"
        if (
            found.form == "else"
            and found.general_block is not None
            and (declared_names(source, found.general_block) or not in_block)
        ):
            # braces kept: the general path's locals cannot clash, and an `else if` stays one
            text = source.text_of(found.general_block)
            inner = source.indent_of(found.general_block.start_byte)
        elif found.form == "else" and not in_block:
            text = "{ " + source.text_of(found.general[0]) + " }"  # `else if (...) s; else f;`
        else:
            end = last.end_byte
            if keeps_return:
                end = _after(found.general[-1]).end_byte
            text = source.text_of((first.start_byte, end))
        text = dedent_lines(text, max(0, len(inner) - len(indent)))
        return [Edit(guard.start_byte, found.end_byte, text)]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source = kernel.parsed
        found = self._filter(source, site)
        condition = found.guard.child_by_field_name("condition")
        assert condition is not None
        guard_text = source.text_of(condition)[1:-1].strip()
        if found.form != "return":
            return Carrier(form=found.form, guard=guard_text)
        fast = source.text_of((found.guard.end_byte, found.end_byte))
        return Carrier(form="return", guard=guard_text, fast_path=fast)

    # -- forward ------------------------------------------------------------------------------

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        filtered = {
            site.function
            for site in self.find_sites(source)  # functions that have one already
        }
        for function in source.functions:
            if not function.runs_on_device or function.body is None:
                continue
            if function.name in filtered:
                continue
            statements = block_statements(function.body)
            last = statements[-1] if statements else None
            if last is None or last.type != "expression_statement" or not last.named_children:
                continue
            call = strip_parens(last.named_children[0])
            name = call_name(source, call)
            if name is None or source.function(name) is None:
                continue
            arguments = call.child_by_field_name("arguments")
            args = arguments.named_children if arguments is not None else []
            if not any(shared_base(source, function, a) for a in args):
                continue  # a general path works on the block's shared memory
            yield self.site(source, last, detail={"general": name})

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        statement = self.node_at(source, site, "expression_statement")
        form = carrier.get_str("form", "return")
        guard = carrier.get_str("guard")
        fast = carrier.get_str("fast_path")
        if form != "return":
            raise self.refuse(
                f"only the early-return form can be rebuilt (the carrier says {form!r})",
                site,
                "apply",
            )
        if not guard or not fast:
            raise self.refuse(
                "the kernel has only the general path here: candidate filtering needs the "
                "filtered fast path and its capacity guard (carrier fast_path and guard, as "
                "carrier_of records them); a rule cannot write a staging pass",
                site,
                "apply",
            )
        indent = source.indent_of(statement.start_byte)
        text = (
            f"if ({guard}) {{\n{indent}{_INDENT}{source.text_of(statement)}\n"
            f"{indent}{_INDENT}return;\n{indent}}}{fast}"
        )
        return [Edit.replace(statement, text)]

    # -- conditions ---------------------------------------------------------------------------

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        capacity = site.detail.get("capacity", "the capacity")
        staged = site.detail.get("staged", "the shared buffer")
        return [
            Prose(
                text="the general path must give the same result for every input, not only "
                "for those whose candidates overflow the buffer",
                why="without the filter every input takes the general path",
            ),
            Prose(
                text=f"the fast path may run only when its candidates fit in {staged} "
                f"({capacity} elements)",
                why="the guard is what keeps the staging writes inside the shared buffer",
            ),
        ]


def _span_node(found: _Filter) -> Node:
    return found.general_block or found.general[0]


def _declared_before(source: ParsedSource, guard: Node) -> set[str]:
    parent = guard.parent
    names: set[str] = set()
    for statement in block_statements(parent):
        if statement.start_byte < guard.start_byte and statement.type == "declaration":
            names |= declared_names(source, statement)
    return names


def _ends_function(source: ParsedSource, guard: Node) -> bool:
    """Whether the ``if`` sits in the function's own body (its ``return;`` then only ends the
    function early, which the removed fast path no longer needs)."""
    function = source.enclosing_function(guard)
    return function is not None and guard.parent == function.body


def _after(statement: Node) -> Node:
    """The statement after ``statement`` (the general path's ``return;``)."""
    following = statement_after(statement)
    return following if following is not None else statement
