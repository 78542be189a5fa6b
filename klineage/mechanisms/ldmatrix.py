"""``ldmatrix`` vs per-thread shared-memory loads that build the same MMA fragments.

``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` loads four 8x8 matrices of 16-bit elements
from shared memory in one warp-wide instruction and hands every lane the register layout
``mma.sync`` wants, instead of each lane issuing its own small loads.

- detect: every inline-PTX ``ldmatrix`` statement;
- remove: the canonical ``ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared[::cta].b16
  {r...}, [%addr];`` (usually the body of one helper ``ldmatrix_x4(uint32_t (&r)[4],
  uint32_t addr)``) becomes the loads it stands for. PTX ISA ("Warp-level matrix load
  instruction: ldmatrix"): lanes 8i..8i+7 give the row addresses of matrix i; without
  ``.trans`` lane l receives the 32-bit word l % 4 of row l / 4 of each matrix; with
  ``.trans`` it receives the 16-bit elements at column l / 4 of rows 2(l % 4) and
  2(l % 4) + 1 (the lower row in the low half). Each lane fetches the row address it needs
  from its owner with ``__shfl_sync`` and loads through ``__cvta_shared_to_generic``;
- apply: only puts the instruction back where this mechanism emulated it.
"""

from __future__ import annotations

from klineage.conditions import ArchAtLeast, BlockSizeMultiple, Condition
from klineage.cuda.analysis.ptx import PtxInstruction
from klineage.cuda.source import ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms._ptx_stash import PtxEmulation, Unsupported
from klineage.mechanisms._tiles_util import (
    FULL_MASK,
    LANE,
    AsmOperand,
    AsmStatement,
    block_threads,
    register_list,
    split_operands,
)
from klineage.mechanisms.base import Site, register
from klineage.problem import Problem

_REQUIRED = frozenset({"sync", "aligned", "m8n8", "b16"})
_COUNTS = {"x1": 1, "x2": 2, "x4": 4}


def _canonical(mnemonic: str) -> tuple[int, bool] | None:
    """``(count, transposed)`` of ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared[::cta].b16``
    with its qualifiers in any order (``.x4.m8n8`` as public macros write it); None for any
    other form."""
    parts = mnemonic.split(".")
    if parts[0] != "ldmatrix":
        return None
    qualifiers = parts[1:]
    counts = [q for q in qualifiers if q in _COUNTS]
    spaces = [q for q in qualifiers if q in ("shared", "shared::cta")]
    rest = set(qualifiers) - _REQUIRED - set(_COUNTS) - {"trans", "shared", "shared::cta"}
    if len(counts) != 1 or len(spaces) != 1 or rest or not set(qualifiers) >= _REQUIRED:
        return None
    if len(qualifiers) != len(set(qualifiers)):
        return None
    return _COUNTS[counts[0]], "trans" in qualifiers


def _operands(statement: AsmStatement) -> tuple[int, bool, list[AsmOperand], AsmOperand]:
    """Matrix count, transposed or not, the destination registers and the address."""
    instructions = statement.instructions
    if len(instructions) != 1:
        raise Unsupported("the asm statement holds more than one instruction")
    mnemonic, parts = split_operands(instructions[0])
    canonical = _canonical(mnemonic)
    if canonical is None:
        raise Unsupported(
            f"{mnemonic} is not ldmatrix.sync.aligned.m8n8.x1/x2/x4[.trans].shared.b16, the "
            "form the emulation covers"
        )
    count, transposed = canonical
    if len(parts) != 2:
        raise Unsupported("expected a register list and one address")
    tokens = register_list(parts[0])
    if tokens is None or len(tokens) != count:
        raise Unsupported(f"{parts[0]!r} is not a list of {count} registers")
    registers = [statement.operand(t) for t in tokens]
    if None in registers or not all(
        r is not None and r.output and r.constraint == "=r" for r in registers
    ):
        raise Unsupported("the destinations must be 32-bit register outputs ('=r')")
    address_text = parts[1].strip()
    if not (address_text.startswith("[") and address_text.endswith("]")):
        raise Unsupported(f"the address {address_text!r} is not [%N]")
    address = statement.operand(address_text[1:-1])
    if address is None or address.output or address.constraint not in ("r", "l"):
        raise Unsupported(
            f"the address {address_text!r} is not a plain register operand (an offset or "
            "an immediate is not handled)"
        )
    return count, transposed, [r for r in registers if r is not None], address


def _load(ctype: str, address: str) -> str:
    return f"*static_cast<const {ctype}*>(__cvta_shared_to_generic({address}))"


@register
class Ldmatrix(PtxEmulation):
    name = "ldmatrix"
    category = "memory"
    signature = ("LDSM",)
    family = "tensor-core MMA vs scalar FMA"
    intent = (
        "Load the 8x8 sub-matrices of an MMA operand from shared memory with one warp-wide "
        "instruction that hands every lane its fragment registers."
    )

    def matches_instruction(self, instruction: PtxInstruction) -> bool:
        return instruction.family == "ldmatrix"

    def matches(self, statement: AsmStatement) -> bool:
        return any(i.startswith("ldmatrix") for i in statement.instructions)

    def emulation(self, source: ParsedSource, statement: AsmStatement) -> list[str]:
        count, trans, registers, address = _operands(statement)
        lines = [
            f"const unsigned kl_addr = (unsigned)({source.text_of(address.expr)});",
            f"const int kl_lane = {LANE};",
            f"unsigned kl_r[{count}];",
            "#pragma unroll",
            f"for (int kl_i = 0; kl_i < {count}; ++kl_i) {{",
        ]
        if trans:
            lines = [
                "// ldmatrix .trans as shared loads: lane l gets, of matrix i, the 16-bit",
                "// elements at column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1, whose",
                "// addresses lanes 8 i + 2 (l % 4) and 8 i + 2 (l % 4) + 1 hold.",
                *lines,
                f"  const unsigned kl_row0 = __shfl_sync({FULL_MASK}, kl_addr, "
                "8 * kl_i + 2 * (kl_lane & 3));",
                f"  const unsigned kl_row1 = __shfl_sync({FULL_MASK}, kl_addr, "
                "8 * kl_i + 2 * (kl_lane & 3) + 1);",
                "  const unsigned kl_lo = "
                + _load("unsigned short", "kl_row0 + 2u * (kl_lane >> 2)")
                + ";",
                "  const unsigned kl_hi = "
                + _load("unsigned short", "kl_row1 + 2u * (kl_lane >> 2)")
                + ";",
                "  kl_r[kl_i] = kl_lo | (kl_hi << 16);",
            ]
        else:
            lines = [
                "// ldmatrix as shared loads: lane l gets, of matrix i, the 32-bit word l % 4",
                "// of row l / 4, whose address lane 8 i + l / 4 holds.",
                *lines,
                f"  const unsigned kl_row = __shfl_sync({FULL_MASK}, kl_addr, "
                "8 * kl_i + (kl_lane >> 2));",
                "  kl_r[kl_i] = " + _load("unsigned", "kl_row + 4u * (kl_lane & 3)") + ";",
            ]
        lines.append("}")
        lines += [f"{source.text_of(r.expr)} = kl_r[{i}];" for i, r in enumerate(registers)]
        return lines

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        block = None
        if site.function in {k.name for k in source.kernels}:
            block = block_threads(source, site.function)
        return [
            ArchAtLeast(sm=75, why="ldmatrix needs sm_75"),
            BlockSizeMultiple(
                k=32,
                block_size=block,
                why="ldmatrix is warp-wide: every lane of a full warp gives a row address",
            ),
        ]
