"""The tensor_core_mma mechanism: mma.sync emulated on the FMA pipes, and put back."""

from __future__ import annotations

import pytest

from klineage.conditions import ArchAtLeast, BlockSizeMultiple
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from tests.conftest import REPO
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("tensor_core_mma")


class TestTensorCoreMma(RoundTripSuite):
    mechanism = "tensor_core_mma"


def _asm_kernel(instruction: str, operands: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_fp16.h>\n#include <stdint.h>\n"
        "__device__ void f(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {\n"
        f'  asm volatile("{instruction}" {operands});\n}}\n'
    )


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("tensor_core_mma") >= 1


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "tensor_core_mma")


def test_the_emulation_gathers_the_fragments_of_the_ptx_layout() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    (site,) = [s for s in mechanism.detect(before) if s.node_kind == "expression_statement"]
    text = mechanism.remove(before, site).text
    # A rows g and g + 8 come from lane 4 g + s; B columns 2t and 2t + 1 from lanes
    # 4 (2t) + s and 4 (2t + 1) + s; the bf16 pairs unpack low half first.
    for piece in (
        "kl_a[2 * kl_h], 4 * kl_g + kl_s",
        "kl_a[2 * kl_h + 1], 4 * kl_g + kl_s",
        "kl_b[kl_h], 8 * kl_t + kl_s",
        "kl_b[kl_h], 8 * kl_t + 4 + kl_s",
        "kl_d[3] += kl_y0 * kl_q0 + kl_y1 * kl_q1;",
        "__uint_as_float((kl_a_lo) << 16)",
        "float kl_d[4] = {d[0], d[1], d[2], d[3]};",
        "d[3] = kl_d[3];",
    ):
        assert piece in text


def test_the_wrapper_and_its_call_sites_go_together() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    sites = mechanism.detect(before)
    assert [s.node_kind for s in sites] == ["expression_statement", "call_expression"]
    call = sites[1]
    assert call.function == "gemm_mma" and call.detail["wrapper"] == "mma_m16n8k16"
    assert mechanism.remove(before, call).text == mechanism.remove(before, sites[0]).text


@pytest.mark.parametrize(
    ("instruction", "operands", "reason"),
    [
        (
            "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
            "{%0,%1,%2,%3};",
            ': "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(b0)',
            "is not m16n8k16.row.col",
        ),
        ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0}, %1, %2;", "", "wgmma"),
    ],
)
def test_other_forms_are_detected_and_refused(instruction: str, operands: str, reason: str) -> None:
    source = _asm_kernel(instruction, operands)
    (site,) = mechanism.detect(source)
    assert site.refusal is not None and reason in site.refusal
    with pytest.raises(MechanismRefused, match=reason):
        mechanism.remove(source, site)


def test_wmma_is_detected_and_refused() -> None:
    source = KernelSource(
        "#include <mma.h>\nusing namespace nvcuda;\n"
        "__global__ void k() { wmma::mma_sync(c, a, b, c); }\n"
    )
    (site,) = mechanism.detect(source)
    assert "opaque" in (site.refusal or "")


def test_apply_restores_only_its_own_emulation() -> None:
    naive = fixture_pairs("tensor_core_mma")[0].after
    assert [c for c in mechanism.candidates(naive) if c.supported]
    edited = KernelSource(naive.text.replace("kl_d[0] += kl_x0", "kl_d[0] -= kl_x0"))
    (candidate,) = mechanism.candidates(edited)
    assert "edited since the removal" in (candidate.refusal or "")
    with pytest.raises(MechanismRefused, match="edited since the removal"):
        mechanism.apply(edited, candidate)
    scalar = KernelSource.from_file(REPO / "heldout" / "sgemm" / "kernel.cu")
    (loop,) = mechanism.candidates(scalar)
    with pytest.raises(MechanismRefused, match="re-tiles the loop"):
        mechanism.apply(scalar, loop)


def test_conditions() -> None:
    before = fixture_pairs("tensor_core_mma")[0].before
    conditions = mechanism.conditions(before, mechanism.detect(before)[1])
    arch = next(c for c in conditions if isinstance(c, ArchAtLeast))
    assert arch.sm == 80 and not arch.specific
    warp = next(c for c in conditions if isinstance(c, BlockSizeMultiple))
    assert (warp.k, warp.block_size) == (32, "32")
    assert any("multiple of 16" in c.prose for c in conditions)


def test_an_f16_mma_removed_from_the_fmha_expert_is_restorable() -> None:
    # the f16 emulation needs cuda_fp16.h: a need of the whole file, so the remembered
    # statement (parsed alone when the stash is checked) must not be refused for lacking it
    expert = KernelSource.from_file(REPO / "expert_kernels" / "fmha_fp16" / "kernel.cu")
    site = next(s for s in mechanism.detect(expert) if s.node_kind == "expression_statement")
    assert site.supported and "f16.f16" in str(site.detail["instruction"])
    simplified = mechanism.remove(expert, site)
    (candidate,) = [c for c in mechanism.candidates(simplified) if c.supported]
    assert mechanism.apply(simplified, candidate).text == expert.text
    without_header = KernelSource(expert.text.replace("#include <cuda_fp16.h>", ""))
    site = next(
        s for s in mechanism.detect(without_header) if s.node_kind == "expression_statement"
    )
    assert site.refusal == "the f16 emulation needs cuda_fp16.h, which the file lacks"


