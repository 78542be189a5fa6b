"""Tensor-core MMA (``mma.sync``, ``wmma::mma_sync``, ``wgmma.mma_async``) vs scalar FMA.

One ``mma.sync.aligned.m16n8k16`` multiplies a 16x16 by a 16x8 tile across a warp in one
instruction, at many times the throughput of the FMA pipes.

- detect: inline-PTX ``mma.sync`` statements (any shape), ``wgmma.mma_async`` statements and
  ``wmma::mma_sync`` calls;
- remove: the canonical form, one ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.
  {bf16,f16}.f32`` statement (usually the body of a single helper such as
  ``mma_m16n8k16(float (&d)[4], a0..a3, b0, b1)``), becomes a scalar emulation with the
  same fragment semantics: each lane gathers the A row pairs and B column pairs its four
  outputs need with ``__shfl_sync`` and accumulates in fp32. Slow, and correct. Other shapes
  and types, ``wmma`` and ``wgmma`` are refused with a reason;
- apply: puts the instruction back where this mechanism emulated it (see
  :mod:`klineage.mechanisms._ptx_stash`); and on a staged tile product of 16-bit operands
  (``T x T`` threads, ``acc += SA[ty][kk] * SB[kk][tx]`` over tiles of widened f16 or bf16
  values, what smem_staging writes on a half GEMM) re-tiles it for ``mma.sync`` m16n8k16:
  128-row block tiles, 64 x 32 warp tiles, 16-bit shared tiles (see
  :mod:`klineage.mechanisms._mma_tile`). Other scalar dot products are refused with a reason.

Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"):
lane = 4 * g + t (g = groupID, t = threadID_in_group). A (16x16, row-major, four .b32
registers of two 16-bit elements, the lower k in the low half): register 0 holds row g,
k 2t and 2t+1; register 1 row g+8, same k; register 2 row g, k 2t+8 and 2t+9; register 3
row g+8, those k. B (16x8, column-major, two registers): register 0 holds column g, k 2t
and 2t+1; register 1 column g, k 2t+8 and 2t+9. C and D (16x8 fp32, four registers): rows
g (0, 1) and g+8 (2, 3), columns 2t and 2t+1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from klineage.conditions import ArchAtLeast, BlockSizeMultiple, Condition, Prose
from klineage.cuda.analysis.ptx import PtxInstruction
from klineage.cuda.edit import Edit
from klineage.cuda.source import Loop, ParsedSource
from klineage.cuda.tree import NotInForm
from klineage.kernel import KernelSource
from klineage.mechanisms._mma_tile import mma_tile_edits, mma_tile_of
from klineage.mechanisms._ptx_stash import PtxEmulation, Unsupported
from klineage.mechanisms._register_tile import register_tile_of, tile_products
from klineage.mechanisms._tiles_util import (
    FULL_MASK,
    LANE,
    AsmOperand,
    AsmStatement,
    block_threads,
    register_list,
    split_operands,
)
from klineage.mechanisms.base import Carrier, Site, register
from klineage.problem import Problem

MMA_TILE = "mma_tile"
"""The candidate form of a staged tile product of 16-bit operands."""
_CANONICAL = re.compile(
    r"^mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(bf16|f16)\.(bf16|f16)\.f32$"
)
_SHAPE = re.compile(r"\.m(\d+)n(\d+)k(\d+)\.")
_WMMA = ("wmma::mma_sync", "nvcuda::wmma::mma_sync")
_HALF_HEADERS = (b"cuda_fp16.h", b"cuda_bf16.h", b"mma.h", b"cuda_fp16.hpp")

# Low and high 16-bit halves of a .b32 register as float.
_UNPACK = {
    "bf16": ("__uint_as_float(({x}) << 16)", "__uint_as_float(({x}) & 0xffff0000u)"),
    "f16": (
        "__half2float(__ushort_as_half((unsigned short)(({x}) & 0xffffu)))",
        "__half2float(__ushort_as_half((unsigned short)(({x}) >> 16)))",
    ),
}


def _min_arch(mnemonic: str) -> int:
    """The oldest architecture with this mma.sync shape and type (PTX ISA target notes)."""
    shape = _SHAPE.search(mnemonic + ".")
    if shape is None:
        return 80
    m, n, k = (int(v) for v in shape.groups())
    if (m, n, k) == (8, 8, 4):
        return 70
    if (m, n, k) == (16, 8, 8) and ".f16" in mnemonic and ".bf16" not in mnemonic:
        return 75
    if (m, n, k) == (8, 8, 16) and (".s8" in mnemonic or ".u8" in mnemonic):
        return 75
    return 80


def _fragments(statement: AsmStatement) -> tuple[str, list[list[AsmOperand]]]:
    """The element type and the D, A, B, C operand lists of a canonical mma.sync."""
    instructions = statement.instructions
    if len(instructions) != 1:
        raise Unsupported("the asm statement holds more than one instruction")
    mnemonic, parts = split_operands(instructions[0])
    match = _CANONICAL.match(mnemonic)
    if match is None:
        raise Unsupported(
            f"{mnemonic} is not m16n8k16.row.col with bf16/f16 inputs and fp32 accumulation, "
            "the form the scalar emulation covers"
        )
    if match.group(1) != match.group(2):
        raise Unsupported("A and B have different element types")
    if len(parts) != 4:
        raise Unsupported("expected four register lists {D}, {A}, {B}, {C}")
    groups: list[list[AsmOperand]] = []
    for part, size in zip(parts, (4, 4, 2, 4), strict=True):
        tokens = register_list(part)
        if tokens is None or len(tokens) != size:
            raise Unsupported(f"operand {part!r} is not a list of {size} registers")
        operands = [statement.operand(t) for t in tokens]
        if None in operands:
            raise Unsupported(f"operand {part!r} names registers that are not %N operands")
        groups.append([o for o in operands if o is not None])
    d, a, b, c = groups
    if not all(o.output and o.constraint.lstrip("=+&") == "f" for o in d):
        raise Unsupported("D must be four float outputs ('=f' or '+f')")
    if not all(not o.output and o.constraint == "r" for o in a + b):
        raise Unsupported("A and B must be 32-bit register inputs ('r')")
    if not all(
        o.constraint.lstrip("=+&") == "f" and (not o.output or "+" in o.constraint) for o in c
    ):
        raise Unsupported("C must be float inputs or the read-write D registers")
    return match.group(1), groups


def _scalar_fma(loop: Loop) -> bool:
    """Whether a loop's body is one multiply-accumulate ``acc += a * b;``."""
    body = loop.body
    if body is not None and body.type == "compound_statement":
        inner = [c for c in body.named_children if c.type != "comment"]
        body = inner[0] if len(inner) == 1 else None
    if body is None or body.type != "expression_statement" or not body.named_children:
        return False
    assignment = body.named_children[0]
    operator = assignment.child_by_field_name("operator")
    value = assignment.child_by_field_name("right")
    product = None if value is None else value.child_by_field_name("operator")
    return (
        assignment.type == "assignment_expression"
        and operator is not None
        and operator.type == "+="
        and product is not None
        and product.type == "*"
    )


