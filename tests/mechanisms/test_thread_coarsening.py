"""The thread_coarsening mechanism: fixtures both ways, heldout kernels, experts, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok
from tests.mechanisms.test_vectorized_access import listing_experts

NAME = "thread_coarsening"
mechanism = get(NAME)
ALL_EXPERTS = sorted(p.parent for p in (REPO / "expert_kernels").glob("*/kernel.cu"))


class TestThreadCoarsening(RoundTripSuite):
    mechanism = NAME


def test_detect_finds_what_the_experts_list() -> None:
    """Every entry for this mechanism in an expert's mechanisms.json is detected (dropout_apply
    lists the canonical form)."""
    assert "dropout_apply" in [p.name for p in listing_experts(NAME)]
    for expert in listing_experts(NAME):
        entries = json.loads((expert / "mechanisms.json").read_text())
        listed = [e for e in entries if e["mechanism"] == NAME]
        report = detection_recall(KernelSource.from_file(expert / "kernel.cu"), listed)
        assert report.recall == 1.0, str(report)


@pytest.mark.parametrize(
    "expert", [p for p in ALL_EXPERTS if p.name != "dropout_apply"], ids=lambda p: p.name
)
def test_expert_coarsening_is_reported_with_the_reason_it_is_refused(expert: Path) -> None:
    """Expert kernels coarsen through helpers and register arrays (softmax's load_row, the
    rmsnorm access loops, topk's four loads in flight): honest refusals, never rewrites."""
    kernel = KernelSource.from_file(expert / "kernel.cu")
    for site in mechanism.detect(kernel):
        assert site.refusal and "canonical form" in site.refusal
        with pytest.raises(MechanismRefused):
            mechanism.remove(kernel, site)


def test_the_expert_loops_over_register_slots_are_found() -> None:
    found = {
        name: [s.start_line for s in mechanism.detect(KernelSource.from_file(path))]
        for name, path in [
            ("softmax", REPO / "expert_kernels/softmax/kernel.cu"),
            ("topk", REPO / "expert_kernels/topk/kernel.cu"),
        ]
    }
    assert found == {"softmax": [55, 88], "topk": [166]}


@pytest.mark.nvcc
def test_heldout_kernels_coarsen_and_compile(mechanism_builder: Builder) -> None:
    gelu = KernelSource.from_file(REPO / "heldout/gelu/kernel.cu")
    coarse = mechanism.apply(gelu, mechanism.candidates(gelu)[0], Carrier(coarsen=8))
    assert "gelu_tanh<<<(unsigned)((n + 8 * 256 - 1) / (8 * 256)), 256, 0, stream>>>" in (
        coarse.text
    )
    gather = KernelSource.from_file(REPO / "heldout/embedding_gather/kernel.cu")
    (candidate,) = mechanism.candidates(gather)
    contiguous = mechanism.apply(gather, candidate, Carrier(layout="contiguous"))
    assert "    const int64_t i = i_first + i_step;\n    if (i >= tokens * hidden) return;" in (
        contiguous.text
    )
    assert "      continue;\n" in contiguous.text  # the element's early return
    (site,) = mechanism.detect(contiguous)
    assert mechanism.carrier_of(contiguous, site) == Carrier(coarsen=4, layout="contiguous")
    compile_ok(mechanism_builder, [coarse, contiguous])


def _kernel(
    body: str, launch: str = "k<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, n);"
) -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__global__ void k(float* x, int64_t n) {\n"
        "  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
        f"  if (i >= n) return;\n{body}\n}}\n"
        'extern "C" int run(float* x, int64_t n, cudaStream_t s) {\n'
        f"  {launch}\n  return 0;\n}}\n"
    )


@pytest.mark.parametrize(
    ("body", "launch", "reason"),
    [
        ("  x[i] += blockIdx.x;", None, "reads blockIdx.x"),
        ("  x[i] = 0.0f;\n  __syncthreads();", None, "__syncthreads"),
        ("  for (int j = 0; j < 4; ++j) if (x[i] > j) return;", None, "nested loop"),
        ("  x[i] = 0.0f;", "(void)s;", "no launch of k"),
    ],
)
def test_unsafe_kernels_are_refused_with_a_reason(
    body: str, launch: str | None, reason: str
) -> None:
    kernel = _kernel(body) if launch is None else _kernel(body, launch)
    (candidate,) = mechanism.candidates(kernel)
    assert reason in (candidate.refusal or "")
    with pytest.raises(MechanismRefused, match=reason.split()[0]):
        mechanism.apply(kernel, candidate)


def test_a_bound_the_launch_cannot_see_is_refused() -> None:
    kernel = KernelSource(
        _kernel("  x[i] = 0.0f;").text.replace("if (i >= n) return;", "if (i >= n * g) return;")
    )
    kernel = KernelSource("__device__ int64_t g;\n" + kernel.text)
    (candidate,) = mechanism.candidates(kernel)
    with pytest.raises(MechanismRefused, match="not a kernel parameter"):
        mechanism.apply(kernel, candidate)


@pytest.mark.parametrize(
    ("carrier", "reason"), [({"coarsen": 1}, "one element"), ({"layout": "x"}, "not 'strided'")]
)
def test_bad_carriers_are_refused(carrier: dict[str, int | str], reason: str) -> None:
    kernel = _kernel("  x[i] = 0.0f;")
    with pytest.raises(MechanismRefused, match=reason):
        mechanism.apply(kernel, mechanism.candidates(kernel)[0], Carrier(**carrier))


def test_the_canonical_form_survives_edits_to_the_element_code_only() -> None:
    text = (FIXTURES / NAME / "before.cu").read_text()
    edited = KernelSource(text.replace("y[i] = fmaxf(x[i], 0.0f);", "y[i] = fmaxf(x[i], 1.0f);"))
    assert len([s for s in mechanism.detect(edited) if s.supported]) == 2
    swapped = KernelSource(text.replace("i_step < 4", "i_step < 3"))
    assert len([s for s in mechanism.detect(swapped) if s.supported]) == 1


def test_an_unroll_pragma_with_a_count_is_still_the_canonical_form() -> None:
    # experts write `#pragma unroll 4` as often as `#pragma unroll`; either belongs to
    # pragma_unroll and leaves the coarsened loop removable
    text = (FIXTURES / NAME / "before.cu").read_text()
    counted = KernelSource(text.replace("#pragma unroll\n", "#pragma unroll 4\n", 1))
    assert counted.text != text
    assert len([s for s in mechanism.detect(counted) if s.supported]) == 2
    other = KernelSource(text.replace("#pragma unroll\n", "#pragma nounroll\n", 1))
    assert len([s for s in mechanism.detect(other) if s.supported]) == 1


# ---------------------------------------------------------------------------------------------
# Forward on a staged tile product: a register micro-tile per thread
# ---------------------------------------------------------------------------------------------

FORWARD = FIXTURES / NAME / "forward"
"""``<case>.naive.cu`` (smem_staging's child of a held-out GEMM) and ``<case>.applied.cu``."""
TILED = {"sgemm_tiles": "sgemm", "batched_hgemm_tiles": "batched_hgemm"}
SIZES = [
    Carrier(tm=2, tn=8, bk=8),
    Carrier(tm=1, tn=2, bk=32),
    Carrier(tm=3, tn=1, bk=5),
    Carrier(tm=8, tn=8),  # the experts' micro-tile, raced beside the default in replay
]


def _register_tile(kernel: KernelSource, carrier: Carrier | None = None) -> KernelSource:
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("form") == "register_tile"]
    return mechanism.apply(kernel, site, carrier)


