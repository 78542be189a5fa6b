"""The walk of a thread-per-row kernel's body: which loops walk the row, what each reduces or
stores, and why a statement keeps the kernel from being spread over a group."""

from __future__ import annotations

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import fold_int
from klineage.cuda.source import Function, Loop, Node, ParsedSource
from klineage.cuda.tree import (
    FMA_CALLS,
    assigned_names,
    declaration_names,
)
from klineage.mechanisms._block_unrolled import (
    STORE_INTRINSICS,
    UnrolledFormError,
    UnrolledLoop,
    clamped_element,
    thread_unrolled_loop,
)
from klineage.mechanisms._online_pair_form import FoldFormError, block_folds, fold_blocks
from klineage.mechanisms._reductions_util import (
    arguments_of,
    call_name,
    inside,
    is_zero_literal,
    named_statements,
    plain_type,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    MAX_FUNCS,
    SUM_OPS,
    THREAD_UNROLLED_FORM,
    Group,
    NotCanonical,
    Op,
    RowLoop,
    below,
    below_name,
    operator_of,
    single_init,
)
from klineage.mechanisms._thread_row_steps import (
    StepFormError,
    constant_value,
    packed_deref,
    packed_step,
    pointer_offset,
    split_start,
    steps_down,
    sum_terms,
    vector_access,
    walk_back,
)
from klineage.mechanisms._tiles_util import Locals


