"""The source model: CUDA parsed with tree-sitter and queried by mechanisms.

Mechanisms never rewrite text with regular expressions. They ask a :class:`ParsedSource` for
functions, loops, declarations, calls, kernel launches and pragmas, then describe a rewrite as
byte-range splices (:mod:`klineage.cuda.edit`), applied in one go and re-parsed.

Two facts shape this module:

- **Offsets are bytes.** tree-sitter reports UTF-8 byte offsets and a kernel may hold
  non-ASCII text in comments, so everything here (nodes, edits, masks) works in bytes of the
  UTF-8 encoding of ``KernelSource.text``; :meth:`ParsedSource.text_of` decodes for display.
- **Real CUDA does not always parse.** tree-sitter-cuda 0.21 leaves ``ERROR`` nodes on a few
  common constructs (see :func:`mask_source`). The parser reads a *masked* copy of the source
  in which those constructs are overwritten with spaces of the same byte length (newlines
  kept), so every byte offset and line number is valid in the original text, and splices go
  into the original. What still fails to parse is reported as :attr:`ParsedSource.errors`;
  edits that touch such a region, or that add errors, are refused.

Parse once per kernel: ``KernelSource.parsed`` caches the :class:`ParsedSource`, and each query
below is computed once and cached, so detecting every mechanism on a 1,000-line file stays well
under the 200 ms budget.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Literal

import tree_sitter_cuda
from tree_sitter import Language, Node, Parser, Query, QueryCursor, Tree

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.macros import expand_macros
from klineage.headers import local_headers
from klineage.kernel import KernelSource
from klineage.limits import SOURCE_SNIPPET_SHOWN

DefineKind = Literal["preproc_def", "preproc_function_def"]
"""The two kinds of ``#define``: an object-like macro and one with parameters."""

__all__ = [
    "CUDA_FUNCTION_QUALIFIERS",
    "Call",
    "Declaration",
    "ErrorSpan",
    "Function",
    "Launch",
    "Loop",
    "Mask",
    "Node",
    "Param",
    "ParsedSource",
    "Pragma",
    "mask_source",
    "parse",
]

CUDA_FUNCTION_QUALIFIERS = frozenset(
    {"__global__", "__device__", "__host__", "__forceinline__", "__noinline__", "__inline__"}
)
"""Execution-space and inlining keywords; the grammar keeps them as anonymous tokens."""

LOOP_KINDS = ("for_statement", "for_range_loop", "while_statement", "do_statement")
_RESTRICT = frozenset({"__restrict__", "__restrict", "restrict"})


# ---------------------------------------------------------------------------------------------
# The parser (one per thread: tree-sitter parsers are not thread-safe)
# ---------------------------------------------------------------------------------------------


@cache
def _language() -> Language:
    return Language(tree_sitter_cuda.language())


_local = threading.local()


def _parser() -> Parser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = Parser(_language())
    return parser


@cache
def _query(kinds: tuple[str, ...]) -> Query:
    pattern = "[" + " ".join(f"({kind})" for kind in kinds) + "] @node"
    return Query(_language(), pattern)


# ---------------------------------------------------------------------------------------------
# Masking constructs the grammar cannot read
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mask:
    """A byte range of the source that the parser saw as spaces."""

    start_byte: int
    end_byte: int
    what: str
    """Why it was masked: ``__align__``, ``__maxnreg__``, ``_Pragma``, ``__cluster_dims__``,
    ``__launch_bounds__ extra argument``, ``extended lambda``, ``#if in parentheses`` or
    ``statement macro at file scope``."""


# `__align__(16)` (a parenthesized declarator to the grammar), `__maxnreg__(64)` and the
# `_Pragma("unroll")` operator leave ERROR or MISSING nodes; so does a third
# `__launch_bounds__` argument (max blocks per cluster, sm_90), and `__cluster_dims__(x, y, z)`
# between the return type and the name of a Hopper kernel. `alignas(16)` parses fine in
# tree-sitter-cuda 0.21, so it is left alone: its node is useful to mechanisms.
_MASKED_CALLS = re.compile(
    rb"\b(__align__|__maxnreg__|_Pragma|__launch_bounds__|__cluster_dims__)\s*\("
)
# Comments and literals are skipped so their parentheses do not count.
_LEXEMES = re.compile(
    rb'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[()]'
    rb"|^[ \t]*#[ \t]*(?:if|ifdef|ifndef|elif|else|endif)\b(?:[^\n]*\\\n)*[^\n]*",
    re.MULTILINE | re.DOTALL,
)
_MAX_MASKED_CALL = 400  # bytes; a longer "argument list" is not one of these attributes
# Extended lambdas, `[=] __device__ (float v) {...}`: the grammar has no place for the keyword.
_LAMBDA_SPACE = re.compile(
    rb"\]\s*((?:__host__|__device__)(?:\s+(?:__host__|__device__))?)\s*[(\{]"
)


def _blank(buffer: bytearray, start: int, end: int) -> None:
    """Overwrite [start, end) with spaces, keeping newlines so line numbers do not move."""
    for i in range(start, end):
        if buffer[i] not in (0x0A, 0x0D):
            buffer[i] = 0x20


def _closing_paren(
    data: bytes, open_at: int, limit: int = _MAX_MASKED_CALL
) -> tuple[int, list[int]] | None:
    """Index of the `)` matching data[open_at] == `(`, and the top-level comma positions.

    None when there is no match within `limit` bytes or a `;`, `{` or `}` comes first
    (an unbalanced attribute in a comment must not swallow code).
    """
    depth = 0
    commas: list[int] = []
    i = open_at
    limit = min(len(data), open_at + limit)
    while i < limit:
        ch = data[i]
        if ch in b'"':
            close = data.find(b'"', i + 1)
            if close < 0:
                return None
            i = close
        elif ch == 0x28:  # (
            depth += 1
        elif ch == 0x29:  # )
            depth -= 1
            if depth == 0:
                return i, commas
        elif ch == 0x2C and depth == 1:  # ,
            commas.append(i)
        elif ch in b";{}":
            return None
        i += 1
    return None


