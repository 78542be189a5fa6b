"""The rasterization mechanism: a grouped tile order becomes groups of one tile-row (row-major)
by setting its group-size constant to 1, and comes back from the marks that removal leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.conditions import evaluate_size
from klineage.cuda.cexpr import to_size_expr
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms.rasterization import raster_run
from klineage.mining.removal import remove_mechanism
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("rasterization")
GEMM = Path(__file__).resolve().parents[2] / "expert_kernels" / "gemm_bf16" / "kernel.cu"


class TestRasterization(RoundTripSuite):
    mechanism = "rasterization"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("rasterization") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "rasterization", expect_some=True)


def test_the_site_spans_the_grouped_mapping() -> None:
    before = fixture_pairs("rasterization")[0].before
    (site,) = mechanism.detect(before)
    assert (site.start_line, site.end_line) == (27, 33)


def _declared(parsed, statement) -> tuple[str, object] | None:
    declarator = statement.child_by_field_name("declarator")
    if statement.type != "declaration" or declarator is None:
        return None
    name, value = (
        declarator.child_by_field_name("declarator"),
        declarator.child_by_field_name("value"),
    )
    return (parsed.text_of(name), value) if name is not None and value is not None else None


def _tile_origins(kernel: KernelSource, function: str, axes: dict[str, int]) -> list[tuple]:
    """(m0, n0) for every block id, by evaluating the kernel's own declarations up to the end
    of its raster run (those that fold to integers; the rest are left out)."""
    run = raster_run(kernel.parsed, kernel.parsed.function(function))
    m0_name, n0_name = (_declared(kernel.parsed, s)[0] for s in run[-2:])
    # the block index as a plain name of the same length, so byte offsets do not move
    scratch = KernelSource(kernel.text.replace("blockIdx.x", "blockIdx_x"))
    parsed = scratch.parsed
    body = parsed.function(function)
    statements = [c for c in body.body.named_children if c.end_byte <= run[-1].end_byte]
    declared = [d for d in (_declared(parsed, s) for s in statements) if d is not None]
    # each declaration as a size expression over the names before it, made once: evaluating
    # it for every block is what the loop below repeats (thousands of blocks)
    symbols: dict[str, int | str] = {**parsed.integer_constants, **{a: a for a in axes}}
    symbols["blockIdx_x"] = "blockIdx_x"
    formulas: list[tuple[str, str]] = []
    for name, value in declared:
        expr = to_size_expr(parsed, value, symbols)
        if expr is not None:
            formulas.append((name, expr))
            symbols[name] = name
    origins: list[tuple] = []
    tiles = 1
    block = 0
    while block < tiles:
        values: dict[str, int] = {**parsed.integer_constants, **axes, "blockIdx_x": block}
        for name, expr in formulas:
            result = evaluate_size(expr, values)
            if result is not None:
                values[name] = result
        tiles = int(values["tiles_m"]) * int(values["tiles_n"])
        origins.append((values[m0_name], values[n0_name]))
        block += 1
    return origins


@pytest.mark.parametrize(("M", "N"), [(128, 256), (4096, 4096), (1000, 3000), (8192, 11008)])
def test_the_gemm_expert_keeps_a_bijection_and_becomes_row_major(M: int, N: int) -> None:
    expert = KernelSource.from_file(GEMM)
    removal = remove_mechanism(expert, mechanism)
    assert removal.changed
    grouped = _tile_origins(expert, "gemm_tiled", {"M": M, "N": N})
    plain = _tile_origins(removal.simplified, "gemm_tiled", {"M": M, "N": N})
    assert sorted(grouped) == sorted(plain) and len(set(plain)) == len(plain)  # a bijection
    rows = sorted({m for m, _ in plain})
    cols = sorted({n for _, n in plain})
    # groups of one tile-row: block b computes tile-row b // tiles_n, tile-column b % tiles_n
    assert plain == [(rows[b // len(cols)], cols[b % len(cols)]) for b in range(len(plain))]
    assert grouped != plain or len(rows) == 1  # the grouped order really differed
