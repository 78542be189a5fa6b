"""Tensor-core kernels in public spellings: PTX through macros, warp tiles through helpers."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.roundtrip import compile_ok, forward_chain, removal_chain

# PTX issued through function-like macros, qualifiers in another order than the PTX manual's
MACROS = """\
#include <cuda_fp16.h>
#include <stdint.h>
#define FRAG_X2(R0, R1, addr) \\
  asm volatile("ldmatrix.sync.aligned.x2.m8n8.shared.b16 {%0, %1}, [%2];\\n" \\
               : "=r"(R0), "=r"(R1) : "r"(addr))
#define MMA_16816(D0, D1, A0, A1, A2, A3, B0, B1) \\
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}, " \\
               "{%2, %3, %4, %5}, {%6, %7}, {%0, %1};\\n" \\
               : "+r"(D0), "+r"(D1) : "r"(A0), "r"(A1), "r"(A2), "r"(A3), "r"(B0), "r"(B1))
#define ASYNC_16(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" \\
                                        :: "r"(dst), "l"(src))
#define ASYNC_COMMIT() asm volatile("cp.async.commit_group;\\n" ::)
#define ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;\\n" :: "n"(n))
__global__ void tile(const half* a, half* c) {
  __shared__ half s[16 * 16];
  uint32_t dst = __cvta_generic_to_shared(&s[threadIdx.x * 8]);
  ASYNC_16(dst, a + threadIdx.x * 8);
  ASYNC_COMMIT();
  ASYNC_WAIT(0);
  __syncthreads();
  uint32_t b0, b1, d0 = 0, d1 = 0;
  FRAG_X2(b0, b1, dst);
  MMA_16816(d0, d1, b0, b1, b0, b1, b0, b1);
  reinterpret_cast<uint32_t*>(c)[threadIdx.x] = d0 ^ d1;
}
extern "C" int run(const half* a, half* c, cudaStream_t stream) {
  tile<<<1, 32, 0, stream>>>(a, c);
  return (int)cudaGetLastError();
}
"""

# warp tiles whose coordinates come from a 2-D block's linear index and scale in a helper
WARP_TILES = """\
template <int WM, int WN>
__device__ void store_warp_tile(float* c, int ldc, float v, int warp_row, int warp_col, int lane) {
  c[(warp_row * WM + lane / 8) * ldc + warp_col * WN + lane % 8] = v;
}
template <int WARPS_N, int WM, int WN>
__global__ void warp_tiles(float* c, int ldc) {
  const int linear = threadIdx.y * blockDim.x + threadIdx.x;
  const int warp = linear / 32;
  store_warp_tile<WM, WN>(c, ldc, 1.f, warp / WARPS_N, warp % WARPS_N, linear % 32);
}
"""


def test_ptx_through_macros_is_removed_through_the_expansion_and_restored(
    mechanism_builder: Builder,
) -> None:
    kernel = KernelSource(MACROS)
    states = []
    for name in ("cp_async_pipeline", "ldmatrix"):
        mechanism = get(name)
        sites = mechanism.detect(kernel)
        assert {s.detail["macro"] for s in sites} <= {
            "ASYNC_16",
            "ASYNC_COMMIT",
            "ASYNC_WAIT",
            "FRAG_X2",
        }
        chain = removal_chain(mechanism, kernel)
        assert chain.sites and not [s for s in mechanism.detect(chain.states[-1]) if s.supported]
        assert "klineage:" + name in chain.states[-1].text  # the macro call kept in the stash
        restored = forward_chain(mechanism, chain)
        assert restored[-1].text == kernel.text
        states.append(chain.states[-1])
    compile_ok(mechanism_builder, states)


def test_macro_commits_wait_for_the_macro_copies() -> None:
    copies = get("cp_async_pipeline").detect(KernelSource(MACROS))
    commit = next(s for s in copies if s.detail["macro"] == "ASYNC_COMMIT")
    assert "asynchronous copies remain in the file" in str(commit.refusal)


def test_an_f16_accumulating_mma_macro_is_refused_by_the_emulation() -> None:
    (site,) = get("tensor_core_mma").detect(KernelSource(MACROS))
    assert site.detail["macro"] == "MMA_16816"
    assert "fp32 accumulation, the form the scalar emulation covers" in str(site.refusal)
    with pytest.raises(MechanismRefused):
        get("tensor_core_mma").remove(KernelSource(MACROS), site)


def test_qualifier_order_does_not_matter() -> None:
    (site,) = get("ldmatrix").detect(KernelSource(MACROS))
    assert site.detail["instruction"] == "ldmatrix.sync.aligned.x2.m8n8.shared.b16"
    assert site.supported


def test_warp_tiles_scaled_inside_a_helper_are_found() -> None:
    (site,) = get("warp_tiling").detect(KernelSource(WARP_TILES))
    assert site.function == "warp_tiles" and site.refusal is not None
    assert site.detail["coordinates"] == "[warp % WARPS_N], [warp / WARPS_N]"


# chunks of each row rotated by a row-dependent amount for cp.async writes
ROTATED = """\
#include <cuda_fp16.h>
#include <stdint.h>
__global__ void stage(const half* a, int lda) {
  __shared__ half tile[64][32];
  const int lane = threadIdx.x % 32;
  for (int row = threadIdx.x / 4; row < 64; row += blockDim.x / 4) {
    uint32_t dst = __cvta_generic_to_shared(&tile[row][0]) +
                   ((lane % 4 + (row % 8) / 2) % 4) * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(dst),
                 "l"(a + row * lda));
  }
}
"""

# the swizzle is the copy engine's: a tensor map in 128-byte swizzle mode
TMA_SWIZZLE = """\
#include <cuda.h>
CUresult make_map(CUtensorMap* map, void* base, const cuuint64_t* shape,
                  const cuuint64_t* stride, const cuuint32_t* box, const cuuint32_t* elem) {
  return cuTensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, shape, stride,
                                box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
"""


def test_a_rotation_of_chunks_and_a_tma_swizzle_mode_are_swizzles() -> None:
    swizzle = get("smem_swizzle")
    (rotation,) = swizzle.detect(KernelSource(ROTATED))
    assert rotation.start_line == 7
    # its one access is rotated: the rotation removal takes it (test_public_swizzle.py)
    assert rotation.supported and rotation.detail["form"] == "rotation"
    (tma,) = swizzle.detect(KernelSource(TMA_SWIZZLE))
    assert "a 128-byte swizzle applied by the TMA copy engine" in str(tma.refusal)
