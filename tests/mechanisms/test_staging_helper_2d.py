"""Removing 2-D tiles a device helper stages element by element under a bounds check
(leimao's V06 idiom): each read ``S[a][b]`` becomes the bounds-checked load that filled slot
``[a][b]``; the refusals name the form."""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms._staging_helper_2d import Tile2d, tile_of
from klineage.mechanisms.base import Site
from tests.mechanisms.roundtrip import PUBLIC_FORMS

staging = get("smem_staging")
FIXTURE = PUBLIC_FORMS / "smem_staging" / "helper_tiles_2d.before.cu"
TEXT = FIXTURE.read_text()
READ_A = "A_vals[y] = A_tile_T[k_i][thread_row_idx * THREAD_TILE_SIZE_Y + y];"


def _site(text: str) -> Site:
    (site,) = staging.detect(KernelSource(text))
    return site


def _refusal(text: str) -> str:
    site = _site(text)
    assert site.refusal is not None and "as tiles a helper stages" in site.refusal
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(text), site)
    return site.refusal


def test_the_fixture_is_removable_and_reads_the_bounds_checked_loads() -> None:
    site = _site(TEXT)
    assert site.supported and site.detail["form"] == "helper", site.refusal
    removed = staging.remove(KernelSource(TEXT), site).text
    assert (
        "A_vals[y] = ((blockIdx.y * BLOCK_TILE_SIZE_Y + (thread_row_idx * THREAD_TILE_SIZE_Y + y))"
        " < m && (tile_idx * BLOCK_TILE_SIZE_K + k_i) < k ? A[" in removed
    )
    assert "__shared__" not in removed and "__syncthreads" not in removed
    assert "load_tiles_transposed" not in removed
    # the block's thread count stays, though only the loader read it: a forward rule's loader
    # counts by it again
    assert "  constexpr size_t NUM_THREADS{" in removed


READER = PUBLIC_FORMS / "smem_staging" / "helper_tiles_2d_reader.before.cu"
COPY_ROW = (
    "template <typename T, size_t N>\n"
    "__device__ void copy_row(T const row[N], T *out) { for (size_t i{0U}; i < N; ++i) "
    "out[i] = row[i]; }\n\n"
)
KERNEL_TEMPLATE = (
    "template <typename T, size_t BLOCK_TILE_SIZE_X, size_t BLOCK_TILE_SIZE_Y,\n"
    "          size_t BLOCK_TILE_SIZE_K, size_t THREAD_TILE_SIZE_X"
)


def _with_copy_row(call: str) -> str:
    text = TEXT.replace(KERNEL_TEMPLATE, COPY_ROW + KERNEL_TEMPLATE, 1)
    return text.replace(
        "        A_vals[y] = A_tile_T[k_i][thread_row_idx * THREAD_TILE_SIZE_Y + y];\n", call
    )


def test_rows_read_through_a_reader_helper_read_the_loads_the_kernel_form_reads() -> None:
    reader = KernelSource(READER.read_text())
    (site,) = staging.detect(reader)
    assert site.supported, site.refusal
    removed = staging.remove(reader, site).text
    # one copy per tile, reading the load that filled slot [k_i][e], the original gone
    assert "__device__ void slice_to_registers(" not in removed
    assert "slice_to_registers_from_A<T, BLOCK_TILE_SIZE_Y, THREAD_TILE_SIZE_Y>(k_i, A_vals," in (
        removed
    )
    assert "size_t tile_row_index, T values[SLICE]" in removed
    assert "__shared__" not in removed and "__syncthreads" not in removed
    # the same load the 2-D rule writes for the read in the kernel (helper_tiles_2d, whose
    # pair passed the gate's GPU check), with the helper's names for the kernel's
    in_kernel = staging.remove(KernelSource(TEXT), _site(TEXT)).text
    (kernel_read,) = [
        line.split(" = ", 1)[1] for line in in_kernel.splitlines() if "A_vals[y] = " in line
    ]
    (helper_read,) = [
        line.split(" = ", 1)[1]
        for line in removed.splitlines()
        if "values[i] = " in line and "A[" in line
    ]
    as_kernel = (
        helper_read.replace("TILE_WIDTH", "BLOCK_TILE_SIZE_Y")
        .replace("(thread_idx * SLICE + i)", "(thread_row_idx * THREAD_TILE_SIZE_Y + y)")
        .replace("tile_row_index", "k_i")
    )
    assert as_kernel == kernel_read


