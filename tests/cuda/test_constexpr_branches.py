"""`if constexpr` branches no instantiation takes, found from the file's launches."""

from __future__ import annotations

from klineage.cuda.constexpr_branches import emptied_branches, untaken_branches
from klineage.cuda.edit import apply_edits
from klineage.kernel import KernelSource

KERNEL = """
template <int kPack>
__global__ void k(float* y, int n) {
  float s = 0;
  if constexpr (kPack == 0) {
    s = 1;
  } else {
    if constexpr (kPack > 2) { s = 3; }
    s = 2;
  }
  if constexpr (kPack != 0) { s += 4; }
  y[0] = s;
}

extern "C" int run(float* y, int n) {
  LAUNCHES
  return 0;
}
"""


def _kernel(launches: str) -> KernelSource:
    return KernelSource(KERNEL.replace("LAUNCHES", launches))


def _branches(kernel: KernelSource) -> list[str]:
    parsed = kernel.parsed
    function = parsed.function("k")
    assert function is not None
    return [" ".join(parsed.text_of(n).split()) for n in untaken_branches(parsed, function)]


def test_a_template_launched_with_one_value_leaves_out_the_other_branches() -> None:
    kernel = _kernel("k<0><<<1, 32>>>(y, n);")
    # the else branch (with the `if constexpr` inside it) and the body of `kPack != 0`
    assert _branches(kernel) == [
        "{ if constexpr (kPack > 2) { s = 3; } s = 2; }",
        "{ s += 4; }",
    ]


def test_a_branch_some_launch_takes_is_kept() -> None:
    kernel = _kernel("k<0><<<1, 32>>>(y, n);\n  k<4><<<1, 32>>>(y, n);")
    assert _branches(kernel) == []
    kernel = _kernel("k<1><<<1, 32>>>(y, n);\n  k<4><<<1, 32>>>(y, n);")
    # kPack == 0 is false for both and kPack != 0 true: only the first consequence is dead
    assert _branches(kernel) == ["{ s = 1; }"]


def test_an_instantiation_that_does_not_fold_leaves_everything() -> None:
    assert _branches(_kernel("k<N><<<1, 32>>>(y, n);")) == []


def test_emptying_the_branches_keeps_code_that_parses() -> None:
    kernel = _kernel("k<0><<<1, 32>>>(y, n);")
    parsed = kernel.parsed
    function = parsed.function("k")
    assert function is not None
    edits, dead = emptied_branches(parsed, function)
    assert len(edits) == len(dead) == 2
    text = apply_edits(kernel, edits).text  # refused were the result to parse worse
    assert "} else {}" in text and "s = 2" not in text and "s += 4" not in text
    assert "s = 1;" in text
    assert not KernelSource(text).parsed.errors
