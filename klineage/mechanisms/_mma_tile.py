"""Forward tensor cores on a staged tile product of 16-bit operands: warp-wide ``mma.sync``.

The form taken is the register tile's (:mod:`klineage.mechanisms._register_tile`): a shared-
memory tiled product with ``T x T`` threads, ``acc += SA[ty][kk] * SB[kk][tx]``, one guarded
store of ``f(acc)``. One more demand: each tile value is a 16-bit float widened, ``p0 + t < K ?
__half2float(G) : 0`` (or ``__bfloat162float``), the same type in both tiles. The tiles can
then hold the loaded 16-bit values themselves (``c ? G : 0`` narrowed), and a tensor core forms
exactly the products the scalar loop formed (the product of two 16-bit floats is exact in
fp32); the sums stay fp32, in k order within each instruction.

The rewrite keeps the launch's ``T x T`` threads, ``W = T*T/32`` warps (2, 4 or 8), and gives
the block a ``128 x 16*W`` output tile: warps as ``2 x W/2``, each a ``64 x 32`` warp tile of
``4 x 4`` ``m16n8k16`` tiles accumulated in ``acc[4][4][4]``, laid out as the PTX ISA's C
fragment (lane ``4g + t`` holds rows ``g`` and ``g + 8``, columns ``2t`` and ``2t + 1`` of each
tile). A stage holds a ``128 x 32`` tile of A and a ``32 x BN`` tile of B as 16-bit values,
their rows padded by 8 elements so the eight rows a fragment load reads fall in distinct banks,
filled by all threads in strided loops with the original loads (their zero fill past K and
their clamps, the widening left out); two k steps of 16 read the fragments (A's pairs as 32-bit
words, B's two rows packed) and issue the ``mma.sync`` through a helper, which
``tensor_core_mma`` detects and can remove again. The epilogue stores each of a thread's 64
outputs under the original guard, its coordinates declared anew; every launch's grid divides by
the new tile instead of T.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from klineage.cuda.edit import Edit
from klineage.cuda.source import Node, ParsedSource
from klineage.cuda.tree import NotInForm, statements, strip_parens
from klineage.mechanisms._local_util import names_in_function, splice
from klineage.mechanisms._register_tile import (
    RegisterTile,
    TileWriter,
    launch_edits,
)
from klineage.mechanisms._tiles_util import fresh_name

__all__ = ["MmaTile", "mma_tile_edits", "mma_tile_of"]

WARP_M, WARP_N = 64, 32
"""A warp's tile: 4 x 4 m16n8k16 tiles."""
STAGE_K = 32
"""Columns of A (rows of B) a stage: two k steps of 16."""
PAD = 8
"""16-bit elements added to each shared row: 16 bytes, so a fragment's rows change banks."""

NEEDED = (
    "the register tile's staged product (T x T threads, T*T/32 warps in 2, 4 or 8) whose tile "
    "values are 16-bit floats widened, `p0 + t < K ? __half2float(G) : 0` or "
    "`__bfloat162float`, the same type in both tiles"
)


@dataclass(frozen=True)
class _Type:
    """A 16-bit operand type and how the rewrite writes it."""

    element: str
    """The C++ type: ``__half`` or ``__nv_bfloat16``."""
    ptx: str
    """Its name in the mma.sync mnemonic: ``f16`` or ``bf16``."""
    narrow: str
    """The conversion from float (the zero fill)."""
    bits: str
    """The reinterpretation as 16 bits (packing two into a register)."""


_TYPES = {
    "__half2float": _Type("__half", "f16", "__float2half_rn", "__half_as_ushort"),
    "__bfloat162float": _Type(
        "__nv_bfloat16", "bf16", "__float2bfloat16_rn", "__bfloat16_as_ushort"
    ),
}


@dataclass(frozen=True)
class MmaTile:
    """A staged tile product the tensor-core rewrite takes."""

    tile: RegisterTile
    kind: _Type
    warps_n: int
    """Warps along the block tile's columns (2 along its rows)."""

    @property
    def block_m(self) -> int:
        return 2 * WARP_M

    @property
    def block_n(self) -> int:
        return self.warps_n * WARP_N


def _widened(source: ParsedSource, value: Node) -> str | None:
    """The widening call of a tile value ``cond ? widen(G) : 0``, or None."""
    node = strip_parens(value)
    chosen = (
        node.child_by_field_name("consequence") if node.type == "conditional_expression" else None
    )
    call = strip_parens(chosen) if chosen is not None else None
    if call is None or call.type != "call_expression":
        return None
    callee = call.child_by_field_name("function")
    name = source.text_of(callee) if callee is not None else ""
    return name if name in _TYPES else None


