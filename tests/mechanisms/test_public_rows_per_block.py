"""Rows per block (thread_coarsening): a block walking ``K`` rows in a counted loop becomes
one row per block, the grid ``K`` times larger, or is refused with what its turns carry.

The CPU check reads the stores' index forms and row bounds from the analysis of both
fixtures and enumerates, for a small grid, which (row, element) pairs every thread of every
block touches: block ``b`` at turn ``r`` before is block ``K * b + r`` after."""

from __future__ import annotations

from collections import Counter

import pytest

from klineage.cuda.analysis import IndexForm, analysis
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mining.removal import reapply, remove_mechanism
from klineage.problem import load_problem
from tests.conftest import REPO
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok, removal_chain

coarsening = get("thread_coarsening")
BEFORE = PUBLIC_FORMS / "thread_coarsening" / "rows_per_block.before.cu"
AFTER = PUBLIC_FORMS / "thread_coarsening" / "rows_per_block.after.cu"


def _value(form: IndexForm, values: dict[str, int]) -> int:
    got = form.substitute({k: IndexForm.constant(v) for k, v in values.items()}).value
    assert got is not None, (form, values)
    return got


def _touched(path, grid_x: int, heads: int, T: int, block: int) -> dict[tuple, set[tuple]]:
    """(head, block, thread, turn) -> the (row, column) pairs its stores write."""
    source = KernelSource(path.read_text()).parsed
    indices = analysis(source).indices(source.kernels[0])
    (store,) = [a for a in indices.accesses() if a.direction == "store" and a.buffer.name == "out"]
    (inner,) = [a for a in store.offset.atoms() if "@" in a and a.startswith("c@")]
    turns = [a for a in store.offset.atoms() if a.startswith("r@")]
    column = indices.loop(inner)
    assert column is not None and column.bound is not None and column.step is not None
    touched: dict[tuple, set[tuple]] = {}
    for head in range(heads):
        for bx in range(grid_x):
            for tid in range(block):
                for turn in range(4 if turns else 1):
                    values = {"blockIdx.x": bx, "blockIdx.y": head, "threadIdx.x": tid}
                    values |= {"T": T, "BlockSize": block} | {t: turn for t in turns}
                    row = _value(indices.form(column.bound), values)
                    if row < 0:
                        break  # `if (t < 0) return;`
                    pairs = set()
                    c = _value(column.init, values)
                    while c <= row:
                        offset = _value(store.offset, values | {inner: c})
                        pairs.add((offset // (T * T), offset % (T * T) // T, offset % T))
                        c += _value(column.step, values)
                    touched[(head, 4 * bx + turn if turns else bx, tid)] = pairs
    return touched


@pytest.mark.parametrize("T", [8, 12, 20])
def test_one_row_per_block_touches_what_each_turn_touched(T: int) -> None:
    heads, block = 2, 4
    before = _touched(BEFORE, T // 4, heads, T, block)
    after = _touched(AFTER, T // 4 * 4, heads, T, block)
    assert before == after
    written = Counter(p for pairs in after.values() for p in pairs)
    lower = {(h, r, c) for h in range(heads) for r in range(T) for c in range(r + 1)}
    assert set(written) == lower and set(written.values()) == {1}


def _site(text: str):
    (site,) = coarsening.detect(KernelSource(text))
    return site


def test_the_fixture_site_is_removable_as_rows() -> None:
    site = _site(BEFORE.read_text())
    assert site.supported and site.detail["form"] == "rows"
    assert (
        "dim3(t / 4 * 4, (unsigned)H)"
        in coarsening.remove(KernelSource(BEFORE.read_text()), site).text
    )


CARRY = ("float sum = 0.0f;", "float sum = carry;\n    carry += 1.0f;")
REFUSED = {
    "a running value": (
        [("  for (int r = 0;", "  float carry = 0.0f;\n  for (int r = 0;"), CARRY],
        "rows that carry carry from one turn to the next",
    ),
    "no barrier": (
        [("    block.sync();\n    sum =", "    sum =")],
        "rows reading warp_sums with no barrier after every write of it",
    ),
    "a later guard": (
        [("if (t < 0) return;", "if (t > 7) return;")],
        "rows ended by `if (t > 7) return;`, not a guard every later row takes too",
    ),
    "gridDim.x": (
        [("int head = blockIdx.y;", "int head = blockIdx.y + gridDim.x;")],
        "a kernel that reads gridDim.x",
    ),
    "blockIdx.x": (
        [("int head = blockIdx.y;", "int head = blockIdx.y;\n  if (blockIdx.x > 99) return;")],
        "a kernel reading blockIdx.x outside its row's base",
    ),
    "read back": (
        [("out_row[c] = x_row[c] - mean;", "out_row[c] = x_row[c] - out[c];")],
        "rows that both read and write out",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_rows_whose_turns_depend_on_each_other_are_refused(case: str) -> None:
    edits, why = REFUSED[case]
    text = BEFORE.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new, 1)
    site = _site(text)
    assert not site.supported
    assert f"as rows per block, it is {why}" in str(site.refusal)
    assert "that removal needs rows per block: a loop" in str(site.refusal)


# -- forward: a block per row becomes K rows a block ---------------------------------------

ROW_SUMS = """\
__global__ void row_sums(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x;
    if (row >= rows) return;
    __shared__ float partial[128];
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += x[row * cols + c];
    partial[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int i = 0; i < 128; ++i) total += partial[i];
        y[row] = total;
    }
}
extern "C" int run(const float* x, float* y, long long rows, long long cols, cudaStream_t s) {
    row_sums<<<(unsigned)rows, 128, 0, s>>>(x, y, (int)rows, (int)cols);
    return 0;
}
"""


def _rows_candidate(kernel: KernelSource):  # type: ignore[no-untyped-def]
    (site,) = [c for c in coarsening.candidates(kernel) if c.detail.get("form") == "rows"]
    return site


def test_the_removed_rows_per_block_come_back_by_the_forward_rule() -> None:
    before = KernelSource(BEFORE.read_text())
    removal = remove_mechanism(before, coarsening)
    assert removal.carriers == [Carrier(rows=4)]
    again = reapply(removal)
    # the loop, the scaled base and the grid come back; the constant's name does not
    assert "for (int row_turn = 0; row_turn < 4; ++row_turn) {" in again.text
    assert "int t = last - row_turn;" in again.text
    assert "int last = T - 1 - (4 * blockIdx.x);" in again.text
    assert "dim3(t / 4, (unsigned)H)" in again.text
    assert "__syncthreads();" not in again.text  # the turn already ends in block.sync()
    # and removing it again gives the simplified kernel, but for a pair of parentheses
    (back,) = removal_chain(coarsening, again).states[1:]
    assert back.text == removal.simplified.text.replace(
        "int last = T - 1 - blockIdx.x;", "int last = T - 1 - (blockIdx.x);"
    )


def test_a_block_per_row_with_an_upward_guard_takes_four_rows_a_block(
    shared_builder: Builder,
) -> None:
    kernel = KernelSource(ROW_SUMS)
    site = _rows_candidate(kernel)
    assert site.supported and site.detail["kernel"] == "row_sums"
    after = coarsening.apply(kernel, site, Carrier(rows=4))
    text = after.text
    assert "for (int row_turn = 0; row_turn < 4; ++row_turn) {" in text
    assert "    int row_first = 4 * blockIdx.x;\n    for (int row_turn" in text
    assert "int row = row_first + row_turn;" in text
    assert "        if (row >= rows) return;" in text  # every later row takes it too
    # thread 0 reads the partials last; the next turn must not overwrite them before
    assert text.count("__syncthreads();") == 2
    assert "row_sums<<<((unsigned)rows + 3) / 4, 128, 0, s>>>" in text
    # the removal reads it back as one row a block over the same rows
    (back,) = removal_chain(coarsening, after).states[1:]
    assert "int row = row_first;" in back.text and "int row_first = blockIdx.x;" in back.text
    compile_ok(shared_builder, [kernel, after])


def test_a_turn_whose_last_loop_holds_a_barrier_still_closes_with_one() -> None:
    # thread 0 reads partial after the loop's barrier: the next row's first store to partial
    # would race with it, so a barrier inside the last statement does not end the turn
    looped = ROW_SUMS.replace(
        """    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int i = 0; i < 128; ++i) total += partial[i];
        y[row] = total;
    }
""",
        """    for (int pass = 0; pass < 2; ++pass) {
        __syncthreads();
        if (threadIdx.x == pass) y[row] = partial[0] + partial[127];
    }
""",
    )
    kernel = KernelSource(looped)
    after = coarsening.apply(kernel, _rows_candidate(kernel), Carrier(rows=4))
    assert (
        "        __syncthreads();  // the next row writes what this one read\n    }" in after.text
    )
    # a turn whose last statement is the barrier itself needs none more
    ended = KernelSource(
        looped.replace("partial[127];\n    }\n", "partial[127];\n    }\n    __syncthreads();\n")
    )
    again = coarsening.apply(ended, _rows_candidate(ended), Carrier(rows=4))
    assert "// the next row writes" not in again.text


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (("    if (row >= rows) return;\n", ""), "without the guard `if (row >= e) return;`"),
        (("c += blockDim.x", "c += blockDim.x * gridDim.x"), "reading gridDim.x"),
        (("y[row] = total", "y[blockIdx.x] = total"), "reading blockIdx.x 2 times"),
    ],
)
def test_a_block_per_row_out_of_form_is_refused_with_the_reason(
    change: tuple[str, str], refusal: str
) -> None:
    kernel = KernelSource(ROW_SUMS.replace(*change))
    site = _rows_candidate(kernel)
    assert site.refusal is not None and refusal in site.refusal


def test_kernels_without_a_row_of_blocks_offer_no_rows_candidate() -> None:
    elementwise = ROW_SUMS.replace("int row = blockIdx.x;", "int row = threadIdx.y;")
    kernel = KernelSource(elementwise.replace("    if (row >= rows) return;\n", ""))
    assert [c for c in coarsening.candidates(kernel) if c.detail.get("form") == "rows"] == []


def test_rows_per_block_after_block_per_row_on_a_heldout_kernel(shared_builder: Builder) -> None:
    # depth 2 in replay: block_per_row's rewrite of the naive row sum is a block per row
    # with its guard, so several rows a block apply next
    naive = load_problem(REPO / "heldout" / "row_sum").kernel_source()
    block_per_row = get("block_per_row")
    (site,) = [c for c in block_per_row.candidates(naive) if c.supported]
    rows = block_per_row.apply(naive, site)
    after = coarsening.apply(rows, _rows_candidate(rows), Carrier(rows=4))
    text = after.text
    assert "const int64_t r_first = (int64_t)(4 * blockIdx.x);" in text
    assert "const int64_t r = r_first + row_turn;" in text  # the row keeps its type
    # block_reduce_sum's scratch is shared: each turn closes with a barrier
    assert "    __syncthreads();  // the next row writes what this one read\n  }" in text
    assert "row_sum<<<((unsigned)rows + 3) / 4, 256, 0, stream>>>" in text
    compile_ok(shared_builder, [after])


def test_rows_that_would_carry_a_local_from_turn_to_turn_are_refused() -> None:
    # a local declared before the row and written after it would accumulate across the rows
    # of a block: the removal's reading of the result refuses it, so apply does too
    carried = ROW_SUMS.replace(
        "    int row = blockIdx.x;\n", "    float seen = 0.f;\n    int row = blockIdx.x;\n"
    ).replace("y[row] = total;", "seen += total;\n        y[row] = seen;")
    kernel = KernelSource(carried)
    site = _rows_candidate(kernel)
    with pytest.raises(MechanismRefused, match="carry seen"):
        coarsening.apply(kernel, site, Carrier(rows=4))
