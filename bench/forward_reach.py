"""Forward reach of the catalog: for every mechanism, on which held-out naive kernels its forward
`apply` offers candidate sites (and writes a kernel there), and why not on the others.

    python bench/forward_reach.py [--out bench/results/forward_reach.json] [--markdown FILE]

CPU only: candidates and rewrites are parsing and splicing, nothing is built or run. Per
mechanism and kernel, one of:
- `applies`: candidate sites whose `apply` (default carrier) wrote a kernel;
- `refused`: candidate sites, every one refused: the refusal (a site's or `apply`'s);
- `no site`: no candidate at all: the form the forward rule looks for, which the kernel lacks
  (or, for a mechanism with no forward rule, why it has none).

Chained reach (depth 2): a skill may need another's carrier first (padding needs the shared
tiles a staging rewrite writes). For every mechanism that applies at
depth 1, its child (first site it wrote, default carrier) is tried with every mechanism that
did not reach that kernel at depth 1; the first parent whose child it applies on is recorded.
Where it reaches neither way, the first parent whose child holds more of its detected sites
than the naive kernel is recorded too: the parent wrote the optimization itself (block_per_row
writes its reduction with shuffles), so there is nothing left for the rule to apply. A
mechanism that reaches a kernel at depth 1 may still have a form of its rule that only a child
offers (thread_coarsening's register micro-tile needs smem_staging's tiles): the first parent
whose child it applies on at a site of a form (``Site.detail["form"]``) the naive kernel does
not offer is recorded with that form.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from klineage.kernel import KernelSource  # noqa: E402
from klineage.mechanisms import Mechanism, MechanismRefused, all_mechanisms  # noqa: E402
from klineage.mechanisms.base import DetectOnly  # noqa: E402

HELDOUT = REPO / "heldout"
DEFAULT_OUT = REPO / "bench" / "results" / "forward_reach.json"

# What each forward rule looks for, in a line: the reason a kernel without it offers no site.
# Read from each mechanism module's description of `apply`.
FORWARD_FORMS: dict[str, str] = {
    "block_per_row": "a thread-per-row kernel whose loops reduce a float (sum, max, min) or "
    "write its running sum",
    "block_tiling": "a Hopper wgmma tile covering the whole N extent (other re-tilings are "
    "refused)",
    "candidate_filtering": "a general-path call ending a device function, with the fast path "
    "in the carrier",
    "cp_async_pipeline": "a canonical shared-memory staged tile loop (or a cp.async this "
    "mechanism made synchronous)",
    "fast_math": "a call of expf, logf, sinf, cosf, powf, a float division or 1/sqrtf in "
    "device code",
    "grid_stride_loop": "a one-thread-per-element kernel",
    "launch_bounds": "a kernel without __launch_bounds__",
    "launch_size_dispatch": "a dispatch removed earlier whose specialized kernels are still "
    "in the file (a new dispatch needs kernels only a person writes)",
    "ldmatrix": "an ldmatrix this mechanism emulated earlier",
    "online_softmax": "a max pass followed by a sum-of-exponentials pass over the same row",
    "packed_half2_math": "a loop over c converting half/bf16 elements p[c] to float on every "
    "turn, or two adjacent statements doing one scalar half/bf16 operation on a pair's halves",
    "pragma_unroll": "a for loop directly in a block of device code, without a pragma",
    "rasterization": "a kernel reading blockIdx.x and blockIdx.y (a 2-D grid of tiles) without "
    "an order of its own, or the reads a rasterization removal marked",
    "readonly_ldg": "a read through a const pointer in device-only code",
    "register_fragment_streaming": "none: no forward rule",
    "restrict_pointers": "a __global__ pointer parameter without __restrict__",
    "register_outer_product": "two counted output loops (compile-time trips) whose inner "
    "body sums v += X * Y over a reduction and then uses v, X reading the row and Y the column",
    "row_in_registers": "two or more passes over a row p[c] with one loop header (start never "
    "negative, a constant or block-dimension step, bound the same for every thread), or a row "
    "load repeated word for word before a later pass",
    "smem_histogram": "a kernel whose only use of a global pointer is as an atomicAdd target",
    "smem_padding": "a multi-dimensional static __shared__ array (or a pitch constant) "
    "without padding",
    "smem_staging": "a blocked dot-product loop without staging, a naive one-thread-per-"
    "output GEMM, a naive transpose (y[i] from one read of x that scales i % D), vectors every "
    "row reads at a loop's index alone, or a row a block or warp loaded again by a later pass",
    "smem_swizzle": "a swizzle helper without its XOR, a wgmma descriptor tile, or a 2-D shared "
    "array whose every access wraps its column at the row unrotated",
    "split_k": "a split count's '= 1' declaration whose choice a removal deleted (a new split "
    "needs a workspace only a person writes)",
    "tensor_core_mma": "a staged tile product of 16-bit operands (what smem_staging writes on a "
    "half GEMM), or an mma this mechanism emulated earlier",
    "thread_coarsening": "a one-thread-per-element kernel with its launch in the file",
    "vectorized_access": "an elementwise loop, a split (scalar) access in the canonical form, "
    "or a warp scan one float a lane a turn",
    "warp_ballot_compaction": "'P ? atomicAdd(C, 1) : R' reached by every lane of a warp",
    "warp_per_row": "a thread-per-row kernel whose loops reduce a float (sum, max, min)",
    "warp_shuffle_reduction": "a shared-memory tree-reduction step in the exchange form, or a "
    "block halving loop over a shared buffer",
    "warp_shuffle_scan": "a shared-memory scan step in the exchange form, or a thread-per-row "
    "running sum stored every turn",
    "warp_tiling": "a block-wide thread grid (row = t / NC, col = t % NC, t the linear "
    "thread index) that places a SIMT kernel's outputs, in a file without warp-collective "
    "operations",
}

Outcome = Literal["applies", "refused", "no site"]


class Reach(BaseModel):
    """What one mechanism's forward rule makes of one held-out naive kernel."""

    problem: str = Field(description="the held-out folder's name")
    outcome: Outcome = Field(description="applies, refused or no site")
    sites: int = Field(description="candidate sites offered without a refusal")
    applied: int = Field(description="of those, the sites where apply wrote a kernel")
    why_not: str = Field(default="", description="the refusal, or the form the kernel lacks")


