"""block_per_row and warp_per_row applied to a thread per row that folds its row into an
online (max, sum of exp) pair: in its own loop (a naive online softmax), or in a
``__device__`` helper (llm.c's classifier after its block rows were removed), the helper's
row loops spread, its folds combined over the group; and the forms they refuse."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.mechanisms._online_pair_form import FoldFormError, block_folds
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

HELPER_ONLINE = PUBLIC_FORMS / "block_per_row" / "helper_online.cu"
HELPER_ONLINE_UP = PUBLIC_FORMS / "block_per_row" / "helper_online_up.cu"
ONLINE_ROWS = PUBLIC_FORMS / "block_per_row" / "online_rows.cu"


def _folds(body: str, tracked: set[str]) -> list[tuple[str, tuple[str, ...], str]]:
    text = f"__device__ void f(float x, float m, float s, float a) {{\n{body}\n}}\n"
    source = KernelSource(text).parsed
    function = source.function("f")
    assert function is not None and function.body is not None
    return [(f.kind, f.names, f.exponential) for f in block_folds(source, function.body, tracked)]


@pytest.mark.parametrize(
    "body",
    [
        # llm.c: the old maximum in a local, the rescale and the new term in two statements
        "float old = m; m = fmaxf(m, x); s *= expf(old - m); s += expf(x - m);",
        # the new maximum in a local, one statement for the sum, either order of its terms
        "float n = fmaxf(m, x); s = s * expf(m - n) + expf(x - n); m = n;",
        "float n = fmaxf(x, m); s = expf(x - n) + expf(m - n) * s; m = n;",
    ],
)
def test_an_online_pair_is_read_from_what_its_statements_compute(body: str) -> None:
    assert _folds(body, {"m", "s"}) == [("pair", ("m", "s"), "expf")]


@pytest.mark.parametrize(
    ("body", "kind"),
    [("a += x * x;", "sum"), ("a = x + a;", "sum"), ("a = fmaxf(x, a);", "max")],
)
def test_plain_folds_are_read_too(body: str, kind: str) -> None:
    assert _folds(body, {"a"}) == [(kind, ("a",), "expf")]


@pytest.mark.parametrize(
    "body",
    [
        # the rescale's exponent the wrong way round: not sum(exp(x - m))
        "float old = m; m = fmaxf(m, x); s *= expf(m - old); s += expf(x - m);",
        # the new term against the old maximum
        "float old = m; m = fmaxf(m, x); s *= expf(old - m); s += expf(x - old);",
        # a sum scaled by a constant
        "s = s * 2.0f + x;",
    ],
)
def test_other_updates_are_no_fold(body: str) -> None:
    with pytest.raises(FoldFormError):
        _folds(body, {"m", "s"})


@pytest.mark.parametrize(
    ("name", "start", "step", "combine"),
    [
        (
            "block_per_row",
            "int i = (cols + kGroup - 1) / kGroup - 1 - threadIdx.x;",
            "i -= blockDim.x",
            "const float block_max = block_reduce_max(running_max);",
        ),
        (
            "warp_per_row",
            "int i = (cols + kGroup - 1) / kGroup - 1 - (threadIdx.x & 31);",
            "i -= 32",
            "const float warp_max = warp_reduce_max(running_max);",
        ),
    ],
)
def test_a_helper_walking_its_row_down_is_spread_and_its_pair_combined(
    name: str, start: str, step: str, combine: str
) -> None:
    kernel = KernelSource.from_file(HELPER_ONLINE)
    (candidate,) = get(name).candidates(kernel)
    assert candidate.supported, candidate.refusal
    applied = get(name).apply(kernel, candidate).text
    assert start in applied
    assert applied.count(step) == 2  # the while's step and the for's
    assert "while ((i + 1) * kGroup > cols)" in applied
    assert combine in applied
    # the combine follows the last row loop, before the helper returns the pair
    assert applied.index(combine) < applied.index("return RowStats{running_max, running_sum};")
    # the row's statistic is stored by one thread of the group
    assert "if (" in applied.split("RowStats stats = running_stats(idx, inp, cols);")[1]
    # the reductions are defined before the helper that calls them
    assert applied.index(f"float {name.split('_')[0]}_reduce_sum(") < applied.index(
        "__device__ RowStats running_stats("
    )


def test_a_helper_folding_its_row_forward_is_spread_and_the_kernel_loop_too() -> None:
    kernel = KernelSource.from_file(HELPER_ONLINE_UP)
    (candidate,) = get("block_per_row").candidates(kernel)
    applied = get("block_per_row").apply(kernel, candidate).text
    assert "for (int c = threadIdx.x; c < n; c += blockDim.x) {" in applied
    assert "for (int c = threadIdx.x; c < cols; c += blockDim.x) {" in applied
    # a thread that saw no element keeps (-inf, 0), whose share is 0
    assert "s = block_reduce_sum(m == block_max ? s : s * __expf(m - block_max));" in applied
    assert "int row = blockIdx.x;" in applied


@pytest.mark.parametrize(
    ("path", "old", "new", "reason"),
    [
        (  # the helper writes memory every thread of a group would repeat
            HELPER_ONLINE_UP,
            "const float value = x[c];",
            "const float value = x[c]; ((float*)x)[c] = 0.0f;",
            "writes ((float*)x)[c]",
        ),
        (  # a sum from one: each thread of a group would add its one
            HELPER_ONLINE_UP,
            "float s = 0.0f;",
            "float s = 1.0f;",
            "does not start from a zero literal",
        ),
        (  # a condition that holds on no top run of i: a thread's stride skips its end
            HELPER_ONLINE,
            "while ((i + 1) * kGroup > cols)",
            "while (i % 2 == 1)",
            "on a top run of i",
        ),
        (  # the pair used outside its loops before the group combines it
            HELPER_ONLINE_UP,
            "  for (int c = 0; c < n; ++c) {",
            "  if (m > 0.0f) s = 0.0f;\n  for (int c = 0; c < n; ++c) {",
            "before the group combines it",
        ),
        (  # a statement between the walk's two loops breaks the walk down
            HELPER_ONLINE,
            "  // whole groups, no checks",
            "  if (running_sum > 1e30f) running_sum = 1e30f;",
            "starts a walk down the row",
        ),
        (  # a second value carried from element to element
            HELPER_ONLINE_UP,
            "m = next;",
            "m = next; last = value;",
            "last",
        ),
        (  # the helper reads the row the kernel overwrites: a fast thread's store would
            # reach a slow thread's read
            HELPER_ONLINE_UP,
            "max_and_total(inp + (int64_t)row * cols, cols)",
            "max_and_total(out + (int64_t)row * cols, cols)",
            "reads out",
        ),
        (  # the row leaves its loop early
            HELPER_ONLINE_UP,
            "const float value = x[c];",
            "const float value = x[c]; if (value > 1e30f) break;",
            "leaves the row loop",
        ),
    ],
)
def test_helpers_outside_the_forms_are_refused(path, old: str, new: str, reason: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text
    text = text.replace(old, new)
    if "last = value" in new:
        text = text.replace("float s = 0.0f;", "float s = 0.0f;\n  float last = 0.0f;")
    (candidate,) = get("block_per_row").candidates(KernelSource(text))
    assert reason in str(candidate.refusal), candidate.refusal


def test_a_helper_calling_a_function_that_writes_memory_is_refused() -> None:
    # every thread of the group would repeat the callee's store
    text = HELPER_ONLINE_UP.read_text(encoding="utf-8")
    text = text.replace(
        "__device__ float2 max_and_total(",
        "__device__ void note(float* p, float v) { p[0] = v; }\n\n__device__ float2 max_and_total(",
    ).replace("  return make_float2(m, s);", "  note((float*)x, m);\n  return make_float2(m, s);")
    (candidate,) = get("block_per_row").candidates(KernelSource(text))
    assert "max_and_total calls note: note writes p[0]" in str(candidate.refusal)


def test_a_helper_with_another_caller_is_refused() -> None:
    text = HELPER_ONLINE_UP.read_text(encoding="utf-8") + (
        "\n__global__ void row_totals(const float* inp, float* out, int cols) {\n"
        "  out[0] = max_and_total(inp, cols).y;\n}\n"
    )
    candidates = get("block_per_row").candidates(KernelSource(text))
    (candidate,) = [c for c in candidates if c.function == "softmax_rows"]
    assert "other callers" in str(candidate.refusal), candidate.refusal


@pytest.mark.parametrize(
    ("name", "loop", "combine"),
    [
        (
            "block_per_row",
            "for (int c = threadIdx.x; c < cols; c += blockDim.x) {",
            "total = block_reduce_sum(top == block_max ? total : total * expf(top - block_max));",
        ),
        (
            "warp_per_row",
            "for (int c = threadIdx.x & 31; c < cols; c += 32) {",
            "total = warp_reduce_sum(top == warp_max ? total : total * expf(top - warp_max));",
        ),
    ],
)
def test_an_online_pair_in_the_kernels_own_loop_is_combined_after_it(
    name: str, loop: str, combine: str
) -> None:
    kernel = KernelSource.from_file(ONLINE_ROWS)
    (candidate,) = get(name).candidates(kernel)
    assert candidate.supported, candidate.refusal
    applied = get(name).apply(kernel, candidate).text
    assert applied.count(loop) == 2  # the fold and the write-out
    # the pair is the group's before the row is written out from it
    assert applied.index(combine) < applied.index("const float inverse = 1.0f / total;")


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (  # the running maximum stored as it runs: a running value, not a fold
            "    total += expf(v - top);\n",
            "    total += expf(v - top);\n    y[(int64_t)row * cols + c] = top;\n",
            "read as a running pair: the statement at line 20 stores a running value",
        ),
        (  # a sum from one: each thread of a group would add its one
            "float total = 0.0f;",
            "float total = 1.0f;",
            "does not start from a zero literal",
        ),
        (  # the sum rescaled by the wrong exponent: no pair, and no sum either
            "total *= expf(before - top);",
            "total *= expf(top - before);",
            "is not a sum, a max or a min",
        ),
    ],
)
def test_online_pairs_outside_the_form_are_refused(old: str, new: str, reason: str) -> None:
    text = ONLINE_ROWS.read_text(encoding="utf-8")
    assert old in text
    (candidate,) = get("block_per_row").candidates(KernelSource(text.replace(old, new)))
    assert reason in str(candidate.refusal), candidate.refusal


@pytest.mark.nvcc
def test_helper_rows_spread_compile(mechanism_builder: Builder) -> None:
    applied = []
    for path in (HELPER_ONLINE, HELPER_ONLINE_UP, ONLINE_ROWS):
        kernel = KernelSource.from_file(path)
        for name in ("block_per_row", "warp_per_row"):
            mechanism = get(name)
            applied.append(mechanism.apply(kernel, mechanism.candidates(kernel)[0]))
    compile_ok(mechanism_builder, applied)


def test_the_round_trip_carrier_reads_a_block_size_held_in_a_local() -> None:
    # llm.c launches `<<<grid_size, block_size>>>` with `const int block_size = 1024;`: the
    # round trip spreads the rows over that many threads again, not the rule's default
    kernel = KernelSource.from_file(HELPER_ONLINE_UP)
    mechanism = get("block_per_row")
    spread = mechanism.apply(kernel, mechanism.candidates(kernel)[0], Carrier(block_size=512))
    launch = ", 512, 0, stream>>>"
    assert launch in spread.text
    text = spread.text.replace(launch, ", threads, 0, stream>>>").replace(
        "  softmax_rows<<<", "  const int threads = 512;\n  softmax_rows<<<"
    )
    named = KernelSource(text)
    (site,) = mechanism.detect(named)
    assert mechanism.carrier_of(named, site).block_size == 512
