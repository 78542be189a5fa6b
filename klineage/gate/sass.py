"""Machine code of a build: what the GPU and the host will actually run.

Two things come out of every OK build, from the files nvcc keeps (``-keep``):

- **fingerprints**, read straight from the ELF files by :mod:`klineage.gate.elf` (milliseconds,
  no tool needed): one per device function (its SASS bytes and relocations, its static shared
  memory), one for all device code, and one for the host side (the host object's code and
  data, relocations by symbol name, the embedded device image left out). nvcc names the
  translation unit's anonymous namespace after a hash of the source, so that hash is
  normalized away: a comment added to the source leaves every fingerprint as it was.
- **an instruction histogram** per kernel from ``nvdisasm`` (CUDA toolkit, or the
  ``nvidia-cuda-nvdisasm`` wheel on machines without one): counts of the instructions that
  tell mechanisms apart (global load/store widths, shared accesses, shuffles, barriers,
  tensor-core ops, async copies, special functions, local memory). nvdisasm spends about half
  a CPU second starting up whatever the kernel's size, so it runs once per build entry, on
  demand (:meth:`klineage.gate.build.Builder.disassemble`), and is cached with the build.

Two builds with the same device and host fingerprints run the same machine code: timing one
measures the other, and a source change between them is not an optimization.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from klineage.gate.elf import SHF_ALLOC, SHF_EXECINSTR, SHT_NOBITS, STT_FUNC, Elf, Section
from klineage.gate.ptxas import demangle

__all__ = [
    "FAMILIES",
    "FunctionCode",
    "KernelDelta",
    "MachineCode",
    "Signature",
    "delta",
    "disassemble",
    "feature_counts",
    "find_tool",
    "instantiated_lines",
    "normalized_image",
    "read_device_code",
    "read_machine_code",
    "render_delta",
    "short_name",
    "signature_present",
    "signature_shown",
]

RECIPE = 4
"""Bump when what the fingerprints hash changes: it is part of the build cache's key."""
STO_CUDA_ENTRY = 0x10
"""st_other bit nvcc sets on a __global__ function's symbol."""
MODULE_PLACEHOLDER = "xxxxxxxx"
_MODULE_HASH = re.compile(r"^_([0-9a-f]{8})_")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_LINE = re.compile(r'//## File "(?P<file>[^"]+)", line (?P<line>\d+)')

FAMILIES: tuple[str, ...] = (
    "LDG",
    "STG",
    "LD",
    "ST",
    "LDS",
    "STS",
    "LDSM",
    "STSM",
    "LDGSTS",
    "UTMALDG",
    "UTMASTG",
    "UBLKCP",
    "SHFL",
    "BAR",
    "HMMA",
    "HGMMA",
    "IMMA",
    "MUFU",
    "LDL",
    "STL",
    "ATOM",
    "ATOMG",
    "ATOMS",
    "RED",
    "REDG",
    "VOTE",
)
"""Instruction families the histogram counts (by full mnemonic, modifiers included)."""

Signature = tuple[str, ...]
"""What a mechanism's removal must change, as feature names (see :func:`feature_counts`):
an instruction family (``SHFL``), ``global_width`` (the widths of global loads and stores),
``constant`` (global loads through the read-only path) or ``host`` (the host side)."""


class FunctionCode(BaseModel):
    """One device function of a build (a kernel, or a function ptxas kept out of line)."""

    name: str = Field(description="demangled name, as the ptxas report prints it")
    symbol: str = Field(description="mangled name with the translation unit's hash normalized")
    entry: bool = Field(description="True for a __global__ kernel")
    fingerprint: str = Field(description="sha256 (24 hex) of its SASS bytes and relocations")
    instructions: int = Field(description="SASS instructions (16 bytes each on sm_70+)")
    shared_bytes: int = Field(default=0, description="static shared memory of the kernel")
    histogram: dict[str, int] | None = Field(
        default=None,
        description="counts of the FAMILIES instructions by full mnemonic (e.g. LDG.E.128); "
        "None until disassembled",
    )


