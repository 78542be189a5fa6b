"""The element rule: how an output is compared with the reference.

An element fails only if `|err| > atol` and `|err| > rtol * |ref|`; a NaN or Inf in the output
fails unless the reference has the same non-finite value there. Pure tensor code, so it runs
(and is tested) on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from klineage.problem import Definition, Tolerance


@dataclass(frozen=True)
class OutputComparison:
    """How one output tensor compares with the reference."""

    name: str
    total: int
    bad: int
    unwritten: int
    """Elements still holding the poison value (NaN or the integer minimum)."""
    max_abs: float
    max_rel: float
    first_bad: tuple[int, ...] | None
    first_bad_value: float | None
    first_bad_expected: float | None

    @property
    def ok(self) -> bool:
        return self.bad == 0

    def describe(self) -> str:
        if self.ok:
            return f"{self.name}: ok"
        where = ""
        if self.first_bad is not None:
            where = (
                f"; first at {list(self.first_bad)}: got {self.first_bad_value!r}, "
                f"expected {self.first_bad_expected!r}"
            )
        unwritten = f", {self.unwritten} never written (still poison)" if self.unwritten else ""
        return (
            f"{self.name}: {self.bad} of {self.total} elements wrong{unwritten}; "
            f"max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}{where}"
        )


def compare_output(
    name: str, out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance
) -> OutputComparison:
    """Apply the element rule to one output. The figures come back in one host sync (the
    check stage compares every output of every trial); a failure's first bad element, one
    more."""
    import torch

    wide = torch.float64 if torch.float64 in (out.dtype, ref.dtype) else torch.float32
    if out.dtype.is_floating_point:
        unwritten = torch.isnan(out).sum()
    elif out.dtype == torch.bool:
        unwritten = torch.zeros((), dtype=torch.int64, device=out.device)  # no spare value
    else:
        unwritten = (out == torch.iinfo(out.dtype).min).sum()
    o = out.to(wide)
    r = ref.to(wide)
    err = (o - r).abs()
    bad = _bad_elements(o, r, err, tolerance)
    zero = torch.zeros((), dtype=wide, device=err.device)
    # the largest finite error, and relative error where the reference is not zero (0 if none)
    max_abs = torch.where(torch.isfinite(err), err, zero).max() if err.numel() else zero
    rel = err / r.abs()
    rel_ok = torch.isfinite(err) & (r != 0)
    max_rel = torch.where(rel_ok, rel, zero).max() if err.numel() else zero
    figures = torch.stack(
        [
            unwritten.to(torch.float64),
            bad.sum().to(torch.float64),
            max_abs.double(),
            max_rel.double(),
        ]
    ).tolist()
    n_unwritten, n_bad = int(figures[0]), int(figures[1])
    first = first_value = first_expected = None
    if n_bad:
        index = torch.nonzero(bad)[0]
        first = tuple(int(i) for i in index)
        first_value = float(o[first])
        first_expected = float(r[first])
    return OutputComparison(
        name=name,
        total=out.numel(),
        bad=n_bad,
        unwritten=n_unwritten,
        max_abs=float(figures[2]),
        max_rel=float(figures[3]),
        first_bad=first,
        first_bad_value=first_value,
        first_bad_expected=first_expected,
    )


def _bad_elements(
    o: torch.Tensor, r: torch.Tensor, err: torch.Tensor, tolerance: Tolerance
) -> torch.Tensor:
    """The element rule as a mask: |err| > atol and |err| > rtol*|ref|, and a non-finite output
    passes only where the reference holds the same non-finite value."""
    import torch

    bad = (err > tolerance.atol) & (err > tolerance.rtol * r.abs())
    same = (torch.isnan(o) & torch.isnan(r)) | (o == r)
    return bad | (~torch.isfinite(o) & ~same)


def output_fails(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance) -> torch.Tensor:
    """Whether any element of an output breaks the element rule, as a 0-d bool tensor on the
    output's device (no host sync: the timing audit gathers several such flags and reads them
    at once; `compare_output` gives the details of a failure)."""
    import torch

    wide = torch.float64 if torch.float64 in (out.dtype, ref.dtype) else torch.float32
    o, r = out.to(wide), ref.to(wide)
    return _bad_elements(o, r, (o - r).abs(), tolerance).any()


def output_ok(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance) -> bool:
    """Whether an output passes the element rule, with one host sync."""
    return not bool(output_fails(out, ref, tolerance))


def _same_bits(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    import torch

    if before.dtype.is_floating_point:
        return (before == after) | (torch.isnan(before) & torch.isnan(after))
    return before == after


def changed_count(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """How many elements differ bitwise (NaN == NaN), as a 0-d tensor on the device (no host
    sync: the timing audit reads several at once)."""
    return (~_same_bits(before, after)).sum()


def changed_elements(before: torch.Tensor, after: torch.Tensor) -> int:
    """How many elements differ bitwise (NaN == NaN), for the inputs-unchanged check."""
    return int(changed_count(before, after))


def compare_indices(
    name: str, indices: torch.Tensor, source: torch.Tensor, values: torch.Tensor
) -> OutputComparison:
    """Check an index output by what it selects: in range, unique along the last dimension,
    and `source.gather(-1, indices)` bitwise equal to the kernel's `values` output."""
    import torch

    length = source.shape[-1]
    idx = indices.to(torch.int64)
    in_range = (idx >= 0) & (idx < length)
    unwritten = int((indices == torch.iinfo(indices.dtype).min).sum())
    safe = torch.where(in_range, idx, torch.zeros_like(idx))
    picked = source.expand(*idx.shape[:-1], length).gather(-1, safe)
    same = (picked == values) | (torch.isnan(picked) & torch.isnan(values))
    ordered = torch.sort(safe, dim=-1).values
    repeated = torch.zeros_like(in_range)
    repeated[..., 1:] = ordered[..., 1:] == ordered[..., :-1]
    bad = ~in_range | ~same | repeated
    n_bad = int(bad.sum())
    first = first_value = None
    if n_bad:
        first = tuple(int(i) for i in torch.nonzero(bad)[0])
        first_value = float(idx[first])
    return OutputComparison(
        name=name,
        total=indices.numel(),
        bad=n_bad,
        unwritten=unwritten,
        max_abs=0.0,
        max_rel=0.0,
        first_bad=first,
        first_bad_value=first_value,
        first_bad_expected=None,
    )


def compare_by_spec(
    definition: Definition,
    name: str,
    outputs: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    inputs: dict[str, torch.Tensor],
) -> OutputComparison:
    """Compare one output the way its spec asks: elementwise, sorted, or indices_of."""
    import torch

    from klineage.problem import IndicesOf

    spec = definition.outputs[name]
    tolerance = definition.tolerance_for(name)
    out, ref = outputs[name], reference[name]
    if isinstance(spec.compare, IndicesOf):
        return compare_indices(name, out, inputs[spec.compare.source], outputs[spec.compare.values])
    if spec.compare == "sorted":
        out = torch.sort(out, dim=-1).values
        ref = torch.sort(ref, dim=-1).values
    return compare_output(name, out, ref, tolerance)
