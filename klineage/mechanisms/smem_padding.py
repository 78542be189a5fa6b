"""Shared-memory padding against bank conflicts: ``__shared__ T tile[N][M + 1]``.

Shared memory has 32 four-byte banks. A tile whose rows are a multiple of 32 words long
puts a whole column in one bank, so a warp reading a column (a transpose, a GEMM's A tile
read along k) serializes 32 ways. One extra element per row shifts each row by a bank.

- detect: ``__shared__`` arrays of two or more dimensions whose last extent is ``E + P``
  (P a small constant, or a name with "pad" in it), and row-pitch constants ``kPitch = E +
  P`` (a name with pitch, stride, ld or pad in it) used only in shared-memory address
  arithmetic (and ``static_assert``\\ s), as for a byte buffer carved out of ``extern
  __shared__`` memory;
- remove: drop the ``+ P``. Indexing stays valid because rows are addressed through the
  declared extent (``tile[r][c]``) or through the pitch constant itself, and the padding
  column is never addressed; refused when the array is also used through a pointer, which
  may rely on the padded length;
- apply: ``[E]`` -> ``[E + pad]`` on the last extent of a multi-dimensional static
  ``__shared__`` array used only through full subscripts (carrier ``pad``, default 1), or
  ``kPitch = E`` -> ``E + pad`` for a pitch constant (carrier ``pad`` required: it counts in
  the constant's unit).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from klineage.conditions import Condition, Prose, SharedMemoryAtMost
from klineage.cuda.cexpr import SIZEOF, fold_int, operand
from klineage.cuda.edit import Edit
from klineage.cuda.facts import shared_memory_of
from klineage.cuda.source import Declaration, Function, Node, ParsedSource
from klineage.cuda.tree import identifier_names, one_line
from klineage.kernel import KernelSource
from klineage.mechanisms._staging import subscript_chain
from klineage.mechanisms._tiles_util import DYNAMIC_SHARED_LIMIT, STATIC_SHARED_LIMIT
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

MAX_PAD = 64
ADDITIVE = 12
"""C++ precedence of ``+``: an extent that binds more loosely gets parentheses."""
_PITCH = re.compile(r"(?i)(pitch|stride|pad|^ld|_ld)")
_PAD = re.compile(r"(?i)pad")


@dataclass(frozen=True)
class _Array:
    """A multi-dimensional static shared array."""

    name: str
    declaration: Declaration
    sizes: tuple[Node, ...]
    """The extent expressions, outermost first."""
    function: Function | None


def _arrays(source: ParsedSource) -> Iterator[_Array]:
    for decl in source.shared_declarations:
        if decl.is_extern:
            continue
        for name, declarator in zip(decl.names, decl.declarators, strict=True):
            sizes: list[Node] = []
            current: Node | None = declarator
            while current is not None and current.type == "array_declarator":
                size = current.child_by_field_name("size")
                if size is None:
                    break
                sizes.insert(0, size)
                current = current.child_by_field_name("declarator")
            if len(sizes) >= 2:
                yield _Array(name, decl, tuple(sizes), source.enclosing_function(decl.node))


def _padding(source: ParsedSource, size: Node) -> tuple[Node, Node] | None:
    """``E + P`` -> (E, P) when P is padding: a constant 1..MAX_PAD, or a name with "pad"."""
    if size.type != "binary_expression":
        return None
    op = size.child_by_field_name("operator")
    left, right = size.child_by_field_name("left"), size.child_by_field_name("right")
    if op is None or op.type != "+" or left is None or right is None:
        return None
    value = fold_int(source, right)
    if (value is not None and 0 < value <= MAX_PAD) or _PAD.search(source.text_of(right)):
        return left, right
    return None


def _uses(source: ParsedSource, name: str, scope: Node, skip: Node) -> list[Node]:
    """Identifier nodes named ``name`` inside ``scope``, outside ``skip``."""
    return [
        n
        for n in source.iter_nodes("identifier", within=scope)
        if source.text_of(n) == name and not skip.start_byte <= n.start_byte < skip.end_byte
    ]


def _full_subscripts_only(source: ParsedSource, array: _Array) -> str | None:
    """None when every use of the array is a full subscript ``a[i][j]``, else why not."""
    scope = array.function.node if array.function is not None else source.root
    for use in _uses(source, array.name, scope, array.declaration.node):
        top = use
        while top.parent is not None and top.parent.type == "subscript_expression":
            base = top.parent.child_by_field_name("argument")
            if base is None or base != top:
                break
            top = top.parent
        chain = subscript_chain(top)
        if (
            chain is None
            or len(chain[1]) != len(array.sizes)
            or (top.parent is not None and top.parent.type == "pointer_expression")
        ):
            return (
                f"{array.name} is used at line {source.line_of(use.start_byte)} other than as a "
                "full subscript, e.g. through a pointer that may rely on the padded row length"
            )
    return None


@dataclass(frozen=True)
class _Pitch:
    """A row-pitch constant used in shared-memory address arithmetic."""

    name: str
    declarator: Node
    value: Node


def _shared_names(source: ParsedSource) -> set[str]:
    """Shared buffers, and pointers initialized from them (`char* smem = smem_raw + off;`)."""
    names = {n for d in source.shared_declarations for n in d.names}
    if not names:
        return names
    pointers = []
    for decl in source.declarations:
        head = source.text_of(decl.node).split("=")[0]
        if "*" not in head and "&" not in head:  # a pointer, or a struct laid over the buffer
            continue
        for name, declarator in zip(decl.names, decl.declarators, strict=True):
            value = declarator.child_by_field_name("value")
            if value is not None:
                pointers.append((name, value, source.text_of(value)))
    for _ in range(3):  # aliases of aliases
        grown = False
        for name, value, text in pointers:
            if name in names or not any(n in text for n in names):
                continue  # the substring test is cheap; the identifier walk confirms
            used = {source.text_of(n) for n in source.iter_nodes("identifier", within=value)}
            if used & names:
                names.add(name)
                grown = True
        if not grown:
            break
    return names


def _pitches(source: ParsedSource) -> Iterator[_Pitch]:
    shared = _shared_names(source)
    for decl in source.declarations:
        if "const" not in decl.qualifiers and "constexpr" not in decl.qualifiers:
            continue
        for name, declarator in zip(decl.names, decl.declarators, strict=True):
            value = declarator.child_by_field_name("value")
            if value is None or not _PITCH.search(name) or decl.is_shared:
                continue
            if _pitch_uses_ok(source, name, decl.node, shared):
                yield _Pitch(name, declarator, value)


def _constant_declared_by(source: ParsedSource, node: Node) -> str | None:
    """The constant a node helps initialize: ``kBytes`` for a use in ``constexpr int kBytes
    = kTile * kPitch;`` at file scope; None otherwise."""
    declarator = ParsedSource.ancestor(node, "init_declarator")
    declaration = None if declarator is None else declarator.parent
    if declaration is None or declaration.type != "declaration":
        return None
    if source.enclosing_function(declaration) is not None:
        return None
    words = source.text_of(declaration).split()
    name = declarator.child_by_field_name("declarator") if declarator is not None else None
    if name is None or not {"const", "constexpr"} & set(words):
        return None
    return source.text_of(name)


def _shared_size_use(source: ParsedSource, node: Node) -> bool:
    """A use as a size: a ``static_assert``, a launch's shared-memory bytes, or the value of
    ``cudaFuncSetAttribute``."""
    if ParsedSource.ancestor(node, "static_assert_declaration") is not None:
        return True
    for launch in source.launches:
        size = launch.shared_memory
        if size is not None and size.start_byte <= node.start_byte < size.end_byte:
            return True
    call = ParsedSource.ancestor(node, "call_expression")
    function = None if call is None else call.child_by_field_name("function")
    return function is not None and source.text_of(function) == "cudaFuncSetAttribute"


def _names_a_shared_buffer(source: ParsedSource, use: Node, shared: set[str]) -> bool:
    """The expression around a use (up to its statement, declarator or argument) also names
    a shared buffer: an address computation."""
    top = use
    while top.parent is not None and top.parent.type not in (
        "expression_statement",
        "init_declarator",
        "return_statement",
        "argument_list",
    ):
        top = top.parent
    names = {source.text_of(n) for n in source.iter_nodes("identifier", within=top)}
    return bool(names & shared)


def _pitch_uses_ok(
    source: ParsedSource, name: str, declaration: Node, shared: set[str], depth: int = 0
) -> bool:
    """Every use of the constant is in an expression that also names a shared buffer (an
    address computation), a size of shared memory, or the initializer of another constant
    used the same way; and there is at least one use."""
    uses = _uses(source, name, source.root, declaration)
    if not uses or depth > 3:
        return False
    return _other_use(source, name, declaration, shared, depth) is None


def _other_use(
    source: ParsedSource, name: str, declaration: Node, shared: set[str], depth: int = 0
) -> Node | None:
    """The first use of the constant that is none of the uses `_pitch_uses_ok` allows."""
    for use in _uses(source, name, source.root, declaration):
        if _shared_size_use(source, use):
            continue
        if ParsedSource.ancestor(use, "static_assert_declaration") is not None:
            continue  # a compile-time check: nvcc re-checks it after any rewrite
        derived = _constant_declared_by(source, use)
        if derived is not None:
            holder = ParsedSource.ancestor(use, "declaration")
            if holder is None or not _pitch_uses_ok(source, derived, holder, shared, depth + 1):
                return use
            continue
        if not _names_a_shared_buffer(source, use, shared):
            return use
    return None


def _tensor_map_copy(source: ParsedSource, pitch: str) -> Node | None:
    """A call in a kernel handed both a ``CUtensorMap`` parameter and a local whose
    initializer uses the pitch (``store(&map, tile + w * kPadded * N, ...)``): a copy engine
    reads those rows with the box its map was encoded with."""
    for function in source.kernels:
        maps = {p.name for p in function.params if p.name and "CUtensorMap" in p.type}
        if not maps or function.body is None:
            continue
        pitched = set()
        for declarator in source.iter_nodes("init_declarator", within=function.body):
            value = declarator.child_by_field_name("value")
            name = declarator.child_by_field_name("declarator")
            while name is not None and name.type != "identifier":  # `T* p`, `T& r`
                name = name.child_by_field_name("declarator")
            if name is not None and value is not None and pitch in identifier_names(source, value):
                pitched.add(source.text_of(name))
        for call in source.calls:
            if not function.node.start_byte <= call.node.start_byte < function.node.end_byte:
                continue
            named = set().union(*(identifier_names(source, a) for a in call.args))
            if named & maps and named & pitched:
                return call.node
    return None


def _padded_pitches_elsewhere(source: ParsedSource) -> Iterator[tuple[_Pitch, Node]]:
    """Padded constants named as padding (``kRowPadded = kRow + 8``) that address shared
    memory but also reach other code (a lane's offset, an address handed to a copy engine),
    with the first such use: detected, but not removable by dropping the pad alone."""
    shared = _shared_names(source)
    for decl in source.declarations:
        if not {"const", "constexpr"} & set(decl.qualifiers) or decl.is_shared:
            continue
        for name, declarator in zip(decl.names, decl.declarators, strict=True):
            value = declarator.child_by_field_name("value")
            if value is None or not _PAD.search(name) or _padding(source, value) is None:
                continue
            uses = _uses(source, name, source.root, decl.node)
            if not any(_names_a_shared_buffer(source, u, shared) for u in uses):
                continue
            other = _other_use(source, name, decl.node, shared)
            if other is not None:
                yield _Pitch(name, declarator, value), other


@register
class SmemPadding(Mechanism):
    name = "smem_padding"
    category = "memory"
    family = "shared-memory padding or swizzle"
    intent = (
        "Pad each row of a shared-memory tile so that a warp reading down a column hits 32 "
        "different banks instead of one."
    )
    carrier_keys: ClassVar[dict[str, str]] = {
        "pad": "elements (or, for a pitch constant, its unit) added to each row",
    }
    relieves = ("shared-memory bank conflicts",)

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for array in _arrays(source):
            padded = _padding(source, array.sizes[-1])
            if padded is None:
                continue
            yield self.site(
                source,
                array.sizes[-1],
                detail={"array": array.name, "pad": source.text_of(padded[1])},
                refusal=_full_subscripts_only(source, array),
            )
        for pitch in _pitches(source):
            padded = _padding(source, pitch.value)
            if padded is not None:
                yield self.site(
                    source,
                    pitch.value,
                    detail={"pitch": pitch.name, "pad": source.text_of(padded[1])},
                )
        for pitch, other in _padded_pitches_elsewhere(source):
            padded = _padding(source, pitch.value)
            assert padded is not None  # _padded_pitches_elsewhere checked it
            statement = ParsedSource.ancestor(other, "declaration") or other.parent or other
            copy = _tensor_map_copy(source, pitch.name)
            engine = (
                ""
                if copy is None
                else f", and the padded rows go to a tensor-map copy at line "
                f"{source.line_of(copy.start_byte)} (`{one_line(source, copy)}`), whose box "
                "holds the padded pitch"
            )
            yield self.site(
                source,
                pitch.value,
                detail={"pitch": pitch.name, "pad": source.text_of(padded[1])},
                refusal=(
                    f"the site is the padded pitch {pitch.name}, also used at line "
                    f"{source.line_of(other.start_byte)} (`{one_line(source, statement)}`), "
                    f"which this rule does not follow to a shared-memory address{engine}; it "
                    "drops a pad only where every use of the pitch is one, so that nothing "
                    "else still assumes the padded rows"
                ),
            )

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        for array in _arrays(source):
            if _padding(source, array.sizes[-1]) is not None:
                continue
            yield self.site(
                source,
                array.sizes[-1],
                detail={"array": array.name},
                refusal=_full_subscripts_only(source, array),
            )
        for pitch in _pitches(source):
            if _padding(source, pitch.value) is None:
                yield self.site(source, pitch.value, detail={"pitch": pitch.name})

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        node = self.node_at(source, site, "binary_expression")
        padded = _padding(source, node)
        if padded is None:
            raise self.refuse("the extent is no longer E + pad", site)
        return [Edit.replace(node, source.text_of(padded[0]))]

    def carrier_of(self, kernel: KernelSource, site: Site) -> Carrier:
        node = self.node_at(kernel.parsed, site, "binary_expression")
        padded = _padding(kernel.parsed, node)
        value = None if padded is None else fold_int(kernel.parsed, padded[1])
        return Carrier(pad=value) if value is not None else Carrier()

    def default_carrier(self, kernel: KernelSource, site: Site) -> Carrier:
        return Carrier(pad=1) if "array" in site.detail else Carrier()

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        pad = carrier.get_int("pad")
        if pad is None:
            raise self.refuse(
                f"give --carrier pad=N: {site.detail.get('pitch')} counts in its own unit "
                "(bytes or elements), so no default is safe",
                site,
                "apply",
            )
        if not 0 < pad <= MAX_PAD:
            raise self.refuse(f"pad={pad} is not in 1..{MAX_PAD}", site, "apply")
        node = source.root.descendant_for_byte_range(site.start_byte, site.end_byte)
        while node is not None and (node.start_byte, node.end_byte) != (
            site.start_byte,
            site.end_byte,
        ):
            node = node.parent
        if node is None:
            raise self.refuse("the extent is not found", site, "apply")
        return [Edit.replace(node, f"{operand(source, node, ADDITIVE)} + {pad}")]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        source = kernel.parsed
        kernels = self._kernels(source, site)
        found: list[Condition] = []
        for function in kernels:
            usage = shared_memory_of(source, function)
            dynamic = any(
                d.is_extern
                and function.node.start_byte <= d.node.start_byte < function.node.end_byte
                for d in source.shared_declarations
            )
            limit = DYNAMIC_SHARED_LIMIT if dynamic else STATIC_SHARED_LIMIT
            extra = self._extra_bytes(source, site)
            if usage is None:
                continue
            found.append(
                SharedMemoryAtMost(
                    bytes=limit,
                    usage=f"({usage}) + {extra}" if extra else usage,
                    why="padding adds a column to every row"
                    + (
                        "; dynamic shared memory beyond 48 KiB needs the opt-in attribute"
                        if dynamic
                        else "; static shared memory is limited to 48 KiB"
                    ),
                )
            )
        if not found:
            found.append(
                Prose(
                    text="the padded tile must still fit in shared memory",
                    why="padding adds a column to every row",
                )
            )
        return found

    def _kernels(self, source: ParsedSource, site: Site) -> list[Function]:
        if "array" in site.detail:
            function = source.enclosing_function(site.start_byte)
            return [function] if function is not None and function.is_kernel else []
        name = str(site.detail.get("pitch", ""))
        users = set()
        for node in source.iter_nodes("identifier"):
            if source.text_of(node) == name:
                function = source.enclosing_function(node)
                if function is not None:
                    users.add(function.name)
        return [k for k in source.kernels if k.name in users]

    def _extra_bytes(self, source: ParsedSource, site: Site) -> int:
        """Bytes an application at a candidate would add (0 for a detected site)."""
        if "array" not in site.detail or "pad" in site.detail:
            return 0
        array = next((a for a in _arrays(source) if a.name == site.detail["array"]), None)
        if array is None:
            return 0
        rows = 1
        for size in array.sizes[:-1]:
            value = fold_int(source, size)
            if value is None:
                return 0
            rows *= value
        return rows * SIZEOF.get(array.declaration.type, 4)
