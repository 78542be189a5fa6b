"""Removing a tile of several dimensions staged once (the shared-memory transpose): each read
``S[a][b]`` becomes the global load that filled slot ``[a][b]``; the refusals name the form."""

from __future__ import annotations

import itertools

import pytest

from klineage.cuda.analysis import IndexForm, analysis
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms.base import Site
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

staging = get("smem_staging")

# block coordinates in locals, the row and column locals reassigned for the output after the
# input's index is taken
TURN = """\
#define T 32
#define R 8
__global__ void turn(const float* src, float* dst, int n, int m) {
  __shared__ float tile[T][T + 1];
  int bx = blockIdx.x, by = blockIdx.y;
  int c = bx * T + threadIdx.x;
  int r = by * T + threadIdx.y;
  const int src_at = r * m + c;
  c = by * T + threadIdx.x;
  r = bx * T + threadIdx.y;
  for (int k = 0; k < T; k += R)
    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m];
  __syncthreads();
  for (int k = 0; k < T; k += R)
    dst[(r + k) * n + c] = tile[threadIdx.x][threadIdx.y + k];
}
"""

TURNED = "dst[(r + k) * n + c] = src[(by * T + threadIdx.x) * m + (bx * T + (threadIdx.y + k))];"


def _site(text: str) -> Site:
    (site,) = staging.detect(KernelSource(text))
    return site


def _removed(text: str) -> str:
    site = _site(text)
    assert site.supported and site.detail["form"] == "once", site.refusal
    return staging.remove(KernelSource(text), site).text


def _refusal(text: str) -> str:
    site = _site(text)
    assert site.refusal is not None and site.refusal.startswith("the site is tiles staged once")
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(text), site)
    return site.refusal


def test_each_read_becomes_the_load_that_filled_its_slot() -> None:
    removed = _removed(TURN)
    assert TURNED in removed
    # the tile, its barrier and the index only the staging used go; uniform locals stay names
    assert "__shared__" not in removed and "__syncthreads" not in removed
    assert "src_at" not in removed and "int bx = blockIdx.x, by = blockIdx.y;" in removed
    assert not [s for s in staging.detect(KernelSource(removed)) if s.supported]


def test_a_uniform_local_written_after_the_index_took_it_is_replaced_by_its_value() -> None:
    removed = _removed(
        TURN.replace(
            "  for (int k = 0; k < T; k += R)\n    tile",
            "  bx = 0;\n  for (int k = 0; k < T; k += R)\n    tile",
        )
    )
    assert "= src[(by * T + threadIdx.x) * m + (blockIdx.x * T + (threadIdx.y + k))];" in removed


@pytest.mark.parametrize("barrier", ["cta.sync();", "cg::sync(cta);"])
def test_a_cooperative_groups_barrier_goes_with_its_handle(barrier: str) -> None:
    text = TURN.replace(
        "  __shared__", "  cg::thread_block cta = cg::this_thread_block();\n  __shared__"
    ).replace("__syncthreads();", barrier)
    text = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n" + text
    removed = _removed(text)
    assert TURNED in removed and "cta" not in removed


def test_a_staging_loop_started_at_the_thread_index_is_read_at_the_slot() -> None:
    text = TURN.replace(
        "  for (int k = 0; k < T; k += R)\n    tile[threadIdx.y + k][threadIdx.x] = "
        "src[src_at + k * m];",
        "  for (int k = threadIdx.y; k < T; k += R)\n    tile[k][threadIdx.x] = "
        "src[(by * T + k) * m + bx * T + threadIdx.x];",
    )
    removed = _removed(text)
    assert "= src[(by * T + threadIdx.x) * m + bx * T + (threadIdx.y + k)];" in removed


def test_a_tile_stored_by_one_statement_is_removed() -> None:
    text = TURN.replace(
        "  for (int k = 0; k < T; k += R)\n    tile[threadIdx.y + k][threadIdx.x] = "
        "src[src_at + k * m];",
        "  tile[threadIdx.y][threadIdx.x] = src[src_at];",
    ).replace(
        "  for (int k = 0; k < T; k += R)\n    dst[(r + k) * n + c] = "
        "tile[threadIdx.x][threadIdx.y + k];",
        "  dst[r * n + c] = tile[threadIdx.x][threadIdx.y];",
    )
    removed = _removed(text)
    assert "dst[r * n + c] = src[(by * T + threadIdx.x) * m + (bx * T + threadIdx.y)];" in removed


# -- refusals ---------------------------------------------------------------------------------


def _staged_as(store: str) -> str:
    return TURN.replace("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m];", store)


def test_a_staging_loop_that_does_more_than_store_is_refused() -> None:
    guarded = _staged_as("    if (c < m) tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m];")
    assert "a staging loop holding `if (c < m)" in _refusal(guarded)


def test_a_stored_value_that_differs_between_threads_of_a_slot_is_refused() -> None:
    text = _staged_as("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m + shift];")
    text = text.replace(
        "  const int src_at",
        "  int shift;\n  if (threadIdx.x < 16) shift = 0;\n  else shift = 1;\n  const int src_at",
    )
    assert "uses shift, which differs between threads" in _refusal(text)


