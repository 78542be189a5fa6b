"""Shared helpers of the local memory and parallelism mechanisms.

``vectorized_access``, ``packed_half2_math``, ``thread_coarsening`` and ``grid_stride_loop``
all rewrite the same few shapes of code, so the shapes are recognized here once:

- **expression facts**: casts and parentheses stripped, CUDA built-ins (``threadIdx.x``),
  side-effect freedom (an expression that a rewrite evaluates twice must not write
  anything), barriers and warp collectives (code that a rewrite runs a different number of
  times per thread must not hold any);
- **expression types**: a small type inference over parameters, locals, struct and union
  fields, subscripts and the intrinsics the mechanisms rewrite, enough to tell a
  ``__nv_bfloat162`` from a ``__half2`` and a ``float4*`` from a ``float*``;
- **the one-thread-per-element kernel**: ``const int64_t i = blockIdx.x * blockDim.x +
  threadIdx.x;`` followed by ``if (i >= n) return;`` (or ``if (i < n) {...}`` at the end),
  the naive form the heldout kernels use and the one these mechanisms start from;
- **launch grids**: the kernel's bound ``n`` rewritten at each launch (kernel parameters
  replaced by the launch's arguments), and a grid that covers it with ``per_thread``
  elements per thread, so a rewrite that changes how many elements a thread handles changes
  the launch with it;
- **indentation**: block text moved in or out by a fixed number of spaces, exactly
  reversibly, so removals give back the original text byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from klineage.conditions import AxisDivisible, Condition, PointerAlignment, Prose, evaluate_size
from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import PRIMARY, fold_int, precedence, to_size_expr
from klineage.cuda.facts import launch_block_size, launch_names, template_bindings
from klineage.cuda.source import (
    Function,
    Launch,
    Node,
    ParsedSource,
    strip_casts,
    strip_parens,
)
from klineage.cuda.tree import assigned_names, builtin_of, dim3_extents, operator_of, walk

__all__ = [
    "ELEMENT_SIZES",
    "VECTOR_TYPES",
    "ElementKernel",
    "GlobalIndex",
    "Refused",
    "VectorType",
    "alignment_conditions",
    "alignment_of_sum",
    "assigned_names",
    "binary",
    "builtin_of",
    "collective_in",
    "cover_grid",
    "element_kernels",
    "element_refusal",
    "element_returns",
    "expr_type",
    "form_text",
    "global_index",
    "grid_cap",
    "grid_edits",
    "identifiers",
    "index_bound",
    "index_declaration",
    "is_block_size",
    "is_side_effect_free",
    "leaving_jumps",
    "local_types",
    "loop_bound_jumps",
    "memory_accesses_in",
    "names_in_function",
    "normalize_type",
    "shift",
    "splice",
    "statements",
    "strip_casts",
    "strip_parens",
    "tensor_name",
    "unshift",
    "walk",
]


class Refused(Exception):
    """A rewrite that cannot be done safely here; the message is the reason, in one sentence."""


# ---------------------------------------------------------------------------------------------
# Nodes and expressions
# ---------------------------------------------------------------------------------------------


def statements(block: Node) -> list[Node]:
    """The statements of a compound statement (comments left out)."""
    return [c for c in block.named_children if c.type != "comment"]


def identifiers(source: ParsedSource, node: Node) -> list[Node]:
    """The ``identifier`` nodes under ``node`` (field names and types are other kinds)."""
    return [n for n in walk(node) if n.type == "identifier"]


def binary(node: Node, *ops: str) -> tuple[Node, Node] | None:
    """(left, right) of a binary expression with one of ``ops``, else None."""
    if node.type != "binary_expression" or operator_of(node) not in ops:
        return None
    left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
    if left is None or right is None:
        return None
    return left, right


_PURE_CALLS = frozenset(
    {
        "abs",
        "fabs",
        "fabsf",
        "min",
        "max",
        "fminf",
        "fmaxf",
        "fmin",
        "fmax",
        "sqrtf",
        "sqrt",
        "rsqrtf",
        "expf",
        "exp",
        "exp2f",
        "logf",
        "log",
        "log2f",
        "tanhf",
        "tanh",
        "erff",
        "powf",
        "floorf",
        "ceilf",
        "roundf",
        "truncf",
        "fmaf",
        "sinf",
        "cosf",
        "reinterpret_cast",
        "static_cast",
        "const_cast",
    }
)
_IMPURE_PREFIXES = (
    "atomic",
    "__sync",
    "__shfl",
    "__ballot",
    "__any",
    "__all",
    "__activemask",
    "__threadfence",
    "__nanosleep",
    "__trap",
    "__st",
    "__match",
    "__reduce",
    "printf",
)


def _call_name(source: ParsedSource, call: Node) -> str:
    function = call.child_by_field_name("function")
    if function is None:
        return ""
    if function.type == "template_function":
        function = function.child_by_field_name("name") or function
    return source.text_of(function)


def is_pure_call(source: ParsedSource, call: Node) -> bool:
    """A call known to read nothing it does not get and to write nothing: math functions,
    conversion and arithmetic intrinsics, ``make_float4``-style constructors, C++ casts, the
    file's arithmetic macros (``OFFSET(row, col, ld)``) and access macros (``HALF2(a[i])``, a
    read)."""
    name = _call_name(source, call)
    if name in _PURE_CALLS or name.startswith("make_"):
        return True
    if name in analysis(source).arithmetic_macros or name in analysis(source).vectors.access_macros:
        return True
    return name.startswith("__") and not name.startswith(_IMPURE_PREFIXES)


def is_side_effect_free(source: ParsedSource, node: Node) -> bool:
    """Whether evaluating ``node`` twice is the same as evaluating it once: no assignment,
    no ``++``/``--``, no call that is not known to be pure."""
    for n in walk(node):
        if n.type in ("assignment_expression", "update_expression", "new_expression"):
            return False
        if n.type == "call_expression" and not is_pure_call(source, n):
            return False
        if "asm" in n.type or n.type == "lambda_expression":
            return False
    return True


_WARP_WIDE = ("__shfl", "__ballot", "__any", "__all", "__activemask", "__match", "__reduce")


def collective_in(source: ParsedSource, nodes: Iterable[Node]) -> str | None:
    """The first barrier, warp collective, asynchronous copy or inline assembly under
    ``nodes`` (its text), or None. Code holding one must run the same number of times in
    every thread of a warp or block, which the parallelism rewrites change. Any call whose
    name holds ``sync`` or ``barrier`` counts (``__syncthreads``, ``__shfl_xor_sync``,
    ``g.sync``, ``cuda::memcpy_async``): a false alarm costs a refusal, a miss a deadlock."""
    for node in nodes:
        for n in walk(node):
            if "asm" in n.type:
                return source.snippet(n, 40)
            if n.type != "call_expression":
                continue
            name = _call_name(source, n)
            if "sync" in name or "barrier" in name or name.startswith(_WARP_WIDE):
                return name
    return None


@dataclass(frozen=True)
class RegionAccesses:
    """The memory a stretch of code reads and stores, by buffer (the parameter or shared
    array an address starts from, as the index analysis names it)."""

    loads: dict[tuple[int, int], str]
    """(start, end) of each load's node -> its buffer."""
    stores: dict[tuple[int, int], str]
    """(start, end) of each store's node (or of the helper call that stores) -> its buffer."""
    unplaced: Node | None
    """A store whose buffer the analysis cannot tell, if any."""

    def loads_within(self, nodes: Iterable[Node]) -> set[str]:
        """The buffers loaded by accesses inside ``nodes``."""
        spans = [(n.start_byte, n.end_byte) for n in nodes]
        return {
            buffer
            for (start, end), buffer in self.loads.items()
            if any(a <= start and end <= b for a, b in spans)
        }