# ---------------------------------------------------------------------------------------------
# Forward on a staged tile product of 16-bit operands: warp-wide mma.sync
# ---------------------------------------------------------------------------------------------

STAGED = REPO / "tests" / "fixtures" / "mechanisms" / "thread_coarsening" / "forward"
"""smem_staging's children of the held-out GEMMs (the register tile's fixtures)."""
FORWARD = REPO / "tests" / "fixtures" / "mechanisms" / "tensor_core_mma" / "forward"

# mma.sync on the host, for the emulation harness: the warp's lanes post their fragments, meet,
# each forms its four outputs from every lane's (the PTX ISA layout: lane 4g + t holds A rows g
# and g + 8 at k 2t, 2t + 1 and 2t + 8, 2t + 9, B column g at those k, C rows g and g + 8 at
# columns 2t and 2t + 1), summing k in ascending order as the scalar loop does, and meet again.
HOST_MMA = """
static unsigned kl_mma_a[32][32][4], kl_mma_b[32][32][2];
static float kl_half_bits(unsigned bits) {
#ifdef KL_BF16
  const unsigned wide = bits << 16;
  float value;
  memcpy(&value, &wide, sizeof(value));
  return value;
#else
  return __half2float(__ushort_as_half((unsigned short)bits));
#endif
}
static void kl_mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  const unsigned warp = kl_linear() / 32, lane = kl_linear() % 32;
  memcpy(kl_mma_a[warp][lane], a, sizeof(a));
  memcpy(kl_mma_b[warp][lane], b, sizeof(b));
  kl_warp_sync(warp);
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, t = l % 4;
    for (unsigned h = 0; h < 2; ++h) {
      A[g][2 * t + h] = kl_half_bits(kl_mma_a[warp][l][0] >> (16 * h) & 0xffffu);
      A[g + 8][2 * t + h] = kl_half_bits(kl_mma_a[warp][l][1] >> (16 * h) & 0xffffu);
      A[g][2 * t + 8 + h] = kl_half_bits(kl_mma_a[warp][l][2] >> (16 * h) & 0xffffu);
      A[g + 8][2 * t + 8 + h] = kl_half_bits(kl_mma_a[warp][l][3] >> (16 * h) & 0xffffu);
      B[2 * t + h][g] = kl_half_bits(kl_mma_b[warp][l][0] >> (16 * h) & 0xffffu);
      B[2 * t + 8 + h][g] = kl_half_bits(kl_mma_b[warp][l][1] >> (16 * h) & 0xffffu);
    }
  }
  const unsigned g = lane / 4, t = lane % 4;
  for (unsigned r = 0; r < 4; ++r)
    for (unsigned k = 0; k < 16; ++k) d[r] += A[g + r / 2 * 8][k] * B[k][2 * t + r % 2];
  kl_warp_sync(warp);
}
"""


def _on_host(kernel: KernelSource) -> str:
    """The kernel with its mma.sync helper's asm replaced by the host emulation."""
    text = kernel.text
    start = text.index('  asm volatile(\n      "mma.sync')
    end = text.index(");\n", start) + 3
    text = text[:start] + "  kl_mma(d, a, b);\n" + text[end:]
    first = text.index("// two ")
    bf16 = "#define KL_BF16\n" if "klineage_mma_m16n8k16_bf16" in text else ""
    return text[:first] + bf16 + HOST_MMA + text[first:]


def _as_bf16(text: str) -> str:
    """A half kernel written for bf16 (the same code with the other 16-bit type)."""
    for old, new in (
        ("#include <cuda_fp16.h>", "#include <cuda_bf16.h>"),
        ("__half2float", "__bfloat162float"),
        ("__float2half", "__float2bfloat16"),
        ("__half", "__nv_bfloat16"),
    ):
        text = text.replace(old, new)
    return text


def _mma_tile(kernel: KernelSource) -> KernelSource:
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("form") == "mma_tile"]
    return mechanism.apply(kernel, site)


def test_a_staged_f16_tile_product_goes_to_the_tensor_cores_as_the_fixture() -> None:
    staged = KernelSource.from_file(STAGED / "batched_hgemm_tiles.naive.cu")
    applied = _mma_tile(staged)
    assert applied.text == (FORWARD / "batched_hgemm_tiles.applied.cu").read_text()
    # the helper is what the removal knows: detected, removable, and restorable after it
    (site,) = [s for s in mechanism.detect(applied) if s.node_kind == "expression_statement"]
    assert site.supported and "f16.f16" in str(site.detail["instruction"])
    assert not [s for s in mechanism.candidates(applied) if s.detail.get("form") == "mma_tile"]
    simplified = mechanism.remove(applied, site)
    (back,) = [c for c in mechanism.candidates(simplified) if c.supported]
    assert mechanism.apply(simplified, back).text == applied.text


