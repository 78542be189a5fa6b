"""The walk of a group-per-row kernel (:class:`GroupWalker`): its group-strided loops, group
reductions and first-thread guards, each with the edit that makes it thread per row; any
other use of the thread layout is refused with its line."""

from __future__ import annotations

from dataclasses import dataclass

from klineage.conditions import evaluate_size
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import fold_int, precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.facts import launch_names, template_bindings
from klineage.cuda.source import Function, Launch, Loop, Node, ParsedSource
from klineage.cuda.tree import (
    WARP_SIZE,
    declaration_names,
    statement_before,
    walk,
)
from klineage.mechanisms._block_unrolled import (
    UnrolledFormError,
    unrolled_loop,
)
from klineage.mechanisms._reductions_serial import (
    early_exit,
    scratch_pointers,
)
from klineage.mechanisms._reductions_util import (
    arguments_of,
    builtin_uses,
    call_name,
    fold,
    graph,
    inside,
    is_builtin,
    is_zero_literal,
    line_deletion,
    named_statements,
    strip_casts,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    SYNC_CALLS,
    UNROLLED_FORM,
    WARP_INTRINSICS,
    Group,
    NotCanonical,
    below,
    is_declared_name,
    is_lane,
    operator_of,
    single_init,
    spread_reason,
)
from klineage.mechanisms._rows_group_reductions import (
    InlineReductions,
    group_scratch_runs,
    group_serial_runs,
    rank_aliases,
    warp_reduction_of,
)
from klineage.mechanisms._rows_helpers import block_reduce_functions, layout_bound
from klineage.mechanisms._thread_row_steps import (
    StepFormError,
    walk_back,
)
from klineage.mechanisms._warp_rows_2d import (
    block_threads_2d,
    is_thread_x,
)
from klineage.mechanisms._warp_rows_cg import is_warp_query, tile_calls_left, warp_reduces


@dataclass
class GroupRows:
    """A group-per-row kernel, analysed for the rewrite to thread per row."""

    kernel: Function
    group: Group
    edits: list[Edit]
    removed: list[tuple[int, int]]
    """Byte ranges the rewrite deletes (to tell which helpers become unused)."""