def memory_accesses_in(
    source: ParsedSource, function: Function, start: int, end: int
) -> RegionAccesses:
    """The loads and stores of ``function`` between bytes ``start`` and ``end``. Distinct
    buffers are taken to be distinct memory (the ABI's parameters are separate tensors)."""
    loads: dict[tuple[int, int], str] = {}
    stores: dict[tuple[int, int], str] = {}
    for access in analysis(source).indices(function).accesses():
        node = access.node
        if not (start <= node.start_byte and node.end_byte <= end):
            continue
        key = (node.start_byte, node.end_byte)
        if access.direction == "load":
            loads[key] = access.buffer.name
        else:
            stores[key] = access.buffer.name
    unplaced = None
    assert function.body is not None
    for node in walk(function.body):
        if not (start <= node.start_byte and node.end_byte <= end):
            continue
        target = None
        if node.type == "assignment_expression":
            target = node.child_by_field_name("left")
        elif node.type == "update_expression":
            target = node.child_by_field_name("argument")
        if target is None or strip_parens(target).type == "identifier":
            continue
        target = strip_parens(target)
        if (target.start_byte, target.end_byte) not in stores and unplaced is None:
            unplaced = target
    return RegionAccesses(loads, stores, unplaced)


def loop_bound_jumps(root: Node, kinds: tuple[str, ...]) -> list[Node]:
    """The statements of ``kinds`` (``return_statement``, ``continue_statement``...) under
    ``root`` that are not inside a nested loop, switch or lambda (for ``return``: not inside
    a lambda only), i.e. the jumps that leave the code ``root`` stands for."""
    found: list[Node] = []
    stack = list(reversed(root.children))
    while stack:
        node = stack.pop()
        if node.type == "lambda_expression":
            continue
        if node.type in kinds:
            found.append(node)
        nested = node.type in (
            "for_statement",
            "for_range_loop",
            "while_statement",
            "do_statement",
            "switch_statement",
        )
        if nested and kinds != ("return_statement",):
            # break/continue inside a nested loop (or break in a switch) bind there
            continue
        stack.extend(reversed(node.children))
    return found


# ---------------------------------------------------------------------------------------------
# Indentation
# ---------------------------------------------------------------------------------------------


def shift(text: str, spaces: int) -> str:
    """Indent every line after the first by ``spaces`` (blank lines, and preprocessor lines at
    column 0, are left alone)."""
    lines = text.split("\n")
    pad = " " * spaces
    kept = [line if not line.strip() or line.startswith("#") else pad + line for line in lines[1:]]
    return "\n".join([lines[0], *kept])


def form_text(text: str) -> str:
    """Text compared for canonical forms: ``#pragma unroll`` lines and spacing ignored (the
    pragma_unroll mechanism may have removed the pragma; that does not change the form)."""
    kept = [line for line in text.split("\n") if line.strip() != "#pragma unroll"]
    return " ".join(" ".join(kept).split())


def unshift(text: str, spaces: int) -> str | None:
    """The inverse of :func:`shift`; None when a line is not indented that far. A preprocessor
    line indented less stays where it is: formatters put `#pragma` at column 0 inside a body."""
    lines = text.split("\n")
    pad = " " * spaces
    out = [lines[0]]
    for line in lines[1:]:
        if not line.strip():
            out.append(line)
        elif line.startswith(pad):
            out.append(line[spaces:])
        elif line.lstrip().startswith("#"):
            out.append(line)
        else:
            return None
    return "\n".join(out)


def splice(source: ParsedSource, start: int, end: int, edits: Iterable[tuple[Node, str]]) -> str:
    """The text of bytes [start, end) with some nodes inside replaced."""
    pieces: list[bytes] = []
    cursor = start
    for node, text in sorted(edits, key=lambda e: e[0].start_byte):
        if node.start_byte < cursor or node.end_byte > end:
            raise Refused("overlapping rewrites inside one site")
        pieces += [source.data[cursor : node.start_byte], text.encode("utf-8")]
        cursor = node.end_byte
    pieces.append(source.data[cursor:end])
    return b"".join(pieces).decode("utf-8")


# ---------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VectorType:
    """A CUDA vector type as memory sees it: ``count`` elements of ``element``."""

    name: str
    element: str
    count: int
    make: str
    """The function that builds one from its elements (``make_float4``, ``__halves2half2``)."""

    @property
    def fields(self) -> tuple[str, ...]:
        return ("x", "y", "z", "w")[: self.count]


