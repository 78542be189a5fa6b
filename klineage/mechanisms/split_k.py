"""Split-K: the reduction dimension is partitioned across blocks, then the partials summed.

When the output has too few tiles to fill the GPU (a GEMM with small M and N), K is split
across blocks too (``grid.y``): each block reduces its K range into an fp32 partial tile,
and a small kernel (or atomics) sums the partials.

- detect: the host-side choice of the split count (an ``if`` that raises a local from its
  initial 1, the local being the y or z extent of a launch's grid), kernels whose K range
  starts at ``blockIdx.y`` (or ``.z``) times a run-time size, kernels that reduce over
  ``gridDim.y`` and store a partial per ``blockIdx.y``, and kernels that sum over a count a
  launch passes the split count for (:mod:`klineage.mechanisms._split_forms`);
- remove: the canonical host-side choice ``int splits = 1; ... if (tiles < sms) splits =
  ...;`` is deleted, so ``splits`` stays 1: one block owns K. This is semantics-preserving
  because the code already handles ``splits == 1`` (it is the initial value), and the split
  kernels become dead code. A count computed to fill the GPU and clamped below at one
  (``const int n = max(1, threads_per_sm * sms / (block * blocks_x));``, llm.c's spelling)
  becomes ``= 1``: the clamp says the code already handles a single split. The kernel-side
  sites are refused (they follow the host's choice);
- apply: a choice a removal carried goes back after the split count's ``= 1`` declaration,
  where the code after it still branches on the count (the workspace, the split kernels and
  the reduction are all still there; only the choice was deleted); a carried clamp replaces
  the ``1`` again, when every name it reads is declared before it. On naive code, a
  thread-per-output sum is split over ``blockIdx.y`` with atomics, into the output or a
  float workspace a second kernel stores (:mod:`klineage.mechanisms._split_loops`). Any
  other new split is refused: it needs a partial-sum workspace and a reduction kernel, which
  only a person or an LLM writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import call_arguments, declaration_names, strip_parens
from klineage.kernel import KernelSource
from klineage.mechanisms._split_forms import (
    grid_split_counts,
    k_range_declarations,
    partial_loops,
    partial_sums,
)
from klineage.mechanisms._split_loops import (
    BLOCKS_PER_SM,
    MIN_ROWS,
    NotSplittable,
    match,
    split_loops,
)
from klineage.mechanisms._split_rewrite import split_edits
from klineage.mechanisms._tiles_util import (
    names_in,
    statement_deletion,
    statements,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

KERNEL_REFUSAL = (
    "the kernel follows the host's split count; remove the host-side choice of splits so "
    "this path is no longer taken"
)
APPLY_REFUSAL = (
    "splitting K needs a partial-sum workspace (or atomics) and a reduction kernel, which "
    "only a person or an LLM writes"
)


def _host_choices(
    source: ParsedSource, function: Function, counts: set[str] | None = None
) -> Iterator[tuple[Node, str | None]]:
    """``if (...) n = ...;`` statements of a host function where ``n`` is a split count (the
    y or z extent of a launch's grid, unless ``counts`` names them), with a refusal or None."""
    if function.body is None or function.runs_on_device:
        return
    if counts is None:
        counts = grid_split_counts(source)
    for node in source.iter_nodes("if_statement", within=function.body):
        consequence = node.child_by_field_name("consequence")
        if consequence is None:
            continue
        body = (
            statements(consequence) if consequence.type == "compound_statement" else [consequence]
        )
        assignments = [_assigned(source, s) for s in body]
        if not assignments or None in assignments:
            continue
        targets = {t for t in assignments if t is not None}
        if not targets <= counts:
            continue
        refusal = None
        initial = [_initial(source, t, node) for t in sorted(targets)]
        if node.child_by_field_name("alternative") is not None:
            refusal = "the choice has an else branch, so no single value is the default"
        elif any(v != "1" for v in initial):
            refusal = (
                "the split count is not a local initialized to 1 before the choice, so "
                "deleting the choice is not known to leave a single split"
            )
        yield node, refusal


_MAX_CALLS = frozenset({"max", "std::max", "::max"})


def _clamp_at_one(source: ParsedSource, value: Node) -> bool:
    """Whether ``value`` is ``max(1, E)`` or ``max(E, 1)``: never below one."""
    value = strip_parens(value)
    if value.type != "call_expression":
        return False
    callee = value.child_by_field_name("function")
    if callee is None or "".join(source.text_of(callee).split()) not in _MAX_CALLS:
        return False
    arguments = call_arguments(value)
    return len(arguments) == 2 and any(source.text_of(a).strip() == "1" for a in arguments)


def _clamps(
    source: ParsedSource, within: Node | None = None, counts: set[str] | None = None
) -> Iterator[tuple[Node, Node]]:
    """``n = max(1, ...)`` declarators under ``within`` (the whole source by default), with
    their declaration; only those whose ``n`` is in ``counts`` when it is given."""
    for statement in source.iter_nodes("declaration", within=within):
        for declarator in statement.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if inner is None or value is None or not _clamp_at_one(source, value):
                continue
            if counts is None or source.text_of(inner) in counts:
                yield statement, value


def _clamped_counts(source: ParsedSource, function: Function) -> Iterator[tuple[Node, Node]]:
    """The clamps of a host function's split counts: each count computed (to fill the GPU,
    say) and clamped at one."""
    if function.body is not None and not function.runs_on_device:
        yield from _clamps(source, function.body, grid_split_counts(source))


def _declared_before(source: ParsedSource, function: Function, at: int) -> set[str]:
    """Names the file's constants and macros, the function's parameters and its declarations
    before byte ``at`` define."""
    names = {p.name for p in function.params}
    scopes = [source.root] if function.body is None else [source.root, function.body]
    for scope in scopes:
        for statement in scope.named_children:
            if statement.start_byte >= at:
                break
            if statement.type == "preproc_def":
                name = statement.child_by_field_name("name")
                names |= {source.text_of(name)} if name is not None else set()
            if statement.type == "declaration":
                names |= set(declaration_names(source, statement))
    return names


def _assigned(source: ParsedSource, statement: Node) -> str | None:
    """The name a statement ``x = ...;`` assigns, else None."""
    if statement.type != "expression_statement" or not statement.named_children:
        return None
    assignment = statement.named_children[0]
    left = assignment.child_by_field_name("left")
    if assignment.type != "assignment_expression" or left is None or left.type != "identifier":
        return None
    return source.text_of(left)


def _initial(source: ParsedSource, name: str, before: Node) -> str | None:
    """The initializer text of the declaration of ``name`` in scope at ``before`` (the
    nearest enclosing block that declares it before that point), if it is never assigned
    between; None otherwise."""
    scope: Node | None = before.parent
    while scope is not None:
        if scope.type == "compound_statement":
            for statement in statements(scope):
                if statement.start_byte >= before.start_byte:
                    break
                if statement.type != "declaration":
                    continue
                for declarator in statement.children_by_field_name("declarator"):
                    inner = declarator.child_by_field_name("declarator")
                    value = declarator.child_by_field_name("value")
                    if inner is not None and source.text_of(inner) == name:
                        return None if value is None else source.text_of(value).strip()
        scope = scope.parent
    return None


def _restorable(source: ParsedSource, function: Function) -> Iterator[tuple[Node, str]]:
    """``int splits = 1;`` declarations of a host function that no choice follows but later
    code still reads (the split path is there, its choice is gone), with the local's name."""
    if function.body is None or function.runs_on_device:
        return
    choices = {node for node, _ in _host_choices(source, function)}
    counts = grid_split_counts(source)
    for block in source.iter_nodes("compound_statement", within=function.body):
        body = statements(block)
        for index, statement in enumerate(body):
            if statement.type != "declaration":
                continue
            for declarator in statement.children_by_field_name("declarator"):
                inner = declarator.child_by_field_name("declarator")
                value = declarator.child_by_field_name("value")
                if inner is None or value is None or source.text_of(value).strip() != "1":
                    continue
                name = source.text_of(inner)
                later = body[index + 1 :]
                if name not in counts or any(s in choices for s in later):
                    continue
                if any(name in names_in(source, s) for s in later):
                    yield statement, name


def _carried_choice(text: str, name: str) -> bool:
    """Whether ``text`` is one host choice ``if (...) name = ...;`` and nothing else."""
    probe = KernelSource(f"void choose() {{\n  int {name} = 1;\n{text}\n}}\n", name="carried")
    source = probe.parsed
    function = source.function("choose")
    if function is None or function.body is None or source.errors:
        return False
    found = list(_host_choices(source, function, {name}))
    return (
        len(found) == 1
        and found[0][1] is None
        and len(statements(function.body)) == 2
        and names_in(source, found[0][0].child_by_field_name("consequence") or found[0][0])
        >= {name}
    )


def _kernel_sites(source: ParsedSource, function: Function) -> list[Node]:
    """A kernel's K range per block (``begin = blockIdx.y * S``), its partials per block row
    (a loop grid-strided over ``gridDim.y`` storing per-``blockIdx.y`` results), or its sum of
    the partials (a loop up to the split count a launch passes)."""
    found = k_range_declarations(source, function) + partial_loops(source, function)
    if not found and partial_sums(source, function, grid_split_counts(source)):
        found.append(function.outer)
    return found


@register
class SplitK(Mechanism):
    name = "split_k"
    category = "parallelism"
    signature = ("host",)
    fills_threads = True  # a thread's sum over blocks: nothing to gain where the GPU is full
    spreads_loop = "blocks"
    family = "block and warp tiling"
    intent = (
        "Split the reduction dimension across blocks when the output alone cannot fill the "
        "GPU, and sum the partial results afterwards."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "choice": "the host's `if (...) splits = ...;` a removal carried, as written; it goes "
        "back after the count's `= 1` declaration (a new choice is refused)",
        "clamp": "the count's `max(1, ...)` initializer a removal carried, as written; it "
        "replaces the `1` of the count's declaration again",
        "blocks_per_sm": "for a naive sum split anew: blocks per SM the split count aims at "
        f"(default {BLOCKS_PER_SM})",
        "min_rows": "for a naive sum split anew: reduction steps each split keeps at least "
        f"(default {MIN_ROWS})",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.functions:
            for node, refusal in _host_choices(source, function):
                condition = node.child_by_field_name("condition")
                end = condition.end_byte if condition is not None else node.end_byte
                yield self.site(
                    source,
                    node,
                    snippet=source.snippet((node.start_byte, end)) + " splits = ...",
                    detail={"side": "host"},
                    refusal=refusal,
                )
            for declaration, _ in _clamped_counts(source, function):
                yield self.site(
                    source,
                    declaration,
                    snippet=source.snippet(declaration),
                    detail={"side": "host", "form": "clamp"},
                )
        for function in source.kernels:
            for node in _kernel_sites(source, function):
                yield self.site(
                    source,
                    node,
                    snippet=f"{function.name}: "
                    + (
                        "sums the split partials"
                        if node == function.outer
                        else source.snippet(node)
                    ),
                    detail={"side": "kernel"},
                    refusal=KERNEL_REFUSAL,
                )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.functions:
            for declaration, name in _restorable(source, function):
                yield self.site(
                    source,
                    declaration,
                    snippet=f"{source.snippet(declaration)} (no choice raises {name})",
                    detail={"side": "host", "split": name},
                )
        split = set()
        for kernel, loop, refusal in split_loops(source):
            if _kernel_sites(source, kernel):
                continue  # a kernel of a split already (its K range, its partials' sum)
            if refusal is None:
                split.add(kernel.name)
            yield self.site(
                source,
                loop,
                snippet=f"{kernel.name}: {source.snippet(loop)}",
                detail={"side": "kernel", "form": "loop"},
                refusal=refusal and f"{refusal}; {APPLY_REFUSAL}",
            )
        for launch in source.launches:
            function = source.enclosing_function(launch.node)
            if function is not None and function.extern_c and launch.kernel not in split:
                yield self.site(source, launch.node, refusal=APPLY_REFUSAL)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == "clamp":
            return [Edit.replace(self._clamp(source, site), "1")]
        node = self.node_at(source, site, "if_statement")
        function = source.enclosing_function(node)
        if function is None:
            raise self.refuse("the choice is not in a function", site)
        for found, refusal in _host_choices(source, function):
            if found == node:
                if refusal is not None:
                    raise self.refuse(refusal, site)
                return [statement_deletion(source, node)]
        raise self.refuse("the split choice is not found", site)

    def _clamp(self, source: ParsedSource, site: Site) -> Node:
        """The ``max(1, ...)`` initializer of a clamped count's declaration at ``site``."""
        declaration = self.node_at(source, site, "declaration")
        function = source.enclosing_function(declaration)
        if function is not None:
            for found, value in _clamped_counts(source, function):
                if found == declaration:
                    return value
        raise self.refuse("the count's `max(1, ...)` initializer is not found", site)

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("side") != "host":
            return Carrier()
        if site.detail.get("form") == "clamp":
            return Carrier(clamp=kernel.parsed.text_of(self._clamp(kernel.parsed, site)))
        node = self.node_at(kernel.parsed, site, "if_statement")
        return Carrier(choice=kernel.parsed.text_of(node))

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == "loop":
            return self._split_loop(source, site, carrier)
        name = site.detail.get("split")
        clamp = carrier.as_dict().get("clamp")
        if isinstance(name, str) and isinstance(clamp, str):
            return [self._clamp_back(source, site, clamp)]
        choice = carrier.as_dict().get("choice")
        if not isinstance(name, str) or not isinstance(choice, str):
            raise self.refuse(APPLY_REFUSAL, site, "apply")
        if not _carried_choice(choice, name):
            raise self.refuse(
                f"the carried choice is not one `if (...) {name} = ...;` without an else",
                site,
                "apply",
            )
        declaration = self.node_at(source, site, "declaration")
        end = source.data.find(b"\n", declaration.end_byte)
        at = len(source.data) if end < 0 else end + 1
        indent = source.indent_of(declaration.start_byte)
        return [Edit.insert(at, f"{indent}{choice}\n")]

    def _split_loop(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        """A naive thread-per-output sum split over ``blockIdx.y`` (`_split_loops`)."""
        loop = self.node_at(source, site, "for_statement")
        kernel = source.enclosing_function(loop)
        if kernel is None:
            raise self.refuse("the loop is not in a kernel", site, "apply")
        try:
            found = match(source, kernel, loop)
        except NotSplittable as why:
            raise self.refuse(f"{why}; {APPLY_REFUSAL}", site, "apply") from why
        values = carrier.as_dict()
        per_sm = values.get("blocks_per_sm", BLOCKS_PER_SM)
        least = values.get("min_rows", MIN_ROWS)
        if not isinstance(per_sm, int) or not isinstance(least, int) or per_sm < 1 or least < 1:
            raise self.refuse("blocks_per_sm and min_rows must be positive integers", site, "apply")
        return split_edits(source, found, per_sm, least)

    def _clamp_back(self, source: ParsedSource, site: Site, clamp: str) -> Edit:
        """The count's ``1`` replaced by the carried ``max(1, ...)``, whose names must all be
        declared before the count."""
        probe = KernelSource(f"void count() {{\n  const int n = {clamp};\n}}\n", name="carried")
        parsed = probe.parsed
        values = [v for _, v in _clamps(parsed)]
        if parsed.errors or len(values) != 1:
            raise self.refuse(
                f"the carried count `{clamp}` is not one `max(1, ...)` expression", site, "apply"
            )
        declaration = self.node_at(source, site, "declaration")
        function = source.enclosing_function(declaration)
        value = next(
            (
                d.child_by_field_name("value")
                for d in declaration.children_by_field_name("declarator")
                if d.child_by_field_name("value") is not None
            ),
            None,
        )
        if function is None or value is None or source.text_of(value).strip() != "1":
            raise self.refuse("the split count is not declared `= 1` here", site, "apply")
        callee = values[0].child_by_field_name("function")
        called = names_in(parsed, callee) if callee is not None else set()
        missing = sorted(
            names_in(parsed, values[0])
            - called
            - _declared_before(source, function, declaration.start_byte)
        )
        if missing:
            raise self.refuse(
                f"the carried count reads {', '.join(missing)}, which this function does not "
                "declare before the count",
                site,
                "apply",
            )
        return Edit.replace(value, clamp)

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        found = [
            Prose(
                text="the partial sums of every split are added before the output is read",
                why="split-K trades one more pass over an fp32 workspace for more blocks",
            )
        ]
        if site.detail.get("form") == "loop":
            found.append(
                Prose(
                    text="the output tolerates float sums added in no fixed order",
                    why="the splits' partials meet through atomicAdd, so the last bits of "
                    "a sum can differ from one run to the next",
                )
            )
        return found
