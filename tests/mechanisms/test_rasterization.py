"""The rasterization mechanism: a grouped tile order becomes groups of one tile-row (row-major)
by setting its group-size constant to 1, and comes back from the marks that removal leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.conditions import evaluate_size
from klineage.cuda.cexpr import to_size_expr
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms.rasterization import raster_run
from klineage.mining.removal import matching_candidate, remove_mechanism
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


# ---- a grouped order written from scratch on a kernel over a 2-D grid ------------------------

STAGED = Path(__file__).resolve().parents[1] / "fixtures" / "mechanisms" / "thread_coarsening"
TILED = STAGED / "forward" / "sgemm_tiles.naive.cu"


def _grid_site(kernel: KernelSource):  # -> Site
    (site,) = mechanism.candidates(kernel)
    assert site.detail["form"] == "grid_2d" and site.supported
    return site


def test_a_2d_grid_gets_a_grouped_order_that_the_removal_takes_back() -> None:
    kernel = KernelSource.from_file(TILED)
    applied = mechanism.apply(kernel, _grid_site(kernel), Carrier(group_rows=4))
    assert "constexpr int kGroupRows = 4;" in applied.text
    assert "blockIdx.y * 16" not in applied.text and "tile_y * 16" in applied.text
    (site,) = mechanism.detect(applied)  # the grouped order the detector knows
    assert site.supported and mechanism.carrier_of(applied, site) == Carrier(group_rows=4)
    assert not [c for c in mechanism.candidates(applied) if c.detail.get("form") == "grid_2d"]
    removed = mechanism.remove(applied, site)
    candidate = matching_candidate(mechanism, applied, removed)
    assert candidate is not None
    assert mechanism.apply(removed, candidate, Carrier(group_rows=4)).text == applied.text


def test_a_group_of_one_row_is_refused() -> None:
    kernel = KernelSource.from_file(TILED)
    with pytest.raises(MechanismRefused, match="two or more tile-rows"):
        mechanism.apply(kernel, _grid_site(kernel), Carrier(group_rows=1))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            ("__global__ void", "__device__ int tile_of() { return blockIdx.y; }\n__global__ void"),
            "helper tile_of reads the block index",
        ),
        (("#include <stdint.h>", "#include <stdint.h>\n// cg::this_grid().sync()"), "this_grid"),
    ],
    ids=["helper", "grid_sync"],
)
def test_kernels_whose_blocks_see_the_old_order_are_refused(
    edit: tuple[str, str], reason: str
) -> None:
    text = TILED.read_text()
    assert edit[0] in text
    (site,) = mechanism.candidates(KernelSource(text.replace(edit[0], edit[1], 1)))
    assert not site.supported and reason in str(site.refusal)


def test_a_kernel_over_a_1d_grid_is_no_candidate() -> None:
    naive = Path(__file__).resolve().parents[2] / "heldout" / "sgemm" / "kernel.cu"
    assert mechanism.candidates(KernelSource.from_file(naive)) == []


@pytest.mark.nvcc
@pytest.mark.parametrize("group", [2, 8])
def test_the_grouped_order_computes_the_same_bits_on_the_host(group: int) -> None:
    """Blocks take other tiles; each tile's sums are the same, so every output bit is."""
    from tests.mechanisms.host_emulation import run_on_host
    from tests.mechanisms.test_thread_coarsening import _gemm_cases

    kernel = KernelSource.from_file(TILED)
    applied = mechanism.apply(kernel, _grid_site(kernel), Carrier(group_rows=group))
    cases = _gemm_cases("sgemm", (16, 16))
    assert run_on_host(applied.text, cases) == run_on_host(kernel.text, cases)