class GroupWalker:
    """Recognizes the group-layout forms of one kernel and collects their thread-per-row
    rewrites; anything left tied to the layout is refused."""

    def __init__(
        self, source: ParsedSource, kernel: Function, group: Group, left_out: list[Node]
    ) -> None:
        if kernel.body is None:
            raise NotCanonical(f"{kernel.name} has no body")
        self.source = source
        self.kernel = kernel
        self.body: Node = kernel.body
        self.group = group
        self.graph = graph(source)
        self.launches = source.launches_of(kernel)
        self.edits: list[Edit] = []
        # nodes whose built-ins are accounted for; `if constexpr` branches no instantiation
        # takes are (they are emptied: their code never runs)
        self.handled: list[Node] = list(left_out)
        self.removed: list[tuple[int, int]] = [(n.start_byte, n.end_byte) for n in left_out]
        self.reduced: list[tuple[int, str]] = []  # (end of a reduction, the variable it sets)
        self.strided: list[Node] = []  # the group-strided loops
        self.inline = InlineReductions(source, kernel.body)
        self.warp_reducers = self.inline.warp_reducers
        self.block_reducers = block_reduce_functions(source)
        self.lane_is_thread_x = False  # a warp per row of a 32 x y block
        # `const int tid = threadIdx.x;`: names of the block rank (a block per row only)
        self.rank_aliases = rank_aliases(source, kernel.body) if group == "block" else set()
        self.scratch_ops: dict[str, str] = {}  # scratch of a serial reduction -> its op
        self.blocks_2d: dict[int, int] = {}  # launch start -> threads of its 32 x y block
        if not self.launches:
            raise NotCanonical(f"no launch of {kernel.name} in this file to rewrite")
        for launch in self.launches:
            self.check_launch(launch)

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    def check_launch(self, launch: Launch) -> None:
        line = self.line(launch.node)
        if launch.grid is None or launch.block is None:
            raise NotCanonical(f"the launch at line {line} has no block size")
        for part in (launch.grid, launch.block):
            threads = block_threads_2d(self.source, launch) if self.group == "warp" else None
            if part is launch.block and threads is not None and threads != WARP_SIZE:
                # a 32 x y block: checked against the row index's form by the layout
                self.blocks_2d[launch.node.start_byte] = threads
                continue
            text = self.source.text_of(part)
            if "dim3" in text or "," in text:
                raise NotCanonical(f"the launch at line {line} is not one-dimensional ({text})")
            host = self.source.enclosing_function(launch.node)
            types = self.source.local_types(host) if host is not None else {}
            if part.type == "identifier" and "dim3" in types.get(text, ""):
                raise NotCanonical(f"the launch at line {line} uses a dim3 {text}")

    def require_1d(self) -> None:
        """Refuse 32 x y blocks where the row index is not that of their warps."""
        for launch in self.launches:
            if launch.node.start_byte in self.blocks_2d:
                assert launch.block is not None
                text = self.source.text_of(launch.block)
                raise NotCanonical(
                    f"the launch at line {self.line(launch.node)} is not one-dimensional ({text})"
                )

    # -- the group size --------------------------------------------------------------------

    def names(self, launch: Launch) -> dict[str, int | str]:
        """Constants usable at a launch: the file's, the launching function's folded locals,
        and the kernel's template parameters bound to numbers."""
        names: dict[str, int | str] = dict(self.source.integer_constants)
        local = launch_names(self.source, self.source.enclosing_function(launch.node))
        for key, value in [*local.items(), *template_bindings(self.source, launch).items()]:
            folded = evaluate_size(str(value), {})
            if folded is not None:
                names[key] = folded
        return names

    def is_block_size(self, node: Node) -> bool:
        """Whether an expression equals the launch's block size at every launch."""
        if is_builtin(self.source, node, "blockDim"):
            return True
        text = " ".join(self.source.text_of(node).split())
        for launch in self.launches:
            assert launch.block is not None
            block_text = " ".join(self.source.text_of(launch.block).split())
            bindings = template_bindings(self.source, launch)
            if text == block_text:
                continue
            if text in bindings and " ".join(str(bindings[text]).split()) == block_text:
                continue
            names = self.names(launch)
            here = _fold_with(self.source, node, names)
            there = _fold_with(self.source, launch.block, names)
            if here is None or there is None or here != there:
                return False
        return True

    def is_warp_count(self, node: Node) -> bool:
        """Whether an expression times 32 is the launch's block size at every launch."""
        for launch in self.launches:
            assert launch.block is not None
            names = self.names(launch)
            here = _fold_with(self.source, node, names)
            there = _fold_with(self.source, launch.block, names)
            if here is None or there is None or here * 32 != there:
                return False
        return True

    # -- reductions ------------------------------------------------------------------------

    def reductions(self, reducers: set[str]) -> None:
        """Calls to group-reduction helpers become the identity."""
        for node in inside(self.source, self.body, "call_expression"):
            if call_name(self.source, node) not in reducers:
                continue
            args = arguments_of(node)
            if args:
                self.identity(node, args[0])

    def tile_reductions(self) -> None:
        """``cg::reduce(warp, v, op)`` over a 32-thread tile becomes the identity."""
        for reduce in warp_reduces(self.source, self.kernel):
            self.identity(reduce.node, reduce.value)

    def identity(self, node: Node, value: Node) -> None:
        """A reduction call of ``value`` becomes ``value``: one thread's partial is the row's
        (``v = reduce(v)`` goes)."""
        statement = node.parent.parent if node.parent is not None else None
        assignment = node.parent
        name = self.source.text_of(value)
        if (
            assignment is not None
            and assignment.type == "assignment_expression"
            and operator_of(assignment) == "="
            and statement is not None
            and statement.type == "expression_statement"
            and self.source.text_of(assignment.child_by_field_name("left") or node) == name
        ):
            self.delete(statement)
            self.reduced.append((statement.end_byte, name))
            return
        self.edits.append(Edit.replace(node, wrap_at(node, name, precedence(value))))
        self.handled.append(node)
        self.removed.append((node.start_byte, node.end_byte))
        # `v = reduce(v) / n`: the statement that combines v also sets it, target included
        around = node.parent
        while around is not None and around.type not in ("expression_statement", "declaration"):
            around = around.parent
        target = around.named_children[0] if around is not None and around.named_children else None
        if (
            target is not None
            and target.type == "assignment_expression"
            and operator_of(target) == "="
            and self.source.text_of(target.child_by_field_name("left") or node) == name
        ):
            self.reduced.append((target.start_byte, name))

    def delete(self, statement: Node) -> None:
        edit = line_deletion(self.source, statement)
        self.edits.append(edit)
        self.handled.append(statement)
        self.removed.append((statement.start_byte, statement.end_byte))

    def scratch_reductions(self) -> None:
        """Block reductions through per-warp scratch written value by value
        (:mod:`klineage.mechanisms._reductions_scratch`): the first warp reduction becomes
        its value, the publishes, barrier and reloads go, the second reduction becomes the
        published variable."""
        reduction = warp_reduction_of(self.source, self.kernel, self.warp_reducers)
        for run in group_scratch_runs(self.source, self.kernel, self.inline):
            nodes = [*run.first.values(), *run.deleted, *(call for call, _ in run.second)]
            if any(a < n.end_byte and n.start_byte < b for n in nodes for a, b in self.removed):
                continue  # another form's rewrite took these statements already
            for call in run.first.values():
                value = reduction(call)
                assert value is not None
                self.identity(call, value)
                self.reduced.append((call.end_byte, self.source.text_of(value)))
            for statement in run.deleted:
                self.delete(statement)
            for call, variable in run.second:
                self.edits.append(Edit.replace(call, variable))
                self.handled.append(call)
                self.removed.append((call.start_byte, call.end_byte))
                self.reduced.append((call.end_byte, variable))

    def serial_reductions(self) -> None:
        """Warp reduce / publish / barrier / thread-0 serial loop / barrier / broadcast runs
        (:mod:`klineage.mechanisms._reductions_serial`): the warp reduction and the run go,
        and the broadcast reads the thread's partial."""
        for run in group_serial_runs(self.source, self.kernel, self):
            self.scratch_ops[run.scratch] = run.op
            self.delete(run.warp_step)
            self.reduced.append((run.warp_step.end_byte, run.variable))
            for statement in run.deleted:
                self.delete(statement)
            self.edits.append(Edit.replace(run.broadcast, run.variable))
            self.handled.append(run.broadcast)
            self.removed.append((run.broadcast.start_byte, run.broadcast.end_byte))

    def early_exits(self) -> None:
        """``if (rank >= n) { publish identities; return; }`` goes: a thread per row walks
        all ``n`` elements. Its ``n`` must bound every block-strided loop, or the block
        skipped elements the thread would not."""
        for statement in named_statements(self.body):
            bound = early_exit(self.source, statement, self.scratch_ops, self.is_block_rank)
            if bound is None:
                continue
            text = " ".join(self.source.text_of(bound).split())
            for loop in self.strided:
                found = self.source.loop_at(loop)
                condition = strip_parens(found.condition) if found and found.condition else None
                right = condition.child_by_field_name("right") if condition else None
                if right is None or " ".join(self.source.text_of(right).split()) != text:
                    raise NotCanonical(
                        f"the early exit at line {self.line(statement)} bounds the rank by "
                        f"{text}, but the loop at line {self.line(loop)} runs to another bound"
                    )
            self.delete(statement)

    def is_block_rank(self, node: Node) -> bool:
        """``threadIdx.x`` or a name for it."""
        return self.is_rank(node, None)

    def scratch_pointers(self) -> None:
        """Pointers into shared scratch (``float* s = &shared[k]``) that only deleted
        reductions read go; one read elsewhere is refused."""
        shared = self.inline.shared
        for name, statement in scratch_pointers(self.source, self.body, shared).items():
            for node in inside(self.source, self.body, "identifier"):
                if self.source.text_of(node) != name or within(node, statement):
                    continue
                if not self._removed(node):
                    raise NotCanonical(
                        f"the block shares {name} (shared memory) beyond a reduction "
                        f"(line {self.line(node)})"
                    )
            self.delete(statement)

    def unused_rank_declarations(self) -> None:
        """Declarations of thread ranks (``warp_id = threadIdx.x / 32``) and of cooperative
        groups (``cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);``) that
        only deleted code read go too, the groups' namespace alias with the last of them."""
        groups = analysis(self.source).cooperative_groups
        declared = {  # a tile's `T<32> warp = ...;` parses as an expression statement
            group.declaration.start_byte: name
            for (function, name), group in groups.groups.items()
            if function == self.kernel.name
        }
        deleted = True
        while deleted:  # the warp's declaration reads the block: the block goes after it
            deleted = False
            for statement in named_statements(self.body):
                if any(within(statement, h) or within(h, statement) for h in self.handled):
                    continue
                group_names = [
                    name
                    for start, name in declared.items()
                    if statement.start_byte <= start < statement.end_byte
                ]
                group = bool(group_names)
                if statement.type == "declaration":
                    names = declaration_names(self.source, statement) + group_names
                elif group:
                    names = group_names
                else:
                    continue
                if not group and not builtin_uses(self.source, statement):
                    continue
                reads = [
                    node
                    for node in inside(self.source, self.body, "identifier")
                    if self.source.text_of(node) in names and not within(node, statement)
                ]
                if (reads or group) and all(self._removed(n) for n in reads):
                    self.delete(statement)
                    deleted = True
        self._unused_namespace_alias()

    def _removed(self, node: Node) -> bool:
        """Whether a deletion made already covers ``node``."""
        return any(a <= node.start_byte and node.end_byte <= b for a, b in self.removed)

    def _unused_namespace_alias(self) -> None:
        """``namespace cg = cooperative_groups;`` once nothing left in the body names cg."""
        for statement in named_statements(self.body):
            if statement.type != "namespace_alias_definition":
                continue
            name = statement.child_by_field_name("name")
            alias = self.source.text_of(name) if name is not None else None
            used = [
                node
                for node in walk(self.body)
                if node.type == "namespace_identifier"
                and self.source.text_of(node) == alias
                and not within(node, statement)
                and not self._removed(node)
            ]
            if alias is not None and not used:
                self.delete(statement)

    def inline_reductions(self) -> None:
        """``v = warp(v); ... publish ...; __syncthreads(); ... reload ...; v = warp(v);`` ->
        nothing."""
        for block in inside(self.source, self.body, "compound_statement"):
            statements = named_statements(block)
            index = 0
            while index < len(statements):
                end = self.inline.run_end(statements, index)
                if end is None:
                    index += 1
                    continue
                for statement in statements[index : end + 1]:
                    self.delete(statement)
                variable = self.inline.warp_step(statements[index])
                self.reduced.append((statements[end].end_byte, variable or ""))
                index = end + 1

    # -- loops, guards, shared memory ------------------------------------------------------

    def strided_loops(self, lane_name: str | None) -> None:
        """``for (T c = rank; c < n; c += size)`` -> ``for (T c = 0; c < n; ++c)``, the rank
        being ``threadIdx.x`` (block) or the lane (warp: ``threadIdx.x & 31`` or its
        variable)."""
        for loop in self.source.loops:
            if not within(loop.node, self.body) or loop.kind != "for" or loop.variable is None:
                continue
            if loop.initializer is None or loop.update is None:
                continue
            declared = single_init(self.source, loop.initializer)
            if declared is None or not below(self.source, loop.condition, loop.variable):
                continue
            if self.is_rank(declared[1], lane_name):
                if self.stride(loop.update, loop.variable) is None:
                    self.unrolled_loop(loop, declared[1])
                    continue
                update = f"++{loop.variable}"
            else:
                # packed: ``c = rank * u`` by ``size * u`` walks the row u elements at a time
                unit = self.packed_rank(declared[1], lane_name)
                if unit is None or not self.packed_stride(loop.update, loop.variable, unit):
                    continue
                update = f"{loop.variable} += {unit}"
            self.edits.append(Edit.replace(declared[1], "0"))
            self.edits.append(Edit.replace(loop.update, update))
            self.handled += [declared[1], loop.update]
            # the group's rank and size these read are gone with them
            self.removed += [(n.start_byte, n.end_byte) for n in (declared[1], loop.update)]
            self.strided.append(loop.node)

    def split_strided_loops(self, lane_name: str | None) -> None:
        """The same walk with its start declared before the loop, ``T c = rank * u; for (;
        c < n; c += size * u)`` (or ``rank``, ``size``), and a walk back down from where it
        stopped, ``c -= size * u; for (; c >= 0; c -= size * u)`` (llm.c fused_residual k4):
        each thread walks the whole row, ``u`` elements at a time, up and then down."""
        for loop in self.source.loops:
            if not within(loop.node, self.body) or loop.kind != "for" or loop.initializer:
                continue
            condition = strip_parens(loop.condition) if loop.condition is not None else None
            left = condition.child_by_field_name("left") if condition is not None else None
            if left is None or not below(self.source, condition, self.source.text_of(left)):
                continue
            name = self.source.text_of(left)
            start = statement_before(loop.node)
            declared = single_init(self.source, start) if start is not None else None
            if declared is None or declared[0] != name or loop.update is None:
                continue
            unit = (
                None
                if self.is_rank(declared[1], lane_name)
                else (self.packed_rank(declared[1], lane_name))
            )
            if unit is None and not self.is_rank(declared[1], lane_name):
                continue
            if unit is None:
                if self.stride(loop.update, name) is None:
                    continue
                step = "1"
            elif self.packed_stride(loop.update, name, unit):
                step = unit
            else:
                continue
            self.edits += [
                Edit.replace(declared[1], "0"),
                Edit.replace(loop.update, f"{name} += {step}"),
            ]
            self.handled += [declared[1], loop.update]
            self.removed += [(n.start_byte, n.end_byte) for n in (declared[1], loop.update)]
            self.strided.append(loop.node)
            self._walk_back(loop.node, name, unit, step)

    def _walk_back(self, up: Node, name: str, unit: str | None, step: str) -> None:
        """After the loop ``up``, where the walk's variable stopped differs between a lane
        and a thread: the only later use allowed is ``c -= size * u; for (; c >= 0; c -=
        size * u)``, each then by ``u``; any other use is refused."""
        try:
            found = walk_back(
                self.source,
                up,
                name,
                lambda move: move is not None and self._steps_down(move, name, unit),
                "size * u",
            )
        except StepFormError as why:
            raise NotCanonical(str(why)) from None
        if found is None:
            return
        move, back = found
        moves = [move, back.child_by_field_name("update")]
        for move in moves:
            assert move is not None
            self.edits.append(Edit.replace(move, f"{name} -= {step}"))
            self.handled.append(move)
        self.strided.append(back)

    def _steps_down(self, node: Node, name: str, unit: str | None) -> bool:
        """``name -= size * unit`` (or ``name -= size``)."""
        if unit is None:
            return self.stride(node, name, "-=") is not None
        return self.packed_stride(node, name, unit, "-=")

    def block_strided_left(self) -> None:
        """A loop that starts at the thread's rank and steps by the block, in none of the
        forms the rewrite maps (a start off the rank, a step that is not a multiple of the
        block size), is refused with its form."""
        indices = analysis(self.source).indices(self.kernel)
        for variable in indices.loops:
            if variable.loop in self.strided or not within(variable.loop, self.body):
                continue
            step = variable.step
            if step is None or not step.coefficient("blockDim.x").terms:
                continue
            if "threadIdx.x" not in indices.thread_atoms(variable.init):
                continue
            raise NotCanonical(
                f"the loop at line {self.line(variable.loop)} starts at {variable.init} and steps "
                f"by {step}: this rule needs a loop that starts at the thread's rank (threadIdx.x) "
                "and steps by a multiple of the block size"
            )

    def unrolled_loop(self, loop: Loop, start: Node) -> None:
        """``for (i = rank; i < n; i += B * U)`` with ``i + u * B`` inside -> ``for (i = 0; i
        < n; i += U)`` with ``i + u`` (:mod:`klineage.mechanisms._block_unrolled`)."""
        indices = analysis(self.source).indices(self.kernel)
        try:
            if self.group == "block":
                found = unrolled_loop(self.source, loop, start, indices, self.is_block_size)
            else:  # the caller checked the start is the lane, which the analysis cannot name
                found = unrolled_loop(self.source, loop, start, indices, self.is_warp_size, None)
        except UnrolledFormError as why:
            raise NotCanonical(f"{why}; {UNROLLED_FORM}") from None
        if found is None:
            return
        variable = loop.variable
        self.edits.append(Edit.replace(found.start, "0"))
        self.edits.append(Edit.replace(found.update, f"{variable} += {found.factor}"))
        for offset, slot in found.slots:
            self.edits.append(Edit.replace(offset, slot))
            self.handled.append(offset)
        self.handled += [found.start, found.update]
        self.removed.append((found.start.start_byte, found.start.end_byte))
        self.strided.append(loop.node)

    def is_rank_alias(self, node: Node) -> bool:
        """A name the kernel gives ``threadIdx.x`` (``const int tid = threadIdx.x;``)."""
        node = strip_parens(node)
        return node.type == "identifier" and self.source.text_of(node) in self.rank_aliases

    def packed_rank(self, node: Node, lane_name: str | None) -> str | None:
        """``u`` of ``rank * u`` (or ``u * rank``), ``u`` a positive integer constant."""
        node = strip_parens(strip_casts(node))
        if node.type != "binary_expression" or operator_of(node) != "*":
            return None
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        for rank, unit in ((left, right), (right, left)):
            if rank is None or unit is None or not self.is_rank(rank, lane_name):
                continue
            value = fold(self.source, unit)
            if value is None:  # a member constant (`x128::size`) the analysis knows
                value = analysis(self.source).indices(self.kernel).form(unit).value
            if value is not None and value > 0:
                return self.source.text_of(unit)
        return None

    def packed_stride(self, update: Node, variable: str, unit: str, op: str = "+=") -> bool:
        """``c += size * u`` (either order; ``op`` ``-=`` for a walk down), ``size`` the
        group's stride."""
        update = strip_parens(update)
        if update.type != "assignment_expression" or operator_of(update) != op:
            return False
        left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return False
        right = strip_parens(right)
        if right.type != "binary_expression" or operator_of(right) != "*":
            return False
        a, b = right.child_by_field_name("left"), right.child_by_field_name("right")
        for size, factor in ((a, b), (b, a)):
            if size is None or factor is None or self.source.text_of(factor) != unit:
                continue
            if self.group == "block" and self.is_block_size(size):
                return True
            if self.group == "warp" and self.is_warp_size(size):
                return True
        return False

    def stride(self, update: Node, variable: str, op: str = "+=") -> Node | None:
        update = strip_parens(update)
        if update.type != "assignment_expression" or operator_of(update) != op:
            return None
        left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
        if left is None or right is None or self.source.text_of(left) != variable:
            return None
        if self.group == "block":
            return right if self.is_block_size(right) else None
        return right if self.is_warp_size(right) else None

    def is_warp_size(self, node: Node) -> bool:
        """32, ``warpSize``, a 32-thread tile's ``size()``, or ``blockDim.x`` where the lane
        is ``threadIdx.x`` (a 32 x y block)."""
        text = "".join(self.source.text_of(strip_parens(node)).split())
        return (
            text in ("32", "warpSize")
            or (self.lane_is_thread_x and text == "blockDim.x")
            or is_warp_query(self.source, node, "group_size")
            or (  # a local constant (`constexpr int WarpSize = 32;`)
                strip_parens(node).type == "identifier"
                and analysis(self.source).indices(self.kernel).form(node).value == 32
            )
        )

    def is_rank(self, node: Node, lane_name: str | None) -> bool:
        if self.group == "block":
            return is_builtin(self.source, node, "threadIdx") or self.is_rank_alias(node)
        node = strip_casts(node)
        if self.lane_is_thread_x and is_thread_x(self.source, node):
            return True
        if is_warp_query(self.source, node, "lane"):
            return True
        return is_lane(self.source, node) or (
            lane_name is not None and self.source.text_of(node) == lane_name
        )

    def guards(self, lane_name: str | None) -> None:
        """``if (first) S`` -> ``S``, for the group's first thread."""
        for node in inside(self.source, self.body, "if_statement"):
            if node.child_by_field_name("alternative") is not None:
                continue
            condition = node.child_by_field_name("condition")
            consequence = node.child_by_field_name("consequence")
            value = condition.child_by_field_name("value") if condition is not None else None
            if value is None or consequence is None or any(within(node, h) for h in self.handled):
                continue
            if self.is_first(value, lane_name):
                self.edits.append(Edit(node.start_byte, consequence.start_byte, ""))
                self.handled.append(value)
                self.removed.append((value.start_byte, value.end_byte))
                continue
            # `if (first && other) S` -> `if (other) S`
            both = strip_parens(value)
            if both.type != "binary_expression" or operator_of(both) != "&&":
                continue
            first, other = both.child_by_field_name("left"), both.child_by_field_name("right")
            if first is None or other is None or not self.is_first(first, lane_name):
                continue
            self.edits.append(Edit(first.start_byte, other.start_byte, ""))
            self.handled.append(first)
            self.removed.append((first.start_byte, first.end_byte))

    def is_first(self, node: Node, lane_name: str | None) -> bool:
        node = strip_parens(node)
        if node.type != "binary_expression" or operator_of(node) != "==":
            return False
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None or not is_zero_literal(self.source, right):
            return False
        if self.group == "block":
            return is_builtin(self.source, left, "threadIdx") or self.is_rank_alias(left)
        left = strip_parens(left)
        if self.lane_is_thread_x and is_thread_x(self.source, left):
            return True
        if is_warp_query(self.source, left, "lane"):
            return True
        return is_lane(self.source, left) or (
            lane_name is not None and self.source.text_of(left) == lane_name
        )

    def unused_shared(self) -> None:
        """``__shared__`` arrays only the deleted reductions used are deleted too."""
        for declaration in self.source.shared_declarations:
            if not within(declaration.node, self.body):
                continue
            names = set(declaration.names)
            for node in inside(self.source, self.body, "identifier"):
                if self.source.text_of(node) not in names or within(node, declaration.node):
                    continue
                if not self._removed(node):
                    raise NotCanonical(
                        f"the block shares {self.source.text_of(node)} in shared memory beyond "
                        f"a reduction (line {self.line(node)})"
                    )
            self.delete(declaration.node)

    def partials(self) -> None:
        """A value a group-strided loop accumulates is one thread's part of the row until a
        group reduction combines it: read before that, it would mean the whole row once the
        loop is a full loop, so such a read is refused."""
        for loop in self.strided:
            body = loop.child_by_field_name("body")
            if body is None:
                continue
            local = {
                name
                for node in inside(self.source, body, "declaration")
                for name in declaration_names(self.source, node)
            }
            written = set()
            for node in inside(self.source, body, "assignment_expression", "update_expression"):
                target = node.child_by_field_name("left") or node.child_by_field_name("argument")
                root = _lvalue_root(self.source, target) if target is not None else None
                if root is not None and root not in local:
                    written.add(root)
            for name in sorted(written):
                self.partial_reads(loop, name)

    def partial_reads(self, loop: Node, name: str) -> None:
        combined = min(
            (end for end, variable in self.reduced if variable == name and end > loop.end_byte),
            default=None,
        )
        for node in inside(self.source, self.body, "identifier"):
            if self.source.text_of(node) != name or node.start_byte < loop.end_byte:
                continue
            if combined is not None and node.start_byte >= combined:
                break
            if self._removed(node):
                continue
            if any(within(node, other) for other in self.strided):
                continue
            raise NotCanonical(
                f"{name}, accumulated by the {self.group}-strided loop at line {self.line(loop)}, "
                f"is read at line {self.line(node)} before a {self.group} reduction combines it"
            )

    def leftovers(self) -> None:
        """Refuse what is still tied to the thread layout."""
        for node in inside(self.source, self.body, "identifier"):
            if not self.is_rank_alias(node) or is_declared_name(node):
                continue
            if any(within(node, h) for h in self.handled) or self._removed(node):
                continue
            raise NotCanonical(spread_reason(self.source.text_of(node), self.line(node)))
        for use in builtin_uses(self.source, self.body):
            if any(within(use, h) for h in self.handled):
                continue
            raise NotCanonical(spread_reason(self.source.text_of(use), self.line(use)))
        _, barriers = analysis(self.source).cooperative_groups.in_function(self.kernel)
        for barrier in barriers:  # `block.sync()`: a barrier, whatever its spelling
            if not any(within(barrier.node, h) for h in self.handled):
                text = self.source.text_of(barrier.node)
                raise NotCanonical(
                    f"{text} at line {self.line(barrier.node)} is not part of a reduction"
                )
        for call in tile_calls_left(self.source, self.kernel):
            if any(within(call, h) for h in self.handled):
                continue
            raise NotCanonical(spread_reason(self.source.text_of(call), self.line(call)))
        for node in inside(self.source, self.body, "call_expression"):
            if any(within(node, h) for h in self.handled):
                continue
            name = call_name(self.source, node)
            if name in SYNC_CALLS or name in WARP_INTRINSICS:
                raise NotCanonical(f"{name} at line {self.line(node)} is not part of a reduction")
            for function in self.graph.functions(name or ""):
                why = layout_bound(self.source, function)
                if why is None:
                    reached = [
                        g
                        for n in self.graph.reachable(function.name)
                        for g in self.graph.functions(n)
                    ]
                    why = next((w for g in reached if (w := layout_bound(self.source, g))), None)
                if why is not None:
                    raise NotCanonical(f"{name} at line {self.line(node)} {why}")


def _lvalue_root(source: ParsedSource, node: Node) -> str | None:
    """``acc.m`` -> ``acc``; ``v`` -> ``v``; memory stores (``p[i]``) -> None."""
    node = strip_parens(node)
    while node.type == "field_expression":
        operator = node.child_by_field_name("operator")
        inner = node.child_by_field_name("argument")
        if inner is None or operator is None or operator.type != ".":
            return None
        node = strip_parens(inner)
    return source.text_of(node) if node.type == "identifier" else None


def _fold_with(source: ParsedSource, node: Node, names: dict[str, int | str]) -> int | None:
    return fold_int(source, node, names)
