"""smem_staging on the sliced-K tile loop as public tutorials write it: the thread's place in
the block flattened and split again by the tile width (``tid / W``, ``tid % W``), and the
indices of each store declared among the stores (written here in that idiom)."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms._staging import NotStaged, analyze_staged_loop
from klineage.mining.plan import plan_walk
from klineage.problem import load_problem
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

staging = get("smem_staging")

SLICED = """\
#define TILE 16
__global__ void matmul_sliced(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float tile_a[TILE][TILE], tile_b[TILE][TILE];
  int tid = threadIdx.y * blockDim.x + threadIdx.x;  // the thread's place in its block
  int a_tile_row = tid / TILE;
  int a_tile_col = tid % TILE;
  int b_tile_row = tid / TILE;
  int b_tile_col = tid % TILE;
  int a_row = blockIdx.y * TILE + a_tile_row;
  int b_col = blockIdx.x * TILE + b_tile_col;
  float acc = 0.f;
  for (int step = 0; step < (k + TILE - 1) / TILE; ++step) {
    int a_col = step * TILE + a_tile_col;
    int a_at = a_row * k + a_col;
    tile_a[a_tile_row][a_tile_col] = a[a_at];
    int b_row = step * TILE + b_tile_row;
    int b_at = b_row * n + b_col;
    tile_b[b_tile_row][b_tile_col] = b[b_at];
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TILE; ++kk) {
      int a_read_row = a_tile_row;
      int b_read_col = b_tile_col;
      acc += tile_a[a_read_row][kk] * tile_b[kk][b_read_col];
    }
    __syncthreads();
  }
  int c_at = a_row * n + b_col;
  c[c_at] = acc;
}

