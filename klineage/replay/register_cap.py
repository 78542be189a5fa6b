"""A launch bound's register cap, lifted where a later rewrite spills under it.

`__launch_bounds__(256, 4)` asks for four resident blocks of 256 threads, so ptxas gives a
thread at most 65,536 / 1,024 = 64 registers. A bound kept early in a replay (it gained on the
lighter kernel of that state) then caps every later rewrite: on sgemm's staged tiles the raced
8 x 8 register micro-tile spilled 4,764 bytes under it and measured 0.40x of its state, where
the same tile without the cap measured 2.13x. Replay writes such a rewrite again with the
bound's max threads kept and its minimum blocks dropped, when that stops the spills.
"""

from __future__ import annotations

from klineage.gate.build import Builder, BuildResult
from klineage.kernel import KernelSource
from klineage.mechanisms.launch_bounds import bound_args

BOUND = "__launch_bounds__"


def spill_bytes(build: BuildResult) -> int | None:
    """Register spill bytes (stores and loads) over the build's kernels; None when it did not
    build or ptxas reported nothing."""
    if not build.ok or build.report is None:
        return None
    return sum(k.spill_bytes for k in build.report.kernels)


def without_min_blocks(kernel: KernelSource) -> KernelSource | None:
    """`kernel` with every `__launch_bounds__(T, B, ...)` written `__launch_bounds__(T)`;
    None where no bound has a second argument."""
    source = kernel.parsed
    spans: list[tuple[int, int, bytes]] = []
    for function in source.kernels:
        node = function.launch_bounds
        if node is None:
            continue
        args = bound_args(node)
        if len(args) < 2:
            continue
        threads = source.data[args[0].start_byte : args[0].end_byte]
        spans.append((node.start_byte, node.end_byte, threads))
    if not spans:
        return None
    data = source.data
    for start, end, threads in sorted(spans, reverse=True):
        data = data[:start] + f"{BOUND}(".encode() + threads + b")" + data[end:]
    return KernelSource(data.decode("utf-8"), kernel.name)


def lift_register_cap(
    builder: Builder, state: KernelSource, new: KernelSource
) -> tuple[KernelSource, str] | None:
    """`new` without its launch bounds' minimum blocks, and why, where `new` spills more than
    `state` does under them and less without them; None otherwise (no minimum blocks, no
    spill of the rewrite's making, or none saved)."""
    lifted = without_min_blocks(new)
    if lifted is None:
        return None
    spilled = spill_bytes(builder.build(new.text, new.name))
    before = spill_bytes(builder.build(state.text, state.name))
    if not spilled or before is None or before >= spilled:
        return None
    after = spill_bytes(builder.build(lifted.text, lifted.name))
    if after is None or after >= spilled:
        return None
    return lifted, (
        f"{BOUND} without its minimum blocks: the rewrite spilled {spilled} bytes under that "
        f"register cap, {after} without it"
    )
