"""Packed vectors: 128-bit (and 64-bit) accesses however they are spelled.

A kernel moves 16 bytes per thread with ``float4``, ``uint4``, ``int4``, or with a struct of its
own: an aligned array of 4 floats or 8 bfloat16 (``template <class T> struct alignas(16)
Packed128 { T payload[sizeof(int4) / sizeof(T)]; }``), named through a typedef (``x128``)
and moved by small helpers that cast to ``int4*`` (``load128(p)``, ``store128cs(p, v)``), or
by function-like macros that reinterpret an element's address (``#define FLOAT4(v)
(reinterpret_cast<float4 *>(&(v))[0])``, used as ``FLOAT4(a[i])`` on either side of ``=``).
This module resolves those names: how many elements and bytes a type is, which functions are
vector load and store helpers, which macros are vector accesses, and what ``x128::size`` is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from klineage.cuda.cexpr import without_outer_parentheses
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import (
    binary_operands,
    call_arguments,
    descendants,
    strip_casts,
    strip_parens,
)

__all__ = [
    "BUILTIN_VECTORS",
    "ELEMENT_BYTES",
    "AccessMacro",
    "PackedType",
    "VectorHelper",
    "VectorModel",
    "cast_operand",
    "cast_target",
    "dereferenced_cast",
]

ELEMENT_BYTES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "uint": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "int64_t": 8,
    "uint64_t": 8,
    "long long": 8,
    "short": 2,
    "char": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "half": 2,
    "__half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
    "bf16": 2,
    "__nv_fp8_e4m3": 1,
    "__nv_fp8_e5m2": 1,
}
"""Bytes of the scalar types kernels pack."""

BUILTIN_VECTORS: dict[str, tuple[str, int]] = {
    "float2": ("float", 2),
    "float4": ("float", 4),
    "double2": ("double", 2),
    "int2": ("int", 2),
    "int4": ("int", 4),
    "uint2": ("unsigned", 2),
    "uint4": ("unsigned", 4),
    "longlong2": ("long long", 2),
    "ulonglong2": ("long long", 2),
    "short4": ("short", 4),
    "char4": ("char", 4),
    "half2": ("half", 2),
    "__half2": ("half", 2),
    "__nv_bfloat162": ("__nv_bfloat16", 2),
    "nv_bfloat162": ("__nv_bfloat16", 2),
}
"""CUDA's vector types: element type and count."""

_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|struct|typename)\b")


def _plain(text: str) -> str:
    return " ".join(_QUALIFIERS.sub(" ", text).replace("*", " ").replace("&", " ").split())


@dataclass(frozen=True)
class PackedType:
    """A type that packs ``count`` elements of ``element`` into ``bytes`` bytes."""

    name: str
    element: str
    count: int
    bytes: int
    user_defined: bool
    """A struct of the file's own (an aligned array with helpers), not a CUDA vector type."""


@dataclass(frozen=True)
class VectorHelper:
    """A device function that loads or stores a packed vector through a pointer parameter."""

    name: str
    kind: Literal["load", "store"]
    bytes: int
    pointer_param: int
    """The index of the parameter holding the address."""


@dataclass(frozen=True)
class AccessMacro:
    """A function-like macro of one parameter that reads or writes the packed vector at its
    argument's address: ``(reinterpret_cast<V*>(&(v))[0])`` or ``(*reinterpret_cast<V*>(&(v)))``."""

    name: str
    vector: str
    """The packed type ``V`` (``float4``, ``half2``), through aliases."""


_ACCESS_MACRO = re.compile(
    r"^(?P<deref>\*\s*)?(?P<open>\(\s*)?"
    r"(?:reinterpret_cast\s*<\s*(?:const\s+)?(?P<type>[\w:]+)\s*\*\s*>"
    r"|\(\s*(?:const\s+)?(?P<ctype>[\w:]+)\s*\*\s*\))"
    r"\s*\(\s*&\s*(?P<arg>\w+|\(\s*\w+\s*\))\s*\)(?(open)\s*\))"
    r"\s*(?P<index>\[\s*0\s*\])?$"
)
"""The body of an access macro, its outer parentheses removed: a cast of the argument's
address to ``V*``, then ``[0]`` or a leading ``*``."""


@dataclass(frozen=True)
class _Template:
    """A struct template whose payload is an array of its type parameter."""

    name: str
    parameter: str
    bytes: int | None
    """The struct's total size when its extent is ``sizeof(V) / sizeof(T)`` (16 for int4)."""