class ThreadWalker:
    """Walks a thread-per-row kernel's statements after the bound check."""

    def __init__(
        self, source: ParsedSource, kernel: Function, group: Group, *, inclusive: bool = False
    ) -> None:
        self.source = source
        self.kernel = kernel
        self.group = group
        self.inclusive = inclusive
        """Whether row loops may also run while ``c <= n``."""
        self.loops: list[RowLoop] = []
        self.stores: list[Node] = []
        self.store_targets: list[tuple[str, str, Node]] = []  # (base, index, node)
        self.loads: list[tuple[str, str, Node, bool]] = []  # (base, index, node, in loop)
        self.types = source.local_types(kernel)
        # locals of a loop body pointing into the loop's element (float* e = (float*)&o[c])
        self.element_pointers: set[str] = set()
        # loops that walk a split loop's row back: their start -> (variable, `c -= s`, V)
        self.walks_back: dict[int, tuple[str, Node, Node | None]] = {}
        # the blocks of the loop being walked that fold its running pairs, and why blocks
        # that fold several values are no pair (said where a statement is refused)
        self.pair_blocks: list[Node] = []
        self.fold_refusals: list[tuple[Node, str]] = []

    def line(self, node: Node) -> int:
        return self.source.line_of(node.start_byte)

    # -- scalar code ------------------------------------------------------------------------

    def statement(self, node: Node) -> None:
        kind = node.type
        if kind in ("comment",) or kind.startswith("preproc"):
            return
        if kind == "compound_statement":
            for child in named_statements(node):
                self.statement(child)
        elif kind == "declaration":
            self.reads(node, in_loop=False)
        elif kind == "expression_statement":
            self.scalar_expression(node)
        elif kind == "if_statement":
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=False)
            for branch in ("consequence", "alternative"):
                child = node.child_by_field_name(branch)
                if child is not None:
                    self.statement(
                        child.named_children[0] if child.type == "else_clause" else child
                    )
        elif kind == "return_statement":
            if node.named_children:
                raise NotCanonical(f"a kernel returns no value (line {self.line(node)})")
        elif kind == "for_statement":
            self.loop(node)
        else:
            raise NotCanonical(f"a {kind.replace('_', ' ')} at line {self.line(node)}")

    def scalar_expression(self, node: Node) -> None:
        if not node.named_children:
            return
        expression = node.named_children[0]
        if expression.type == "assignment_expression":
            left = expression.child_by_field_name("left")
            right = expression.child_by_field_name("right")
            assert left is not None and right is not None
            if left.type == "identifier":
                self.reads(right, in_loop=False)
                return
            self.store(node, left, loop=None)
            self.reads(right, in_loop=False)
            return
        if expression.type == "update_expression":
            argument = expression.child_by_field_name("argument")
            if argument is not None and argument.type == "identifier":
                return
        stored = _intrinsic_store(self.source, expression)
        if stored is not None:  # __stcs(mean + row, m): a store through a cache hint
            self.store(node, stored[0], loop=None)
            self.reads(stored[1], in_loop=False)
            return
        raise NotCanonical(
            f"the statement at line {self.line(node)} is not an assignment, so every thread "
            "of a group would repeat its effect"
        )

    def store(
        self, statement: Node, target: Node, loop: RowLoop | None, width: int | None = 1
    ) -> None:
        """Record a store to ``target`` (``width`` elements from it, None when unknown)."""
        base, index = self._address(target)
        if loop is None:
            parent = statement.parent
            if parent is not None and parent.type == "if_statement":
                if parent.child_by_field_name("alternative") is not None:
                    raise NotCanonical(
                        f"the store at line {self.line(statement)} is a branch of an if/else; "
                        "brace it first"
                    )
            elif parent is None or parent.type != "compound_statement":
                raise NotCanonical(f"the store at line {self.line(statement)} is not in a block")
            self.stores.append(statement)
        elif (
            not self._offset_by(target, loop.variable, width)
            and not self._element_store(target)
            and not self._clamped_store(target, loop)
        ):
            raise NotCanonical(
                f"the store at line {self.line(statement)} is not p[... + {loop.variable}], so two "
                "threads of a group could write one element"
            )
        self.store_targets.append((base, index, target))

    def _offset_by(self, target: Node, variable: str, width: int | None) -> bool:
        """Whether a store ``p[index]`` (``width`` elements wide) has ``index = variable``,
        ``... + variable + ...`` or ``... + variable * K + ...`` (``K`` a compile-time
        integer no smaller than the width) with the variable nowhere else: each iteration
        then writes elements of its own."""
        source = self.source
        target = strip_parens(target)
        packed = packed_deref(source, target)
        if packed is not None:  # *reinterpret_cast<float4*>(p + index)
            target, width = packed.address, packed.elements
        indices = (
            target.child_by_field_name("indices") if target.type == "subscript_expression" else None
        )
        offset = pointer_offset(source, target) if indices is None else None
        if offset is not None:
            terms = list(offset.terms)  # already the sum's terms
        elif indices is None or len(indices.named_children) != 1:
            return False
        else:
            terms = sum_terms(indices.named_children[0])
        found = 0
        for term in terms:
            if (term.type == "identifier" and source.text_of(term) == variable) or (
                self._scaled(term, variable, width)
            ):
                found += 1
            elif any(source.text_of(n) == variable for n in inside(source, term, "identifier")):
                return False
        return found == 1

    def _scaled(self, term: Node, variable: str, width: int | None) -> bool:
        """``variable * K`` (either order) with ``K`` a compile-time integer at least
        ``width``: iterations ``K`` apart, none overlapping another's elements."""
        if term.type != "binary_expression" or operator_of(term) != "*" or width is None:
            return False
        left, right = term.child_by_field_name("left"), term.child_by_field_name("right")
        for name, scale in ((left, right), (right, left)):
            if name is None or scale is None:
                continue
            name = strip_parens(name)
            if name.type != "identifier" or self.source.text_of(name) != variable:
                continue
            value = constant_value(self.source, self.kernel, scale)
            return value is not None and value >= max(width, 1)
        return False

    def _clamped_store(self, target: Node, loop: RowLoop) -> bool:
        """``p[min(n - 1, i + u)]`` in an unrolled loop (its guard makes the clamp a no-op)."""
        target = strip_parens(target)
        indices = target.child_by_field_name("indices")
        if loop.unrolled is None or target.type != "subscript_expression" or indices is None:
            return False
        return len(indices.named_children) == 1 and clamped_element(
            self.source, indices.named_children[0], loop.unrolled
        )

    def _points_into_element(self, declaration: Node, variable: str) -> bool:
        """``T* e = (T*)&out[c];``: the address of the loop's element, nothing else."""
        addresses = [
            n
            for n in inside(self.source, declaration, "pointer_expression")
            if self.source.text_of(n).startswith("&")
        ]
        for address in addresses:
            argument = strip_parens(address.child_by_field_name("argument") or address)
            if argument.type == "subscript_expression" and self._offset_by(
                argument, variable, None
            ):
                return len(addresses) == 1
        return False

    def _element_store(self, target: Node) -> bool:
        """``e[2] = v`` through a pointer into this thread's element: a constant index."""
        target = strip_parens(target)
        base = target.child_by_field_name("argument")
        indices = target.child_by_field_name("indices")
        if target.type != "subscript_expression" or base is None or indices is None:
            return False
        return (
            self.source.text_of(base) in self.element_pointers
            and bool(indices.named_children)
            and fold_int(self.source, indices.named_children[0]) is not None
        )

    def _address(self, target: Node) -> tuple[str, str]:
        target = strip_parens(target)
        packed = packed_deref(self.source, target)
        if packed is not None:  # *reinterpret_cast<float4*>(p + c): p[c] a vector wide
            return packed.pointer, packed.offset.text(self.source)
        if target.type == "subscript_expression":
            base = target.child_by_field_name("argument")
            indices = target.child_by_field_name("indices")
            if base is not None and base.type == "identifier" and indices is not None:
                return self.source.text_of(base), " ".join(self.source.text_of(indices).split())
        if target.type == "pointer_expression":
            return "*", " ".join(self.source.text_of(target).split())
        offset = pointer_offset(self.source, target)
        if offset is not None:
            return offset.pointer, offset.text(self.source)
        raise NotCanonical(
            f"the store to {self.source.text_of(target)} (line {self.line(target)}) is not p[index]"
        )

    def reads(self, node: Node, in_loop: bool) -> None:
        for call in inside(self.source, node, "call_expression"):
            access = vector_access(self.source, call)
            if access is not None and access.kind == "load":  # load128(x + c): a packed load
                index = access.offset.text(self.source)
                self.loads.append((access.pointer, index, call, in_loop))
                continue
            arguments = arguments_of(call)
            if call_name(self.source, call) in _LOAD_INTRINSICS and len(arguments) == 1:
                offset = pointer_offset(self.source, strip_parens(arguments[0]))
                if offset is not None:  # __ldcs(x + c): a load through a cache hint
                    self.loads.append((offset.pointer, offset.text(self.source), call, in_loop))
        for read in inside(self.source, node, "subscript_expression", "pointer_expression"):
            if read.type == "pointer_expression" and not self.source.text_of(read).startswith("*"):
                continue
            try:
                base, index = self._address(read)
            except NotCanonical:
                continue
            self.loads.append((base, index, read, in_loop))

    # -- loops ------------------------------------------------------------------------------

    def loop(self, node: Node) -> None:
        found = self.source.loop_at(node)
        if found is not None and found.initializer is None and node.start_byte in self.walks_back:
            variable, move, _ = self.walks_back[node.start_byte]
            self.row_loop(node, found, variable, move, down=True)
            return
        start = self.split_start(node, found) if found is not None else None
        if found is None or (found.variable is None and start is None):
            raise NotCanonical(f"the loop at line {self.line(node)} is not for (T c = 0; ...)")
        if start is None:
            assert found.initializer is not None
            declared = single_init(self.source, found.initializer)
            start = declared[1] if declared is not None else None
        variable = found.variable or self.source.text_of(below_name(found.condition))
        if start is None:
            raise NotCanonical(f"the loop at line {self.line(node)} does not start at 0")
        if not is_zero_literal(self.source, start):
            self.offset_start(node, found, variable, start)
        if not below(self.source, found.condition, variable, self.inclusive):
            bounds = f"{variable} < n" + (f" or {variable} <= n" if self.inclusive else "")
            raise NotCanonical(f"the loop at line {self.line(node)} does not run while {bounds}")
        self.row_loop(node, found, variable, start)

    def offset_start(self, node: Node, found: Loop, variable: str, start: Node) -> None:
        """A row loop from ``s`` by 1 (``for (T c = s; c < n; ++c)``, the tail after a packed
        loop, say) spreads over a group as ``c = s + rank``: ``s`` must be the same for every
        thread of the group, so it may read no name the kernel writes after declaring it
        (an accumulator holds a thread's part only)."""
        line = self.line(node)
        if found.initializer is None or not unit_step(self.source, found.update, variable):
            raise NotCanonical(
                f"the loop at line {line} starts at {self.source.text_of(start)} and does not "
                "step by 1; a row loop starts at 0, or at a start the row fixes with a step of 1"
            )
        assert self.kernel.body is not None
        written = assigned_names(self.source, self.kernel.body)
        if Locals(self.source, self.kernel).depends_on(start, written):
            raise NotCanonical(
                f"the loop at line {line} starts at {self.source.text_of(start)}, which reads a "
                "name the kernel writes, so a group's threads may not agree on it"
            )

    def split_start(self, node: Node, found: Loop) -> Node | None:
        """The start of ``T c = 0; for (; c < n; ...)``, declared right before the loop."""
        if found.initializer is not None or found.condition is None:
            return None
        name = below_name(found.condition)
        return split_start(self.source, node, self.source.text_of(name)) if name else None

    def row_loop(
        self, node: Node, found: Loop, variable: str, start: Node, down: bool = False
    ) -> None:
        unrolled, unit = None, None
        if down:
            unit = self.walks_back[node.start_byte][2]
            if unit is not None:  # its packed accesses move as many elements as its step
                self.packed_step(found, variable, "-=")
        elif not unit_step(self.source, found.update, variable):
            unit = self.packed_step(found, variable, "+=")
            if unit is None and found.variable is None:
                raise NotCanonical(
                    f"the loop at line {self.line(node)} declares {variable} before it and steps "
                    "by neither 1 nor a packed vector (a constant V, with the loop's every use "
                    f"of {variable} the address of a packed load or store of V elements)"
                )
            if unit is None:
                unrolled = self.unrolled(found, start)
        if node.parent is None or node.parent.type != "compound_statement":
            raise NotCanonical(f"the loop at line {self.line(node)} is not directly in a block")
        if found.initializer is None and not down:
            if self.group == "block":  # the block's removal reads no split walk back
                raise NotCanonical(
                    f"the loop at line {self.line(node)} declares {variable} before it; this "
                    f"rule writes that form back for a warp per row only (for (T {variable} = "
                    "0; ...) for a block)"
                )
            step = self.source.text_of(unit) if unit is not None else "1"
            try:
                back = walk_back(
                    self.source,
                    node,
                    variable,
                    lambda m: steps_down(self.source, m, variable, step),
                    step,
                )
            except StepFormError as why:
                raise NotCanonical(str(why)) from None
            if back is not None:
                self.walks_back[back[1].start_byte] = (variable, back[0], unit)
        assert found.update is not None and found.body is not None
        loop = RowLoop(node, variable, start, found.update, unrolled=unrolled, unit=unit, down=down)
        local: set[str] = {variable}
        self_reads: set[tuple[int, int]] = set()
        self.fold_refusals = []
        self.pair_blocks = self.online_pairs(loop, found.body)
        self.loop_body(found.body, loop, local, self_reads)
        self.check_accumulators(loop, self_reads)
        for fold in loop.pairs:
            self.check_starts_at_zero(fold.names[1], loop.node)
        self.loops.append(loop)

    def online_pairs(self, loop: RowLoop, body: Node) -> list[Node]:
        """The running (max, sum of exp) pairs the loop folds, into ``loop.pairs``, and the
        blocks whose statements fold them (the rest of the loop must leave the pair alone)."""
        source = self.source
        declared = {
            n for d in inside(source, body, "declaration") for n in declaration_names(source, d)
        }
        tracked = assigned_names(source, body) - declared - {loop.variable}
        tracked = {n for n in tracked if plain_type(self.types.get(n, "")) == "float"}
        if len(tracked) < 2:
            return []
        try:
            blocks = fold_blocks(source, [body], tracked)
        except FoldFormError:
            return []
        found: list[Node] = []
        for block in blocks.values():
            try:
                folds = block_folds(source, block, tracked)
            except FoldFormError as why:
                self.fold_refusals.append((block, str(why)))  # told if a statement is refused
                continue
            pairs = [fold for fold in folds if fold.kind == "pair"]
            for fold in pairs:
                if fold.names not in [p.names for p in loop.pairs]:
                    loop.pairs.append(fold)
            if pairs:
                found.append(block)
        return found

    def in_pair_block(self, node: Node, name: str, loop: RowLoop) -> bool:
        """Whether ``node`` is in a block that folds the pair holding ``name``."""
        pair_names = {n for fold in loop.pairs for n in fold.names}
        return name in pair_names and any(within(node, b) for b in self.pair_blocks)

    def packed_step(self, found: Loop, variable: str, op: str) -> Node | None:
        try:
            return packed_step(self.source, self.kernel, found, variable, op)
        except StepFormError as why:
            raise NotCanonical(f"the loop at line {self.line(found.node)}: {why}") from None

    def unrolled(self, found: Loop, start: Node) -> UnrolledLoop:
        """A row loop stepping by more than 1: the hand-unrolled form, else refused."""
        line = self.line(found.node)
        try:
            indices = analysis(self.source).indices(self.kernel)
            unrolled = thread_unrolled_loop(self.source, found, start, indices)
        except UnrolledFormError as why:
            raise NotCanonical(
                f"the loop at line {line} is not {found.variable} < n with a step of 1, nor "
                f"unrolled by hand: {why}; {THREAD_UNROLLED_FORM}"
            ) from None
        if unrolled is None:
            raise NotCanonical(
                f"the loop at line {line} is not {found.variable} < n with a step of 1, and its "
                f"step is not a constant; {THREAD_UNROLLED_FORM}"
            )
        return unrolled

    def loop_body(
        self, node: Node, loop: RowLoop, local: set[str], self_reads: set[tuple[int, int]]
    ) -> None:
        kind = node.type
        if kind == "compound_statement":
            for child in named_statements(node):
                self.loop_body(child, loop, local, self_reads)
        elif kind == "for_statement" and loop.unrolled is not None and node in loop.unrolled.inner:
            inner = self.source.loop_at(node)  # the loop over u: its variable is the slot
            assert inner is not None and inner.body is not None
            local.add(inner.variable or "")
            self.loop_body(inner.body, loop, local, self_reads)
        elif kind == "for_statement" and self.inner_loop(node, local):
            inner = self.source.loop_at(node)  # over a packed vector's elements, say
            assert inner is not None and inner.body is not None
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=True)
            self.loop_body(inner.body, loop, local, self_reads)
        elif kind == "preproc_call" and self.source.text_of(node).split()[:2] == [
            "#pragma",
            "unroll",
        ]:
            return
        elif kind == "declaration":
            local.update(n for n in declaration_names(self.source, node))
            if self._points_into_element(node, loop.variable):
                self.element_pointers.update(declaration_names(self.source, node))
            self.reads(node, in_loop=True)
        elif kind == "expression_statement":
            self.loop_expression(node, loop, local, self_reads)
        elif kind == "if_statement":
            condition = node.child_by_field_name("condition")
            if condition is not None:
                self.reads(condition, in_loop=True)
            for branch in ("consequence", "alternative"):
                child = node.child_by_field_name(branch)
                if child is not None:
                    inner = child.named_children[0] if child.type == "else_clause" else child
                    self.loop_body(inner, loop, local, self_reads)
        elif kind == "comment":
            return
        else:
            raise NotCanonical(
                f"the {kind.replace('_', ' ')} at line {self.line(node)} inside a row loop"
            )

    def loop_expression(
        self, node: Node, loop: RowLoop, local: set[str], self_reads: set[tuple[int, int]]
    ) -> None:
        expression = node.named_children[0] if node.named_children else None
        if expression is not None and expression.type == "update_expression":
            argument = expression.child_by_field_name("argument")
            if argument is not None and self.source.text_of(argument) in local:
                return
        stored = _intrinsic_store(self.source, expression) if expression is not None else None
        if stored is not None:  # __stcs(o + c, v): the loop's element through a cache hint
            self.store(node, stored[0], loop, stored[2])
            self.reads(stored[1], in_loop=True)
            return
        if expression is None or expression.type != "assignment_expression":
            raise NotCanonical(f"the statement at line {self.line(node)} in a row loop")
        left = expression.child_by_field_name("left")
        right = expression.child_by_field_name("right")
        assert left is not None and right is not None
        if left.type != "identifier" and not self._local_array(left, local):
            self.store(node, left, loop)
            self.reads(right, in_loop=True)
            return
        name = self.source.text_of(left)
        if name in local or left.type != "identifier":
            self.reads(right, in_loop=True)
            return
        if any(name in fold.names for fold in loop.pairs):
            if not self.in_pair_block(node, name, loop):
                raise NotCanonical(
                    f"{name} is written at line {self.line(node)} outside the statements that "
                    "fold its running (max, sum of exp) pair"
                )
            self.reads(right, in_loop=True)
            return
        op, self_read = self.accumulation(expression, name)
        if loop.accumulators.get(name, op) != op:
            raise NotCanonical(f"{name} is reduced with two operations in one loop")
        loop.accumulators[name] = op
        if self_read is not None:
            self_reads.add((self_read.start_byte, self_read.end_byte))
        self.reads(right, in_loop=True)

    def inner_loop(self, node: Node, local: set[str]) -> bool:
        """``for (int k = 0; k < m; ++k)`` inside a row loop: its variable declared in its
        header and the only name its update writes (it then joins the loop's locals)."""
        inner = self.source.loop_at(node)
        if inner is None or inner.variable is None or inner.body is None:
            return False
        if inner.initializer is None or inner.initializer.type != "declaration":
            return False
        update = strip_parens(inner.update) if inner.update is not None else None
        target = None
        if update is not None:
            target = update.child_by_field_name("left") or update.child_by_field_name("argument")
        if target is None or self.source.text_of(target) != inner.variable:
            return False
        local.add(inner.variable)
        return True

    def _local_array(self, target: Node, local: set[str]) -> bool:
        """``a[k]`` with ``a`` an array (or ``v[k]``, ``v.x`` with ``v`` a packed vector,
        ``float4 v``) the loop body declares: registers of this thread."""
        target = strip_parens(target)
        base = target.child_by_field_name("argument")
        operator = target.child_by_field_name("operator")
        member = target.type == "field_expression" and operator is not None and operator.type == "."
        if target.type != "subscript_expression" and not member:
            return False
        if base is None or base.type != "identifier":
            return False
        kind = self.types.get(self.source.text_of(base), "")
        if self.source.text_of(base) not in local or "*" in kind:
            return False
        return kind.endswith("[]") or analysis(self.source).vectors.packed(kind) is not None

    def accumulation(self, expression: Node, name: str) -> tuple[Op, Node | None]:
        """(operation, the node reading the accumulator itself) of ``acc op= e``."""
        right = expression.child_by_field_name("right")
        assert right is not None
        operator = operator_of(expression)
        if operator in SUM_OPS:
            return "sum", None
        value = strip_parens(right)
        if operator == "=" and value.type == "binary_expression" and operator_of(value) == "+":
            for side in ("left", "right"):
                operand = value.child_by_field_name(side)
                if operand is not None and self.source.text_of(strip_parens(operand)) == name:
                    return "sum", operand
        if operator == "=" and value.type == "call_expression":
            function = call_name(self.source, value)
            args = arguments_of(value)
            if function in FMA_CALLS and len(args) == 3:
                # acc = fmaf(a, b, acc): a sum of products, acc read only as the addend
                own = [
                    n
                    for arg in args[:2]
                    for n in inside(self.source, arg, "identifier")
                    if self.source.text_of(n) == name
                ]
                if self.source.text_of(strip_parens(args[2])) == name and not own:
                    return "sum", args[2]
            if function in MAX_FUNCS and len(args) == 2:
                for arg in args:
                    if self.source.text_of(strip_parens(arg)) == name:
                        return MAX_FUNCS[function], arg
            if plain_type(self.types.get(name, "")) != "float":
                own = [
                    n
                    for n in inside(self.source, value, "identifier")
                    if self.source.text_of(n) == name
                ]
                if len(own) == 1:  # acc = push(push(acc, v.x), v.y): a merge of a user type
                    return "merge", own[0]
        pair = next((why for b, why in self.fold_refusals if within(expression, b)), None)
        raise NotCanonical(
            f"the loop assigns {name} at line {self.line(expression)}, which is not a sum, a "
            "max or a min of it" + (f" (read as a running pair: {pair})" if pair else "")
        )

    def check_accumulators(self, loop: RowLoop, self_reads: set[tuple[int, int]]) -> None:
        body = loop.node.child_by_field_name("body")
        assert body is not None
        pair_names = {n for fold in loop.pairs for n in fold.names}
        for node in inside(self.source, body, "identifier"):
            name = self.source.text_of(node)
            if name in pair_names and not self.in_pair_block(node, name, loop):
                raise NotCanonical(
                    f"the loop at line {self.line(loop.node)} reads {name} (line "
                    f"{self.line(node)}) while folding it into a running pair: a running value"
                )
            if name not in loop.accumulators:
                continue
            parent = node.parent
            is_target = (
                parent is not None
                and parent.type == "assignment_expression"
                and parent.child_by_field_name("left") == node
            )
            if is_target or (node.start_byte, node.end_byte) in self_reads:
                continue
            raise NotCanonical(
                f"the loop at line {self.line(loop.node)} reads {name} while reducing into it "
                f"(line {self.line(node)}): a running value, not a reduction"
            )
        for name, op in loop.accumulators.items():
            if op == "merge":
                continue  # its merge and identity come with the carried reduction
            if plain_type(self.types.get(name, "")) != "float":
                raise NotCanonical(f"{name} is not a float (only float reductions are emitted)")
            if op == "sum":
                self.check_starts_at_zero(name, loop.node)

    def check_starts_at_zero(self, name: str, loop: Node) -> None:
        """A sum split over threads is right only when every thread starts from zero: the
        sum's last write before its loop is its declaration, or a plain ``sum = 0.0f;`` (a
        sum reused for a second walk of the row) in a block the loop is in."""
        last = self.last_write(name, loop)
        if last is None or last[0].type == "declaration":
            if last is None or not is_zero_literal(self.source, last[1]):
                raise NotCanonical(
                    f"the sum {name} does not start from a zero literal, so each thread of a "
                    "group would add its start value"
                )
            return
        write, value = last
        statement = write.parent
        block = statement.parent if statement is not None else None
        if not (
            is_zero_literal(self.source, value)
            and statement is not None
            and statement.type == "expression_statement"
            and block is not None
            and block.type == "compound_statement"
            and within(loop, block)
        ):
            raise NotCanonical(f"{name} is written before its loop (line {self.line(write)})")

    def last_write(self, name: str, loop: Node) -> tuple[Node, Node | None] | None:
        """The last declaration of ``name`` with a value, or assignment or update of it, before
        ``loop`` in the kernel's text, with the value it is set to (``None`` for a compound
        assignment or an update)."""
        assert self.kernel.body is not None
        writes: list[tuple[Node, Node | None]] = []
        for node in inside(self.source, self.kernel.body, "declaration"):
            declared = single_init(self.source, node)
            if declared is not None and declared[0] == name and node.end_byte <= loop.start_byte:
                writes.append((node, declared[1]))
        for node in inside(
            self.source, self.kernel.body, "assignment_expression", "update_expression"
        ):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if node.start_byte >= loop.start_byte or target is None:
                continue
            if self.source.text_of(target) == name:
                plain = node.type == "assignment_expression" and operator_of(node) == "="
                writes.append((node, node.child_by_field_name("right") if plain else None))
        return max(writes, key=lambda write: write[0].start_byte, default=None)

    def check_memory(self) -> None:
        """Threads of a group see each other's stores only at the same index in the same
        pattern of loops, so memory that is written is read back only that way."""
        stored = {(base, index) for base, index, _ in self.store_targets}
        bases = {base for base, _ in stored}
        for base, index, node, in_loop in self.loads:
            if base not in bases or (not in_loop and self.updated_in_place(base, index, node)):
                continue
            if not in_loop or (base, index) not in stored:
                raise NotCanonical(
                    f"{base}[{index}] is read at line {self.line(node)} but written elsewhere "
                    "in the kernel, by another thread of the group"
                )
            self.check_clamped_read(base, index, node)

    def updated_in_place(self, base: str, index: str, node: Node) -> bool:
        """``out[i] = out[i] + sum;`` after the loops: the read is in the one statement that
        stores that element, which one thread of a group runs once the group's reduction is
        done, so no other thread of the group writes what it reads."""
        for statement in self.stores:
            if not within(node, statement):
                continue
            targets = [t for b, i, t in self.store_targets if (b, i) == (base, index)]
            return len(targets) == 1 and within(targets[0], statement) and targets[0] != node
        return False

    def check_clamped_read(self, base: str, index: str, node: Node) -> None:
        """``p[min(n - 1, i + u)]`` read back in an unrolled loop: past the row's end every
        thread reads ``p[n - 1]``, which another thread of the group wrote; that is the value
        a thread per row reads only when a group reduction (a barrier) lies between the
        store and the read."""
        reader = next((i for i, loop in enumerate(self.loops) if within(node, loop.node)), None)
        subscript = strip_parens(node)
        inner = subscript.child_by_field_name("indices")
        unrolled = self.loops[reader].unrolled if reader is not None else None
        if unrolled is None or inner is None or len(inner.named_children) != 1:
            return
        if not clamped_element(self.source, inner.named_children[0], unrolled):
            return
        for stored_base, stored_index, target in self.store_targets:
            if (stored_base, stored_index) != (base, index):
                continue
            writer = next(
                (i for i, loop in enumerate(self.loops) if within(target, loop.node)), None
            )
            assert reader is not None
            if self.group != "block":
                raise NotCanonical(
                    f"{self.source.text_of(node)} at line {self.line(node)} reads the row's last "
                    f"element past its end, which another lane writes at line {self.line(target)}; "
                    "shuffles are no memory barrier, so this rule needs a block"
                )
            if writer is None or not any(loop.accumulators for loop in self.loops[writer:reader]):
                raise NotCanonical(
                    f"{self.source.text_of(node)} at line {self.line(node)} reads the row's last "
                    "element past its end, which another thread of the group writes at line "
                    f"{self.line(target)} with no group reduction (barrier) in between"
                )


_LOAD_INTRINSICS = frozenset({"__ldg", "__ldcs", "__ldcg", "__ldca", "__ldlu", "__ldcv"})
"""Loads through a cache hint (the stores are :data:`STORE_INTRINSICS`)."""


def _intrinsic_store(
    source: ParsedSource, expression: Node
) -> tuple[Node, Node, int | None] | None:
    """(address, value, elements stored) of ``__stcs(address, value)`` and its kin (or a
    packed store helper of the file) whose address is ``p + index``; None for anything
    else."""
    access = vector_access(source, expression)
    if access is not None and access.kind == "store" and access.value is not None:
        # store128(p + i, v): a packed store helper
        return access.address, access.value, access.elements
    if expression.type != "call_expression" or call_name(source, expression) not in (
        STORE_INTRINSICS
    ):
        return None
    arguments = arguments_of(expression)
    if len(arguments) != 2 or pointer_offset(source, strip_parens(arguments[0])) is None:
        return None
    return strip_parens(arguments[0]), arguments[1], 1


def unit_step(source: ParsedSource, update: Node | None, variable: str) -> bool:
    if update is None:
        return False
    text = source.text_of(update).replace(" ", "")
    return text in (f"++{variable}", f"{variable}++", f"{variable}+=1")