_FUNCTION_MACRO = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)\(", re.MULTILINE)
_MAX_MACRO_INVOCATION = 2000  # bytes of arguments; longer is not a binding line


def _statement_macro_masks(data: bytes) -> list[Mask]:
    """File-scope invocations of the file's own function-like macros written as statements
    without a semicolon (``TORCH_BINDING_REDUCE(f32, f32, ...)`` on a line of its own, which
    defines a host function): the grammar reads the whole translation unit as one ERROR
    around them. Only lines that start with the name and end at its ``)``."""
    names = {m.group(1) for m in _FUNCTION_MACRO.finditer(data)}
    if not names:
        return []
    pattern = re.compile(rb"^(" + b"|".join(re.escape(n) for n in names) + rb")[ \t]*\(", re.M)
    masks = []
    for match in pattern.finditer(data):
        found = _closing_paren(data, match.end() - 1, _MAX_MACRO_INVOCATION)
        if found is None:
            continue
        close = found[0]
        end = data.find(b"\n", close + 1)
        rest = data[close + 1 : end if end >= 0 else len(data)].strip()
        after = data[close + 1 :].lstrip()[:1]  # a function body on the next line
        if (rest and not rest.startswith(b"//")) or after == b"{":
            continue
        masks.append(Mask(match.start(), close + 1, "statement macro at file scope"))
    return masks


def mask_source(data: bytes) -> tuple[bytes, tuple[Mask, ...]]:
    """A copy of ``data`` with constructs tree-sitter-cuda cannot parse blanked out.

    The copy has the same length and the same newlines, so nodes of its tree index the
    original bytes. Masked: ``__align__(n)``, ``__maxnreg__(n)``, ``_Pragma("...")``,
    ``__cluster_dims__(x, y, z)``, the
    arguments of ``__launch_bounds__`` after the second, the execution space of an extended
    lambda (``[] __device__ (float v) {...}``), preprocessor conditionals
    (``#if``/``#else``/``#endif``...) inside parentheses, such as an ``#if`` in an argument
    list (both branches are then parsed as one), and file-scope lines that invoke one of the
    file's function-like macros without a semicolon (:func:`_statement_macro_masks`).
    """
    masks: list[Mask] = []
    if (
        b"__align__" in data
        or b"__maxnreg__" in data
        or b"_Pragma" in data
        or b"__launch_b" in data
        or b"__cluster_dims__" in data
    ):
        for match in _MASKED_CALLS.finditer(data):
            found = _closing_paren(data, match.end() - 1)
            if found is None:
                continue
            close, commas = found
            word = match.group(1).decode()
            if word != "__launch_bounds__":
                masks.append(Mask(match.start(), close + 1, word))
            elif len(commas) >= 2:
                masks.append(Mask(commas[1], close, "__launch_bounds__ extra argument"))
    if b"] __" in data or b"]__" in data:
        for match in _LAMBDA_SPACE.finditer(data):
            masks.append(Mask(match.start(1), match.end(1), "extended lambda"))
    if b"#if" in data or b"# if" in data:
        depth = 0
        for match in _LEXEMES.finditer(data):
            token = match.group()
            if token == b"(":
                depth += 1
            elif token == b")":
                depth = max(0, depth - 1)
            elif token.lstrip()[:1] == b"#" and depth > 0:
                masks.append(Mask(match.start(), match.end(), "#if in parentheses"))
    masks += _statement_macro_masks(data)
    if not masks:
        return data, ()
    buffer = bytearray(data)
    for mask in masks:
        _blank(buffer, mask.start_byte, mask.end_byte)
    masks.sort(key=lambda m: m.start_byte)
    return bytes(buffer), tuple(masks)


# ---------------------------------------------------------------------------------------------
# What the queries return
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorSpan:
    """A region the parser could not read: an ERROR node, or a MISSING token (zero width)."""

    start_byte: int
    end_byte: int
    line: int
    missing: bool
    """True for a token the parser had to invent (such as a missing `;`)."""

    def touches(self, start: int, end: int) -> bool:
        """Whether an edit of [start, end) overlaps this span (an insertion: lies inside it)."""
        if self.missing or self.start_byte == self.end_byte:
            return start <= self.start_byte <= end
        if start == end:
            return self.start_byte < start < self.end_byte
        return start < self.end_byte and self.start_byte < end


@dataclass(frozen=True)
class Param:
    """One parameter of a function."""

    node: Node
    """The ``parameter_declaration`` (or ``optional_parameter_declaration``) node."""
    name: str | None
    """The parameter name; None when it has none (a prototype)."""
    type: str
    """The declared type with the name left out, spaces normalized: ``const float*``."""
    base_type: str
    """The type without qualifiers and pointers: ``float``."""
    pointer_depth: int
    """0 for a value, 1 for ``T*``, 2 for ``T**``; references count 0."""
    is_const: bool
    """Whether the (pointed-to) base type is const: ``const float* x`` is."""
    restrict: tuple[Node, ...]
    """The ``__restrict__`` qualifier nodes on the pointer (usually zero or one)."""
    pointer: Node | None
    """The outermost ``pointer_declarator``, for pointers."""

    @property
    def is_pointer(self) -> bool:
        """Whether the parameter is a pointer."""
        return self.pointer_depth > 0


@dataclass(frozen=True)
class Function:
    """A function definition (a kernel, a device function, a host function such as ``run``)."""

    node: Node
    """The ``function_definition`` node."""
    outer: Node
    """The node spanning the whole definition: a ``template_declaration`` around it, or the
    ``linkage_specification`` of ``extern "C" int run(...)``, or ``node`` itself."""
    name: str
    qualifiers: tuple[str, ...]
    """Keywords before the return type, in order: ``__global__``, ``static``, ``inline``..."""
    template: Node | None
    """The ``template_parameter_list``, for a function template."""
    template_params: tuple[str, ...]
    """Names of the template parameters, in order."""
    extern_c: bool
    """True for ``extern "C"`` functions (the ABI's ``run``)."""
    params: tuple[Param, ...]
    declarator: Node
    """The ``function_declarator`` (name and parameter list)."""
    body: Node | None
    """The ``compound_statement`` body."""
    launch_bounds: Node | None
    """The ``launch_bounds`` node, when the function has ``__launch_bounds__(...)``."""

    @property
    def is_kernel(self) -> bool:
        """A ``__global__`` function."""
        return "__global__" in self.qualifiers

    @property
    def runs_on_device(self) -> bool:
        """A kernel or a ``__device__`` function (possibly also ``__host__``)."""
        return "__global__" in self.qualifiers or "__device__" in self.qualifiers

    @property
    def device_only(self) -> bool:
        """Code that never runs on the host, so device intrinsics are always allowed."""
        return self.runs_on_device and "__host__" not in self.qualifiers

    def param(self, name: str) -> Param | None:
        """The parameter called `name`, or None."""
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True)
class Loop:
    """A ``for``, range-``for``, ``while`` or ``do`` loop."""

    node: Node
    kind: Literal["for", "for_range", "while", "do"]
    initializer: Node | None
    condition: Node | None
    update: Node | None
    body: Node | None
    variable: str | None
    """The induction variable declared in a ``for`` initializer (or range-for), if any."""