VECTOR_TYPES: dict[str, VectorType] = {
    v.name: v
    for v in (
        VectorType("float4", "float", 4, "make_float4"),
        VectorType("float2", "float", 2, "make_float2"),
        VectorType("int4", "int", 4, "make_int4"),
        VectorType("int2", "int", 2, "make_int2"),
        VectorType("uint4", "unsigned int", 4, "make_uint4"),
        VectorType("uint2", "unsigned int", 2, "make_uint2"),
        VectorType("double2", "double", 2, "make_double2"),
        VectorType("longlong2", "long long", 2, "make_longlong2"),
        VectorType("__half2", "__half", 2, "__halves2half2"),
        VectorType("half2", "__half", 2, "__halves2half2"),
        VectorType("__nv_bfloat162", "__nv_bfloat16", 2, "__halves2bfloat162"),
        VectorType("nv_bfloat162", "__nv_bfloat16", 2, "__halves2bfloat162"),
    )
}

ELEMENT_SIZES: dict[str, int] = {
    "float": 4,
    "int": 4,
    "unsigned": 4,
    "unsigned int": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "double": 8,
    "long long": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "__half": 2,
    "half": 2,
    "__nv_bfloat16": 2,
    "nv_bfloat16": 2,
}

_HALF_PAIRS = {
    "__half": "__half2",
    "half": "half2",
    "__nv_bfloat16": "__nv_bfloat162",
    "nv_bfloat16": "nv_bfloat162",
}
_SIGNED = frozenset({"int", "int32_t"})


def vector_for(element: str, width: int) -> str | None:
    """The vector type that holds ``width`` elements of ``element``: float x4 -> ``float4``,
    bf16 x8 -> ``uint4`` (16 bytes), bf16 x2 -> ``__nv_bfloat162``; None when there is none."""
    size = ELEMENT_SIZES.get(element)
    if size is None:
        return None
    total = size * width
    if element == "float":
        return {8: "float2", 16: "float4"}.get(total)
    if size == 2:
        return {4: _HALF_PAIRS.get(element), 8: "uint2", 16: "uint4"}.get(total)
    if size == 4:
        prefix = "int" if element in _SIGNED else "uint"
        return {8: f"{prefix}2", 16: f"{prefix}4"}.get(total)
    if size == 8 and total == 16:
        return "double2" if element == "double" else "longlong2"
    return None


_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct|union)\b")


def normalize_type(text: str) -> str:
    """``const float4* __restrict__`` -> ``float4*``; ``float4 (&)[kVec]`` -> ``float4[]``."""
    text = _QUALIFIERS.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    text = text.replace("(&)", "").replace("&", "").replace("(", "").replace(")", "")
    text = re.sub(r"\s*([*\[\]])\s*", r"\1", " ".join(text.split()))
    return text.strip()


def element_of(type_text: str) -> str | None:
    """The type a subscript or dereference gives: ``float4*`` -> ``float4``."""
    if type_text.endswith("[]"):
        return type_text[:-2]
    if type_text.endswith("*"):
        return type_text[:-1]
    return None


def struct_fields(source: ParsedSource) -> dict[str, dict[str, str]]:
    """Struct/union name -> field name -> normalized type, for the types in this file."""
    cached: dict[str, dict[str, str]] | None = source.__dict__.get("_klineage_struct_fields")
    if cached is not None:
        return cached
    found: dict[str, dict[str, str]] = {}
    for kind in ("struct_specifier", "union_specifier", "class_specifier"):
        for node in source.nodes(kind):
            name = node.child_by_field_name("name")
            body = node.child_by_field_name("body")
            if name is None or body is None:
                continue
            fields: dict[str, str] = {}
            for decl in body.named_children:
                if decl.type != "field_declaration":
                    continue
                type_node = decl.child_by_field_name("type")
                if type_node is None:
                    continue
                base = source.text_of(type_node)
                for declarator in decl.children_by_field_name("declarator"):
                    suffix = ""
                    current: Node | None = declarator
                    while current is not None and current.type not in (
                        "field_identifier",
                        "identifier",
                    ):
                        if current.type == "array_declarator":
                            suffix += "[]"
                        elif current.type == "pointer_declarator":
                            suffix = "*" + suffix
                        current = current.child_by_field_name("declarator")
                    if current is not None:
                        fields[source.text_of(current)] = normalize_type(base + suffix)
            found[source.text_of(name)] = fields
    source.__dict__["_klineage_struct_fields"] = found
    return found


_RETURN_TYPES: dict[str, str] = {
    "__floats2bfloat162_rn": "__nv_bfloat162",
    "__float22bfloat162_rn": "__nv_bfloat162",
    "__halves2bfloat162": "__nv_bfloat162",
    "__floats2half2_rn": "__half2",
    "__float22half2_rn": "__half2",
    "__halves2half2": "__half2",
    "__bfloat1622float2": "float2",
    "__half22float2": "float2",
    "__float2bfloat16": "__nv_bfloat16",
    "__float2bfloat16_rn": "__nv_bfloat16",
    "__float2half": "__half",
    "__float2half_rn": "__half",
    "__low2bfloat16": "__nv_bfloat16",
    "__high2bfloat16": "__nv_bfloat16",
    "__low2half": "__half",
    "__high2half": "__half",
}
_SAME_AS_FIRST = frozenset(
    {"__hadd2", "__hsub2", "__hmul2", "__hfma2", "__hadd", "__hsub", "__hmul", "__hfma"}
)


def local_types(source: ParsedSource, function: Function) -> dict[str, str]:
    """``ParsedSource.local_types``, cached per function (type inference asks often)."""
    cache: dict[int, dict[str, str]] = source.__dict__.setdefault("_klineage_local_types", {})
    key = function.node.start_byte
    if key not in cache:
        cache[key] = source.local_types(function)
    return cache[key]


