"""Writing a device helper's call out in place (klineage.cuda.inline), and the edits between
two texts (klineage.cuda.edit.edits_between)."""

from __future__ import annotations

import pytest

from klineage.cuda.edit import apply_edits, edits_between
from klineage.cuda.inline import caller_names, inline_call
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource

HELPERS = """
constexpr int kScale = 3;

template <typename T, int N, int STRIDE>
__device__ void load_row(T const tile[N], T regs[N / STRIDE], int first) {
  static_assert(N % STRIDE == 0);
  for (int i = 0; i < N / STRIDE; ++i) {
    int const at = first + i * STRIDE;
    regs[i] = tile[at] * kScale;
  }
}

__device__ void bump(int count, float* out) {
  count += 1;
  out[0] = count;
}

__device__ float twice(float v) { return 2.0f * v; }

template <int N> __device__ void early(float* out) {
  if (N > 4) return;
  out[0] = 1.0f;
}

__global__ void k(const float* a, float* out, int first) {
  __shared__ float tile[4][32];
  float regs[8];
  for (int i = 0; i < 4; ++i) {
    load_row<float, 32, 4>(tile[i], regs, first + i);
    bump(first * 2, out);
    early<2>(out);
    load_row(tile[i], regs, first);
  }
  out[1] = twice(regs[0]);
}
"""


def _statement(source: ParsedSource, text: str) -> Node:
    return next(
        n for n in source.iter_nodes("expression_statement") if source.text_of(n).startswith(text)
    )


def _inline(text: str, statement: str) -> tuple[list[str], list[str], set[str]]:
    source = KernelSource(text).parsed
    kernel = source.function("k")
    assert kernel is not None
    taken = caller_names(source, kernel)
    written = inline_call(source, _statement(source, statement), taken)
    return written.statements, written.asserts, taken


def test_template_arguments_and_arguments_stand_in_and_clashing_locals_are_renamed() -> None:
    statements, asserts, taken = _inline(HELPERS, "load_row<float, 32, 4>")
    assert asserts == ["static_assert(32 % 4 == 0);"]
    (loop,) = statements
    assert "for (int i_2 = 0; i_2 < 32 / 4; ++i_2)" in loop  # the caller's `i` is not shadowed
    assert "int const at = (first + i) + i_2 * 4;" in loop
    assert "regs[i_2] = tile[i][at] * kScale;" in loop
    assert {"i_2", "at"} <= taken


def test_a_parameter_the_helper_writes_becomes_a_copy() -> None:
    statements, _, _ = _inline(HELPERS, "bump(")
    assert statements == ["int count = first * 2;", "count += 1;", "out[0] = count;"]


@pytest.mark.parametrize(
    ("statement", "reason"),
    [
        ("early<2>", "with a `return` in its body"),
        ("load_row(tile[i]", "0 template arguments for 3 parameters"),
    ],
)
def test_what_cannot_be_written_out_is_refused(statement: str, reason: str) -> None:
    with pytest.raises(NotInForm, match=reason):
        _inline(HELPERS, statement)


def test_a_name_the_helper_reads_from_the_file_must_not_be_a_local_of_the_caller() -> None:
    text = HELPERS.replace("float regs[8];", "float regs[8];\n  int kScale = 2;")
    with pytest.raises(NotInForm, match="reads kScale, which the caller declares too"):
        _inline(text, "load_row<float, 32, 4>")


def test_an_array_parameter_needs_a_name_or_an_element_of_one() -> None:
    text = HELPERS.replace("load_row<float, 32, 4>(tile[i],", "load_row<float, 32, 4>(&tile[i][0],")
    with pytest.raises(NotInForm, match="not a name or an element of one"):
        _inline(text, "load_row<float, 32, 4>")


def test_edits_between_two_texts_land_as_the_lines_that_changed() -> None:
    old = KernelSource("int a = 1;\nint b = 2;\nint c = 3;\nint d = 4;\n")
    new = "int a = 1;\nint b = 20;\nint c = 3;\nint e = 5;\nint d = 4;\n"
    edits = edits_between(old.text, new)
    assert len(edits) == 2
    assert apply_edits(old, edits).text == new
    assert edits_between(old.text, old.text) == []


NAMESPACED = """
namespace tiles {
constexpr int kWidth = 4;
template <int N> __device__ void zero(float* a) {
  for (int i = 0; i < N; ++i) a[i] = 0.0f;
  return;
}
template <int N> __device__ void widen(float* a) {
  for (int i = 0; i < N; ++i) a[i] *= kWidth;
}
}  // namespace tiles

__global__ void k(float* out) {
  float regs[8];
  tiles::zero<8>(regs);
  tiles::widen<8>(regs);
  out[threadIdx.x] = regs[0];
}
"""


def test_a_qualified_call_and_a_trailing_return_are_written_out() -> None:
    statements, _, _ = _inline(NAMESPACED, "tiles::zero<8>")
    assert statements == ["for (int i = 0; i < 8; ++i) regs[i] = 0.0f;"]


def test_a_helper_naming_its_namespace_is_refused() -> None:
    with pytest.raises(NotInForm, match="names kWidth of its namespace"):
        _inline(NAMESPACED, "tiles::widen<8>")
