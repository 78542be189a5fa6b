"""The cp_async_pipeline mechanism: asynchronous copies made synchronous, and back; a staged
tile loop turned into a two-stage cp.async ring."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast, SharedMemoryAtMost
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get, remove_all
from tests.mechanisms.roundtrip import (
    FIXTURES,
    PUBLIC_FORMS,
    RoundTripSuite,
    compile_ok,
    fixture_pairs,
)
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


def test_group_and_bulk_copies_and_undeclared_pipelines_are_refused() -> None:
    source = KernelSource(
        "#include <cuda/pipeline>\n__global__ void k(float* s, const float* g, uint64_t* bar) {\n"
        "  cuda::memcpy_async(s, g, 16, pipe);\n"
        "  cuda::memcpy_async(block, s, g, 16, barrier);\n"
        '  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes '
        '[%0], [%1], 64, [%2];" :: "r"(0), "l"(g), "r"(0) : "memory");\n}\n'
    )
    reasons = sorted(s.refusal or "" for s in mechanism.detect(source))
    assert any("pipe is not declared in k" in r for r in reasons)
    assert any("copies for a whole group of threads" in r for r in reasons)
    assert any("bulk copies complete on an mbarrier" in r for r in reasons)


LIBCU = FIXTURES / "cp_async_pipeline" / "libcu.before.cu"


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # a pipeline of the block orders one thread's copies for another thread's reads
            "cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();",
            "__shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, 1> state;\n"
            "  auto pipe = cuda::make_pipeline(cuda::this_thread_block(), &state);",
            "pipe is a pipeline made by `cuda::make_pipeline(cuda::this_thread",
        ),
        (  # a helper's sync object is what its callers pass: here a pipeline of the block
            "copy_row(row, in + base, cols, (*bar_ptr));",
            "copy_row(row, in + base, cols, shared_pipe);",
            "shared_pipe is not declared in scale_rows",
        ),
    ],
)
def test_copies_through_a_pipeline_of_many_threads_are_refused(
    old: str, new: str, reason: str
) -> None:
    text = LIBCU.read_text(encoding="utf-8")
    assert old in text
    kernel = KernelSource(text.replace(old, new))
    copies = [s for s in mechanism.detect(kernel) if "memcpy_async" in s.snippet]
    refused = [s for s in copies if not s.supported]
    assert refused and all(reason in str(s.refusal) for s in refused), [s.refusal for s in copies]


def test_a_libcu_copy_becomes_one_vector_store_where_its_size_is_aligned() -> None:
    pair = next(p for p in fixture_pairs("cp_async_pipeline") if p.case == "libcu")
    assert "*reinterpret_cast<uint4*>(&dst[c]) =" in pair.after.text
    assert "bar.arrive_and_wait();" in pair.after.text  # the barrier still orders the reads
    unaligned = KernelSource(
        LIBCU.read_text(encoding="utf-8").replace(
            "cuda::aligned_size_t<16>(sizeof(float4))", "sizeof(float4)"
        )
    )
    after = remove_all(unaligned, mechanism)
    assert "memcpy(&dst[c], &src[c], sizeof(float4));" in after.text


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


@pytest.mark.gpu
@pytest.mark.nvcc
def test_the_libcu_copies_made_synchronous_keep_the_kernel_correct(tmp_path) -> None:
    # y = 2 x: 100 x 300 takes the barrier's row path, 2048 x 4096 the pipeline's tiles
    from klineage.gate.gate import Gate
    from klineage.problem import load_problem

    problem = load_problem(FIXTURES.parent / "public_forms" / "problems" / "scale_tiles")
    pair = next(p for p in fixture_pairs("cp_async_pipeline") if p.case == "libcu")
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        for state, kernel in (("before", pair.before), ("after", pair.after)):
            source = KernelSource(kernel.text, name=f"libcu.{state}.cu")
            verdict = gate.run(problem, source, time_it=False)
            failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
            assert verdict.passed, (state, verdict.build.message, failing)


SHARED_PIPELINE = """
__global__ void shared_copy(const float* in, float* out) {
  __shared__ float tile[256];
  __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, 1> state;
  auto block = cooperative_groups::this_thread_block();
  auto pipe = cuda::make_pipeline(block, &state);
  pipe.producer_acquire();
  cuda::memcpy_async(&tile[threadIdx.x], &in[threadIdx.x], sizeof(float), pipe);
  pipe.producer_commit();
  pipe.consumer_wait();
  out[threadIdx.x] = tile[255 - threadIdx.x];
  pipe.consumer_release();
}
"""


def test_a_pipeline_shared_by_a_block_keeps_only_its_own_steps() -> None:
    # its copy stays asynchronous (refused), and so do its steps; the one-thread pipelines
    # of the other kernels lose their copies and their steps, and the round trip is exact
    from klineage.mining.removal import reapply, remove_mechanism

    text = LIBCU.read_text(encoding="utf-8")
    text = text.replace('extern "C" int run(', SHARED_PIPELINE + '\nextern "C" int run(')
    kernel = KernelSource(text)
    removal = remove_mechanism(kernel, mechanism)
    after = removal.simplified.text
    shared = after[after.index("void shared_copy") :]
    assert "pipe.producer_acquire();\n  cuda::memcpy_async(&tile" in shared
    assert "  pipe.consumer_wait();" in shared
    assert "{ /* klineage:cp_async_pipeline: pipe.consumer_release(); */ ; }" in after
    refused = {site.function for site, _ in removal.refused}
    assert refused == {"shared_copy"}
    assert reapply(removal).text == kernel.text


HELPER_PIPELINE = """
#include <cuda/pipeline>
template <typename Sync>
__device__ void stage(float* dst, const float* src, Sync& sync) {
  cuda::memcpy_async(dst, src, cuda::aligned_size_t<4>(sizeof(float)), sync);
}