def expr_type(source: ParsedSource, function: Function | None, node: Node) -> str | None:
    """The normalized type of an expression, when this small inference can tell."""
    if function is None:
        return None
    node = strip_parens(node)
    kind = node.type
    if kind == "identifier":
        declared = local_types(source, function).get(source.text_of(node))
        return normalize_type(declared) if declared else None
    if kind == "subscript_expression":
        base = node.child_by_field_name("argument")
        inner = expr_type(source, function, base) if base is not None else None
        return element_of(inner) if inner else None
    if kind == "field_expression":
        return _field_type(source, function, node)
    if kind == "pointer_expression":
        argument = node.child_by_field_name("argument")
        inner = expr_type(source, function, argument) if argument is not None else None
        if inner is None:
            return None
        return inner + "*" if source.text_of(node).startswith("&") else element_of(inner)
    if kind == "binary_expression":
        sides = binary(node, "+", "-")
        if sides is None:
            return None
        left = expr_type(source, function, sides[0])
        return left if left is not None and left.endswith("*") else None
    if kind == "cast_expression":
        type_node = node.child_by_field_name("type")
        return normalize_type(source.text_of(type_node)) if type_node is not None else None
    if kind == "call_expression":
        return _call_type(source, function, node)
    return None


def _field_type(source: ParsedSource, function: Function, node: Node) -> str | None:
    argument = node.child_by_field_name("argument")
    field = node.child_by_field_name("field")
    if argument is None or field is None:
        return None
    owner = expr_type(source, function, argument)
    if owner is None:
        return None
    if source.text_of(node)[len(source.text_of(argument)) :].lstrip().startswith("->"):
        owner = element_of(owner) or owner
    name = source.text_of(field)
    vector = VECTOR_TYPES.get(owner)
    if vector is not None:
        return vector.element if name in vector.fields else None
    return struct_fields(source).get(owner, {}).get(name)


def _call_type(source: ParsedSource, function: Function, node: Node) -> str | None:
    name = _call_name(source, node)
    if name in _RETURN_TYPES:
        return _RETURN_TYPES[name]
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    args = [c for c in arguments.named_children if c.type != "comment"] if arguments else []
    if name in ("reinterpret_cast", "static_cast") and callee is not None:
        targs = callee.child_by_field_name("arguments")
        return normalize_type(source.text_of(targs).strip("<>")) if targs is not None else None
    if name in _SAME_AS_FIRST and args:
        return expr_type(source, function, args[0])
    if name == "__ldg" and len(args) == 1:
        pointer = expr_type(source, function, args[0])
        return element_of(pointer) if pointer else None
    if name.startswith("make_") and name[5:] in VECTOR_TYPES:
        return name[5:]
    macro = analysis(source).vectors.access_macros.get(name)
    return normalize_type(macro.vector) if macro is not None else None  # FLOAT4(a[i]): float4


# ---------------------------------------------------------------------------------------------
# The global thread index and the one-thread-per-element kernel
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GlobalIndex:
    """``blockIdx.x * D + threadIdx.x`` in any order, with casts."""

    node: Node
    block_term: Node
    """The product ``blockIdx.x * D`` as written (casts and parentheses kept)."""
    stride: Node
    """``D``: ``blockDim.x``, or the block size written as a constant."""


def global_index(source: ParsedSource, node: Node) -> GlobalIndex | None:
    """The global thread index of a 1-D launch, recognized in the usual spellings."""
    sides = binary(strip_casts(node), "+")
    if sides is None:
        return None
    for thread, other in (sides, sides[::-1]):
        if builtin_of(source, thread) != "threadIdx.x":
            continue
        product = binary(strip_parens(other), "*")
        if product is None:
            continue
        for block, stride in (product, product[::-1]):
            if builtin_of(source, block) == "blockIdx.x" and builtin_of(source, stride) in (
                None,
                "blockDim.x",
            ):
                return GlobalIndex(node=node, block_term=other, stride=stride)
    return None


@dataclass(frozen=True)
class ElementKernel:
    """A kernel in the naive one-thread-per-element form.

    ``form == "return"``::

        const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (i >= n) return;
        <rest of the function>

    ``form == "if"`` (the guard is the function's last statement)::

        int64_t i = blockIdx.x * (int64_t)256 + threadIdx.x;
        if (i < n) <statement>
    """

    function: Function
    decl: Node
    """The declaration of the index."""
    name: str
    specifiers: str
    """The declaration's text before the name: ``const int64_t``."""
    index_type: str
    """The index type without qualifiers: ``int64_t``."""
    index: GlobalIndex
    guard: Node
    """The ``if`` statement."""
    bound: Node
    """``n`` in ``i >= n`` / ``i < n``."""
    form: Literal["return", "if"]
    body: tuple[Node, ...]
    """The statements run per element: those after the guard, or the guarded statement."""
    end_byte: int
    """Where the element's code ends: the last statement (or comment) of the function."""
    scale: int = 1
    """Elements an index stands for: ``W`` of a guard ``if (i * W >= n) return;`` (a kernel
    whose thread handles a vector of W elements), else 1."""

    @property
    def start_byte(self) -> int:
        return self.decl.start_byte


def _condition_value(if_node: Node) -> Node | None:
    clause = if_node.child_by_field_name("condition")
    if clause is None:
        return None
    values = [c for c in clause.named_children if c.type not in ("comment", "init_statement")]
    if len(values) != 1 or clause.child_by_field_name("initializer") is not None:
        return None
    return values[0]


def _is_bare_return(node: Node | None) -> bool:
    if node is None:
        return False
    if node.type == "compound_statement":
        inner = statements(node)
        return len(inner) == 1 and _is_bare_return(inner[0])
    return node.type == "return_statement" and node.named_child_count == 0


def index_bound(source: ParsedSource, condition: Node, name: str, exits: bool) -> Node | None:
    """``N`` of ``name >= N`` / ``N <= name`` (``exits``) or ``name < N`` / ``N > name``."""
    condition = strip_parens(condition)
    ops = (">=", "<=") if exits else ("<", ">")
    for op, swapped in ((ops[0], False), (ops[1], True)):
        sides = binary(condition, op)
        if sides is None:
            continue
        index, bound = sides[::-1] if swapped else sides
        if strip_parens(index).type == "identifier" and source.text_of(strip_parens(index)) == name:
            return bound
    return None


