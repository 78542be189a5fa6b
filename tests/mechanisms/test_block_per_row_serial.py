"""A block per row whose loops stride by the block and are unrolled by hand, reduced through
per-warp scratch that thread 0 walks serially (the ``serial_unrolled`` fixtures): what the
rewrite to a thread per row keeps, and the variants it refuses."""

from __future__ import annotations

from collections import Counter

import pytest

from klineage.cuda.analysis import IndexForm, analysis
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

block_per_row = get("block_per_row")
BEFORE = KernelSource.from_file(PUBLIC_FORMS / "block_per_row" / "serial_unrolled.before.cu")
AFTER = KernelSource.from_file(PUBLIC_FORMS / "block_per_row" / "serial_unrolled.after.cu")


def _variant(old: str, new: str, count: int = 1) -> KernelSource:
    assert old in BEFORE.text
    return KernelSource(BEFORE.text.replace(old, new, count), name="variant.cu")


def _refusal(kernel: KernelSource) -> str:
    (site,) = block_per_row.detect(kernel)
    assert site.refusal is not None, "the variant should be refused"
    return site.refusal


def _guarded_columns(kernel: KernelSource, threads: int, block: int, cols: int) -> list[Counter]:
    """For each guarded write of the row loops (``if (c + s * B < cols)``), how often each
    column is written by the ``threads`` threads of one row, read from the index analysis."""
    source = kernel.parsed
    function = source.function("row_softmax")
    assert function is not None and function.body is not None
    indices = analysis(source).indices(function)
    found = []
    for guard in indices.nodes("if_statement"):
        condition = guard.child_by_field_name("condition")
        test = condition.child_by_field_name("value") if condition is not None else None
        if test is None or not source.text_of(test).endswith("< cols"):
            continue
        left = test.child_by_field_name("left")
        assert left is not None
        element = indices.form(left)
        loops = [indices.loop(a) for a in element.atoms() if indices.loop(a) is not None]
        outer = next(v for v in loops if v is not None and v.name == "c")
        inner = next(v for v in loops if v is not None and v.name == "s")
        assert inner.trip is not None and outer.step is not None
        counts: Counter = Counter()
        for thread in range(threads):
            known = {"threadIdx.x": IndexForm.constant(thread), "blockDim.x": block}
            values = {
                k: v if isinstance(v, IndexForm) else IndexForm.constant(v)
                for k, v in known.items()
            }
            start, step = outer.init.substitute(values).value, outer.step.substitute(values).value
            assert start is not None and step is not None
            for c in range(start, cols, step):
                for s in range(inner.trip):
                    at = {
                        **values,
                        outer.atom: IndexForm.constant(c),
                        inner.atom: IndexForm.constant(s),
                    }
                    column = element.substitute(at).value
                    assert column is not None
                    if column < cols:
                        counts[column] += 1
        found.append(counts)
    return found


@pytest.mark.parametrize("cols", [64, 100, 256, 257, 1000])
def test_the_block_and_the_thread_write_every_column_of_a_row_exactly_once(cols: int) -> None:
    every_column_once = Counter(range(cols))
    block = _guarded_columns(BEFORE, threads=64, block=64, cols=cols)
    thread = _guarded_columns(AFTER, threads=1, block=64, cols=cols)
    assert len(block) == len(thread) == 2
    assert all(counts == every_column_once for counts in block + thread)


def test_the_block_reductions_become_the_threads_partials() -> None:
    assert "const float top = m;" in AFTER.text and "const float sum = total;" in AFTER.text
    assert "__syncthreads" not in AFTER.text and "scratch" not in AFTER.text
    # the row count is the parameter the launch passes the grid size in
    assert "if (row >= rows) return;" in AFTER.text
    assert "<<<(unsigned)((rows + threads - 1) / threads), threads, 0, stream>>>" in AFTER.text


def test_a_step_that_is_not_a_multiple_of_the_block_is_refused() -> None:
    kernel = _variant("c += kSlots * blockDim.x) {", "c += kSlots * blockDim.x + 1) {")
    assert "steps by a multiple of the block size" in _refusal(kernel)


def test_a_start_off_the_threads_rank_is_refused() -> None:
    kernel = _variant("for (int c = t; c < cols;", "for (int c = t + 1; c < cols;")
    refusal = _refusal(kernel)
    assert "starts at the thread's rank" in refusal and "line 39" in refusal


def test_a_bare_use_of_the_strided_index_is_refused() -> None:
    kernel = _variant("y[c + s * blockDim.x] = e;", "y[c] = e;")
    assert "other than as c + u * blockDim.x" in _refusal(kernel)


def test_an_unguarded_sum_is_refused() -> None:
    kernel = _variant(
        "      if (c + s * blockDim.x < cols) {\n"
        "        const float e = expf(x[c + s * blockDim.x] - top);\n"
        "        y[c + s * blockDim.x] = e;\n"
        "        total += e;\n"
        "      }\n",
        "      const float e = expf(x[min(cols - 1, c + s * blockDim.x)] - top);\n"
        "      total += e;\n",
    )
    assert "is not guarded by `i + u * blockDim.x < cols`" in _refusal(kernel)


def test_a_serial_reduction_reading_more_than_the_scratch_is_refused() -> None:
    kernel = _variant("best = fmaxf(best, row_max[w]);", "best = fmaxf(best, row_max[w] + x[w]);")
    assert "reads x[w], not only the row_max slots" in _refusal(kernel)


def test_another_read_of_the_scratch_is_refused() -> None:
    kernel = _variant("const float inv = 1.0f / sum;", "const float inv = row_sum[1] / sum;")
    assert "shares row_sum (shared memory) beyond a reduction" in _refusal(kernel)


def test_a_barrier_outside_the_reductions_is_refused() -> None:
    kernel = _variant("  float total = 0.0f;\n", "  __syncthreads();\n  float total = 0.0f;\n")
    assert "__syncthreads at line" in _refusal(kernel)


def test_an_early_exit_on_another_bound_than_the_loops_is_refused() -> None:
    kernel = _variant("if (t >= cols) {", "if (t >= cols / 2) {")
    assert "the early exit at line 31 bounds the rank by cols / 2" in _refusal(kernel)


def test_an_early_exit_publishing_a_value_that_is_not_neutral_is_refused() -> None:
    kernel = _variant("row_sum[warp] = 0.0f;", "row_sum[warp] = 1.0f;")
    assert "beyond a reduction" in _refusal(kernel)


def test_a_row_index_mixed_with_the_thread_is_refused() -> None:
    kernel = _variant(
        "float* y = out + (size_t)row * cols;", "float* y = out + (size_t)blockIdx.x * cols + t;"
    )
    assert _refusal(kernel).startswith("t at line 37 is not a group-strided loop start")


def test_a_serial_reduction_combining_otherwise_than_the_warps_is_refused() -> None:
    kernel = _variant("best = fmaxf(best, row_max[w]);", "best += row_max[w];")
    assert "combines with max, the serial one after it with sum" in _refusal(kernel)


def test_a_serial_sum_that_skips_a_warp_is_refused() -> None:
    kernel = _variant("for (int w = 0; w < warps; ++w) acc", "for (int w = 1; w < warps; ++w) acc")
    assert "does not walk the slots 0 .. warps - 1 one by one" in _refusal(kernel)


def test_a_serial_reduction_over_half_the_warps_is_refused() -> None:
    kernel = _variant("w < warps; ++w) best", "w < warps / 2; ++w) best")
    assert "does not walk the slots 1 .. warps - 1 one by one" in _refusal(kernel)
