"""Removing tiles a device helper stages (the SGEMM tutorial idiom): each read ``S[e]``, in
the kernel or in a reader helper, becomes the global load that filled slot ``e``; the
refusals name the form."""

from __future__ import annotations

import itertools

import pytest

from klineage.cuda.analysis import IndexForm
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms._staging_helper import _layout, _stores
from klineage.mechanisms.base import Site
from tests.mechanisms.roundtrip import PUBLIC_FORMS

staging = get("smem_staging")
FIXTURE = PUBLIC_FORMS / "smem_staging" / "helper_tiles.before.cu"

# the tiles read in the kernel itself, a scalar copy of B
DIRECT = """\
template <const int BM, const int BK>
__device__ void stage(int K, const float *A, const float *B, float *As, float *Bs, int r, int c) {
  for (int off = 0; off + 8 <= BM; off += 8) {
    const float4 quad = *reinterpret_cast<const float4 *>(&A[(r + off) * K + c * 4]);
    As[(c * 4 + 0) * BM + r + off] = quad.x;
    As[(c * 4 + 1) * BM + r + off] = quad.y;
    As[(c * 4 + 2) * BM + r + off] = quad.z;
    As[(c * 4 + 3) * BM + r + off] = quad.w;
  }
  Bs[threadIdx.x] = B[threadIdx.x];
}

template <const int BM, const int BK>
__global__ void dot_tiles(int K, const float *A, const float *B, float *C) {
  __shared__ float As[BM * BK];
  __shared__ float Bs[BK];
  float acc = 0.0f;
  for (int t = 0; t < K; t += BK) {
    stage<BM, BK>(K, A, B, As, Bs, threadIdx.x / 4, threadIdx.x % 4);
    __syncthreads();
    for (int k = 0; k < BK; ++k) acc += As[k * BM + threadIdx.x] * Bs[k];
    A += BK;
    B += BK;
    __syncthreads();
  }
  C[threadIdx.x] = acc;
}
"""


def _site(text: str) -> Site:
    (site,) = staging.detect(KernelSource(text))
    return site


def _removed(text: str) -> str:
    site = _site(text)
    assert site.supported and site.detail["form"] == "helper", site.refusal
    return staging.remove(KernelSource(text), site).text


def _refusal(text: str) -> str:
    site = _site(text)
    assert site.refusal is not None and "as tiles a helper stages" in site.refusal
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(text), site)
    return site.refusal


def test_reads_in_the_kernel_become_the_loads_that_filled_their_slots() -> None:
    removed = _removed(DIRECT)
    assert "acc += A[(k * BM + threadIdx.x) % BM * K + (k * BM + threadIdx.x) / BM] * B[k];" in (
        removed
    )
    assert "__shared__" not in removed and "__syncthreads" not in removed
    assert "stage<" not in removed and "A += BK;" in removed
    assert not [s for s in staging.detect(KernelSource(removed)) if s.supported]


def test_a_reader_helper_called_twice_is_refused() -> None:
    text = FIXTURE.read_text()
    twice = text.replace(
        "  for (int i = 0; i < TM; ++i) {\n    for (int j = 0; j < TN; ++j) {\n      C[",
        "  tiles::multiplyTiles<BM, BN, BK, TM, TN>(regA, regB, acc, As, Bs, threadRow, "
        "threadCol);\n  for (int i = 0; i < TM; ++i) {\n    for (int j = 0; j < TN; ++j) {\n"
        "      C[",
    )
    assert twice != text
    refusal = staging.detect(KernelSource(twice))[0].refusal
    assert refusal is not None and "not a helper called only here" in refusal


def test_a_pointer_moved_before_the_reads_is_refused() -> None:
    moved = DIRECT.replace(
        "    __syncthreads();\n    for (int k", "    __syncthreads();\n    A += 1;\n    for (int k"
    )
    assert "writes A between the loader's call and the last read" in _refusal(moved)


def test_a_conditional_store_is_refused() -> None:
    guarded = DIRECT.replace("  Bs[threadIdx.x]", "  if (K > 0) Bs[threadIdx.x]")
    assert "is conditional" in _refusal(guarded)


def test_tiles_of_one_and_two_dimensions_in_one_call_are_refused() -> None:
    two_d = (
        DIRECT.replace("float *Bs,", "float Bs[1][BK],")
        .replace("Bs[threadIdx.x] = B", "Bs[0][threadIdx.x] = B")
        .replace("__shared__ float Bs[BK];", "__shared__ float Bs[1][BK];")
        .replace("* Bs[k]", "* Bs[0][k]")
    )
    assert "shared arrays of several dimensions in one call (As: 1, Bs: 2)" in _refusal(two_d)


def test_a_slot_in_three_components_is_refused() -> None:
    three = DIRECT.replace(
        "Bs[threadIdx.x] = B[threadIdx.x];",
        "Bs[r * BK * BM + c * BM + threadIdx.x] = B[r + c + threadIdx.x];",
    )
    assert "in 3 components" in _refusal(three)


def test_a_row_stride_of_any_value_is_read_back() -> None:
    strided = DIRECT.replace("Bs[threadIdx.x] = B[threadIdx.x];", "Bs[r * BK + c] = B[r * 7 + c];")
    assert "* B[k % BK + k / BK * 7];" in _removed(strided)


def _evaluate(form: IndexForm, values: dict[str, int]) -> int:
    value = form.substitute({a: IndexForm.constant(v) for a, v in values.items()}).value
    assert value is not None, (form, values)
    return value


@pytest.mark.parametrize(("array", "extent"), [("As", 64 * 16), ("Bs", 16 * 64)])
def test_every_slot_is_read_at_the_offset_its_store_loaded(array: str, extent: int) -> None:
    """The fixture's loader, run for every thread of a 128-thread block, every loop turn and
    lane: each slot is filled once, with the global offset the layout gives back for it."""
    source = KernelSource.from_file(FIXTURE).parsed
    (loader,) = [f for f in source.functions if f.name == "stageTiles"]
    constants = {"BM": 64, "BN": 64, "BK": 16, "strideA": 32, "strideB": 8, "K": 48, "N": 128}
    layout = _layout(source, loader, array)
    filled: dict[int, int] = {}
    for store in _stores(source, loader, array):
        (loop,) = [a for a in store.slot.atoms() if "@" in a]
        stride = constants["strideA" if array == "As" else "strideB"]
        bound = constants["BM" if array == "As" else "BK"]
        for tid, off in itertools.product(range(128), range(0, bound, stride)):
            values = {
                **constants,
                "rowA": tid // 4,
                "colA": tid % 4,
                "rowB": tid // 16,
                "colB": tid % 16,
                loop: off,
            }
            slot, offset = _evaluate(store.slot, values), _evaluate(store.offset, values)
            assert filled.setdefault(slot, offset) == offset
    assert sorted(filled) == list(range(extent))
    high = _evaluate(layout.high, constants) if layout.high is not None else extent
    for slot, offset in filled.items():
        row, column = slot % high, slot // high
        got = (
            _evaluate(layout.g_low, constants) * row
            + _evaluate(layout.g_high, constants) * column
            + _evaluate(layout.rest, constants)
        )
        assert got == offset