class ChainedReach(BaseModel):
    """A kernel a mechanism reaches only on another mechanism's child."""

    problem: str = Field(description="the held-out folder's name")
    parent: str = Field(description="the mechanism whose child it applies on (first in order)")


class ChainedForm(BaseModel):
    """A form of a mechanism's rule that applies on a kernel only after another's rewrite."""

    problem: str = Field(description="the held-out folder's name")
    parent: str = Field(description="the mechanism whose child it applies on (first in order)")
    form: str = Field(description="the site's form (its detail's `form`)")


class MechanismReach(BaseModel):
    """One mechanism over every held-out kernel."""

    mechanism: str = Field(description="the catalog name")
    forward_rule: bool = Field(description="False for a detect-only mechanism")
    reaches: list[str] = Field(description="held-out problems where apply wrote a kernel")
    reaches_after: list[ChainedReach] = Field(
        default_factory=list,
        description="held-out problems reached only on a depth-1 child, with its parent",
    )
    written_by: list[ChainedReach] = Field(
        default_factory=list,
        description="held-out problems reached neither way whose depth-1 child holds new "
        "sites of it, with the parent that wrote them",
    )
    forms_after: list[ChainedForm] = Field(
        default_factory=list,
        description="held-out problems reached at depth 1 where a depth-1 child offers a form "
        "of the rule the naive kernel does not, and it applies there",
    )
    kernels: list[Reach] = Field(description="one per held-out problem, in folder order")


