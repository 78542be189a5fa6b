"""block_per_row and warp_per_row forward on the thread-per-row form that public experts'
removals leave: compile-time constants before the row index, and row loops unrolled by hand
(``for (i = 0; i < n; i += U) for (u = 0; u < U; u++) ... p[min(n - 1, i + u)] ...``, writes
past the row's end guarded). The ``unrolled_*`` fixture pairs run the round-trip suite both ways;
these tests show the candidates, the applied text, remove(apply(x)) == x, the build, and the
refusals of what the rule does not take."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from tests.mechanisms.roundtrip import FIXTURES, compile_ok, diff

block_per_row = get("block_per_row")
warp_per_row = get("warp_per_row")
SOFTMAX = KernelSource.from_file(FIXTURES / "block_per_row" / "unrolled_softmax.after.cu")
BACKWARD = KernelSource.from_file(FIXTURES / "block_per_row" / "unrolled_backward.after.cu")


def _applied(mechanism_name: str, kernel: KernelSource, block: int = 256) -> KernelSource:
    mechanism = get(mechanism_name)
    (site,) = mechanism.candidates(kernel)
    assert site.supported, site.refusal
    return mechanism.apply(kernel, site, Carrier(block_size=block))


def _refusal(mechanism_name: str, kernel: KernelSource) -> str:
    (site,) = get(mechanism_name).candidates(kernel)
    assert site.refusal is not None, "the variant should be refused"
    return site.refusal


def _variant(kernel: KernelSource, old: str, new: str) -> KernelSource:
    assert old in kernel.text
    return KernelSource(kernel.text.replace(old, new), name="variant.cu")


@pytest.mark.parametrize(
    ("name", "kernel"),
    [("block_per_row", SOFTMAX), ("block_per_row", BACKWARD), ("warp_per_row", BACKWARD)],
    ids=["block-softmax", "block-backward", "warp-backward"],
)  # the warp refuses the softmax: test_a_clamped_read_back_needs_a_block
def test_a_leading_constant_and_unrolled_loops_are_a_supported_candidate(
    name: str, kernel: KernelSource
) -> None:
    (site,) = get(name).candidates(kernel)
    assert site.supported and site.function == kernel.parsed.kernels[0].name


def test_the_block_takes_turns_inside_each_run_of_slots() -> None:
    text = _applied("block_per_row", SOFTMAX).text
    assert "const int kUnroll = 4;\n  const int row = (int64_t)blockIdx.x;" in text
    assert text.count("for (int i = threadIdx.x; i < cols; i += blockDim.x * kUnroll) {") == 3
    assert "top = fmaxf(top, x[min(cols - 1, i + u * blockDim.x)]);" in text
    assert "if (i + u * blockDim.x < cols) {" in text
    assert "y[i + u * blockDim.x] = v[u] * inv;" in text
    assert "top = block_reduce_max(top);" in text and "total = block_reduce_sum(total);" in text
    assert "v[u] = __ldcs(&x[min(cols - 1, i + u * blockDim.x)]);" in text  # registers stay
    assert "<<<(unsigned)n, 256, 0, stream>>>" in text


def test_the_warp_strides_by_32_slots() -> None:
    text = _applied("warp_per_row", BACKWARD).text
    assert "const int row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;" in text
    assert "for (int i = threadIdx.x & 31; i < cols; i += 32 * kUnroll) {" in text
    assert "__stcs(dxr + (i + u * 32), a[u] * (b[u] - dot));" in text
    assert "dot = warp_reduce_sum(dot);" in text


@pytest.mark.parametrize("kernel", [SOFTMAX, BACKWARD], ids=["softmax", "backward"])
@pytest.mark.parametrize("block", [64, 256])
def test_removing_what_the_block_rule_wrote_gives_the_kernel_back(
    kernel: KernelSource, block: int
) -> None:
    applied = _applied("block_per_row", kernel, block)
    (site,) = block_per_row.detect(applied)
    back = block_per_row.remove(applied, site)
    # the launch comes back as ceil(rows / block) of the block size the rule chose
    want = kernel.text.replace("(n + 127) / 128), 128", f"(n + {block - 1}) / {block}), {block}")
    assert back.text == want, diff(back.text, want)


def test_removing_what_the_warp_rule_wrote_gives_the_kernel_back() -> None:
    applied = _applied("warp_per_row", BACKWARD, 128)
    (site,) = warp_per_row.detect(applied)
    back = warp_per_row.remove(applied, site)
    assert back.text == BACKWARD.text, diff(back.text, BACKWARD.text)


@pytest.mark.nvcc
def test_the_applied_kernels_compile(mechanism_builder: Builder) -> None:
    compile_ok(
        mechanism_builder,
        [
            _applied("block_per_row", SOFTMAX),
            _applied("block_per_row", BACKWARD, 512),
            _applied("warp_per_row", BACKWARD),
        ],
    )


def test_a_clamped_read_back_needs_a_block() -> None:
    """Past the row's end every lane reads y[cols - 1], which another lane wrote; a block
    reduction's barrier orders that, warp shuffles do not."""
    refusal = _refusal("warp_per_row", SOFTMAX)
    assert "reads the row's last element past its end" in refusal
    assert "shuffles are no memory barrier" in refusal


