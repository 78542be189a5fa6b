"""Asynchronous copies (``cp.async``) and multi-stage pipelines vs synchronous loads.

``cp.async`` (sm_80+) copies global memory straight into shared memory without passing
through registers, and does it in the background: a kernel issues the copies of the next
tiles (``commit_group``), computes on the current one, and waits (``wait_group N``) only
for the stage it needs, so loads and math overlap.

- detect: inline-PTX ``cp.async`` statements (copies, ``commit_group``, ``wait_group``,
  ``wait_all``, and the ``bulk``/``mbarrier`` forms), the ``__pipeline_memcpy_async``,
  ``__pipeline_commit`` and ``__pipeline_wait_prior`` intrinsics, and ``cuda::memcpy_async``;
- remove: a copy ``cp.async.{ca,cg}.shared.global [dst], [src], size[, src-size]`` (or
  ``__pipeline_memcpy_async(dst, src, size[, zfill])``) becomes the synchronous copy it
  stands for: the same bytes stored to the same shared address, zero-filled past the source
  size, so the predicate and zero-fill semantics are kept. Once no asynchronous copy is left,
  ``commit_group`` and ``wait_group`` become no-ops (every copy has landed when it is
  issued). This is semantics-preserving for any race-free pipeline: a read that was ordered
  after its copy's ``wait_group`` and barrier still is, and the ring of stages stays valid
  with synchronous stores. Commits and waits are refused while an asynchronous copy remains
  (they still order it). libcu++'s ``cuda::memcpy_async(dst, src, size, sync)`` of one thread
  is made synchronous too, where ``sync`` is a ``cuda::barrier`` (its waits stay) or a
  one-thread ``cuda::pipeline`` (its steps become no-ops), :mod:`klineage.mechanisms._cpp_async`.
  ``bulk`` (TMA) copies, mbarrier completion, group copies and pipelines shared by threads are
  refused with a reason. A ring of stages that warps hand to each other through mbarriers
  (Hopper producer/consumer pipelines, :mod:`klineage.mechanisms._mbarrier_ring`) is removed
  whole instead: its stage count, bound at the launch, becomes 1;
- apply: puts an instruction back where this mechanism made it synchronous (commits and
  waits before the copies), or turns the tile loads of a canonical staged loop (see
  :mod:`klineage.mechanisms._staging`; each tile stored as ``cond ? p[i] : 0`` or ``p[i]``
  with no conversion) into a two-stage ``cp.async`` ring: the tiles become ``[2][..][..]``,
  the first tile is copied before the loop, each iteration copies the next tile into the
  other stage, commits, waits for all but the newest group and computes (carrier
  ``stages`` = 2), or sets a one-stage mbarrier ring's count to ``stages``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from klineage.conditions import ArchAtLeast, Condition, SharedMemoryAtMost
from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.ptx import PtxInstruction
from klineage.cuda.cexpr import PRIMARY, SIZEOF, fold_int, precedence
from klineage.cuda.edit import Edit
from klineage.cuda.facts import shared_memory_of
from klineage.cuda.source import Call, Function, Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._cpp_async import (
    CPP_COPY,
    cpp_copy,
    cpp_copy_lines,
    cpp_kind,
    pipeline_copies,
    sync_object,
    sync_refusal,
)
from klineage.mechanisms._mbarrier_ring import Ring, rings, set_stages
from klineage.mechanisms._ptx_stash import PtxEmulation, Unsupported
from klineage.mechanisms._staging import (
    NotStaged,
    StagedArray,
    StagedLoop,
    analyze_staged_loop,
    staging_loops,
    subscript_chain,
)
from klineage.mechanisms._tiles_util import (
    STATIC_SHARED_LIMIT,
    AsmStatement,
    asm_statement,
    asm_statements,
    fresh_name,
    function_names,
    rename,
    split_operands,
    stash_blocks,
)
from klineage.mechanisms.base import Carrier, Site, register
from klineage.problem import Problem

_COPY = re.compile(r"^cp\.async\.(ca|cg)\.shared(::cta)?\.global(\.L2::(64|128|256)B)?$")
_GROUPS = ("cp.async.commit_group", "cp.async.wait_group", "cp.async.wait_all")
_PIPELINE_COPY = "__pipeline_memcpy_async"
_PIPELINE_GROUPS = ("__pipeline_commit", "__pipeline_wait_prior")
_CPP_ASYNC = ("cuda::memcpy_async", "cooperative_groups::memcpy_async", "cg::memcpy_async")
_VECTOR = {4: "unsigned", 8: "uint2", 16: "uint4"}
_ZERO = re.compile(r"^(0|0\.0*f?|0\.f|0[uU]?[lL]*)$")
_LOOP_DONE = ("break_statement", "continue_statement", "return_statement", "goto_statement")


@dataclass(frozen=True)
class _Copy:
    """A copy to emulate: shared destination, source, size, and bytes actually read."""

    destination: str
    shared_address: bool
    """True when ``destination`` is a shared-space address (PTX), False for a pointer."""
    source: str
    size: int
    read: str | None
    """An expression for the bytes read from the source (the rest is zero); None: all."""


def _kind(statement: Any) -> str | None:
    """``copy``, ``group`` (commit or wait), or None for another statement."""
    if isinstance(statement, AsmStatement):
        mnemonic = statement.mnemonic
        if mnemonic.startswith(_GROUPS):
            return "group"
        return "copy" if mnemonic.startswith("cp.async") else None
    if isinstance(statement, Call):
        if statement.name == _PIPELINE_COPY:
            return "copy"
        return "group" if statement.name in _PIPELINE_GROUPS else cpp_kind(statement)
    return None


def _size(source: ParsedSource, text: str, statement: AsmStatement) -> int:
    operand = statement.operand(text)
    if operand is not None:
        value = fold_int(source, operand.expr)
    else:
        value = int(text) if text.isdigit() else None
    if value not in _VECTOR:
        raise Unsupported(f"the copy size {text!r} is not a literal 4, 8 or 16")
    return value


def _asm_copy(source: ParsedSource, statement: AsmStatement) -> _Copy:
    instructions = statement.instructions
    if len(instructions) != 1:
        raise Unsupported("the asm statement holds more than one instruction")
    mnemonic, parts = split_operands(instructions[0])
    if not _COPY.match(mnemonic):
        raise Unsupported(
            f"{mnemonic} is not cp.async.ca/cg.shared.global (bulk copies complete on an "
            "mbarrier, and cache-hint forms carry a policy operand), the forms made synchronous"
        )
    if len(parts) not in (3, 4) or not all(
        p.startswith("[") and p.endswith("]") for p in parts[:2]
    ):
        raise Unsupported("expected [dst], [src], size[, src-size]")
    destination = statement.operand(parts[0][1:-1])
    origin = statement.operand(parts[1][1:-1])
    if destination is None or origin is None or destination.output or origin.output:
        raise Unsupported("the addresses are not plain register operands")
    read = None
    if len(parts) == 4:
        operand = statement.operand(parts[3])
        read = source.text_of(operand.expr) if operand is not None else parts[3]
        if operand is None and not parts[3].isdigit():
            raise Unsupported(f"the source size {parts[3]!r} is neither an operand nor a literal")
    return _Copy(
        destination=source.text_of(destination.expr),
        shared_address=True,
        source=source.text_of(origin.expr),
        size=_size(source, parts[2], statement),
        read=read,
    )


def _pipeline_copy(source: ParsedSource, call: Call) -> _Copy:
    if len(call.args) not in (3, 4):
        raise Unsupported("__pipeline_memcpy_async takes (dst, src, size[, zfill])")
    size = fold_int(source, call.args[2])
    if size not in _VECTOR:
        raise Unsupported("the copy size is not a literal 4, 8 or 16")
    zfill = None if len(call.args) == 3 else source.text_of(call.args[3])
    return _Copy(
        destination=source.text_of(call.args[0]),
        shared_address=False,
        source=source.text_of(call.args[1]),
        size=size,
        read=None if zfill is None else f"{size} - ({zfill})",
    )


def _copy_lines(copy: _Copy) -> list[str]:
    vector = _VECTOR[copy.size]
    if copy.shared_address:
        target = f"static_cast<{vector}*>(__cvta_shared_to_generic((size_t)({copy.destination})))"
    else:
        target = f"({vector}*)({copy.destination})"
    lines = [
        "// cp.async made synchronous: the same bytes land in shared memory now (zero past",
        "// the bytes read), so the wait_group that orders them has nothing left to wait for.",
        f"{vector}* kl_dst = {target};",
        f"const {vector}* kl_src = (const {vector}*)({copy.source});",
    ]
    if copy.read is None:
        return [*lines, "*kl_dst = *kl_src;"]
    return [
        *lines,
        f"const int kl_read = (int)({copy.read});",
        f"if (kl_read >= {copy.size}) {{",
        "  *kl_dst = *kl_src;",
        "} else {",
        f"  for (int kl_j = 0; kl_j < {copy.size}; ++kl_j)",
        "    reinterpret_cast<unsigned char*>(kl_dst)[kl_j] =",
        "        kl_j < kl_read ? reinterpret_cast<const unsigned char*>(kl_src)[kl_j] : 0;",
        "}",
    ]


# ---------------------------------------------------------------------------------------------
# Applying to a staged loop
# ---------------------------------------------------------------------------------------------


@dataclass
class _TileCopy:
    """One staged tile's load as a copy: predicate, source element, base pointer."""

    array: StagedArray
    predicate: Node | None
    element: Node
    base: Node