class VectorModel:
    """The packed vector types and helpers of one source and of the local headers it
    includes (``x128`` and ``load128`` kept in a shared ``common.h``); the file's own
    definitions win over a header's."""

    def __init__(self, source: ParsedSource) -> None:
        self.source = source
        self._holders = (*source.headers, source)
        self.aliases: dict[str, str] = {}
        self._templates: dict[str, _Template] = {}
        self._structs: dict[str, PackedType] = {}
        self._read_aliases()
        self._read_structs()
        self.helpers: dict[str, VectorHelper] = self._read_helpers()
        self.access_macros: dict[str, AccessMacro] = self._read_access_macros()

    # -- types ------------------------------------------------------------------------------

    def resolve(self, type_text: str) -> str:
        """A type name through typedefs and ``using`` aliases, qualifiers dropped."""
        name = _plain(type_text)
        for _ in range(8):
            target = self.aliases.get(name)
            if target is None:
                break
            name = _plain(target)
        return name

    def element_bytes(self, type_text: str) -> int | None:
        """Bytes one value of a type takes (a scalar, a vector or a packed struct), if known."""
        name = self.resolve(type_text)
        if name in ELEMENT_BYTES:
            return ELEMENT_BYTES[name]
        packed = self.packed(name)
        return packed.bytes if packed is not None else None

    def packed(self, type_text: str) -> PackedType | None:
        """The packed vector a type is (``float4``, ``x128``, ``Packed128<float>``); else None."""
        name = self.resolve(type_text)
        if name in BUILTIN_VECTORS:
            element, count = BUILTIN_VECTORS[name]
            return PackedType(name, element, count, count * ELEMENT_BYTES[element], False)
        if name in self._structs:
            return self._structs[name]
        match = re.match(r"^([\w:]+)\s*<\s*(.+)\s*>$", name)
        if match is not None:
            template = self._templates.get(match.group(1).split("::")[-1])
            element = self.resolve(match.group(2))
            size = ELEMENT_BYTES.get(element)
            if template is not None and template.bytes is not None and size:
                count = template.bytes // size
                return PackedType(name, element, count, template.bytes, True)
        return None

    def constant(self, qualified: str) -> int | None:
        """``x128::size`` -> 8 for a bfloat16 Packed128; None when not a packed size."""
        owner, _, member = "".join(qualified.split()).rpartition("::")
        if member != "size" or not owner:
            return None
        packed = self.packed(owner)
        return packed.count if packed is not None and packed.user_defined else None

    # -- reading ----------------------------------------------------------------------------

    def _read_aliases(self) -> None:
        for source in self._holders:
            for node in source.nodes("type_definition"):
                target = node.child_by_field_name("type")
                for declarator in node.children_by_field_name("declarator"):
                    if target is not None and declarator.type == "type_identifier":
                        self.aliases[source.text_of(declarator)] = source.text_of(target)
            for node in source.nodes("alias_declaration"):
                name = node.child_by_field_name("name")
                target = node.child_by_field_name("type")
                if name is not None and target is not None:
                    self.aliases[source.text_of(name)] = source.text_of(target)

    def _read_structs(self) -> None:
        for source in self._holders:
            for node in source.nodes("struct_specifier"):
                name = node.child_by_field_name("name")
                body = node.child_by_field_name("body")
                if name is None or body is None:
                    continue
                self._read_struct(source, node, source.text_of(name), body)

    def _read_struct(self, source: ParsedSource, node: Node, name: str, body: Node) -> None:
        parameter = _template_parameter(source, node)
        for field in body.named_children:
            if field.type != "field_declaration":
                continue
            declarator = field.child_by_field_name("declarator")
            field_type = field.child_by_field_name("type")
            if declarator is None or field_type is None or declarator.type != "array_declarator":
                continue
            size = declarator.child_by_field_name("size")
            element = _plain(source.text_of(field_type))
            if parameter is not None and element == parameter:
                self._templates[name] = _Template(
                    name, parameter, _sizeof_ratio(source, body, size)
                )
                return
            count = _folded_extent(source, size)
            element_size = ELEMENT_BYTES.get(self.resolve(element))
            if count and element_size and count * element_size in (8, 16, 32):
                self._structs[name] = PackedType(
                    name, self.resolve(element), count, count * element_size, True
                )
                return

    def _read_access_macros(self) -> dict[str, AccessMacro]:
        """Function-like macros of one parameter whose body reads the vector at the argument's
        address; the first definition of a name wins."""
        found: dict[str, AccessMacro] = {}
        for source, node in self.source.defines("preproc_function_def"):
            name = node.child_by_field_name("name")
            value = node.child_by_field_name("value")
            parameters = node.child_by_field_name("parameters")
            params = [source.text_of(p) for p in parameters.named_children] if parameters else []
            if name is None or value is None or len(params) != 1:
                continue
            body = without_outer_parentheses(" ".join(source.text_of(value).split()))
            match = _ACCESS_MACRO.match(body)
            if match is None or bool(match.group("deref")) == bool(match.group("index")):
                continue
            if match.group("arg").strip("() ") != params[0]:
                continue
            vector = self.resolve(match.group("type") or match.group("ctype"))
            if self.packed(vector) is not None:
                found.setdefault(source.text_of(name), AccessMacro(source.text_of(name), vector))
        return found

    def _read_helpers(self) -> dict[str, VectorHelper]:
        """Device functions that dereference a pointer parameter cast to a wide type."""
        found: dict[str, VectorHelper] = {}
        for source in self._holders:
            for function in source.functions:
                if function.body is None or not function.runs_on_device or function.is_kernel:
                    continue
                helper = self._helper(source, function)
                if helper is not None:
                    found[function.name] = helper
                elif source is self.source:
                    found.pop(function.name, None)  # the file's own function of that name
        return found

    def _helper(self, source: ParsedSource, function: Function) -> VectorHelper | None:
        assert function.body is not None
        params = [p.name for p in function.params]
        for cast in descendants(
            function.body, "call_expression", "cast_expression", "template_function"
        ):
            target = cast_target(source, cast)
            if target is None:
                continue
            packed = self.packed(target.rstrip("*").strip())
            if packed is None or packed.bytes < 8:
                continue
            pointer = cast_operand(cast)
            root = strip_casts(pointer) if pointer is not None else None
            if root is None or root.type != "identifier" or source.text_of(root) not in params:
                continue
            index = params.index(source.text_of(root))
            kind: Literal["load", "store"] = "store" if _written_through(cast) else "load"
            if (
                kind == "load"
                and function.params[index].is_const is False
                and (
                    _stored_by_call(source, cast)
                    or _stored_through_local(source, cast, function.body)
                )
            ):
                kind = "store"
            return VectorHelper(function.name, kind, packed.bytes, index)
        return None


