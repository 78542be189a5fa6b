"""A minimal reader of 64-bit little-endian ELF files: sections, symbols, relocations.

Enough to fingerprint what nvcc leaves behind: the device cubin (code of each kernel) and the
host object (code and data of the translation unit's host side). No tool is needed, so the
fingerprints cost a few milliseconds per build whatever is installed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

__all__ = ["Elf", "ElfError", "Relocation", "Section", "Symbol"]

SHT_SYMTAB = 2
SHT_RELA = 4
SHT_NOBITS = 8
SHT_REL = 9
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
STT_FUNC = 2
STT_SECTION = 3


class ElfError(ValueError):
    """The file is not a 64-bit little-endian ELF this reader understands."""


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    size: int
    link: int
    info: int
    data: bytes  # empty for NOBITS sections


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    size: int
    type: int
    other: int
    section: int


@dataclass(frozen=True)
class Relocation:
    offset: int
    type: int
    symbol: str  # the symbol's name, or its section's name for a section symbol
    addend: int


@dataclass
class Elf:
    sections: list[Section] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)

    @classmethod
    def parse(cls, data: bytes) -> Elf:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ElfError("not a 64-bit little-endian ELF file")
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx][4], raw[shstrndx][5]
        strtab = data[names[0] : names[0] + names[1]]
        elf = cls()
        for index, (name, kind, flags, _addr, offset, size, link, info, _al, _es) in enumerate(raw):
            body = b"" if kind == SHT_NOBITS else data[offset : offset + size]
            elf.sections.append(
                Section(index, _cstr(strtab, name), kind, flags, size, link, info, body)
            )
        symtab = next((s for s in elf.sections if s.type == SHT_SYMTAB), None)
        if symtab is not None:
            strings = elf.sections[symtab.link].data
            for at in range(0, len(symtab.data) - 23, 24):
                name, info, other, shndx, value, size = struct.unpack_from(
                    "<IBBHQQ", symtab.data, at
                )
                elf.symbols.append(
                    Symbol(_cstr(strings, name), value, size, info & 0xF, other, shndx)
                )
        return elf

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def relocations(self, target: Section) -> list[Relocation]:
        """The relocations applied to `target`, symbols by name."""
        found = []
        for rel in self.sections:
            if rel.type not in (SHT_RELA, SHT_REL) or rel.info != target.index:
                continue
            size = 24 if rel.type == SHT_RELA else 16
            for at in range(0, len(rel.data) - size + 1, size):
                offset, info = struct.unpack_from("<QQ", rel.data, at)
                addend = struct.unpack_from("<q", rel.data, at + 16)[0] if size == 24 else 0
                found.append(
                    Relocation(offset, info & 0xFFFFFFFF, self._symbol(info >> 32), addend)
                )
        return found

    def _symbol(self, index: int) -> str:
        if not 0 <= index < len(self.symbols):
            return ""
        symbol = self.symbols[index]
        if symbol.type == STT_SECTION and 0 <= symbol.section < len(self.sections):
            return self.sections[symbol.section].name
        return symbol.name


def _cstr(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")