def _tile_copy(source: ParsedSource, function: Function, array: StagedArray) -> _TileCopy:
    value = array.value
    predicate = None
    if value.type == "conditional_expression":
        predicate = value.child_by_field_name("condition")
        alternative = value.child_by_field_name("alternative")
        consequence = value.child_by_field_name("consequence")
        if alternative is None or not _ZERO.match(source.text_of(alternative).strip()):
            raise NotStaged(f"the load of {array.name} does not fill zero outside its predicate")
        value = consequence if consequence is not None else value
    while value.type == "parenthesized_expression" and value.named_children:
        value = value.named_children[0]
    if value.type == "call_expression":
        raise NotStaged(_converted_load(source, array, value))
    chain = subscript_chain(value) if value.type == "subscript_expression" else None
    if chain is None or len(chain[1]) != 1:
        raise NotStaged(f"the load of {array.name} is not a plain element p[i] of global memory")
    base = chain[0]
    declared = source.local_types(function).get(source.text_of(base), "")
    element = " ".join(
        w for w in declared.rstrip("*").split() if w not in ("const", "__restrict__")
    )
    if not declared.endswith("*") or element != array.element:
        raise NotStaged(
            f"{array.name} holds {array.element} loaded from {declared or 'an unknown type'}: "
            "cp.async copies bytes and cannot convert"
        )
    if SIZEOF.get(array.element) not in _VECTOR:
        raise NotStaged(f"{array.element} is not 4, 8 or 16 bytes, the sizes cp.async copies")
    elsewhere = analysis(source).spaces.of(function, base) & {"shared", "local"}
    if elsewhere:
        raise NotStaged(
            f"{source.text_of(base)} may point into {' and '.join(sorted(elsewhere))} memory; "
            "cp.async copies from global memory only"
        )
    return _TileCopy(array, predicate, value, base)