def _template_parameter(source: ParsedSource, struct: Node) -> str | None:
    parent = struct.parent
    while parent is not None and parent.type not in ("template_declaration", "translation_unit"):
        parent = parent.parent
    if parent is None or parent.type != "template_declaration":
        return None
    parameters = parent.child_by_field_name("parameters")
    for parameter in parameters.named_children if parameters is not None else []:
        names = [c for c in parameter.named_children if c.type == "type_identifier"]
        if names:
            return source.text_of(names[-1])
    return None


def _sizeof_ratio(source: ParsedSource, body: Node, size: Node | None) -> int | None:
    """16 for an extent ``sizeof(int4) / sizeof(T)`` (or a member ``size`` defined so)."""
    text = source.text_of(size) if size is not None else ""
    if "sizeof" not in text:
        for member in body.named_children:
            if member.type == "comment":
                continue
            member_text = source.text_of(member)
            if re.search(rf"\b{re.escape(text)}\s*=", member_text) and "sizeof" in member_text:
                text = member_text
                break
    match = re.search(r"sizeof\s*\(\s*(\w+)\s*\)\s*/\s*sizeof", text)
    if match is None:
        return None
    vector = BUILTIN_VECTORS.get(match.group(1))
    return vector[1] * ELEMENT_BYTES[vector[0]] if vector is not None else None


def _folded_extent(source: ParsedSource, size: Node | None) -> int | None:
    from klineage.cuda.cexpr import fold_int

    return fold_int(source, size) if size is not None else None


def cast_target(source: ParsedSource, node: Node) -> str | None:
    """``float4*`` of ``reinterpret_cast<float4*>(p)`` or ``(float4*)p``."""
    if node.type == "cast_expression":
        type_node = node.child_by_field_name("type")
        return " ".join(source.text_of(type_node).split()) if type_node is not None else None
    if node.type == "call_expression":
        function = node.child_by_field_name("function")
        if function is None or function.type != "template_function":
            return None
        name = function.child_by_field_name("name")
        if name is None or source.text_of(name) not in ("reinterpret_cast", "static_cast"):
            return None
        arguments = function.child_by_field_name("arguments")
        if arguments is None:
            return None
        return " ".join(source.text_of(arguments).strip("<>").split())
    return None


