"""Helpers shared by the tile, pipeline and tensor-core mechanisms.

Those mechanisms work on idioms rather than single tokens: inline PTX (``mma.sync``,
``ldmatrix``, ``cp.async``), shared-memory tiles, index arithmetic. This module holds what
they have in common:

- reading ``asm`` statements (the template string and the operands it names);
- *stashes*: a removal that swaps a PTX instruction for an equivalent scalar emulation writes
  the emulation as a block whose first token is a comment holding the original statement,
  ``{ /* klineage:<mechanism>: asm volatile(...); */ ... }``. ``apply`` recognizes such a
  block only when it is exactly the emulation the mechanism would write for that statement,
  so putting the instruction back is safe by construction (the two are equivalent) and gives
  the original text byte for byte;
- identifier substitution and a small dependency analysis over a function's locals (which
  locals derive from ``threadIdx.x``, say), for the tile rewrites;
- launch facts the conditions need (the block's dimensions, not only its thread count).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

from klineage.cuda.cexpr import fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.facts import launch_names
from klineage.cuda.source import Function, Launch, Node, ParsedSource
from klineage.cuda.tree import declarator_name

FULL_MASK = "0xffffffffu"
LANE = "(int)(((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) & 31u)"
"""The lane of the calling thread: warps are cut from the linear thread index."""
STATIC_SHARED_LIMIT = 48 * 1024
"""Bytes of static ``__shared__`` memory a block may declare."""
DYNAMIC_SHARED_LIMIT = 227 * 1024
"""Bytes of shared memory per block on sm_90 with the opt-in attribute."""
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_THREAD_FIELDS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


# ---------------------------------------------------------------------------------------------
# Inline assembly
# ---------------------------------------------------------------------------------------------


def string_value(source: ParsedSource, node: Node) -> str | None:
    """The value of a string literal (or adjacent literals), escapes decoded; None for
    anything else (a macro, a raw string)."""
    if node.type == "concatenated_string":
        parts = [string_value(source, c) for c in node.named_children]
        return None if None in parts else "".join(p for p in parts if p is not None)
    if node.type != "string_literal":
        return None
    out: list[str] = []
    for child in node.named_children:
        text = source.text_of(child)
        if child.type == "escape_sequence":
            out.append(_ESCAPES.get(text[1:], text))
        else:
            out.append(text)
    return "".join(out)


@dataclass(frozen=True)
class AsmOperand:
    """One operand of an ``asm`` statement: ``"=r"(r[0])``."""

    constraint: str
    """The constraint without quotes: ``=r``, ``+f``, ``l``, ``n``."""
    expr: Node
    """The C++ expression in parentheses."""
    output: bool


@dataclass(frozen=True)
class AsmStatement:
    """An expression statement holding one ``asm [volatile] (...)``."""

    statement: Node
    """The ``expression_statement`` (it ends with the ``;``)."""
    template: str
    """The instruction text, escapes decoded."""
    operands: tuple[AsmOperand, ...]
    """Outputs first, then inputs: the numbering ``%0, %1, ...`` of the template."""
    clobbers: tuple[str, ...]

    @property
    def instructions(self) -> list[str]:
        """The template's instructions, one per ``;``, trimmed, empty ones left out."""
        return [part.strip() for part in self.template.split(";") if part.strip()]

    @property
    def mnemonic(self) -> str:
        """The first instruction's opcode with its modifiers: ``mma.sync.aligned...``."""
        instructions = self.instructions
        return instructions[0].split()[0] if instructions else ""

    def operand(self, token: str) -> AsmOperand | None:
        """The operand a ``%N`` token names, or None."""
        match = re.fullmatch(r"%(\d+)", token.strip())
        if match is None or int(match.group(1)) >= len(self.operands):
            return None
        return self.operands[int(match.group(1))]


def _operands(source: ParsedSource, node: Node | None, output: bool) -> list[AsmOperand]:
    found = []
    for child in node.named_children if node is not None else []:
        if child.type not in ("gnu_asm_output_operand", "gnu_asm_input_operand"):
            continue
        constraint = next((c for c in child.named_children if c.type == "string_literal"), None)
        expr = child.child_by_field_name("value")
        if expr is None:
            exprs = [c for c in child.named_children if c.type != "string_literal"]
            expr = exprs[-1] if exprs else None
        if constraint is None or expr is None:
            continue
        found.append(AsmOperand(string_value(source, constraint) or "", expr, output))
    return found