def scaled_index_bound(source: ParsedSource, condition: Node, name: str) -> tuple[Node, int] | None:
    """``(N, W)`` of an exit ``name * W >= N`` (or ``W * name``), ``W`` a literal above 1."""
    sides = binary(strip_parens(condition), ">=")
    product = binary(strip_parens(sides[0]), "*") if sides is not None else None
    if sides is None or product is None:
        return None
    for index, factor in (product, product[::-1]):
        width = source.text_of(strip_parens(factor))
        if (
            strip_parens(index).type == "identifier"
            and source.text_of(strip_parens(index)) == name
            and width.isdigit()
            and int(width) > 1
        ):
            return sides[1], int(width)
    return None


def index_declaration(source: ParsedSource, node: Node) -> tuple[str, str, Node] | None:
    """(name, specifiers, value) of ``[const] T name = value;`` with a single declarator."""
    if node.type != "declaration":
        return None
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    target = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if target is None or value is None or target.type != "identifier":
        return None
    specifiers = " ".join(source.text_of((node.start_byte, declarators[0].start_byte)).split())
    return source.text_of(target), specifiers, value


def element_kernels(source: ParsedSource, *, scaled: bool = False) -> list[ElementKernel]:
    """Every kernel (top-level statements) in the one-thread-per-element form; with
    ``scaled``, also those whose thread handles a vector (``if (i * W >= n) return;``)."""
    found = []
    for function in source.kernels:
        if function.body is None:
            continue
        found.extend(_element_forms(source, function, scaled))
    return found


def _element_forms(
    source: ParsedSource, function: Function, scaled: bool = False
) -> Iterator[ElementKernel]:
    assert function.body is not None
    body = statements(function.body)
    named = [c for c in function.body.named_children]
    for position, decl in enumerate(body[:-1]):
        parsed = index_declaration(source, decl)
        if parsed is None:
            continue
        name, specifiers, value = parsed
        index = global_index(source, value)
        guard = body[position + 1]
        if index is None or guard.type != "if_statement":
            continue
        if guard.child_by_field_name("alternative") is not None:
            continue
        condition = _condition_value(guard)
        consequence = guard.child_by_field_name("consequence")
        if condition is None or consequence is None:
            continue
        index_type = normalize_type(specifiers)
        exit_bound, scale = index_bound(source, condition, name, exits=True), 1
        if exit_bound is None and scaled:
            exit_bound, scale = scaled_index_bound(source, condition, name) or (None, 1)
        if exit_bound is not None and _is_bare_return(consequence):
            rest = tuple(body[position + 2 :])
            if rest:
                yield ElementKernel(
                    function, decl, name, specifiers, index_type, index, guard, exit_bound,
                    "return", rest, named[-1].end_byte, scale,
                )  # fmt: skip
            continue
        enter_bound = index_bound(source, condition, name, exits=False)
        if enter_bound is not None and guard == body[-1]:
            inner = (
                tuple(statements(consequence))
                if consequence.type == "compound_statement"
                else (consequence,)
            )
            yield ElementKernel(
                function, decl, name, specifiers, index_type, index, guard, enter_bound, "if",
                inner, named[-1].end_byte,
            )  # fmt: skip


_PER_THREAD = ("blockIdx", "threadIdx", "gridDim")


def element_refusal(
    source: ParsedSource, element: ElementKernel, *, returns: Literal["refuse", "nested"]
) -> str | None:
    """Why a rewrite that runs the element code several times per thread (or in a loop) is
    unsafe here, or None. ``returns="nested"`` allows ``return`` statements that are not
    inside a nested loop or switch (they become ``continue``)."""
    function = element.function
    assert function.body is not None
    body = list(element.body)
    if element.name in assigned_names(source, function.body):
        return f"the index {element.name} is written after its declaration"
    bound_names = {source.text_of(n) for n in identifiers(source, element.bound)}
    written = bound_names & assigned_names(source, function.body)
    if written:
        return f"the bound uses {', '.join(sorted(written))}, which the kernel writes"
    barrier = collective_in(source, [function.body])
    if barrier is not None:
        return f"the kernel holds {barrier}, which every thread must reach equally often"
    for n in walk(function.body):
        if element.decl.start_byte <= n.start_byte < element.decl.end_byte:
            continue
        builtin = builtin_of(source, n) if n.type == "field_expression" else None
        if builtin is not None and builtin.split(".")[0] in ("blockIdx", "gridDim"):
            return f"the kernel reads {builtin} outside the index, and the rewrite changes the grid"
    for node in body:
        for n in walk(node):
            builtin = builtin_of(source, n) if n.type == "field_expression" else None
            if builtin is not None and builtin.split(".")[0] in _PER_THREAD:
                return f"the element code reads {builtin}, whose meaning the rewrite changes"
            if n.type == "goto_statement":
                return "the element code holds a goto"
    for node in body:
        jumps = loop_bound_jumps(node, ("return_statement",))
        if node.type == "return_statement":
            jumps.append(node)
        if not jumps:
            continue
        if returns == "refuse":
            return "the element code returns early, which would skip the thread's other elements"
        for jump in jumps:
            if inside_nested_loop(jump, node):
                return "a return inside a nested loop cannot become a continue of the new loop"
    return None


def inside_nested_loop(node: Node, root: Node) -> bool:
    current = node.parent
    while current is not None and current != root.parent:
        if current.type in (
            "for_statement",
            "for_range_loop",
            "while_statement",
            "do_statement",
            "switch_statement",
        ):
            return True
        if current == root:
            break
        current = current.parent
    return False


def leaving_jumps(statements: Iterable[Node], kind: str) -> list[Node]:
    """The ``kind`` statements (``return_statement``, ``continue_statement``) that are, or lie
    under, ``statements`` and leave the code they stand for (:func:`loop_bound_jumps`)."""
    found: list[Node] = []
    for node in statements:
        found += [node] if node.type == kind else loop_bound_jumps(node, (kind,))
    return found


