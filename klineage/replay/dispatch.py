"""A launch-size dispatch between two kernels replay has measured: each runs the workloads it
is faster on.

A rule cannot write the specialized kernels a dispatch chooses between (the catalog's
`launch_size_dispatch` refuses a new one), but replay can have them: rivals raced from one
state (a block per row and a warp per row) are each correct on every workload and each
timed on every workload. Where one is faster on short rows and the other on long ones, a
dispatch on the row length runs each where it wins, as the experts' dispatches do
(``if (cols <= 1024)`` a warp per row, else a block per row).

- :func:`best_split` finds the var axis and threshold that separate the workloads each
  kernel wins, when the split beats the faster kernel alone past timing noise;
- :func:`write_dispatch` writes one source holding both kernels, each in a namespace of its
  own with its `run` renamed, and a `run` that calls one or the other by that axis.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from klineage.gate.result import geomean
from klineage.kernel import KernelSource
from klineage.problem import Problem
from klineage.problem.abi import declared_run

NOISE = 1.05
"""A split must predict at least this much over the faster kernel alone (geomean over the
workloads) to be worth a gate run. A workload's two figures come from two verdicts, each
timed against the state in a run of its own: 2-3% apart is within their noise (served from
the finished replay's verdicts, splits between vector widths predicted 1.02-1.03x on
one-token workloads of a few microseconds)."""

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_RUN = re.compile(r'extern\s+"C"\s+(int\s+)run\s*\(')
NAMESPACES = ("klineage_dispatch_low", "klineage_dispatch_high")
"""The namespaces of the kernel that runs at or below the threshold, and of the other."""


@dataclass(frozen=True)
class Split:
    """Which kernel runs which workloads: `low` at or below `threshold` of `axis`."""

    axis: str
    """A var axis of the definition."""
    threshold: int
    """The largest value of `axis` the `low` kernel runs."""
    low: int
    """The kernel (0 or 1, in the order given) for `axis <= threshold`; the other above."""
    gain: float
    """Predicted geomean speedup over the faster kernel alone, from the two verdicts."""


def best_split(problem: Problem, latencies: Sequence[Mapping[str, float]]) -> Split | None:
    """The split of the problem's workloads between two kernels (per-workload latencies, by
    label) that predicts the lowest geomean latency, if it beats the faster kernel alone by
    `NOISE`; None otherwise (or where a workload's latency is missing)."""
    first, second = latencies
    workloads = list(problem.workloads)
    if not workloads or any(w.label not in first or w.label not in second for w in workloads):
        return None

    def mean(choice: Sequence[int]) -> float:
        pairs = zip(choice, workloads, strict=True)
        return geomean([(first, second)[c][w.label] for c, w in pairs])

    alone = min(mean([0] * len(workloads)), mean([1] * len(workloads)))
    best: Split | None = None
    for axis in problem.definition.var_axes():
        values = sorted({w.axes[axis] for w in workloads if axis in w.axes})
        for threshold in values[:-1]:
            for low in (0, 1):
                choice = [low if w.axes[axis] <= threshold else 1 - low for w in workloads]
                gain = alone / mean(choice)
                if gain >= NOISE and (best is None or gain > best.gain):
                    best = Split(axis, threshold, low, gain)
    return best


class DispatchRefused(ValueError):
    """The two kernels cannot be put in one source by this writer; says why."""


def write_dispatch(
    kernels: Sequence[KernelSource], split: Split, axes: Sequence[str]
) -> KernelSource:
    """One source: the `low` kernel and the other, each in its own namespace with its `run`
    renamed `run_variant`, and an `extern "C" run` calling the one the axis chooses. The
    parameters are the `low` kernel's `run`'s (the ABI makes both the same); the axis is the
    one at its place among the var axes `axes` (the ABI passes them in definition order, just
    before the stream), whatever the source calls it."""
    low, high = kernels[split.low], kernels[1 - split.low]
    for kernel in (low, high):
        if any(f"namespace {name}" in kernel.text for name in NAMESPACES):
            raise DispatchRefused(f"{kernel.name} is a dispatch already; one level is written")
    declared = declared_run(low.text)
    if declared is None:
        raise DispatchRefused(f"{low.name} defines no run(...)")
    names = [p.name for p in declared.params]
    if not all(names):
        unnamed = next(p.text for p in declared.params if not p.name)
        raise DispatchRefused(f"run(...) of {low.name} does not name its parameter `{unnamed}`")
    if split.axis not in axes or len(names) < len(axes) + 1:
        raise DispatchRefused(f"run(...) of {low.name} has no parameter for the axis {split.axis}")
    size = names[len(names) - 1 - len(axes) + list(axes).index(split.axis)]
    includes: list[str] = []
    bodies = []
    for namespace, kernel in zip(NAMESPACES, (low, high), strict=True):
        for line in _INCLUDE.findall(kernel.text):
            if line.strip() not in includes:
                includes.append(line.strip())
        body, count = _RUN.subn(r"\1run_variant(", _INCLUDE.sub("", kernel.text))
        if count != 1:
            raise DispatchRefused(f'{kernel.name}: not one `extern "C" int run(` definition')
        bodies.append(f"namespace {namespace} {{\n{body.strip()}\n}}  // namespace {namespace}\n")
    params = ", ".join(p.text for p in declared.params)
    args = ", ".join(names)
    low_space, high_space = NAMESPACES
    dispatch = (
        f"// {split.axis} <= {split.threshold}: the kernel faster there; above it, the other "
        f"(predicted {split.gain:.2f}x over the faster alone)\n"
        f'extern "C" int run({params}) {{\n'
        f"  if ({size} <= {split.threshold}) return {low_space}::run_variant({args});\n"
        f"  return {high_space}::run_variant({args});\n"
        "}\n"
    )
    text = "\n".join(includes) + "\n\n" + "\n".join(bodies) + "\n" + dispatch
    return KernelSource(text, low.name)
