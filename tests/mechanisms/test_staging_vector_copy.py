"""smem_staging on tiles a SIMT GEMM fills 16 (or 8) bytes at a time: the vector views the
loader rule reads lane by lane, and the copies it refuses because their lanes do not line up
with the tile's (the removals themselves are the ``vector_tiles`` and ``vector_pairs`` pairs of
tests/fixtures/public_forms/smem_staging/)."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms._staging_vector_copy import vector_copy
from tests.mechanisms.roundtrip import PUBLIC_FORMS

staging = get("smem_staging")
TILES = (PUBLIC_FORMS / "smem_staging" / "vector_tiles.before.cu").read_text()
PAIRS = (PUBLIC_FORMS / "smem_staging" / "vector_pairs.before.cu").read_text()
A_COPY = "F4(sa[sa_row][sa_col]) = F4(a[a_addr]);"


def _copy_of(text: str, statement: str):
    source = KernelSource(text).parsed
    (node,) = [
        n for n in source.iter_nodes("expression_statement") if source.text_of(n) == statement
    ]
    copy = vector_copy(source, node)
    return (
        None
        if copy is None
        else (source.text_of(copy.target), source.text_of(copy.value), copy.vector)
    )


@pytest.mark.parametrize(
    "spelling",
    [
        "F4(sa[sa_row][sa_col]) = F4(a[a_addr]);",
        "reinterpret_cast<float4 *>(&(sa[sa_row][sa_col]))[0] = "
        "reinterpret_cast<float4 *>(&(a[a_addr]))[0];",
        "*reinterpret_cast<float4 *>(&sa[sa_row][sa_col]) = "
        "*reinterpret_cast<float4 *>(&a[a_addr]);",
        "*(float4 *)(&sa[sa_row][sa_col]) = *(float4 *)(&a[a_addr]);",
    ],
    ids=["macro", "cast_index", "cast_deref", "c_cast"],
)
def test_every_spelling_of_a_vector_copy_names_both_elements(spelling: str) -> None:
    text = TILES.replace(A_COPY, spelling)
    assert _copy_of(text, spelling) == ("sa[sa_row][sa_col]", "a[a_addr]", "float4")
    site = next(s for s in staging.detect(KernelSource(text)) if s.function == "sgemm_vector_tiles")
    assert site.supported and site.detail == {"form": "loader"}


def test_a_copy_of_two_vector_types_is_no_copy() -> None:
    mixed = "F4(sa[sa_row][sa_col]) = *(int4 *)(&a[a_addr]);"
    assert _copy_of(TILES.replace(A_COPY, mixed), mixed) is None


def _refusal(text: str) -> str:
    (site,) = [s for s in staging.detect(KernelSource(text)) if s.start_line > 15]
    assert not site.supported
    return site.refusal or ""


def test_lanes_that_are_not_contiguous_in_global_memory_are_refused() -> None:
    # the tile's column walks rows of A: its four lanes are K apart there
    text = TILES.replace(
        "int a_addr = a_row * K + kt * BK + sa_col;",
        "int a_addr = (kt * BK + sa_col) * K + a_row;",
    )
    assert "float4 copy whose global offset steps by K where the tile's inner subscript" in (
        _refusal(text)
    )


def test_lanes_of_another_element_type_are_refused() -> None:
    text = TILES.replace("float *a, float *b", "double *a, float *b").replace(
        "const_cast<float *>(A)", "(double *)(A)"
    )
    assert "a pointer to double: its lanes are not the tile's elements" in _refusal(text)


def test_two_copies_into_one_tile_must_map_their_slots_alike() -> None:
    text = PAIRS.replace(
        "V2(sa[sa_row][sa_col + 2]) = V2(a[a_at + 2]);",
        "V2(sa[sa_row][sa_col + 2]) = V2(a[a_at + K + 2]);",
    )
    assert (
        "stores into sa at lines 21 and 22 whose slots map to global memory in different ways"
        in (_refusal(text))
    )


VIEWED_ONCE = """\
#define F4(v) (reinterpret_cast<float4 *>(&(v))[0])
__global__ void transpose_f32x4(float *x, float *y, int n) {
  __shared__ float tile[32][36];
  const int r = threadIdx.y, c = threadIdx.x * 4;
  F4(tile[r][c]) = F4(x[(blockIdx.y * 32 + r) * n + blockIdx.x * 32 + c]);
  __syncthreads();
  for (int k = 0; k < 4; ++k)
    y[(blockIdx.x * 32 + c + k) * n + blockIdx.y * 32 + r] = tile[r][c + k];
}
"""

CAST_FROM_DYNAMIC = """\
__global__ void stage_dynamic(const float4 *x, float *y, int n) {
  extern __shared__ char buffer[];
  reinterpret_cast<float4 *>(buffer)[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  const float *row = reinterpret_cast<const float *>(buffer);
  y[blockIdx.x * blockDim.x + threadIdx.x] = row[(threadIdx.x * 5) % (4 * blockDim.x)];
}
"""


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (VIEWED_ONCE, "stored through a vector view of its elements"),
        (CAST_FROM_DYNAMIC, "stored through a pointer cast from a dynamic shared buffer"),
    ],
    ids=["vector_view", "dynamic_buffer"],
)
def test_a_refused_site_says_how_its_stores_reach_the_tile(text: str, said: str) -> None:
    refusals = [s.refusal or "" for s in staging.detect(KernelSource(text)) if not s.supported]
    assert any(said in r for r in refusals), refusals