__global__ void halves(const float* in, float* out) {
  __shared__ float tile[256];
  cuda::pipeline<cuda::thread_scope_thread> pipe = cuda::make_pipeline();
  pipe.producer_acquire();
  stage(&tile[threadIdx.x], &in[threadIdx.x], pipe);
  pipe.producer_commit();
  pipe.consumer_wait();
  __syncthreads();
  out[threadIdx.x] = tile[255 - threadIdx.x];
  pipe.consumer_release();
}
"""


def test_a_pipeline_handed_to_a_helper_keeps_its_steps_until_the_helper_copies_go() -> None:
    kernel = KernelSource(HELPER_PIPELINE)
    steps = [s for s in mechanism.detect(kernel) if "pipe." in s.snippet]
    assert steps and all(
        "copies through pipe remain in this function" in str(s.refusal) for s in steps
    )
    after = remove_all(kernel, mechanism).text
    assert "pipe.consumer_wait(); */ ; }" in after  # the helper's copy went, then the steps
    assert "*reinterpret_cast<unsigned*>(dst) =" in after


def test_a_helper_given_different_sync_objects_is_refused() -> None:
    # one caller passes a barrier, the other a pipeline of the block: no one reading holds
    text = HELPER_PIPELINE.replace(
        "__global__ void halves(",
        "__global__ void shared(const float* in, float* out) {\n"
        "  __shared__ float tile[256];\n"
        "  __shared__ cuda::pipeline_shared_state<cuda::thread_scope_block, 1> state;\n"
        "  auto pipe = cuda::make_pipeline(cooperative_groups::this_thread_block(), &state);\n"
        "  stage(&tile[threadIdx.x], &in[threadIdx.x], pipe);\n"
        "}\n\n__global__ void halves(",
    )
    (copy,) = [s for s in mechanism.detect(KernelSource(text)) if "memcpy_async" in s.snippet]
    assert "the calls of stage pass different kinds of sync" in str(copy.refusal), copy.refusal


RING = PUBLIC_FORMS / "cp_async_pipeline" / "ring_stages.before.cu"


def _ring_kernel(old: str = "", new: str = "") -> KernelSource:
    text = RING.read_text(encoding="utf-8")
    assert old in text
    return KernelSource(text.replace(old, new) if old else text, name="ring_stages.cu")


def _ring_sites(kernel: KernelSource, *, candidates: bool = False) -> list:
    found = mechanism.candidates(kernel) if candidates else mechanism.detect(kernel)
    return [s for s in found if s.detail.get("form") == "ring"]


def test_an_mbarrier_ring_is_detected_with_its_stage_count_as_carrier() -> None:
    kernel = _ring_kernel()
    (site,) = _ring_sites(kernel)
    assert site.supported and site.function == "stream_affine"
    assert site.snippet == "4-stage mbarrier ring (STAGES, full[])"
    assert mechanism.carrier_of(kernel, site) == Carrier(stages=4)
    assert any(
        isinstance(c, ArchAtLeast) and c.sm == 90 for c in mechanism.conditions(kernel, site)
    )


def test_a_one_stage_ring_is_a_candidate_that_takes_any_count_forward() -> None:
    one_stage = mechanism.remove(_ring_kernel(), _ring_sites(_ring_kernel())[0])
    assert "constexpr int STAGES = 1;" in one_stage.text
    assert not _ring_sites(one_stage)
    (candidate,) = _ring_sites(one_stage, candidates=True)
    assert mechanism.apply(one_stage, candidate, Carrier(stages=4)).text == RING.read_text()
    three = mechanism.apply(one_stage, candidate)  # the default: two stages
    assert "constexpr int STAGES = 2;" in three.text
    with pytest.raises(MechanismRefused, match="a pipeline needs 2 or more"):
        mechanism.apply(one_stage, candidate, Carrier(stages=1))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (  # the index wrapped by a modulo, the barriers declared in the kernel
            "  auto& ring = *reinterpret_cast<RingStorage<TILE_FLOATS, STAGES>*>(smem);\n",
            "  auto& ring = *reinterpret_cast<RingStorage<TILE_FLOATS, STAGES>*>(smem);\n"
            "  __shared__ uint64_t ready[STAGES];\n  int slot = 0;\n"
            "  slot = (slot + 1) % STAGES;\n  ready[slot] = 0;\n",
        ),
        ("if (++stage == STAGES) {", "if (STAGES == ++stage) {"),
        (  # libcu++ barriers, named by an alias
            "  alignas(8) uint64_t full[STAGES], empty[STAGES];\n",
            "  barrier full[STAGES], empty[STAGES];\n",
        ),
    ],
)
def test_the_ring_is_found_in_other_spellings(old: str, new: str) -> None:
    kernel = _ring_kernel(old, new)
    if "barrier full" in new:
        kernel = KernelSource(
            kernel.text.replace(
                "constexpr int TILE = 1024;",
                "using barrier = cuda::barrier<cuda::thread_scope_block>;\n"
                "constexpr int TILE = 1024;",
            )
        )
        without_alias = _ring_kernel(old, new)  # a type the file does not make a barrier
        assert not _ring_sites(without_alias)
    assert any(s.supported for s in _ring_sites(kernel))


def test_a_literal_stage_count_at_a_direct_launch_is_edited() -> None:
    kernel = _ring_kernel(
        "  auto* kernel = stream_affine<TILE, STAGES>;\n",
        "  auto* kernel = stream_affine<TILE, 4>;\n",
    )
    kernel = KernelSource(
        kernel.text.replace("kernel<<<blocks", "stream_affine<TILE, 3><<<blocks")
        .replace("  auto* kernel = stream_affine<TILE, 4>;\n", "")
        .replace("cudaFuncSetAttribute(kernel,", "cudaFuncSetAttribute(stream_affine<TILE, 3>,")
    )
    (site,) = _ring_sites(kernel)
    assert site.detail["stages"] == 3
    assert "stream_affine<TILE, 1><<<blocks" in mechanism.remove(kernel, site).text


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # the host reads the count for more than the kernel's template
            "  const int64_t tiles = n / TILE;\n",
            "  const int64_t tiles = n / TILE + STAGES - STAGES;\n",
            "`STAGES` is also used outside template arguments (line 119)",
        ),
        (  # two launches: which one sets the ring is not one edit
            "  return (int)cudaGetLastError();\n}",
            "  kernel<<<1, 32 + 128, shared, stream>>>(x, y, 0);\n"
            "  return (int)cudaGetLastError();\n}",
            "stream_affine is launched 2 times",
        ),
        (
            "  constexpr int STAGES = 4;\n",
            "  const int STAGES = n > 4096 ? 4 : 2;\n",
            "is not one constant at the launches",
        ),
    ],
)
def test_a_stage_count_not_written_once_is_refused_with_the_reason(
    old: str, new: str, reason: str
) -> None:
    (site,) = _ring_sites(_ring_kernel(old, new))
    assert reason in str(site.refusal), site.refusal