@dataclass(frozen=True)
class Declaration:
    """A declaration statement: locals, ``__shared__`` arrays, file-scope constants."""

    node: Node
    type: str
    """The type specifier text (``float``, ``float4``, ``int64_t``)."""
    qualifiers: tuple[str, ...]
    """``const``, ``constexpr``, ``__shared__``, ``static``, ``extern``..."""
    names: tuple[str, ...]
    declarators: tuple[Node, ...]
    """One per declared name (``init_declarator``, ``array_declarator``, ``identifier``...)."""

    @property
    def is_shared(self) -> bool:
        """Whether it declares `__shared__` memory."""
        return "__shared__" in self.qualifiers

    @property
    def is_extern(self) -> bool:
        """Whether it is `extern` (dynamic shared memory)."""
        return "extern" in self.qualifiers


@dataclass(frozen=True)
class Call:
    """A call that is not a kernel launch: ``__expf(x)``, ``block_reduce<true>(m, s)``."""

    node: Node
    name: str
    """The callee as written, template arguments left out: ``__ldg``, ``wmma::mma_sync``."""
    template_args: Node | None
    args: tuple[Node, ...]
    """The argument expressions."""


@dataclass(frozen=True)
class Launch:
    """A kernel launch ``kernel<T...><<<grid, block, smem, stream>>>(args)``."""

    node: Node
    """The ``call_expression`` node."""
    kernel: str
    template_args: tuple[Node, ...]
    config: tuple[Node, ...]
    """The launch configuration expressions, between ``<<<`` and ``>>>``."""
    args: tuple[Node, ...]

    @property
    def grid(self) -> Node | None:
        """The grid size expression (`<<<grid, ...>>>`), or None."""
        return self.config[0] if self.config else None

    @property
    def block(self) -> Node | None:
        """The block size expression, or None."""
        return self.config[1] if len(self.config) > 1 else None

    @property
    def shared_memory(self) -> Node | None:
        """The dynamic shared memory expression, or None."""
        return self.config[2] if len(self.config) > 2 else None

    @property
    def stream(self) -> Node | None:
        """The stream expression, or None."""
        return self.config[3] if len(self.config) > 3 else None


@dataclass(frozen=True)
class Pragma:
    """A ``#pragma`` line."""

    node: Node
    """The ``preproc_call`` node; it ends after the line's newline."""
    text: str
    """What follows ``#pragma``: ``unroll 4``."""
    name: str
    """The first word: ``unroll``."""
    argument: str
    """The rest, stripped: ``4`` (empty when there is none)."""
    target: Node | None
    """The next statement in the same block (the loop a ``#pragma unroll`` applies to)."""


# ---------------------------------------------------------------------------------------------
# The parsed source
# ---------------------------------------------------------------------------------------------


def _normalize_space(text: str) -> str:
    return " ".join(text.split())


def _collapse_type(text: str) -> str:
    """``const  float *`` -> ``const float*``."""
    text = _normalize_space(text)
    text = re.sub(r"\s*([*&])\s*", r"\1 ", text).replace("* *", "**").strip()
    return re.sub(r"\s+\)", ")", text)