def element_returns(element: ElementKernel) -> list[Node]:
    """The ``return`` statements of the element code (not those of lambdas)."""
    return leaving_jumps(element.body, "return_statement")


def element_text(source: ParsedSource, element: ElementKernel, reps: list[tuple[Node, str]]) -> str:
    """The element code as text at the index declaration's indentation, newline first, with
    ``reps`` (node, text) applied."""
    if element.form == "return":
        return splice(source, element.guard.end_byte, element.end_byte, reps)
    consequence = element.guard.child_by_field_name("consequence")
    assert consequence is not None
    if consequence.type == "compound_statement":
        inner = consequence.named_children
        text = splice(source, consequence.start_byte + 1, inner[-1].end_byte, reps)
        return unshift(text, 2) or text
    indent = source.indent_of(element.decl.start_byte)
    return f"\n{indent}" + splice(source, consequence.start_byte, consequence.end_byte, reps)


def names_in_function(source: ParsedSource, function: Function) -> set[str]:
    """Every identifier (and field name) in a function: generated names must avoid them."""
    return {
        source.text_of(n)
        for n in walk(function.node)
        if n.type in ("identifier", "field_identifier", "type_identifier")
    }


# ---------------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------------

_SIMPLE = re.compile(r"^[A-Za-z_][\w.]*( \* [A-Za-z_][\w.]*)*$|^\d+$")


def local_initializer(
    source: ParsedSource, function: Function, name: str, at: Node | None = None
) -> Node | None:
    """The initializer of a never-reassigned local (``T x = v``, ``T* p = v``) of
    ``function``: the one declared in a block around ``at`` before it, nearest first (or
    the only one in the function when ``at`` is None)."""
    if function.body is None or name in assigned_names(source, function.body):
        return None
    found: list[tuple[Node, Node]] = []
    for decl in source.iter_nodes("declaration", within=function.body):
        for declarator in decl.children_by_field_name("declarator"):
            if declarator.type != "init_declarator":
                continue
            target = declarator.child_by_field_name("declarator")
            while target is not None and target.type == "pointer_declarator":
                target = target.child_by_field_name("declarator")
            value = declarator.child_by_field_name("value")
            if (
                target is not None
                and value is not None
                and target.type == "identifier"
                and source.text_of(target) == name
            ):
                found.append((decl, value))
    if at is None:
        return found[0][1] if len(found) == 1 else None
    visible = [
        value
        for decl, value in found
        if decl.end_byte <= at.start_byte
        and decl.parent is not None
        and decl.parent.start_byte <= at.start_byte < decl.parent.end_byte
    ]
    return visible[-1] if visible else None


def size_at_launch(
    source: ParsedSource, kernel: Function, launch: Launch, expr: Node, depth: int = 0
) -> str:
    """A size expression of the kernel (its bound ``n``) written at a launch: kernel
    parameters become the launch's arguments, template parameters its template arguments.
    Raises :class:`Refused` when the expression needs anything else."""
    if depth > 4:
        raise Refused("the bound is defined through too many locals")
    params = [p.name for p in kernel.params]
    replacements: list[tuple[Node, str]] = []
    for node in walk(expr):
        if node.type == "call_expression" and not is_pure_call(source, node):
            raise Refused(f"the bound {source.snippet(expr)!r} calls a function")
        if node.type == "field_expression" and builtin_of(source, node):
            raise Refused(f"the bound {source.snippet(expr)!r} depends on the launch shape")
        if node.type != "identifier":
            continue
        name = source.text_of(node)
        if name in params:
            index = params.index(name)
            if index >= len(launch.args):
                raise Refused(f"the launch passes no argument for {name}")
            arg = launch.args[index]
            text = source.text_of(arg)
            replacements.append((node, text if precedence(arg) >= PRIMARY else f"({text})"))
        elif name in kernel.template_params:
            index = kernel.template_params.index(name)
            if index >= len(launch.template_args):
                raise Refused(f"the launch gives no template argument for {name}")
            replacements.append((node, f"({source.text_of(launch.template_args[index])})"))
        elif name in source.integer_constants:
            continue
        else:
            value = local_initializer(source, kernel, name, node)
            if value is None:
                raise Refused(
                    f"{name} in the bound {source.snippet(expr)!r} is not a kernel parameter or "
                    "a constant, so the launch cannot size the grid from it"
                )
            inner = size_at_launch(source, kernel, launch, value, depth + 1)
            replacements.append((node, f"({inner})"))
    text = splice(source, expr.start_byte, expr.end_byte, replacements)
    return " ".join(text.split())


def _block_text(source: ParsedSource, launch: Launch, flat_dim3: bool = False) -> str:
    block = launch.block
    if block is None:
        raise Refused("the launch has no block size")
    function = source.enclosing_function(launch.node)
    stripped = strip_parens(block)
    if stripped.type == "call_expression" or stripped.type == "initializer_list":
        raise Refused(f"the block size {source.snippet(block)!r} is not a plain thread count")
    if stripped.type == "identifier" and function is not None:
        name = source.text_of(stripped)
        if "dim3" in local_types(source, function).get(name, ""):
            if not flat_dim3:
                raise Refused(f"the block size {name} is a dim3")
            if not _flat_dim3(source, function, name):
                raise Refused(
                    f"the block size {name} is a dim3 whose y and z are not both 1 (or which "
                    "the function changes), so its thread count is not its x"
                )
            return f"{name}.x"
    text = " ".join(source.text_of(block).split())
    return text if precedence(block) >= PRIMARY else f"({text})"