def _converted_load(source: ParsedSource, array: StagedArray, call: Node) -> str:
    """Why a tile filled through a call (a conversion such as ``__half2float(p[i])``, the
    form staging writes for 16-bit inputs) has no asynchronous copy."""
    function = call.child_by_field_name("function")
    name = source.text_of(function) if function is not None else "a call"
    return (
        f"the load of {array.name} converts each element ({name}); cp.async copies bytes "
        "unchanged, so the tile would have to hold the global element type and be converted "
        "where it is read (a rewrite of the staging, not of its copies)"
    )


@dataclass
class _Ring:
    staged: StagedLoop
    copies: list[_TileCopy]
    var: str
    start: Node
    bound: Node
    step: str


def _ring(source: ParsedSource, staged: StagedLoop) -> _Ring:
    if staged.declarations:
        line = source.line_of(staged.declarations[0].start_byte)
        raise NotStaged(
            f"the tile stores use indices declared among them (line {line}), which the copy of "
            "the next tile, issued a turn ahead, cannot read; this rule needs stores whose "
            "values read only the loop variable and locals declared before the loop"
        )
    loop = staged.loop
    init = loop.child_by_field_name("initializer")
    condition = loop.child_by_field_name("condition")
    update = loop.child_by_field_name("update")
    if init is None or init.type != "declaration" or condition is None or update is None:
        raise NotStaged("the tile loop is not 'for (T v = start; v < end; v += step)'")
    declarators = init.children_by_field_name("declarator")
    start = declarators[0].child_by_field_name("value") if len(declarators) == 1 else None
    var = staged.var
    left = condition.child_by_field_name("left")
    operator = condition.child_by_field_name("operator")
    bound = condition.child_by_field_name("right")
    if (
        start is None
        or left is None
        or operator is None
        or bound is None
        or (operator.type != "<" or source.text_of(left) != var)
    ):
        raise NotStaged(f"the tile loop's condition is not '{var} < end'")
    step_text = " ".join(source.text_of(update).split())
    if step_text in (f"++{var}", f"{var}++"):
        step = "1"
    elif update.type == "assignment_expression" and step_text.startswith(f"{var} += "):
        step = step_text[len(f"{var} += ") :]
    else:
        raise NotStaged(f"the tile loop does not step {var} by a fixed amount")
    body = loop.child_by_field_name("body")
    if body is not None and any(True for _ in source.iter_nodes(*_LOOP_DONE, within=body)):
        raise NotStaged("the tile loop's body can leave an iteration early")
    copies = [_tile_copy(source, staged.function, array) for array in staged.arrays]
    for array in staged.arrays:
        declarators = array.declaration.children_by_field_name("declarator")
        if len(declarators) != 1:
            raise NotStaged(f"the declaration of {array.name} declares more than one array")
    return _Ring(staged, copies, var, start, bound, step)