def reach_of(mechanism: Mechanism, problem: str, kernel: KernelSource) -> Reach:
    """Candidates of `mechanism` on `kernel`, each tried with `apply` and its default carrier."""
    candidates = mechanism.candidates(kernel)
    offered = [s for s in candidates if s.refusal is None]
    refusals = [s.refusal for s in candidates if s.refusal is not None]
    applied = 0
    for site in offered:
        try:
            mechanism.apply(kernel, site)
        except MechanismRefused as refused:
            refusals.append(refused.reason)
        else:
            applied += 1
    if applied:
        return Reach(problem=problem, outcome="applies", sites=len(offered), applied=applied)
    if refusals:
        reason, count = Counter(refusals).most_common(1)[0]
        more = f" ({len(refusals)} sites)" if len(refusals) > 1 else ""
        return Reach(
            problem=problem,
            outcome="refused",
            sites=len(offered),
            applied=0,
            why_not=f"refused{more}: {reason}" + ("" if count == len(refusals) else "; ..."),
        )
    if isinstance(mechanism, DetectOnly):
        why = f"no forward rule: {mechanism.refusal}"
    else:
        why = f"no site of the form {FORWARD_FORMS.get(mechanism.name, 'its rule matches')}"
    return Reach(problem=problem, outcome="no site", sites=0, applied=0, why_not=why)


def first_child(mechanism: Mechanism, kernel: KernelSource) -> KernelSource | None:
    """The kernel `apply` writes at the first candidate it does not refuse, or None."""
    for site in mechanism.candidates(kernel):
        if site.refusal is not None:
            continue
        try:
            return mechanism.apply(kernel, site)
        except MechanismRefused:
            continue
    return None


def chained_parent(mechanism: Mechanism, children: dict[str, KernelSource]) -> str | None:
    """The first parent (catalog order) on whose child `mechanism` writes a kernel."""
    for parent, child in children.items():
        if parent != mechanism.name and first_child(mechanism, child) is not None:
            return parent
    return None


def _forms(mechanism: Mechanism, kernel: KernelSource) -> set[str]:
    return {str(s.detail.get("form", "")) for s in mechanism.candidates(kernel) if s.supported}


def new_form_parents(
    mechanism: Mechanism, kernel: KernelSource, children: dict[str, KernelSource]
) -> list[tuple[str, str]]:
    """(parent, form) for each form of `mechanism`'s rule that the naive `kernel` offers no
    site of and a depth-1 child does (it writes a kernel there), with the first such parent."""
    present = _forms(mechanism, kernel)
    found: dict[str, str] = {}
    for parent, child in children.items():
        if parent == mechanism.name:
            continue
        for site in mechanism.candidates(child):
            form = str(site.detail.get("form", ""))
            if not site.supported or not form or form in present or form in found:
                continue
            try:
                mechanism.apply(child, site)
            except MechanismRefused:
                continue
            found[form] = parent
    return [(parent, form) for form, parent in found.items()]


def writing_parent(
    mechanism: Mechanism, kernel: KernelSource, children: dict[str, KernelSource]
) -> str | None:
    """The first parent whose child holds more detected sites of `mechanism` than `kernel`."""
    present = len(mechanism.detect(kernel))
    for parent, child in children.items():
        if parent != mechanism.name and len(mechanism.detect(child)) > present:
            return parent
    return None


def forward_reach(heldout: Path = HELDOUT, chained: bool = True) -> list[MechanismReach]:
    """Every catalog mechanism against every held-out naive kernel (and, with `chained`,
    against the children of the mechanisms that apply there)."""
    kernels = {
        folder.name: KernelSource.from_file(folder / "kernel.cu")
        for folder in sorted(heldout.iterdir())
        if (folder / "kernel.cu").is_file()
    }
    mechanisms = all_mechanisms()
    table = []
    for mechanism in mechanisms:
        rows = [reach_of(mechanism, name, kernel) for name, kernel in kernels.items()]
        table.append(
            MechanismReach(
                mechanism=mechanism.name,
                forward_rule=not isinstance(mechanism, DetectOnly),
                reaches=[r.problem for r in rows if r.outcome == "applies"],
                kernels=rows,
            )
        )
    if chained:
        _add_chained_reach(table, mechanisms, kernels)
    return table