class MachineCode(BaseModel):
    """Fingerprints (always) and instruction histograms (once disassembled) of a build."""

    arch: str = Field(description="the SASS target, e.g. sm_90 or sm_90a")
    functions: list[FunctionCode] = Field(
        default_factory=list, description="device functions, kernels first, by name"
    )
    device_fingerprint: str = Field(description="sha256 (24 hex) of every device section")
    host_fingerprint: str = Field(
        description="sha256 (24 hex) of the host object: code, data, relocations by symbol; "
        "the embedded device image and the kernels' own stubs left out; empty for a "
        "device-only build (no host object)"
    )
    host_source_fingerprint: str = Field(
        default="",
        description="sha256 (24 hex) of the host side of the source as nvcc's front end "
        "hands it to the host compiler (device bodies, line markers, comments, spacing and "
        "__restrict__ left out)",
    )
    fingerprint_seconds: float = Field(default=0.0, description="time spent on fingerprints")
    disassembler: str = Field(
        default="",
        description="the nvdisasm that made the histograms, by name and version; empty until then",
    )
    disassembly_seconds: float = Field(default=0.0, description="time spent in nvdisasm")

    @property
    def kernels(self) -> list[FunctionCode]:
        return [f for f in self.functions if f.entry]

    @property
    def disassembled(self) -> bool:
        return all(f.histogram is not None for f in self.functions)

    @property
    def fingerprint(self) -> str:
        """Device SASS and host source together: equal means the same machine code runs
        (the key verdicts are shared by)."""
        host = self.host_source_fingerprint or self.host_fingerprint
        return _digest([self.device_fingerprint.encode(), host.encode()])

    def same_device(self, other: MachineCode) -> bool:
        return self.device_fingerprint == other.device_fingerprint

    def same_host(self, other: MachineCode) -> bool:
        """The same host launch: the same host object code, or the same host-side source.
        Either is enough. A stub gcc inlined into its caller lays out its argument copies
        differently under `__restrict__` (the object differs, the source does not); a loop
        pragma gcc ignores changes the source and not the object."""
        if not (self.host_fingerprint and other.host_fingerprint):
            return False  # a device-only build has no host side to compare
        if self.host_fingerprint == other.host_fingerprint:
            return True
        return bool(self.host_source_fingerprint) and (
            self.host_source_fingerprint == other.host_source_fingerprint
        )


# ---- fingerprints --------------------------------------------------------------------------


def read_machine_code(keep_dir: Path, arch: str) -> MachineCode:
    """Fingerprints of the build whose intermediate files nvcc kept in `keep_dir`."""
    started = time.perf_counter()
    cubin = device_image(keep_dir)
    host = keep_dir / "kernel.o"
    module = _module_hash(keep_dir)
    device = Elf.parse(cubin.read_bytes())
    functions = _functions(device, module)
    code = MachineCode(
        arch=arch,
        functions=functions,
        device_fingerprint=_device_fingerprint(device, module),
        host_fingerprint=_host_fingerprint(host, module, {f.name for f in functions if f.entry}),
        host_source_fingerprint=_host_source_fingerprint(keep_dir / "kernel.cudafe1.cpp", module),
    )
    code.fingerprint_seconds = time.perf_counter() - started
    return code


def read_device_code(cubin: Path, keep_dir: Path, arch: str) -> MachineCode:
    """Fingerprints of a device-only build (``nvcc -cubin``): `cubin` is its output, `keep_dir`
    the files nvcc kept. There is no host side, so the host fingerprints are empty (and
    :meth:`MachineCode.same_host` is never true of them)."""
    started = time.perf_counter()
    module = _module_hash(keep_dir)
    device = Elf.parse(cubin.read_bytes())
    code = MachineCode(
        arch=arch,
        functions=_functions(device, module),
        device_fingerprint=_device_fingerprint(device, module),
        host_fingerprint="",
    )
    code.fingerprint_seconds = time.perf_counter() - started
    return code


