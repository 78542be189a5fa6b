"""The stage count of a ring of shared-memory buffers handed between warps through mbarriers.

Hopper pipelines (TMA or bulk copies by a producer warp, math by consumer warps) keep a ring
of ``S`` stages: each stage has its tile buffers and a ``full``/``empty`` pair of mbarriers,
and each side walks the ring with an index that wraps and flips the barrier parity::

    template <int STAGES, ...> __global__ void kernel(...) {
      __shared__ uint64_t full[STAGES], empty[STAGES];   // or cuda::barrier, or struct fields
      ...
      if (stage == STAGES) { stage = 0; phase ^= 1; }     // or stage = (stage + 1) % STAGES
    }
    void run(...) { constexpr int STAGES = 4; auto* k = kernel<STAGES, ...>; k<<<...>>>(...); }

Such a kernel is written for any stage count, one included: with one stage the producer
waits for the consumers to free the only buffer before it refills it, so copies no longer
overlap the math, and the results are the same. Removing the pipeline sets the count bound at
the launch to 1 (the literal template argument, or the launching function's constant when
every use of it is a template argument); applying it sets a count of 1 back to ``stages``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.facts import template_values
from klineage.cuda.source import Function, Node, ParsedSource, strip_parens, within
from klineage.cuda.tree import NotInForm
from klineage.mechanisms._launch_literal import launch_literal

BARRIER_TYPES = frozenset({"uint64_t", "unsigned long long", "__mbarrier_t", "std::uint64_t"})
"""Element types of an mbarrier array (an mbarrier is a 64-bit word in shared memory)."""
_LIBCU_BARRIER = re.compile(
    r"\busing\s+(\w+)\s*=\s*(?:::)?cuda::barrier\s*<"
    r"|\btypedef\s+(?:::)?cuda::barrier\s*<[^;]*>\s*(\w+)\s*;"
)


def _barrier_types(source: ParsedSource) -> frozenset[str]:
    """The element types of barrier arrays in this file: 64-bit words, libcu++'s
    ``cuda::barrier<...>`` (also an mbarrier in shared memory) and the names the file gives it
    (``using barrier = cuda::barrier<cuda::thread_scope_block>;``)."""
    aliases = {a or b for a, b in _LIBCU_BARRIER.findall(source.kernel.text)}
    return BARRIER_TYPES | aliases


def _is_barrier(types: frozenset[str], type_text: str) -> bool:
    text = type_text.strip().removeprefix("::")
    return text in types or text.startswith("cuda::barrier<")


@dataclass(frozen=True)
class Ring:
    """A ring of stages in a kernel, and where its stage count is written at the launch."""

    kernel: Function
    parameter: str
    """The kernel's template parameter that counts the stages."""
    barriers: str
    """An mbarrier array sized by it (``full``)."""
    wrap: Node
    """The first statement that wraps the stage index."""
    stages: int
    """The count every launch binds."""
    count: Node | None
    """The literal to edit: the launch's template argument or the launching constant's value;
    None when the count is written in a form this rule does not edit (``refusal`` says why)."""
    refusal: str | None = None


def _barrier_array(source: ParsedSource, kernel: Function, parameter: str) -> str | None:
    """The name of a 64-bit array sized by ``parameter``, declared in ``kernel`` or as a field
    of a struct template that ``kernel`` instantiates with ``parameter`` at that position."""
    assert kernel.body is not None
    types = _barrier_types(source)
    for decl in source.declarations:
        if within(decl.node, kernel.body) and _is_barrier(types, decl.type):
            for name, declarator in zip(decl.names, decl.declarators, strict=True):
                if _sized_by(source, declarator, parameter):
                    return name
    for struct, position in _struct_uses(source, kernel, parameter):
        for field in source.iter_nodes("field_declaration", within=struct):
            type_node = field.child_by_field_name("type")
            if type_node is None or not _is_barrier(types, source.text_of(type_node)):
                continue
            for declarator in field.children_by_field_name("declarator"):
                if _sized_by(source, declarator, position):
                    name = declarator.child_by_field_name("declarator")
                    return source.text_of(name) if name is not None else None
    return None


def _sized_by(source: ParsedSource, declarator: Node, name: str) -> bool:
    size = declarator.child_by_field_name("size") if declarator.type == "array_declarator" else None
    return size is not None and source.text_of(strip_parens(size)).strip() == name