@pytest.mark.parametrize("case", sorted(TILED))
def test_a_staged_tile_product_gets_a_register_tile_as_the_fixture(case: str) -> None:
    naive = KernelSource.from_file(FORWARD / f"{case}.naive.cu")
    applied = _register_tile(naive)
    assert applied.text == (FORWARD / f"{case}.applied.cu").read_text()
    assert not [s for s in mechanism.candidates(applied) if s.detail.get("form")]


@pytest.mark.parametrize("case", sorted(TILED))
def test_the_fixture_is_what_smem_staging_writes_on_the_heldout_gemm(case: str) -> None:
    heldout = KernelSource.from_file(REPO / "heldout" / TILED[case] / "kernel.cu")
    staging = get("smem_staging")
    child = staging.apply(heldout, next(s for s in staging.candidates(heldout) if s.supported))
    assert child.text == (FORWARD / f"{case}.naive.cu").read_text()


SGEMM_TILES = (FORWARD / "sgemm_tiles.naive.cu").read_text()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            ("acc += tile_a[ty][kk] * tile_b[kk][tx];", "acc += tile_a[ty][kk] + tile_b[kk][tx];"),
            "not a plain sum of products",
        ),
        (
            ("acc += tile_a[ty][kk] * tile_b[kk][tx];", "acc += tile_a[kk][ty] * tile_b[kk][tx];"),
            "not `acc += SA[ty][kk] * SB[kk][tx]`",
        ),
        (
            ("acc += tile_a[ty][kk] * tile_b[kk][tx];", "acc = tile_a[ty][kk] * tile_b[kk][tx];"),
            "not `acc += ...`",
        ),
        (
            (
                "const int64_t row = tile_row < m ? tile_row : m - 1;",
                "const int64_t row = tile_row < m ? tile_row : m;",
            ),
            "unclamped",
        ),
        (("A[row * k + (p0 + tx)] : 0.0f", "A[row * k + (p0 + tx)] : 1.0f"), "zero-filled"),
        (("A[row * k + (p0 + tx)]", "A[row * k + (p0 + tx) + ty]"), "other than through"),
        (("A[row * k + (p0 + tx)]", "A[row * k + p0 * 2 + tx]"), "other than in `p0 + t`"),
        (
            ("if (tile_row < m && tile_col < n) C[i] = acc;", "C[i] = acc;"),
            "one guarded store",
        ),
        (
            ("if (tile_row < m && tile_col < n) C[i] = acc;", "if (tile_row < m) C[i] = acc;"),
            "over both coordinates",
        ),
        (
            ("C[i] = acc;", "C[i] = acc + acc;"),
            "read acc once",
        ),
        (("(m + 15) / 16", "(n + 15) / 16"), "grid y is not (m + 15) / 16"),
        (("dim3(16, 16), 0", "dim3(16, 8), 0"), "block is not dim3(16, 16)"),
        (
            ("float acc = 0.0f;", "float acc = 0.0f;\n  if (tile_row >= m) return;"),
            "not only declarations",
        ),
    ],
)
def test_staged_products_out_of_form_are_refused(change: tuple[str, str], reason: str) -> None:
    assert change[0] in SGEMM_TILES
    kernel = KernelSource(SGEMM_TILES.replace(change[0], change[1], 1), name="sgemm.cu")
    (site,) = [s for s in mechanism.candidates(kernel) if s.detail.get("form") == "register_tile"]
    assert reason in (site.refusal or ""), site.refusal
    with pytest.raises(MechanismRefused):
        mechanism.apply(kernel, site)


