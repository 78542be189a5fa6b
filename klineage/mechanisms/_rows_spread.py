"""Thread per row -> group per row (the forward rewrite): loops strided by the group, each
accumulator reduced over the group after its loop, stores by the first thread, one row per
group at launch; carried block reductions of a user type (a running max and sum) merged back."""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.cexpr import PRIMARY, fold_int, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.facts import template_values
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import WARP_SIZE, identifier_names
from klineage.mechanisms._online_pair_form import combine_text
from klineage.mechanisms._reductions_util import (
    inside,
    is_zero_literal,
    named_statements,
    plain_type,
    strip_parens,
    within,
)
from klineage.mechanisms._rows_forms import (
    Group,
    NotCanonical,
    RowLoop,
    count_numerator,
    primary_text,
    row_count,
    single_init,
)
from klineage.mechanisms._rows_group_reductions import InlineReductions
from klineage.mechanisms._rows_helper_forward import helper_edits
from klineage.mechanisms._rows_helpers import helper_insertions
from klineage.mechanisms._rows_thread import ThreadRows
from klineage.mechanisms._tiles_util import orphaned_declarations
from klineage.mechanisms._warp_rows_2d import block_threads_2d

_RANK = {"block": "threadIdx.x", "warp": "threadIdx.x & 31"}

_SIZE = {"block": "blockDim.x", "warp": "32"}

_FIRST = {"block": "threadIdx.x == 0", "warp": "(threadIdx.x & 31) == 0"}


def _group_stride(source: ParsedSource, kernel: str, group: Group, block_size: int) -> str:
    """What a row loop strides by: a template parameter that equals ``block_size`` in every
    instantiation (``kThreads``) when the kernel has one, so the stride stays a compile-time
    constant as an expert writes it; else ``blockDim.x`` (or 32 for a warp)."""
    if group != "block":
        return _SIZE[group]
    bindings = template_values(source, kernel) or [{}]
    names = [n for n in bindings[0] if all(b.get(n) == block_size for b in bindings)]
    names.sort(key=lambda n: not re.search("thread|block", n, re.IGNORECASE))
    return names[0] if names else _SIZE[group]


@dataclass(frozen=True)
class MergeReduction:
    """An inline block reduction of a user-typed accumulator, as written in a group-per-row
    kernel: what a round trip carries to spread that accumulator again."""

    variable: str
    text: str
    """The statements from the first warp merge to the last, their common indentation removed."""
    scratch: str
    """The ``__shared__`` declaration they publish through."""


def merge_reductions(source: ParsedSource, kernel: Function) -> list[MergeReduction]:
    """The inline block reductions of ``kernel`` over accumulators that are not floats."""
    if kernel.body is None:
        return []
    finder = InlineReductions(source, kernel.body)
    types = source.local_types(kernel)
    shared = [d for d in source.shared_declarations if within(d.node, kernel.body)]
    found: list[MergeReduction] = []
    for block in inside(source, kernel.body, "compound_statement"):
        statements = named_statements(block)
        for index, first in enumerate(statements):
            try:
                end = finder.run_end(statements, index)
            except NotCanonical:
                continue
            variable = finder.warp_step(first)
            if end is None or variable is None or plain_type(types.get(variable, "")) == "float":
                continue
            lines = source.text_of((first.start_byte, statements[end].end_byte)).split("\n")
            base = first.start_byte - source.line_start(first.start_byte)
            text = "\n".join(
                [
                    lines[0],
                    *(line[base:] if not line[:base].strip() else line for line in lines[1:]),
                ]
            )
            used = [d for d in shared if any(re.search(rf"\b{n}\b", text) for n in d.names)]
            if len(used) == 1:
                found.append(MergeReduction(variable, text, source.text_of(used[0].node)))
    return found


def _merge_point(source: ParsedSource, rows: ThreadRows, loops: list[RowLoop], name: str) -> Node:
    """Where the carried reduction of ``name`` goes: after its one loop, or after the one
    statement of the kernel body that holds all its loops (the branches of ``if (kAligned)``),
    provided nothing in that statement reads ``name`` after a loop."""
    assert rows.kernel.body is not None
    if len(loops) == 1:
        return loops[0].node
    tops: dict[tuple[int, int], Node] = {}
    for loop in loops:
        node = loop.node
        while node.parent is not None and node.parent != rows.kernel.body:
            node = node.parent
        tops[(node.start_byte, node.end_byte)] = node
    if len(tops) != 1:
        raise NotCanonical(f"the loops that accumulate {name} are not in one statement")
    (top,) = tops.values()
    covered = [(loop.node.start_byte, loop.node.end_byte) for loop in loops]
    for node in inside(source, top, "identifier"):
        outside = not any(a <= node.start_byte < b for a, b in covered)
        if (
            source.text_of(node) == name
            and outside
            and any(node.start_byte >= b for _, b in covered)
        ):
            raise NotCanonical(
                f"{name} is read at line {source.line_of(node.start_byte)}, after a loop "
                "that accumulates it and before the statement ends"
            )
    return top