def asm_statement(source: ParsedSource, statement: Node) -> AsmStatement | None:
    """The asm statement a node is, or None (not an asm, an unreadable template)."""
    if statement.type != "expression_statement":
        return None
    asm = next((c for c in statement.named_children if c.type == "gnu_asm_expression"), None)
    if asm is None:
        return None
    template_node = asm.child_by_field_name("assembly_code")
    if template_node is None:
        template_node = next(
            (c for c in asm.named_children if c.type in ("string_literal", "concatenated_string")),
            None,
        )
    template = None if template_node is None else string_value(source, template_node)
    if template is None:
        return None
    outputs = next((c for c in asm.children if c.type == "gnu_asm_output_operand_list"), None)
    inputs = next((c for c in asm.children if c.type == "gnu_asm_input_operand_list"), None)
    clobber_list = next((c for c in asm.children if c.type == "gnu_asm_clobber_list"), None)
    clobbers = tuple(
        string_value(source, c) or ""
        for c in (clobber_list.named_children if clobber_list is not None else [])
        if c.type == "string_literal"
    )
    return AsmStatement(
        statement=statement,
        template=template,
        operands=(*_operands(source, outputs, True), *_operands(source, inputs, False)),
        clobbers=clobbers,
    )


def asm_statements(source: ParsedSource) -> list[AsmStatement]:
    """Every readable asm statement of the file, in document order."""
    found = []
    for node in source.nodes("gnu_asm_expression"):
        parent = node.parent
        if parent is not None:
            statement = asm_statement(source, parent)
            if statement is not None:
                found.append(statement)
    return found


def register_list(text: str) -> list[str] | None:
    """``{%0, %1}`` -> ``["%0", "%1"]``; None when the text is not a brace list."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    return [part.strip() for part in text[1:-1].split(",")]


def split_operands(instruction: str) -> tuple[str, list[str]]:
    """``op.a.b {x, y}, [z], 16;`` -> ``("op.a.b", ["{x, y}", "[z]", "16"])``: commas inside
    braces or brackets do not split."""
    head, _, rest = instruction.strip().rstrip(";").partition(" ")
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in rest:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return head, parts


# ---------------------------------------------------------------------------------------------
# Stashes: a scalar emulation that remembers the instruction it replaced
# ---------------------------------------------------------------------------------------------


def _marker(mechanism: str) -> str:
    return f"/* klineage:{mechanism}: "


def stash_block(mechanism: str, original: str, indent: str, body: Iterable[str]) -> str:
    """The block replacing a statement: a comment holding the original, then ``body`` (lines
    without indentation; nested lines keep their own leading spaces), at ``indent``. An empty
    body becomes a null statement."""
    lines = list(body)
    head = f"{_marker(mechanism)}{original} */"
    if not lines:  # `;` keeps `{ { /* */ } }` from reading as a brace initializer
        return "{ " + head + " ; }"
    inner = "".join(f"{indent}  {line}\n" if line else "\n" for line in lines)
    return "{  " + head + "\n" + inner + indent + "}"


def can_stash(original: str) -> bool:
    """Whether a statement can be kept in a block comment (it holds no ``*/``)."""
    return "*/" not in original


def stashed_original(source: ParsedSource, block: Node, mechanism: str) -> str | None:
    """The statement a stash block of ``mechanism`` remembers, or None if it is not one."""
    if block.type != "compound_statement":
        return None
    first = next((c for c in block.children if c.type != "{"), None)
    if first is None or first.type != "comment":
        return None
    text = source.text_of(first)
    marker = _marker(mechanism)
    if not text.startswith(marker) or not text.endswith(" */"):
        return None
    return text[len(marker) : -len(" */")]


def stash_blocks(source: ParsedSource, mechanism: str) -> Iterator[tuple[Node, str]]:
    """Every stash block of ``mechanism`` with the statement it remembers."""
    marker = _marker(mechanism).encode()
    if marker not in source.data:
        return
    for comment in source.nodes("comment"):
        block = comment.parent
        if block is None:
            continue
        original = stashed_original(source, block, mechanism)
        if original is not None:
            yield block, original


def reparse_statement(original: str) -> tuple[ParsedSource, Node] | None:
    """A stashed statement parsed on its own (inside a dummy device function)."""
    from klineage.kernel import KernelSource

    wrapped = KernelSource("__device__ void klineage_stash() {\n" + original + "\n}\n")
    parsed = wrapped.parsed
    function = parsed.function("klineage_stash")
    if parsed.errors or function is None or function.body is None:
        return None
    statements = [c for c in function.body.named_children if c.type != "comment"]
    if len(statements) != 1:
        return None
    return parsed, statements[0]


# ---------------------------------------------------------------------------------------------
# Names, substitution, dependencies
# ---------------------------------------------------------------------------------------------


def name_of(source: ParsedSource, node: Node) -> str | None:
    """``x`` for an identifier, ``threadIdx.x`` for a field access of a name, else None."""
    if node.type == "identifier":
        return source.text_of(node)
    if node.type == "field_expression":
        base = node.child_by_field_name("argument")
        field = node.child_by_field_name("field")
        if base is not None and field is not None and base.type == "identifier":
            return f"{source.text_of(base)}.{source.text_of(field)}"
    return None


def names_in(source: ParsedSource, node: Node) -> set[str]:
    """The identifiers an expression reads, with ``threadIdx.x``-style accesses as one name
    (their base name is included too). Field names and called functions' names are not."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        name = name_of(source, current)
        if name is not None:
            found.add(name)
            if current.type == "field_expression":
                found.add(name.split(".")[0])
            continue
        if current.type == "call_expression":  # the arguments and launch configuration
            function = current.child_by_field_name("function")
            stack.extend(c for c in current.named_children if c != function)
            continue
        stack.extend(current.named_children)
    return found


