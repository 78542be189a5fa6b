"""A thread-per-row running sum rewritten as one block per row: the forward rule of
block_per_row on naive row scans (``form=scan``).

It takes the form :func:`klineage.mechanisms._scan_rows.row_scan` reads (one thread walking its
row, ``acc += VALUE(c); TARGET(c) = acc;``) and writes a block that scans its row
``blockDim.x`` elements a turn: each warp scans its 32 with ``__shfl_up_sync``, the warps'
totals go through shared memory, and every thread adds the totals of the warps below it and
the carry of the turns before::

    for (int64_t c_base = 0; c_base < cols; c_base += blockDim.x) {
      const int64_t c = c_base + threadIdx.x;
      float acc_part = c < cols ? (VALUE(c)) : 0.0f;
      ...Hillis-Steele scan of acc_part across the warp...
      if (lane == 31) acc_warps[warp] = acc_part;
      __syncthreads();
      float acc_below = 0.0f, acc_turn = 0.0f;     // every thread adds the same totals in
      for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {   // the same order: the carry is
        const float t = acc_warps[w];                     // the same float in every thread
        if (w < warp) acc_below += t;
        acc_turn += t;
      }
      if (c < cols) TARGET(c) = acc + acc_below + acc_part;
      acc += acc_turn;
      __syncthreads();  // acc_warps is written again next turn
    }

A row of 32,000 takes 32,000 / blockDim.x turns instead of a warp's 1,000: few long rows
(where one warp per row leaves the GPU idle) are what it is for. The row index becomes
``blockIdx.x`` and each launch gets one block per row. Sums are added in another order than
the serial loop's, as any parallel scan does.
"""

from __future__ import annotations

from klineage.cuda.edit import Edit
from klineage.cuda.source import ParsedSource
from klineage.cuda.tree import fresh_name
from klineage.mechanisms._local_util import names_in_function
from klineage.mechanisms._reductions_rows import (
    NotCanonical,
    _check_launch_bounds,
    _launch_edits_to_groups,
)
from klineage.mechanisms._scan_rows import RowScan, chunk_start, hillis_steele


def block_scan_edits(source: ParsedSource, scan: RowScan, block_size: int, mask: str) -> list[Edit]:
    """The edits that give each row a block scanning it ``blockDim.x`` elements a turn."""
    if block_size % 32 or not 64 <= block_size <= 1024:
        raise NotCanonical(f"block_size={block_size} is not a multiple of 32 in 64..1024")
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
    loop = "\n".join([
        *chunk_start(source, scan, base, part, ("blockDim.x", "threadIdx.x"), step),
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
        f"{step}if ({c} < {n}) {target} = {acc} + {below} + {part};",
        f"{step}{acc} += {turn};",
        f"{step}__syncthreads();  // {warps} is written again next turn",
        f"{at}}}",
    ])  # fmt: skip
    guard_indent = source.indent_of(scan.guard.start_byte)
    _check_launch_bounds(source, scan.rows.kernel, block_size)
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
        *_launch_edits_to_groups(source, scan.rows, "block", block_size),
    ]
