"""Register outer products: a thread that computes several outputs loads each operand value
once per reduction step and accumulates it into every output it feeds.

A thread computing an ``M x N`` block of dot products can run them one after another (each
output its own pass over the reduction, re-reading both operands: ``2·M·N`` loads a step) or
interchange the loops: per step, ``M`` values of one operand and ``N`` of the other into
registers, then the ``M·N`` products (``M + N`` loads a step). The outputs per thread are the
same in both; what changes is how often each load is used.

- detect: an accumulation ``A[i][j] += x[i] * y[j]`` (or ``fmaf``; a flat mixed-radix index
  such as ``A[(w * TM + m) * (WN * TN) + v * TN + n]``; one output loop with a scalar,
  ``A[i] += x[i] * s``) over up to four counted output loops (constant trips, or trips of
  template parameters and ``constexpr`` locals), inside a reduction loop whose turn loads at
  least one factor's value: register arrays filled by counted loops (declared in the turn,
  before the loops, or received from a caller that only passes them) or scalars declared in
  the turn (``_outer_product``). Also a helper that only computes the products for its
  caller's loop, whose other calls fill the registers (``_outer_product_helpers``): read
  with those calls written out in the loop (``_outer_product_inline``);
- remove: interchange back: each output sums over the reduction into a scalar that starts
  from and goes back to its accumulator, reading its operands where the registers were loaded
  from (offsets the turn, a fill loop or an output declares move with it). No loop is
  unrolled that was not. Refused, with the form found, when the turn holds anything else, a
  value has side effects or reads what the moved loops would shadow, or the reduction writes
  other state. In the helper form, the helpers no call reaches any more are deleted;
- apply: the inverse on two counted output loops whose inner body sums ``v += X * Y`` over a
  reduction and then uses ``v``, ``X`` reading the row and ``Y`` the column
  (``_outer_product_forward``): a register tile of sums, per reduction step a register array
  of each operand and their outer product, then each output takes its sum. Also on what
  the removal leaves of a tile (one to four output loops, each sum started from and
  stored back into its accumulator element, ``_outer_product_forward_tile``): per turn,
  each factor over its own output loops into a register array (one register for a factor
  that reads none), then the products into the accumulator. Carrier ``first``/``second``
  name the register arrays.

Each output's sum runs over the reduction in the same order in both forms, so results are
the same bits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from klineage.conditions import Condition, Prose
from klineage.cuda.edit import Edit, edits_between
from klineage.cuda.source import ParsedSource
from klineage.cuda.tree import NotInForm, one_line
from klineage.kernel import KernelSource
from klineage.mechanisms._outer_product import (
    OuterProduct,
    factor_cache,
    looks_cached,
    read_caches,
    shape,
)
from klineage.mechanisms._outer_product_forms import loop_header
from klineage.mechanisms._outer_product_forward import Sums, application, check, sums
from klineage.mechanisms._outer_product_forward_tile import sides, tile_application, tile_sums
from klineage.mechanisms._outer_product_helpers import FORM as HELPER_FORM
from klineage.mechanisms._outer_product_helpers import helper_products
from klineage.mechanisms._outer_product_inline import inlined_product, removed_through_inlining
from klineage.mechanisms._outer_product_removal import removal
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem


def _products(source: ParsedSource) -> Iterator[OuterProduct]:
    for function in source.functions:
        if not function.runs_on_device or function.body is None:
            continue
        for statement in source.iter_nodes("expression_statement", within=function.body):
            product = shape(source, function, statement)
            if product is not None and looks_cached(source, product):
                yield product


@register
class RegisterOuterProduct(Mechanism):
    name = "register_outer_product"
    category = "memory"
    family = "registers vs re-reads"
    intent = (
        "Accumulate a thread's block of outputs as outer products of operand values loaded "
        "once per reduction step into registers, instead of a dot product per output that "
        "re-reads both operands."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "first": "name of the register array for the first factor's values",
        "second": "name of the register array for the second factor's values",
    }

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for product in _products(source):
            refusal = None
            try:
                read_caches(source, product)
            except NotInForm as err:
                refusal = str(err)
            top = product.top
            yield self.site(
                source,
                top,
                snippet=f"{loop_header(source, top)} {{ ... "
                f"{one_line(source, product.update.statement, 60)} }}",
                detail={
                    "accumulator": product.update.accumulator,
                    "outputs": " x ".join(str(o.trip or o.bound) for o in product.outputs),
                },
                refusal=refusal,
            )

        for helper in helper_products(source):
            refusal = None
            try:
                inlined_product(source, helper)
            except NotInForm as err:
                refusal = f"{HELPER_FORM}, and inlined, {err}"
            yield self.site(
                source,
                helper.outer,
                snippet=f"{loop_header(source, helper.outer)} {{ ... "
                f"{one_line(source, helper.update.statement, 60)} }}",
                detail={
                    "accumulator": helper.update.accumulator,
                    "outputs": " x ".join(str(o.trip or o.bound) for o in helper.outputs),
                    "inlined": "yes",
                },
                refusal=refusal,
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for function in source.functions:
            if not function.runs_on_device or function.body is None:
                continue
            for loop in source.iter_nodes("for_statement", within=function.body):
                form = sums(source, function, loop) or tile_sums(source, function, loop)
                if form is None:
                    continue
                try:
                    check(source, form) if isinstance(form, Sums) else sides(source, form)
                except NotInForm:
                    continue
                yield self.site(
                    source,
                    loop,
                    snippet=f"{loop_header(source, loop)} {{ ... "
                    f"{one_line(source, form.update, 60)} }}",
                    detail={"sum": form.total},
                )

    def _product_at(self, source: ParsedSource, site: Site) -> tuple[ParsedSource, OuterProduct]:
        """The product at a site, in the source it is read in: the file, or for an outer
        product a helper computes, the file with its caller's loop inlined."""
        top = self.node_at(source, site, "for_statement")
        for product in _products(source):
            if product.top == top:
                read_caches(source, product)
                return source, product
        for helper in helper_products(source):
            if helper.outer == top:
                inlining = inlined_product(source, helper)
                return inlining.source, inlining.product
        raise self.refuse(f"no outer-product accumulation at {site}", site)

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        top = self.node_at(source, site, "for_statement")
        helper = next((h for h in helper_products(source) if h.outer == top), None)
        if helper is None:
            return removal(source, self._product_at(source, site)[1])
        original = source.text_of((0, len(source.data)))
        return edits_between(original, removed_through_inlining(source, helper))

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        source, product = self._product_at(kernel.parsed, site)
        caches = [factor_cache(source, product, f) for f in product.update.factors]
        names = [c.name if c is not None else None for c in caches]
        values = dict(zip(("first", "second"), names, strict=True))
        return Carrier(**{k: v for k, v in values.items() if v is not None})

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        if function is None:
            raise self.refuse(f"no per-output sums at {site}", site, "apply")
        names = (carrier.get_str("first"), carrier.get_str("second"))
        form = sums(source, function, loop)
        if form is not None:
            start, end, text = application(source, form, names)
            return [Edit(start, end, text)]
        tile = tile_sums(source, function, loop)
        if tile is None:
            raise self.refuse(f"no per-output sums at {site}", site, "apply")
        start, end, text = tile_application(source, tile, names)
        return [Edit(start, end, text)]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text="the output loops have compile-time trip counts and are unrolled, so the "
                "accumulators and the loaded values stay in registers (M·N + M + N of them)"
            ),
            Prose(
                text="each output's sum runs over the reduction in the same order, so the "
                "results are bitwise the same; a value loaded once serves every output of its "
                "row or column"
            ),
        ]