def _add_chained_reach(
    table: list[MechanismReach], mechanisms: list[Mechanism], kernels: dict[str, KernelSource]
) -> None:
    """Fill `reaches_after`: per kernel, the depth-1 children, tried by the mechanisms that
    did not reach the naive kernel itself."""
    by_name = {m.name: m for m in mechanisms}
    for problem, kernel in kernels.items():
        children = {}
        for row in table:
            if problem in row.reaches:
                child = first_child(by_name[row.mechanism], kernel)
                if child is not None:
                    children[row.mechanism] = child
        for row in table:
            mechanism = by_name[row.mechanism]
            if problem in row.reaches:
                for parent, form in new_form_parents(mechanism, kernel, children):
                    row.forms_after.append(ChainedForm(problem=problem, parent=parent, form=form))
                continue
            parent = chained_parent(mechanism, children)
            if parent is not None:
                row.reaches_after.append(ChainedReach(problem=problem, parent=parent))
                continue
            writer = writing_parent(mechanism, kernel, children)
            if writer is not None:
                row.written_by.append(ChainedReach(problem=problem, parent=writer))


def _short(text: str, limit: int = 150) -> str:
    flat = " ".join(text.split()).replace("|", "/")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def markdown(table: list[MechanismReach], total: int) -> str:
    """A README table: per mechanism, the kernels it reaches and the commonest reason elsewhere."""
    lines = [
        "| mechanism | reaches | held-out kernels it applies on | depth 2: applies after "
        "another, or another writes it | why not on the others at depth 1 (commonest reason) |",
        "|---|---|---|---|---|",
    ]
    order = sorted(table, key=lambda r: (-len(r.reaches), -len(r.reaches_after), r.mechanism))
    for row in order:
        others = [k.why_not for k in row.kernels if k.outcome != "applies"]
        reason = ""
        if others:
            common, count = Counter(others).most_common(1)[0]
            reason = f"{_short(common)} ({count} of {len(others)})"
        reached = ", ".join(row.reaches) if len(row.reaches) < total else "all"
        after = ", ".join(
            [f"{c.problem} (after {c.parent})" for c in row.reaches_after]
            + [f"{c.problem} (written by {c.parent})" for c in row.written_by]
            + [f"{c.problem} ({c.form} after {c.parent})" for c in row.forms_after]
        )
        lines.append(
            f"| `{row.mechanism}` | {len(row.reaches)}/{total} | {reached or '-'} | "
            f"{after or '-'} | {reason or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--markdown", type=Path, help="also write the README table here")
    args = parser.parse_args()
    table = forward_reach()
    total = len(table[0].kernels) if table else 0
    reached = sum(bool(r.reaches) for r in table)
    chained = sum(bool(r.reaches or r.reaches_after) for r in table)
    written = sum(bool(r.written_by and not (r.reaches or r.reaches_after)) for r in table)
    forms = sum(bool(r.forms_after) for r in table)
    payload = {
        "command": "python bench/forward_reach.py",
        "heldout_kernels": total,
        "mechanisms": len(table),
        "mechanisms_reaching_a_kernel": reached,
        "mechanisms_reaching_a_kernel_by_depth_2": chained,
        "mechanisms_written_by_another_only": written,
        "mechanisms_with_a_form_reached_only_at_depth_2": forms,
        "table": [json.loads(r.model_dump_json()) for r in table],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    text = markdown(table, total)
    if args.markdown:
        args.markdown.write_text(text)
    print(text)
    print(f"{reached} of {len(table)} mechanisms apply on at least one of {total} kernels")
    print(f"{chained} of {len(table)} do so at depth 1 or on a depth-1 child (depth 2)")
    print(f"{written} more reach no kernel but are written by another mechanism's rewrite")
    print(f"{forms} have a form of their rule that applies only on a depth-1 child")


if __name__ == "__main__":
    main()
