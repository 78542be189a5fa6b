"""The kernel ABI: the `run(...)` a definition implies, and the one a kernel source declares.

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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from klineage.problem.models import Definition, TensorSpec

Role = Literal["input", "output", "axis", "stream"]
"""Where an argument of `run` comes from."""

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


@dataclass(frozen=True)
class AbiParam:
    """One parameter of `run(...)`."""

    name: str
    """Parameter name (the definition's input, output or axis name, or `stream`)."""
    role: Role
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
        """The `ctypes` type the argument is passed as."""
        if self.is_pointer:
            return ctypes.c_void_p
        if self.role == "axis":
            return ctypes.c_int64
        assert self.dtype is not None
        return _CTYPES_SCALARS[self.dtype]

    @property
    def c_declaration(self) -> str:
        """The parameter as C declares it (`const float* x`)."""
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
        """The signature `definition` implies; AbiError when the ABI cannot express it."""
        params: list[AbiParam] = []
        updated_in_place = set(definition.inplace_outputs().values())
        groups: tuple[tuple[Role, dict[str, TensorSpec]], ...] = (
            ("input", definition.inputs),
            ("output", definition.outputs),
        )
        for role, specs in groups:
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
        """The `ctypes` argument types of `run`, in order."""
        return [p.ctype for p in self.params]

    @property
    def prototype(self) -> str:
        """The C declaration the kernel must export: `extern "C" int run(...)`."""
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

    def arguments(
        self,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any],
        axis_values: Mapping[str, int],
        stream: int,
    ) -> list[Any]:
        """The values to call `run` with: device addresses of the tensors (anything with a
        `data_ptr()`), scalars by value, the var axes, then the stream handle."""
        values: list[Any] = []
        for param in self.params:
            if param.role == "input":
                value = inputs[param.name]
                values.append(value.data_ptr() if param.is_pointer else value)
            elif param.role == "output":
                values.append(outputs[param.name].data_ptr())
            elif param.role == "axis":
                values.append(axis_values[param.name])
            else:
                values.append(stream)
        return values

    def mismatch(self, source: str, name: str = "kernel.cu") -> str | None:
        """Why the `run` that `source` defines cannot be called with this signature, or None
        when it matches (or when no declaration of `run` can be read from the source; the
        build's symbol check covers a missing one). Names do not matter; the count, pointer
        or value, and the width of every value parameter do."""
        declared = declared_run(source)
        if declared is None:
            return None
        problems = _differences(self.params, declared.params)
        if not problems:
            return None
        found = ", ".join(p.text for p in declared.params)
        return "\n".join(
            [
                f"{name}:{declared.line}: run(...) does not match the definition's ABI: "
                + "; ".join(problems),
                f"  found:    {declared.linkage}int run({found})",
                f"  expected: {self.prototype}",
            ]
        )


# ---- reading the declared run(...) -----------------------------------------------------------

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_RUN = re.compile(r"(?<![\w.>:])([A-Za-z_]\w*)\s+run\s*\(")
_NOT_TYPES = {"return", "else", "case", "goto", "new", "delete", "throw", "sizeof"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")

# Value types by how the ABI passes them; a value parameter of another known type is called
# with the wrong bits (an `int` axis reads half of the int64_t the harness passes).
_VALUE_KINDS: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "int64_t": "int64",
    "long": "int64",
    "long long": "int64",
    "long int": "int64",
    "long long int": "int64",
    "unsigned long": "int64",
    "unsigned long long": "int64",
    "uint64_t": "int64",
    "size_t": "int64",
    "ssize_t": "int64",
    "ptrdiff_t": "int64",
    "int": "int32",
    "int32_t": "int32",
    "unsigned": "int32",
    "unsigned int": "int32",
    "uint32_t": "int32",
    "short": "int16",
    "int16_t": "int16",
    "uint16_t": "int16",
    "char": "int8",
    "signed char": "int8",
    "int8_t": "int8",
    "unsigned char": "uint8",
    "uint8_t": "uint8",
    "bool": "bool",
}
_STREAM_TYPES = {"cudaStream_t", "CUstream"}


@dataclass(frozen=True)
class DeclaredParam:
    """One parameter of `run(...)` as the source declares it."""

    text: str
    """The declaration, white space folded (`const float* x`)."""
    is_pointer: bool
    """Declared with `*` or `[]`."""
    type_name: str
    """The type without qualifiers or the parameter name (`float`, `cudaStream_t`)."""
    name: str = ""
    """The parameter's name (`x`); empty where the declaration names none (`float`)."""