def dereferenced_cast(source: ParsedSource, node: Node) -> tuple[str, Node] | None:
    """(``V*``, ``p``) of ``*reinterpret_cast<V*>(p)``, ``reinterpret_cast<V*>(p)[0]``, or either
    written with a C cast ``(V*)p``: the value a cast pointer points to."""
    node = strip_parens(node)
    if node.type == "pointer_expression" and source.text_of(node).startswith("*"):
        cast = node.child_by_field_name("argument")
    elif node.type == "subscript_expression":
        indices = node.child_by_field_name("indices")
        if indices is None or [source.text_of(i) for i in indices.named_children] != ["0"]:
            return None
        cast = node.child_by_field_name("argument")
    else:
        return None
    cast = strip_parens(cast) if cast is not None else None
    target = cast_target(source, cast) if cast is not None else None
    operand = cast_operand(cast) if cast is not None and target is not None else None
    if target is None or operand is None:
        return None
    return target, strip_parens(operand)


def cast_operand(node: Node) -> Node | None:
    """What a cast converts: the value of ``(T*)p``, the argument of
    ``reinterpret_cast<T*>(p)``; None when the cast has no operand."""
    if node.type == "cast_expression":
        return node.child_by_field_name("value")
    args = call_arguments(node)
    return args[0] if args else None


def _written_through(cast: Node) -> bool:
    """Whether the cast pointer is dereferenced on the left of an assignment."""
    current = cast
    while current.parent is not None and current.parent.type in (
        "parenthesized_expression",
        "pointer_expression",
        "subscript_expression",
    ):
        current = current.parent
    parent = current.parent
    return (
        parent is not None
        and parent.type == "assignment_expression"
        and parent.child_by_field_name("left") == current
    )


def _stored_by_call(source: ParsedSource, cast: Node) -> bool:
    """``__stcs(reinterpret_cast<int4*>(p), v)``: a store intrinsic taking the cast pointer."""
    parent = cast.parent
    if parent is None or parent.type != "argument_list" or parent.parent is None:
        return False
    function = parent.parent.child_by_field_name("function")
    return function is not None and source.text_of(function).startswith("__st")


def _stored_through_local(source: ParsedSource, cast: Node, body: Node) -> bool:
    """``int* e = reinterpret_cast<int*>(reinterpret_cast<int4*>(p)); e[0] = v.x;`` (or
    ``__stcs(&e[0], v.x);``): the cast pointer kept in a local that is then written through."""
    current = cast
    while current.parent is not None and (
        current.parent.type in ("parenthesized_expression", "cast_expression", "argument_list")
        or cast_target(source, current.parent) is not None
    ):
        current = current.parent
    declarator = current.parent
    if declarator is None or declarator.type != "init_declarator":
        return False
    name = declarator.child_by_field_name("declarator")
    while name is not None and name.type != "identifier":
        name = name.child_by_field_name("declarator")
    if name is None:
        return False
    for assignment in descendants(body, "assignment_expression"):
        left = assignment.child_by_field_name("left")
        while left is not None and left.type == "parenthesized_expression" and left.named_children:
            left = left.named_children[0]
        if left is None or left.type not in ("subscript_expression", "pointer_expression"):
            continue
        base = left.child_by_field_name("argument")
        if base is not None and source.text_of(base) == source.text_of(name):
            return True
    written = source.text_of(name)
    return any(_stores_into(source, c, written) for c in descendants(body, "call_expression"))


def _stores_into(source: ParsedSource, call: Node, name: str) -> bool:
    """``__stcs(&e[k], v)``, ``__stcs(e + k, v)`` or ``__stcs(e, v)``: a store intrinsic
    writing through ``e``."""
    function = call.child_by_field_name("function")
    arguments = call_arguments(call)
    if function is None or not source.text_of(function).startswith("__st") or not arguments:
        return False
    address = strip_casts(arguments[0])
    if address.type == "pointer_expression" and source.text_of(address).startswith("&"):
        element = address.child_by_field_name("argument")
        base = element.child_by_field_name("argument") if element is not None else None
        return (
            element is not None
            and element.type == "subscript_expression"
            and base is not None
            and source.text_of(base) == name
        )
    sides = binary_operands(address, "+")
    if sides is not None:
        return any(source.text_of(side) == name for side in sides)
    return address.type == "identifier" and source.text_of(address) == name
