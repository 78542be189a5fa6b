"""Macros read as the preprocessor writes them (klineage.cuda.macros), the file-scope
binding lines the parser is spared (mask_source), and kernel instantiations that only macros
write (template_values through ParsedSource.macro_expanded)."""

from __future__ import annotations

from klineage.cuda.facts import template_values
from klineage.cuda.macros import expand_macros
from klineage.cuda.source import mask_source
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

DISPATCH = (PUBLIC_FORMS / "warp_shuffle_reduction" / "macro_dispatch.before.cu").read_text(
    encoding="utf-8"
)


def _solid(text: str | None) -> str:
    assert text is not None
    return " ".join(text.split())


def test_object_and_function_macros_expand_with_stringify_and_paste() -> None:
    text = (
        "#define WIDTH 4\n"
        "#define NAME(kind) scale_##kind##_kernel\n"
        "#define SHOW(x) #x\n"
        "#define LAUNCH(kind, n) NAME(kind)<(n) * WIDTH><<<g, b>>>(SHOW(kind))\n"
        "LAUNCH(f16, 32);\n"
    )
    assert _solid(expand_macros(text)) == 'scale_f16_kernel<(32) * 4><<<g, b>>>("f16");'


def test_a_pasted_argument_is_not_expanded_first() -> None:
    text = "#define f32 float\n#define K(t) k_##t(t)\nK(f32);\n"
    assert _solid(expand_macros(text)) == "k_f32(float);"


def test_variadic_arguments_and_continued_lines() -> None:
    text = "#define CALL(f, ...) \\\n  f(__VA_ARGS__)\nCALL(launch, a, (b, c), d);\n"
    assert _solid(expand_macros(text)) == "launch(a, (b, c), d);"


def test_undef_earlier_texts_and_names_without_arguments() -> None:
    header = "#define TILE 16\n#define SQUARE(x) ((x) * (x))\n"
    text = (
        "#undef TILE\n#define TILE 32\n"
        "int a = TILE; int b = SQUARE(TILE); int (*f)(int) = SQUARE;\n"
    )
    expanded = _solid(expand_macros(text, [header]))
    assert expanded == "int a = 32; int b = ((32) * (32)); int (*f)(int) = SQUARE;"


def test_a_macro_that_names_itself_stops() -> None:
    text = "#define grow(x) grow(x + 1)\n#define loop loop\nint v = grow(1) + loop;\n"
    assert _solid(expand_macros(text)) == "int v = grow(1 + 1) + loop;"


def test_a_text_without_defines_has_no_expansion() -> None:
    assert expand_macros("#include <cuda_runtime.h>\nint main() { return 0; }\n") is None


def test_file_scope_binding_lines_are_masked_and_the_file_parses() -> None:
    masked, masks = mask_source(DISPATCH.encode())
    assert [m.what for m in masks] == ["statement macro at file scope"]
    assert masked[masks[0].start_byte : masks[0].end_byte].strip() == b""
    assert DISPATCH[masks[0].start_byte : masks[0].end_byte] == "BIND_GROUP_TOTALS(f32, float)"
    parsed = KernelSource(DISPATCH).parsed
    assert not [e for e in parsed.errors if not e.missing]
    # the same line, its macro not defined in the file: left to the parser, which errs there
    unmasked = KernelSource(DISPATCH.replace("#define BIND_GROUP_TOTALS", "#define BIND_OTHER"))
    assert [e.line for e in unmasked.parsed.errors] == [
        DISPATCH[: masks[0].start_byte].count("\n") + 1
    ]


def test_invocations_with_a_semicolon_or_a_body_are_left_to_the_parser() -> None:
    text = (
        "#define DECLARE(n) __global__ void n(float* y)\n"
        "#define ZERO(n) n = 0\n"
        "DECLARE(fill)\n{\n  y[0] = 1.0f;\n}\n"
        "int v;\nZERO(v);\n"
    )
    assert mask_source(text.encode())[1] == ()


def test_instantiations_written_only_by_macros_are_read_from_the_expansion() -> None:
    source = KernelSource(DISPATCH).parsed
    assert source.launches_of("group_totals_f32_kernel") == []
    bindings = template_values(source, "group_totals_f32_kernel")
    assert bindings == [{"NUM_THREADS": 64}, {"NUM_THREADS": 128}, {"NUM_THREADS": 256}]
    lanes = template_values(source, "lane_fold_sum")
    assert lanes is not None
    assert sorted({b["kWarpSize"] for b in lanes}) == [2, 4, 8, 32]


