"""Shared-memory staging in the spellings public kernels use."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host

staging = get("smem_staging")

# a transpose through one padded tile, barrier through cooperative groups, no loop around it
# (locals reassigned between the staging and the reads)
ONE_TILE = """\
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#define TILE 32
#define ROWS 8
__global__ void flip(float* out, const float* in, int width, int height) {
  cg::thread_block cta = cg::this_thread_block();
  __shared__ float tile[TILE][TILE + 1];
  int x = blockIdx.x * TILE + threadIdx.x, y = blockIdx.y * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    tile[threadIdx.y + j][threadIdx.x] = in[(y + j) * width + x];
  cg::sync(cta);
  x = blockIdx.y * TILE + threadIdx.x;
  y = blockIdx.x * TILE + threadIdx.y;
  for (int j = 0; j < TILE; j += ROWS)
    out[(y + j) * height + x] = tile[threadIdx.x][threadIdx.y + j];
}
"""

# tiles loaded by a helper that gets the shared arrays, vectors through float4
HELPER_TILES = """\
template <int BM, int BK>
__device__ void fetch(const float* a, int lda, float* a_tile, int row, int col) {
  const float4 v = reinterpret_cast<const float4*>(&a[row * lda + col * 4])[0];
  a_tile[(col * 4 + 0) * BM + row] = v.x;
  a_tile[(col * 4 + 1) * BM + row] = v.y;
  a_tile[(col * 4 + 2) * BM + row] = v.z;
  a_tile[(col * 4 + 3) * BM + row] = v.w;
}
template <int BM, int BK>
__global__ void gemm(const float* a, const float* b, float* c, int n, int k) {
  __shared__ float a_tile[BM * BK];
  float acc = 0.f;
  const float* a_block = a + blockIdx.y * BM * k;
  for (int k0 = 0; k0 < k; k0 += BK) {
    fetch<BM, BK>(a_block + k0, k, a_tile, threadIdx.x / (BK / 4), threadIdx.x % (BK / 4));
    __syncthreads();
    for (int kk = 0; kk < BK; ++kk) acc += a_tile[kk * BM + threadIdx.x % BM] * b[(k0 + kk) * n];
    __syncthreads();
  }
  c[blockIdx.y * BM * n + threadIdx.x] = acc;
}
"""

# a row's parameters staged once through a cast of the dynamic buffer, read by every row
CAST_ONCE = """\
struct alignas(16) Vec { float v[4]; };
__global__ void affine_rows(const float* w, const float* x, float* y, int rows, int cols) {
  extern __shared__ char raw[];
  Vec* sw = reinterpret_cast<Vec*>(raw);
  for (int c = threadIdx.x * 4; c < cols; c += blockDim.x * 4)
    sw[c / 4] = *reinterpret_cast<const Vec*>(w + c);
  __syncthreads();
  for (int r = blockIdx.x; r < rows; r += gridDim.x)
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      y[r * cols + c] = x[r * cols + c] * sw[c / 4].v[c % 4];
}
"""

# a block reduction: shared memory holds partial sums, not staged input (not a site)
PARTIALS = """\
__global__ void sums(const float* x, float* y, int n) {
  __shared__ float part[32];
  float acc = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += x[blockIdx.x * n + i];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) y[blockIdx.x] = part[0] + part[1];
}
"""


def _only_site(text: str):
    (site,) = staging.detect(KernelSource(text))
    return site


def test_a_single_tile_behind_a_cooperative_groups_barrier_is_staging_removed_once() -> None:
    site = _only_site(ONE_TILE)
    assert site.snippet == "for (int j = 0; j < TILE; j += ROWS)" and site.start_line == 9
    assert site.supported and site.detail["form"] == "once"
    removed = staging.remove(KernelSource(ONE_TILE), site).text
    # x and y as they were when the tile was stored, not as reassigned before the read
    assert (
        "out[(y + j) * height + x] = "
        "in[(blockIdx.y * TILE + threadIdx.x) * width + (blockIdx.x * TILE + (threadIdx.y + j))];"
    ) in removed
    assert "__shared__" not in removed and "sync" not in removed and "cta" not in removed


def test_a_tile_loop_whose_stores_are_in_a_helper_is_staging() -> None:
    site = _only_site(HELPER_TILES)
    assert site.snippet == "for (int k0 = 0; k0 < k; k0 += BK)"
    assert "stored by the helper fetch, which gets the shared arrays" in str(site.refusal)


def test_stores_through_a_cast_of_the_dynamic_buffer_are_staging_removed_once() -> None:
    site = _only_site(CAST_ONCE)
    assert site.start_line == 5 and site.supported and site.detail["form"] == "once"
    removed = staging.remove(KernelSource(CAST_ONCE), site).text
    # c is not a multiple of 4 here, so the slot's iteration is written out
    assert "* (*reinterpret_cast<const Vec*>(w + (c / 4) * 4)).v[c % 4];" in removed
    assert "__shared__" not in removed and "__syncthreads" not in removed


def _once_refusal(text: str) -> str:
    (site,) = staging.detect(KernelSource(text))
    assert site.refusal is not None and site.refusal.startswith("the site is tiles staged once")
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(text), site)
    return site.refusal


def test_a_staging_loop_whose_index_is_not_a_multiple_of_the_pack_is_refused() -> None:
    shifted = CAST_ONCE.replace("int c = threadIdx.x * 4;", "int c = threadIdx.x;")
    assert "whose index c (from threadIdx.x, step 4·blockDim.x) is not always a multiple of 4" in (
        _once_refusal(shifted)
    )


def test_a_staged_value_that_differs_between_threads_is_refused() -> None:
    local = CAST_ONCE.replace(
        "  for (int c = threadIdx.x * 4;",
        "  int lane = threadIdx.x % 32;\n  for (int c = threadIdx.x * 4;",
    ).replace(
        "sw[c / 4] = *reinterpret_cast<const Vec*>(w + c);", "sw[c / 4] = Vec{{w[c + lane]}};"
    )
    assert "a staged value `Vec{{w[c + lane]}}` that uses lane" in _once_refusal(local)


def test_a_staged_buffer_written_again_is_refused() -> None:
    again = CAST_ONCE.replace(
        "      y[r * cols + c] =", "      if (c == 0) sw[0].v[0] = 0.f;\n      y[r * cols + c] ="
    )
    assert "sw written again at line 10" in _once_refusal(again)


def test_partial_sums_in_shared_memory_are_not_staging() -> None:
    assert staging.detect(KernelSource(PARTIALS)) == []


# A kernel written once for several bodies, each body a __device__ function bound as a template
# argument; this body stages 128 x 32 slices of q and k for the whole block and reads them with
# a column skewed by the thread (public llm.c-style attention score tiles).
BODY_STAGES_TILES = """\
using tile_body = void (*)(float* p, const float* k, const float* q, int ld, int hs);
__device__ void staged_scores(float* p, const float* k, const float* q, int ld, int hs) {
  __shared__ float q_s[128][32];
  __shared__ float k_s[128][32];
  float acc[8][8] = {};
  for (int so = 0; so < hs; so += 32) {
    __syncthreads();
    for (int y = threadIdx.y / 2; y < 128; y += 8) {
      int xo = (threadIdx.y % 2) * 16;
      q_s[y][threadIdx.x + xo] = q[y * ld + so + threadIdx.x + xo];
      k_s[y][threadIdx.x + xo] = k[y * ld + so + threadIdx.x + xo];
    }
    __syncthreads();
    for (int si = 0; si < 32; ++si)
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 8; ++j)
          acc[i][j] += q_s[i + 8 * threadIdx.x][(si + threadIdx.x) % 32] *
                       k_s[j + 8 * threadIdx.y][(si + threadIdx.x) % 32];
  }
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) p[(8 * threadIdx.x + i) * 128 + 8 * threadIdx.y + j] = acc[i][j];
}
template <tile_body body>
__global__ void scores(float* p, const float* k, const float* q, int ld, int hs) {
  body(p, k, q, ld, hs);
}
extern "C" void launch(float* p, const float* k, const float* q, int ld, int hs) {
  scores<staged_scores><<<1, dim3(16, 16)>>>(p, k, q, ld, hs);
}
"""


def test_tiles_a_template_bound_body_stages_through_a_loader_loop_are_removed() -> None:
    """Detected in the body the launch binds; each read becomes the global element the loader
    stored there (`q[so + ld * row + col]`), the loader, the tiles and the barriers go."""
    kernel = KernelSource(BODY_STAGES_TILES)
    (site,) = staging.detect(kernel)
    assert site.function == "staged_scores" and site.supported
    assert site.detail["form"] == "loader"
    removed = staging.remove(kernel, site).text
    assert "__shared__" not in removed and "__syncthreads" not in removed
    assert "for (int y = threadIdx.y / 2" not in removed
    assert "q[so + (ld) * (i + 8 * threadIdx.x) + ((si + threadIdx.x) % 32)]" in removed
    assert "k[so + (ld) * (j + 8 * threadIdx.y) + ((si + threadIdx.x) % 32)]" in removed
    unbound = BODY_STAGES_TILES.replace("scores<staged_scores><<<", "scores<nullptr><<<")
    assert staging.detect(KernelSource(unbound)) == []  # no kernel runs that body


def test_a_loader_storing_a_computed_value_or_moving_its_pointer_is_refused() -> None:
    scaled = BODY_STAGES_TILES.replace(
        "q_s[y][threadIdx.x + xo] = q[y * ld + so + threadIdx.x + xo];",
        "q_s[y][threadIdx.x + xo] = 2.0f * q[y * ld + so + threadIdx.x + xo];",
    )
    (site,) = staging.detect(KernelSource(scaled))
    assert "as tiles a loader stages, it is a store into q_s of `2.0f * q[" in (site.refusal or "")
    moved = BODY_STAGES_TILES.replace(
        "  for (int so = 0; so < hs; so += 32) {\n    __syncthreads();",
        "  for (int so = 0; so < hs; so += 32) {\n    __syncthreads();\n    q += 0;",
    )
    assert "q += 0;" in moved
    (site,) = staging.detect(KernelSource(moved))
    assert "runs `q += 0;`" in (site.refusal or "")
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(moved), site)


# The sample-style tiled product: the tile loop steps two offsets at once (`a += step_a, b +=
# step_b`) and declares its tiles in the turn; the analysis writes b as its start plus the
# loop's advance, which the removal renders as `b` again.
TWO_OFFSETS = """\
#define TILE 16
__global__ void matmul(float* c, const float* a_mat, const float* b_mat, int wa, int wb) {
  float sum = 0.0f;
  for (int a = wa * TILE * blockIdx.y, b = TILE * blockIdx.x; a < wa * TILE * blockIdx.y + wa;
       a += TILE, b += TILE * wb) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    as[threadIdx.y][threadIdx.x] = a_mat[a + wa * threadIdx.y + threadIdx.x];
    bs[threadIdx.y][threadIdx.x] = b_mat[b + wb * threadIdx.y + threadIdx.x];
    __syncthreads();
    for (int k = 0; k < TILE; ++k) sum += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  c[(blockIdx.y * TILE + threadIdx.y) * wb + blockIdx.x * TILE + threadIdx.x] = sum;
}
"""


def test_tiles_of_a_loop_stepping_two_offsets_read_the_second_by_name() -> None:
    kernel = KernelSource(TWO_OFFSETS)
    (site,) = staging.detect(kernel)
    assert site.supported and site.detail["form"] == "loader"
    removed = staging.remove(kernel, site).text
    assert (
        "sum += a_mat[a + (wa) * (threadIdx.y) + (k)] * b_mat[b + (wb) * (k) + (threadIdx.x)]"
        in (removed)
    )
    assert "__shared__" not in removed and "__syncthreads" not in removed


def test_a_second_offset_stepped_but_declared_before_the_loop_is_refused() -> None:
    """Its start is not in the loop's header, so the read could not be written by name."""
    text = TWO_OFFSETS.replace(
        "  float sum = 0.0f;\n", "  float sum = 0.0f;\n  int b = TILE * blockIdx.x;\n"
    )
    text = text.replace(", b = TILE * blockIdx.x;", ";")
    assert "int b = TILE * blockIdx.x;" in text and "b = TILE * blockIdx.x; a <" not in text
    (site,) = staging.detect(KernelSource(text))
    assert not site.supported
    assert "a store into bs whose global offset" in (site.refusal or "")


