"""The group reductions of a group-per-row kernel: inline "warp reduce, publish per warp,
barrier, reload" sequences, thread-0 serial finishes and calls to warp reduction helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from klineage.cuda.analysis import analysis
from klineage.cuda.source import Function, Node, ParsedSource, plain_assignment
from klineage.cuda.tree import declaration_names
from klineage.mechanisms._reductions_scratch import ScratchRun, scratch_runs
from klineage.mechanisms._reductions_serial import (
    SerialFormError,
    SerialRun,
    scratch_pointers,
    serial_runs,
)
from klineage.mechanisms._reductions_util import (
    arguments_of,
    builtin_uses,
    call_name,
    inside,
    is_builtin,
    is_zero_literal,
    named_statements,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    SERIAL_FORM,
    SYNC_CALLS,
    NotCanonical,
    is_call_statement,
    operator_of,
    single_init,
)
from klineage.mechanisms._rows_helpers import warp_reduce_functions
from klineage.mechanisms._warp_rows_cg import warp_reduces

if TYPE_CHECKING:
    from klineage.mechanisms._rows_group_walker import GroupWalker


class InlineReductions:
    """Recognizes a group reduction written inline::

    v = warp_sum(v);                        // a warp-reduction helper, every lane
    const int lane = threadIdx.x & 31;      // rank variables (unused afterwards)
    if (lane == 0) scratch[warp] = v;       // publish one value per warp
    __syncthreads();
    v = lane < kWarps ? scratch[lane] : 0;  // reload
    v = warp_sum(v);                        // reduce the warps' values
    __syncthreads();                        // (optional: scratch reused)
    """

    def __init__(self, source: ParsedSource, body: Node) -> None:
        self.source = source
        self.body = body
        self.warp_reducers = warp_reduce_functions(source)
        self.shared = {
            name for d in source.shared_declarations if within(d.node, body) for name in d.names
        }

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    def any_run(self) -> bool:
        """Whether the body holds such a run anywhere (detection)."""
        for block in inside(self.source, self.body, "compound_statement"):
            statements = named_statements(block)
            for index in range(len(statements)):
                try:
                    if self.run_end(statements, index) is not None:
                        return True
                except NotCanonical:
                    return True
        return False

    def run_end(self, statements: list[Node], start: int) -> int | None:
        """The index of the last statement of a reduction run starting at ``start``."""
        variable = self.warp_step(statements[start])
        if variable is None:
            return None
        synced = False
        declared: list[str] = []
        for index in range(start + 1, len(statements)):
            statement = statements[index]
            if self.warp_step(statement) == variable:
                if not synced:
                    return None
                following = statements[index + 1 :]
                if following and is_call_statement(self.source, following[0], SYNC_CALLS):
                    index += 1
                self.check_unused_after(declared, statements[index + 1 :])
                return index
            if is_call_statement(self.source, statement, SYNC_CALLS):
                synced = True
                continue
            if statement.type == "declaration" and builtin_uses(self.source, statement):
                declared += declaration_names(self.source, statement)
                continue
            if self.publishes(statement, variable) or self.reloads(statement, variable):
                continue
            return None
        return None

    def warp_step(self, statement: Node) -> str | None:
        """``v = warp_fn(v);`` -> ``v``."""
        if statement.type != "expression_statement" or not statement.named_children:
            return None
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression" or operator_of(assignment) != "=":
            return None
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        if left is None or right is None or right.type != "call_expression":
            return None
        if call_name(self.source, right) not in self.warp_reducers:
            return None
        args = arguments_of(right)
        name = self.source.text_of(left)
        return name if len(args) == 1 and self.source.text_of(args[0]) == name else None

    def publishes(self, statement: Node, variable: str) -> bool:
        """``if (lane == 0) scratch[warp] = v;``: one thread per warp stores ``v``."""
        if statement.type != "if_statement" or statement.child_by_field_name("alternative"):
            return False
        found = plain_assignment(statement.child_by_field_name("consequence"))
        if found is None:
            return False
        left, right = found
        base = left.child_by_field_name("argument")
        return (
            base is not None
            and self.source.text_of(base) in self.shared
            and self.source.text_of(right) == variable
        )

    def reloads(self, statement: Node, variable: str) -> bool:
        """``v = lane < n ? scratch[lane] : identity;``."""
        if statement.type != "expression_statement" or not statement.named_children:
            return False
        assignment = statement.named_children[0]
        if assignment.type != "assignment_expression":
            return False
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return False
        shared = self.shared
        return any(
            self.source.text_of(n) in shared for n in inside(self.source, right, "identifier")
        )

    def check_unused_after(self, names: list[str], rest: list[Node]) -> None:
        for statement in rest:
            for node in inside(self.source, statement, "identifier"):
                if self.source.text_of(node) in names:
                    raise NotCanonical(
                        f"{self.source.text_of(node)} from the block reduction is used again "
                        f"at line {self.line(node)}"
                    )


def warp_reduction_of(
    source: ParsedSource, kernel: Function, helpers: set[str]
) -> Callable[[Node], Node | None]:
    """The reduced value of a warp-reduction call in ``kernel`` (a helper of ``helpers`` or
    ``cg::reduce`` over a 32-thread tile), None for any other node."""
    tiles = {r.node.start_byte: r.value for r in warp_reduces(source, kernel)}

    def reduction(node: Node) -> Node | None:
        if node.type != "call_expression":
            return None
        if node.start_byte in tiles:
            return tiles[node.start_byte]
        args = arguments_of(node)
        return args[0] if call_name(source, node) in helpers and len(args) == 1 else None

    return reduction


def group_scratch_runs(
    source: ParsedSource, kernel: Function, inline: InlineReductions
) -> list[ScratchRun]:
    """The per-warp scratch block reductions of ``kernel``, in every block of statements."""
    reduction = warp_reduction_of(source, kernel, inline.warp_reducers)

    def is_barrier(statement: Node) -> bool:
        if is_call_statement(source, statement, SYNC_CALLS):
            return True
        call = statement.named_children[0] if statement.named_children else None
        barrier = analysis(source).cooperative_groups.barrier_at(call) if call else None
        return barrier is not None and barrier.scope == "block"

    assert kernel.body is not None
    return [
        run
        for block in inside(source, kernel.body, "compound_statement")
        for run in scratch_runs(
            source, named_statements(block), inline.shared, reduction, is_barrier
        )
    ]


def group_serial_runs(
    source: ParsedSource, kernel: Function, walker: GroupWalker | None = None
) -> list[SerialRun]:
    """The thread-0 serial block reductions of ``kernel``, in every block of statements;
    :class:`NotCanonical` when one starts as the form does and differs from it."""
    inline = walker.inline if walker is not None else InlineReductions(source, kernel.body)
    reduction = warp_reduction_of(source, kernel, inline.warp_reducers)
    assert kernel.body is not None
    scratch = inline.shared | set(scratch_pointers(source, kernel.body, inline.shared))
    aliases = walker.rank_aliases if walker is not None else rank_aliases(source, kernel.body)

    def is_first(node: Node) -> bool:
        node = strip_parens(node)
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if node.type != "binary_expression" or operator_of(node) != "==" or left is None:
            return False
        rank = is_builtin(source, left, "threadIdx") or source.text_of(left) in aliases
        return rank and is_zero_literal(source, right)

    def is_barrier(statement: Node) -> bool:
        return is_call_statement(source, statement, SYNC_CALLS)

    def is_warp_count(node: Node) -> bool:
        return counts_warps(source, kernel, node, walker)

    try:
        return [
            run
            for block in inside(source, kernel.body, "compound_statement")
            for run in serial_runs(
                source,
                named_statements(block),
                scratch,
                reduction,
                is_barrier,
                is_first,
                is_warp_count,
            )
        ]
    except SerialFormError as why:
        raise NotCanonical(f"{why}; {SERIAL_FORM}") from None


def counts_warps(
    source: ParsedSource, kernel: Function, node: Node, walker: GroupWalker | None
) -> bool:
    """``blockDim.x / 32`` (``>> 5``, ``/ warpSize``), a never-written local set to it, or a
    number that times 32 is the block size of every launch."""
    assert kernel.body is not None
    node = strip_parens(node)
    if node.type == "identifier":
        name = source.text_of(node)
        for statement in named_statements(kernel.body):
            declared = single_init(source, statement)
            if declared is not None and declared[0] == name:
                node = strip_parens(declared[1])
                break
        written = [
            n
            for n in inside(source, kernel.body, "assignment_expression", "update_expression")
            if source.text_of(
                n.child_by_field_name("left") or n.child_by_field_name("argument") or n
            )
            == name
        ]
        if written:
            return False
    left = node.child_by_field_name("left")
    if node.type == "binary_expression" and left is not None and _is_thread_count(source, left):
        right = "".join(source.text_of(node.child_by_field_name("right") or node).split())
        return (operator_of(node), right) in (("/", "32"), (">>", "5"), ("/", "warpSize"))
    return walker is not None and walker.is_warp_count(node)


def _is_thread_count(source: ParsedSource, node: Node) -> bool:
    """``blockDim.x``."""
    return "".join(source.text_of(strip_parens(node)).split()) == "blockDim.x"


def rank_aliases(source: ParsedSource, body: Node) -> set[str]:
    """Top-level ``T name = threadIdx.x;`` declarations whose name is never written again."""
    found = set()
    for statement in named_statements(body):
        declared = single_init(source, statement)
        if declared is None or not is_builtin(source, declared[1], "threadIdx"):
            continue
        if source.text_of(strip_parens(declared[1])).replace(" ", "") != "threadIdx.x":
            continue
        written = any(
            source.text_of(t) == declared[0]
            for node in inside(source, body, "assignment_expression", "update_expression")
            if (t := node.child_by_field_name("left") or node.child_by_field_name("argument"))
        )
        if not written:
            found.add(declared[0])
    return found