def normalized_image(keep_dir: Path, cubin: Path | None = None) -> bytes:
    """The kernel's cubin (`cubin`, else the one among nvcc's kept files) with the translation
    unit's hash normalized in its names (same length, so the ELF stays valid): what the cache
    keeps for later disassembly."""
    image = cubin if cubin is not None else device_image(keep_dir)
    return _normal(image.read_bytes(), _module_hash(keep_dir))


def device_image(keep_dir: Path) -> Path:
    """The cubin nvcc compiled the kernel file to (not the device-link stub's)."""
    found = sorted(p for p in keep_dir.glob("kernel*.cubin") if "_dlink" not in p.name)
    if not found:
        raise FileNotFoundError(f"no kernel cubin among nvcc's kept files in {keep_dir}")
    return found[0]


def _module_hash(keep_dir: Path) -> bytes:
    """The 8-hex hash nvcc derives from the source and puts in internal names."""
    path = keep_dir / "kernel.module_id"
    text = path.read_text(errors="replace").strip() if path.is_file() else ""
    match = _MODULE_HASH.match(text)
    return match[1].encode() if match else b""


def _normal(value: str | bytes, module: bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return data.replace(module, MODULE_PLACEHOLDER.encode()) if module else data


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:24]


def _section_parts(elf: Elf, section: Section, module: bytes) -> list[bytes]:
    """A section as bytes to hash: name, size, contents, and relocations by symbol name."""
    parts = [_normal(section.name, module), str(section.size).encode()]
    if section.type != SHT_NOBITS:
        parts.append(_normal(section.data, module))
    for rel in elf.relocations(section):
        parts.append(_normal(f"{rel.offset}:{rel.type}:{rel.symbol}:{rel.addend}", module))
    return parts


# Device sections that carry code or data the kernels use. Attributes (.nv.info: register
# counts, launch bounds as declared) are left out: the question is whether the SASS changed.
_DEVICE_SECTIONS = (".text.", ".nv.constant", ".nv.global", ".nv.shared")


def _device_fingerprint(elf: Elf, module: bytes) -> str:
    chosen = [s for s in elf.sections if s.name.startswith(_DEVICE_SECTIONS)]
    chosen.sort(key=lambda s: _normal(s.name, module))
    return _digest(part for s in chosen for part in _section_parts(elf, s, module))


# Host sections left out: the embedded device image (the device fingerprint covers what of
# it runs; its PTX may differ while the SASS does not), what only a linker reads, and unwind
# tables (they follow the code's layout, and the code is hashed function by function).
_HOST_SKIPPED = (".nv_fatbin", ".comment", ".note", ".group", ".eh_frame", ".gcc_except_table")
_OBJDUMP_ADDRESS = re.compile(r"^\s*[0-9a-f]+:\t")
_OBJDUMP_TARGET = re.compile(r"\b[0-9a-f]+ <")
_OBJDUMP_COMMENT = re.compile(r"\s+# [0-9a-f]+ <[^>]*>")
_OBJDUMP_RELOC = re.compile(r"\t[0-9a-f]+: R_")
_OBJDUMP_FUNCTION = re.compile(r"^[0-9a-f]+ <(?P<name>[^>]+)>:$")
_OBJDUMP_SECTION_REF = re.compile(r"\t(?P<section>\.text[\w.]*)(?P<offset>[+-]0x[0-9a-f]+)?$")
STUB_MARK = "__device_stub__"
"""A kernel's host stub (named so, or named as the kernel itself) only copies the arguments
its caller passes into an array for cudaLaunchKernel (grid, block, shared memory and stream
come from the caller's launch), so it is left out of the host fingerprint: gcc lays those
copies out differently when a parameter gains `__restrict__`, which changes no launch. A
stub gcc inlines into its caller stays, with the caller."""


