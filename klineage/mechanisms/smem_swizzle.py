"""XOR-swizzled shared-memory layouts vs plain indexing.

Instead of padding, a swizzled layout permutes the 16-byte chunks of each row: chunk ``c`` of
row ``r`` is stored at ``c ^ (r & 7)``. The eight rows an ``ldmatrix`` phase (or a column
of cp.async writes) touches then land in eight different chunks, i.e. all 32 banks, with no
memory wasted.

- detect (other forms, when a file has no XOR swizzle): a rotation of the chunks of a row by
  a row-dependent amount in a shared-memory address, or a swizzle mode given to TMA
  (:mod:`klineage.mechanisms._swizzle_forms`), refused with their form, except a rotation
  written the same way at every access of one shared array, which is removed (the rotation
  dropped at every access: :mod:`klineage.mechanisms._swizzle_rotation`) and applied (a
  rotation by one chunk every ``shift_rows`` rows written into every access of a shared array
  whose columns wrap at the row unrotated, the state that removal leaves:
  :mod:`klineage.mechanisms._swizzle_rotation_forward`);
- detect: ``^`` expressions with a masked operand (``c ^ (r & 7)``; a butterfly exchange
  ``lane ^ offset`` is not a swizzle) in a *layout helper*, a device function computing a
  2-D offset ``row * pitch + chunk << 4`` over two of its parameters (what it computes
  decides, never its name: :func:`layout_params`), or inside the subscript of a
  ``__shared__`` array;
- remove: where the swizzle lives in one helper, ``swizzle(row, chunk)`` returning an offset
  with ``chunk ^ (row & mask)`` in it, and every access goes through that helper (writes and
  reads alike), the XOR is dropped: the helper becomes the identity layout. Since all
  accesses move together the program computes the same values; only the banks change. An
  XOR written inline at an access is refused (every access of that buffer would have to
  change consistently);
- apply: a layout helper that has no XOR yet gets ``chunk ^ (row & mask)`` (carrier
  ``mask``, default 7; ``row`` and ``chunk`` name the parameters, default the one scaled by
  the pitch and the one scaled into chunks), provided the row pitch it multiplies ``row`` by
  holds a whole multiple of ``mask + 1`` chunks, so the permuted chunk stays inside its row;
- wgmma (Hopper): when the tensor cores read the tiles through shared-memory descriptors in
  128-byte swizzle mode, the helper is usually called by the writers alone, and the layout
  moves with the descriptors instead: the helper becomes interleaved core matrices, the
  descriptor mode 0 with LBO 128, and the k steps along a row become core-matrix steps (see
  :mod:`klineage.mechanisms._descriptor_swizzle`); applying reverses the three together.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import template_values
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._descriptor_swizzle import (
    ROW_BYTES,
    application_plan,
    descriptors,
    removal_plan,
)
from klineage.mechanisms._forms import form_site, removable_form_site
from klineage.mechanisms._swizzle_forms import ROTATION, swizzle_forms
from klineage.mechanisms._swizzle_rotation import common_rotation, rotation_removal
from klineage.mechanisms._swizzle_rotation_forward import (
    canonical_shift,
    rotation_application,
    rows_candidates,
)
from klineage.mechanisms._tiles_util import names_in
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

DEFAULT_MASK = 7


def _operator(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


def _inner(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[0]
    return node


def layout_params(source: ParsedSource, function: Function) -> tuple[str, str] | None:
    """``(row, chunk)`` when a device helper returns a 2-D layout offset over two of its
    parameters: ``row`` scaled by a row pitch (``row * P``) and ``chunk`` scaled into bytes or
    elements (``chunk << 4``, ``chunk * 16``, permuted or not: ``(chunk ^ (row & 7)) << 4``).
    What the helper computes decides, not what it is called."""
    if function.body is None or not function.runs_on_device:
        return None
    params = [p.name for p in function.params if p.name]
    scales: dict[str, int | None] = {}  # parameter -> what it is scaled by (None: unknown)
    returned = [r for r in source.iter_nodes("return_statement", within=function.body)]
    products = [node for r in returned for node in source.iter_nodes("binary_expression", within=r)]
    for node in products:
        op = _operator(node)
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None or op not in ("*", "<<"):
            continue
        pairs = [(left, right), (right, left)] if op == "*" else [(left, right)]
        for mine, other in pairs:
            factor = fold_int(source, other)
            scale = factor if op == "*" or factor is None else 1 << factor
            for name in names_in(source, mine) & set(params):
                if name not in names_in(source, other):
                    known = scales.get(name, 0)
                    scales[name] = None if known is None or scale is None else max(known, scale)
    if len(scales) != 2:
        return None
    (a, scale_a), (b, scale_b) = scales.items()
    if scale_a is None or (scale_b is not None and scale_a > scale_b):
        return (a, b) if scale_b is not None else None
    return (b, a) if scale_a is not None and scale_b != scale_a else None


def _is_helper(source: ParsedSource, function: Function | None) -> bool:
    """A device function computing a layout offset (:func:`layout_params`)."""
    return function is not None and layout_params(source, function) is not None


def _in_shared_subscript(source: ParsedSource, node: Node, shared: set[str]) -> bool:
    current = node.parent
    while current is not None and current.type not in ("expression_statement", "declaration"):
        if current.type == "subscript_expression":
            base = current.child_by_field_name("argument")
            while base is not None and base.type == "subscript_expression":
                base = base.child_by_field_name("argument")
            if base is not None and source.text_of(base) in shared:
                return True
        current = current.parent
    return False


@dataclass(frozen=True)
class _Xor:
    """``chunk ^ (row & mask)`` in a helper: the kept operand and the mask."""

    node: Node
    kept: Node
    row: str
    mask: int


def _helper_xor(source: ParsedSource, function: Function, node: Node) -> _Xor | str:
    """The swizzle XOR of a helper, or why it is not the canonical form."""
    params = [p.name for p in function.params if p.name]
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None:
        return "the XOR has no two operands"
    for kept, masked in ((left, right), (right, left)):
        inner = _inner(masked)
        if inner.type != "binary_expression" or _operator(inner) != "&":
            continue
        a, b = inner.child_by_field_name("left"), inner.child_by_field_name("right")
        if a is None or b is None:
            continue
        mask = fold_int(source, b)
        row = source.text_of(a)
        if mask is None or row not in params or kept.type != "identifier":
            continue
        if source.text_of(kept) not in params or source.text_of(kept) == row:
            continue
        return _Xor(node, kept, row, mask)
    return "the XOR is not 'chunk ^ (row & mask)' over two parameters of the helper"


def _masked(source: ParsedSource, node: Node) -> bool:
    """Whether an XOR operand is a masked row index (``row & 7``, ``(row >> 1) % 4``): what
    tells a swizzle from a butterfly exchange (``lane ^ offset``)."""
    inner = _inner(node)
    right = inner.child_by_field_name("right")
    return (
        inner.type == "binary_expression"
        and _operator(inner) in ("&", "%")
        and right is not None
        and fold_int(source, right) is not None
    )


def _xor_sites(source: ParsedSource) -> Iterator[tuple[Node, Function | None]]:
    shared = {n for d in source.shared_declarations for n in d.names}
    for node in source.nodes("binary_expression"):
        if _operator(node) != "^":
            continue
        operands = [node.child_by_field_name(f) for f in ("left", "right")]
        if not any(o is not None and _masked(source, o) for o in operands):
            continue
        function = source.enclosing_function(node)
        if function is None or not function.runs_on_device:
            continue
        if _is_helper(source, function) or _in_shared_subscript(source, node, shared):
            yield node, function


def _calls(source: ParsedSource, name: str) -> int:
    return len(source.calls_named(name))


def _chunks_per_row(
    source: ParsedSource,
    function: Function,
    row: str,
    chunk: str,
    binding: Mapping[str, int] | None = None,
) -> int | None:
    """Chunks in a row of the helper's layout: the pitch ``row`` is multiplied by, over the
    chunk size (``chunk << 4`` or ``chunk * 16``); None when either is not constant (with the
    helper's template parameters bound as in `binding`)."""
    if function.body is None:
        return None
    names = {**source.integer_constants, **(binding or {})}
    pitch = unit = None
    for node in source.iter_nodes("binary_expression", within=function.body):
        left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
        if left is None or right is None:
            continue
        op = _operator(node)
        for mine, other in ((left, right), (right, left)):
            name = source.text_of(_inner(mine))
            if op == "*" and name == row:
                pitch = fold_int(source, other, names)
            elif op == "*" and name == chunk:
                unit = fold_int(source, other, names)
        if op == "<<" and chunk in names_in(source, left):
            shift = fold_int(source, right, names)
            unit = None if shift is None else 1 << shift
    if pitch is None or not unit or pitch % unit:
        return None
    return pitch // unit


@register
class SmemSwizzle(Mechanism):
    name = "smem_swizzle"
    category = "memory"
    family = "shared-memory padding or swizzle"
    intent = (
        "Permute the 16-byte chunks of each shared-memory row with an XOR of the row index, so "
        "the rows one warp touches together fall in different banks, without padding."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "mask": "row bits XORed into the chunk index (7: eight chunks, 128-byte rows)",
        "row": "the helper's row parameter (default: the one multiplied by the row pitch)",
        "chunk": "the helper's chunk parameter (default: the one scaled into chunks)",
        "pitch": "row pitch as written, for a layout wgmma descriptors read (default: 128)",
        "shift_rows": (
            "rows that share one rotation of an inline rotated layout (default: the rows of "
            "one 128-byte bank line)"
        ),
    }
    relieves = ("shared-memory bank conflicts",)

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for node, function in _xor_sites(source):
            detail: dict[str, str | int] = {}
            refusal: str | None
            if _is_helper(source, function):
                assert function is not None
                found = _helper_xor(source, function, node)
                if isinstance(found, str):
                    refusal = found
                else:
                    detail = {
                        "mask": found.mask,
                        "row": found.row,
                        "chunk": source.text_of(found.kept),
                    }
                    refusal = None
                    if descriptors(source):
                        plan = removal_plan(source, node, found.row, str(detail["chunk"]))
                        refusal = plan if isinstance(plan, str) else None
                        if not isinstance(plan, str):
                            detail["pitch"] = plan.pitch
                    elif _calls(source, function.name) < 2:
                        refusal = (
                            f"{function.name} is called fewer than twice, so the writes and the "
                            "reads of the buffer do not both go through it"
                        )
            else:
                refusal = (
                    "the XOR is written inline at a shared-memory access; removing it needs "
                    "every access of that buffer rewritten the same way, which is not checked"
                )
            yield self.site(source, node, detail=detail, refusal=refusal)
        if not any(True for _ in _xor_sites(source)):
            for form in swizzle_forms(source, set()):
                if form.kind == ROTATION:
                    yield removable_form_site(
                        self,
                        source,
                        form,
                        rotation_removal,
                        ROTATION,
                        "as a rotation at every access",
                    )
                else:
                    yield form_site(self, source, form)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for found in rows_candidates(source):
            accesses = found.array.accesses if found.array is not None else None
            yield self.site(
                source,
                found.start,
                span=(found.start.start_byte, found.end.end_byte),
                # a refused array is shown by its declaration
                snippet=f"{found.name}: {len(accesses)} accesses with unrotated rows"
                if accesses
                else None,
                detail={"kernel": found.function.name, "form": ROTATION, "array": found.name},
                refusal=str(found.refusal) if found.refusal is not None else None,
            )
        for function in source.functions:
            if not _is_helper(source, function) or function.body is None:
                continue
            if any(
                _operator(n) == "^"
                for n in source.iter_nodes("binary_expression", within=function.body)
            ):
                continue
            yield self.site(
                source,
                function.node,
                span=(function.body.start_byte, function.body.end_byte),
                kind="compound_statement",
                snippet=f"{function.name} without XOR",
            )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == ROTATION:
            return self._rotation_removal(source, site)
        node = self.node_at(source, site, "binary_expression")
        function = source.enclosing_function(node)
        if function is None:
            raise self.refuse("the XOR is not in a function", site)
        found = _helper_xor(source, function, node)
        if isinstance(found, str):
            raise self.refuse(found, site)
        if descriptors(source):  # the tensor cores read the layout too: move both
            plan = removal_plan(source, node, found.row, source.text_of(found.kept))
            if isinstance(plan, str):
                raise self.refuse(plan, site)
            return plan.edits
        target = node
        if node.parent is not None and node.parent.type == "parenthesized_expression":
            target = node.parent
        return [Edit.replace(target, source.text_of(found.kept))]

    def _rotation_removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        """Drop the row rotation at every access of the array (no forward rule: a rotation is
        mined, not applied)."""
        statement = self.node_at(source, site)
        function = source.enclosing_function(statement)
        if function is None:
            raise self.refuse("the rotation is not in a function", site)
        try:
            return rotation_removal(source, function, statement)
        except NotInForm as why:
            raise self.refuse(str(why), site) from None

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        if site.detail.get("form") == ROTATION:
            return self._rotation_carrier(kernel.parsed, site)
        keys = ("mask", "row", "chunk", "pitch")
        values = {k: site.detail[k] for k in keys if k in site.detail}
        return Carrier(**values)

    def _rotation_carrier(self, source: ParsedSource, site: Site) -> Carrier:
        """``shift_rows`` when the rotation removed is the form the forward rule writes (one
        chunk every g rows); else nothing, and applying takes the default."""
        statement = self.node_at(source, site)
        function = source.enclosing_function(statement)
        if function is None:
            return Carrier()
        try:
            rotation, row_bytes = common_rotation(source, function, statement)
        except NotInForm:
            return Carrier()
        shift = canonical_shift(rotation, row_bytes)
        return Carrier(shift_rows=shift) if shift is not None else Carrier()

    def _rotation_application(
        self, source: ParsedSource, site: Site, carrier: Carrier
    ) -> list[Edit]:
        function = source.enclosing_function(site.start_byte)
        if function is None:
            raise self.refuse("the shared array is not in a function", site, "apply")
        shift = carrier.get_int("shift_rows")
        if shift is not None and shift < 1:
            raise self.refuse(f"shift_rows={shift} is not a positive row count", site, "apply")
        return rotation_application(source, function, str(site.detail["array"]), shift)

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == ROTATION:
            return self._rotation_application(source, site, carrier)
        function = source.enclosing_function(site.start_byte)
        if function is None or function.body is None:
            raise self.refuse("no helper here", site, "apply")
        params = [p.name for p in function.params if p.name]
        found = layout_params(source, function)
        row = carrier.get_str("row") or (found[0] if found else None)
        chunk = carrier.get_str("chunk") or (found[1] if found else None)
        mask = carrier.get_int("mask", DEFAULT_MASK) or DEFAULT_MASK
        if row not in params or chunk not in params or row == chunk:
            raise self.refuse(f"{function.name} has no row and chunk parameters", site, "apply")
        if mask & (mask + 1):
            raise self.refuse(f"mask={mask} is not 2^k - 1", site, "apply")
        if descriptors(source):  # wgmma reads the layout through descriptors: move both
            if mask != DEFAULT_MASK:
                raise self.refuse(f"mask={mask}: the descriptors' swizzle is mask 7", site, "apply")
            pitch = carrier.get_str("pitch") or str(ROW_BYTES)
            plan = application_plan(source, function, row, chunk, pitch)
            if isinstance(plan, str):
                raise self.refuse(plan, site, "apply")
            return plan.edits
        # a template helper is checked for every instantiation the file makes of it
        bindings = template_values(source, function.name) or [None]
        rows = [_chunks_per_row(source, function, row, chunk, b) for b in bindings]
        if any(chunks is None or chunks % (mask + 1) for chunks in rows):
            raise self.refuse(
                f"cannot tell that a row of {function.name}'s layout holds a multiple of "
                f"{mask + 1} chunks; the permuted chunk could leave its row",
                site,
                "apply",
            )
        uses = [
            n
            for n in source.iter_nodes("identifier", within=function.body)
            if source.text_of(n) == chunk
        ]
        if len(uses) != 1:
            raise self.refuse(
                f"{chunk} is used {len(uses)} times in {function.name}", site, "apply"
            )
        return [Edit.replace(uses[0], f"({chunk} ^ ({row} & {mask}))")]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        if site.detail.get("form") == ROTATION:
            return [
                Prose(
                    text=(
                        "every access of the shared array rotates the 16-byte chunks of its row "
                        "by the same row-dependent amount"
                    ),
                    why="a rotation of each row is a bijection only if writers and readers agree",
                )
            ]
        function = kernel.parsed.enclosing_function(site.start_byte)
        name = function.name if function is not None else "the layout"
        if descriptors(kernel.parsed):
            return [
                Prose(
                    text=(
                        f"{name} writes K-major tiles of 128-byte rows, each tile starts on a "
                        "1024-byte boundary, and the wgmma descriptors that read them are in "
                        "128-byte swizzle mode (mode 1, SBO 1024) with k16 steps of 32 bytes"
                    ),
                    why=(
                        "the hardware swizzle permutes by address bits 4-9, so the writers' XOR "
                        "matches it only on 1024-byte-aligned 8-row groups of 128-byte rows"
                    ),
                )
            ]
        return [
            Prose(
                text=f"every write and read of the swizzled buffer goes through {name}",
                why="a layout is a permutation only if both sides use it",
            )
        ]