class ParsedSource:
    """A kernel parsed with tree-sitter-cuda, with cached structural queries.

    Build one with :func:`parse` or ``KernelSource.parsed``. Nodes come from the parse of the
    masked copy (:func:`mask_source`); their byte offsets index :attr:`data`, the UTF-8 bytes
    of the original text. Use :meth:`text_of` for a node's original text.
    """

    def __init__(self, kernel: KernelSource) -> None:
        self.kernel = kernel
        self.data: bytes = kernel.text.encode("utf-8")
        self.masked, self.masks = mask_source(self.data)
        self.tree: Tree = _parser().parse(self.masked)
        self.root: Node = self.tree.root_node
        self._kind_cache: dict[str, list[Node]] = {}

    def __repr__(self) -> str:
        return f"ParsedSource({self.kernel.name!r}, errors={len(self.errors)})"

    # -- text and positions -----------------------------------------------------------------

    @cached_property
    def _line_starts(self) -> list[int]:
        starts = [0]
        find = self.data.find
        pos = find(b"\n")
        while pos >= 0:
            starts.append(pos + 1)
            pos = find(b"\n", pos + 1)
        return starts

    def line_of(self, byte: int) -> int:
        """The 1-based line holding ``byte``."""
        return bisect.bisect_right(self._line_starts, byte)

    def line_start(self, byte: int) -> int:
        """The byte offset where the line holding ``byte`` begins."""
        return self._line_starts[self.line_of(byte) - 1]

    def line_range(self, node: Node) -> tuple[int, int]:
        """First and last 1-based line of a node (a node ending in a newline ends before it)."""
        end = max(node.start_byte, node.end_byte - 1)
        return self.line_of(node.start_byte), self.line_of(end)

    def indent_of(self, byte: int) -> str:
        """The whitespace that begins the line holding ``byte``."""
        start = self.line_start(byte)
        end = start
        while end < len(self.data) and self.data[end] in b" \t":
            end += 1
        return self.data[start:end].decode()

    def starts_line(self, byte: int) -> bool:
        """Whether only whitespace precedes ``byte`` on its line."""
        return not self.data[self.line_start(byte) : byte].strip()

    def text_of(self, node: Node | tuple[int, int]) -> str:
        """The original text of a node (or of a ``(start_byte, end_byte)`` range)."""
        start, end = (node.start_byte, node.end_byte) if isinstance(node, Node) else node
        return self.data[start:end].decode("utf-8", errors="replace")

    def snippet(self, node: Node | tuple[int, int], limit: int = SOURCE_SNIPPET_SHOWN) -> str:
        """A node's text on one line, whitespace collapsed, cut at ``limit`` characters."""
        text = _normalize_space(self.text_of(node))
        return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."

    def header(self, node: Node) -> str:
        """A loop's or branch's text up to its body, on one line (``for (int i = 0; i < n;
        ++i)``): what a site shows of a statement whose body is long."""
        body = node.child_by_field_name("body")
        end = body.start_byte if body is not None else node.end_byte
        return self.snippet((node.start_byte, end)).rstrip(" {")

    # -- edits that keep the layout tidy -----------------------------------------------------

    def deletion(
        self,
        node: Node | tuple[int, int],
        *,
        spaces: Literal["after", "before", "none"] = "after",
        whole_line: bool = False,
        comment: bool = False,
    ) -> Edit:
        """An edit deleting a node with the blanks next to it.

        ``spaces="after"`` also deletes the spaces and tabs that follow (``__restrict__ x``
        -> ``x``), ``"before"`` those that precede (``void __launch_bounds__(256)`` ->
        ``void``). With ``whole_line``, a node alone on its line is deleted with the line
        (indentation and newline included), as for a ``#pragma`` line; with ``comment`` too,
        a ``//`` comment after it on its last line goes with it (it spoke of the node).
        """
        start, end = (node.start_byte, node.end_byte) if isinstance(node, Node) else node
        data = self.data
        if whole_line and self.starts_line(start):
            line_end = data.find(b"\n", max(start, end - 1))
            rest = data[end : line_end if line_end >= 0 else len(data)]
            if not rest.strip() or (comment and rest.strip().startswith(b"//")):
                stop = len(data) if line_end < 0 else line_end + 1
                return Edit(self.line_start(start), max(stop, end), "")
        if spaces == "after":
            while end < len(data) and data[end] in b" \t":
                end += 1
        elif spaces == "before":
            while start > 0 and data[start - 1] in b" \t":
                start -= 1
        return Edit(start, end, "")

    def line_insertion(self, node: Node, line: str) -> Edit:
        """An edit putting ``line`` on a line of its own just before ``node``, indented
        like it (``#pragma unroll`` before a loop)."""
        indent = self.indent_of(node.start_byte)
        if self.starts_line(node.start_byte):
            return Edit.insert(node.start_byte, f"{line}\n{indent}")
        return Edit.insert(node.start_byte, f"\n{indent}{line}\n{indent}")

    # -- nodes ------------------------------------------------------------------------------

    def nodes(self, kind: str) -> list[Node]:
        """Every node of one kind, in document order (cached)."""
        found = self._kind_cache.get(kind)
        if found is None:
            captured = QueryCursor(_query((kind,))).captures(self.root).get("node", [])
            found = sorted(captured, key=lambda n: (n.start_byte, -n.end_byte))
            self._kind_cache[kind] = found
        return found

    @cached_property
    def headers(self) -> tuple[ParsedSource, ...]:
        """The local headers the kernel includes (:mod:`klineage.headers`), parsed:
        read for their definitions, never edited."""
        return tuple(header.parsed for header in local_headers(self.kernel))

    @cached_property
    def macro_expanded(self) -> ParsedSource | None:
        """The file with its macros (and its local headers' macros) expanded, parsed: a
        view to read instantiations from that only macros write (a kernel launched from a
        binding macro that pastes its name), never to edit. None when nothing is defined."""
        text = expand_macros(self.kernel.text, [h.kernel.text for h in self.headers])
        if text is None:
            return None
        return KernelSource(text, name=self.kernel.name).parsed

    def defines(self, kind: DefineKind) -> list[tuple[ParsedSource, Node]]:
        """Every ``#define`` of one kind (``preproc_def``, or ``preproc_function_def`` for a
        macro with parameters) with the source that holds it: the file's own first, in order,
        then those of its local headers. Read a node's text through its source."""
        found = [(self, node) for node in self.nodes(kind)]
        for header in self.headers:
            found += [(header, node) for node in header.nodes(kind)]
        return found

    def iter_nodes(self, *kinds: str, within: Node | None = None) -> Iterator[Node]:
        """Nodes of the given kinds in document order, optionally only those inside ``within``."""
        merged: list[Node] = []
        for kind in kinds:
            merged.extend(self.nodes(kind))
        if len(kinds) > 1:
            merged.sort(key=lambda n: (n.start_byte, -n.end_byte))
        for node in merged:
            if within is None or (
                within.start_byte <= node.start_byte and node.end_byte <= within.end_byte
            ):
                yield node

    @staticmethod
    def ancestor(node: Node, *kinds: str) -> Node | None:
        """The nearest proper ancestor of one of the given kinds."""
        parent = node.parent
        while parent is not None:
            if parent.type in kinds:
                return parent
            parent = parent.parent
        return None

    # -- errors -----------------------------------------------------------------------------

    @cached_property
    def errors(self) -> tuple[ErrorSpan, ...]:
        """Regions the parser could not read, in document order (empty for a clean parse)."""
        if not self.root.has_error:
            return ()
        spans = [
            ErrorSpan(n.start_byte, n.end_byte, self.line_of(n.start_byte), n.is_missing)
            for kind in ("ERROR", "MISSING")
            for n in QueryCursor(_query((kind,))).captures(self.root).get("node", [])
        ]
        # Nested ERROR nodes describe one region; keep the outermost.
        spans.sort(key=lambda s: (s.start_byte, -s.end_byte))
        kept: list[ErrorSpan] = []
        for span in spans:
            if kept and not span.missing and not kept[-1].missing:
                last = kept[-1]
                if last.start_byte <= span.start_byte and span.end_byte <= last.end_byte:
                    continue
            kept.append(span)
        return tuple(kept)

    def error_touching(self, start: int, end: int) -> ErrorSpan | None:
        """The first error region an edit of [start, end) would touch, if any."""
        return next((e for e in self.errors if e.touches(start, end)), None)

    # -- functions --------------------------------------------------------------------------

    @cached_property
    def functions(self) -> tuple[Function, ...]:
        """Every function definition with a body, in document order."""
        found = []
        for node in self.nodes("function_definition"):
            function = self._function(node)
            if function is not None:
                found.append(function)
        return tuple(found)

    def function(self, name: str) -> Function | None:
        """The first function called ``name``."""
        return next((f for f in self.functions if f.name == name), None)

    @cached_property
    def kernels(self) -> tuple[Function, ...]:
        """The ``__global__`` functions."""
        return tuple(f for f in self.functions if f.is_kernel)

    @cached_property
    def _function_starts(self) -> list[int]:
        return [f.node.start_byte for f in self.functions]

    def enclosing_function(self, node: Node | int) -> Function | None:
        """The innermost function definition containing a node (or a byte offset)."""
        start = node if isinstance(node, int) else node.start_byte
        end = start if isinstance(node, int) else node.end_byte
        index = bisect.bisect_right(self._function_starts, start) - 1
        while index >= 0:
            function = self.functions[index]
            if function.node.start_byte <= start and end <= function.node.end_byte:
                return function
            index -= 1
        return None

    def _function(self, node: Node) -> Function | None:
        declarator = node.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        if declarator is None:
            return None
        name_node = declarator.child_by_field_name("declarator")
        name = self.text_of(name_node) if name_node is not None else "?"
        qualifiers: list[str] = []
        launch_bounds = None
        for child in node.children:
            if child.type == "launch_bounds":
                launch_bounds = child
            elif child.type in ("storage_class_specifier", "type_qualifier"):
                qualifiers.append(self.text_of(child))
            elif not child.is_named and child.type in CUDA_FUNCTION_QUALIFIERS:
                qualifiers.append(child.type)
            elif child == declarator or child.type == "compound_statement":
                break
        outer = node
        template = None
        template_params: tuple[str, ...] = ()
        parent = node.parent
        if parent is not None and parent.type == "template_declaration":
            outer = parent
            template = parent.child_by_field_name("parameters")
            if template is not None:
                template_params = tuple(self._template_param_names(template))
        extern_c = False
        for candidate in (outer.parent, outer.parent.parent if outer.parent else None):
            if candidate is not None and candidate.type == "linkage_specification":
                value = candidate.child_by_field_name("value")
                extern_c = value is not None and self.text_of(value) == '"C"'
                if candidate.child_by_field_name("body") == outer:
                    outer = candidate
                break
        params_node = declarator.child_by_field_name("parameters")
        params = tuple(
            self._param(p)
            for p in (params_node.named_children if params_node is not None else [])
            if p.type in ("parameter_declaration", "optional_parameter_declaration")
        )
        return Function(
            node=node,
            outer=outer,
            name=name,
            qualifiers=tuple(qualifiers),
            template=template,
            template_params=template_params,
            extern_c=extern_c,
            params=params,
            declarator=declarator,
            body=node.child_by_field_name("body"),
            launch_bounds=launch_bounds,
        )

    def _template_param_names(self, params: Node) -> Iterator[str]:
        for child in params.named_children:
            declarator = child.child_by_field_name("declarator")
            if declarator is not None:
                yield self.text_of(declarator)
                continue
            ident = next(
                (c for c in child.named_children if c.type in ("type_identifier", "identifier")),
                None,
            )
            yield self.text_of(ident) if ident is not None else "?"

    def _param(self, node: Node) -> Param:
        type_node = node.child_by_field_name("type")
        base_type = self.text_of(type_node) if type_node is not None else ""
        is_const = any(
            c.type == "type_qualifier" and self.text_of(c) == "const" for c in node.children
        )
        declarator = node.child_by_field_name("declarator")
        depth = 0
        restrict: list[Node] = []
        pointer = None
        plain = True  # only pointer declarators around the name
        current = declarator
        while current is not None and current.type not in ("identifier", "field_identifier"):
            if current.type in ("pointer_declarator", "abstract_pointer_declarator"):
                pointer = pointer or current
                depth += 1
                if depth == 1:
                    restrict.extend(
                        c
                        for c in current.children
                        if c.type == "type_qualifier" and self.text_of(c) in _RESTRICT
                    )
            else:
                plain = False
            current = _inner_declarator(current)
        name = self.text_of(current) if current is not None else None
        if plain or current is None:
            end = declarator.start_byte if declarator is not None else node.end_byte
            type_text = self.text_of((node.start_byte, end)) + "*" * depth
        else:  # `float4 (&v)[kVec]`, `float& r`: the declaration with the name left out
            type_text = self.text_of((node.start_byte, current.start_byte)) + self.text_of(
                (current.end_byte, node.end_byte)
            )
        return Param(
            node=node,
            name=name,
            type=_collapse_type(type_text),
            base_type=base_type,
            pointer_depth=depth if plain else 0,
            is_const=is_const,
            restrict=tuple(restrict),
            pointer=pointer if plain else None,
        )

    # -- loops, declarations, calls, launches, pragmas --------------------------------------

    @cached_property
    def loops(self) -> tuple[Loop, ...]:
        """Every loop, in document order (outer loops before the loops they contain)."""
        found = []
        for node in self.iter_nodes(*LOOP_KINDS):
            kind = {
                "for_statement": "for",
                "for_range_loop": "for_range",
                "while_statement": "while",
                "do_statement": "do",
            }[node.type]
            initializer = node.child_by_field_name("initializer")
            variable = None
            if kind == "for" and initializer is not None and initializer.type == "declaration":
                names = self._declared_names(initializer)
                variable = names[0][0] if names else None
            elif kind == "for_range":
                decl = node.child_by_field_name("declarator")
                variable = self.text_of(decl) if decl is not None else None
            found.append(
                Loop(
                    node=node,
                    kind=kind,  # type: ignore[arg-type]
                    initializer=initializer,
                    condition=node.child_by_field_name("condition"),
                    update=node.child_by_field_name("update"),
                    body=node.child_by_field_name("body"),
                    variable=variable,
                )
            )
        return tuple(found)

    def loop_at(self, node: Node) -> Loop | None:
        """The loop whose node is `node`, or None."""
        return next((loop for loop in self.loops if loop.node == node), None)

    def _declared_names(self, node: Node) -> list[tuple[str, Node]]:
        found = []
        for declarator in node.children_by_field_name("declarator"):
            current: Node | None = declarator
            while current is not None and current.type not in ("identifier", "field_identifier"):
                current = _inner_declarator(current)
            if current is not None:
                found.append((self.text_of(current), declarator))
        return found

    @cached_property
    def declarations(self) -> tuple[Declaration, ...]:
        """Every declaration statement (locals, ``__shared__`` arrays, file-scope constants)."""
        found = []
        for node in self.nodes("declaration"):
            type_node = node.child_by_field_name("type")
            qualifiers = tuple(
                self.text_of(c)
                for c in node.children
                if c.type in ("type_qualifier", "storage_class_specifier")
            )
            names = self._declared_names(node)
            found.append(
                Declaration(
                    node=node,
                    type=self.text_of(type_node) if type_node is not None else "",
                    qualifiers=qualifiers,
                    names=tuple(n for n, _ in names),
                    declarators=tuple(d for _, d in names),
                )
            )
        return tuple(found)

    @cached_property
    def shared_declarations(self) -> tuple[Declaration, ...]:
        """The ``__shared__`` declarations (static and ``extern`` dynamic)."""
        return tuple(d for d in self.declarations if d.is_shared)

    @cached_property
    def _calls_and_launches(self) -> tuple[tuple[Call, ...], tuple[Launch, ...]]:
        calls: list[Call] = []
        launches: list[Launch] = []
        for node in self.nodes("call_expression"):
            function = node.child_by_field_name("function")
            arguments = node.child_by_field_name("arguments")
            args = tuple(
                c for c in (arguments.named_children if arguments else []) if c.type != "comment"
            )
            template_args: Node | None = None
            name_node = function
            if function is not None and function.type == "template_function":
                name_node = function.child_by_field_name("name")
                template_args = function.child_by_field_name("arguments")
            name = self.text_of(name_node) if name_node is not None else ""
            config = next((c for c in node.children if c.type == "kernel_call_syntax"), None)
            if config is not None and template_args is None:
                alias = self._kernel_alias(node, name)
                if alias is not None:
                    name, template_args = alias
            if config is not None:
                launches.append(
                    Launch(
                        node=node,
                        kernel=name,
                        template_args=tuple(
                            c for c in (template_args.named_children if template_args else [])
                        ),
                        config=tuple(c for c in config.named_children if c.type != "comment"),
                        args=args,
                    )
                )
            else:
                calls.append(Call(node=node, name=name, template_args=template_args, args=args))
        return tuple(calls), tuple(launches)

    def _kernel_alias(self, launch: Node, name: str) -> tuple[str, Node | None] | None:
        """(kernel, template arguments) that a launch through a local pointer starts:
        ``auto* k = kernel<128, 3>; k<<<grid, block>>>(...)`` (also ``auto k = &kernel<...>``),
        where the pointer is declared once in the launching function and never reassigned;
        None for any other launch."""
        if any(f.name == name for f in self.functions):
            return None
        caller = self.enclosing_function(launch)
        if caller is None or caller.body is None:
            return None
        found = [
            declarator
            for decl in self.declarations
            if decl.type == "auto" and within(decl.node, caller.body)
            for declared, declarator in zip(decl.names, decl.declarators, strict=True)
            if declared == name
        ]
        if len(found) != 1 or found[0].type != "init_declarator":
            return None
        value = found[0].child_by_field_name("value")
        if value is not None and value.type == "pointer_expression":
            value = value.child_by_field_name("argument")
        if value is None or value.type not in ("template_function", "identifier"):
            return None
        kernel_node = (
            value.child_by_field_name("name") if value.type == "template_function" else value
        )
        kernel = self.text_of(kernel_node) if kernel_node is not None else ""
        if not any(k.name == kernel.rsplit("::", 1)[-1] for k in self.kernels):
            return None
        for assignment in self.iter_nodes("assignment_expression", within=caller.body):
            left = assignment.child_by_field_name("left")
            if left is not None and self.text_of(left) == name:
                return None  # a pointer that is re-pointed: not followed
        arguments = value.child_by_field_name("arguments") if value.type != "identifier" else None
        return kernel, arguments

    @property
    def calls(self) -> tuple[Call, ...]:
        """Every call that is not a kernel launch, in document order."""
        return self._calls_and_launches[0]

    def calls_named(self, *names: str) -> list[Call]:
        """The calls to any of ``names`` (as written, without template arguments)."""
        wanted = set(names)
        return [c for c in self.calls if c.name in wanted]

    @property
    def launches(self) -> tuple[Launch, ...]:
        """Every kernel launch ``k<<<...>>>(...)``, in document order."""
        return self._calls_and_launches[1]

    def launches_of(self, kernel: str | Function) -> list[Launch]:
        """The launches of ``kernel``: of that function where a :class:`Function` is given
        (a launch names it as its namespace resolves the name: a launch-size dispatch holds a
        kernel of the same name in each variant's namespace), else of any kernel so named
        (qualified or not)."""
        name = kernel if isinstance(kernel, str) else kernel.name
        named = [launch for launch in self.launches if launch.kernel.rsplit("::", 1)[-1] == name]
        if isinstance(kernel, str):
            return named
        where = self.namespace_of(kernel.node)
        return [launch for launch in named if self._launched_namespace(launch) == where]

    def namespace_of(self, node: Node) -> str:
        """The namespaces around ``node``, outermost first, joined by ``::`` ('' at file
        scope; an anonymous namespace counts as none)."""
        names: list[str] = []
        parent = node.parent
        while parent is not None:
            if parent.type == "namespace_definition":
                name = parent.child_by_field_name("name")
                if name is not None:
                    names.append(self.text_of(name))
            parent = parent.parent
        return "::".join(reversed(names))

    @cached_property
    def _kernel_namespaces(self) -> dict[str, frozenset[str]]:
        """Kernel name -> the namespaces that define a kernel of that name."""
        found: dict[str, set[str]] = {}
        for kernel in self.kernels:
            found.setdefault(kernel.name, set()).add(self.namespace_of(kernel.node))
        return {name: frozenset(spaces) for name, spaces in found.items()}

    def _launched_namespace(self, launch: Launch) -> str:
        """The namespace of the kernel a launch starts: the one it names (``ns::k``), else the
        innermost around the launch that defines a kernel of that name, else file scope."""
        qualifier, _, name = launch.kernel.rpartition("::")
        if qualifier:
            return qualifier.removeprefix("::")
        around = self.namespace_of(launch.node)
        defined = self._kernel_namespaces.get(name, frozenset())
        while around:
            if around in defined:
                return around
            around = around.rpartition("::")[0]
        if "" not in defined and len(defined) == 1:
            return next(iter(defined))  # `using namespace ns;` before the launch
        return ""

    @cached_property
    def pragmas(self) -> tuple[Pragma, ...]:
        """Every ``#pragma`` line, with the statement it precedes."""
        found = []
        for node in self.nodes("preproc_call"):
            directive = node.child_by_field_name("directive")
            if directive is None or self.text_of(directive).replace(" ", "") != "#pragma":
                continue
            argument = node.child_by_field_name("argument")
            text = self.text_of(argument).strip() if argument is not None else ""
            name, _, rest = text.partition(" ")
            if "(" in name:  # `#pragma unroll(4)`
                name, _, paren = name.partition("(")
                rest = "(" + paren + (" " + rest if rest else "")
            target = node.next_named_sibling
            while target is not None and target.type == "comment":
                target = target.next_named_sibling
            found.append(
                Pragma(node=node, text=text, name=name, argument=rest.strip(), target=target)
            )
        return tuple(found)

    def pragma_before(self, node: Node, name: str | None = None) -> Pragma | None:
        """The ``#pragma`` (optionally only one called ``name``) directly before a statement."""
        for pragma in self.pragmas:
            if pragma.target == node and (name is None or pragma.name == name):
                return pragma
        return None

    # -- names and types --------------------------------------------------------------------

    def local_types(self, function: Function) -> dict[str, str]:
        """Name -> declared type for a function's parameters and local declarations.

        Types read like :attr:`Param.type` (``const float*``). Shadowing is ignored: a name
        declared twice keeps its first type, which is right for the usual kernel.
        """
        types: dict[str, str] = {}
        for param in function.params:
            if param.name:
                types.setdefault(param.name, param.type)
        if function.body is None:
            return types
        for decl in self.iter_nodes("declaration", within=function.body):
            for name, declarator in self._declared_names(decl):
                type_node = decl.child_by_field_name("type")
                if type_node is None:
                    continue
                prefix = self.text_of((decl.start_byte, type_node.end_byte))
                stars, arrays = self._declarator_shape(declarator)
                types.setdefault(name, _collapse_type(prefix + "*" * stars) + "[]" * arrays)
        return types

    @staticmethod
    def _declarator_shape(declarator: Node) -> tuple[int, int]:
        """(pointer levels, array dimensions) of a declarator."""
        pointers = arrays = 0
        current: Node | None = declarator
        while current is not None:
            if current.type == "pointer_declarator":
                pointers += 1
            elif current.type == "array_declarator":
                arrays += 1
            current = _inner_declarator(current)
        return pointers, arrays

    @cached_property
    def integer_constants(self) -> dict[str, int]:
        """File-scope integer constants: ``constexpr int k = 256;``, ``#define K 256``.

        Values are folded with the constants defined before them, those of the local headers
        included first; a constant whose value cannot be folded is left out.
        """
        constants: dict[str, int] = {}
        for header in self.headers:
            header._fold_constants(constants)
        self._fold_constants(constants)
        return constants

    def _fold_constants(self, constants: dict[str, int]) -> None:
        """Add this file's own integer constants to ``constants`` (folded with them)."""
        for node in self.iter_nodes("declaration", "preproc_def"):
            if node.type == "preproc_def":
                name = node.child_by_field_name("name")
                value = node.child_by_field_name("value")
                if name is None or value is None or not self._device_branch(node, constants):
                    continue
                folded = _fold_define(self.text_of(value), constants)
                if folded is not None:
                    constants[self.text_of(name)] = folded
                continue
            if self.enclosing_function(node) is not None:
                continue
            qualifiers = {
                self.text_of(c)
                for c in node.children
                if c.type in ("type_qualifier", "storage_class_specifier")
            }
            if not qualifiers & {"constexpr", "const"}:
                continue
            for declarator in node.children_by_field_name("declarator"):
                if declarator.type != "init_declarator":
                    continue
                name = declarator.child_by_field_name("declarator")
                value = declarator.child_by_field_name("value")
                if name is None or value is None or name.type != "identifier":
                    continue
                folded = fold_int(self, value, constants)
                if folded is not None:
                    constants[self.text_of(name)] = folded

    def _device_branch(self, node: Node, constants: dict[str, int]) -> bool:
        """Whether the device pass compiles ``node``: every ``#if``/``#elif`` around it that
        tests ``__CUDA_ARCH__`` is read with the target's value (``#if __CUDA_ARCH__ >= 900
        #define N 2 #else #define N 1``: N is 2 for the kernels). Conditions on anything
        else count as taken, as before."""
        names = {**constants, "__CUDA_ARCH__": DEVICE_ARCH}
        child, parent = node, node.parent
        while parent is not None:
            if parent.type in ("preproc_if", "preproc_elif"):
                condition = parent.child_by_field_name("condition")
                alternative = parent.child_by_field_name("alternative")
                value = None
                if condition is not None and "__CUDA_ARCH__" in self.text_of(condition):
                    value = fold_int(self, condition, names)
                in_alternative = alternative is not None and child == alternative
                if value is not None and bool(value) == in_alternative:
                    return False
            child, parent = parent, parent.parent
        return True