def _grouped(source: ParsedSource, node: Node) -> str:
    text = source.text_of(node)
    return text if precedence(node) >= PRIMARY else f"({text})"


def _issue_lines(
    source: ParsedSource, ring: _Ring, value: str, stage: str, helper: str
) -> list[str]:
    """The copies of the tiles for loop value ``value`` into ``stage``."""
    lines = []
    for copy in ring.copies:
        array = copy.array
        index = f"[{stage}][{source.text_of(array.indices[0])}][{source.text_of(array.indices[1])}]"
        element = rename(source, copy.element, {ring.var: value})
        base = source.text_of(copy.base)
        if copy.predicate is None:
            lines.append(f"{helper}(&{array.name}{index}, &{element}, true);")
            continue
        predicate = rename(source, copy.predicate, {ring.var: value})
        if predicate.startswith("(") and predicate.endswith(")"):
            predicate = predicate[1:-1]
        lines.append(
            f"{helper}(&{array.name}{index}, ({predicate}) ? &{element} : {base}, {predicate});"
        )
    return lines


def _helpers(names: tuple[str, str, str], size: int) -> str:
    copy, commit, wait = names
    cache = "cg" if size == 16 else "ca"
    return (
        f"// cp.async (sm_80+): copy {size} bytes from global to shared memory in the background;\n"
        "// with pred false nothing is read and the destination is zero-filled.\n"
        f"__device__ __forceinline__ void {copy}(void* dst, const void* src, bool pred) {{\n"
        "  const unsigned dst_addr = (unsigned)__cvta_generic_to_shared(dst);\n"
        f'  asm volatile("cp.async.{cache}.shared.global [%0], [%1], {size}, %2;\\n"\n'
        f'               ::"r"(dst_addr), "l"(src), "r"(pred ? {size} : 0)\n'
        '               : "memory");\n'
        "}\n\n"
        f"__device__ __forceinline__ void {commit}() {{\n"
        '  asm volatile("cp.async.commit_group;\\n" ::: "memory");\n'
        "}\n\n"
        "// Wait until at most one committed group (the newest) is still in flight.\n"
        f"__device__ __forceinline__ void {wait}() {{\n"
        '  asm volatile("cp.async.wait_group 1;\\n" ::: "memory");\n'
        "}\n\n"
    )


