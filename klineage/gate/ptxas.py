"""Parse the resource report that ``ptxas -v`` prints during an nvcc build.

nvcc 13.0 (``-Xptxas -v``) prints one block per entry function and target::

  ptxas info    : 0 bytes gmem
  ptxas info    : Compiling entry function '_Z3fooPfl' for 'sm_90'
  ptxas info    : Function properties for _Z3fooPfl
      8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  ptxas info    : Used 32 registers, used 1 barriers, 8 bytes cumulative stack size, 1024 bytes smem
  ptxas info    : Compile time = 3.801 ms

Non-inlined ``__device__`` functions only get a ``Function properties for`` block (no
``Compiling entry function`` line, no ``Used`` line). For ``sm_90`` nvcc 13.0 no longer prints
``cmem[N]`` items; older toolkits and other targets (e.g. ``sm_80``) still do, and very old
ones omit ``used N barriers``. The parser therefore reads the ``Used`` line item by item.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable

from pydantic import BaseModel, Field

__all__ = [
    "DeviceFunction",
    "KernelResources",
    "PtxasReport",
    "demangle",
    "parse_ptxas",
]

_PTXAS_TAG = re.compile(r"(?<!\n)(?=ptxas (?:info|warning|error|fatal)\s*:)")
_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, "
    r"(?P<ld>\d+) bytes spill loads"
)
_USED = re.compile(r"ptxas info\s*:\s*Used (?P<items>.*)$")
_GMEM = re.compile(r"ptxas info\s*:\s*\d+ bytes gmem")
_WARNING = re.compile(r"ptxas warning\s*:\s*(?P<msg>.*)$")
_PERF_NOTE = re.compile(r"ptxas info\s*:\s*(?P<msg>.*Potential Performance Loss.*)$")

# Items of the comma-separated "Used ..." line, matched one at a time.
_REGISTERS = re.compile(r"^(?:Used )?(\d+) registers$")
_BARRIERS = re.compile(r"^used (\d+) barriers$")
_SMEM = re.compile(r"^(\d+) bytes smem$")
_CMEM = re.compile(r"^(\d+) bytes cmem\[(\d+)\]$")
_CUMULATIVE_STACK = re.compile(r"^(\d+) bytes cumulative stack size$")


class DeviceFunction(BaseModel):
    """Frame information of a non-inlined ``__device__`` function (not a kernel)."""

    name: str = Field(description="Demangled name when a demangler was available, else mangled.")
    mangled_name: str = Field(description="Symbol name exactly as ptxas printed it.")
    arch: str | None = Field(
        default=None, description="Target (e.g. 'sm_90') the function was compiled for, if known."
    )
    stack_bytes: int = Field(default=0, description="Per-thread stack frame size in bytes.")
    spill_store_bytes: int = Field(default=0, description="Bytes of register spill stores.")
    spill_load_bytes: int = Field(default=0, description="Bytes of register spill loads.")


class KernelResources(BaseModel):
    """Resources ptxas assigned to one ``__global__`` entry function for one target."""

    name: str = Field(description="Demangled name when a demangler was available, else mangled.")
    mangled_name: str = Field(description="Symbol name exactly as ptxas printed it.")
    arch: str = Field(description="Target the entry was compiled for, e.g. 'sm_90' or 'sm_90a'.")
    registers: int = Field(default=0, description="Registers per thread.")
    shared_bytes: int = Field(default=0, description="Static shared memory (smem) in bytes.")
    constant_bytes: int | None = Field(
        default=None,
        description="Sum of all cmem[N] banks in bytes; None when ptxas printed no cmem items "
        "(nvcc 13.0 omits them for sm_90).",
    )
    constant_banks: dict[int, int] = Field(
        default_factory=dict, description="Constant memory bytes per cmem bank number."
    )
    stack_bytes: int = Field(default=0, description="Per-thread stack frame size in bytes.")
    cumulative_stack_bytes: int = Field(
        default=0,
        description="Stack including called device functions ('cumulative stack size'), "
        "0 when not reported.",
    )
    spill_store_bytes: int = Field(default=0, description="Bytes of register spill stores.")
    spill_load_bytes: int = Field(default=0, description="Bytes of register spill loads.")
    barriers: int = Field(default=0, description="Named barriers used (0 when not reported).")

    @property
    def spill_bytes(self) -> int:
        """Spill stores plus spill loads, in bytes."""
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def short_name(self) -> str:
        """The bare function name: no return type, template arguments or parameters."""
        return _short_name(self.name)


class PtxasReport(BaseModel):
    """Everything parsed from one build's ``-Xptxas -v`` output."""

    kernels: list[KernelResources] = Field(
        default_factory=list, description="Entry functions, in the order ptxas printed them."
    )
    device_functions: list[DeviceFunction] = Field(
        default_factory=list,
        description="Non-inlined __device__ functions with their frames (never kernels).",
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="ptxas warnings and 'Potential Performance Loss' notes, verbatim.",
    )

    @classmethod
    def parse(cls, log: str, demangle_names: bool = True) -> PtxasReport:
        """Same as :func:`parse_ptxas`."""
        return parse_ptxas(log, demangle_names=demangle_names)

    @property
    def total_spills(self) -> int:
        """Spill store plus spill load bytes, summed over all kernels."""
        return sum(k.spill_bytes for k in self.kernels)

    def by_name(self, name: str, arch: str | None = None) -> KernelResources | None:
        """Find a kernel by demangled name, mangled name, or bare name (``"foo"``).

        Returns None when nothing matches. A bare name shared by several kernels (e.g. two
        template instantiations) raises KeyError listing them, rather than guessing.
        """
        pool = [k for k in self.kernels if arch is None or k.arch == arch]
        for k in pool:
            if name in (k.name, k.mangled_name):
                return k
        matches = [k for k in pool if k.short_name == name]
        if len(matches) > 1:
            listed = ", ".join(f"{k.name} [{k.arch}]" for k in matches)
            raise KeyError(f"kernel name {name!r} is ambiguous: {listed}")
        return matches[0] if matches else None