def test_a_reader_helper_called_elsewhere_is_kept_beside_its_copy() -> None:
    text = _with_copy_row("        copy_row<T, BLOCK_TILE_SIZE_Y>(A_tile_T[k_i], A_vals);\n")
    text = text.replace(
        "  for (size_t y{0U}; y < THREAD_TILE_SIZE_Y; ++y) {\n    for (size_t x",
        "  copy_row<T, THREAD_TILE_SIZE_Y>(A_vals, B_vals);\n"
        "  for (size_t y{0U}; y < THREAD_TILE_SIZE_Y; ++y) {\n    for (size_t x",
        1,
    )
    assert text.count("copy_row<") == 2
    removed = staging.remove(KernelSource(text), _site(text)).text
    assert "__device__ void copy_row(T const row[N], T *out)" in removed
    assert "__device__ void copy_row_from_A(size_t row_index, T *out, T const* A" in removed
    assert "copy_row_from_A<T, BLOCK_TILE_SIZE_Y>(k_i, A_vals, A, " in removed


def test_a_reader_helper_that_writes_its_row_is_refused() -> None:
    text = _with_copy_row("        copy_row<T, BLOCK_TILE_SIZE_Y>(A_tile_T[k_i], A_vals);\n")
    text = text.replace("out[i] = row[i]; }", "out[i] = row[i]; row[0] = out[0]; }")
    refusal = _refusal(text)
    assert "copy_row uses row as `row[0] = out[0]`, not read as `row[e]`" in refusal


def test_a_value_that_names_the_turn_directly_is_refused() -> None:
    text = TEXT.replace(
        "val = A[A_row_idx * lda + A_col_idx];", "val = A[A_row_idx * lda + load_idx];"
    )
    assert "names `load_idx` other than through the slot" in _refusal(text)


def test_a_value_over_a_thread_varying_argument_is_refused() -> None:
    text = TEXT.replace(
        "size_t const A_col_idx{tile_idx * BLOCK_TILE_SIZE_K + A_tile_col_idx};",
        "size_t const A_col_idx{thread_linear_idx + A_tile_col_idx};",
    )
    assert "over thread_linear_idx, given `thread_linear_idx`, which may differ" in _refusal(text)


def test_a_slot_not_split_from_one_linear_index_is_refused() -> None:
    split = "(thread_linear_idx + load_idx * NUM_THREADS) %\n" + " " * 32
    text = TEXT.replace(split + "BLOCK_TILE_SIZE_K", split + "BLOCK_TILE_SIZE_Y", 1)
    assert text != TEXT
    assert "not `[X % C][X / C]`" in _refusal(text)


def test_an_else_branch_is_refused() -> None:
    text = TEXT.replace(
        "      val = A[A_row_idx * lda + A_col_idx];\n    }\n",
        "      val = A[A_row_idx * lda + A_col_idx];\n    } else {\n      val = 1;\n    }\n",
    )
    assert "that is not `if (cond) { v = load; }`" in _refusal(text)


def test_an_offset_moved_before_the_reads_is_refused() -> None:
    text = TEXT.replace(
        "    __syncthreads();\n#pragma unroll\n    for (size_t k_i",
        "    __syncthreads();\n    lda += 0;\n#pragma unroll\n    for (size_t k_i",
    )
    assert "writes lda between the loader's call and the last read" in _refusal(text)


# ---------------------------------------------------------------------------------------------
# Slot by slot: the loader run in Python for every thread and turn of the fixture's block
# ---------------------------------------------------------------------------------------------