def _ring_edits(source: ParsedSource, ring: _Ring) -> list[Edit]:
    staged = ring.staged
    function = staged.function
    used = function_names(source, function) | {f.name for f in source.functions}
    size = SIZEOF.get(ring.copies[0].array.element, 4)
    names = (
        fresh_name(used, f"cp_async_copy{size}"),
        fresh_name(used, "cp_async_commit"),
        fresh_name(used, "cp_async_wait_newest"),
    )
    stage = fresh_name(used, "stage")
    loop = staged.loop
    indent = source.indent_of(loop.start_byte)
    inner = source.indent_of(staged.first_sync.start_byte)
    start = _grouped(source, ring.start)
    bound = source.text_of(ring.bound)
    step = ring.step if ring.step == "1" or ring.step.isidentifier() else f"({ring.step})"
    following = f"{ring.var} + {step}"
    prologue = [
        f"int {stage} = 0;",
        f"if ({start} < {bound}) {{  // the first tile, into stage 0",
        *(f"  {line}" for line in _issue_lines(source, ring, start, "0", names[0])),
        "}",
        f"{names[1]}();",
    ]
    ahead = [
        f"if ({following} < {bound}) {{  // the next tile, into the other stage",
        *(
            f"  {line}"
            for line in _issue_lines(source, ring, f"({following})", f"{stage} ^ 1", names[0])
        ),
        "}",
        f"{names[1]}();",
        f"{names[2]}();  // this iteration's tile has landed",
    ]
    edits = [Edit.insert(function.outer.start_byte, _helpers(names, size))]
    edits.append(Edit.insert(loop.start_byte, "".join(f"{line}\n{indent}" for line in prologue)))
    for copy in ring.copies:
        array = copy.array
        edits.append(source.deletion(array.store, whole_line=True))
        declarator = array.declaration.children_by_field_name("declarator")[0]
        name_node = declarator
        while name_node.type == "array_declarator":
            inner_node = name_node.child_by_field_name("declarator")
            if inner_node is None:
                break
            name_node = inner_node
        edits.append(Edit.insert(name_node.end_byte, "[2]"))
        for read in array.reads:
            chain = subscript_chain(read)
            assert chain is not None
            edits.append(Edit.insert(chain[0].end_byte, f"[{stage}]"))
    edits.append(
        Edit.insert(
            source.line_start(staged.first_sync.start_byte),
            "".join(f"{inner}{line}\n" for line in ahead),
        )
    )
    edits.append(Edit.insert(staged.last_sync.end_byte, f"\n{inner}{stage} ^= 1;"))
    return edits


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


def _pipeline_scope(
    source: ParsedSource, block: Node, found: tuple[ParsedSource, Any]
) -> tuple[str, str] | None:
    """(function, sync object) of a remembered libcu++ copy or pipeline step, its block in
    ``source``; None for the PTX and intrinsic forms (their groups order every copy of the
    thread, wherever it is written)."""
    snippet, statement = found
    if not isinstance(statement, Call) or cpp_kind(statement) is None:
        return None
    target = sync_object(snippet, statement)
    function = source.enclosing_function(block)
    if target is None or function is None:
        return None
    return function.name, snippet.text_of(target)