def substitute(source: ParsedSource, node: Node, replace: Callable[[Node], str | None]) -> str:
    """The text of ``node`` with every sub-node for which ``replace`` returns text swapped for
    that text (outermost first; a replaced node's children are not visited)."""
    pieces: list[str] = []
    cursor = node.start_byte

    def visit(current: Node) -> None:
        nonlocal cursor
        text = replace(current)
        if text is not None:
            pieces.append(source.text_of((cursor, current.start_byte)))
            pieces.append(text)
            cursor = current.end_byte
            return
        for child in current.children:
            visit(child)

    visit(node)
    pieces.append(source.text_of((cursor, node.end_byte)))
    return "".join(pieces)


def rename(source: ParsedSource, node: Node, mapping: dict[str, str]) -> str:
    """The text of ``node`` with names (``t``, ``threadIdx.x``) replaced per ``mapping``."""

    def replace(current: Node) -> str | None:
        name = name_of(source, current)
        if name is None or name not in mapping:
            return None
        if current.type == "identifier" and _is_field_base(current):
            return None
        return mapping[name]

    return substitute(source, node, replace)


def _is_field_base(node: Node) -> bool:
    parent = node.parent
    return parent is not None and parent.type == "field_expression"


def with_comments_above(source: ParsedSource, statement: Node) -> Node:
    """The first of the whole-line comments written just above a statement (or itself)."""
    start = statement
    while (
        start.prev_sibling is not None
        and start.prev_sibling.type == "comment"
        and source.starts_line(start.prev_sibling.start_byte)
    ):
        start = start.prev_sibling
    return start


def fresh_name(used: set[str], base: str) -> str:
    """``base``, or ``base_2``, ``base_3``... whichever is not in ``used`` (and adds it)."""
    name, index = base, 2
    while name in used:
        name = f"{base}_{index}"
        index += 1
    used.add(name)
    return name


