"""The cp_async_pipeline mechanism: asynchronous copies made synchronous, and back; a staged
tile loop turned into a two-stage cp.async ring."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast, SharedMemoryAtMost
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("cp_async_pipeline")


def _staged() -> KernelSource:
    return fixture_pairs("smem_staging")[0].before


class TestCpAsyncPipeline(RoundTripSuite):
    mechanism = "cp_async_pipeline"


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("cp_async_pipeline") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "cp_async_pipeline")


def test_waits_go_after_the_copies_and_come_back_before_them() -> None:
    before = fixture_pairs("cp_async_pipeline")[0].before
    waits = [s for s in mechanism.detect(before) if "commit" in s.snippet or "wait" in s.snippet]
    assert waits and all("remove the copies first" in (s.refusal or "") for s in waits)
    after = fixture_pairs("cp_async_pipeline")[0].after
    copy = next(c for c in mechanism.candidates(after) if "cp.async.ca" in c.snippet)
    assert "restore them first" in (copy.refusal or "")


def test_zero_fill_is_kept() -> None:
    pair = next(p for p in fixture_pairs("cp_async_pipeline") if p.case == "forms")
    assert "kl_j < kl_read ? reinterpret_cast<const unsigned char*>(kl_src)[kl_j] : 0" in (
        pair.after.text
    )


def test_a_staged_tile_loop_becomes_a_two_stage_ring() -> None:
    staged = _staged()
    (candidate,) = [c for c in mechanism.candidates(staged) if c.detail.get("form") == "staged"]
    ring = mechanism.apply(staged, candidate, Carrier(stages=2))
    assert ring.text == fixture_pairs("cp_async_pipeline")[0].before.text.replace(
        "// cp_async_pipeline fixture: the 16x16 tiled SGEMM of the smem_staging fixture with "
        "its tile\n// loads turned into a two-stage cp.async ring (what cp_async_pipeline's "
        "apply writes).",
        "// smem_staging fixture: a 16x16 shared-memory tiled SGEMM, C = A @ B (row-major), "
        "with\n// bounds-checked tile loads (zero outside the matrices).",
    )
    assert "__shared__ float As[2][TILE][TILE];" in ring.text
    assert "As[stage][ty][k] * Bs[stage][k][tx]" in ring.text
    conditions = mechanism.conditions(staged, candidate)
    assert any(isinstance(c, ArchAtLeast) and c.sm == 80 for c in conditions)
    assert any(isinstance(c, SharedMemoryAtMost) and c.usage == "2 * (2048)" for c in conditions)
    with pytest.raises(MechanismRefused, match="only a two-stage ring"):
        mechanism.apply(staged, candidate, Carrier(stages=3))


def test_a_tile_copied_from_shared_or_local_memory_is_refused() -> None:
    # cp.async reads global memory only: a source that may be another shared array (or a
    # local one) would fault on the GPU
    text = (
        _staged()
        .text.replace(
            "  __shared__ float Bs[TILE][TILE];\n",
            "  __shared__ float Bs[TILE][TILE];\n  __shared__ float cache[4096];\n"
            "  const float* source = K > 64 ? A : cache;\n",
        )
        .replace("A[row * K + t * TILE + tx]", "source[row * K + t * TILE + tx]")
    )
    (candidate,) = [
        c for c in mechanism.candidates(KernelSource(text)) if c.detail.get("form") == "staged"
    ]
    assert "source may point into shared memory" in (candidate.refusal or "")
    assert "global memory only" in (candidate.refusal or "")


def test_a_converting_tile_load_is_refused() -> None:
    halves = KernelSource(_staged().text.replace("A[row * K + t * TILE + tx]", "(float)(A[0])"))
    (candidate,) = [c for c in mechanism.candidates(halves) if c.detail.get("form") == "staged"]
    assert "not a plain element" in (candidate.refusal or "")


def test_cpp_memcpy_async_and_bulk_copies_are_refused() -> None:
    source = KernelSource(
        "#include <cuda/pipeline>\n__global__ void k(float* s, const float* g, uint64_t* bar) {\n"
        "  cuda::memcpy_async(s, g, 16, pipe);\n"
        '  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes '
        '[%0], [%1], 64, [%2];" :: "r"(0), "l"(g), "r"(0) : "memory");\n}\n'
    )
    reasons = sorted(s.refusal or "" for s in mechanism.detect(source))
    assert any("pipeline or barrier object" in r for r in reasons)
    assert any("bulk copies complete on an mbarrier" in r for r in reasons)


@pytest.mark.nvcc
def test_the_ring_of_the_heldout_sgemm_compiles(mechanism_builder: Builder) -> None:
    from tests.conftest import REPO

    staging = get("smem_staging")
    naive = KernelSource.from_file(REPO / "heldout" / "sgemm" / "kernel.cu")
    tiled = staging.apply(naive, staging.candidates(naive)[0])
    (candidate,) = [c for c in mechanism.candidates(tiled) if c.detail.get("form") == "staged"]
    ring = mechanism.apply(tiled, candidate)
    synchronous = ring
    for _ in range(3):
        synchronous = mechanism.remove(
            synchronous, next(s for s in mechanism.detect(synchronous) if s.supported)
        )
    compile_ok(mechanism_builder, [ring, synchronous])


def test_the_converting_tiles_staging_writes_for_halves_are_refused_with_the_reason() -> None:
    from tests.conftest import REPO

    staging = get("smem_staging")
    naive = KernelSource.from_file(REPO / "heldout" / "batched_hgemm" / "kernel.cu")
    tiled = staging.apply(naive, staging.candidates(naive)[0])
    (candidate,) = [c for c in mechanism.candidates(tiled) if c.detail.get("form") == "staged"]
    assert "converts each element (__half2float)" in (candidate.refusal or "")
    with pytest.raises(MechanismRefused, match=r"cp\.async copies bytes unchanged"):
        mechanism.apply(tiled, candidate)