@register
class CpAsyncPipeline(PtxEmulation):
    name = "cp_async_pipeline"
    category = "memory"
    signature = ("LDGSTS", "UTMALDG")
    family = "cp.async pipelines vs synchronous loads"
    intent = (
        "Copy the next tiles from global to shared memory in the background (cp.async) while "
        "the current tile is computed, so memory latency hides behind the math."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "stages": "pipeline stages: of a staged tile loop (only 2 is written), or of an "
        "mbarrier ring (any count)",
    }

    # -- statements -------------------------------------------------------------------------

    def matches_instruction(self, instruction: PtxInstruction) -> bool:
        return instruction.family in ("cp_async", "cp_async_commit", "cp_async_wait")

    def matches(self, statement: AsmStatement) -> bool:
        return any(i.startswith("cp.async") for i in statement.instructions)

    def statement(self, source: ParsedSource, node: Node) -> Any | None:
        found = asm_statement(source, node)
        if found is not None:
            return found if self.matches(found) else None
        if node.type != "expression_statement" or not node.named_children:
            return None
        call_node = node.named_children[0]
        call = next((c for c in source.calls if c.node == call_node), None)
        if call is not None and call.name in (_PIPELINE_COPY, *_PIPELINE_GROUPS):
            return call
        return call if call is not None and cpp_kind(call) is not None else None

    def describe(self, statement: Any) -> str:
        return statement.name if isinstance(statement, Call) else super().describe(statement)

    def statement_nodes(self, source: ParsedSource) -> Iterator[Node]:
        nodes = [s.statement for s in asm_statements(source)]
        for call in source.calls:
            if call.name not in (_PIPELINE_COPY, *_PIPELINE_GROUPS) and cpp_kind(call) is None:
                continue
            if call.node.parent is not None and call.node.parent.type == "expression_statement":
                nodes.append(call.node.parent)
        yield from sorted(nodes, key=lambda n: n.start_byte)

    def extra_sites(self, source: ParsedSource) -> Iterator[Site]:
        for ring in rings(source):
            if ring.stages != 1:
                yield self._ring_site(source, ring)
        for call in source.calls_named(*_CPP_ASYNC):
            if cpp_kind(call) == "copy":
                continue  # a thread's copy: a statement site of its own
            yield self.site(
                source,
                call.node,
                detail={"instruction": call.name},
                refusal=f"{call.name} copies for a whole group of threads, which complete "
                "together through the group's waits; only a thread's own copies are made "
                "synchronous",
            )

    def emulation(self, source: ParsedSource, statement: Any) -> list[str]:
        if _kind(statement) == "group":
            if isinstance(statement, AsmStatement) and len(statement.instructions) != 1:
                raise Unsupported("the asm statement holds more than one instruction")
            return []
        if isinstance(statement, Call) and cpp_kind(statement) == "copy":
            return cpp_copy_lines(cpp_copy(source, statement))
        if isinstance(statement, Call):
            return _copy_lines(_pipeline_copy(source, statement))
        return _copy_lines(_asm_copy(source, statement))

    def _ring_site(self, source: ParsedSource, ring: Ring) -> Site:
        return self.site(
            source,
            ring.wrap,
            snippet=f"{ring.stages}-stage mbarrier ring ({ring.parameter}, {ring.barriers}[])",
            detail={"form": "ring", "stages": ring.stages, "parameter": ring.parameter},
            refusal=ring.refusal,
        )

    def _ring_at(self, source: ParsedSource, site: Site) -> Ring:
        for ring in rings(source):
            if (ring.wrap.start_byte, ring.kernel.name) == (site.start_byte, site.function):
                return ring
        raise self.refuse("the mbarrier ring is no longer found at the site", site)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") != "ring":
            return super().removal(source, site)
        return set_stages(source, self._ring_at(source, site), 1)

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("form") == "ring":
            return Carrier(stages=int(site.detail["stages"]))
        return super().carrier_of(kernel, site)

    # -- ordering ---------------------------------------------------------------------------

    def _async_copies(self, source: ParsedSource) -> int:
        count = sum(1 for s in asm_statements(source) if self.matches(s) and _kind(s) == "copy")
        macros = sum(
            1
            for site in analysis(source).ptx.sites
            if site.via == "macro" and "cp_async" in site.families()
        )
        cpp = sum(1 for call in source.calls_named(CPP_COPY) if cpp_kind(call) == "copy")
        return count + macros + len(source.calls_named(_PIPELINE_COPY)) + cpp

    def removal_refusal(self, source: ParsedSource, statement: Any) -> str | None:
        if isinstance(statement, Call) and cpp_kind(statement) is not None:
            why = sync_refusal(source, statement)
            if why is not None:
                return (
                    f"{statement.name} completes through a sync object this rewrite does "
                    f"not follow: {why}"
                )
            if cpp_kind(statement) == "group":  # a pipeline's step orders its own copies
                if pipeline_copies(source, statement):
                    return (
                        f"copies through {statement.name.split('.')[0]} remain in this "
                        "function and this step still orders them; remove the copies first"
                    )
                return None
        if _kind(statement) == "group" and self._async_copies(source):
            return (
                "asynchronous copies remain in the file and this commit/wait still orders "
                "them; remove the copies first"
            )
        return None

    def apply_refusal_of(self, source: ParsedSource, block: Node) -> str | None:
        original = next((o for b, o in stash_blocks(source, self.name) if b == block), None)
        found = None if original is None else self.statement_of_text(source, original)
        if _kind(found[1] if found is not None else None) != "copy":
            return None
        assert found is not None
        # a libcu++ copy waits on its own pipeline's steps, in its own function
        scope = _pipeline_scope(source, block, found)
        for other_block, other in stash_blocks(source, self.name):
            again = self.statement_of_text(source, other)
            if other_block == block or again is None or _kind(again[1]) != "group":
                continue
            if scope is None or _pipeline_scope(source, other_block, again) == scope:
                return (
                    "the commit and wait groups made no-ops are still missing; restore them "
                    "first, or this copy would never be waited for"
                )
        return None

    # -- the staged-loop application ----------------------------------------------------------

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        yield from super().find_candidates(source)
        for ring in rings(source):
            if ring.stages == 1:
                yield self._ring_site(source, ring)
        for function, loop in staging_loops(source):
            try:
                _ring(source, analyze_staged_loop(source, function, loop))
                refusal = None
            except NotStaged as why:
                refusal = str(why)
            yield self.site(
                source,
                loop,
                snippet=source.header(loop),
                detail={"form": "staged"},
                refusal=refusal,
            )

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == "ring":
            stages = carrier.get_int("stages", 2) or 2
            if stages < 2:
                raise self.refuse(f"stages={stages}: a pipeline needs 2 or more", site, "apply")
            return set_stages(source, self._ring_at(source, site), stages)
        if site.detail.get("form") != "staged":
            return super().application(source, site, carrier)
        stages = carrier.get_int("stages", 2)
        if stages != 2:
            raise self.refuse(f"stages={stages}: only a two-stage ring is written", site, "apply")
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        if function is None:
            raise self.refuse("the loop is not in a function", site, "apply")
        try:
            ring = _ring(source, analyze_staged_loop(source, function, loop))
        except NotStaged as why:
            raise self.refuse(str(why), site, "apply") from None
        return _ring_edits(source, ring)

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        if site.detail.get("form") == "ring":
            return [ArchAtLeast(sm=90, why="bulk copies completing on mbarriers need sm_90")]
        found: list[Condition] = [ArchAtLeast(sm=80, why="cp.async needs sm_80")]
        if site.detail.get("form") == "staged":
            source = kernel.parsed
            usage = shared_memory_of(source, site.function)
            if usage is not None:
                found.append(
                    SharedMemoryAtMost(
                        bytes=STATIC_SHARED_LIMIT,
                        usage=f"2 * ({usage})",
                        why="two stages double the staged tiles",
                    )
                )
        return found