def test_tiles_that_are_not_16_bit_values_are_refused() -> None:
    text = (STAGED / "batched_hgemm_tiles.naive.cu").read_text()
    assert "__half2float(a_row" in text
    kernel = KernelSource(text.replace("__half2float(a_row", "(float)(a_row"))
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("form") == "mma_tile"]
    assert "not a 16-bit float widened" in str(site.refusal)
    with pytest.raises(MechanismRefused, match="16-bit float widened"):
        mechanism.apply(kernel, site)


def test_an_fp32_tile_product_is_refused_with_its_form() -> None:
    staged = KernelSource.from_file(STAGED / "sgemm_tiles.naive.cu")
    (site,) = [s for s in mechanism.candidates(staged) if s.detail.get("form") == "mma_tile"]
    assert "tensor cores would round fp32 operands" in str(site.refusal)
    # the product loop inside is not offered a second time as a plain scalar loop
    assert len(mechanism.candidates(staged)) == 1


@pytest.mark.nvcc
def test_the_tensor_core_tile_computes_the_naive_bits_on_the_host() -> None:
    """The naive batched GEMM and its tensor-core rewrite run on the CPU (a block's threads as
    host threads, the mma.sync as a warp collective with the PTX fragment layout): every output
    bit agrees, each output's sum staying in ascending k with zero products past k."""
    from tests.mechanisms.host_emulation import run_on_host
    from tests.mechanisms.test_thread_coarsening import _gemm_cases

    naive = (REPO / "heldout" / "batched_hgemm" / "kernel.cu").read_text()
    applied = KernelSource.from_file(FORWARD / "batched_hgemm_tiles.applied.cu")
    want = run_on_host(naive, _gemm_cases("batched_hgemm", None))
    got = run_on_host(_on_host(applied), _gemm_cases("batched_hgemm", (128, 128)))
    assert got == want
    # past one block tile on both sides (a second block row and column, each partly past m
    # and n) and a k of two stages and a bit
    wide = [_wide_case(None), _wide_case((128, 128))]
    assert run_on_host(_on_host(applied), wide[1:]) == run_on_host(naive, wide[:1])


def _wide_case(tiles: tuple[int, int] | None):  # -> Case
    from tests.mechanisms.host_emulation import Buffer, Case

    buffers = [
        Buffer("a", "__half", "batch * m * k"),
        Buffer("b", "__half", "batch * k * n", offset=1),
        Buffer("c", "__half", "batch * m * n", output=True),
    ]
    grid = (
        "" if tiles is None else "dim3((unsigned)((n + 127) / 128), (unsigned)((m + 127) / 128), 1)"
    )
    return Case(
        {"batch": 1, "m": 131, "n": 137, "k": 70},
        buffers,
        "batched_hgemm(a, b, c, batch, m, n, k)",
        "batch * m * n",
        grid=grid,
    )


@pytest.mark.nvcc
def test_the_tensor_core_tile_compiles_with_hmma(mechanism_builder: Builder) -> None:
    applied = KernelSource.from_file(FORWARD / "batched_hgemm_tiles.applied.cu")
    result = mechanism_builder.build(applied.text, "mma_tile.cu", disassemble=True)
    assert result.ok, result.message
    assert result.machine_code is not None
    (kernel,) = [f for f in result.machine_code.functions if f.entry]
    assert kernel.histogram is not None
    assert kernel.histogram.get("HMMA.16816.F32", 0) == 32, kernel.histogram  # 2 k steps x 16


@pytest.mark.nvcc
def test_a_bf16_tile_product_goes_to_bf16_tensor_cores_with_the_naive_bits() -> None:
    from tests.mechanisms.host_emulation import Buffer, run_on_host
    from tests.mechanisms.test_thread_coarsening import _gemm_cases

    staged = KernelSource(_as_bf16((STAGED / "batched_hgemm_tiles.naive.cu").read_text()))
    applied = _mma_tile(staged)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in applied.text
    assert "__float2bfloat16_rn(0.0f)" in applied.text

    def cases(tiles: tuple[int, int] | None) -> list:
        found = _gemm_cases("batched_hgemm", tiles)
        for case in found:
            case.buffers[:] = [
                Buffer(b.name, "__nv_bfloat16", b.count, b.output, b.offset) for b in case.buffers
            ]
        return found

    naive = _as_bf16((REPO / "heldout" / "batched_hgemm" / "kernel.cu").read_text())
    want = run_on_host(naive, cases(None))
    assert run_on_host(_on_host(applied), cases((128, 128))) == want