def _unpacked(dtype: str) -> list[str]:
    """Lines turning the four gathered registers into the floats they hold."""
    lo, hi = _UNPACK[dtype]
    pairs = (
        ("x", "kl_a_lo", "A row g"),
        ("y", "kl_a_hi", "A row g + 8"),
        ("p", "kl_b_0", "B column 2t"),
        ("q", "kl_b_1", "B column 2t + 1"),
    )
    return [
        f"const float kl_{v}0 = {lo.format(x=reg)}, kl_{v}1 = {hi.format(x=reg)};  // {what}"
        for v, reg, what in pairs
    ]


@register
class TensorCoreMma(PtxEmulation):
    name = "tensor_core_mma"
    category = "compute"
    signature = ("HMMA", "HGMMA")
    family = "tensor-core MMA vs scalar FMA"
    intent = (
        "Multiply whole tiles with one warp-wide tensor-core instruction (mma.sync) instead "
        "of one fused multiply-add per thread and element."
    )

    def matches_instruction(self, instruction: PtxInstruction) -> bool:
        return instruction.family in ("mma", "wgmma")

    def matches(self, statement: AsmStatement) -> bool:
        return any("mma.sync" in i or "wgmma.mma_async" in i for i in statement.instructions)

    def extra_sites(self, source: ParsedSource) -> Iterator[Site]:
        for call in source.calls_named(*_WMMA):
            yield self.site(
                source,
                call.node,
                detail={"instruction": "wmma::mma_sync"},
                refusal="wmma fragments have an opaque, architecture-defined layout, so no "
                "scalar emulation can address their elements",
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        """Emulations this mechanism wrote (restorable), staged tile products of 16-bit
        operands (:mod:`klineage.mechanisms._mma_tile`), and other scalar dot-product loops
        (``acc += a * b``), where tensor cores would go but only a re-tiling puts them."""
        yield from super().find_candidates(source)
        staged: set[int] = set()
        for function, loop, tile in tile_products(source):
            if isinstance(tile, NotInForm):
                continue  # not a tile product this rule knows: the scalar loop below says so
            staged.add(tile.inner.start_byte)
            refusal = None
            try:
                mma_tile_of(source, tile)
            except NotInForm as why:
                refusal = str(why)
            yield self.site(
                source,
                loop,
                snippet=source.header(loop),
                detail={"kernel": function.name, "form": MMA_TILE},
                refusal=refusal,
            )
        for loop in source.loops:
            function = source.enclosing_function(loop.node)
            if function is None or not function.runs_on_device or not _scalar_fma(loop):
                continue
            if loop.node.start_byte in staged:
                continue
            yield self.site(
                source,
                loop.node,
                snippet=source.header(loop.node),
                refusal="introducing tensor cores re-tiles the loop into warp-wide m16n8k16 "
                "fragments, which only a person or an LLM does",
            )

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") != MMA_TILE:
            return super().application(source, site, carrier)
        loop = self.node_at(source, site, "for_statement")
        function = source.enclosing_function(loop)
        assert function is not None
        return mma_tile_edits(source, mma_tile_of(source, register_tile_of(source, function, loop)))

    def removal_refusal(self, source: ParsedSource, statement: AsmStatement) -> str | None:
        # a file-level need: checked here on the whole file, not in `emulation`, which the
        # restore check also runs on the remembered statement parsed alone
        dtype, _ = _fragments(statement)
        if dtype == "f16" and not any(h in source.data for h in _HALF_HEADERS):
            return "the f16 emulation needs cuda_fp16.h, which the file lacks"
        return None

    def emulation(self, source: ParsedSource, statement: AsmStatement) -> list[str]:
        if any("wgmma" in i for i in statement.instructions):
            raise Unsupported(
                "wgmma reads its operands from shared-memory descriptors and runs "
                "asynchronously across a warpgroup; no scalar form of it is written here"
            )
        dtype, (d, a, b, c) = _fragments(statement)

        def texts(group: list[AsmOperand]) -> str:
            return ", ".join(source.text_of(o.expr) for o in group)

        lines = [
            "// m16n8k16 on the FMA pipes (PTX ISA fragment layout): lane 4 * g + t holds A",
            "// rows g, g + 8 at k 2t, 2t + 1 (regs 0, 1) and 2t + 8, 2t + 9 (regs 2, 3), B",
            "// column g at those k (regs 0, 1), C and D rows g, g + 8 at columns 2t, 2t + 1.",
            f"const unsigned kl_a[4] = {{{texts(a)}}};",
            f"const unsigned kl_b[2] = {{{texts(b)}}};",
            f"float kl_d[4] = {{{texts(c)}}};",
            f"const int kl_lane = {LANE};",
            "const int kl_g = kl_lane >> 2;",
            "const int kl_t = kl_lane & 3;",
            "#pragma unroll",
            "for (int kl_s = 0; kl_s < 4; ++kl_s) {  // lane 4 * g + kl_s holds k 2 * kl_s, +1",
            "#pragma unroll",
            "  for (int kl_h = 0; kl_h < 2; ++kl_h) {  // k 0..7, then k 8..15",
            f"    const unsigned kl_a_lo = __shfl_sync({FULL_MASK}, kl_a[2 * kl_h], "
            "4 * kl_g + kl_s);",
            f"    const unsigned kl_a_hi = __shfl_sync({FULL_MASK}, kl_a[2 * kl_h + 1], "
            "4 * kl_g + kl_s);",
            f"    const unsigned kl_b_0 = __shfl_sync({FULL_MASK}, kl_b[kl_h], 8 * kl_t + kl_s);",
            f"    const unsigned kl_b_1 = __shfl_sync({FULL_MASK}, kl_b[kl_h], "
            "8 * kl_t + 4 + kl_s);",
            *("    " + line for line in _unpacked(dtype)),
            "    kl_d[0] += kl_x0 * kl_p0 + kl_x1 * kl_p1;",
            "    kl_d[1] += kl_x0 * kl_q0 + kl_x1 * kl_q1;",
            "    kl_d[2] += kl_y0 * kl_p0 + kl_y1 * kl_p1;",
            "    kl_d[3] += kl_y0 * kl_q0 + kl_y1 * kl_q1;",
            "  }",
            "}",
        ]
        lines += [f"{source.text_of(o.expr)} = kl_d[{i}];" for i, o in enumerate(d)]
        return lines

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        instruction = str(site.detail.get("instruction", ""))
        source = kernel.parsed
        block = None
        if site.function in {k.name for k in source.kernels}:
            block = block_threads(source, site.function)
        found: list[Condition] = []
        if "wgmma" in instruction:
            found.append(ArchAtLeast(sm=90, specific=True, why="wgmma exists only on sm_90a"))
        elif "wmma" in instruction:
            found.append(ArchAtLeast(sm=70, why="wmma needs tensor cores (bf16 needs sm_80)"))
        else:
            arch = _min_arch(instruction or "mma.sync.aligned.m16n8k16")
            found.append(ArchAtLeast(sm=arch, why=f"{instruction or 'mma.sync'} needs sm_{arch}"))
        found.append(
            BlockSizeMultiple(
                k=32,
                block_size=block,
                why="the instruction is warp-wide: every lane of a full warp takes part",
            )
        )
        found.append(
            Prose(
                text="the reduction extent is consumed in whole k16 steps: K must be a "
                "multiple of 16 or the last step zero-filled",
                why="one m16n8k16 consumes 16 values of k at a time",
            )
        )
        return found
