"""Block per row in the cooperative-groups spelling (llm.c attention backward's kernel 8 once
its rows per block are gone): what the removal takes, and what it refuses, with the form."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms._block_rows_cg import cg_block_rows
from klineage.mechanisms._rows_forms import NotCanonical
from tests.mechanisms.roundtrip import PUBLIC_FORMS

BEFORE = (PUBLIC_FORMS / "block_per_row" / "rows_cg_causal.before.cu").read_text(encoding="utf-8")
COARSENED = (PUBLIC_FORMS / "thread_coarsening" / "rows_per_block.before.cu").read_text(
    encoding="utf-8"
)
block_per_row = get("block_per_row")


def _refusal(text: str) -> str:
    kernel = KernelSource(text, name="kernel.cu")
    with pytest.raises(NotCanonical) as refused:
        cg_block_rows(kernel.parsed, kernel.parsed.kernels[0])
    return str(refused.value)


def test_the_rows_become_threads_counted_down_from_the_grid() -> None:
    (site,) = block_per_row.detect(KernelSource(BEFORE))
    assert site.supported and site.function == "causal_center_rows"
    after = block_per_row.remove(KernelSource(BEFORE), site).text
    code = after.split("#include", 1)[1]  # the header comment names what went
    assert "int last = T - 1 - (blockIdx.x * blockDim.x + threadIdx.x);" in after
    assert after.count("for (int c = 0; c <= t; c += 1)") == 2
    for gone in ("__shared__", "cg::reduce", ".sync()", "thread_rank", "tiled_partition"):
        assert gone not in code, gone
    assert "<<<dim3(((t / 4 * 4) + 128 - 1) / 128, (unsigned)H), 128, 0, stream>>>" in after


def test_the_rows_per_block_loop_still_ties_rows_to_the_block() -> None:
    (site,) = block_per_row.detect(KernelSource(COARSENED))
    assert not site.supported  # the coarsening goes first (thread_coarsening's rows per block)


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("int last = T - 1 - blockIdx.x;", "int last = blockIdx.x;", "rows counted down"),
        ("  if (t < 0) return;\n", "", "writes memory before the row's exit check"),
        (
            "  if (t < 0) return;\n",
            "  if (t >= T) return;\n",
            "writes memory before the row's exit check",
        ),
        (
            "  __shared__ float warp_sums[32];",
            "  __shared__ float warp_sums[32], spare[4];",
            "shares memory beyond its reductions",
        ),
        (
            "c <= t; c += BlockSize) {\n    sum",
            "c <= t; c += 64) {\n    sum",
            "does not step by the block's size",
        ),
        (
            "causal_center_rows<128><<<dim3(t / 4 * 4, (unsigned)H), 128,",
            "causal_center_rows<128><<<dim3(t / 4 * 4, (unsigned)H), 256,",
            "does not step by the block's size",
        ),
        (
            "  block.sync();\n  sum = cg::reduce",
            "  sum = cg::reduce",
            "not followed by a block barrier",
        ),
    ],
)
def test_other_spellings_are_refused_with_their_form(old: str, new: str, why: str) -> None:
    assert old in BEFORE
    assert why in _refusal(BEFORE.replace(old, new, 1))
