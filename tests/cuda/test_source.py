"""The tree-sitter source model: queries, masking, byte-range edits, speed."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klineage.cuda.edit import Edit, EditError, apply_edits
from klineage.cuda.source import mask_source
from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all
from tests.conftest import REPO
from tests.mechanisms.large_kernel import thousand_line_blocks, thousand_line_kernel
from tests.mechanisms.roundtrip import FIXTURES

SAMPLE = """\
// Sample kernel — with a non-ASCII comment (é, 中文) so byte and character offsets differ.
#include <cuda_runtime.h>
#include <stdint.h>

constexpr int kThreads = 256;
#define kVecWidth 4

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int kBlock, typename T>
__global__ void __launch_bounds__(kBlock) reduce_rows(const T* __restrict__ x, T* y,
                                                      int64_t cols) {
  __shared__ float partial[kBlock / 32];
  extern __shared__ float dynamic[];
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kBlock) s += (float)x[blockIdx.x * cols + c];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
  __syncthreads();
  while (false) {}
  if (threadIdx.x == 0) y[blockIdx.x] = (T)partial[0];
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  reduce_rows<kThreads, float><<<(unsigned)rows, kThreads, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
"""


@pytest.fixture
def sample() -> KernelSource:
    return KernelSource(SAMPLE, name="sample.cu")


def test_functions_qualifiers_templates_and_params(sample: KernelSource) -> None:
    src = sample.parsed
    assert [f.name for f in src.functions] == ["warp_sum", "reduce_rows", "run"]
    warp_sum, reduce_rows, run = src.functions
    assert warp_sum.qualifiers == ("__device__", "__forceinline__") and warp_sum.device_only
    assert reduce_rows.is_kernel and reduce_rows.template_params == ("kBlock", "T")
    assert reduce_rows.outer.type == "template_declaration"
    assert src.text_of(reduce_rows.launch_bounds) == "__launch_bounds__(kBlock)"
    x, y, cols = reduce_rows.params
    assert (x.name, x.type, x.is_const, x.pointer_depth, len(x.restrict)) == (
        "x",
        "const T*",
        True,
        1,
        1,
    )
    assert (y.type, y.restrict, cols.is_pointer) == ("T*", (), False)
    assert run.extern_c and run.outer.type == "linkage_specification" and not run.runs_on_device
    assert src.kernels == (reduce_rows,)


def test_extern_c_block_and_reference_array_params() -> None:
    src = KernelSource(
        'extern "C" {\nint run(float* x) { return 0; }\n}\n'
        "template <int N> __device__ void f(const float4 (&v)[N], float& r) {}\n"
    ).parsed
    run, f = src.functions
    assert run.extern_c and not f.extern_c
    v, r = f.params
    assert (v.name, v.type, v.is_const, v.pointer_depth) == ("v", "const float4 (&)[N]", True, 0)
    assert (r.name, r.pointer_depth) == ("r", 0)


def test_loops_declarations_calls_launches_pragmas(sample: KernelSource) -> None:
    src = sample.parsed
    assert [(loop.kind, loop.variable) for loop in src.loops] == [
        ("for", "offset"),
        ("for", "c"),
        ("while", None),
    ]
    shared = src.shared_declarations
    assert [(d.names, d.is_extern) for d in shared] == [(("partial",), False), (("dynamic",), True)]
    assert [c.name for c in src.calls_named("warp_sum", "__syncthreads")] == [
        "warp_sum",
        "__syncthreads",
    ]
    (launch,) = src.launches
    assert launch.kernel == "reduce_rows"
    assert [src.text_of(a) for a in launch.template_args] == ["kThreads", "float"]
    assert [src.text_of(c) for c in launch.config] == ["(unsigned)rows", "kThreads", "0", "stream"]
    assert src.text_of(launch.block) == "kThreads" and src.text_of(launch.stream) == "stream"
    (pragma,) = src.pragmas
    assert (pragma.name, pragma.argument, pragma.target.type) == ("unroll", "", "for_statement")
    assert src.pragma_before(src.loops[0].node, "unroll") == pragma
    assert src.integer_constants == {"kThreads": 256, "kVecWidth": 4}


def test_defines_with_trailing_comments_and_parentheses_are_constants() -> None:
    text = (
        "#define LANES 32   // threads in a warp\n"
        "#define PER_THREAD 4 /* elements */\n"
        "#define ALIAS (LANES)\n"
        "constexpr int kTile = LANES * PER_THREAD;\n"
    )
    constants = KernelSource(text).parsed.integer_constants
    assert constants == {"LANES": 32, "PER_THREAD": 4, "ALIAS": 32, "kTile": 128}


def test_defines_under_a_cuda_arch_test_take_the_device_pass_value() -> None:
    # a block count picked per architecture, and a width chosen through #elif; a condition
    # on anything else counts as taken, as before
    text = (
        "#if __CUDA_ARCH__ == 800 || __CUDA_ARCH__ >= 900\n"
        "#define BLOCKS_PER_SM 2\n"
        "#else\n"
        "#define BLOCKS_PER_SM 1\n"
        "#endif\n"
        "#if __CUDA_ARCH__ < 700\n"
        "#define WIDTH 8\n"
        "#elif __CUDA_ARCH__ < 950\n"
        "#define WIDTH 16\n"
        "#else\n"
        "#define WIDTH 32\n"
        "#endif\n"
        "#ifdef EXTRA\n"
        "#define EXTRA_ROWS 3\n"
        "#endif\n"
    )
    constants = KernelSource(text).parsed.integer_constants
    assert constants == {"BLOCKS_PER_SM": 2, "WIDTH": 16, "EXTRA_ROWS": 3}


def test_positions_are_bytes_and_lines(sample: KernelSource) -> None:
    src = sample.parsed
    assert len(src.data) > len(SAMPLE)  # the comment holds multi-byte characters
    call = src.calls_named("__syncthreads")[0]
    assert src.text_of(call.node) == "__syncthreads()"
    assert src.line_range(call.node) == (23, 23)
    assert src.enclosing_function(call.node).name == "reduce_rows"
    assert src.enclosing_function(0) is None
    kernel = src.function("reduce_rows")
    assert src.line_range(kernel.outer) == (14, 26)
    assert src.snippet(kernel.node, limit=30).endswith("...")
    assert src.local_types(kernel)["partial"] == "__shared__ float[]"


def test_parsed_is_cached_and_import_is_lazy(sample: KernelSource) -> None:
    assert sample.parsed is sample.parsed
    code = "import sys, klineage; print('tree_sitter' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# Masking: constructs tree-sitter-cuda 0.21 cannot parse
# ---------------------------------------------------------------------------------------------

TROUBLE = {
    "__align__ on shared": "__global__ void f() { __shared__ __align__(16) float s[128]; }\n",
    "__align__ on a struct": "struct __align__(16) Pack { float a[4]; };\n",
    "extern shared aligned": (
        "__global__ void f() { extern __shared__ __align__(16) unsigned char smem[]; }\n"
    ),
    "launch bounds, 3 args": "__global__ void __launch_bounds__(256, 1, 1) f(float* x) {}\n",
    "maxnreg": "__global__ void __maxnreg__(64) f(float* x) {}\n",
    "_Pragma": (
        '__global__ void f(float* x) { _Pragma("unroll") for (int i = 0; i < 4; i++) x[i] = 0; }\n'
    ),
    "#if in arguments": "void f() {\n  g(a,\n#if USE_B\n    b,\n#endif\n    c);\n}\n",
    "extended lambda": (
        "__global__ void f(float* y) { auto sq = [] __device__ (float v) { return v * v; }; }\n"
    ),
}


@pytest.mark.parametrize("case", sorted(TROUBLE))
def test_masking_makes_known_trouble_parse(case: str) -> None:
    text = TROUBLE[case]
    masked, masks = mask_source(text.encode())
    assert masks and len(masked) == len(text.encode())
    assert masked.count(b"\n") == text.count("\n")
    parsed = KernelSource(text).parsed
    assert parsed.errors == (), case


def test_masked_kernel_keeps_its_mechanisms() -> None:
    text = "__global__ void __launch_bounds__(256, 1, 1) f(float* __restrict__ x) {}\n"
    parsed = KernelSource(text).parsed
    (kernel,) = parsed.kernels
    # the launch_bounds node survives; only the cluster argument was blanked
    assert parsed.text_of(kernel.launch_bounds).startswith("__launch_bounds__(256, 1")
    assert len(kernel.params[0].restrict) == 1


def test_comment_with_unbalanced_attribute_is_not_swallowed() -> None:
    text = "// __align__( oops\n__global__ void f(float* x) { x[0] = 1.0f; }\n"
    parsed = KernelSource(text).parsed
    assert parsed.masks == () and parsed.errors == () and parsed.kernels


UNPARSABLE = """\
#define LB __launch_bounds__(256)
__global__ void LB f(float* x) { x[0] = 1.0f; }
__global__ void g(float* y) { y[0] = 2.0f; }
"""


def test_edits_touching_an_unparsed_region_are_refused() -> None:
    parsed = KernelSource(UNPARSABLE, name="macro.cu").parsed
    assert parsed.errors and parsed.errors[0].line == 2
    error = parsed.errors[0]
    with pytest.raises(EditError, match=r"macro\.cu:2: the edit touches a region"):
        apply_edits(parsed, [Edit(error.start_byte, error.end_byte, "")])
    # elsewhere in the same file, edits still work
    start = UNPARSABLE.index("2.0f")
    result = apply_edits(parsed, [Edit(start, start + 4, "3.0f")])
    assert "y[0] = 3.0f" in result.text


# ---------------------------------------------------------------------------------------------
# Edits
# ---------------------------------------------------------------------------------------------


def _byte(text: str, needle: str) -> int:
    return len(text[: text.index(needle)].encode())


def test_edits_apply_in_any_order(sample: KernelSource) -> None:
    a = _byte(SAMPLE, "s = warp_sum(s)")
    b = _byte(SAMPLE, "__syncthreads()")
    edits = [
        Edit(a, a + 1, "acc"),
        Edit.insert(b, "/* barrier */ "),
        Edit(b + len("__syncthreads"), b + len("__syncthreads()"), "()"),
    ]
    one = apply_edits(sample, edits)
    two = apply_edits(sample, list(reversed(edits)))
    assert one == two and "acc = warp_sum(s)" in one.text
    assert "/* barrier */ __syncthreads()" in one.text
    assert apply_edits(sample, [*edits, edits[0]]) == one  # an exact duplicate counts once
    assert apply_edits(sample, []) is sample


def test_overlapping_edits_are_refused_with_the_line(sample: KernelSource) -> None:
    b = _byte(SAMPLE, "__syncthreads()")
    with pytest.raises(EditError, match=r"sample.cu:23: overlapping edits"):
        apply_edits(sample, [Edit(b, b + 5, "x"), Edit(b + 3, b + 8, "y")])
    with pytest.raises(EditError, match="two insertions at the same place"):
        apply_edits(sample, [Edit.insert(b, "a "), Edit.insert(b, "b ")])
    with pytest.raises(EditError, match="past the end"):
        apply_edits(sample, [Edit(0, 10**6, "")])
    with pytest.raises(ValueError, match="bad edit range"):
        Edit(5, 3, "")


def test_an_edit_that_breaks_the_syntax_is_refused_with_the_line(sample: KernelSource) -> None:
    b = _byte(SAMPLE, "__syncthreads();")
    with pytest.raises(EditError, match=r"sample.cu:23: the edited kernel has"):
        apply_edits(sample, [Edit(b, b + len("__syncthreads();"), "__syncthreads(;")])
    # without the check the broken text comes back (for tools that want it)
    broken = apply_edits(sample, [Edit(b, b + 16, "__syncthreads(;")], check=False)
    assert broken.parsed.errors


def test_an_edit_splitting_a_character_is_refused(sample: KernelSource) -> None:
    e_acute = _byte(SAMPLE, "é")
    with pytest.raises(EditError, match="multi-byte"):
        apply_edits(sample, [Edit(e_acute, e_acute + 1, "")])


def test_layout_helpers(sample: KernelSource) -> None:
    src = sample.parsed
    (pragma,) = src.pragmas
    line_gone = apply_edits(src, [src.deletion(pragma.node, whole_line=True)])
    assert "#pragma" not in line_gone.text
    assert line_gone.text.count("\n") == SAMPLE.count("\n") - 1
    loop = src.loops[1].node
    with_pragma = apply_edits(src, [src.line_insertion(loop, "#pragma unroll 4")])
    assert "  #pragma unroll 4\n  for (int64_t c" in with_pragma.text


# ---------------------------------------------------------------------------------------------
# Property tests of the edit layer
# ---------------------------------------------------------------------------------------------

EDIT_TEXTS = [SAMPLE, (FIXTURES / "fast_math" / "before.cu").read_text()]


def _reference_splice(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply character-offset splices from the end of the text: the obvious implementation."""
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