CONSTANTS = {
    "BLOCK_TILE_SIZE_X": 64,
    "BLOCK_TILE_SIZE_Y": 64,
    "BLOCK_TILE_SIZE_K": 16,
    "NUM_THREADS": (64 // 4) * (64 // 8),
}
SIZES = {"m": 70, "n": 100, "k": 37, "lda": 37, "ldb": 100}


def _python(expression: str) -> str:
    """A C expression of the fixture as Python (integer division, logical operators)."""
    expression = re.sub(r"static_cast<T>\((\w+)\)", r"\1", expression)
    expression = expression.replace("&&", " and ").replace("||", " or ")
    return re.sub(r"(?<![/])/(?![/])", "//", expression).replace("U)", ")").replace("0U", "0")


def _loops(param: str) -> str:
    """The body of the loader's loop that stores into ``param``."""
    loader = TEXT[TEXT.index("__device__ void load_tiles_transposed") : TEXT.index("__global__")]
    bodies = re.findall(r"\+\+load_idx\) \{\n(.*?)\n  \}\n", loader, re.S)
    (body,) = [b for b in bodies if f"{param}[" in b]
    return body


def _run_loader(param: str, env: dict[str, object]) -> dict[tuple[int, int], str | None]:
    """Slot -> the load it got (``"A[off]"``) or None (the zero default), from the loader's
    text, for every thread and turn; every slot must be stored once."""
    body = _loops(param)
    trips_text = {
        "A_tile_T": "(BLOCK_TILE_SIZE_Y * BLOCK_TILE_SIZE_K + NUM_THREADS - 1) // NUM_THREADS",
        "B_tile": "(BLOCK_TILE_SIZE_K * BLOCK_TILE_SIZE_X + NUM_THREADS - 1) // NUM_THREADS",
    }[param]
    trips = eval(trips_text, {}, env)
    statements = [" ".join(s.split()) for s in body.split(";") if s.strip()]
    stored: dict[tuple[int, int], str | None] = {}
    for tid, turn in itertools.product(range(CONSTANTS["NUM_THREADS"]), range(trips)):
        local: dict[str, object] = {**env, "thread_linear_idx": tid, "load_idx": turn}
        for statement in statements:
            declared = re.fullmatch(r"size_t const (\w+)\{(.*)\}", statement)
            guarded = re.fullmatch(r"if \((.*)\) \{ val = (\w+)\[(.*)\]", statement)
            slot = re.fullmatch(rf"(?:\}} )?{param}\[(\w+)\]\[(\w+)\] = val", statement)
            if declared:
                local[declared[1]] = eval(_python(declared[2]), {}, local)
            elif statement.startswith("T val{"):
                local["val"] = None
            elif guarded:
                if eval(_python(guarded[1]), {}, local):
                    local["val"] = f"{guarded[2]}[{eval(_python(guarded[3]), {}, local)}]"
            elif slot:
                first, second = slot.groups()
                key = (int(local[first]), int(local[second]))  # type: ignore[call-overload]
                assert key not in stored, f"{param}{list(key)} stored twice"
                stored[key] = local["val"]  # type: ignore[assignment]
            else:
                raise AssertionError(f"unread statement {statement!r}")
    return stored


def _slot_value(tile: Tile2d, first: int, second: int, env: dict[str, object]) -> str | None:
    """What the rewrite reads for slot ``[first][second]``."""
    names = {name: name for name in tile.names | {tile.pointer}}

    whole = tile.value(f"({first})", f"({second})", names)
    if tile.cond is None:
        load = re.fullmatch(r"(\w+)\[(.*)\]", whole)
        assert load is not None
        return f"{load[1]}[{eval(_python(load[2]), {}, env)}]"
    found = re.fullmatch(r"\((.*) \? (\w+)\[(.*)\] : (.*)\)", whole)
    assert found is not None, whole
    if not eval(_python(found[1]), {}, env):
        assert eval(_python(found[4]), {}, env) == 0
        return None
    return f"{found[2]}[{eval(_python(found[3]), {}, env)}]"


@pytest.mark.parametrize(("param", "extents"), [("A_tile_T", (16, 64)), ("B_tile", (16, 64))])
@pytest.mark.parametrize(("block", "tile"), [((0, 0), 0), ((1, 1), 2), ((1, 0), 1)])
def test_every_slot_is_stored_once_with_the_load_the_rewrite_reads(
    param: str, extents: tuple[int, int], block: tuple[int, int], tile: int
) -> None:
    """Every slot of the tile is stored exactly once per turn of the tile loop, for every
    thread of the 128-thread block, and holds the bounds-checked load (or the zero) that the
    rewritten read gives for it; sizes 70 x 100 x 37 put the last tiles past the matrix."""
    source = KernelSource(TEXT).parsed
    (loader,) = [f for f in source.functions if f.name == "load_tiles_transposed"]
    env: dict[str, object] = {
        **CONSTANTS,
        **SIZES,
        "tile_idx": tile,
        "blockIdx": SimpleNamespace(x=block[0], y=block[1]),
    }
    stored = _run_loader(param, env)
    assert sorted(stored) == sorted(itertools.product(*(range(e) for e in extents)))
    rewrite = tile_of(source, loader, param)
    for (first, second), value in stored.items():
        assert _slot_value(rewrite, first, second, env) == value, (first, second)
    zeros = [slot for slot, v in stored.items() if v is None]
    if block == (1, 1):  # the last tile along both dimensions: past the matrix
        assert zeros, "the bounds check is exercised past the matrix"
    if block == (0, 0):
        assert not zeros
