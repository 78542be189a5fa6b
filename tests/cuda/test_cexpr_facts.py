"""C++ expression helpers (precedence, folding) and launch facts."""

from __future__ import annotations

import pytest

from klineage.conditions import evaluate_size
from klineage.cuda.cexpr import (
    PRIMARY,
    fold_int,
    precedence,
    required_precedence,
    to_size_expr,
    wrap_at,
)
from klineage.cuda.facts import (
    block_size_of,
    block_size_parameter,
    eval_context,
    shared_memory_of,
    static_shared_bytes,
)
from klineage.cuda.source import Node, ParsedSource
from klineage.kernel import KernelSource
from tests.conftest import REPO


def _expression(text: str) -> tuple[ParsedSource, Node]:
    source = KernelSource(f"constexpr int kFour = 4;\nint value = {text};\n").parsed
    declarator = source.nodes("init_declarator")[-1]
    value = declarator.child_by_field_name("value")
    assert value is not None
    return source, value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("256", 256),
        ("0x100u", 256),
        ("1'024", 1024),
        ("kFour * 32", 128),
        ("(kFour + 4) / 3", 2),
        ("1 << kFour", 16),
        ("(int)sizeof(float4) * 2", 32),
        ("kFour > 2 ? 64 : 32", 64),
        ("min(kFour, 2)", 2),
        ("dim3(32, 8)", 256),
        ("cols * 2", None),
        ("1.5f", None),
    ],
)
def test_fold_int(text: str, value: int | None) -> None:
    source, node = _expression(text)
    assert fold_int(source, node) == value


def test_size_expression_keeps_axis_names() -> None:
    source, node = _expression("(cols + kFour - 1) / kFour")
    expr = to_size_expr(source, node, {"kFour": 4, "cols": "cols"})
    assert expr is not None and evaluate_size(expr, {"cols": 10}) == 3


def test_precedence_and_wrapping() -> None:
    _source, node = _expression("a * f(b)")
    call = node.child_by_field_name("right")
    assert precedence(node) == 13 and precedence(call) == PRIMARY
    assert required_precedence(call) == 14  # the right operand of `*`
    assert wrap_at(call, "x / y", 13) == "(x / y)"
    assert wrap_at(call, "g(x)", PRIMARY) == "g(x)"
    assert wrap_at(node, "x / y", 13) == "x / y"  # an initializer takes anything but a comma


FACTS = """\
#include <cuda_runtime.h>
#include <stdint.h>
constexpr int kThreads = 128;
template <int kBlock>
__global__ void tiles(const float* x, float* y) {
  __shared__ float tile[kBlock][4 + 1];
  __shared__ int flags[8];
  extern __shared__ float dynamic[];
  y[threadIdx.x] = x[threadIdx.x] + tile[0][0] + flags[0] + dynamic[0];
}
__global__ void flat(float* y, int64_t n) { y[0] = 0; }
extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  const int threads = kThreads * 2;
  tiles<32><<<rows, threads, cols * sizeof(float), s>>>(x, y);
  flat<<<rows, (unsigned)min(cols, (int64_t)1024), 0, s>>>(y, cols);
  return 0;
}
"""


def test_launch_facts_are_size_expressions_over_axes() -> None:
    kernel = KernelSource(FACTS)
    source = kernel.parsed
    assert block_size_of(source, "tiles") == "256"
    flat_block = block_size_of(source, "flat")
    assert flat_block is not None
    assert evaluate_size(flat_block, {"cols": 100}) == 100
    assert evaluate_size(flat_block, {"cols": 5000}) == 1024
    tiles = source.function("tiles")
    assert tiles is not None
    assert static_shared_bytes(source, tiles) is None  # kBlock unknown without a launch
    assert static_shared_bytes(source, tiles, {"kBlock": 32}) == 32 * 5 * 4 + 8 * 4
    usage = shared_memory_of(source, "tiles")
    assert usage is not None and evaluate_size(usage, {"cols": 10}) == 672 + 40
    context = eval_context(kernel, "tiles", arch="sm_80")
    assert context.arch == "sm_80" and context.block_size == "256"


def test_expert_softmax_facts() -> None:
    kernel = KernelSource.from_file(REPO / "expert_kernels" / "softmax" / "kernel.cu")
    context = eval_context(kernel)
    assert kernel.parsed.errors == ()
    assert context.block_size is None or evaluate_size(context.block_size, {}) is not None


TEMPLATE_CHAIN = """
template <int kD> __device__ int pitch(int row) { return row * (kD * 2); }
template <int kD, int kRows> __global__ void k(int* y) { y[0] = pitch<kD>(kRows); }
template <int kD> void launch(int* y) { k<kD, kD / 2><<<1, 32>>>(y); }
constexpr int kWide = 256;
extern "C" int run(int* y, int n) {
  if (n > 64) launch<kWide>(y); else launch<64>(y);
  return 0;
}
"""


