"""block_per_row forward on the thread-per-row form its cooperative-groups removal leaves: rows
counted down from the grid's end (``r = N - 1 - (blockIdx.x * blockDim.x + threadIdx.x)``,
left by ``if (r < 0) return;``). The ``rows_cg_counted_down`` fixture pair runs the round-trip
suite (tests/mechanisms/test_block_per_row.py); these tests show the candidate, the applied
text on the public form's removal, remove(apply(x)) == x, the same sums on the host, the
build, and the refusals of what the rule does not take."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from klineage.mechanisms._block_rows_cg_forward import CG_ROWS
from tests.mechanisms.roundtrip import FIXTURES, PUBLIC_FORMS, compile_ok, diff

block_per_row = get("block_per_row")
BEFORE = KernelSource.from_file(FIXTURES / "block_per_row" / "rows_cg_counted_down.before.cu")
AFTER = KernelSource.from_file(FIXTURES / "block_per_row" / "rows_cg_counted_down.after.cu")
CAUSAL_BEFORE = PUBLIC_FORMS / "block_per_row" / "rows_cg_causal.before.cu"
CAUSAL_AFTER = KernelSource.from_file(PUBLIC_FORMS / "block_per_row" / "rows_cg_causal.after.cu")
ALIAS = "  namespace cg = cooperative_groups;\n"
HEADERS = "#include <cooperative_groups.h>\n#include <cooperative_groups/reduce.h>\n"


def _applied(kernel: KernelSource) -> KernelSource:
    (site,) = block_per_row.candidates(kernel)
    assert site.supported, site.refusal
    assert site.detail["form"] == CG_ROWS
    return block_per_row.apply(kernel, site)


def _removed(kernel: KernelSource) -> KernelSource:
    (site,) = block_per_row.detect(kernel)
    assert site.supported, site.refusal
    return block_per_row.remove(kernel, site)


def _variant(old: str, new: str, kernel: KernelSource = AFTER) -> KernelSource:
    assert old in kernel.text
    return KernelSource(kernel.text.replace(old, new, 1), name="variant.cu")


def _refusal(kernel: KernelSource) -> str:
    (site,) = block_per_row.candidates(kernel)
    assert site.refusal is not None, "the variant should be refused"
    return site.refusal


def test_the_counted_down_rows_are_a_cg_candidate_and_come_back() -> None:
    applied = _applied(AFTER)
    assert applied.text == BEFORE.text, diff(applied.text, BEFORE.text)
    assert _removed(applied).text == AFTER.text


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_the_public_forms_removal_is_written_back_with_a_barrier_after_the_zeroing() -> None:
    """The public form's first warp zeroes the slots with no barrier before the other warps
    publish: the rule writes one, and the block rows the removal took, line for line (blank
    lines aside), but the barrier that closed the row, which one row a block does not need."""
    applied = _applied(CAUSAL_AFTER)
    want = CAUSAL_BEFORE.read_text(encoding="utf-8").replace(
        "0.0f;\n  }\n", "0.0f;\n  }\n  block.sync();\n"
    )
    want = want.replace("  }\n  block.sync();\n}\n", "  }\n}\n")
    assert _lines(applied.text) == _lines(want), diff(applied.text, want)
    assert _removed(applied).text == CAUSAL_AFTER.text


def test_a_kernel_without_groups_gets_the_headers_the_alias_and_the_block_stride() -> None:
    kernel = _variant(HEADERS, "")
    kernel = _variant(ALIAS, "", kernel)
    kernel = _variant("template <int BlockSize>\n", "", kernel)
    kernel = _variant("causal_l1_rows<128><<<", "causal_l1_rows<<<", kernel)
    applied = _applied(kernel)
    text = applied.text
    assert text.count(HEADERS) == 1
    assert f"{ALIAS}  cg::thread_block block" in text
    assert text.count("for (int c = block.thread_rank(); c <= t; c += blockDim.x) {") == 2
    assert "int row = T - 1 - blockIdx.x;" in text
    assert "<<<dim3(t, (unsigned)H), 128, 0, stream>>>" in text
    # the removal takes the rest back; the headers and the alias it keeps
    assert _removed(applied).text.replace(HEADERS, "").replace(ALIAS, "") == kernel.text


def test_taken_names_are_not_reused() -> None:
    kernel = _variant("float norm = 0.0f;", "float norm = 0.0f;\n  float block = 1.0f;")
    kernel = _variant("x_row[c] * inv;", "x_row[c] * inv * block;", kernel)
    text = _applied(kernel).text
    assert "cg::thread_block block2 = cg::this_thread_block();" in text
    assert "for (int c = block2.thread_rank(); c <= t; c += BlockSize) {" in text


@pytest.mark.nvcc
def test_the_block_rows_give_the_thread_rows_sums_on_the_host() -> None:
    """Rows shorter than a warp, than the block, and several block turns long, two heads:
    the block's sum through zeroed slots equals the thread's serial sum within rounding."""
    from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host

    applied = _applied(AFTER)

    def cases(grid_x: str) -> list[Case]:
        return [
            Case(
                {"H": 2, "T": length},
                [Buffer("x", "float", "H * T * T"), Buffer("y", "float", "H * T * T", True)],
                "causal_l1_rows<128>(y, x, (int)T)",
                "T",
                grid=f"dim3({grid_x}, (unsigned)H)",
                block_dims="dim3(128)",
            )
            for length in (1, 7, 40, 300)
        ]

    want = floats(run_on_host(AFTER.text, cases("(unsigned)((T + 127) / 128)")))
    assert_close(floats(run_on_host(applied.text, cases("(unsigned)T"))), want)


@pytest.mark.nvcc
def test_the_applied_kernels_compile(mechanism_builder: Builder) -> None:
    plain = _variant("template <int BlockSize>\n", "")
    plain = _variant("causal_l1_rows<128><<<", "causal_l1_rows<<<", plain)
    compile_ok(mechanism_builder, [_applied(AFTER), _applied(CAUSAL_AFTER), _applied(plain)])


@pytest.mark.parametrize(
    "row",
    [
        "int row = blockIdx.x * blockDim.x + threadIdx.x;",  # counted up
        "int row = T - (blockIdx.x * blockDim.x + threadIdx.x);",  # from N, not N - 1
        "int row = T - 1 - 2 * (blockIdx.x * blockDim.x + threadIdx.x);",  # every other row
    ],
    ids=["up", "from-n", "strided"],
)
def test_other_rows_are_no_candidate_of_this_form(row: str) -> None:
    kernel = _variant("int row = T - 1 - (blockIdx.x * blockDim.x + threadIdx.x);", row)
    assert block_per_row.candidates(kernel) == []


EXIT = "  if (t < 0) return;\n"
NORM_LOOP = "    norm += fabsf(x_row[c]);\n  }\n"


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        (
            [("norm += fabsf(x_row[c]);", "norm = fmaxf(norm, fabsf(x_row[c]));")],
            "reduces norm (max) over its row; this form writes back one float sum",
        ),
        (
            [
                (
                    "    norm += fabsf(x_row[c]);\n",
                    "    norm += fabsf(x_row[c]);\n    mass += x_row[c];\n",
                ),
                ("float norm = 0.0f;", "float norm = 0.0f;\n  float mass = 0.0f;"),
            ],
            "reduces norm (sum), mass (sum)",
        ),
        (
            [
                (
                    "  const float inv = 1.0f / (norm + 1e-6f);\n",
                    "  const float inv = 1.0f / (norm + 1e-6f);\n  y_row[t] = inv;\n",
                )
            ],
            "stores outside a row loop",
        ),
        (
            [("  x += head * T * T;\n", "  if (head > 4) return;\n  x += head * T * T;\n")],
            "returns before the row's exit check",
        ),
        (
            [(EXIT, ""), (NORM_LOOP, NORM_LOOP + EXIT)],
            "comes before the row's exit check",
        ),
        (
            [("y_row[c] = x_row[c] * inv;", "y_row[c] = x_row[c] * inv + threadIdx.x;")],
            "threadIdx.x is used outside the row index",
        ),
        (
            [
                (
                    "<<<dim3((t + 128 - 1) / 128, (unsigned)H), 128,",
                    "<<<dim3(t / 128 + 1, (unsigned)H), 128,",
                )
            ],
            "this form takes grid x (x + B - 1) / B with B its block size `128`",
        ),
        (
            [
                (
                    "for (int c = 0; c <= t; c += 1) {\n    norm",
                    "for (int c = 0; c != t; c += 1) {\n    norm",
                )
            ],
            "does not run while c < n or c <= n",
        ),
    ],
    ids=["max", "two-sums", "store", "early-return", "loop-first", "thread", "grid", "bound"],
)
def test_other_forms_are_refused_with_their_form(edits: list[tuple[str, str]], why: str) -> None:
    kernel = AFTER
    for old, new in edits:
        kernel = _variant(old, new, kernel)
    assert why in _refusal(kernel)