def _host_fingerprint(obj: Path, module: bytes, kernels: set[str]) -> str:
    """The host object's data sections (bytes, relocations by symbol) and its functions
    (objdump's listing, addresses dropped, each function apart), kernel stubs left out.
    Without objdump, every allocated section's bytes (stricter: a stub's layout counts)."""
    elf = Elf.parse(obj.read_bytes())
    functions = _host_functions(obj, module, elf, kernels)
    code = functions is not None
    chosen = [
        s
        for s in elf.sections
        if s.flags & SHF_ALLOC
        and not s.name.startswith(_HOST_SKIPPED)
        and not (code and s.flags & SHF_EXECINSTR)
    ]
    chosen.sort(key=lambda s: _normal(s.name, module))
    parts = [part for s in chosen for part in _section_parts(elf, s, module)]
    for name, lines in sorted((functions or {}).items()):
        parts += [name.encode(), "\n".join(lines).encode()]
    return _digest(parts)


def _host_functions(
    obj: Path, module: bytes, elf: Elf, kernels: set[str]
) -> dict[str, list[str]] | None:
    """Function name -> its normalized objdump lines, launch stubs left out; None without
    objdump. A relocation to a code section plus an offset (how gcc points at a local
    function) names the function instead: gcc may order the functions differently."""
    tool = shutil.which("objdump")
    if tool is None:
        return None
    proc = subprocess.run(
        [tool, "-d", "-r", "-w", "--no-show-raw-insn", str(obj)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        return None
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in proc.stdout.splitlines():
        if m := _OBJDUMP_FUNCTION.match(raw):
            current = functions.setdefault(_normal(m["name"], module).decode(), [])
        elif current is not None and _OBJDUMP_ADDRESS.match(raw):
            line = _OBJDUMP_ADDRESS.sub("", raw)
            line = _OBJDUMP_COMMENT.sub("", line)
            line = _OBJDUMP_RELOC.sub("\tR_", _OBJDUMP_TARGET.sub("<", line))
            line = _OBJDUMP_SECTION_REF.sub(lambda m: _function_at(elf, m), line)
            current.append(_normal(line, module).decode())
    names = list(functions)
    pretty = demangle(names)
    return {
        name: functions[name]
        for name, shown in zip(names, pretty, strict=True)
        if STUB_MARK not in name and shown.removesuffix(" [clone .cold]") not in kernels
    }


def _function_at(elf: Elf, match: re.Match[str]) -> str:
    """`\t.text+0x90c` as `\t<function>`: a PC-relative reference to a function's start
    carries the start minus the few bytes to the end of the instruction (`lea` -4)."""
    section = elf.section(match["section"])
    offset = int(match["offset"] or "0", 16)
    if section is None:
        return match[0]
    starts = [
        s for s in elf.symbols if s.type == STT_FUNC and s.section == section.index and s.size
    ]
    near = [s for s in starts if 0 <= s.value - offset <= 8]
    if near:
        return f"\t<{min(near, key=lambda s: s.value).name}>"
    inside = [s for s in starts if s.value <= offset < s.value + s.size]
    return f"\t<{inside[0].name}>+{offset - inside[0].value:#x}" if inside else match[0]


_LINE_MARKER = re.compile(r'^#\s*\d+(?:\s+"(?P<file>[^"]*)")?')
_RESTRICT = re.compile(r"\b__restrict(?:__)?\b")
_SPACES = re.compile(r"\s+")
_PUNCT_SPACE = re.compile(r"\s*([^\w\s])\s*")  # spacing around punctuation is no token


def _host_source_fingerprint(cudafe: Path, module: bytes) -> str:
    """The lines of the kernel file in nvcc's host-side translation (headers left out), with
    the device bodies nvcc keeps under `#if 0` dropped, as well as line markers, spacing and
    `__restrict__` (a promise about device loads). Empty when nvcc kept no such file."""
    if not cudafe.is_file():
        return ""
    kept: list[bytes] = []
    ours, skipping = True, 0
    for line in cudafe.read_text(errors="replace").splitlines():
        stripped = line.strip()
        if skipping:
            skipping += stripped.startswith("#if")
            skipping -= stripped.startswith("#endif")
            continue
        if stripped == "#if 0":
            skipping = 1
            continue
        if marker := _LINE_MARKER.match(stripped):
            if marker["file"] is not None:
                ours = os.path.basename(marker["file"]) == "kernel.cu"
            continue
        if ours and stripped:
            text = _SPACES.sub(" ", _RESTRICT.sub("", stripped))
            text = _PUNCT_SPACE.sub(r"\1", text).strip()
            kept.append(_normal(text, module))
    return _digest(kept)


def _functions(elf: Elf, module: bytes) -> list[FunctionCode]:
    entries = {s.name for s in elf.symbols if s.other & STO_CUDA_ENTRY}
    texts = [s for s in elf.sections if s.name.startswith(".text.")]
    mangled = [s.name.removeprefix(".text.") for s in texts]
    names = demangle(mangled)
    out = []
    for section, symbol, name in zip(texts, mangled, names, strict=True):
        shared = elf.section(f".nv.shared.{symbol}")
        out.append(
            FunctionCode(
                name=name,
                symbol=_normal(symbol, module).decode(),
                entry=symbol in entries,
                fingerprint=_digest(_section_parts(elf, section, module)[2:]),
                instructions=section.size // 16,
                shared_bytes=shared.size if shared is not None else 0,
            )
        )
    out.sort(key=lambda f: (not f.entry, f.name))
    return out


# ---- disassembly ---------------------------------------------------------------------------


def toolkit_roots() -> list[Path]:
    """The CUDA toolkit folders this machine has: the one holding the nvcc on PATH (as found,
    then through its links), then ``$CUDA_HOME`` and ``$CUDA_PATH``."""
    roots: list[Path] = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots += [Path(nvcc).parent.parent, Path(nvcc).resolve().parent.parent]
    roots += [Path(v) for v in filter(None, map(os.environ.get, ("CUDA_HOME", "CUDA_PATH")))]
    return list(dict.fromkeys(roots))


def find_tool(name: str) -> str | None:
    """`name` (nvdisasm, cuobjdump) from ``$KLINEAGE_<NAME>``, PATH, the CUDA toolkit beside
    nvcc or ``$CUDA_HOME``, or an ``nvidia-cuda-<name>`` wheel in this Python environment
    (the wheels put the binary under ``nvidia/cu13/bin/`` without adding it to PATH)."""
    chosen = os.environ.get(f"KLINEAGE_{name.upper()}")
    if chosen:
        return chosen
    found = shutil.which(name)
    if found:
        return found
    folders = [root / "bin" for root in toolkit_roots()]
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            folders += sorted(Path(base).glob("*/bin"))
    for folder in folders:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _nvdisasm(cubin: Path, *flags: str) -> tuple[str, str]:
    tool = find_tool("nvdisasm")
    if tool is None:
        raise FileNotFoundError(
            "nvdisasm was not found: install the CUDA toolkit's nvdisasm, or "
            "`pip install nvidia-cuda-nvdisasm` into this environment"
        )
    proc = subprocess.run(
        [tool, "-c", "-ndf", *flags, str(cubin)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin.name}: {proc.stderr.strip()[:400]}")
    return proc.stdout, tool


@functools.cache
def tool_version(path: str) -> str:
    """`nvdisasm V13.5.37`: the tool by name and version (never its path on this machine)."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return Path(path).name
    version = re.search(r"\bV\d+(?:\.\d+)+", proc.stdout)
    return f"{Path(path).name} {version[0]}" if version else Path(path).name


def parse_histograms(listing: str) -> dict[str, dict[str, int]]:
    """Mangled function name -> counts of FAMILIES instructions, from nvdisasm's listing."""
    counts: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in listing.splitlines():
        if m := _SECTION.match(line):
            current = counts.setdefault(m[1], Counter())
        elif current is not None and (m := _INSTRUCTION.match(line)):
            mnemonic = m[1]
            if mnemonic.split(".", 1)[0] in FAMILIES:
                current[mnemonic] += 1
    return {name: dict(sorted(c.items())) for name, c in counts.items()}


def disassemble(code: MachineCode, cubin: Path) -> MachineCode:
    """`code` with every function's histogram filled from nvdisasm's listing of `cubin` (the
    image :func:`normalized_image` wrote, so its names match the fingerprints')."""
    started = time.perf_counter()
    listing, tool = _nvdisasm(cubin)
    found = parse_histograms(listing)
    tool = tool_version(tool)
    functions = [
        f.model_copy(update={"histogram": found.get(f.symbol, {})}) for f in code.functions
    ]
    return code.model_copy(
        update={
            "functions": functions,
            "disassembler": tool,
            "disassembly_seconds": time.perf_counter() - started,
        }
    )


def instantiated_lines(cubin: Path, source_name: str = "kernel.cu") -> set[int]:
    """Source lines that some SASS instruction comes from, in a build made with -lineinfo."""
    listing, _ = _nvdisasm(cubin, "-g")
    return {
        int(m["line"])
        for m in _LINE.finditer(listing)
        if os.path.basename(m["file"]) == source_name
    }


# ---- features and deltas -------------------------------------------------------------------


def _width(mnemonic: str) -> str:
    parts = mnemonic.split(".")
    for token in parts[1:]:
        if token in {"64", "128", "U8", "S8", "U16", "S16"}:
            return token
    return "32"


def feature_counts(functions: Iterable[FunctionCode]) -> Counter[str]:
    """Features summed over `functions`: each family's count, ``constant`` (global loads on
    the read-only path) and ``global_width:<op>.<width>`` per access width."""
    total: Counter[str] = Counter()
    for function in functions:
        for mnemonic, count in (function.histogram or {}).items():
            family = mnemonic.split(".", 1)[0]
            total[family] += count
            if family in ("LDG", "STG"):
                total[f"global_width:{family}.{_width(mnemonic)}"] += count
                if ".CONSTANT" in mnemonic:
                    total["constant"] += count
    return total


def _feature_subset(counts: Mapping[str, int], feature: str) -> dict[str, int]:
    if feature == "global_width":
        return {k: v for k, v in counts.items() if k.startswith("global_width:")}
    return {feature: counts.get(feature, 0)}


def signature_shown(signature: Signature, optimized: MachineCode, simplified: MachineCode) -> bool:
    """Whether the step from `optimized` to `simplified` changes one of the signature's
    features (True when the signature is empty: the mechanism declares none)."""
    if not signature:
        return True
    before = feature_counts(optimized.kernels)
    after = feature_counts(simplified.kernels)
    for feature in signature:
        if feature == "host":
            if not optimized.same_host(simplified):
                return True
        elif _feature_subset(before, feature) != _feature_subset(after, feature):
            return True
    return False


class KernelDelta(BaseModel):
    """How one kernel's machine code differs between two builds (before -> after)."""

    kernel: str = Field(description="demangled kernel name")
    status: str = Field(description="'changed', 'added' (after only) or 'removed' (before only)")
    before: dict[str, int] = Field(
        default_factory=dict, description="counts, in the before build, of the changed mnemonics"
    )
    after: dict[str, int] = Field(
        default_factory=dict, description="counts, in the after build, of the changed mnemonics"
    )
    instructions_before: int = Field(default=0, description="SASS instructions before")
    instructions_after: int = Field(default=0, description="SASS instructions after")


def delta(before: MachineCode, after: MachineCode) -> list[KernelDelta]:
    """Per kernel whose SASS differs: the histogram entries that changed."""
    old = {f.symbol: f for f in before.kernels}
    new = {f.symbol: f for f in after.kernels}
    out = []
    for symbol in sorted(set(old) | set(new), key=lambda s: (old.get(s) or new[s]).name):
        a, b = old.get(symbol), new.get(symbol)
        if a is not None and b is not None and a.fingerprint == b.fingerprint:
            continue
        ha, hb = (a.histogram or {}) if a else {}, (b.histogram or {}) if b else {}
        keys = sorted(k for k in set(ha) | set(hb) if ha.get(k, 0) != hb.get(k, 0))
        out.append(
            KernelDelta(
                kernel=(a or b).name,  # type: ignore[union-attr]
                status="changed" if a and b else ("added" if b else "removed"),
                before={k: ha[k] for k in keys if ha.get(k, 0)},
                after={k: hb[k] for k in keys if hb.get(k, 0)},
                instructions_before=a.instructions if a else 0,
                instructions_after=b.instructions if b else 0,
            )
        )
    return out


def short_name(name: str) -> str:
    """`void (anonymous namespace)::softmax_rows<256>(const float *, ...)` -> `softmax_rows<256>`
    (also from cu++filt's spelling, `<unnamed>::...`): what a card shows, and how kernels are
    matched across demanglers. cu++filt casts template arguments (`f<(int)4, (bool)0>`): the
    casts go and a `bool` reads as c++filt writes it (`f<4,false>`)."""
    for scope in ("(anonymous namespace)::", "<unnamed>::"):
        name = name.replace(scope, "")
    name = re.sub(r"\(bool\)([01])\b", lambda m: ("false", "true")[int(m.group(1))], name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    head = name[:cut]
    depth, start = 0, 0
    for i, ch in enumerate(head):  # drop a return type: the last space outside <...>
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            start = i + 1
    return re.sub(r"\(\w+\)(?=-?\d)", "", head[start:]).replace(" ", "")


def render_delta(deltas: Sequence[KernelDelta]) -> list[str]:
    """One line per kernel: "`LDG.E` x8 -> `LDG.E.128` x2 in `softmax_rows<256>`"."""
    lines = []
    for d in deltas:
        where = f"`{short_name(d.kernel)}`"
        if d.status != "changed":
            size = d.instructions_after or d.instructions_before
            lines.append(f"kernel {where} {d.status} ({size} instructions)")
            continue
        left = ", ".join(f"`{k}` x{v}" for k, v in d.before.items()) or "none"
        right = ", ".join(f"`{k}` x{v}" for k, v in d.after.items()) or "none"
        sizes = f"{d.instructions_before} -> {d.instructions_after} instructions"
        if not d.before and not d.after:
            lines.append(f"{sizes} in {where} (no counted instruction changed)")
        else:
            lines.append(f"{left} -> {right} in {where} ({sizes})")
    return lines


def signature_present(
    signature: Signature, gained: Mapping[str, int], lost: Mapping[str, int], target: MachineCode
) -> bool:
    """Whether `target` already shows what a skill adds: every feature of its signature the
    skill gains is in the target's kernels, and none the skill takes away is left there."""
    features = feature_counts(target.kernels)
    relevant = [f for f in signature if f != "host"]
    if not relevant or not target.disassembled:
        return False

    def in_signature(key: str) -> bool:
        return any(
            key == f or (f == "global_width" and key.startswith("global_width:")) for f in relevant
        )

    wanted = [k for k in gained if in_signature(k)]
    unwanted = [k for k in lost if in_signature(k)]
    if not wanted:
        return False
    return all(features.get(k, 0) > 0 for k in wanted) and not any(
        features.get(k, 0) > 0 for k in unwanted
    )
