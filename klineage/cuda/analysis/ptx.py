"""PTX written by hand: which instructions a kernel issues, however they are wrapped.

Expert kernels issue ``mma.sync``, ``ldmatrix``, ``cp.async``, ``wgmma`` and TMA copies as
inline assembly, directly, through a function-like macro (``#define LDMATRIX_X4(R0, ..., addr)
asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 ...")``), or through a small
``__device__`` wrapper (``load_async(...)``, ``warpgroup_arrive()``). A :class:`PtxSite` is a
place in the code that issues instructions by any of these routes, with the instructions
parsed into an opcode and a *set* of qualifiers, so ``.x4.m8n8`` and ``.m8n8.x4`` read the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import call_arguments, callee_name

__all__ = ["PtxInstruction", "PtxMacro", "PtxModel", "PtxSite", "parse_template"]

Family = Literal[
    "mma",
    "wgmma",
    "wgmma_sync",
    "ldmatrix",
    "stmatrix",
    "cp_async",
    "cp_async_commit",
    "cp_async_wait",
    "tma_load",
    "tma_store",
    "tma_sync",
    "mbarrier",
    "fence",
    "setmaxnreg",
    "other",
]
Via = Literal["asm", "macro", "helper"]

_STRING = re.compile(r'"((?:\\.|[^"\\])*)"')
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}
_ASM = re.compile(rb"\basm\b|\b__asm__\b")


@dataclass(frozen=True)
class PtxInstruction:
    """One PTX instruction of an asm template: ``mma.sync.aligned.m16n8k16.row.col...``."""

    text: str
    """The instruction as written, operands included, without the trailing ``;``."""
    head: str
    """The dotted name: ``ldmatrix.sync.aligned.x4.m8n8.shared.b16``."""
    qualifiers: frozenset[str]
    """The dotted parts after the first (``sync``, ``aligned``, ``x4``, ``m8n8``...)."""
    family: Family

    @property
    def opcode(self) -> str:
        """The instruction without its qualifiers (``mma`` of ``mma.sync.aligned...``)."""
        return self.head.split(".")[0]

    def has(self, *qualifiers: str) -> bool:
        """Whether every one of ``qualifiers`` is present, in any order."""
        return all(q in self.qualifiers for q in qualifiers)


@dataclass(frozen=True)
class PtxSite:
    """A statement or call that issues PTX instructions."""

    node: Node
    """The asm expression statement, or the call of the macro or the wrapper."""
    function: Function | None
    via: Via
    name: str
    """The macro's or the wrapper's name; ``asm`` for inline assembly."""
    instructions: tuple[PtxInstruction, ...]

    def families(self) -> set[str]:
        """The instruction families issued at this site."""
        return {i.family for i in self.instructions}


@dataclass(frozen=True)
class PtxMacro:
    """A function-like macro whose body is inline assembly (``#define CP_ASYNC_CG(dst, src,
    Bytes) asm volatile("cp.async.cg.shared.global [%0], [%1], %2;" :: ...)``)."""

    name: str
    params: tuple[str, ...]
    body: str
    """The replacement text, line continuations joined."""
    instructions: tuple[PtxInstruction, ...]

    def expand(self, args: list[str]) -> str | None:
        """The body with the parameters replaced by ``args`` (outside string literals);
        None for a wrong argument count or a body that stringifies or pastes tokens."""
        if len(args) != len(self.params) or "#" in _STRING.sub("", self.body):
            return None
        values = dict(zip(self.params, args, strict=True))
        pieces = []
        position = 0
        for literal in _STRING.finditer(self.body):
            pieces.append(_substitute(self.body[position : literal.start()], values))
            pieces.append(literal.group(0))
            position = literal.end()
        pieces.append(_substitute(self.body[position:], values))
        return "".join(pieces)


def _substitute(text: str, values: dict[str, str]) -> str:
    if not values:
        return text
    pattern = re.compile(r"\b(" + "|".join(re.escape(p) for p in values) + r")\b")
    return pattern.sub(lambda m: values[m.group(1)], text)


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _family(head: str, qualifiers: frozenset[str]) -> Family:
    opcode = head.split(".")[0]
    if opcode == "mma":
        return "mma"
    if opcode == "wgmma":
        return "wgmma" if "mma_async" in qualifiers else "wgmma_sync"
    if opcode in ("ldmatrix", "stmatrix", "setmaxnreg", "mbarrier"):
        return opcode  # type: ignore[return-value]
    if opcode == "fence":
        return "fence"
    if head.startswith("cp.async.bulk"):
        if "tensor" in qualifiers:
            parts = head.split(".")
            spaces = [p.split("::")[0] for p in parts if p.split("::")[0] in ("shared", "global")]
            return "tma_load" if spaces[:1] == ["shared"] else "tma_store"
        return (
            "tma_sync"
            if {"commit_group", "wait_group", "wait_group.read"} & qualifiers
            or ("wait_group" in head or "commit_group" in head)
            else "other"
        )
    if head.startswith("cp.async"):
        if "commit_group" in qualifiers:
            return "cp_async_commit"
        if "wait_group" in qualifiers or "wait_all" in qualifiers:
            return "cp_async_wait"
        return "cp_async"
    return "other"


def parse_template(template: str) -> tuple[PtxInstruction, ...]:
    """The instructions of an asm template (register declarations, labels and braces left
    out; a guard predicate ``@p`` dropped)."""
    found = []
    for raw in re.split(r"[;\n]", template):
        text = raw.strip().strip("{}").strip()
        if not text or text.startswith((".reg", "//", ".pred")) or text.endswith(":"):
            continue
        if text.startswith("@"):
            text = text.split(None, 1)[1] if " " in text else ""
        head = text.split(None, 1)[0] if text else ""
        if not head or not re.match(r"^[a-z]", head):
            continue
        qualifiers = frozenset(
            p for part in head.split(".")[1:] for p in (part, part.split("::")[0])
        )
        found.append(PtxInstruction(text, head, qualifiers, _family(head, qualifiers)))
    return tuple(found)


def _leading_strings(text: str) -> str:
    """The instruction template of ``asm volatile("a" "b" : ...)`` written as raw text: the
    string literals right after the opening parenthesis, concatenated."""
    match = re.search(r"\b(?:asm|__asm__)\b(?:\s+(?:volatile|__volatile__))?\s*\(", text)
    if match is None:
        return ""
    rest = text[match.end() :]
    pieces = []
    position = 0
    while True:
        skipped = re.match(r"(?:\s|\\\n)*", rest[position:])
        position += skipped.end() if skipped else 0
        literal = _STRING.match(rest, position)
        if literal is None:
            break
        pieces.append(_unescape(literal.group(1)))
        position = literal.end()
    return "".join(pieces)


class PtxModel:
    """Every place a source issues PTX, by inline asm, macro or device wrapper."""

    def __init__(self, source: ParsedSource) -> None:
        self.source = source
        self.macros: dict[str, PtxMacro] = {}
        self.helpers: dict[str, tuple[PtxInstruction, ...]] = {}
        self.sites: list[PtxSite] = []
        if _ASM.search(source.data) is None:
            return
        self._read_macros()
        direct = self._inline_sites() + self._macro_sites()
        self._read_helpers(direct)
        self.sites = sorted(direct + self._helper_sites(), key=lambda s: s.node.start_byte)

    # -- queries ----------------------------------------------------------------------------

    def sites_in(self, function: Function, *, via_helpers: bool = True) -> list[PtxSite]:
        """The PTX sites of ``function``: its own, and its helpers' unless ``via_helpers`` is
        False."""
        return [
            s
            for s in self.sites
            if s.function is not None
            and s.function.name == function.name
            and (via_helpers or s.via != "helper")
        ]

    def of_family(self, *families: str) -> list[PtxSite]:
        """Every site issuing an instruction of one of ``families``."""
        wanted = set(families)
        return [s for s in self.sites if s.families() & wanted]

    def issues(self, function: Function, *families: str) -> bool:
        """Whether ``function`` issues any instruction of ``families`` (through anything)."""
        wanted = set(families)
        return any(s.families() & wanted for s in self.sites_in(function))

    # -- reading ----------------------------------------------------------------------------

    def _read_macros(self) -> None:
        """Function-like macros of inline assembly; the first definition of a name wins (the
        branch of an ``#if`` a current toolkit takes comes first in the files seen so far)."""
        for holder, node in self.source.defines("preproc_function_def"):
            name = node.child_by_field_name("name")
            value = node.child_by_field_name("value")
            parameters = node.child_by_field_name("parameters")
            if name is None or value is None or holder.text_of(name) in self.macros:
                continue
            body = holder.text_of(value).replace("\\\n", " ")
            instructions = parse_template(_leading_strings(body))
            params = tuple(
                holder.text_of(p) for p in (parameters.named_children if parameters else [])
            )
            if instructions:
                text = holder.text_of(name)
                self.macros[text] = PtxMacro(text, params, body, instructions)

    def expand(self, call: Node, constants: dict[str, int]) -> str | None:
        """The statement a macro call stands for, its integer-constant arguments folded
        (``THREAD_COPY_BYTES`` -> ``16``) so the expansion reads on its own; None when the
        call is no assembly macro or does not expand."""
        callee = call.child_by_field_name("function")
        macro = self.macros.get(self.source.text_of(callee)) if callee is not None else None
        if macro is None:
            return None
        args = []
        for arg in call_arguments(call):
            text = " ".join(self.source.text_of(arg).split())
            args.append(str(constants[text]) if text in constants else text)
        expanded = macro.expand(args)
        return None if expanded is None else expanded.strip().rstrip(";") + ";"

    def _inline_sites(self) -> list[PtxSite]:
        found = []
        for asm in self.source.nodes("gnu_asm_expression"):
            statement = asm.parent if asm.parent is not None else asm
            instructions = parse_template(_leading_strings(self.source.text_of(asm)))
            if instructions:
                function = self.source.enclosing_function(asm)
                found.append(PtxSite(statement, function, "asm", "asm", instructions))
        return found

    def _macro_sites(self) -> list[PtxSite]:
        if not self.macros:
            return []
        found = []
        for call in self.source.calls:
            macro = self.macros.get(call.name)
            if macro is not None:
                instructions = macro.instructions
                function = self.source.enclosing_function(call.node)
                found.append(PtxSite(call.node, function, "macro", call.name, instructions))
        return found

    def _read_helpers(self, direct: list[PtxSite]) -> None:
        """Device functions that issue PTX, closed over calls (a wrapper of a wrapper)."""
        issued: dict[str, list[PtxInstruction]] = {}
        for site in direct:
            if (
                site.function is not None
                and site.function.runs_on_device
                and not site.function.is_kernel
            ):
                issued.setdefault(site.function.name, []).extend(site.instructions)
        changed = True
        while changed:
            changed = False
            for call in self.source.calls:
                function = self.source.enclosing_function(call.node)
                callee = callee_name(call.name)
                if function is None or callee not in issued or function.name == callee:
                    continue
                if not function.runs_on_device or function.is_kernel:
                    continue
                before = len(issued.get(function.name, []))
                merged = {i.text: i for i in issued.get(function.name, []) + issued[callee]}
                if len(merged) > before:
                    issued[function.name] = list(merged.values())
                    changed = True
        self.helpers = {name: tuple(found) for name, found in issued.items()}

    def _helper_sites(self) -> list[PtxSite]:
        found = []
        for call in self.source.calls:
            callee = callee_name(call.name)
            instructions = self.helpers.get(callee)
            if instructions is None or call.name in self.macros:
                continue
            function = self.source.enclosing_function(call.node)
            if function is not None and function.name != callee:
                found.append(PtxSite(call.node, function, "helper", callee, instructions))
        return found
