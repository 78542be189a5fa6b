"""A problem's extra build flags: FlashInfer-Trace / SOL-ExecBench ``compile_options``.

A problem folder may hold ``compile_options.json`` beside ``definition.json``::

    {"ld_flags": ["-lcuda"]}

- ``cflags``: host-compiler flags (``-DNDEBUG``, ``-Wno-...``), given to nvcc as
  ``-Xcompiler``;
- ``cuda_cflags``: nvcc flags (``-DTILE=128``, ``--use_fast_math``, ``-Xptxas=-O3``);
- ``ld_flags``: linker flags of the shared library: ``-l<lib>`` (``-lcuda`` for the driver
  API's ``cuTensorMapEncodeTiled``, ``-lcublas``), ``-l:<file>``, ``-L<dir>``, ``-Wl,<opt>``.

The gate builds ``kernel.cu`` into the shared library the harness loads and calls, so flags
that change what nvcc writes (``-o``, ``-cubin``, ``-rdc``), the target (``-arch``,
``-gencode``: the gate chooses it), or whether ``run`` stays loadable
(``-fvisibility=hidden``, ``-Wl,-z,undefs``) are refused when the file is read. A flag and its
value are one item (``-Xptxas=-v``, ``-I/opt/include``): the list is what nvcc receives.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from klineage.problem.errors import fail

COMPILE_OPTIONS_FILE = "compile_options.json"

# nvcc options that pick the output, the compilation mode or the target: the gate owns them.
_NVCC_OWNED = {
    "-o": "the gate names the output",
    "--output-file": "the gate names the output",
    "-c": "the gate links a shared library",
    "--compile": "the gate links a shared library",
    "-cubin": "the gate chooses the output kind",
    "-ptx": "the gate chooses the output kind",
    "-fatbin": "the gate chooses the output kind",
    "-optix-ir": "the gate chooses the output kind",
    "-E": "the gate compiles, not only preprocesses",
    "--preprocess": "the gate compiles, not only preprocesses",
    "-M": "dependency output replaces the build",
    "--generate-dependencies": "dependency output replaces the build",
    "-shared": "the gate already builds a shared library",
    "-lib": "the gate links a shared library",
    "-link": "the gate links a shared library",
    "-run": "the gate runs the kernel itself",
    "-dc": "relocatable device code needs a device link the gate does not do",
    "-dw": "relocatable device code needs a device link the gate does not do",
    "-rdc": "relocatable device code needs a device link the gate does not do",
    "--relocatable-device-code": "relocatable device code needs a device link the gate does not do",
    "-dlink": "the gate does not device-link",
    "-arch": "the gate chooses the target (Builder(arch=...), klineage gate --arch)",
    "--gpu-architecture": "the gate chooses the target (klineage gate --arch)",
    "-gencode": "the gate chooses the target (klineage gate --arch)",
    "--generate-code": "the gate chooses the target (klineage gate --arch)",
    "-code": "the gate chooses the target (klineage gate --arch)",
    "--gpu-code": "the gate chooses the target (klineage gate --arch)",
    "-keep": "the gate keeps nvcc's files where it reads the machine code",
    "-keep-dir": "the gate keeps nvcc's files where it reads the machine code",
    "-save-temps": "the gate keeps nvcc's files where it reads the machine code",
    "-Xcompiler": "host-compiler flags go in cflags",
    "--compiler-options": "host-compiler flags go in cflags",
    "-Xlinker": "linker flags go in ld_flags",
    "--linker-options": "linker flags go in ld_flags",
}
# Options whose value must come in the same item (the list is passed to nvcc as it is, so a
# value in the next item would be read as a flag of its own).
_NEEDS_VALUE = ("-Xptxas", "--ptxas-options", "-Xnvlink", "-I", "-isystem", "-D", "-U")
# Host-compiler flags that hide run() or make the library unloadable.
_HOST_OWNED = {
    "-fvisibility=hidden": "run() must stay a visible symbol",
    "-fno-PIC": "a shared library needs position-independent code",
    "-fno-pic": "a shared library needs position-independent code",
    "-c": "the gate links a shared library",
    "-o": "the gate names the output",
    "-E": "the gate compiles, not only preprocesses",
    "-shared": "the gate already builds a shared library",
    "-m32": "the harness loads 64-bit libraries",
}
# Linker options that would let a library with an unresolved symbol pass the build stage.
_LINK_CHECK_OFF = ("-z,undefs", "--unresolved-symbols", "--warn-unresolved-symbols")


class CompileOptions(BaseModel):
    """Extra compiler and linker flags for one problem's kernels (SOL-ExecBench's
    ``compile_options``), read from ``compile_options.json`` in the problem folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cflags: tuple[str, ...] = Field(
        default=(), description="host-compiler flags, e.g. -DNDEBUG (nvcc gets -Xcompiler)"
    )
    cuda_cflags: tuple[str, ...] = Field(
        default=(), description="nvcc flags, e.g. -DTILE=128, --use_fast_math, -Xptxas=-O3"
    )
    ld_flags: tuple[str, ...] = Field(
        default=(),
        description="linker flags: -l<lib> (-lcuda for cuTensorMapEncodeTiled, -lcublas), "
        "-l:<file>, -L<dir>, -Wl,<option>",
    )

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        """The folders of the ``-I`` and ``-isystem`` flags, in order: where a quoted
        ``#include`` not next to the kernel is found."""
        found = []
        for flag in self.cuda_cflags:
            for prefix in ("-isystem", "-I"):
                if flag.startswith(prefix):
                    folder = flag[len(prefix) :].lstrip("=")
                    if folder:
                        found.append(Path(folder))
                    break
        return tuple(found)

    @property
    def empty(self) -> bool:
        """True when no flag is given (the build is the gate's plain one)."""
        return not (self.cflags or self.cuda_cflags or self.ld_flags)

    @field_validator("cflags")
    @classmethod
    def _host_flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for index, flag in enumerate(flags):
            _one_flag(index, flag, "-DNDEBUG")
            if "," in flag:
                fail(
                    (index,),
                    f"{flag!r} holds a comma, which nvcc's -Xcompiler splits into two flags",
                    "one host flag without commas per item (linker options go in ld_flags)",
                )
            reason = _HOST_OWNED.get(flag)
            if reason is not None:
                fail((index,), f"{flag!r} is not allowed: {reason}", "another host flag")
        return flags

    @field_validator("cuda_cflags")
    @classmethod
    def _nvcc_flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for index, flag in enumerate(flags):
            _one_flag(index, flag, "--use_fast_math")
            name = flag.split("=", 1)[0]
            reason = _NVCC_OWNED.get(name) or _NVCC_OWNED.get(_short_m(name))
            if reason is not None:
                fail((index,), f"{flag!r} is not allowed: {reason}", "another nvcc flag")
            if flag in _NEEDS_VALUE:
                fail(
                    (index,),
                    f"{flag!r} has no value in the same item",
                    f"the flag and its value as one item, e.g. {flag}=VALUE"
                    if flag.startswith("-X") or flag.startswith("--")
                    else f"the flag and its value as one item, e.g. {flag}VALUE",
                )
            _absolute_dir(index, flag, ("-I", "-isystem"))
        return flags

    @field_validator("ld_flags")
    @classmethod
    def _link_flags(cls, flags: tuple[str, ...]) -> tuple[str, ...]:
        for index, flag in enumerate(flags):
            _one_flag(index, flag, "-lcuda")
            if not flag.startswith(("-l", "-L", "-Wl,")) or flag in ("-l", "-L", "-Wl,"):
                fail(
                    (index,),
                    f"{flag!r} is not a linker flag the gate passes on",
                    "-l<lib> (e.g. -lcuda, -lcublas), -l:<file>, -L<dir> or -Wl,<option>",
                )
            if any(off in flag for off in _LINK_CHECK_OFF):
                fail(
                    (index,),
                    f"{flag!r} is not allowed: it lets a library with an unresolved symbol "
                    "pass the build, to fail when the harness loads it",
                    "the library that defines the symbol (-l<lib>)",
                )
            _absolute_dir(index, flag, ("-L",))
        return flags


def _one_flag(index: int, flag: str, example: str) -> None:
    if not flag.startswith("-"):
        fail((index,), f"{flag!r} is not a flag", f"a flag starting with '-', e.g. {example}")
    if any(ch.isspace() for ch in flag):
        fail(
            (index,),
            f"{flag!r} holds whitespace",
            f"one flag per item, e.g. [{', '.join(repr(f) for f in flag.split())}]",
        )


def _short_m(name: str) -> str:
    """-MD, -MMD, -MF, -MT ... all write dependency files: they are -M's family."""
    return "-M" if name.startswith("-M") else name


def _absolute_dir(index: int, flag: str, prefixes: tuple[str, ...]) -> None:
    """A directory flag must be absolute: nvcc runs in a temporary build folder."""
    for prefix in sorted(prefixes, key=len, reverse=True):
        if flag.startswith(prefix):
            directory = flag[len(prefix) :].lstrip("=")
            if directory and not PurePosixPath(directory).is_absolute():
                fail(
                    (index,),
                    f"{flag!r} names a relative folder, but nvcc runs in a temporary build folder",
                    f"an absolute path, e.g. {prefix}/opt/mylib/include",
                )
            return