def test_template_values_follow_instantiations_out_through_enclosing_templates() -> None:
    from klineage.cuda.facts import template_values

    source = KernelSource(TEMPLATE_CHAIN).parsed
    assert template_values(source, "pitch") == [{"kD": 256}, {"kD": 64}]
    assert template_values(source, "k") == [{"kD": 256, "kRows": 128}, {"kD": 64, "kRows": 32}]
    assert template_values(source, "run") == [{}]  # not a template
    runtime = KernelSource(TEMPLATE_CHAIN.replace("launch<64>(y)", "launch<n>(y)")).parsed
    assert template_values(runtime, "pitch") is None  # one instantiation is not constant
    unused = KernelSource("template <int kD> __device__ int f() { return kD; }").parsed
    assert template_values(unused, "f") is None


def test_template_values_fold_an_enclosing_templates_constexpr_locals_per_binding() -> None:
    from klineage.cuda.facts import template_values

    source = KernelSource(
        "#define WARP 32\n"
        "template <int kWidth> __device__ float fold(float v) { return v * kWidth; }\n"
        "template <int kThreads> __global__ void k(float* y) {\n"
        "  constexpr int kWarps = (kThreads + WARP - 1) / WARP;\n"
        "  y[0] = fold<WARP>(y[0]) + fold<kWarps>(y[1]);\n}\n"
        'extern "C" int run(float* y) { k<256><<<1, 256>>>(y); k<64><<<1, 64>>>(y); return 0; }\n'
    ).parsed
    assert template_values(source, "fold") == [{"kWidth": 32}, {"kWidth": 8}, {"kWidth": 2}]


_COUNTED = """
template <int BM, int BK, int THREADS>
__global__ void __launch_bounds__(THREADS) tiled(const float *a, float *b) {
  constexpr int ROWS{BM / 2};
  constexpr int LANES = BM / 2;
  b[threadIdx.x] = a[threadIdx.x];
}

extern "C" int run(const float *a, float *b, cudaStream_t stream) {
  const uint kThreads = 128;
  constexpr unsigned int kRows{128U};
  dim3 block(kThreads);
  tiled<kRows, 8, kThreads><<<1, block, 0, stream>>>(a, b);
  return 0;
}
"""


@pytest.mark.parametrize(
    ("change", "found"),
    [
        # BM and THREADS both equal the 128 threads: the launch bounds' name is taken
        ((), "THREADS"),
        ((("__launch_bounds__(THREADS) ", ""),), "BM"),
        # a constexpr local of the body (braced or not) counts too
        ((("tiled<kRows, 8, kThreads>", "tiled<256, 8, 64>"),), "ROWS"),
        # another launch, of 256 threads: THREADS holds both, BM only the first
        (
            (("  return 0;", "  tiled<128, 8, 256><<<1, 256, 0, stream>>>(a, b);\n  return 0;"),),
            "THREADS",
        ),
        (
            (("  return 0;", "  tiled<128, 8, 128><<<1, 256, 0, stream>>>(a, b);\n  return 0;"),),
            None,
        ),
        # a block size the launch does not fold
        ((("dim3 block(kThreads);", "dim3 block(n);"),), None),
    ],
)
def test_block_size_parameter_names_the_block_thread_count(
    change: tuple[tuple[str, str], ...], found: str | None
) -> None:
    text = _COUNTED
    for old, new in change:
        assert old in text
        text = text.replace(old, new)
    source = KernelSource(text).parsed
    kernel = source.function("tiled")
    assert kernel is not None
    assert block_size_parameter(source, kernel) == found


def test_a_local_declared_after_the_given_byte_is_no_count() -> None:
    text = _COUNTED.replace("tiled<kRows, 8, kThreads>", "tiled<256, 8, 64>")
    source = KernelSource(text).parsed
    kernel = source.function("tiled")
    assert kernel is not None
    assert block_size_parameter(source, kernel, before=text.index("  constexpr int LANES")) == (
        "ROWS"
    )
    assert block_size_parameter(source, kernel, before=text.index("  constexpr int ROWS")) is None


TYPED_TEMPLATE = """
template <typename T, int kTile, int kWidth>
__global__ void k(T* y) {
  constexpr int kRepeats{kTile / kWidth};
  constexpr unsigned int kHalf = kRepeats / 2;
  int runtime = threadIdx.x;
  y[runtime] = T(kHalf);
}
extern "C" int run(float* y) {
  constexpr int kTile{64};
  k<float, kTile, 8><<<1, 32>>>(y);
  return 0;
}
"""


def test_compile_time_bindings_skip_type_parameters_and_fold_constexpr_locals() -> None:
    from klineage.cuda.facts import compile_time_bindings, template_values

    source = KernelSource(TYPED_TEMPLATE).parsed
    assert template_values(source, "k") is None  # a type argument is not an integer
    assert template_values(source, "k", skip_types=True) == [{"kTile": 64, "kWidth": 8}]
    kernel = source.function("k")
    assert kernel is not None
    assert compile_time_bindings(source, kernel) == [
        {"kTile": 64, "kWidth": 8, "kRepeats": 8, "kHalf": 4}
    ]
    only_types = KernelSource("template <typename T> void fill(T* y) { y[0] = T(1); }").parsed
    assert template_values(only_types, "fill") is None  # never instantiated here
    assert template_values(only_types, "fill", skip_types=True) == [{}]  # nothing to bind
    unlaunched = KernelSource(TYPED_TEMPLATE.replace("k<float, kTile, 8><<<1, 32>>>(y);", ""))
    function = unlaunched.parsed.function("k")
    assert function is not None and compile_time_bindings(unlaunched.parsed, function) is None