DEVICE_ARCH = 900
"""``__CUDA_ARCH__`` where the device code is compiled (sm_90): the value a ``#if`` on it
takes for the kernels, which is what the constants are read for."""


def _inner_declarator(node: Node) -> Node | None:
    """The declarator inside another (``* x`` -> ``x``, ``(&v)[4]`` -> ``(&v)`` -> ``&v``)."""
    inner = node.child_by_field_name("declarator")
    if inner is not None:
        return inner
    return next(
        (c for c in node.named_children if c.type.endswith("declarator") or c.type == "identifier"),
        None,
    )


_DEFINE_VALUE = re.compile(r"^\(?\s*(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\s*\)?$")


_DEFINE_COMMENT = re.compile(r"//.*$|/\*.*?\*/", re.DOTALL)


def _fold_define(text: str, constants: dict[str, int]) -> int | None:
    # the preprocessor's value runs to the end of the line, a trailing comment included
    text = _DEFINE_COMMENT.sub("", text).strip()
    match = _DEFINE_VALUE.match(text)
    if match:
        return int(match.group(1), 0)
    while text.startswith("(") and text.endswith(")"):  # `#define C (A)`
        text = text[1:-1].strip()
    return constants.get(text)


# ---------------------------------------------------------------------------------------------
# Small node helpers, shared by the mechanisms
# ---------------------------------------------------------------------------------------------