def _flat_dim3(source: ParsedSource, function: Function, name: str) -> bool:
    """Whether the local ``dim3 name(x, 1, 1)`` (or ``(x)``, ``{x, 1}``) is declared once,
    with y and z 1, and never written after: a block of ``name.x`` threads."""
    assert function.body is not None
    sizes: list[list[Node]] = []
    for declaration in source.iter_nodes("declaration", within=function.body):
        for declarator in declaration.children_by_field_name("declarator"):
            inner = declarator.child_by_field_name("declarator")
            if inner is None or source.text_of(inner) != name:
                continue
            if declarator.type == "init_declarator":
                value = declarator.child_by_field_name("value")
                sizes.append(dim3_extents(value) if value is not None else [])
            elif declarator.type == "function_declarator":  # dim3 b(n): the vexing parse
                parameters = declarator.child_by_field_name("parameters")
                sizes.append(dim3_extents(parameters) if parameters is not None else [])
    if len(sizes) != 1 or not 1 <= len(sizes[0]) <= 3:
        return False
    if any(fold_int(source, size) != 1 for size in sizes[0][1:]):
        return False
    for node in source.iter_nodes("assignment_expression", within=function.body):
        target = node.child_by_field_name("left")
        while target is not None and target.type == "field_expression":  # b.y = 2
            target = target.child_by_field_name("argument")
        if target is not None and source.text_of(strip_parens(target)) == name:
            return False
    return True


def cover_grid(size: str, block: str, per_thread: int = 1, cap: int | None = None) -> str:
    """The grid that gives every one of ``size`` elements a thread, ``per_thread`` each,
    optionally capped at ``cap`` blocks: ``(unsigned)((n + 256 - 1) / 256)``."""
    size = size if _SIMPLE.match(size) else f"({size})"
    if per_thread == 1:
        blocks = f"({size} + {block} - 1) / {block}"
    else:
        blocks = f"({size} + {per_thread} * {block} - 1) / ({per_thread} * {block})"
    if cap is not None:
        return f"(unsigned)min((int64_t)({blocks}), (int64_t){cap})"
    return f"(unsigned)({blocks})"


_CAPPED = re.compile(r"^\(unsigned\)min\(\(int64_t\)\((?P<blocks>.*)\), \(int64_t\)(?P<cap>\d+)\)$")


def grid_cap(source: ParsedSource, launch: Launch) -> int | None:
    """The cap of a grid written by :func:`cover_grid` with ``cap``, else None."""
    return None if launch.grid is None else cap_of(source.text_of(launch.grid))


def cap_of(text: str) -> int | None:
    """The cap of a block count written as :func:`cover_grid` caps it, else None."""
    match = _CAPPED.match(" ".join(text.split()))
    return int(match.group("cap")) if match else None


def launches(source: ParsedSource, kernel: Function) -> list[Launch]:
    found = source.launches_of(kernel)
    if not found:
        raise Refused(
            f"no launch of {kernel.name} in this file, so its grid cannot change with the kernel"
        )
    return found


def grid_edits(
    source: ParsedSource,
    kernel: Function,
    bound: Node,
    per_thread: int = 1,
    cap: int | None = None,
    *,
    flat_dim3: bool = False,
) -> list[tuple[Node, str]]:
    """New grid expressions for every launch of ``kernel``: enough blocks for ``bound``
    elements at ``per_thread`` each (capped at ``cap`` blocks). ``flat_dim3``: a block that
    is a ``dim3 b(x, 1, 1)`` local counts ``b.x`` threads (else refused, which sends a removal
    to the form that rewrites the grid's own ``dim3``). Raises :class:`Refused`."""
    edits = []
    for launch in launches(source, kernel):
        if launch.grid is None:
            raise Refused("a launch has no grid")
        size = size_at_launch(source, kernel, launch, bound)
        grid = cover_grid(size, _block_text(source, launch, flat_dim3), per_thread, cap)
        edits.append((launch.grid, grid))
    return edits


# ---------------------------------------------------------------------------------------------
# From a kernel parameter to the problem's tensor and axis names
# ---------------------------------------------------------------------------------------------


def tensor_name(source: ParsedSource, function: Function, param: str, depth: int = 0) -> str | None:
    """The ``run(...)`` parameter that reaches ``function``'s parameter ``param`` through
    launches and helper calls passing it unchanged, or None when that is not clear."""
    if function.extern_c:
        return param if function.param(param) is not None else None
    if depth > 3:
        return None
    names = [p.name for p in function.params]
    if param not in names:
        return None
    index = names.index(param)
    sites: list[tuple[Node, tuple[Node, ...]]] = [
        (launch.node, launch.args) for launch in source.launches_of(function)
    ]
    # a caller may qualify the name (``ns::variant(...)``: a launch-size dispatch calls each
    # variant's host function in its own namespace)
    sites += [
        (call.node, call.args)
        for call in source.calls
        if call.name.rsplit("::", 1)[-1] == function.name
    ]
    answers: set[str | None] = set()
    for node, args in sites:
        caller = source.enclosing_function(node)
        if caller is None or index >= len(args):
            return None
        arg = strip_casts(args[index])
        if arg.type != "identifier":
            return None
        answers.add(tensor_name(source, caller, source.text_of(arg), depth + 1))
    if len(answers) != 1:
        return None
    return answers.pop()


# ---------------------------------------------------------------------------------------------
# Alignment of a pointer, as conditions on the problem
# ---------------------------------------------------------------------------------------------


def pointee_size(type_text: str | None) -> int | None:
    """Bytes of what a pointer type points to: ``float4*`` -> 16, ``__half*`` -> 2."""
    element = element_of(type_text) if type_text else None
    if element is None:
        return None
    vector = VECTOR_TYPES.get(element)
    if vector is not None:
        return vector.count * ELEMENT_SIZES[vector.element]
    return ELEMENT_SIZES.get(element)


_MAX_TRACE = 16
"""How many steps (locals, casts, helper calls) a pointer is traced back."""


