"""Removal of a swizzle written as a rotation of the chunks of each shared-memory row.

The form: at every access of a 2-D ``__shared__`` array ``S[R][W]`` the column is written
``(chunk + f(row)) % W``, either as the subscript (``S[row][(c + f(row)) % W]``, in elements)
or as a byte offset added to the row's address (``__cvta_generic_to_shared(&S[row][0]) +
((c + f(row)) % C) * B`` with ``C * B`` the row's bytes). ``f(row)`` is a term of the sum that
reads the row only through ``row % m`` (spelled ``X % m`` or ``X`` under ``% m`` with ``X``
congruent to the row modulo ``m``, which the index analysis checks); it may be spelled
differently at each access but must give the same rotation, in bytes, for every ``row % m``.

The removal drops the term ``f(row)`` at every access, keeping ``% W``. Why this keeps the
values: for a fixed row, ``c -> (c + f(row)) % W`` is a rotation of the row's slots, a
bijection, and every access of the row applies the same one. A reader of ``(row, c)`` reads
the physical slot ``rot_row(c % W)``; the writer of ``(row, c)`` wrote that same slot, and no
writer of another ``(row, c')`` with ``c' % W != c % W`` did (a bijection). Without the
rotation both read and write ``c % W``: the same pairs of writer and reader meet, so every
read sees the value it saw before; only the banks change. The rotation moves whole 16-byte
chunks (checked), so an access of up to 16 aligned bytes reads or writes one chunk in either
layout. This needs *every* access of the array rotated the same way, so one access in another
form, or two different rotations, is refused with the access and its line.

Pointers made from the array (``T *p = &S[0][0] + ...``) are another view of the memory, for
a later phase (an epilogue reusing it): they are left as they are, and accepted only when every
use of them comes after a top-level ``__syncthreads()`` that follows every access of the array
(the later phase is assumed to read only what it writes itself).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from klineage.cuda.analysis import FunctionIndices, analysis
from klineage.cuda.analysis.forms import IndexForm
from klineage.cuda.cexpr import SIZEOF, fold_int
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import NotInForm, binary_operands, descendants, identifier_names

__all__ = [
    "RowAccess",
    "RowArray",
    "common_rotation",
    "reads_row",
    "rotation_removal",
    "row_array",
]

_NEEDED = (
    "every access of the shared array writing its column as `(chunk + f(row)) % C`, "
    "with one rotation f for all accesses"
)
_SHARED_ADDRESS = "__cvta_generic_to_shared"
_BARRIER = "__syncthreads"
_CHUNK_BYTES = 16
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_INTEGER = re.compile(r"\(?\s*(0[xX][0-9a-fA-F]+|[0-7]+|\d+)[uUlL]*\s*\)?")


@dataclass(frozen=True)
class _Rotated:
    """One access of the array with its rotation term."""

    access: Node
    line: int
    replaced: Node
    """The ``+`` node holding the rotation term, replaced by its other operand."""
    kept: Node
    rotation: tuple[int, ...]
    """The rotation in bytes for each ``row % len(rotation)``."""


@dataclass
class _Context:
    """What every check of one removal reads: the source, its index analysis, the file's
    integer constants (``#define``s with a trailing comment included) and the variables
    already proven multiples of a modulus."""

    source: ParsedSource
    indices: FunctionIndices
    constants: dict[str, int]
    multiples: dict[tuple[int, int], bool] = field(default_factory=dict)
    _names: dict[str, list[Node]] | None = None
    _declared: dict[str, list[tuple[Node, Node]]] | None = None

    def fold(self, node: Node) -> int | None:
        """``node`` as a constant, or None."""
        return fold_int(self.source, node, self.constants)

    def uses(self, name: str) -> list[Node]:
        """The identifiers ``name`` in the function, in order (indexed once)."""
        if self._names is None:
            self._names = {}
            body = self.indices.function.body
            for node in descendants(body, "identifier") if body is not None else []:
                self._names.setdefault(self.source.text_of(node), []).append(node)
        return self._names.get(name, [])

    def declarators(self, name: str) -> list[tuple[Node, Node]]:
        """``(scope, declarator)`` of each local named ``name`` (indexed once): the block or
        ``for`` statement it is declared in."""
        if self._declared is None:
            self._declared = {}
            body = self.indices.function.body
            for declaration in descendants(body, "declaration") if body is not None else []:
                scope = declaration.parent
                for declarator in declaration.children_by_field_name("declarator"):
                    declared = _declared_name(self.source, declarator)
                    if scope is not None and declared is not None:
                        self._declared.setdefault(declared, []).append((scope, declarator))
        return self._declared.get(name, [])


def _file_constants(source: ParsedSource) -> dict[str, int]:
    """The file's integer constants, with ``#define K 32  // why`` read as 32 (the parsed
    constants leave out a define whose text keeps a comment)."""
    constants = dict(source.integer_constants)
    for holder, define in source.defines("preproc_def"):
        name, value = define.child_by_field_name("name"), define.child_by_field_name("value")
        if name is None or value is None or holder.text_of(name) in constants:
            continue
        text = re.sub(r"//.*|/\*.*?\*/", "", holder.text_of(value), flags=re.DOTALL).strip()
        literal = _INTEGER.fullmatch(text)
        number = _integer(literal.group(1)) if literal else constants.get(text)
        if number is not None:
            constants[holder.text_of(name)] = number
    return constants


def _integer(text: str) -> int:
    """A C integer literal's value (hexadecimal, octal or decimal)."""
    if text[:2].lower() == "0x":
        return int(text, 16)
    return int(text, 8) if len(text) > 1 and text.startswith("0") else int(text)