@st.composite
def _splices(draw: st.DrawFn) -> tuple[str, list[tuple[int, int, str]], int]:
    text = draw(st.sampled_from(EDIT_TEXTS))
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), min_size=2, max_size=12)))
    edits = []
    for start, end in zip(cuts[::2], cuts[1::2], strict=False):
        if draw(st.booleans()):
            end = start  # an insertion
        edits.append((start, end, draw(st.text("abc _;{}()\n/*é", max_size=6))))
    # equal insertion points would have no defined order: keep one
    seen: set[int] = set()
    kept = [e for e in edits if not (e[0] == e[1] and (e[0] in seen or seen.add(e[0])))]
    return text, kept, draw(st.integers(0, 2**32))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_splices())
def test_any_non_overlapping_splices_apply_in_any_order(
    case: tuple[str, list[tuple[int, int, str]], int],
) -> None:
    text, splices, seed = case
    kernel = KernelSource(text)

    def to_bytes(i: int) -> int:
        return len(text[:i].encode())

    edits = [Edit(to_bytes(s), to_bytes(e), new) for s, e, new in splices]
    shuffled = list(edits)
    random.Random(seed).shuffle(shuffled)
    one = apply_edits(kernel, edits, check=False)
    two = apply_edits(kernel, shuffled, check=False)
    assert one == two
    assert one.text == _reference_splice(text, splices)