def alignment_conditions(
    source: ParsedSource, function: Function, pointer: Node, alignment: int, depth: int = 0
) -> list[Condition]:
    """What makes the address ``pointer`` a multiple of ``alignment`` bytes.

    The pointer is traced back through locals, casts, ``p + offset`` and the calls of device
    helpers to the kernel's parameters, which become the problem's tensors (aligned by the
    harness: :class:`PointerAlignment`) and its axes (an offset of ``r * cols`` floats is
    16-byte aligned when ``cols % 4 == 0``: :class:`AxisDivisible`). What cannot be traced
    is stated in prose.
    """
    unknown: list[Condition] = [
        Prose(
            text=f"{source.snippet(pointer, 60)} must be {alignment}-byte aligned",
            why=f"a {alignment}-byte access needs an aligned address",
        )
    ]
    node = strip_parens(pointer)
    if depth > _MAX_TRACE:
        return unknown
    if node.type == "cast_expression":
        value = node.child_by_field_name("value")
        return (
            unknown
            if value is None
            else alignment_conditions(source, function, value, alignment, depth + 1)
        )
    if node.type == "call_expression" and _call_name(source, node) in (
        "reinterpret_cast",
        "static_cast",
    ):
        arguments = node.child_by_field_name("arguments")
        args = statements(arguments) if arguments is not None else []
        if len(args) != 1:
            return unknown
        return alignment_conditions(source, function, args[0], alignment, depth + 1)
    if node.type == "identifier":
        return _named_pointer_alignment(source, function, node, alignment, depth) or unknown
    base: Node | None = None
    offset: Node | None = None
    sides = binary(node, "+")
    if sides is not None:
        base, offset = sides
        if not (expr_type(source, function, base) or "").endswith("*"):
            base, offset = offset, base
    elif node.type == "pointer_expression" and source.text_of(node).startswith("&"):
        target = strip_parens(node.child_by_field_name("argument") or node)
        if target.type == "subscript_expression":
            base = target.child_by_field_name("argument")
            indices = target.child_by_field_name("indices")
            inner = statements(indices) if indices is not None else []
            offset = inner[0] if len(inner) == 1 else None
    if base is None or offset is None:
        return unknown
    return alignment_of_sum(source, function, base, offset, alignment, depth + 1)


def alignment_of_sum(
    source: ParsedSource,
    function: Function,
    base: Node,
    offset: Node,
    alignment: int,
    depth: int = 0,
) -> list[Condition]:
    """What makes ``base + offset`` (``&base[offset]``) a multiple of ``alignment`` bytes."""
    found = alignment_conditions(source, function, base, alignment, depth + 1)
    size = pointee_size(expr_type(source, function, base))
    if size is None:
        return [
            *found,
            Prose(
                text=f"{source.snippet(base, 40)} + {source.snippet(offset, 40)} must be "
                f"{alignment}-byte aligned",
                why=f"a {alignment}-byte access needs an aligned address",
            ),
        ]
    if size % alignment == 0:
        return found
    divisor = alignment // size if alignment % size == 0 else None
    divisible = None if divisor is None else offset_divisible(source, function, offset, divisor)
    if divisible is None:
        return [
            *found,
            Prose(
                text=f"{source.snippet(offset, 60)} elements of {size} bytes must make a "
                f"multiple of {alignment} bytes",
                why=f"a {alignment}-byte access needs an aligned address",
            ),
        ]
    return found + divisible


def _named_pointer_alignment(
    source: ParsedSource, function: Function, node: Node, alignment: int, depth: int
) -> list[Condition] | None:
    name = source.text_of(node)
    param = function.param(name)
    if param is None:
        value = local_initializer(source, function, name, node)
        if value is None:
            return None
        return alignment_conditions(source, function, value, alignment, depth + 1)
    if function.is_kernel or function.extern_c:
        tensor = tensor_name(source, function, name)
        if tensor is None:
            return None
        why = f"{alignment}-byte accesses through {name}"
        return [PointerAlignment(tensor=tensor, bytes=alignment, why=why)]
    index = [p.name for p in function.params].index(name)
    calls = source.calls_named(function.name)
    if not calls:
        return None
    found: list[Condition] = []
    for call in calls:
        caller = source.enclosing_function(call.node)
        if caller is None or index >= len(call.args):
            return None
        found += alignment_conditions(source, caller, call.args[index], alignment, depth + 1)
    return found


def offset_divisible(
    source: ParsedSource, function: Function, offset: Node, divisor: int, depth: int = 0
) -> list[Condition] | None:
    """Conditions under which an integer offset is a multiple of ``divisor`` (None: unknown).

    A product needs one divisible factor, a sum every term; kernel parameters are axes."""
    node = strip_casts(offset)
    if divisor <= 1:
        return []
    if depth > _MAX_TRACE:
        return None
    if node.type == "number_literal":
        value = evaluate_size(source.text_of(node).rstrip("uUlL"))
        return [] if value is not None and value % divisor == 0 else None
    if node.type == "identifier":
        name = source.text_of(node)
        constant = source.integer_constants.get(name)
        if constant is not None:
            return [] if constant % divisor == 0 else None
        if function.param(name) is not None:
            axis = tensor_name(source, function, name)
            why = f"keeps {divisor}-element accesses aligned"
            return None if axis is None else [AxisDivisible(axis=axis, k=divisor, why=why)]
        value = local_initializer(source, function, name)
        return (
            None if value is None else offset_divisible(source, function, value, divisor, depth + 1)
        )
    product = binary(node, "*")
    if product is not None:
        for factor in product:
            found = offset_divisible(source, function, factor, divisor, depth + 1)
            if found is not None:
                return found
        return None
    terms = binary(node, "+", "-")
    if terms is not None:
        parts = [offset_divisible(source, function, t, divisor, depth + 1) for t in terms]
        if any(p is None for p in parts):
            return None
        return [c for p in parts for c in (p or [])]
    return None


def is_block_size(source: ParsedSource, function: Function, node: Node) -> bool:
    """Whether ``node`` (in a kernel) equals the block size of every launch of the kernel:
    ``blockDim.x``, or a constant or template parameter the launches agree with."""
    if builtin_of(source, node) == "blockDim.x":
        return True
    if not function.is_kernel:
        return False
    found = source.launches_of(function)
    if not found:
        return False
    for launch in found:
        names: dict[str, int | str] = dict(source.integer_constants)
        names.update(template_bindings(source, launch))
        block = launch_block_size(source, launch)
        value = to_size_expr(source, node, names)
        if block is None or value is None:
            return False
        caller = launch_names(source, source.enclosing_function(launch.node))
        axes = {k: v for k, v in caller.items() if isinstance(v, int)}
        left, right = evaluate_size(block, axes), evaluate_size(value, axes)
        if left is None or left != right:
            return False
    return True