def test_a_stored_value_read_through_a_moved_argument_is_refused() -> None:
    text = TURN.replace("  const int src_at", "  src += m;\n  const int src_at")
    assert "read through src, which the kernel writes" in _refusal(text)


def test_a_stored_value_that_uses_the_loop_variable_outside_its_load_is_refused() -> None:
    text = _staged_as("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m] * k;")
    assert "that uses k outside a load's index" in _refusal(text)


def test_a_stored_index_read_from_memory_is_refused() -> None:
    text = _staged_as("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m + (int)src[0]];")
    assert "whose index depends on a value read from memory" in _refusal(text)


def test_a_stored_index_not_through_the_sum_of_row_and_loop_is_refused() -> None:
    text = _staged_as("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + 2 * k * m];")
    assert "depends on threadIdx.y and the loop variable other than through their sum" in (
        _refusal(text)
    )


def test_a_stored_index_on_a_thread_index_no_slot_names_is_refused() -> None:
    text = _staged_as("    tile[threadIdx.y + k][threadIdx.x] = src[src_at + k * m + threadIdx.z];")
    assert "whose index depends on threadIdx.z" in _refusal(text)


def test_a_tile_read_other_than_element_by_element_is_refused() -> None:
    text = TURN.replace(
        "    dst[(r + k) * n + c] = tile[threadIdx.x][threadIdx.y + k];",
        "    dst[(r + k) * n + c] = *(tile[threadIdx.x] + threadIdx.y + k);",
    )
    assert "tile used as `tile[threadIdx.x]` (line 15), not read element by element" in (
        _refusal(text)
    )


def test_a_tile_written_elsewhere_is_refused() -> None:
    text = TURN.replace("  __syncthreads();\n", "  __syncthreads();\n  tile[0][0] = 0.f;\n")
    assert "tile written again at line 14" in _refusal(text)


def test_a_kernel_with_several_barriers_is_refused() -> None:
    text = TURN.replace(
        "tile[threadIdx.x][threadIdx.y + k];\n",
        "tile[threadIdx.x][threadIdx.y + k];\n  __syncthreads();\n",
    )
    assert "a tile staged once in a kernel with 2 block barriers, not one" in _refusal(text)


def test_a_tile_read_before_the_barrier_is_refused() -> None:
    text = TURN.replace("  __syncthreads();\n", "  dst[0] = tile[0][0];\n  __syncthreads();\n")
    assert "tile read before the barrier (line 13)" in _refusal(text)


# -- exactness ----------------------------------------------------------------------------------


def _value(form: IndexForm, values: dict[str, int]) -> int:
    total = 0
    for monomial, coefficient in form.terms:
        term = coefficient
        for atom in monomial:
            term *= values[atom]
        total += term
    return total


def _offsets(kernel: KernelSource) -> dict[tuple[str, str], IndexForm]:
    """(buffer, direction) -> the offset of that one access."""
    source = kernel.parsed
    indices = analysis(source).indices(source.kernels[0])
    return {(a.buffer.name, a.direction): a.offset for a in indices.accesses()}


def _loop_atom(form: IndexForm) -> str:
    (atom,) = [a for a in form.atoms() if "@" in a]
    return atom