@dataclass
class Locals:
    """The local variables of one function: where each is declared, and from what."""

    source: ParsedSource
    function: Function

    @cached_property
    def declared(self) -> dict[str, list[tuple[Node, Node | None]]]:
        """Name -> (declaration node, initializer or None) for each declaration of it."""
        found: dict[str, list[tuple[Node, Node | None]]] = {}
        body = self.function.body
        if body is None:
            return found
        for decl in self.source.iter_nodes("declaration", within=body):
            for declarator in decl.children_by_field_name("declarator"):
                value = declarator.child_by_field_name("value")
                inner: Node | None = declarator
                while inner is not None and inner.type != "identifier":
                    inner = inner.child_by_field_name("declarator")
                if inner is not None:
                    found.setdefault(self.source.text_of(inner), []).append((decl, value))
        return found

    @cached_property
    def assigned(self) -> set[str]:
        """Names written after their declaration (assignments, ``++``/``--``)."""
        written: set[str] = set()
        body = self.function.body
        if body is None:
            return written
        for node in self.source.iter_nodes(
            "assignment_expression", "update_expression", within=body
        ):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None and target.type == "identifier":
                written.add(self.source.text_of(target))
        return written

    @property
    def params(self) -> set[str]:
        return {p.name for p in self.function.params if p.name}

    def initializer(self, name: str) -> Node | None:
        """The initializer of a local declared once and never reassigned, else None."""
        entries = self.declared.get(name, [])
        if len(entries) != 1 or name in self.assigned:
            return None
        return entries[0][1]

    def depends_on(
        self,
        node: Node,
        targets: set[str],
        stop: frozenset[str] | set[str] = frozenset(),
        _seen: set[str] | None = None,
    ) -> bool:
        """Whether an expression reads one of ``targets`` (names or ``threadIdx.x``-style
        fields), directly or through locals' initializers (locals in ``stop`` are not looked
        through). A local that is reassigned, or declared more than once, is assumed to
        depend on everything (the safe answer)."""
        seen = _seen if _seen is not None else set()
        for name in names_in(self.source, node):
            if name in targets:
                return True
            if name in seen or name in stop or name not in self.declared:
                continue
            seen.add(name)
            value = self.initializer(name)
            if value is None:
                if name in self.assigned or len(self.declared[name]) != 1:
                    return True
                continue
            if self.depends_on(value, targets, stop, seen):
                return True
        return False

    def thread_component(self, node: Node) -> str | None:
        """``x`` when the expression is ``threadIdx.x`` or a local initialized to exactly it
        (casts allowed), else None."""
        current: Node | None = node
        for _ in range(4):
            if current is None:
                return None
            while current.type in ("parenthesized_expression", "cast_expression"):
                inner = (
                    current.child_by_field_name("value")
                    if current.type == "cast_expression"
                    else (current.named_children[0] if current.named_children else None)
                )
                if inner is None:
                    return None
                current = inner
            name = name_of(self.source, current)
            if name in _THREAD_FIELDS:
                return name.split(".")[1]
            if current.type != "identifier" or name is None:
                return None
            current = self.initializer(name)
        return None


# ---------------------------------------------------------------------------------------------
# Launch facts
# ---------------------------------------------------------------------------------------------


def _dims_of(source: ParsedSource, node: Node, names: dict[str, int | str]) -> list[int] | None:
    """The folded dimensions of a block expression: ``dim3(16, 16)`` or ``256``."""
    if node.type == "call_expression":
        function = node.child_by_field_name("function")
        arguments = node.child_by_field_name("arguments")
        if function is not None and source.text_of(function) == "dim3" and arguments is not None:
            values = [fold_int(source, a, names) for a in arguments.named_children]
            if values and None not in values:
                return [v for v in values if v is not None]
            return None
    value = fold_int(source, node, names)
    return None if value is None else [value]


def launch_block_dims(source: ParsedSource, launch: Launch) -> tuple[int, int, int] | None:
    """``(x, y, z)`` threads of a launch's block when they are compile-time constants: a
    literal, ``dim3(16, 16)``, or a never-reassigned local ``dim3 block(16, 16)``."""
    block = launch.block
    if block is None:
        return None
    function = source.enclosing_function(launch.node)
    names = launch_names(source, function)
    dims = None
    if block.type == "identifier" and function is not None:
        # a `dim3 block(16, 16)` local: `names` folds it to its thread count, not its shape
        dims = _local_dim3(source, function, source.text_of(block), names)
    if dims is None:
        dims = _dims_of(source, block, names)
    if dims is None or not 1 <= len(dims) <= 3:
        return None
    padded = [*dims, 1, 1][:3]
    return padded[0], padded[1], padded[2]