extern "C" int run(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
                   cudaStream_t stream) {
  dim3 block(TILE, TILE);
  dim3 grid((unsigned)((N + TILE - 1) / TILE), (unsigned)((M + TILE - 1) / TILE));
  matmul_sliced<<<grid, block, 0, stream>>>(A, B, C, (int)M, (int)N, (int)K);
  return (int)cudaGetLastError();
}
"""


def _host_case(block_dims: str) -> Case:
    """A 32 x 32 x 48 product on a 2 x 2 grid of ``block_dims`` blocks, run on the host."""
    return Case(
        axes={"m": 32, "n": 32, "k": 48},
        buffers=[
            Buffer("c", "float", "m * n", output=True),
            Buffer("a", "float", "m * k", offset=1),
            Buffer("b", "float", "k * n", offset=2),
        ],
        call="matmul_sliced(a, b, c, (int)m, (int)n, (int)k)",
        threads="",
        grid="dim3(2, 2)",
        block_dims=block_dims,
    )


def _site(text: str):
    (site,) = staging.detect(KernelSource(text))
    return site


def test_tiles_stored_at_the_flattened_place_split_by_the_width_are_removed() -> None:
    site = _site(SLICED)
    assert site.supported and site.start_line == 12
    removed = staging.remove(KernelSource(SLICED), site).text
    # each read writes the indices out, down to the thread index it replaces
    assert (
        "acc += a[((blockIdx.y * TILE + a_read_row) * k + (step * TILE + kk))] * "
        "b[((step * TILE + kk) * n + (blockIdx.x * TILE + b_read_col))];"
    ) in removed
    # the stores' own indices go with them; what the compute reads stays
    for gone in ("__shared__", "__syncthreads", "int a_col", "int a_at", "int b_row", "int b_at"):
        assert gone not in removed
    assert "int a_read_row = a_tile_row;" in removed and "int c_at" in removed


def test_a_literal_width_reads_the_same() -> None:
    literal = SLICED.replace("tid / TILE", "tid / 16").replace("tid % TILE", "tid % 16")
    assert _site(literal).supported


MUTATIONS = {
    # the row read through another local that holds the same `tid / TILE`
    "another_row_index": (
        "int a_at = a_row * k + a_col;",
        "int a_at = (blockIdx.y * TILE + b_tile_row) * k + a_col;",
    ),
    # a 32 x 8 block: the same 256 places in the tile, no longer (threadIdx.y, threadIdx.x)
    "block_not_tile_wide": ("dim3 block(TILE, TILE);", "dim3 block(2 * TILE, TILE / 2);"),
    "index_written_again": (
        "int a_at = a_row * k + a_col;",
        "int a_at = a_row * k + a_col;\n    a_at += 0;",
    ),
    # rows of 8 in a tile 16 wide: slots the compute reads are never stored (a broken kernel)
    "width_not_block": ("tid / TILE;\n  int a_tile_col", "tid / 8;\n  int a_tile_col"),
}


def _canonical_refusal(text: str) -> str:
    source = KernelSource(text).parsed
    function = source.function("matmul_sliced")
    assert function is not None and function.body is not None
    loop = next(source.iter_nodes("for_statement", within=function.body))
    with pytest.raises(NotStaged) as refused:
        analyze_staged_loop(source, function, loop)
    return str(refused.value)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("another_row_index", "depends on threadIdx.y through something other than a_tile_row"),
        ("block_not_tile_wide", "not at two distinct thread"),
        ("index_written_again", "not an index computed once"),
        ("width_not_block", "not at two distinct thread"),
    ],
)
def test_the_canonical_rule_refuses_what_it_cannot_prove_every_thread_stores(
    case: str, reason: str
) -> None:
    change = MUTATIONS[case]
    assert change[0] in SLICED
    assert reason in _canonical_refusal(SLICED.replace(*change))


def test_an_index_written_again_is_refused_by_the_loader_rule_too() -> None:
    site = _site(SLICED.replace(*MUTATIONS["index_written_again"]))
    assert not site.supported and "also runs `a_at += 0;` (line 15)" in (site.refusal or "")


@pytest.mark.nvcc
@pytest.mark.parametrize("case", ["another_row_index", "block_not_tile_wide"])
def test_the_loader_rule_removes_tiles_whose_offsets_it_solves(case: str) -> None:
    """The loader rule reads each slot back from the store's offset, solved over the
    subscripts (the same ``tid / TILE`` under another name; any block shape that fills the
    tile): the removal computes the same bits as the staged kernel."""
    text = SLICED.replace(*MUTATIONS[case])
    site = _site(text)
    assert site.supported and site.detail == {"form": "loader"}
    removed = staging.remove(KernelSource(text), site).text
    assert "__shared__" not in removed and "__syncthreads" not in removed
    case_ = _host_case("dim3(32, 8)" if case == "block_not_tile_wide" else "dim3(16, 16)")
    staged = run_on_host(text, [case_])
    assert staged.strip() and run_on_host(removed, [case_]) == staged


def test_the_pipeline_rule_refuses_stores_that_read_indices_declared_among_them() -> None:
    pipeline = get("cp_async_pipeline")
    staged = [
        s for s in pipeline.candidates(KernelSource(SLICED)) if s.detail.get("form") == "staged"
    ]
    assert len(staged) == 1 and "declared among them (line 13)" in (staged[0].refusal or "")


def test_the_forward_rule_stages_the_simplified_loop_again() -> None:
    removed = staging.remove(KernelSource(SLICED), _site(SLICED))
    (candidate,) = staging.candidates(removed)
    assert candidate.supported and candidate.detail["form"] == "blocked"
    staged = staging.apply(removed, candidate).text
    # the copies the inner loop declares are read through the locals they copy
    assert (
        "tile_a[threadIdx.y][threadIdx.x] = "
        "a[((blockIdx.y * TILE + a_tile_row) * k + (step * TILE + threadIdx.x))];"
    ) in staged
    assert "acc += tile_a[threadIdx.y][kk] * tile_b[kk][threadIdx.x];" in staged
    assert [s.mechanism for s in plan_walk(KernelSource(SLICED))[0].steps if s.transferable] == [
        "pragma_unroll",
        "smem_staging",
    ]


def test_a_copy_of_a_local_written_elsewhere_is_no_alias() -> None:
    removed = staging.remove(KernelSource(SLICED), _site(SLICED)).text
    written = removed.replace(
        "int a_tile_row = tid / TILE;", "int a_tile_row = tid / TILE;\n  a_tile_row += 0;"
    )
    candidates = staging.candidates(KernelSource(written))
    # the blocked form does not take it; the operand-tiles form sees `tid / TILE` as no sum
    assert [c.detail.get("form") for c in candidates] == ["operand_tiles"]
    assert "not a sum of products" in (candidates[0].refusal or "")


@pytest.mark.nvcc
def test_every_state_compiles(mechanism_builder: Builder) -> None:
    removed = staging.remove(KernelSource(SLICED), _site(SLICED))
    again = staging.apply(removed, staging.candidates(removed)[0])
    compile_ok(mechanism_builder, [KernelSource(SLICED), removed, again])


@pytest.mark.gpu
@pytest.mark.nvcc
def test_every_state_passes_the_gate(gate) -> None:
    problem = load_problem(PUBLIC_FORMS / "problems" / "sgemm_tiles")
    removed = staging.remove(KernelSource(SLICED), _site(SLICED))
    again = staging.apply(removed, staging.candidates(removed)[0])
    for state, kernel in (("staged", SLICED), ("removed", removed.text), ("again", again.text)):
        verdict = gate.run(problem, KernelSource(kernel, name=f"sliced.{state}.cu"), time_it=False)
        failing = [(w.label, w.message) for w in verdict.workloads if not w.passed]
        assert verdict.passed, (state, verdict.build.message, failing)


@pytest.mark.nvcc
def test_the_removal_and_the_forward_rule_compute_the_same_bits_on_the_host() -> None:
    case = _host_case("dim3(16, 16)")
    removed = staging.remove(KernelSource(SLICED), _site(SLICED))
    again = staging.apply(removed, staging.candidates(removed)[0]).text
    staged = run_on_host(SLICED, [case])
    assert staged.strip() and run_on_host(removed.text, [case]) == staged
    assert run_on_host(again, [case]) == staged


def test_tiles_declared_in_the_turn_go_with_the_loader() -> None:
    """Tiles a turn declares (`__shared__ float As[T][T];` inside the tile loop, as the CUDA
    samples' matrixMul does) are the loader's tiles, not locals of it the reads use."""
    declared_inside = SLICED.replace(
        "  __shared__ float tile_a[TILE][TILE], tile_b[TILE][TILE];\n", ""
    ).replace(
        "    int a_col = step * TILE + a_tile_col;\n",
        "    __shared__ float tile_a[TILE][TILE], tile_b[TILE][TILE];\n"
        "    int a_col = step * TILE + a_tile_col;\n",
    )
    assert declared_inside != SLICED
    site = _site(declared_inside)
    assert site.supported and site.detail == {"form": "loader"}
    removed = staging.remove(KernelSource(declared_inside), site).text
    assert "__shared__" not in removed and "tile_a" not in removed