def test_the_rewritten_read_loads_the_element_its_slot_held_for_every_thread() -> None:
    """The fixture with a 4 x 4 tile and 4 x 2 blocks: the elements each thread's reads got
    from the tile, as the staging filled it, are the ones the rewritten reads load, and the
    kernel before and after is a transpose."""
    text = (PUBLIC_FORMS / "smem_staging" / "transpose_once.before.cu").read_text()
    text = text.replace("#define TILE 32", "#define TILE 4")
    text = text.replace("#define ROWS_PER_PASS 8", "#define ROWS_PER_PASS 2")
    before = KernelSource(text)
    after = staging.remove(before, _site(text))
    old, new = _offsets(before), _offsets(after)
    stored, filled = old[("tile", "store")], old[("in", "load")]
    read, written = old[("tile", "load")], old[("out", "store")]
    rewritten, written_after = new[("in", "load")], new[("out", "store")]
    stage, turn, turn_after = _loop_atom(stored), _loop_atom(read), _loop_atom(rewritten)
    rows, cols, tile = 8, 12, 4
    threads = list(itertools.product(range(4), range(2), (0, 2)))  # x, y, loop variable
    outputs = set()
    for block_col, block_row in itertools.product(range(cols // tile), range(rows // tile)):
        shared = {"[tile_col]": block_col, "[tile_row]": block_row, "rows": rows, "cols": cols}
        slots: dict[int, int] = {}
        for x, y, i in threads:
            at = {**shared, "threadIdx.x": x, "threadIdx.y": y, stage: i}
            assert slots.setdefault(_value(stored, at), _value(filled, at)) == _value(filled, at)
        for x, y, i in threads:
            at = {**shared, "threadIdx.x": x, "threadIdx.y": y, turn: i, turn_after: i}
            element = slots[_value(read, at)]
            assert _value(rewritten, at) == element
            out = _value(written, at)
            assert _value(written_after, at) == out
            assert divmod(out, rows) == divmod(element, cols)[::-1]  # y[j][i] = x[i][j]
            outputs.add(out)
    assert outputs == set(range(rows * cols))


# -- forward: the shared-memory transpose written into a tiled kernel ------------------------

TURN_NAIVE = """\
#define T 32
#define R 8
__global__ void turn(const float* src, float* dst, int n, int m) {
  int bx = blockIdx.x, by = blockIdx.y;
  int c = by * T + threadIdx.x;
  int r = bx * T + threadIdx.y;
  for (int k = 0; k < T; k += R)
    dst[(r + k) * n + c] = 2.f * src[(by * T + threadIdx.x) * m + (bx * T + (threadIdx.y + k))];
}

extern "C" int run(const float* x, float* y, int rows, int cols) {
  dim3 grid(cols / T, rows / T), block(T, R);
  turn<<<grid, block>>>(x, y, rows, cols);
  return 0;
}
"""


def _tile_candidate(text: str) -> Site:
    (site,) = [c for c in staging.candidates(KernelSource(text)) if c.detail]
    assert site.detail["form"] == "tile_transpose"
    return site


def _forward(text: str) -> str:
    site = _tile_candidate(text)
    assert site.supported, site.refusal
    return staging.apply(KernelSource(text), site, Carrier()).text


def test_forward_stages_the_tile_with_the_thread_roles_swapped_and_reads_it_back() -> None:
    staged = _forward(TURN_NAIVE)
    assert "  __shared__ float tile[T][T + 1];\n" in staged
    assert (
        "  for (int k = 0; k < T; k += R) {\n"
        "    tile[threadIdx.y + k][threadIdx.x] = "
        "src[(by * T + (threadIdx.y + k)) * m + (bx * T + threadIdx.x)];\n"
        "  }\n  __syncthreads();\n"
    ) in staged
    assert "dst[(r + k) * n + c] = 2.f * tile[threadIdx.x][threadIdx.y + k];" in staged
    # the staged kernel is the removal's canonical form: removing it gives the kernel back
    assert staging.remove(KernelSource(staged), _site(staged)).text == TURN_NAIVE


def test_forward_inlines_thread_locals_and_keeps_block_uniform_ones() -> None:
    text = TURN_NAIVE.replace(
        "  for (int k = 0; k < T; k += R)\n    dst[(r + k) * n + c] = 2.f * src[(by * T + "
        "threadIdx.x) * m + (bx * T + (threadIdx.y + k))];",
        "  const int from = (by * T + threadIdx.x) * m + bx * T + threadIdx.y;\n"
        "  for (int k = 0; k < T; k += R)\n    dst[(r + k) * n + c] = src[from + k];",
    )
    staged = _forward(text)
    assert (
        "tile[threadIdx.y + k][threadIdx.x] = "
        "src[(by * T + (threadIdx.y + k)) * m + bx * T + threadIdx.x];"
    ) in staged
    assert "dst[(r + k) * n + c] = tile[threadIdx.x][threadIdx.y + k];" in staged


def test_forward_round_trips_the_public_transpose_fixture() -> None:
    after = (PUBLIC_FORMS / "smem_staging" / "transpose_once.after.cu").read_text()
    staged = _forward(after)
    assert staging.remove(KernelSource(staged), _site(staged)).text == after


def test_a_kernel_reading_along_threadidx_x_offers_no_tile_transpose() -> None:
    copy = TURN_NAIVE.replace(
        "src[(by * T + threadIdx.x) * m + (bx * T + (threadIdx.y + k))]",
        "src[(bx * T + (threadIdx.y + k)) * m + (by * T + threadIdx.x)]",
    )
    assert not [c for c in staging.candidates(KernelSource(copy)) if c.detail]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (("block(T, R)", "block(T, 4)"), "a launch with blocks of `block` (line 13), not 32 x 8"),
        (
            ("  int bx", "  if (n == 0) return;\n  int bx"),
            "a return before the loop (line 4), which threads may take",
        ),
        (
            ("    dst[(r + k) * n + c] = 2.f *", "    if (c < n) dst[(r + k) * n + c] = 2.f *"),
            "the transposed read under a condition or loop (line 8)",
        ),
        (("const float* src", "float* src"), None),
    ],
)
def test_forward_refusals_name_the_form(change: tuple[str, str], reason: str | None) -> None:
    text = TURN_NAIVE.replace(*change)
    if reason is None:  # the kernel writes what it reads transposed
        text = text.replace("  int bx", "  src[0] = 0.f;\n  int bx")
        reason = "a transposed read of src, which the kernel also writes"
    site = _tile_candidate(text)
    assert site.refusal is not None and reason in site.refusal, site.refusal
    with pytest.raises(MechanismRefused, match="this rule needs a top-level loop"):
        staging.apply(KernelSource(text), site, Carrier())


@pytest.mark.nvcc
def test_the_staged_kernel_compiles(mechanism_builder: Builder) -> None:
    compile_ok(mechanism_builder, [KernelSource(_forward(TURN_NAIVE), name="turn_staged.cu")])