def _host_cases() -> list[tuple[str, Case]]:
    """(kernel, launch) pairs for the loader removal's host check: one 16 x 16 block of the
    template-bound scores body, and a 2 x 2 grid of the two-offset product."""
    scores = Case(
        axes={"ld": 96, "hs": 64},
        buffers=[
            Buffer("p", "float", "128 * 128", output=True),
            Buffer("k", "float", "128 * ld", offset=1),
            Buffer("q", "float", "128 * ld", offset=3),
        ],
        call="scores<staged_scores>(p, k, q, (int)ld, (int)hs)",
        threads="",
        grid="dim3(1)",
    )
    product = Case(
        axes={"wa": 48, "wb": 32},
        buffers=[
            Buffer("c", "float", "32 * wb", output=True),
            Buffer("a_mat", "float", "32 * wa", offset=1),
            Buffer("b_mat", "float", "wa * wb", offset=2),
        ],
        call="matmul(c, a_mat, b_mat, (int)wa, (int)wb)",
        threads="",
        grid="dim3(2, 2)",
    )
    return [(BODY_STAGES_TILES, scores), (TWO_OFFSETS, product)]


@pytest.mark.nvcc
@pytest.mark.parametrize(("text", "case"), _host_cases(), ids=["template_body", "two_offsets"])
def test_the_loader_removal_computes_the_same_bits_on_the_host(text: str, case: Case) -> None:
    """With the tiles removed, the kernel prints the same output bytes on the host as with
    them (the removal reads the elements the loader stored, in the same order)."""
    kernel = KernelSource(text)
    removed = staging.remove(kernel, staging.detect(kernel)[0]).text
    staged = run_on_host(text, [case])
    assert staged.strip() and run_on_host(removed, [case]) == staged


def test_an_offset_left_with_the_loader_s_own_variable_is_refused() -> None:
    """`r * r` is no multiple of a subscript: it would stay in the read, where the loader's
    `r` is out of scope."""
    text = """\
__global__ void rows(float* out, const float* in, int ld, int n) {
  __shared__ float s[4][32];
  float acc = 0.0f;
  for (int k0 = 0; k0 < n; k0 += 32) {
    __syncthreads();
    for (int r = 0; r < 4; ++r) s[r][threadIdx.x] = in[r * ld + r * r + k0 + threadIdx.x];
    __syncthreads();
    for (int r = 0; r < 4; ++r) acc += s[r][(threadIdx.x + 1) % 32];
  }
  out[threadIdx.x] = acc;
}
"""
    (site,) = staging.detect(KernelSource(text))
    assert not site.supported
    assert "has a part that differs between threads or turns of the loader" in (site.refusal or "")
