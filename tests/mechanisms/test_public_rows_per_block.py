"""Rows per block (thread_coarsening): a block walking ``K`` rows in a counted loop becomes
one row per block, the grid ``K`` times larger, or is refused with what its turns carry.

The CPU check reads the stores' index forms and row bounds from the analysis of both
fixtures and enumerates, for a small grid, which (row, element) pairs every thread of every
block touches: block ``b`` at turn ``r`` before is block ``K * b + r`` after."""

from __future__ import annotations

from collections import Counter

import pytest

from klineage.cuda.analysis import IndexForm, analysis
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

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