def mma_tile_of(source: ParsedSource, tile: RegisterTile) -> MmaTile:
    """``tile`` as the tensor-core rewrite takes it; NotInForm with the form found otherwise."""
    widened = [_widened(source, value) for value in tile.values]
    if None in widened:
        shown = source.snippet(tile.values[widened.index(None)], 60)
        raise NotInForm(
            f"a tile value {shown!r} that is not a 16-bit float widened (tensor cores would round "
            "fp32 operands)",
            NEEDED,
        )
    if widened[0] != widened[1]:
        raise NotInForm(f"tiles of two types ({widened[0]}, {widened[1]})", NEEDED)
    threads = tile.tile * tile.tile
    warps = threads // 32
    if threads % 32 or warps not in (2, 4, 8):
        raise NotInForm(f"{tile.tile} x {tile.tile} threads, {threads / 32:g} warps", NEEDED)
    assert widened[0] is not None
    return MmaTile(tile, _TYPES[widened[0]], warps // 2)


def _helpers(kind: _Type) -> str:
    """The packing and mma.sync helpers the rewritten kernel calls (defined once a file)."""
    return "\n".join(
        [
            f"// two {kind.ptx} values as one .b32 register, the first in the low half",
            f"__device__ __forceinline__ unsigned klineage_pack_{kind.ptx}x2({kind.element} lo,"
            f" {kind.element} hi) {{",
            f"  return (unsigned){kind.bits}(lo) | ((unsigned){kind.bits}(hi) << 16);",
            "}",
            "",
            f"// d += a * b on the tensor cores: a 16x16 {kind.ptx} tile by a 16x8 one, fp32 "
            "accumulators",
            f"__device__ __forceinline__ void klineage_mma_m16n8k16_{kind.ptx}(float (&d)[4], "
            "const unsigned (&a)[4],",
            "                                                      const unsigned (&b)[2]) {",
            "  asm volatile(",
            f'      "mma.sync.aligned.m16n8k16.row.col.f32.{kind.ptx}.{kind.ptx}.f32 {{%0, %1, '
            '%2, %3}, "',
            '      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\\n"',
            '      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])',
            '      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));',
            "}",
            "",
            "",
        ]
    )


def mma_tile_edits(source: ParsedSource, found: MmaTile) -> list[Edit]:
    """The edits writing ``found``'s kernel on the tensor cores, its launches' grids, and the
    helpers before the kernel (unless the file has them)."""
    tile, kind = found.tile, found.kind
    t, bm, bn, bk = tile.tile, found.block_m, found.block_n, STAGE_K
    mi_n, ni_n = WARP_M // 16, WARP_N // 8
    function = tile.function
    assert function.body is not None
    used = names_in_function(source, function)
    name = {
        key: fresh_name(used, key)
        for key in ("mi", "ni", "r", "ks", "ld", "ld_row", "ld_col", "frag_a", "frag_b", "row0")
    }
    for key in ("linear", "warp_m", "warp_n", "group", "quad", "col0"):
        name[key] = fresh_name(used, key)
    mi, ni, r, ks = name["mi"], name["ni"], name["r"], name["ks"]
    load, row, col = name["ld"], name["ld_row"], name["ld_col"]
    frag_a, frag_b, group, quad = name["frag_a"], name["frag_b"], name["group"], name["quad"]
    writer = TileWriter(source, tile)
    unit = "  "
    tx = tile.aliases.get("x", "threadIdx.x")
    ty = tile.aliases.get("y", "threadIdx.y")
    acc, (tile_a, tile_b) = tile.acc.name, tile.tiles
    linear = name["linear"]
    out = writer.uniform()
    out += [
        f"const int {linear} = {ty} * {t} + {tx};",
        f"const int {name['warp_m']} = {linear} / 32 / {found.warps_n};",
        f"const int {name['warp_n']} = {linear} / 32 % {found.warps_n};",
        f"const int {group} = {linear} % 32 / 4;",
        f"const int {quad} = {linear} % 4;",
        f"float {acc}[{mi_n}][{ni_n}][4];",
        "#pragma unroll",
        f"for (int {mi} = 0; {mi} < {mi_n}; ++{mi}) {{",
        f"{unit}#pragma unroll",
        f"{unit}for (int {ni} = 0; {ni} < {ni_n}; ++{ni}) {{",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {r} = 0; {r} < 4; ++{r}) {acc}[{mi}][{ni}][{r}] = "
        f"{source.text_of(tile.acc.value)};",
        f"{unit}}}",
        "}",
        f"__shared__ __align__(16) {kind.element} {tile_a}[{bm}][{bk} + {PAD}];",
        f"__shared__ __align__(16) {kind.element} {tile_b}[{bk}][{bn} + {PAD}];",
    ]
    k_step = tile.loop.child_by_field_name("update")
    k_body = tile.loop.child_by_field_name("body")
    assert k_step is not None and k_body is not None
    header = splice(
        source, tile.loop.start_byte, k_body.start_byte, [(k_step, f"{tile.k_var} += {bk}")]
    ).rstrip()

    def narrowed(value: Node, rename: Callable[[Node], str]) -> str:
        """``c ? widen(G) : z`` as ``c ? G : narrow(z)``: the 16-bit value itself."""
        node = strip_parens(value)
        condition = node.child_by_field_name("condition")
        call = strip_parens(node.child_by_field_name("consequence") or node)
        zero = node.child_by_field_name("alternative")
        arguments = call.child_by_field_name("arguments")
        (loaded,) = [a for a in arguments.named_children] if arguments is not None else [call]
        assert condition is not None and zero is not None
        return f"{rename(condition)} ? {rename(loaded)} : {kind.narrow}({rename(zero)})"

    loads = writer.tile_loads((load, row, col), linear, (bm, bn, bk), unit, narrowed)
    row0, col0 = name["row0"], name["col0"]
    word = "*reinterpret_cast<const unsigned*>"
    a_at = f"{tile_a}[{row0}{{}}][{ks} + 2 * {quad}{{}}]"
    b_at = f"{tile_b}[{ks} + 2 * {quad}{{}}][{col0}]"
    out += [
        f"{header} {{",
        *loads,
        f"{unit}__syncthreads();",
        f"{unit}#pragma unroll",
        f"{unit}for (int {ks} = 0; {ks} < {bk}; {ks} += 16) {{",
        f"{unit * 2}unsigned {frag_a}[{mi_n}][4];",
        f"{unit * 2}unsigned {frag_b}[{ni_n}][2];",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {mi} = 0; {mi} < {mi_n}; ++{mi}) {{",
        f"{unit * 3}const int {row0} = {name['warp_m']} * {WARP_M} + {mi} * 16 + {group};",
        f"{unit * 3}{frag_a}[{mi}][0] = {word}(&{a_at.format('', '')});",
        f"{unit * 3}{frag_a}[{mi}][1] = {word}(&{a_at.format(' + 8', '')});",
        f"{unit * 3}{frag_a}[{mi}][2] = {word}(&{a_at.format('', ' + 8')});",
        f"{unit * 3}{frag_a}[{mi}][3] = {word}(&{a_at.format(' + 8', ' + 8')});",
        f"{unit * 2}}}",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {ni} = 0; {ni} < {ni_n}; ++{ni}) {{",
        f"{unit * 3}const int {col0} = {name['warp_n']} * {WARP_N} + {ni} * 8 + {group};",
        f"{unit * 3}{frag_b}[{ni}][0] = klineage_pack_{kind.ptx}x2({b_at.format('')}, "
        f"{b_at.format(' + 1')});",
        f"{unit * 3}{frag_b}[{ni}][1] = klineage_pack_{kind.ptx}x2({b_at.format(' + 8')}, "
        f"{b_at.format(' + 9')});",
        f"{unit * 2}}}",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {mi} = 0; {mi} < {mi_n}; ++{mi}) {{",
        f"{unit * 3}#pragma unroll",
        f"{unit * 3}for (int {ni} = 0; {ni} < {ni_n}; ++{ni}) "
        f"klineage_mma_m16n8k16_{kind.ptx}({acc}[{mi}][{ni}], {frag_a}[{mi}], {frag_b}[{ni}]);",
        f"{unit * 2}}}",
        f"{unit}}}",
        f"{unit}__syncthreads();",
        "}",
    ]
    rebind = {
        tile.coords["y"].name: writer.coordinate(
            "y", f"{name['warp_m']} * {WARP_M} + {mi} * 16 + {group} + {r} / 2 * 8", bm
        ),
        tile.coords["x"].name: writer.coordinate(
            "x", f"{name['warp_n']} * {WARP_N} + {ni} * 8 + 2 * {quad} + {r} % 2", bn
        ),
    }
    out += [
        "#pragma unroll",
        f"for (int {mi} = 0; {mi} < {mi_n}; ++{mi}) {{",
        f"{unit}#pragma unroll",
        f"{unit}for (int {ni} = 0; {ni} < {ni_n}; ++{ni}) {{",
        f"{unit * 2}#pragma unroll",
        f"{unit * 2}for (int {r} = 0; {r} < 4; ++{r}) {{",
        *writer.scoped(tile.epilogue, rebind, unit * 3),
        f"{unit * 3}{writer.renamed(tile.epilogue, {acc: f'{acc}[{mi}][{ni}][{r}]'})}",
        f"{unit * 2}}}",
        f"{unit}}}",
        "}",
    ]
    body = statements(function.body)
    indent = source.indent_of(tile.loop.start_byte)
    text = ("\n" + indent).join(line.rstrip() for line in out)
    edits = [Edit(body[0].start_byte, body[-1].end_byte, text)]
    for launch in tile.launches:
        edits += launch_edits(source, launch, tile, bm, bn)
    if f"klineage_mma_m16n8k16_{kind.ptx}(".encode() not in source.data:
        edits.append(Edit(function.node.start_byte, function.node.start_byte, _helpers(kind)))
    return edits
