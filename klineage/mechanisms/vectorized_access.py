"""Vectorized loads and stores: one 16-, 8- or 4-byte access instead of several scalar ones.

A ``float4`` load moves four floats in one instruction (``LDG.128``), so a warp issues a
quarter of the memory instructions for the same bytes; ``uint4`` does the same for eight
bf16 or half values. The mechanism has two shapes.

**Single accesses** through a pointer to a vector type (``float4``, ``float2``, ``uint4``,
``uint2``, ``int4``, ``int2``, ``double2``, ``__half2``, ``__nv_bfloat162``), as expert
kernels write them: ``v = __ldg(row4 + c)``, ``a.raw = x16[c]``, ``out4[c] = make_float4(...)``,
and through the cache-hinted intrinsics public helpers use (``__ldcs(reinterpret_cast<const
int4*>(p))``, ``__stcs(reinterpret_cast<int4*>(p), bits)``; the intrinsics are
:mod:`klineage.mechanisms._vector_access_split`'s ``LOAD_INTRINSICS`` and ``STORE_INTRINSICS``).

- remove: the access becomes one scalar access per element, with the register value kept
  as it was, so the code around it does not change::

      __ldg(in4 + c)  ->  make_float4(__ldg(reinterpret_cast<const float*>(in4 + c)),
                                      __ldg(reinterpret_cast<const float*>(in4 + c) + 1), ...)
      out4[c] = v;    ->  { const float4 packed = v; float* elems =
                            reinterpret_cast<float*>(&out4[c]); elems[0] = packed.x; ... }
      __stcs(out4, v);  ->  { ...; __stcs(&elems[0], packed.x); ... }   (the hint kept)

  The same bytes are read and written, so the result is identical and no alignment is
  needed any more. Refused, with the reason, when the address has side effects (it is
  evaluated once per element), a load binds to a reference, or a store's value is used.
- apply: the reverse, on exactly those split forms.

**Elementwise code** in its canonical vectorized form (what ``apply`` writes):

- a loop ``for (int64_t c = S; c < n; c += K) body`` becomes a loop over ``n / W``
  vectors (same start and step) that loads each pointer accessed as ``p[c]`` once as a
  vector, runs the body for each of the ``W`` lanes on the lane's element, and stores the
  written pointers once; then the original loop over the tail ``n / W * W + S ..< n``.
  The names it declares (``c_vec``, ``c_lane``, ``p_vec``) live in the loops it writes, so
  every loop of a kernel takes the form (each pass over a row). With the carrier
  ``check=aligned`` the two loops sit behind a run-time test that every vectorized pointer
  is aligned to a vector, the original loop in the other branch: a row that starts
  misaligned (a row length not a multiple of the width) takes the scalar loop, so no
  alignment condition is needed. With ``check=peeled`` (pointers of one element size) the
  loop first runs the scalar elements before the first pointer's first aligned vector, then
  the vectors from there and the tail, behind a test that the other pointers share that
  misalignment (the loop as it was in the other branch): misaligned rows take vectors too.
  Retrieval asks for one of the two where a workload breaks alignment
  (:meth:`run_time_check`);
- a one-thread-per-element kernel (``i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n)
  return; ...``) gives each thread ``W`` consecutive elements: a vector path for full
  vectors and a scalar loop for the last partial one, and every launch's grid shrinks by
  ``W`` to match.

  remove turns the canonical form back into the scalar loop (or kernel and grid); it checks
  that the form is canonical by writing it again from the result and comparing, so a
  vector form it did not write is refused rather than guessed at.
- a lane loop of that kernel form whose lanes split their index into a row and a column
  (``t = i / D; h = i - t * D``) splits it once per vector when ``D % W == 0`` (``form=rows``,
  :mod:`klineage.mechanisms._vector_rows`): a vector's lanes then share one row.

Pointers are vectorized only when every use in the element code is ``p[c]`` at the
element's own index, outside any condition, and the pointer is not written; the others stay
scalar in each lane, which is always correct. Conditions: each vectorized pointer aligned to
the vector's bytes (the harness's buffers are; row offsets need the row length divisible by
the width: :class:`~klineage.conditions.AxisDivisible`), and for a loop, that its start
values across threads are ``0..K-1`` (prose, when not recognizable).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Literal

from klineage.conditions import (
    AxisDivisible,
    Condition,
    PointerAlignment,
    merge_conditions,
)
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._local_util import (
    ELEMENT_SIZES,
    ElementKernel,
    Refused,
    alignment_conditions,
    alignment_of_sum,
    element_kernels,
    grid_edits,
    names_in_function,
    statements,
)
from klineage.mechanisms._vector_access_split import (
    merged_text,
    split_forms,
    split_text,
    vector_accesses,
)
from klineage.mechanisms._vector_forms import VectorKernel, VectorLoop, vector_kernels, vector_loops
from klineage.mechanisms._vector_header_helpers import header_helper_calls
from klineage.mechanisms._vector_lanes import split_lanes
from klineage.mechanisms._vector_loops import (
    checked_loop_text,
    element_plan,
    kernel_text,
    loop_nodes,
    loop_refusal,
    loop_text,
    partition_prose,
    peeled_loop_text,
    scalar_loop,
)
from klineage.mechanisms._vector_plans import (
    CHECK_ALIGNED,
    CHECK_PEELED,
    CHECKS,
    default_width,
    plan_vectorization,
)
from klineage.mechanisms._vector_rows import RowsForm, rows_forms, rows_text
from klineage.mechanisms._vector_scan import VECTORS
from klineage.mechanisms._vector_scan_forms import (
    VectorScan,
    scan_loop,
    vector_scan_edit,
    vector_scans,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

SCAN = "scan"
"""The form of a chunked warp scan (:mod:`klineage.mechanisms._vector_scan`)."""

ROWS = "rows"
"""The form of lanes split by row once a vector (:mod:`klineage.mechanisms._vector_rows`)."""

Form = Literal["loop", "kernel", "load", "store"]


def _run_time_check(source: ParsedSource, site: Site) -> str:
    """``peeled`` for a scalar loop whose vectorized pointers share one element size (so one
    count of scalar elements aligns them all), else ``aligned``."""
    node = next((n for n in source.nodes("for_statement") if n.start_byte == site.start_byte), None)
    loop = scalar_loop(source, node) if node is not None else None
    function = source.enclosing_function(site.start_byte)
    if loop is None or function is None:
        return CHECK_ALIGNED
    try:
        plan = plan_vectorization(source, function, loop.var, loop_nodes(loop))
    except Refused:
        return CHECK_ALIGNED
    return CHECK_PEELED if len({p.size for p in plan.pointers}) == 1 else CHECK_ALIGNED


@register
class VectorizedAccess(Mechanism):
    name = "vectorized_access"
    category = "memory"
    signature = ("global_width",)
    family = "vectorized loads and stores"
    intent = (
        "Move several elements per memory instruction (float4, uint4 of 8 bf16, half2) so a "
        "warp issues fewer, wider loads and stores for the same bytes."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "vector_width": "elements per access (2, 4, or 8 for 16-byte accesses of 2-byte "
        "types); default: 16 bytes of the widest element",
        "check": f"'{CHECK_ALIGNED}': a loop tests its pointers' alignment at run time and "
        f"keeps the scalar loop for the rest; '{CHECK_PEELED}': a loop runs scalar elements "
        "until its pointers are aligned, then vectors (either: no alignment condition); "
        "default: none",
    }

    # -- detection ------------------------------------------------------------------------------

    def _canonical(self, source: ParsedSource) -> tuple[list[VectorLoop], list[VectorKernel]]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "canonical" not in cache:
            cache["canonical"] = (vector_loops(source), vector_kernels(source))
        result: tuple[list[VectorLoop], list[VectorKernel]] = cache["canonical"]
        return result

    def _rows(self, source: ParsedSource) -> list[RowsForm]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "rows" not in cache:
            cache["rows"] = rows_forms(source)
        result: list[RowsForm] = cache["rows"]
        return result

    def _scans(self, source: ParsedSource) -> list[VectorScan]:
        cache = source.__dict__.setdefault("_klineage_vectorized", {})
        if "scans" not in cache:
            cache["scans"] = vector_scans(source)
        result: list[VectorScan] = cache["scans"]
        return result

    def _spans(self, source: ParsedSource) -> list[tuple[int, int]]:
        loops, kernels = self._canonical(source)
        return (
            [v.region for v in loops]
            + [(k.decl.start_byte, k.end.end_byte) for k in kernels]
            + [(s.node.start_byte, s.node.end_byte) for s in self._scans(source)]
        )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        loops, kernels = self._canonical(source)
        for loop in loops:
            detail: dict[str, str | int] = {"form": "loop", "width": loop.width}
            if loop.guard is not None:
                detail["check"] = loop.check
            yield self.site(source, loop.guard or loop.vector, span=loop.region, detail=detail)
        rows = self._rows(source)
        for found in kernels:
            span = (found.decl.start_byte, found.end.end_byte)
            split = any(span[0] <= r.node.start_byte < span[1] for r in rows)
            yield self.site(
                source,
                found.decl,
                span=span,
                detail={"form": "kernel", "width": found.width, "kernel": found.function.name},
                refusal="its lanes split their row once a vector (form rows): remove that first"
                if split
                else None,
            )
        for row in rows:
            yield self.site(source, row.node, detail={"form": ROWS, "width": row.width})
        for scan in self._scans(source):
            yield self.site(source, scan.node, detail={"form": SCAN, "width": scan.width})
        for access in vector_accesses(source, self._spans(source)):
            yield self.site(
                source,
                access.node,
                detail={
                    "form": access.kind,
                    "access": access.form,
                    "vector": access.vector.name,
                    "width": access.vector.count,
                },
                refusal=access.refusal,
            )
        for through in header_helper_calls(source):
            yield self.site(
                source,
                through.call,
                detail={
                    "form": through.helper.kind,
                    "access": "header_helper",
                    "helper": through.helper.name,
                    "bytes": through.helper.bytes,
                },
                refusal=through.refusal,
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        spans = self._spans(source)
        for node in source.nodes("for_statement"):
            if any(start <= node.start_byte < end for start, end in spans):
                continue
            site = self._loop_candidate(source, node) or self._scan_candidate(source, node)
            if site is not None:
                yield site
        for element in element_kernels(source):
            if any(start <= element.start_byte < end for start, end in spans):
                continue
            site = self._kernel_candidate(source, element)
            if site is not None:
                yield site
        yield from self._rows_candidates(source)
        for split in split_forms(source):
            yield self.site(
                source,
                split.node,
                detail={"form": split.kind, "access": split.form, "vector": split.vector.name},
            )

    def _loop_candidate(self, source: ParsedSource, node: Node) -> Site | None:
        loop = scalar_loop(source, node)
        function = source.enclosing_function(node)
        if loop is None or function is None or not function.runs_on_device:
            return None
        try:
            plan = plan_vectorization(source, function, loop.var, loop_nodes(loop))
        except Refused:
            return None
        if not plan.pointers:
            return None
        refusal = loop_refusal(source, loop)
        header = source.snippet((node.start_byte, loop.body.start_byte)).rstrip(" {")
        detail: dict[str, str | int] = {
            "form": "loop",
            "pointers": ",".join(p.name for p in plan.pointers),
        }
        return self.site(source, node, snippet=header, detail=detail, refusal=refusal)

    def _rows_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Lane loops of canonical vector kernels whose lanes split their index by row."""
        _, kernels = self._canonical(source)
        rows = self._rows(source)
        for found in kernels:
            span = (found.decl.start_byte, found.end.end_byte)
            if any(span[0] <= r.node.start_byte < span[1] for r in rows):
                continue
            for node in source.nodes("for_statement"):
                if not span[0] <= node.start_byte < span[1]:
                    continue
                try:
                    lanes = split_lanes(source, node)
                except NotInForm:
                    continue
                header = source.snippet((node.start_byte, lanes.loop.end_byte), 60)
                yield self.site(
                    source, node, snippet=header, detail={"form": ROWS, "width": lanes.width}
                )

    def _scan_candidate(self, source: ParsedSource, node: Node) -> Site | None:
        try:
            scan = scan_loop(source, node)
        except NotInForm:
            return None
        header = source.snippet((node.start_byte, scan.loop.child_by_field_name("body").start_byte))
        pointers = f"{scan.source_pointer},{scan.target_pointer}"
        return self.site(
            source, node, snippet=header.rstrip(" {"), detail={"form": SCAN, "pointers": pointers}
        )

    def _kernel_candidate(self, source: ParsedSource, element: ElementKernel) -> Site | None:
        try:
            plan = element_plan(source, element)
        except Refused:
            return None
        if not plan.pointers:
            return None
        detail: dict[str, str | int] = {
            "form": "kernel",
            "kernel": element.function.name,
            "pointers": ",".join(p.name for p in plan.pointers),
        }
        return self.site(
            source,
            element.decl,
            span=(element.start_byte, element.end_byte),
            snippet=f"{element.function.name}: {source.snippet(element.decl)}",
            detail=detail,
        )

    # -- removal ---------------------------------------------------------------------------

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        form = site.detail.get("form")
        span = (site.start_byte, site.end_byte)
        loops, kernels = self._canonical(source)
        if form == "loop":
            loop = next(v for v in loops if v.region == span)
            return [Edit(span[0], span[1], loop.scalar)]
        if form == "kernel":
            found = next(k for k in kernels if (k.decl.start_byte, k.end.end_byte) == span)
            try:
                grids = grid_edits(source, found.function, found.bound, 1)
            except Refused as refused:
                raise self.refuse(str(refused), site) from refused
            return [Edit(span[0], span[1], found.scalar)] + [Edit.replace(n, t) for n, t in grids]
        if form == SCAN:
            scan = next(s for s in self._scans(source) if s.node.start_byte == span[0])
            return [Edit(span[0], span[1], scan.scalar)]
        if form == ROWS:
            row = next(r for r in self._rows(source) if r.node.start_byte == span[0])
            return [Edit(span[0], span[1], row.original)]
        access = next(
            a
            for a in vector_accesses(source, self._spans(source))
            if (a.node.start_byte, a.node.end_byte) == span
        )
        function = source.enclosing_function(access.node)
        assert function is not None
        names = names_in_function(source, function)
        return [Edit.replace(access.node, split_text(source, access, names))]

    # -- application -----------------------------------------------------------------------

    def _width(self, carrier: Carrier, fallback: int, site: Site) -> int:
        width = carrier.get_int("vector_width", fallback)
        assert width is not None
        if width < 2:
            raise self.refuse(f"vector_width={width} is not a vector", site, "apply")
        return width

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        form = site.detail.get("form")
        try:
            if form == "loop":
                return self._apply_loop(source, site, carrier)
            if form == "kernel":
                return self._apply_kernel(source, site, carrier)
            if form == SCAN:
                node = self.node_at(source, site, "for_statement")
                width = self._width(carrier, max(VECTORS), site)
                return [vector_scan_edit(source, node, width)]
            if form == ROWS:
                lanes = split_lanes(source, self.node_at(source, site, "for_statement"))
                return [Edit(lanes.start, lanes.loop.end_byte, rows_text(source, lanes))]
        except (Refused, NotInForm) as refused:
            raise self.refuse(str(refused), site, "apply") from refused
        split = next(
            s for s in split_forms(source) if (s.node.start_byte, s.node.end_byte) == (
                site.start_byte, site.end_byte
            )
        )  # fmt: skip
        width = self._width(carrier, split.vector.count, site)
        if width != split.vector.count:
            raise self.refuse(
                f"this split {split.vector.name} access has {split.vector.count} elements, "
                f"not vector_width={width}",
                site,
                "apply",
            )
        return [Edit.replace(split.node, merged_text(source, split))]

    def _apply_loop(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        node = self.node_at(source, site, "for_statement")
        loop = scalar_loop(source, node)
        function = source.enclosing_function(node)
        assert loop is not None and function is not None
        plan = plan_vectorization(source, function, loop.var, loop_nodes(loop))
        width = self._width(carrier, default_width(plan), site)
        check = carrier.get_str("check", "")
        if check not in ("", *CHECKS):
            raise self.refuse(f"check={check!r} is not one of {CHECKS}", site, "apply")
        if check == CHECK_ALIGNED:
            return [Edit.replace(node, checked_loop_text(source, loop, plan, width))]
        if check == CHECK_PEELED:
            return [Edit.replace(node, peeled_loop_text(source, loop, plan, width))]
        return [Edit.replace(node, loop_text(source, loop, plan, width))]

    def _apply_kernel(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        element = next(e for e in element_kernels(source) if e.start_byte == site.start_byte)
        plan = element_plan(source, element)
        width = self._width(carrier, default_width(plan), site)
        text = kernel_text(source, element, plan, width)
        grids = grid_edits(source, element.function, element.bound, width)
        return [Edit(element.start_byte, element.end_byte, text)] + [
            Edit.replace(n, t) for n, t in grids
        ]

    # -- carriers and conditions -----------------------------------------------------------

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        width = site.detail.get("width")
        carrier = Carrier(vector_width=width) if isinstance(width, int) else Carrier()
        check = site.detail.get("check")
        if check in CHECKS:
            carrier = carrier.merged(Carrier(check=check))
        return carrier

    def run_time_check(
        self, kernel: KernelSource, site: Site, condition: Condition
    ) -> Carrier | None:
        """A loop's alignment (and the row length that keeps it) is handled at run time: a
        misaligned row is peeled to alignment (``check=peeled``) where one peel can align
        every vectorized pointer, else it takes the scalar loop (``check=aligned``)."""
        if site.detail.get("form") == "loop" and isinstance(
            condition, (PointerAlignment, AxisDivisible)
        ):
            return Carrier(check=_run_time_check(kernel.parsed, site))
        return None

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        form = site.detail.get("form")
        function = source.enclosing_function(site.start_byte)
        if function is None:
            return []
        if form in ("loop", "kernel"):
            return self._form_conditions(source, function, site)
        if form in (SCAN, ROWS):
            return []  # the vector path (the shared row) is checked on the device
        return self._access_conditions(source, function, site)

    def _form_conditions(
        self, source: ParsedSource, function: Function, site: Site
    ) -> list[Condition]:
        """Alignment of every vectorized pointer (and, for a loop, how it splits the work),
        read from the scalar form: the candidate itself, or what a detected site removes to."""
        form = site.detail.get("form")
        width = site.detail.get("width")
        span = (site.start_byte, site.end_byte)
        loops, kernels = self._canonical(source)
        scalars = [v.scalar for v in loops if v.region == span]
        scalars += [k.scalar for k in kernels if (k.decl.start_byte, k.end.end_byte) == span]
        if scalars:
            data = source.data
            text = data[: span[0]] + scalars[0].encode("utf-8") + data[span[1] :]
            source = KernelSource(text.decode("utf-8"), name=source.kernel.name).parsed
        function = source.enclosing_function(span[0]) or function
        found: list[Condition] = []
        try:
            if form == "loop":
                node = next(n for n in source.nodes("for_statement") if n.start_byte == span[0])
                loop = scalar_loop(source, node)
                assert loop is not None
                plan = plan_vectorization(source, function, loop.var, loop_nodes(loop))
                found += partition_prose(source, function, loop)
            else:
                element = next(e for e in element_kernels(source) if e.start_byte == span[0])
                plan = element_plan(source, element)
        except (Refused, StopIteration):
            return []
        chosen = width if isinstance(width, int) else default_width(plan) if plan.pointers else 1
        if site.detail.get("check") in CHECKS:
            return merge_conditions(found)  # alignment is tested at run time
        for pointer in plan.pointers:
            first = pointer.accesses()[0].child_by_field_name("argument")
            assert first is not None
            found += alignment_conditions(source, function, first, pointer.size * chosen)
        return merge_conditions(found)

    def _access_conditions(
        self, source: ParsedSource, function: Function, site: Site
    ) -> list[Condition]:
        span = (site.start_byte, site.end_byte)
        accesses = [
            a
            for a in vector_accesses(source, self._spans(source))
            if (a.node.start_byte, a.node.end_byte) == span
        ]
        if accesses:
            access = accesses[0]
            vector, node, subscript = access.vector, access.address_node, access.subscript
        else:
            split = next(
                (s for s in split_forms(source) if (s.node.start_byte, s.node.end_byte) == span),
                None,
            )
            if split is None:
                return []
            vector, node, subscript = split.vector, split.address, None
        size = vector.count * ELEMENT_SIZES[vector.element]
        if subscript is not None:
            base = subscript.child_by_field_name("argument")
            indices = subscript.child_by_field_name("indices")
            offset = statements(indices)[0] if indices is not None else None
            if base is not None and offset is not None:
                return merge_conditions(alignment_of_sum(source, function, base, offset, size))
        if node is None:
            return []  # a macro's access to a local's address: aligned as the local is declared
        return merge_conditions(alignment_conditions(source, function, node, size))