@pytest.mark.parametrize(
    ("carrier", "reason"),
    [
        (Carrier(tm=1, tn=1), r"tm \* tn at least 2"),
        (Carrier(tm=0), "at least 1"),
        (Carrier(tm=8, tn=8, bk=64), "48 KiB"),
    ],
)
def test_register_tile_sizes_are_checked(carrier: Carrier, reason: str) -> None:
    with pytest.raises(MechanismRefused, match=reason):
        _register_tile(KernelSource(SGEMM_TILES, name="sgemm.cu"), carrier)


@pytest.mark.nvcc
def test_register_tiled_kernels_compile(mechanism_builder: Builder) -> None:
    sources = []
    for case in TILED:
        naive = KernelSource.from_file(FORWARD / f"{case}.naive.cu")
        sources += [naive, KernelSource.from_file(FORWARD / f"{case}.applied.cu")]
        sources += [_register_tile(naive, carrier) for carrier in SIZES]
    compile_ok(mechanism_builder, sources)


def _gemm_cases(problem: str, tiles: tuple[int, int] | None) -> list[Case]:
    """Odd sizes (none a multiple of a tile) and 1 x 1 x 1; with ``tiles`` (rows, columns of a
    block) the 2-D launch of the tiled kernels, else the naive kernel's 1-D one."""
    cases = []
    batched = problem == "batched_hgemm"
    for batch, m, n, k in [(3, 37, 45, 19), (1, 1, 1, 1), (2, 5, 70, 33)]:
        if batched:
            axes = {"batch": batch, "m": m, "n": n, "k": k}
            kind, (a, b, c), lead = "__half", ("a", "b", "c"), "batch * "
            call = "batched_hgemm(a, b, c, batch, m, n, k)"
        else:
            axes = {"m": m, "n": n, "k": k}
            kind, (a, b, c), lead = "float", ("A", "B", "C"), ""
            call = "sgemm(A, B, C, m, n, k)"
        buffers = [
            Buffer(a, kind, f"{lead}m * k"),
            Buffer(b, kind, f"{lead}k * n", offset=1),
            Buffer(c, kind, f"{lead}m * n", output=True),
        ]
        grid = ""
        if tiles is not None:
            rows, cols = tiles
            z = ", (unsigned)batch" if batched else ""
            x, y = f"(n + {cols - 1}) / {cols}", f"(m + {rows - 1}) / {rows}"
            grid = f"dim3((unsigned)({x}), (unsigned)({y}){z})"
        cases.append(Case(axes, buffers, call, f"{lead}m * n", grid=grid))
    return cases