def _merge_edits(
    source: ParsedSource, rows: ThreadRows, after: Node, name: str, merges: list[MergeReduction]
) -> list[Edit]:
    """The carried reduction of ``name`` after ``after`` (its loop, or the statement holding
    its loops), checked to start from the identity the accumulator is initialized with."""
    carried = next((m for m in merges if m.variable == name), None)
    if carried is None:
        raise NotCanonical(
            f"the loop at line {source.line_of(after.start_byte)} accumulates {name} with a "
            "call, not a sum, a max or a min: combining the threads' values needs its merge, "
            "which only a carried block reduction gives (a round trip)"
        )
    assert rows.kernel.body is not None
    for node in inside(source, rows.kernel.body, "declaration"):
        if node.end_byte > after.start_byte:
            break
        initialized = single_init(source, node)
        if initialized is not None and initialized[0] == name:
            start = source.text_of(initialized[1])
            if " ".join(start.split()) not in " ".join(carried.text.split()):
                raise NotCanonical(
                    f"{name} starts from {start}, which the carried reduction does not use as its "
                    "identity, so each thread of a group would add its start value"
                )
    indent = source.indent_of(after.start_byte)
    body = carried.text.replace("\n", "\n" + indent)
    return [Edit.insert(after.end_byte, f"\n{indent}{body}")]


def spread_rows(
    source: ParsedSource,
    rows: ThreadRows,
    group: Group,
    block_size: int,
    merges: list[MergeReduction] | None = None,
) -> list[Edit]:
    """The edits that give each row of a canonical thread-per-row kernel to a block (or a
    warp) of ``block_size`` threads. User-typed accumulators (``merge``) need their block
    reduction in ``merges``."""
    edits: list[Edit] = []
    rank, first = _RANK[group], _FIRST[group]
    if rows.warps_2d:  # back to the row of the thread's warp; the lanes are threadIdx.x
        edits.append(Edit.replace(rows.index, source.text_of(rows.block_part)))
        rank, first = "threadIdx.x", "threadIdx.x == 0"
        block_size = max(_blocks_2d(source, rows))
    elif group == "block":
        edits.append(Edit.replace(rows.index, source.text_of(rows.block_part)))
    else:
        edits.append(Edit.replace(rows.index, f"({source.text_of(rows.index)}) >> 5"))
    ops: list[str] = []
    stride = _group_stride(source, rows.kernel.name, group, block_size)
    for loop in rows.loops:
        if loop.down:  # `c -= s` before the walk back and its step: by the group's s
            step = f"{loop.variable} -= {_scaled(source, stride, loop.unit)}"
            edits += [Edit.replace(loop.start, step), Edit.replace(loop.update, step)]
        elif is_zero_literal(source, loop.start):
            edits.append(Edit.replace(loop.start, _scaled(source, rank, loop.unit)))
            edits += _strided_update(source, loop, stride)
        else:  # from the row's own start by 1 (the walker's offset_start)
            start = source.text_of(loop.start)
            start = start if primary_text(start) else f"({start})"
            offset = rank if re.fullmatch(r"[\w.]+", rank) else f"({rank})"  # `threadIdx.x & 31`
            edits.append(Edit.replace(loop.start, f"{start} + {offset}"))
            edits += _strided_update(source, loop, stride)
        indent = source.indent_of(loop.node.start_byte)
        lines = "".join(
            f"\n{indent}{name} = {group}_reduce_{op}({name});"
            for name, op in loop.accumulators.items()
            if op != "merge"
        )
        taken = identifier_names(source, rows.kernel.body) if rows.kernel.body else set()
        lines += "".join(
            f"\n{indent}{combine_text(fold, group, indent, taken)}" for fold in loop.pairs
        )
        if lines:
            edits.append(Edit.insert(loop.node.end_byte, lines))
        ops += [op for op in loop.accumulators.values() if op not in ops and op != "merge"]
        ops += [op for op in ("max", "sum") if loop.pairs and op not in ops]
    merged = {n for loop in rows.loops for n, op in loop.accumulators.items() if op == "merge"}
    for name in sorted(merged):
        if group != "block":
            raise NotCanonical(f"{name} is a user-typed merge; only a block carries one")
        loops = [loop for loop in rows.loops if loop.accumulators.get(name) == "merge"]
        edits += _merge_edits(
            source, rows, _merge_point(source, rows, loops, name), name, merges or []
        )
    assert rows.kernel.body is not None
    inner = source.indent_of(named_statements(rows.kernel.body)[0].start_byte)
    for scratch in sorted({m.scratch for m in merges or [] if m.variable in merged}):
        edits.append(Edit.insert(rows.kernel.body.start_byte + 1, f"\n{inner}{scratch}"))
    for store in rows.stores:
        edits.append(Edit.insert(store.start_byte, f"if ({first}) "))
    for helper in rows.helpers:  # by the group's size: the kernel's stride names nothing there
        edits += helper_edits(source, helper, rank, "32" if rows.warps_2d else _SIZE[group], group)
        ops += [op for op in helper.ops if op not in ops]
    check_launch_bounds(source, rows.kernel, block_size)
    edits += launch_edits_to_groups(source, rows, group, block_size)
    first_function = min(
        [rows.kernel, *(h.helper for h in rows.helpers)], key=lambda f: f.outer.start_byte
    )
    edits += helper_insertions(source, first_function, group, ops)
    return edits


