"""Kernel sources and the kernel ABI.

A kernel is one `.cu` file exporting, in destination-passing style::

    extern "C" int run(<inputs...>, <outputs...>, <var axes as int64_t...>, cudaStream_t stream);

Inputs and outputs come in definition order: tensors as typed device pointers, scalars by value.
An output declared `inplace_of` an input gets no pointer of its own: the kernel writes it into
that input's buffer, which is then passed as `T*` rather than `const T*`.
Each var axis follows as `int64_t`, in definition order, then the stream. The return value is a
`cudaError_t` cast to int. `KernelAbi` derives the `ctypes` signature from a definition, so
nobody writes glue by hand.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from klineage.problem import Definition
    from klineage.source import ParsedSource

FINGERPRINT_LENGTH = 16

# C spelling of each definition dtype, for prototypes shown to people and LLMs.
_C_TYPES: dict[str, str] = {
    "float32": "float",
    "float64": "double",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "int64": "int64_t",
    "int32": "int32_t",
    "int16": "int16_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "bool": "bool",
}

# ctypes type of a scalar passed by value. Half-precision scalars have no portable by-value
# representation in ctypes, so the ABI refuses them (use a float32 scalar instead).
_CTYPES_SCALARS: dict[str, type] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int64": ctypes.c_int64,
    "int32": ctypes.c_int32,
    "int16": ctypes.c_int16,
    "int8": ctypes.c_int8,
    "uint8": ctypes.c_uint8,
    "bool": ctypes.c_bool,
}


class AbiError(ValueError):
    """The definition cannot be expressed in the kernel ABI."""


def normalize_source(text: str) -> str:
    """Canonical form used for fingerprints: LF line ends, no trailing blanks, one final newline."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n") + "\n"


def fingerprint_of(text: str) -> str:
    """A stable short id of a kernel's source, blind to line endings and trailing whitespace."""
    digest = hashlib.sha256(normalize_source(text).encode("utf-8")).hexdigest()
    return digest[:FINGERPRINT_LENGTH]


@dataclass(frozen=True)
class KernelSource:
    """The text of one `.cu` kernel, with a display name and a stable fingerprint."""

    text: str
    """The CUDA source, exactly as written."""
    name: str = "kernel.cu"
    """Display name used in messages (the file name when read from disk)."""
    path: Path | None = field(default=None, compare=False)
    """Where the source was read from, if anywhere."""

    @classmethod
    def from_file(cls, path: str | Path) -> KernelSource:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no such kernel file; pass the path of a .cu file")
        return cls(text=file.read_text(encoding="utf-8"), name=file.name, path=file)

    @cached_property
    def fingerprint(self) -> str:
        return fingerprint_of(self.text)

    @cached_property
    def parsed(self) -> ParsedSource:
        """The tree-sitter source model (:mod:`klineage.source`), parsed on first use.

        Imported lazily so that ``import klineage`` stays fast and works without tree-sitter.
        """
        from klineage.source import ParsedSource

        return ParsedSource(self)

    def __repr__(self) -> str:
        return f"KernelSource({self.name!r}, fingerprint={self.fingerprint})"


@dataclass(frozen=True)
class AbiParam:
    """One parameter of `run(...)`."""

    name: str
    """Parameter name (the definition's input, output or axis name, or `stream`)."""
    role: Literal["input", "output", "axis", "stream"]
    """Where the argument comes from."""
    dtype: str | None
    """Definition dtype for tensors and scalars; None for axes and the stream."""
    is_pointer: bool
    """True for tensors (device pointers) and the stream handle."""
    mutable: bool = False
    """An input the kernel overwrites with an output (`inplace_of`): passed as `T*`, not
    `const T*`."""

    @property
    def ctype(self) -> type:
        if self.is_pointer:
            return ctypes.c_void_p
        if self.role == "axis":
            return ctypes.c_int64
        assert self.dtype is not None
        return _CTYPES_SCALARS[self.dtype]

    @property
    def c_declaration(self) -> str:
        if self.role == "stream":
            return f"cudaStream_t {self.name}"
        if self.role == "axis":
            return f"int64_t {self.name}"
        assert self.dtype is not None
        ctype = _C_TYPES[self.dtype]
        if not self.is_pointer:
            return f"{ctype} {self.name}"
        const = "const " if self.role == "input" and not self.mutable else ""
        return f"{const}{ctype}* {self.name}"


@dataclass(frozen=True)
class KernelAbi:
    """The `run(...)` signature a definition implies."""

    params: tuple[AbiParam, ...]

    @classmethod
    def from_definition(cls, definition: Definition) -> KernelAbi:
        params: list[AbiParam] = []
        updated_in_place = set(definition.inplace_outputs().values())
        for role, specs in (("input", definition.inputs), ("output", definition.outputs)):
            for name, spec in specs.items():
                if role == "output" and spec.inplace_of is not None:
                    continue  # written through the input's pointer

                if spec.is_scalar:
                    if role == "output":
                        raise AbiError(
                            f"output {name!r} is a scalar; the ABI passes outputs as device "
                            "pointers, so give it shape [] or a one-element axis"
                        )
                    if spec.dtype not in _CTYPES_SCALARS:
                        raise AbiError(
                            f"scalar input {name!r} has dtype {spec.dtype}, which cannot be "
                            f"passed by value; use one of {', '.join(_CTYPES_SCALARS)}"
                        )
                params.append(
                    AbiParam(
                        name,
                        role,
                        spec.dtype,
                        is_pointer=not spec.is_scalar,
                        mutable=name in updated_in_place,
                    )
                )
        for axis in definition.var_axes():
            params.append(AbiParam(axis, "axis", None, is_pointer=False))
        params.append(AbiParam("stream", "stream", None, is_pointer=True))
        return cls(tuple(params))

    @property
    def argtypes(self) -> list[type]:
        return [p.ctype for p in self.params]

    @property
    def prototype(self) -> str:
        args = ", ".join(p.c_declaration for p in self.params)
        return f'extern "C" int run({args})'

    def bind(self, library: ctypes.CDLL) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
        """Look up `run` in a loaded kernel library and give it this signature."""
        try:
            fn = library.run
        except AttributeError as err:
            raise AbiError(f"the library does not export {self.prototype}") from err
        fn.argtypes = self.argtypes
        fn.restype = ctypes.c_int
        return fn