@dataclass(frozen=True)
class DeclaredRun:
    """The `run(...)` a kernel source defines."""

    params: tuple[DeclaredParam, ...]
    """Its parameters, in order."""
    line: int
    """The 1-based line of the name `run`."""
    linkage: str
    """`extern "C" ` when the declaration says so, else empty."""


def declared_run(source: str) -> DeclaredRun | None:
    """The parameters of the `run` function `source` defines (the definition with a body,
    else the first declaration), read from the text with comments blanked; None if none."""
    code = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), source)
    found: list[tuple[bool, re.Match[str], int]] = []
    for match in _RUN.finditer(code):
        if match.group(1) in _NOT_TYPES:
            continue
        close = _closing_paren(code, match.end())
        if close is None:
            continue
        has_body = re.match(r"\s*(?:noexcept\s*)?\{", code[close + 1 :]) is not None
        found.append((has_body, match, close))
    if not found:
        return None
    _, match, close = next((f for f in found if f[0]), found[0])
    inside = _STRING.sub('""', code[match.end() : close])
    params = tuple(_declared_param(p) for p in _split_top_level(inside))
    if len(params) == 1 and params[0].text in {"", "void"}:
        params = ()
    line_start = code.rfind("\n", 0, match.start()) + 1
    before = code[max(0, line_start - 200) : match.start()]
    linkage = 'extern "C" ' if re.search(r'extern\s+"C"', before) else ""
    return DeclaredRun(params, code.count("\n", 0, match.start(1)) + 1, linkage)


def _closing_paren(code: str, start: int) -> int | None:
    depth = 1
    for index in range(start, len(code)):
        if code[index] == "(":
            depth += 1
        elif code[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char in "(<[":
            depth += 1
        elif char in ")>]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _declared_param(text: str) -> DeclaredParam:
    folded = " ".join(text.split("=")[0].split())
    is_pointer = "*" in folded or "[" in folded
    words = [w for w in _IDENTIFIER.findall(folded.split("[")[0]) if w not in _QUALIFIERS]
    joined = " ".join(words)
    # `long long` and `float` name no parameter; otherwise the last word is the name
    named = len(words) > 1 and joined not in _VALUE_KINDS
    type_name = " ".join(words[:-1]) if named else joined
    return DeclaredParam(
        text=folded, is_pointer=is_pointer, type_name=type_name, name=words[-1] if named else ""
    )


def _differences(expected: Sequence[AbiParam], declared: Sequence[DeclaredParam]) -> list[str]:
    if len(declared) != len(expected):
        problems = [f"{len(declared)} parameters where the definition implies {len(expected)}"]
        return problems + _missing_names(expected, declared)
    problems = []
    for number, (want, got) in enumerate(zip(expected, declared, strict=True), 1):
        wrong = _wrong_type(want, got)
        if wrong:
            problems.append(f"parameter {number} `{got.text}` {wrong}")
    return problems


def _missing_names(expected: Sequence[AbiParam], declared: Sequence[DeclaredParam]) -> list[str]:
    """Which of the definition's names the declaration lacks, when the names tell."""
    names = {(_IDENTIFIER.findall(p.text) or [""])[-1] for p in declared}
    missing = [p.name for p in expected if p.name not in names]
    extra = len(declared) - (len(expected) - len(missing))
    if not missing or extra > 0:
        return []
    return [f"no parameter for {', '.join(missing)}"]


def _wrong_type(want: AbiParam, got: DeclaredParam) -> str:
    """How `got` differs from `want` where it changes the call, or ''."""
    if want.role == "stream":
        kind = _VALUE_KINDS.get(got.type_name)
        return f"should be the stream ({want.c_declaration})" if kind else ""
    if want.is_pointer != got.is_pointer:
        shown = "a device pointer" if want.is_pointer else "a value"
        return f"should be {shown}: {want.c_declaration}"
    if want.is_pointer:
        return ""  # any pointer type carries the address (`const void*`, a typedef of bf16)
    kind = _VALUE_KINDS.get(got.type_name)
    expected = "int64" if want.role == "axis" else want.dtype
    if kind is not None and kind != expected:
        return f"should be {want.c_declaration}"
    return ""