def _local_dim3(
    source: ParsedSource, function: Function, name: str, names: dict[str, int | str]
) -> list[int] | None:
    locals_ = Locals(source, function)
    entries = locals_.declared.get(name, [])
    if len(entries) != 1 or name in locals_.assigned:
        return None
    decl, value = entries[0]
    if value is None:  # `dim3 block(16, 16);`, or `dim3 block(kTile, kTile);` (a declarator)
        for declarator in decl.children_by_field_name("declarator"):
            if declarator_name(source, declarator) != name:
                continue  # `dim3 grid(...), block(...);`: another declarator of the line
            args = next(
                (c for c in declarator.children if c.type in ("argument_list", "parameter_list")),
                None,
            )
            if args is None:
                continue
            items = [
                a.named_children[0]
                if a.type == "parameter_declaration" and a.named_child_count == 1
                else a
                for a in args.named_children
            ]
            folded = [fold_int(source, a, names) for a in items]
            return None if None in folded else [v for v in folded if v is not None]
        return None
    if value.type in ("argument_list", "initializer_list"):
        folded = [fold_int(source, a, names) for a in value.named_children]
        return None if None in folded else [v for v in folded if v is not None]
    return _dims_of(source, value, names)


def kernel_block_dims(source: ParsedSource, kernel: str | Function) -> tuple[int, int, int] | None:
    """The block dimensions every launch of ``kernel`` in the file agrees on, or None."""
    dims = {launch_block_dims(source, launch) for launch in source.launches_of(kernel)}
    if len(dims) != 1:
        return None
    return dims.pop()


# ---------------------------------------------------------------------------------------------
# Statements and layout
# ---------------------------------------------------------------------------------------------


def statements(block: Node) -> list[Node]:
    """The statements of a compound statement, comments left out."""
    return [c for c in block.named_children if c.type != "comment"]


def is_call_statement(source: ParsedSource, node: Node, *names: str) -> bool:
    """Whether a statement is exactly ``name(...);`` for one of ``names``."""
    if node.type != "expression_statement" or not node.named_children:
        return False
    call = node.named_children[0]
    if call.type != "call_expression":
        return False
    function = call.child_by_field_name("function")
    return function is not None and source.text_of(function) in names


def reindent(text: str, remove: int) -> str:
    """``text`` with up to ``remove`` leading spaces taken off every line after the first
    (a statement moved ``remove`` columns to the left keeps its continuation lines aligned)."""
    if remove <= 0:
        return text
    lines = text.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        strip = min(remove, len(line) - len(line.lstrip(" ")))
        out.append(line[strip:])
    return "\n".join(out)


def column(source: ParsedSource, byte: int) -> int:
    """0-based column of a byte on its line."""
    return byte - source.line_start(byte)


def function_names(source: ParsedSource, function: Function) -> set[str]:
    """Every name used in a function (for fresh names)."""
    used = set(source.integer_constants)
    used.update(source.text_of(n) for n in source.iter_nodes("identifier", within=function.node))
    return used


def block_threads(source: ParsedSource, kernel: str | Function) -> str | None:
    """Threads per block of a kernel's launches as a size expression: what
    :func:`klineage.cuda.facts.block_size_of` finds, else the product of constant block
    dimensions (``dim3 block(kTile, kTile)``, which reads as a declarator)."""
    from klineage.cuda.facts import block_size_of

    found = block_size_of(source, kernel)
    if found is not None:
        return found
    dims = kernel_block_dims(source, kernel)
    return None if dims is None else str(dims[0] * dims[1] * dims[2])


