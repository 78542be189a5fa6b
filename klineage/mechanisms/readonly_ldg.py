"""Read-only loads through ``__ldg``.

``__ldg(&p[i])`` loads through the read-only (non-coherent texture) data path, which keeps
streaming reads out of the way of L1 write traffic. Modern compilers often emit it for
``const __restrict__`` pointers by themselves; writing it makes the choice explicit.

- remove: ``__ldg(&p[i])`` -> ``p[i]``; ``__ldg(p + i)`` -> ``p[i]`` when ``p`` is a
  pointer; any other ``__ldg(e)`` -> ``*(e)``, parenthesized as its place needs;
- apply: ``p[i]`` -> ``__ldg(&p[i])`` for a read of a ``const T*`` pointer (parameter or
  local) of a type ``__ldg`` supports, in device-only code; likewise ``*cast(e)`` ->
  ``__ldg(cast(e))`` for a read through a cast to such a pointer
  (``*reinterpret_cast<const uint4*>(p)``, the form the removal writes for other loads), and
  ``*(p + i + j)`` -> ``__ldg(p + i + j)``. A read whose pointer may point into shared or
  local memory (``&x`` of a local, a ``__shared__`` array; see
  :mod:`klineage.cuda.analysis.spaces`) is refused: ``__ldg`` there faults on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

from klineage.conditions import ArchAtLeast, Condition, Prose
from klineage.cuda.analysis import PointerSpaces, analysis
from klineage.cuda.cexpr import PRIMARY, UNARY, operand, precedence, wrap_at
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, call_name, strip_parens
from klineage.cuda.tree import operator_of
from klineage.kernel import KernelSource
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

# Element types with an `__ldg` overload (sm_35+; the half types need cuda_fp16/bf16 headers).
LDG_TYPES = frozenset(
    {
        "char",
        "signed char",
        "unsigned char",
        "short",
        "unsigned short",
        "int",
        "unsigned",
        "unsigned int",
        "long",
        "unsigned long",
        "long long",
        "unsigned long long",
        "int8_t",
        "uint8_t",
        "int16_t",
        "uint16_t",
        "int32_t",
        "uint32_t",
        "int64_t",
        "uint64_t",
        "float",
        "double",
        "char2",
        "char4",
        "uchar2",
        "uchar4",
        "short2",
        "short4",
        "ushort2",
        "ushort4",
        "int2",
        "int4",
        "uint2",
        "uint4",
        "longlong2",
        "ulonglong2",
        "float2",
        "float4",
        "double2",
        "half",
        "__half",
        "half2",
        "__half2",
        "__nv_bfloat16",
        "nv_bfloat16",
        "__nv_bfloat162",
        "nv_bfloat162",
    }
)


def _readonly_element(type_text: str) -> str | None:
    """``const float*`` -> ``float``; None unless a const single-level pointer of an __ldg type."""
    words = type_text.replace("*", " * ").split()
    if words.count("*") != 1 or words[-1] != "*" or "const" not in words[:-1]:
        return None
    element = " ".join(w for w in words[:-1] if w not in ("const", "__restrict__", "volatile"))
    return element if element in LDG_TYPES else None


def _is_rvalue(node: Node) -> bool:
    """Whether a subscript is read (not written, not address-taken)."""
    parent = node.parent
    if parent is None:
        return False
    if parent.type == "pointer_expression":
        return False  # `&p[i]`: address taken (perhaps already inside __ldg)
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == node:
        return False
    return parent.type != "update_expression"


@register
class ReadonlyLdg(Mechanism):
    name = "readonly_ldg"
    category = "memory"
    signature = ("constant",)
    family = "read-only loads"
    intent = (
        "Load read-only data through the non-coherent read-only cache with __ldg, keeping "
        "streaming reads apart from write traffic."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        for call in source.calls_named("__ldg"):
            refusal = None
            if len(call.args) != 1:
                refusal = f"__ldg with {len(call.args)} arguments is not the load intrinsic"
            detail = {"pointer": _base_pointer(source, call.args[0])} if call.args else {}
            yield self.site(source, call.node, detail=detail, refusal=refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        spaces = analysis(source).spaces
        for function in source.functions:
            if not function.device_only or function.body is None:
                continue
            types = source.local_types(function)
            for node in source.iter_nodes("subscript_expression", within=function.body):
                base = node.child_by_field_name("argument")
                indices = node.child_by_field_name("indices")
                if base is None or base.type != "identifier" or indices is None:
                    continue
                if len(indices.named_children) != 1 or not _is_rvalue(node):
                    continue
                element = _readonly_element(types.get(source.text_of(base), ""))
                if element is not None:
                    pointer = source.text_of(base)
                    yield self.site(
                        source,
                        node,
                        detail={"pointer": pointer},
                        refusal=_not_global(spaces, function, base, pointer),
                    )
            for node in source.iter_nodes("pointer_expression", within=function.body):
                address = node.child_by_field_name("argument")
                if address is None or not source.text_of(node).startswith("*"):
                    continue
                if not _is_rvalue(node):
                    continue
                pointer = _const_pointer_cast(source, address) or _const_pointer_sum(
                    source, address, types
                )
                if pointer is not None:
                    yield self.site(
                        source,
                        node,
                        detail={"pointer": pointer},
                        refusal=_not_global(spaces, function, address, pointer),
                    )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        call = self.node_at(source, site, "call_expression")
        arguments = call.child_by_field_name("arguments")
        assert arguments is not None
        (address,) = [c for c in arguments.named_children if c.type != "comment"]
        function = source.enclosing_function(call)
        types = source.local_types(function) if function is not None else {}
        if address.type == "pointer_expression" and source.text_of(address).startswith("&"):
            target = address.child_by_field_name("argument")
            assert target is not None
            text, binding = source.text_of(target), precedence(target)
        elif _is_pointer_plus_index(source, address, types):
            left = address.child_by_field_name("left")
            right = address.child_by_field_name("right")
            assert left is not None and right is not None
            text, binding = f"{source.text_of(left)}[{source.text_of(right)}]", PRIMARY
        else:
            text, binding = f"*{operand(source, address, UNARY)}", UNARY
        return [Edit.replace(call, wrap_at(call, text, binding))]

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        node = self.node_at(source, site, "subscript_expression", "pointer_expression")
        if node.type == "pointer_expression":
            address = node.child_by_field_name("argument")
            assert address is not None
            return [Edit.replace(node, f"__ldg({source.text_of(strip_parens(address))})")]
        return [Edit.replace(node, f"__ldg(&{source.text_of(node)})")]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        pointer = site.detail.get("pointer", "the loaded buffer")
        return [
            Prose(
                text=f"{pointer} must not be written while the kernel runs, through any pointer",
                why="the read-only data cache is not coherent with writes",
            ),
            ArchAtLeast(sm=35, why="__ldg needs sm_35"),
        ]


def _not_global(
    spaces: PointerSpaces, function: Function, address: Node, pointer: str
) -> str | None:
    """Why ``__ldg`` cannot read through ``address``, or None when nothing shows it is not
    global memory (``__ldg`` on a shared or local address faults on the GPU)."""
    found = spaces.of(function, address) & {"shared", "local"}
    if not found:
        return None
    where = " and ".join(sorted(found))
    return f"{pointer} may point into {where} memory, where __ldg faults (it reads global only)"


def _const_pointer_sum(source: ParsedSource, address: Node, types: dict[str, str]) -> str | None:
    """``p``, ``p + i`` or ``p + i + j`` (``p`` a ``const T*`` of an ``__ldg`` type, the form
    the removal writes for ``__ldg(p + i + j)``): the pointer; None for anything else."""
    node = strip_parens(address)
    while node.type == "binary_expression" and operator_of(node) in ("+", "-"):
        left = node.child_by_field_name("left")
        if left is None:
            return None
        node = strip_parens(left)
    if node.type != "identifier":
        return None
    pointer = source.text_of(node)
    return pointer if _readonly_element(types.get(pointer, "")) is not None else None


def _is_pointer_plus_index(source: ParsedSource, node: Node, types: dict[str, str]) -> bool:
    """``p + i`` with ``p`` a declared pointer: reads as ``p[i]``."""
    if node.type != "binary_expression":
        return False
    op = node.child_by_field_name("operator")
    left = node.child_by_field_name("left")
    if op is None or op.type != "+" or left is None or left.type != "identifier":
        return False
    return types.get(source.text_of(left), "").endswith("*")


def _base_pointer(source: ParsedSource, address: Node) -> str:
    """The pointer an ``__ldg`` argument reads through: ``&p[i]`` and ``p + i`` -> ``p``."""
    node = address
    if node.type == "pointer_expression":
        node = node.child_by_field_name("argument") or node
    if node.type == "subscript_expression":
        node = node.child_by_field_name("argument") or node
    if node.type == "binary_expression":
        node = node.child_by_field_name("left") or node
    return source.text_of(node)


def _const_pointer_cast(source: ParsedSource, address: Node) -> str | None:
    """The operand of a cast to a ``const T*`` of an ``__ldg`` type (``reinterpret_cast``,
    ``static_cast`` or a C cast); None for anything else."""
    node = strip_parens(address)
    if node.type == "cast_expression":
        target, value = node.child_by_field_name("type"), node.child_by_field_name("value")
    elif call_name(source, node) in ("reinterpret_cast", "static_cast"):
        function = node.child_by_field_name("function")
        assert function is not None
        types = function.child_by_field_name("arguments")
        target = types.named_children[0] if types is not None and types.named_children else None
        arguments = node.child_by_field_name("arguments")
        value = arguments.named_children[0] if arguments and arguments.named_children else None
    else:
        return None
    if target is None or value is None or _readonly_element(source.text_of(target)) is None:
        return None
    return source.text_of(value)
