"""A thread-per-row running sum rewritten as one block per row: the forward rule of
block_per_row on naive row scans (``form=scan``).

It takes the form :func:`klineage.mechanisms._scan_rows.row_scan` reads (one thread walking its
row, ``acc += VALUE(c); TARGET(c) = acc;``) and writes a block that scans its row
``blockDim.x * K`` elements a turn (``K``, the carrier ``items_per_thread``; 1 by default, 8
the alternative replay races once a block scan is kept):
each thread sums its ``K`` consecutive elements serially, keeping the running sums in
registers; each warp scans its threads' totals with ``__shfl_up_sync``; the warps' totals go
through shared memory; and every element gets the carry of the turns before, the totals of
the warps and lanes below it, and its own running sum::

    for (int64_t c_base = 0; c_base < cols; c_base += blockDim.x * K) {
      const int64_t c_first = c_base + threadIdx.x * K;
      float acc_run[K];
      float acc_part = 0.0f;
      for (int acc_k = 0; acc_k < K; ++acc_k) {            // the thread's run, serially
        const int64_t c = c_first + acc_k;
        acc_part += c < cols ? (VALUE(c)) : 0.0f;
        acc_run[acc_k] = acc_part;
      }
      ...Hillis-Steele scan of acc_part across the warp...
      if (lane == 31) acc_warps[warp] = acc_part;
      __syncthreads();
      float acc_below = 0.0f, acc_turn = 0.0f;     // every thread adds the same totals in
      for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {   // the same order: the carry is
        const float t = acc_warps[w];                     // the same float in every thread
        if (w < warp) acc_below += t;
        acc_turn += t;
      }
      float acc_lanes_below = __shfl_up_sync(mask, acc_part, 1);   // lane 0: 0
      for (int acc_k = 0; acc_k < K; ++acc_k)
        if (c_first + acc_k < cols)
          TARGET(c_first + acc_k) = acc + acc_below + acc_lanes_below + acc_run[acc_k];
      acc += acc_turn;
      __syncthreads();  // acc_warps is written again next turn
    }

With ``K = 1`` each thread takes one element a turn (the scan of the warp is the element's
prefix). A row of 32,000 takes 32,000 / (blockDim.x * K) turns instead of a warp's 1,000: few
long rows (where one warp per row leaves the GPU idle) are what it is for, and the serial runs
cut the turns, and their two barriers each, by ``K``. The row index becomes ``blockIdx.x`` and
each launch gets one block per row. Sums are added in another order than the serial loop's,
as any parallel scan does.
"""

from __future__ import annotations

from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.cuda.tree import fresh_name
from klineage.mechanisms._local_util import names_in_function
from klineage.mechanisms._rows_forms import NotCanonical
from klineage.mechanisms._rows_spread import check_launch_bounds, launch_edits_to_groups
from klineage.mechanisms._scan_rows import RowScan, chunk_start, hillis_steele

ITEMS_PER_THREAD = 1
"""Consecutive elements each thread scans a turn, by default: one, the form the vector form
of block scans reads (:mod:`klineage.mechanisms._vector_block_scan`)."""
RUN_ITEMS = 8
"""The alternative: runs of 8 a thread, so a long row takes 8 times fewer turns (and
barriers); replay races it beside the default once a block scan is kept."""