def _struct_uses(
    source: ParsedSource, kernel: Function, parameter: str
) -> Iterator[tuple[Node, str]]:
    """(struct body, its template parameter) for each struct template that ``kernel`` names
    with ``parameter`` as one of its arguments: ``Storage<TILE, STAGES>``."""
    assert kernel.body is not None
    templates: dict[str, Node] = {}
    for node in source.nodes("struct_specifier"):
        name = node.child_by_field_name("name")
        if (
            name is not None
            and node.parent is not None
            and node.parent.type == "template_declaration"
        ):
            templates.setdefault(source.text_of(name), node.parent)
    for use in source.iter_nodes("template_type", within=kernel.body):
        name = use.child_by_field_name("name")
        arguments = use.child_by_field_name("arguments")
        template = templates.get(source.text_of(name)) if name is not None else None
        if template is None or arguments is None:
            continue
        given = [source.text_of(a).strip() for a in arguments.named_children]
        params = template.child_by_field_name("parameters")
        names = [
            source.text_of(p.child_by_field_name("declarator"))
            for p in (params.named_children if params is not None else [])
            if p.child_by_field_name("declarator") is not None
        ]
        body = next(
            (
                c.child_by_field_name("body")
                for c in template.named_children
                if c.type == "struct_specifier"
            ),
            None,
        )
        if body is None or len(names) != len(given):
            continue
        for declared, argument in zip(names, given, strict=True):
            if argument == parameter:
                yield body, declared


def _wraps(source: ParsedSource, kernel: Function, parameter: str) -> list[Node]:
    """Statements that wrap an index at ``parameter``: ``if (q == S) { q = 0; ... }`` and
    ``q = (q + 1) % S``."""
    assert kernel.body is not None
    found = []
    for statement in source.iter_nodes("if_statement", within=kernel.body):
        condition = statement.child_by_field_name("condition")
        text = "".join(source.text_of(condition).split()) if condition is not None else ""
        for index in _compared_names(text, parameter):
            body = statement.child_by_field_name("consequence")
            if body is not None and f"{index}=0;" in "".join(source.text_of(body).split()):
                found.append(statement)
    for assignment in source.iter_nodes("assignment_expression", within=kernel.body):
        right = assignment.child_by_field_name("right")
        if right is not None and right.type == "binary_expression":
            operator = right.child_by_field_name("operator")
            divisor = right.child_by_field_name("right")
            if (
                operator is not None
                and source.text_of(operator) == "%"
                and divisor is not None
                and source.text_of(strip_parens(divisor)) == parameter
            ):
                found.append(assignment)
    return sorted(found, key=lambda n: n.start_byte)


def _compared_names(condition: str, parameter: str) -> list[str]:
    """The index ``q`` of a condition ``(q==S)``, ``(++q==S)`` or ``(S==q)``, ``q`` a name."""
    inner = condition.strip("()")
    if inner.count("==") != 1:
        return []
    left, right = (side.strip("()").removeprefix("++") for side in inner.split("=="))
    other = right if left == parameter else left if right == parameter else None
    return [other] if other is not None and other.isidentifier() else []


def rings(source: ParsedSource) -> Iterator[Ring]:
    """Every ring of mbarrier-handed stages in the file's kernels."""
    text = source.kernel.text
    if "mbarrier" not in text and "cuda::barrier" not in text:
        return
    for kernel in source.kernels:
        if kernel.body is None:
            continue
        for position, parameter in enumerate(kernel.template_params):
            barriers = _barrier_array(source, kernel, parameter)
            wraps = _wraps(source, kernel, parameter) if barriers is not None else []
            if barriers is None or not wraps:
                continue
            bindings = template_values(source, kernel.name) or []
            counts = {b.get(parameter) for b in bindings}
            if len(counts) != 1 or None in counts:
                yield Ring(
                    kernel,
                    parameter,
                    barriers,
                    wraps[0],
                    0,
                    None,
                    f"the stage count {parameter} is not one constant at the launches",
                )
                continue
            count, why = launch_literal(source, kernel, position, template_only=True)
            yield Ring(kernel, parameter, barriers, wraps[0], int(counts.pop() or 0), count, why)


def set_stages(source: ParsedSource, ring: Ring, stages: int) -> list[Edit]:
    """The edit that makes the launch bind ``stages`` stages."""
    if ring.count is None:
        raise NotInForm(
            f"a ring whose stage count is not edited here ({ring.refusal})",
            "a literal or constant count at the kernel's one launch",
        )
    if stages < 1:
        raise NotInForm(f"a ring asked for {stages} stages", "at least one stage")
    return [Edit.replace(ring.count, str(stages))]