@st.composite
def _safe_splices(draw: st.DrawFn) -> tuple[str, list[tuple[int, int, str]], int]:
    """Renames of identifiers and comments between tokens: never a syntax error."""
    text = draw(st.sampled_from(EDIT_TEXTS))
    parsed = KernelSource(text).parsed
    names = parsed.nodes("identifier")
    chosen = draw(st.lists(st.sampled_from(names), max_size=10, unique_by=lambda n: n.start_byte))
    edits: list[tuple[int, int, str]] = []
    for node in chosen:
        if draw(st.booleans()):
            new = "v_" + draw(st.text("abcxyz0129_", min_size=1, max_size=6))
            edits.append((node.start_byte, node.end_byte, new))
        else:
            edits.append((node.start_byte, node.start_byte, "/* é */ "))
    return text, edits, draw(st.integers(0, 2**32))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_safe_splices())
def test_safe_splices_reparse_cleanly_in_any_order(
    case: tuple[str, list[tuple[int, int, str]], int],
) -> None:
    text, splices, seed = case
    kernel = KernelSource(text)
    edits = [Edit(s, e, new) for s, e, new in splices]
    shuffled = list(edits)
    random.Random(seed).shuffle(shuffled)
    one = apply_edits(kernel, edits)  # checked: must re-parse without new errors
    assert one == apply_edits(kernel, shuffled)
    assert one.parsed.errors == ()
    assert len(one.parsed.functions) == len(kernel.parsed.functions)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, len(SAMPLE.encode()) - 2), st.integers(1, 40), st.integers(0, 39))