def parse_ptxas(log: str, demangle_names: bool = True) -> PtxasReport:
    """Parse nvcc/ptxas verbose output (the whole build log is fine: other lines are skipped)."""
    state = _ParseState()
    for line in _PTXAS_TAG.sub("\n", log).splitlines():
        state.feed(line.rstrip())
    report = PtxasReport(
        kernels=state.kernels, device_functions=state.functions, warnings=state.warnings
    )
    if demangle_names:
        _apply_demangling(report)
    return report


class _ParseState:
    """Line-by-line state machine; ptxas output is small, so a plain loop is enough."""

    def __init__(self) -> None:
        self.kernels: list[KernelResources] = []
        self.functions: list[DeviceFunction] = []
        self.warnings: list[str] = []
        self.current: KernelResources | None = None  # entry whose block we are inside
        self.frame_target: KernelResources | DeviceFunction | None = None
        self.arch: str | None = None
        self.arch_pending: list[DeviceFunction] = []  # device fns seen before any entry

    def feed(self, line: str) -> None:
        if m := _ENTRY.search(line):
            self._start_entry(m["name"], m["arch"])
        elif m := _PROPS.search(line):
            self._start_properties(m["name"])
        elif m := _FRAME.search(line):
            self._set_frame(int(m["stack"]), int(m["st"]), int(m["ld"]))
        elif m := _USED.search(line):
            if self.current is not None:
                _apply_used_items(self.current, m["items"])
        elif _GMEM.search(line):
            # Each ptxas invocation (one per target) starts with the gmem line.
            self.current, self.frame_target, self.arch = None, None, None
        elif m := (_WARNING.search(line) or _PERF_NOTE.search(line)):
            self.warnings.append(m["msg"].strip())

    def _start_entry(self, mangled: str, arch: str) -> None:
        self.current = KernelResources(name=mangled, mangled_name=mangled, arch=arch)
        self.kernels.append(self.current)
        self.frame_target = None
        self.arch = arch
        for fn in self.arch_pending:
            fn.arch = arch
        self.arch_pending.clear()

    def _start_properties(self, mangled: str) -> None:
        if self.current is not None and self.current.mangled_name == mangled:
            self.frame_target = self.current
            return
        # Properties for something that is not the current entry: a device function.
        fn = DeviceFunction(name=mangled, mangled_name=mangled, arch=self.arch)
        if self.arch is None:
            self.arch_pending.append(fn)
        self.functions.append(fn)
        self.frame_target = fn

    def _set_frame(self, stack: int, stores: int, loads: int) -> None:
        target = self.frame_target
        if target is None:
            return
        target.stack_bytes = stack
        target.spill_store_bytes = stores
        target.spill_load_bytes = loads
        self.frame_target = None


def _apply_used_items(kernel: KernelResources, items: str) -> None:
    """Fill a kernel from 'Used 32 registers, used 1 barriers, 1024 bytes smem, ...'."""
    for item in (part.strip() for part in items.split(",")):
        if m := _REGISTERS.match(item):
            kernel.registers = int(m[1])
        elif m := _BARRIERS.match(item):
            kernel.barriers = int(m[1])
        elif m := _SMEM.match(item):
            kernel.shared_bytes = int(m[1])
        elif m := _CMEM.match(item):
            bank = int(m[2])
            kernel.constant_banks[bank] = kernel.constant_banks.get(bank, 0) + int(m[1])
            kernel.constant_bytes = sum(kernel.constant_banks.values())
        elif m := _CUMULATIVE_STACK.match(item):
            kernel.cumulative_stack_bytes = int(m[1])


def _apply_demangling(report: PtxasReport) -> None:
    entries: list[KernelResources | DeviceFunction] = [*report.kernels, *report.device_functions]
    names = demangle(e.mangled_name for e in entries)
    for entry, name in zip(entries, names, strict=True):
        entry.name = name


def demangle(names: Iterable[str]) -> list[str]:
    """Demangle C++ symbol names with one ``cu++filt``/``c++filt`` call.

    Names that are not mangled come back unchanged; if no demangler is installed (or it
    misbehaves) every name comes back unchanged.
    """
    names = list(names)
    if not any(n.startswith("_Z") for n in names):
        return names
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return names
    try:
        proc = subprocess.run(
            [tool],
            input="\n".join(names) + "\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return names
    out = proc.stdout.splitlines()
    # One line per name is the contract; anything else means we cannot trust the mapping.
    if proc.returncode != 0 or len(out) != len(names):
        return names
    return [d.strip() or n for n, d in zip(names, out, strict=True)]


def _short_name(demangled: str) -> str:
    """'void ns::tkern<float, 128>(float*, long)' -> 'tkern'."""
    head = _cut_at_depth0(demangled, "(")
    head = head[_last_index_at_depth0(head, " ") + 1 :]  # drop the return type
    head = _cut_at_depth0(head, "<")
    return head.rsplit("::", 1)[-1]


def _cut_at_depth0(text: str, stop: str) -> str:
    depth = 0
    for i, ch in enumerate(text):
        if ch == stop and depth == 0:
            return text[:i]
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
    return text


def _last_index_at_depth0(text: str, target: str) -> int:
    depth, found = 0, -1
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif ch == target and depth == 0:
            found = i
    return found