def within(node: Node, outer: Node) -> bool:
    """Whether ``node`` lies inside ``outer`` (or is it)."""
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def strip_parens(node: Node) -> Node:
    """``((x))`` -> ``x``."""
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def plain_assignment(statement: Node | None) -> tuple[Node, Node] | None:
    """``(left, right)`` of the statement ``left = right;`` (plain ``=``, not ``+=``); None for
    any other statement."""
    if statement is None or statement.type != "expression_statement":
        return None
    expression = statement.named_children[0] if statement.named_children else None
    if expression is None or expression.type != "assignment_expression":
        return None
    operator = expression.child_by_field_name("operator")
    left = expression.child_by_field_name("left")
    right = expression.child_by_field_name("right")
    if operator is None or operator.type != "=" or left is None or right is None:
        return None
    return left, right


def strip_casts(node: Node) -> Node:
    """``(int64_t)(x)`` -> ``x``: parentheses and C casts dropped (casts change how an index
    is computed, not which)."""
    while True:
        node = strip_parens(node)
        if node.type != "cast_expression":
            return node
        value = node.child_by_field_name("value")
        if value is None:
            return node
        node = value


def variable_of(source: ParsedSource, node: Node) -> str | None:
    """The variable an lvalue belongs to: ``row[i].pair[j]`` -> ``row``, ``acc.m`` -> ``acc``;
    None for anything not rooted in a name (``*p``)."""
    node = strip_parens(node)
    while node.type in ("subscript_expression", "field_expression"):
        inner = node.child_by_field_name("argument")
        if inner is None:
            return None
        node = strip_parens(inner)
    return source.text_of(node) if node.type == "identifier" else None


def call_name(source: ParsedSource, node: Node) -> str | None:
    """The callee of a ``call_expression`` as written, template arguments left out."""
    if node.type != "call_expression":
        return None
    function = node.child_by_field_name("function")
    if function is None:
        return None
    if function.type == "template_function":
        function = function.child_by_field_name("name")
    return source.text_of(function) if function is not None else None


def parse(kernel: KernelSource | str) -> ParsedSource:
    """Parse a kernel (or a source text). Prefer ``KernelSource.parsed``, which caches."""
    if isinstance(kernel, str):
        kernel = KernelSource(kernel)
    return kernel.parsed