def test_a_clamped_read_back_without_a_reduction_between_is_refused() -> None:
    kernel = _variant(SOFTMAX, "        total += e;\n", "")
    kernel = _variant(kernel, "1.0f / total", "1.0f / cols")
    refusal = _refusal("block_per_row", kernel)
    assert "with no group reduction (barrier) in between" in refusal


def test_an_unguarded_sum_past_the_row_end_is_refused() -> None:
    kernel = _variant(
        BACKWARD,
        "      if (i + u < cols) {\n        dot += yr[i + u] * dyr[i + u];\n      }\n",
        "      dot += yr[min(cols - 1, i + u)] * dyr[min(cols - 1, i + u)];\n",
    )
    refusal = _refusal("block_per_row", kernel)
    assert "is not guarded by `i + u < cols`" in refusal
    assert "this rule takes a row loop unrolled by hand" in refusal


def test_an_unguarded_streamed_store_is_refused() -> None:
    kernel = _variant(
        BACKWARD,
        "      if (i + u < cols) {\n        __stcs(dxr + (i + u), a[u] * (b[u] - dot));\n      }\n",
        "      __stcs(dxr + min(cols - 1, i + u), a[u] * (b[u] - dot));\n",
    )
    assert "is not guarded by `i + u < cols`" in _refusal("block_per_row", kernel)


def test_a_bare_use_of_the_unrolled_index_is_refused() -> None:
    kernel = _variant(SOFTMAX, "y[i + u] = v[u] * inv;", "y[i] = v[u] * inv;")
    assert "i is used at line 48 other than as i + u" in _refusal("block_per_row", kernel)


def test_a_slot_loop_that_does_not_cover_the_step_is_refused() -> None:
    kernel = _variant(
        SOFTMAX,
        "    for (int u = 0; u < kUnroll; u++) {\n      top = fmaxf",
        "    for (int u = 0; u < kUnroll - 1; u++) {\n      top = fmaxf",
    )
    assert "is not u with u an inner loop over 0 .. 3" in _refusal("block_per_row", kernel)


def test_a_step_that_is_not_a_constant_is_refused() -> None:
    head = "i += kUnroll) {\n#pragma unroll\n    for (int u = 0; u < kUnroll; u++) {\n      top"
    kernel = _variant(SOFTMAX, head, head.replace("i += kUnroll", "i += cols"))
    assert "its step is not a constant" in _refusal("block_per_row", kernel)


@pytest.mark.parametrize("value", ["(int)threadIdx.y + 4", "scale(cols)"])
def test_a_leading_statement_that_differs_by_thread_or_calls_leaves_no_candidate(
    value: str,
) -> None:
    kernel = _variant(SOFTMAX, "const int kUnroll = 4;", f"const int kUnroll = {value};")
    assert block_per_row.candidates(kernel) == []


def test_a_leading_local_of_parameters_is_read_and_its_unrolled_step_refused() -> None:
    # the same for every thread, so the row index may follow it; as the unroll factor it is
    # no constant, which the unrolled form needs
    kernel = _variant(SOFTMAX, "const int kUnroll = 4;", "const int kUnroll = cols / 64;")
    assert "its step is not a constant" in _refusal("block_per_row", kernel)