def _scaled(source: ParsedSource, text: str, unit: Node | None) -> str:
    """``text * V`` for a packed step ``V`` (``text`` alone without one)."""
    if unit is None:
        return text
    left = text if re.match(r"^[\w.:]+$", text) else f"({text})"
    right = source.text_of(unit)
    return f"{left} * {right if precedence(strip_parens(unit)) >= PRIMARY else f'({right})'}"


def _blocks_2d(source: ParsedSource, rows: ThreadRows) -> list[int]:
    """The threads of each launch's 32 x y block (:func:`_check_blocks_2d` checked them)."""
    found = [block_threads_2d(source, la) for la in source.launches_of(rows.kernel)]
    return [threads for threads in found if threads is not None]


def _strided_update(source: ParsedSource, loop: RowLoop, stride: str) -> list[Edit]:
    """The step of a loop spread over the group: the group's size (times a packed step), or
    for a loop unrolled by hand ``stride * U`` with each ``i + u`` now ``i + u * stride`` (the
    group's threads take turns inside each run of ``U`` group-sized slots)."""
    if loop.unrolled is None:
        return [
            Edit.replace(loop.update, f"{loop.variable} += {_scaled(source, stride, loop.unit)}")
        ]
    step = loop.unrolled.update.child_by_field_name("right")
    factor = loop.unrolled.factor
    if step is None or precedence(strip_parens(step)) < PRIMARY:
        factor = f"({factor})"
    edits = [Edit.replace(loop.update, f"{loop.variable} += {stride} * {factor}")]
    for slot, _ in loop.unrolled.slots:
        edits.append(Edit.replace(slot, f"{source.text_of(slot)} * {stride}"))
    return edits


def check_launch_bounds(source: ParsedSource, kernel: Function, block_size: int) -> None:
    """A launch larger than the kernel's ``__launch_bounds__`` would fail."""
    if kernel.launch_bounds is None:
        return
    args = [a for a in kernel.launch_bounds.named_children if a.type != "comment"]
    # a template kernel's bound (``kThreads``) is checked in every instantiation
    bindings = template_values(source, kernel.name) or [{}]
    values = [
        fold_int(source, args[0], {**source.integer_constants, **b}) if args else None
        for b in bindings
    ]
    bound = None if None in values else min(v for v in values if v is not None)
    if bound is None:
        raise NotCanonical(
            f"{kernel.name} has __launch_bounds__ that do not fold to a number; the new block "
            "size could break them"
        )
    if block_size > bound:
        raise NotCanonical(f"block_size={block_size} exceeds __launch_bounds__({bound})")


def launch_edits_to_groups(
    source: ParsedSource, rows: ThreadRows, group: Group, block_size: int
) -> list[Edit]:
    launches = source.launches_of(rows.kernel)
    if not launches:
        raise NotCanonical(f"no launch of {rows.kernel.name} in this file to give a group per row")
    edits = []
    for launch in launches:
        grid, block = launch.grid, launch.block
        if grid is None or block is None:
            raise NotCanonical(f"the launch at line {source.line_of(launch.node.start_byte)}")
        count = row_count(source, rows.kernel, launch, rows.bound)
        # a 32 x y block keeps its shape: a row for each of its y warps
        threads = block_threads_2d(source, launch) if rows.warps_2d else None
        if group == "block":
            text = f"(unsigned){count}" if primary_text(count) else f"(unsigned)({count})"
        else:
            warps = (threads or block_size) // WARP_SIZE
            text = f"(unsigned)(({count_numerator(count)} + {warps - 1}) / {warps})"
        edits.append(Edit.replace(grid, text))
        if threads is None:
            edits.append(Edit.replace(block, str(block_size)))
    # a grid size computed only for the old launch (`blocks`) would be left unused
    return edits + orphaned_declarations(
        source, [launch.grid for launch in launches if launch.grid]
    )