@pytest.mark.nvcc
@pytest.mark.parametrize("case", sorted(TILED))
def test_the_register_tile_computes_the_naive_bits_on_the_host(case: str) -> None:
    """The naive kernel, smem_staging's 16 x 16 tiles and the register tiles (default 4 x 4
    with 16 columns a stage, and other sizes) run on the CPU (a block's threads as host
    threads, barriers and shared tiles real): every output bit agrees, the sum per output
    staying in ascending k with only zero products added or dropped past k."""
    problem = TILED[case]
    want = run_on_host(
        (REPO / "heldout" / problem / "kernel.cu").read_text(), _gemm_cases(problem, None)
    )
    naive = KernelSource.from_file(FORWARD / f"{case}.naive.cu")
    assert run_on_host(naive.text, _gemm_cases(problem, (16, 16))) == want
    applied = (FORWARD / f"{case}.applied.cu").read_text()
    assert run_on_host(applied, _gemm_cases(problem, (64, 64))) == want
    for carrier in SIZES:
        text = _register_tile(naive, carrier).text
        rows, cols = 16 * (carrier.get_int("tm") or 0), 16 * (carrier.get_int("tn") or 0)
        assert run_on_host(text, _gemm_cases(problem, (rows, cols))) == want


PACKED = """#include <stdint.h>

__global__ void scale8(const uint4* x, uint4* y, float s, int64_t vectors) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vectors) return;
  const uint4 v = x[i];
  uint4 out;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    reinterpret_cast<float*>(&out)[k] = reinterpret_cast<const float*>(&v)[k] * s;
  }
  y[i] = out;
}

extern "C" int run(const uint4* x, uint4* y, float s, int64_t vectors, cudaStream_t stream) {
  scale8<<<(unsigned)((vectors + 256 - 1) / 256), 256, 0, stream>>>(x, y, s, vectors);
  return 0;
}
"""


def test_a_pragma_at_column_0_inside_the_element_code_round_trips() -> None:
    """clang-format puts `#pragma unroll` at column 0 inside a body; coarsening indents the
    element code around it and removing it takes the indent back, the pragma left in place."""
    naive = KernelSource(PACKED)
    [site] = mechanism.candidates(naive)
    coarsened = mechanism.apply(naive, site, Carrier())
    assert "\n#pragma unroll\n    for (int k" in coarsened.text
    [found] = mechanism.detect(coarsened)
    assert found.refusal is None
    assert mechanism.remove(coarsened, found).text == naive.text


# ---------------------------------------------------------------------------------------------
# Forward on a vector kernel: several vectors a thread
# ---------------------------------------------------------------------------------------------

VECTOR_KERNELS = {
    "cast_f32_to_bf16": ("cast_f32_to_bf16", "x", "float", "y", "__nv_bfloat16"),
    "gelu": ("gelu_tanh", "x", "float", "y", "float"),
}


def _vectorized(problem: str) -> KernelSource:
    from klineage.mining.removal import apply_everywhere

    naive = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
    return apply_everywhere(naive, get("vectorized_access"), Carrier())


@pytest.mark.parametrize("problem", sorted(VECTOR_KERNELS))
def test_a_vector_kernel_takes_several_vectors_a_thread_and_comes_back(problem: str) -> None:
    vector = _vectorized(problem)
    assert "if (i_vec * 4 >= n) return;" in vector.text
    (site,) = [s for s in mechanism.candidates(vector) if s.supported and not s.detail.get("form")]
    coarse = mechanism.apply(vector, site, Carrier(coarsen=4))
    kernel = VECTOR_KERNELS[problem][0]
    assert f"{kernel}<<<(unsigned)((n + 16 * 256 - 1) / (16 * 256)), 256" in coarse.text
    assert "    if (i_vec * 4 >= n) return;\n" in coarse.text  # the guard, once a vector
    assert "      continue;\n" in coarse.text  # the vector path's return ends one vector
    (found,) = [s for s in mechanism.detect(coarse) if s.supported]
    assert mechanism.carrier_of(coarse, found) == Carrier(coarsen=4, layout="strided")
    assert mechanism.remove(coarse, found).text == vector.text