def test_overlapping_splices_are_always_refused(start: int, length: int, shift: int) -> None:
    end = min(start + length, len(SAMPLE.encode()))
    inner = min(start + shift % max(1, end - start), end - 1)
    with pytest.raises(EditError, match=r"overlapping|same place"):
        apply_edits(KernelSource(SAMPLE), [Edit(start, end, "x"), Edit(inner, end, "y")])


# ---------------------------------------------------------------------------------------------
# Size (how fast this runs is bench/source_speed.py's job: a timed test fails on a busy machine)
# ---------------------------------------------------------------------------------------------


def test_parse_and_detect_everything_on_1000_lines() -> None:
    """The work the benchmark times: 1,000 lines parse cleanly, and every mechanism one of
    its blocks has on its own is found in the whole."""
    text = thousand_line_kernel()
    assert text.count("\n") >= 1000
    kernel = KernelSource(text)
    assert not kernel.parsed.errors
    sites = detect_all(kernel)
    assert len(sites) > 50
    blocks = thousand_line_blocks()
    alone = {s.mechanism for block in blocks for s in detect_all(KernelSource(block))}
    assert {s.mechanism for s in sites} == alone


VARIANTS = REPO / "tests" / "fixtures" / "cuda" / "namespaced_variants.cu"


def test_a_kernel_s_launches_are_those_its_namespace_resolves_to() -> None:
    # a launch-size dispatch keeps a kernel of the same name in each variant's namespace: a
    # rule that edits one kernel's launches must not edit the other's
    source = KernelSource.from_file(VARIANTS).parsed
    narrow, wide = source.kernels
    assert source.namespace_of(narrow.node) == "narrow"
    blocks = {
        k.name + "@" + source.namespace_of(k.node): [
            source.text_of(launch.block) for launch in source.launches_of(k) if launch.block
        ]
        for k in (narrow, wide)
    }
    assert blocks == {"scale@narrow": ["256"], "scale@wide": ["512", "512"]}
    assert len(source.launches_of("scale")) == 3  # by name alone: every kernel so named