def _strip(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_children:
        node = node.named_children[0]
    return node


def _same(a: Node, b: Node) -> bool:
    return (a.start_byte, a.end_byte, a.type) == (b.start_byte, b.end_byte, b.type)


def _contains(node: Node, inner: Node) -> bool:
    return node.start_byte <= inner.start_byte and inner.end_byte <= node.end_byte


def _evaluate(context: _Context, node: Node, hole: Node, value: int) -> int | None:
    """``node`` as an integer with ``hole`` standing for ``value``; None when anything else in
    it is not a constant."""
    if _same(node, hole):
        return value
    if not _contains(node, hole):
        return context.fold(node)
    if node.type == "parenthesized_expression" and node.named_children:
        return _evaluate(context, node.named_children[0], hole, value)
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    op = node.child_by_field_name("operator")
    if node.type != "binary_expression" or left is None or right is None or op is None:
        return None
    a, b = _evaluate(context, left, hole, value), _evaluate(context, right, hole, value)
    if a is None or b is None or a < 0 or b < 0:
        return None
    operations = {
        "+": lambda: a + b,
        "-": lambda: a - b,
        "*": lambda: a * b,
        "/": lambda: a // b if b else None,
        "%": lambda: a % b if b else None,
        "<<": lambda: a << b,
        ">>": lambda: a >> b,
        "&": lambda: a & b,
        "|": lambda: a | b,
        "^": lambda: a ^ b,
    }
    operation = operations.get(op.type)
    return operation() if operation is not None else None


def _declaration_of(context: _Context, use: Node) -> Node | None:
    """The declarator ``use`` names, by C scoping: of the locals of that name declared before
    it in a block (or ``for`` statement) around it, the one of the innermost block."""
    visible = [
        (scope.start_byte, declarator)
        for scope, declarator in context.declarators(context.source.text_of(use))
        if _contains(scope, use) and declarator.end_byte <= use.start_byte
    ]
    return max(visible, key=lambda pair: pair[0])[1] if visible else None


def _declared_name(source: ParsedSource, declarator: Node) -> str | None:
    inner = declarator.child_by_field_name("declarator") or declarator
    names = (
        identifier_names(source, inner) if inner.type != "identifier" else {source.text_of(inner)}
    )
    return next(iter(names)) if len(names) == 1 else None


def _definitions(context: _Context, declarator: Node) -> list[Node] | None:
    """The values the variable of ``declarator`` is ever given (its initializer, its plain
    and additive assignments); None when one is anything else (``++``, ``*=``, none)."""
    source = context.source
    name = _declared_name(source, declarator)
    if declarator.type != "init_declarator" or name is None:
        return None
    initial = declarator.child_by_field_name("value")
    values = [initial] if initial is not None else []
    for use in context.uses(name):
        node = use.parent
        if node is None or node.type not in ("assignment_expression", "update_expression"):
            continue
        target = node.child_by_field_name("left") or node.child_by_field_name("argument")
        if target is None or not _same(target, use):
            continue
        if not _same_node(_declaration_of(context, target), declarator):
            continue
        op = node.child_by_field_name("operator")
        value = node.child_by_field_name("right")
        if node.type == "update_expression" or value is None or op is None:
            return None
        if op.type not in ("=", "+=", "-="):
            return None
        values.append(value)
    return values


def _same_node(a: Node | None, b: Node | None) -> bool:
    return a is not None and b is not None and _same(a, b)


def _multiple_of(
    context: _Context, form: IndexForm, modulus: int, around: Node, depth: int = 0
) -> bool:
    """Whether ``form`` is a multiple of ``modulus``: each coefficient is, or its term is a
    variable (an opaque atom ``[v]``) every value of which is, by its definitions; ``around``
    is where the form was read, to find which declaration ``v`` names."""
    source = context.source
    for monomial, coefficient in form.terms:
        if coefficient % modulus == 0:
            continue
        if depth > 3 or len(monomial) != 1 or not monomial[0].startswith("["):
            return False
        name = monomial[0][1:-1]
        if not _IDENTIFIER.fullmatch(name):
            return False
        uses = [n for n in descendants(around, "identifier") if source.text_of(n) == name]
        if not uses:  # a variable reached through another's definition: any of its
            uses = context.uses(name)  # declarations may be the one
        declarators = {
            (d.start_byte, d.end_byte): d
            for d in (_declaration_of(context, u) for u in uses)
            if d is not None
        }
        if not declarators or not all(
            _variable_multiple_of(context, d, modulus, depth) for d in declarators.values()
        ):
            return False
    return True


def _variable_multiple_of(context: _Context, declarator: Node, modulus: int, depth: int) -> bool:
    """Whether every value the variable of ``declarator`` is given is a multiple."""
    key = (declarator.start_byte, modulus)
    known = context.multiples.get(key)
    if known is None:
        context.multiples[key] = False  # a definition that reads the variable itself
        values = _definitions(context, declarator)
        known = values is not None and all(
            _multiple_of(context, context.indices.form(v), modulus, v, depth + 1) for v in values
        )
        context.multiples[key] = known
    return known


def _congruent(context: _Context, row: Node, other: Node, modulus: int) -> bool:
    """Whether ``row - other`` is a multiple of ``modulus`` by the index analysis."""
    difference: IndexForm = context.indices.form(row) - context.indices.form(other)
    return _multiple_of(context, difference, modulus, row)


def _row_rotation(context: _Context, term: Node, row: Node) -> tuple[int, ...] | None:
    """``term`` for each ``row % m``, when it reads the row only through ``X % m`` with ``X``
    (or ``X % m``) congruent to the row modulo ``m``."""
    for node in [term, *descendants(term, "binary_expression")]:
        sides = binary_operands(node, "%")
        modulus = context.fold(sides[1]) if sides is not None else None
        if sides is None or modulus is None or modulus <= 0:
            continue
        for hole in (node, sides[0]):
            if not _congruent(context, row, hole, modulus):
                continue
            values = [_evaluate(context, term, hole, r) for r in range(modulus)]
            if all(v is not None and v >= 0 for v in values):  # C and Python `%` agree
                return tuple(v for v in values if v is not None)
    return None


def _sum_terms(node: Node) -> list[tuple[Node, Node, Node]]:
    """Each term of a sum with the ``+`` node holding it and that node's other operand."""
    found: list[tuple[Node, Node, Node]] = []
    sides = binary_operands(_strip(node), "+")
    if sides is None:
        return found
    left, right = sides
    plus = _strip(node)
    found += _sum_terms(left) or [(left, plus, right)]
    found += _sum_terms(right) or [(right, plus, left)]
    return found


@dataclass(frozen=True)
class _Column:
    """Where an access writes its column: the ``%`` operand sum, its modulus and the bytes
    of one unit of the column."""

    total: Node
    modulus: int
    unit: int


def _element_column(context: _Context, column: Node, element: int) -> _Column | None:
    sides = binary_operands(_strip(column), "%")
    modulus = context.fold(sides[1]) if sides is not None else None
    if sides is None or modulus is None:
        return None
    return _Column(sides[0], modulus, element)


def _byte_column(context: _Context, address: Node) -> _Column | None:
    """``cvta(&S[row][0]) + ((sum) % C) * B``: the column of a byte address."""
    source = context.source
    call = address.parent
    while call is not None and call.type in ("argument_list", "parenthesized_expression"):
        call = call.parent
    if call is None or call.type != "call_expression":
        return None
    callee = call.child_by_field_name("function")
    if callee is None or source.text_of(callee) != _SHARED_ADDRESS or call.parent is None:
        return None
    sides = binary_operands(call.parent, "+")
    if sides is None or not _same(sides[0], call):
        return None
    scaled = binary_operands(_strip(sides[1]), "*")
    if scaled is None:
        return None
    for column, factor in (scaled, scaled[::-1]):
        unit = context.fold(factor)
        found = _element_column(context, column, 1)
        if unit is not None and found is not None:
            return _Column(found.total, found.modulus, unit)
    return None


def _subscript_index(node: Node) -> Node | None:
    """``i`` of ``a[i]`` (tree-sitter-cpp puts it under ``indices``, C under ``index``)."""
    index = node.child_by_field_name("index")
    if index is not None:
        return index
    indices = node.child_by_field_name("indices")
    return indices.named_children[0] if indices is not None and indices.named_children else None


def _refuse(source: ParsedSource, access: Node, what: str, needed: str = _NEEDED) -> NotInForm:
    line = source.line_of(access.start_byte)
    text = " ".join(source.text_of(access).split())
    return NotInForm(f"an access at line {line} (`{text}`) {what}", needed)


@dataclass(frozen=True)
class RowAccess:
    """One access ``S[row][col]`` of a 2-D shared array, with where it writes its column."""

    node: Node
    row: Node
    column: _Column


def _access_column(
    context: _Context, access: Node, element: int, row_bytes: int, needed: str
) -> RowAccess:
    """The row and the wrapped column of one access ``S[row][col]``, or NotInForm naming it."""
    source = context.source
    inner, column = access.child_by_field_name("argument"), _subscript_index(access)
    row = _subscript_index(inner) if inner is not None else None
    if row is None or column is None:
        raise _refuse(source, access, "is not a subscript `S[row][col]`", needed)
    address = access.parent
    found: _Column | None
    if context.fold(column) == 0 and address is not None and address.type == "pointer_expression":
        found = _byte_column(context, address)
    else:
        found = _element_column(context, column, element)
    if found is None:
        raise _refuse(source, access, "has no column `(...) % C`", needed)
    if found.modulus * found.unit != row_bytes:
        raise _refuse(source, access, "wraps its column at another width than the row's", needed)
    return RowAccess(access, row, found)


def _rotated(context: _Context, access: RowAccess, row_bytes: int) -> _Rotated:
    """The rotation of one access, or NotInForm naming it."""
    source = context.source
    line = source.line_of(access.node.start_byte)
    rotations = []
    for term, plus, other in _sum_terms(access.column.total):
        amounts = _row_rotation(context, term, access.row)
        if amounts is not None:
            rotation = tuple(a * access.column.unit % row_bytes for a in amounts)
            rotations.append(_Rotated(access.node, line, plus, other, rotation))
    if len(rotations) != 1:
        what = "has no term that depends on the row alone" if not rotations else "has several"
        raise _refuse(source, access.node, what)
    if any(amount % _CHUNK_BYTES for amount in rotations[0].rotation):
        # whole chunks move whole: an access of up to 16 aligned bytes stays one access
        raise _refuse(source, access.node, "rotates by part of a 16-byte chunk")
    return rotations[0]


def reads_row(array: RowArray, access: RowAccess) -> bool:
    """Whether a term of the access's column (or the whole column) varies with its row
    through ``row % m``: a column already rotated, or one in no form a rotation can be added
    to."""
    total = access.column.total
    terms = [term for term, _, _ in _sum_terms(total)] or [total]
    rotations = [_row_rotation(array.context, term, access.row) for term in terms]
    return any(rotation is not None and len(set(rotation)) > 1 for rotation in rotations)


def _periodic(rotation: tuple[int, ...], period: int) -> tuple[int, ...]:
    return tuple(rotation[r % len(rotation)] for r in range(period))


def _alias_of(source: ParsedSource, use: Node) -> tuple[str, Node] | None:
    """The pointer a declaration makes from the array (``T *p = &S[0][0] + ...``), with its
    declarator."""
    current: Node | None = use
    while current is not None and current.type != "init_declarator":
        if current.type in ("expression_statement", "compound_statement"):
            return None
        current = current.parent
    declarator = current.child_by_field_name("declarator") if current is not None else None
    if declarator is None or declarator.type != "pointer_declarator":
        return None
    names = identifier_names(source, declarator)
    return (next(iter(names)), current) if len(names) == 1 and current is not None else None


def _check_later_phase(context: _Context, aliases: dict[str, Node], last: int, needed: str) -> None:
    """Every use of a pointer made from the array comes after a top-level barrier that
    follows the array's last access (``last``): a later phase the rotation is not part of."""
    source, body = context.source, context.indices.function.body
    assert body is not None
    barriers = [
        s.start_byte
        for s in body.named_children
        if s.type == "expression_statement" and source.text_of(s).startswith(_BARRIER + "(")
    ]
    barrier = min((b for b in barriers if b > last), default=None)
    for name, declared in aliases.items():
        later = [u for u in context.uses(name) if not _contains(declared, u)]
        early = [u for u in later if barrier is None or u.start_byte < barrier]
        if early:
            raise _refuse(
                source,
                early[0],
                f"uses `{name}`, a pointer made from the array, before a barrier that follows "
                "every access of the array",
                needed,
            )


def _element_bytes(element_type: str) -> int | None:
    return SIZEOF.get(" ".join(element_type.split()))


def _array_of(source: ParsedSource, indices: FunctionIndices, statement: Node) -> str:
    names = identifier_names(source, statement)
    shared = [n for n, b in indices.buffers.items() if b.space == "shared" and n in names]
    if len(shared) != 1:
        raise NotInForm("a rotation over no single shared array", _NEEDED)
    return shared[0]


@dataclass(frozen=True)
class RowArray:
    """A 2-D ``__shared__`` array of constant row width declared in a kernel, with every
    access of it (pointers made from it are checked to serve a later phase only)."""

    name: str
    row_bytes: int
    accesses: list[RowAccess]
    context: _Context


def row_array(source: ParsedSource, function: Function, name: str, needed: str) -> RowArray:
    """The array ``name`` of ``function`` with the row and column of each access; NotInForm
    (with ``needed``) when it is not a 2-D array of constant row width declared there, or an
    access or a pointer made from it is in another form."""
    indices = analysis(source).indices(function)
    context = _Context(source, indices, _file_constants(source))
    buffer = indices.buffers[name]
    extent = buffer.extents[-1] if len(buffer.extents) == 2 else None
    width = context.fold(extent) if extent is not None else None
    element = _element_bytes(buffer.element_type)
    if width is None or element is None:
        raise NotInForm(f"`{name}`, not a 2-D array of constant row width", needed)
    declaration = buffer.node
    if declaration is None or function.body is None or not _contains(function.body, declaration):
        # a file-scope array may be accessed from other functions too, which are not read
        raise NotInForm(f"`{name}`, not declared in {function.name}", needed)
    aliases: dict[str, Node] = {}
    accesses: list[RowAccess] = []
    for use in context.uses(name):
        if _contains(declaration, use):
            continue
        alias = _alias_of(source, use)
        if alias is not None:
            aliases[alias[0]] = alias[1]
            continue
        access = use.parent
        if access is None or access.type != "subscript_expression" or access.parent is None:
            raise _refuse(source, use, "is not a subscript `S[row][col]`", needed)
        accesses.append(_access_column(context, access.parent, element, width * element, needed))
    if not accesses:
        raise NotInForm(f"`{name}`, which is never accessed", needed)
    _check_later_phase(context, aliases, max(a.node.end_byte for a in accesses), needed)
    return RowArray(name, width * element, accesses, context)


def _rotations(
    source: ParsedSource, function: Function, node: Node
) -> tuple[RowArray, list[_Rotated]]:
    """The array named in the statement ``node`` and the rotation of each of its accesses
    (NotInForm when an access is not rotated, or not the same way)."""
    indices = analysis(source).indices(function)
    name = _array_of(source, indices, node)
    try:
        array = row_array(source, function, name, _NEEDED)
    except NotInForm as why:
        raise NotInForm(f"a rotation in {why.form}", why.needed) from None
    rotated = [_rotated(array.context, access, array.row_bytes) for access in array.accesses]
    period = math.lcm(*(len(r.rotation) for r in rotated))
    first = rotated[0]
    for other in rotated[1:]:
        if _periodic(other.rotation, period) != _periodic(first.rotation, period):
            raise NotInForm(
                f"rotated one way at line {first.line} and another at line {other.line}",
                _NEEDED,
            )
    return array, rotated


def rotation_removal(source: ParsedSource, function: Function, node: Node) -> list[Edit]:
    """The edits dropping the row rotation from every access of the shared array named in
    the statement ``node`` (NotInForm when an access is not rotated, or not the same way)."""
    _, rotated = _rotations(source, function, node)
    return [Edit.replace(r.replaced, source.text_of(r.kept)) for r in rotated]


def common_rotation(
    source: ParsedSource, function: Function, node: Node
) -> tuple[tuple[int, ...], int]:
    """The rotation every access of the array named in the statement ``node`` applies, in
    bytes for each ``row % len(rotation)``, and the bytes of a row (NotInForm as for
    :func:`rotation_removal`)."""
    array, rotated = _rotations(source, function, node)
    period = math.lcm(*(len(r.rotation) for r in rotated))
    return _periodic(rotated[0].rotation, period), array.row_bytes
