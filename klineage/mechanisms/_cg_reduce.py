"""The cooperative-groups form of a warp-shuffle reduction: ``cg::reduce(warp, v, op)``.

``cg::reduce`` over a 32-thread tile is a shuffle butterfly the library writes for you; every
lane gets the reduction. Its removal keeps the expression and changes how it is computed: the
call becomes a call of a ``__device__`` helper that reduces through a ``__shared__`` row per
warp, ``__syncwarp()``-separated, in exactly the exchange form
:mod:`klineage.mechanisms._reductions_exchange` writes and reads::

    v = cg::reduce(warp, v, cg::plus<float>{});
    ->
    v = klineage_warp_reduce_plus_float(v);   // a 5-step xor butterfly through shared memory

so the forward direction is the catalog's own: applying ``warp_shuffle_reduction`` at the
helper's exchange loop gives the shuffle butterfly back. Operators: ``cg::plus``,
``cg::greater``, ``cg::less`` (with their type argument) and a ``__device__`` function of two
values of its return type (``reduce_sum_max_op``). Refused, with the form: a tile that is not
32 threads, a group the analysis does not know, an operator it cannot name a type for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from klineage.cuda.analysis import analysis
from klineage.cuda.analysis.cooperative_groups import CgReduce
from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.cuda.tree import WARP_SIZE, NotInForm
from klineage.mechanisms._reductions_exchange import BUFFER, HEADER_LINES, LANE, WARP

__all__ = ["CgReduction", "cg_reductions", "helper_name", "removal_edits"]

HELPER_PREFIX = "klineage_warp_reduce_"
_COMBINE = {
    "sum": "{a} + {b}",
    "max": "({b} > {a} ? {b} : {a})",
    "min": "({b} < {a} ? {b} : {a})",
}


@dataclass(frozen=True)
class CgReduction:
    """One ``cg::reduce`` call, with what its rewrite needs (or why there is none)."""

    call: CgReduce
    value_type: str | None
    combine: str | None
    """The combining expression over ``{a}`` and ``{b}``."""
    refusal: str | None


def _operator_type(source: ParsedSource, reduce: CgReduce) -> str | None:
    """The type the reduction works on: ``cg::plus<float>`` -> float; a device function's
    return type."""
    if reduce.op != "custom":
        match = re.search(r"<\s*([\w:\s]+?)\s*>", source.text_of(reduce.op_node))
        return " ".join(match.group(1).split()) if match is not None else None
    operator = source.function(reduce.op_name)
    if operator is None or len(operator.params) != 2:
        return None
    declarator_start = operator.declarator.start_byte
    head = source.text_of((operator.node.start_byte, declarator_start))
    words = [w for w in head.split() if not w.startswith("__") and w not in ("static", "inline")]
    return " ".join(words) if words else None


def _describe(reduce: CgReduce) -> str:
    group = reduce.group
    if group is None:
        return "a cg::reduce over a group the analysis does not know"
    if group.kind != "tile":
        return f"a cg::reduce over a {group.kind} group"
    return f"a cg::reduce over a tile of {group.size} threads"


def cg_reductions(source: ParsedSource) -> list[CgReduction]:
    """Every ``cg::reduce`` call in device code, analysed."""
    found = []
    for reduce in analysis(source).cooperative_groups.reduces:
        group = reduce.group
        value_type = _operator_type(source, reduce)
        refusal = None
        if group is None or group.kind != "tile" or group.size != WARP_SIZE:
            refusal = str(NotInForm(_describe(reduce), "a cg::reduce over a 32-thread tile"))
        elif value_type is None:
            refusal = str(
                NotInForm(
                    f"a cg::reduce with the operator {reduce.op_name}",
                    "cg::plus/greater/less<T> or a __device__ function of two values",
                )
            )
        combine = _COMBINE.get(reduce.op, reduce.op_name + "({a}, {b})")
        found.append(CgReduction(reduce, value_type, combine, refusal))
    return found


def helper_name(reduction: CgReduction) -> str:
    assert reduction.value_type is not None
    op = reduction.call.op if reduction.call.op != "custom" else reduction.call.op_name
    kind = re.sub(r"\W+", "_", f"{op}_{reduction.value_type}").strip("_")
    return HELPER_PREFIX + kind


def _helper_text(reduction: CgReduction, name: str) -> str:
    assert reduction.value_type is not None and reduction.combine is not None
    value_type = reduction.value_type
    combined = reduction.combine.format(a="value", b=f"{BUFFER}[{WARP}][{LANE} ^ offset]")
    header = "\n".join(f"  {line}" for line in HEADER_LINES)
    return (
        f"// klineage: {reduction.call.op_name} over a warp (was cg::reduce), through shared "
        "memory\n"
        f"__device__ {value_type} {name}({value_type} value) {{\n"
        f"{header}\n"
        f"  __shared__ {value_type} {BUFFER}[32][32];\n"
        "  for (int offset = 16; offset > 0; offset >>= 1) {\n"
        f"    {BUFFER}[{WARP}][{LANE}] = value;\n"
        "    __syncwarp();\n"
        f"    value = {combined};\n"
        "    __syncwarp();\n"
        "  }\n"
        "  return value;\n"
        "}\n\n"
    )


def removal_edits(source: ParsedSource, reduction: CgReduction) -> list[Edit]:
    """The call replaced by the exchange helper's (inserted before the function once)."""
    if reduction.refusal is not None:
        raise NotInForm(_describe(reduction.call), "a cg::reduce over a 32-thread tile")
    name = helper_name(reduction)
    value = source.text_of(reduction.call.value)
    edits = [Edit.replace(reduction.call.node, f"{name}({value})")]
    if source.function(name) is None:
        outer = reduction.call.function.outer
        edits.append(Edit.insert(outer.start_byte, _helper_text(reduction, name)))
    return edits