ALIASED = """
namespace gemm {
template <int kTile, int kStages> __global__ void body(float* y) { y[0] = kTile * kStages; }
}
extern "C" int run(float* y, cudaStream_t stream) {
  using namespace gemm;
  constexpr int STAGES = 3;
  auto* kernel = body<128, STAGES>;
  kernel<<<1, 32, 0, stream>>>(y);
  auto same = &body<64, 2>;
  same<<<1, 32, 0, stream>>>(y);
  return 0;
}
"""


def test_a_launch_through_a_local_pointer_is_a_launch_of_its_kernel() -> None:
    # `auto* k = kernel<...>; k<<<...>>>`: the pointer's kernel and template arguments, found
    # through `using namespace` too
    from klineage.cuda.facts import template_values

    source = KernelSource(ALIASED).parsed
    (kernel,) = source.kernels
    launches = source.launches_of(kernel)
    assert [(la.kernel, [source.text_of(a) for a in la.template_args]) for la in launches] == [
        ("body", ["128", "STAGES"]),
        ("body", ["64", "2"]),
    ]
    # the launching function's constants fold into the bindings
    assert template_values(source, "body") == [
        {"kTile": 128, "kStages": 3},
        {"kTile": 64, "kStages": 2},
    ]
    repointed = KernelSource(ALIASED.replace("  same<<<", "  same = &body<32, 1>;\n  same<<<"))
    assert [la.kernel for la in repointed.parsed.launches] == ["body", "same"]