def orphaned_declarations(source: ParsedSource, removed: list[Node]) -> list[Edit]:
    """Deletions of the top-level local declarations whose every use lies in the ``removed``
    regions (``blocks`` once the launch that used it is rewritten), so the rewrite leaves no
    unused variable behind. Only locals read in those regions are considered."""
    edits: list[Edit] = []
    names = {n for node in removed for n in names_in(source, node)}
    holders = {
        f.node.start_byte: f
        for f in source.functions
        if any(f.node.start_byte <= r.start_byte < f.node.end_byte for r in removed)
    }
    for function in holders.values():
        body = function.body
        if body is None:
            continue
        for statement in statements(body):
            if statement.type != "declaration":
                continue
            declared = statement.children_by_field_name("declarator")
            if len(declared) != 1:
                continue
            inner: Node | None = declared[0]
            while inner is not None and inner.type != "identifier":
                inner = inner.child_by_field_name("declarator")
            name = None if inner is None else source.text_of(inner)
            if name is None or name not in names:
                continue
            uses = [
                n
                for n in source.iter_nodes("identifier", within=function.node)
                if source.text_of(n) == name
                and not statement.start_byte <= n.start_byte < statement.end_byte
                and not any(r.start_byte <= n.start_byte < r.end_byte for r in removed)
            ]
            if not uses:
                edits.append(source.deletion(statement, whole_line=True))
    return edits


def statement_deletion(source: ParsedSource, node: Node) -> Edit:
    """The deletion of a statement on lines of its own, with one of the blank lines around
    it when it sat between two (no double blank line is left behind)."""
    edit = source.deletion(node, whole_line=True)
    data = source.data
    before_start = source.line_start(max(edit.start_byte - 1, 0))
    blank_before = edit.start_byte > 0 and not data[before_start : edit.start_byte].strip()
    after_end = data.find(b"\n", edit.end_byte)
    blank_after = after_end >= 0 and not data[edit.end_byte : after_end].strip()
    if blank_before and blank_after and edit.end_byte < len(data):
        return Edit(edit.start_byte, after_end + 1, "")
    return edit


# ---------------------------------------------------------------------------------------------
# Structure of tiled kernels (block and warp tiles, rasterization, split-K)
# ---------------------------------------------------------------------------------------------

BLOCK_INDEX = frozenset({"blockIdx.x", "blockIdx.y", "blockIdx.z"})


def is_constant(source: ParsedSource, function: Function, node: Node) -> bool:
    """A compile-time integer: a literal, a file constant, or a template parameter."""
    node = strip_casts(node)
    if node.type == "identifier" and source.text_of(node) in function.template_params:
        return True
    return fold_int(source, node) is not None


def strip_casts(node: Node) -> Node:
    """An expression without the parentheses and casts around it."""
    while True:
        if node.type == "parenthesized_expression" and node.named_children:
            node = node.named_children[0]
        elif node.type == "cast_expression" and node.child_by_field_name("value") is not None:
            value = node.child_by_field_name("value")
            assert value is not None
            node = value
        else:
            return node


def scaled_terms(node: Node) -> Iterator[tuple[Node, Node]]:
    """The ``(x, c)`` pairs of products ``x * c`` at the top of a sum: ``a * 16 + b`` gives
    ``(a, 16)`` and ``(16, a)``; the caller decides which side is the constant."""
    node = strip_casts(node)
    if node.type != "binary_expression":
        return
    op = node.child_by_field_name("operator")
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if op is None or left is None or right is None:
        return
    if op.type == "*":
        yield left, right
        yield right, left
    elif op.type in ("+", "-"):
        yield from scaled_terms(left)
        yield from scaled_terms(right)


def top_declarations(source: ParsedSource, function: Function) -> list[tuple[str, Node, Node]]:
    """(name, declaration, initializer) of the single-name local declarations with an
    initializer, anywhere in a function, in document order."""
    found = []
    if function.body is None:
        return found
    for decl in source.iter_nodes("declaration", within=function.body):
        declarators = decl.children_by_field_name("declarator")
        if len(declarators) != 1:
            continue
        value = declarators[0].child_by_field_name("value")
        name = declarators[0].child_by_field_name("declarator")
        if value is not None and name is not None and name.type == "identifier":
            found.append((source.text_of(name), decl, value))
    return found


def constant_declaration(source: ParsedSource, name: str) -> Node | None:
    """The file-scope declaration (or ``#define``) of a constant."""
    for node in source.iter_nodes("declaration", "preproc_def"):
        if source.enclosing_function(node) is not None:
            continue
        if node.type == "preproc_def":
            define = node.child_by_field_name("name")
            if define is not None and source.text_of(define) == name:
                return node
            continue
        for declarator in node.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator") or declarator
            if source.text_of(inner) == name:
                return node
    return None
