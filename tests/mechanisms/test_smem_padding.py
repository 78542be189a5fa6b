"""The smem_padding mechanism: padded shared tiles and padded row pitches, both ways."""

from __future__ import annotations

import pytest

from klineage.conditions import SharedMemoryAtMost
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("smem_padding")


class TestSmemPadding(RoundTripSuite):
    mechanism = "smem_padding"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("smem_padding") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "smem_padding")


def test_apply_pads_the_last_extent_by_one_by_default() -> None:
    after = fixture_pairs("smem_padding")[0].after
    (candidate,) = mechanism.candidates(after)
    padded = mechanism.apply(after, candidate)
    assert "__shared__ float tile[TILE][TILE + 1];" in padded.text
    (condition,) = mechanism.conditions(after, candidate)
    assert isinstance(condition, SharedMemoryAtMost)
    assert (condition.bytes, condition.usage) == (48 * 1024, "(4096) + 128")
    with pytest.raises(MechanismRefused, match=r"not in 1\.\.64"):
        mechanism.apply(after, candidate, Carrier(pad=100))


def test_a_pitch_needs_its_pad_from_the_carrier() -> None:
    after = next(p for p in fixture_pairs("smem_padding") if p.case == "pitch").after
    (candidate,) = mechanism.candidates(after)
    with pytest.raises(MechanismRefused, match="counts in its own unit"):
        mechanism.apply(after, candidate)
    assert "kTile * 4 + 8;" in mechanism.apply(after, candidate, Carrier(pad=8)).text


def test_a_tile_used_through_a_pointer_is_refused() -> None:
    source = KernelSource(
        "__global__ void k(float* y) {\n  __shared__ float t[32][32 + 1];\n"
        "  float* p = &t[0][0];\n  t[threadIdx.x][0] = 1.0f;\n  y[0] = p[40];\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "other than as a full subscript" in (site.refusal or "")


def test_loose_extents_get_parentheses() -> None:
    source = KernelSource(
        "__global__ void k(float* y) {\n  __shared__ float t[8][1 << 5];\n"
        "  t[threadIdx.y][threadIdx.x] = 1.0f;\n  y[0] = t[0][0];\n}\n"
    )
    (candidate,) = mechanism.candidates(source)
    assert "t[8][(1 << 5) + 1]" in mechanism.apply(source, candidate).text


def _staged_heldout(problem: str) -> KernelSource:
    """The held-out naive GEMM with smem_staging's forward rewrite: the 2-D tiles to pad."""
    from tests.conftest import REPO

    staging = get("smem_staging")
    naive = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
    return staging.apply(naive, staging.candidates(naive)[0])


@pytest.mark.parametrize("problem", ["sgemm", "batched_hgemm"])
def test_apply_pads_the_tiles_smem_staging_writes(problem: str) -> None:
    staged = _staged_heldout(problem)
    assert not mechanism.detect(staged)
    candidates = [c for c in mechanism.candidates(staged) if c.supported]
    assert len(candidates) == 2
    padded = staged
    for _ in candidates:
        padded = mechanism.apply(padded, next(c for c in mechanism.candidates(padded)))
    assert KernelSource(padded.text).parsed.errors == ()
    assert "__shared__ float tile_a[16][16 + 1];" in padded.text
    assert len(mechanism.detect(padded)) == 2


@pytest.mark.nvcc
def test_the_padded_staged_heldout_gemms_compile(mechanism_builder: Builder) -> None:
    from tests.mechanisms.roundtrip import compile_ok

    padded = []
    for problem in ("sgemm", "batched_hgemm"):
        staged = _staged_heldout(problem)
        padded.append(mechanism.apply(staged, mechanism.candidates(staged)[0]))
    compile_ok(mechanism_builder, padded)