def test_a_macro_instantiation_past_the_warp_is_refused_by_its_offsets() -> None:
    """A dispatch case of 2048 threads folds 64 warp totals: the helper's butterfly would
    start at offset 32, which the exchange cannot write; read from the macro, the site says
    so instead of passing."""
    mechanism = get("warp_shuffle_reduction")
    (site,) = mechanism.detect(KernelSource(DISPATCH))
    assert site.supported
    wide = DISPATCH.replace("LAUNCH_GROUP_TOTALS(128, kind)", "LAUNCH_GROUP_TOTALS(2048, kind)")
    (site,) = mechanism.detect(KernelSource(wide))
    assert site.refusal == "the loop reaches offset 32, outside 0..31"


def test_a_template_nothing_instantiates_binds_nothing() -> None:
    """A block helper no kernel calls is never compiled: its call of the warp helper does not
    make the warp helper's lane count unknown."""
    unused = (
        "template <const int NUM_THREADS = 256>\n"
        "__device__ float unused_block_sum(float val) {\n"
        "  return lane_fold_sum<NUM_THREADS / WARP_SIZE>(val);\n"
        "}\n\n"
    )
    text = DISPATCH.replace(
        "template <const int NUM_THREADS = 256>\n__global__",
        unused + "template <const int NUM_THREADS = 256>\n__global__",
    )
    assert "unused_block_sum" in text
    lanes = template_values(KernelSource(text).parsed, "lane_fold_sum")
    assert lanes is not None and sorted({b["kWarpSize"] for b in lanes}) == [2, 4, 8, 32]
    used = text + "__global__ void other(float* y) { y[0] = unused_block_sum<64>(y[0]); }\n"
    lanes = template_values(KernelSource(used).parsed, "lane_fold_sum")
    assert lanes is not None and sorted({b["kWarpSize"] for b in lanes}) == [2, 4, 8, 32]
    wide = text + "__global__ void other(float* y) { y[0] = unused_block_sum<4096>(y[0]); }\n"
    lanes = template_values(KernelSource(wide).parsed, "lane_fold_sum")
    assert lanes is not None and 128 in {b["kWarpSize"] for b in lanes}


HELPER = """#define WARP_SIZE 32
template <const int kWarpSize = WARP_SIZE>
__device__ float fold(float v) {
  for (int m = kWarpSize >> 1; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffff, v, m);
  return v;
}
"""


def test_a_constant_argument_needs_none_of_the_callers_instantiations() -> None:
    """`fold<WARP_SIZE>` in a kernel templated on a tile config (a type, which bindings do
    not fold) binds 32; where the caller's own parameter is called WARP_SIZE,
    the argument is that parameter, bound by the caller's instantiations."""
    caller = (
        "template <typename Config, int kRows>\n"
        "__global__ void rows(float* y) { y[threadIdx.x] = fold<{arg}>(y[threadIdx.x]); }\n"
        "void go(float* y) { rows<float, 4><<<1, 32>>>(y); }\n"
    )
    source = KernelSource(HELPER + caller.replace("{arg}", "WARP_SIZE")).parsed
    assert template_values(source, "rows") is None
    assert template_values(source, "fold") == [{"kWarpSize": 32}]
    # a file constant the caller's own parameter shadows: the argument is the parameter (4)
    constant = HELPER.replace("#define WARP_SIZE 32", "constexpr int WARP_SIZE = 32;")
    shadowed = caller.replace("int kRows", "int WARP_SIZE").replace("{arg}", "WARP_SIZE")
    source = KernelSource(constant + shadowed).parsed
    assert template_values(source, "fold", skip_types=True) == [{"kWarpSize": 4}]
    assert template_values(source, "fold") is None  # the config type does not fold


def test_a_helper_nothing_instantiates_says_so() -> None:
    (site,) = get("warp_shuffle_reduction").detect(KernelSource(HELPER))
    assert site.refusal == (
        "the loop's offsets cannot be worked out statically: nothing in the file instantiates fold"
    )


def test_an_explicitly_instantiated_launcher_binds_its_launches() -> None:
    """A host launcher templated on the element type, compiled by explicit instantiations
    (``template void launch<float>(...);``) and called nowhere in the file, is instantiated:
    the tile sizes its launch binds reach the kernel's helper."""
    text = (
        "template <typename T, int TILE>\n"
        "__device__ void tile_sum(const T* x, T* acc) { for (int i = 0; i < TILE; ++i) "
        "*acc += x[i]; }\n"
        "template <typename T, int TILE>\n"
        "__global__ void tiles(const T* x, T* y) { tile_sum<T, TILE>(x, y); }\n"
        "template <typename T>\n"
        "void launch(const T* x, T* y) {\n"
        "  constexpr int kTile{8};\n"
        "  tiles<T, kTile><<<1, 32>>>(x, y);\n"
        "}\n"
        "template void launch<float>(const float* x, float* y);\n"
    )
    source = KernelSource(text).parsed
    assert template_values(source, "tile_sum", skip_types=True) == [{"TILE": 8}]
    alone = text.replace("template void launch<float>(const float* x, float* y);\n", "")
    assert template_values(KernelSource(alone).parsed, "tile_sum", skip_types=True) is None