@pytest.mark.nvcc
@pytest.mark.parametrize("problem", sorted(VECTOR_KERNELS))
def test_several_vectors_a_thread_compute_the_vector_kernels_bits(problem: str) -> None:
    """The vector kernel and its coarsened versions (strided and contiguous) run on the CPU
    for sizes with and without a scalar tail: every output bit agrees."""
    kernel, x, x_type, y, y_type = VECTOR_KERNELS[problem]
    vector = _vectorized(problem)
    site = next(s for s in mechanism.candidates(vector) if s.supported)

    def cases(per_thread: int) -> list[Case]:
        return [
            Case(
                {"n": n},
                [Buffer(x, x_type, "n"), Buffer(y, y_type, "n", output=True)],
                f"{kernel}({x}, {y}, n)",
                f"(n + {per_thread - 1}) / {per_thread}",
            )
            for n in (1, 4, 4099, 3 * 4096 + 8)
        ]

    want = run_on_host(vector.text, cases(4))
    for carrier in (Carrier(coarsen=4), Carrier(coarsen=2, layout="contiguous")):
        coarse = mechanism.apply(vector, site, carrier)
        assert run_on_host(coarse.text, cases(4 * (carrier.get_int("coarsen") or 1))) == want


@pytest.mark.nvcc
def test_coarsened_vector_kernels_compile(mechanism_builder: Builder) -> None:
    sources = []
    for problem in sorted(VECTOR_KERNELS):
        vector = _vectorized(problem)
        site = next(s for s in mechanism.candidates(vector) if s.supported)
        sources.append(mechanism.apply(vector, site, Carrier(coarsen=4)))
    compile_ok(mechanism_builder, sources)


def test_the_experts_micro_tile_is_raced_only_on_a_staged_product() -> None:
    staged = KernelSource.from_file(FORWARD / "sgemm_tiles.naive.cu")
    assert mechanism.alternative_carriers(staged) == [Carrier(tm=8, tn=8)]
    naive = KernelSource.from_file(REPO / "heldout" / "gelu" / "kernel.cu")
    assert mechanism.alternative_carriers(naive) == []


FRAGMENT_LOOP = """\
#include <stdint.h>
__global__ void tiles(const uint32_t* a, float* c, int lda) {
  float d[4][4] = {};
  for (int i = 0; i < 4; ++i) {
    const int row = (threadIdx.x / 4) + i * 16;
    const uint32_t x = a[row * lda + threadIdx.x % 4];
    ISSUE
    c[row * lda + threadIdx.x % 4] = d[i][0];
  }
}
"""
_MMA = (
    'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, '
    '{%4,%4,%4,%4}, {%4,%4}, {%0,%1,%2,%3};" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), '
    '"+f"(d[i][3]) : "r"(x));'
)


def test_a_loop_over_a_warps_mma_fragments_is_not_coarsening() -> None:
    """A loop that issues mma.sync walks the warp's tiles of fragments (warp tiling), not one
    thread's share of elements; the same loop without it reads as hand-written coarsening."""
    coarsening = get("thread_coarsening")
    plain = coarsening.detect(KernelSource(FRAGMENT_LOOP.replace("ISSUE", "d[i][0] += x;")))
    assert [s.detail.get("coarsen") for s in plain] == ["4"]
    assert coarsening.detect(KernelSource(FRAGMENT_LOOP.replace("ISSUE", _MMA))) == []


def test_coarsening_one_of_two_kernels_of_a_name_edits_its_own_launch_only() -> None:
    # a launch-size dispatch keeps a kernel of the same name in each namespace: the wide
    # variant's launch keeps its grid (shrinking it too left a quarter of its rows undone)
    kernel = KernelSource.from_file(REPO / "tests" / "fixtures" / "cuda" / "namespaced_variants.cu")
    narrow = mechanism.candidates(kernel)[0]
    launches = [
        line
        for line in mechanism.apply(kernel, narrow, Carrier(coarsen=2)).text.splitlines()
        if "<<<" in line
    ]
    assert "(2 * 256)" in launches[0]
    assert "scale<<<(n + 511) / 512, 512>>>" in launches[1]