def block_scan_edits(
    source: ParsedSource, scan: RowScan, block_size: int, mask: str, items: int = ITEMS_PER_THREAD
) -> list[Edit]:
    """The edits that give each row a block scanning it ``blockDim.x * items`` elements a
    turn (``items`` consecutive elements a thread)."""
    if block_size % 32 or not 64 <= block_size <= 1024:
        raise NotCanonical(f"block_size={block_size} is not a multiple of 32 in 64..1024")
    if not 1 <= items <= 32:
        raise NotCanonical(f"items_per_thread={items} is not in 1..32")
    taken = names_in_function(source, scan.rows.kernel)
    c, acc = scan.variable, scan.accumulator
    lane, warp, warps = (fresh_name(taken, n) for n in ("lane", "warp", f"{acc}_warps"))
    base, part, offset, up, below, turn, w, total = (fresh_name(taken, n) for n in (
        f"{c}_base", f"{acc}_part", f"{acc}_offset", f"{acc}_up", f"{acc}_below",
        f"{acc}_turn", f"{acc}_w", f"{acc}_total",
    ))  # fmt: skip
    n, target = source.text_of(scan.bound), source.text_of(scan.target)
    at = source.indent_of(scan.loop.start_byte)
    step = at + "  "
    if items == 1:
        head = chunk_start(source, scan, base, part, ("blockDim.x", "threadIdx.x"), step)
        store = [f"{step}if ({c} < {n}) {target} = {acc} + {below} + {part};"]
    else:
        head, store = _thread_runs(
            source, scan, taken, (base, part, below), items, step, lane, mask
        )
    loop = "\n".join([
        *head,
        *hillis_steele(step, part, lane, offset, up, mask),
        f"{step}if ({lane} == 31) {warps}[{warp}] = {part};",
        f"{step}__syncthreads();",
        f"{step}float {below} = 0.0f;",
        f"{step}float {turn} = 0.0f;",
        f"{step}for (int {w} = 0; {w} < (int)(blockDim.x >> 5); ++{w}) {{",
        f"{step}  const float {total} = {warps}[{w}];",
        f"{step}  if ({w} < {warp}) {below} += {total};",
        f"{step}  {turn} += {total};",
        f"{step}}}",
        *store,
        f"{step}{acc} += {turn};",
        f"{step}__syncthreads();  // {warps} is written again next turn",
        f"{at}}}",
    ])  # fmt: skip
    guard_indent = source.indent_of(scan.guard.start_byte)
    check_launch_bounds(source, scan.rows.kernel, block_size)
    declarations = "\n".join([
        "",
        f"{guard_indent}const int {lane} = threadIdx.x & 31;",
        f"{guard_indent}const int {warp} = threadIdx.x >> 5;",
        f"{guard_indent}__shared__ float {warps}[32];",
    ])  # fmt: skip
    return [
        Edit.replace(scan.rows.index, "(int64_t)blockIdx.x"),
        Edit.insert(scan.guard.end_byte, declarations),
        Edit.replace(scan.loop, loop),
        *launch_edits_to_groups(source, scan.rows, "block", block_size),
    ]


def _thread_runs(
    source: ParsedSource,
    scan: RowScan,
    taken: set[str],
    names: tuple[str, str, str],
    items: int,
    step: str,
    lane: str,
    mask: str,
) -> tuple[list[str], list[str]]:
    """The head of a turn where each thread scans ``items`` consecutive elements serially
    (its run's total left in ``part`` for the warp scan), and the stores after the block's
    totals are known (``below``, the warps below's sum, of ``names = (base, part, below)``):
    each element gets the carry, the warps below, the lanes below (the warp scan shifted by
    one lane) and its own running sum."""
    base, part, below = names
    c, acc, index = scan.variable, scan.accumulator, scan.index_type
    n, value, target = (source.text_of(x) for x in (scan.bound, scan.value, scan.target))
    first, run, k, before = (fresh_name(taken, x) for x in (
        f"{c}_first", f"{acc}_run", f"{acc}_k", f"{acc}_lanes_below",
    ))  # fmt: skip
    inner = step + "  "
    head = [
        f"for ({index} {base} = 0; {base} < {n}; {base} += blockDim.x * {items}) {{",
        f"{step}const {index} {first} = {base} + threadIdx.x * {items};",
        f"{step}float {run}[{items}];",
        f"{step}float {part} = 0.0f;",
        f"{step}#pragma unroll",
        f"{step}for (int {k} = 0; {k} < {items}; ++{k}) {{",
        f"{inner}const {index} {c} = {first} + {k};",
        f"{inner}{part} += {c} < {n} ? ({value}) : 0.0f;",
        f"{inner}{run}[{k}] = {part};",
        f"{step}}}",
    ]  # fmt: skip
    store = [
        f"{step}float {before} = __shfl_up_sync({mask}, {part}, 1);",
        f"{step}if ({lane} == 0) {before} = 0.0f;",
        f"{step}#pragma unroll",
        f"{step}for (int {k} = 0; {k} < {items}; ++{k}) {{",
        f"{inner}const {index} {c} = {first} + {k};",
        f"{inner}if ({c} < {n}) {target} = {acc} + {below} + {before} + {run}[{k}];",
        f"{step}}}",
    ]  # fmt: skip
    return head, store
