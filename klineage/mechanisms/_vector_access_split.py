"""Single vector accesses (``float4`` subscripts and dereferences, ``__ldg`` and the
cache-hinted intrinsics through vector pointers, and the file's access macros such as
``FLOAT4(a[i])``), their split into one scalar access per element, and the split form
recognized and merged back."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.source import Function, Node, ParsedSource
from klineage.cuda.tree import call_arguments
from klineage.mechanisms._local_util import (
    VECTOR_TYPES,
    VectorType,
    binary,
    expr_type,
    index_declaration,
    is_side_effect_free,
    normalize_type,
    statements,
    strip_parens,
)
from klineage.mechanisms._vector_plans import classify_access

AccessForm = Literal["subscript", "deref", "ldg", "hinted", "macro"]
"""How a vector access is spelled: ``p[i]``, ``*A``, ``__ldg(A)``, another load or store
intrinsic with a cache hint (``__ldcs(A)``, ``__stcs(A, v)``, ...), or an access macro of the
file (``FLOAT4(a[i])``, :class:`klineage.cuda.analysis.vectors.AccessMacro`)."""

LOAD_INTRINSICS = frozenset({"__ldg", "__ldca", "__ldcg", "__ldcs", "__ldlu", "__ldcv"})
"""Loads through one pointer (read-only or cache-hinted); each has an overload for every scalar
and vector type, so a vector load splits into the same intrinsic on each element."""

STORE_INTRINSICS = frozenset({"__stwb", "__stcg", "__stcs", "__stwt"})
"""Cache-hinted stores ``__stcs(A, v)``, overloaded for every scalar and vector type too."""


@dataclass(frozen=True)
class _Access:
    """A load or store of a whole vector through a pointer to a vector type."""

    node: Node
    """The load expression, or the store's expression statement."""
    kind: Literal["load", "store"]
    form: AccessForm
    address: str
    """The address as text: ``&out4[c]``, ``in4 + c``."""
    address_node: Node | None
    """The node whose value is the address (deref and ``__ldg``); None for ``p[i]``."""
    subscript: Node | None
    """The ``p[i]`` node of the subscript form."""
    vector: VectorType
    value: Node | None
    """A store's value."""
    refusal: str | None
    intrinsic: str = ""
    """The load or store intrinsic the access goes through (``__ldg``, ``__stcs``), if any."""


def _vector_pointer(source: ParsedSource, function: Function, node: Node) -> VectorType | None:
    """The vector type ``node`` points to, when it is a pointer (not an array) to one."""
    type_text = expr_type(source, function, node)
    if type_text is None or not type_text.endswith("*"):
        return None
    return VECTOR_TYPES.get(type_text[:-1])


def _reference_binding(source: ParsedSource, node: Node) -> str | None:
    """Why a load's value cannot become a temporary (it binds to a non-const reference)."""
    child, parent = node, node.parent
    while parent is not None and parent.type in (
        "parenthesized_expression",
        "conditional_expression",
    ):
        child, parent = parent, parent.parent
    if parent is None:
        return None
    if parent.type == "init_declarator":
        declarator = parent.child_by_field_name("declarator")
        if declarator is not None and declarator.type == "reference_declarator":
            return "the loaded vector is bound to a reference"
    if parent.type == "argument_list" and parent.parent is not None:
        callee = parent.parent.child_by_field_name("function")
        if callee is not None and callee.type == "template_function":
            callee = callee.child_by_field_name("name")
        target = source.function(source.text_of(callee)) if callee is not None else None
        args = statements(parent)
        if target is not None and child in args:
            index = args.index(child)
            if index < len(target.params):
                param = target.params[index]
                if "&" in param.type and not param.is_const:
                    return f"the loaded vector is passed to {target.name} by reference"
    return None


def _access_at(source: ParsedSource, function: Function, node: Node) -> _Access | None:
    """The whole-vector access at ``node`` (a ``p[i]``, ``*A``, ``__ldg(A)`` or another load or
    store intrinsic), if it is one."""
    if node.type == "call_expression":
        return _macro_access(source, node) or _intrinsic_access(source, function, node)
    form: AccessForm
    address_node: Node | None
    if node.type == "subscript_expression":
        base = node.child_by_field_name("argument")
        vector = _vector_pointer(source, function, base) if base is not None else None
        address, address_node, form = f"&{source.text_of(node)}", None, "subscript"
    elif node.type == "pointer_expression" and source.text_of(node).startswith("*"):
        argument = node.child_by_field_name("argument")
        vector = _vector_pointer(source, function, argument) if argument is not None else None
        address_node = strip_parens(argument) if argument is not None else None
        address = source.text_of(address_node) if address_node is not None else ""
        form = "deref"
    else:
        return None
    usage = classify_access(node)
    if vector is None or usage in ("other", "both"):
        return None
    effects = None if is_side_effect_free(source, node) else "the address has side effects"
    subscript = node if form == "subscript" else None
    found = _Access(node, usage, form, address, address_node, subscript, vector, None, effects)
    return _load_or_store(source, found)


def _load_or_store(source: ParsedSource, found: _Access) -> _Access:
    """``found`` (at the accessing node, its refusal the address's) as a load, or as the store
    ``node = value;`` whose statement is the access, with why it is refused if it is."""
    node = found.node
    if found.kind == "load":
        return replace(found, refusal=found.refusal or _reference_binding(source, node))
    assignment = node.parent
    assert assignment is not None
    statement, value = assignment.parent, assignment.child_by_field_name("right")
    if statement is None or statement.type != "expression_statement" or value is None:
        used = "the store's value is used in a larger expression"
        return replace(found, value=value, refusal=used)
    return replace(found, node=statement, value=value)


def _macro_access(source: ParsedSource, call: Node) -> _Access | None:
    """``FLOAT4(a[i])`` read, or ``FLOAT4(a[i]) = v;``, through an access macro of the file: the
    vector at ``&(a[i])``."""
    callee = call.child_by_field_name("function")
    macros = analysis(source).vectors.access_macros
    macro = macros.get(source.text_of(callee)) if callee is not None else None
    args = call_arguments(call)
    vector = VECTOR_TYPES.get(macro.vector) if macro is not None else None
    usage = classify_access(call)
    if vector is None or len(args) != 1 or usage in ("other", "both"):
        return None
    element = strip_parens(args[0])
    address = f"&({source.text_of(element)})"
    subscript = element if element.type == "subscript_expression" else None
    effects = None if is_side_effect_free(source, element) else "the address has side effects"
    found = _Access(call, usage, "macro", address, None, subscript, vector, None, effects)
    return _load_or_store(source, found)


def _intrinsic_access(source: ParsedSource, function: Function, call: Node) -> _Access | None:
    """``__ldcs(A)`` (any load intrinsic) or ``__stcs(A, v);`` (any store intrinsic) of a whole
    vector."""
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    name = source.text_of(callee) if callee is not None else ""
    if name in LOAD_INTRINSICS and len(args) == 1:
        kind: Literal["load", "store"] = "load"
    elif name in STORE_INTRINSICS and len(args) == 2:
        kind = "store"
    else:
        return None
    vector = _vector_pointer(source, function, args[0])
    if vector is None:
        return None
    refusal = None if is_side_effect_free(source, args[0]) else "the address has side effects"
    text = source.text_of(args[0])
    form: AccessForm = "ldg" if name == "__ldg" else "hinted"
    if kind == "load":
        return _Access(call, "load", form, text, args[0], None, vector, None, refusal, name)
    statement = call.parent
    if statement is None or statement.type != "expression_statement":
        used = "the store's value is used in a larger expression"
        return _Access(call, "store", form, text, args[0], None, vector, args[1], used, name)
    return _Access(statement, "store", form, text, args[0], None, vector, args[1], refusal, name)


def vector_accesses(source: ParsedSource, skip: list[tuple[int, int]]) -> list[_Access]:
    """Every whole-vector load and store in device code outside the ``skip`` regions."""
    found = []
    for node in source.iter_nodes("subscript_expression", "pointer_expression", "call_expression"):
        if any(start <= node.start_byte < end for start, end in skip):
            continue
        function = source.enclosing_function(node)
        if function is None or not function.runs_on_device:
            continue
        access = _access_at(source, function, node)
        if access is not None:
            found.append(access)
    return found


def split_text(source: ParsedSource, access: _Access, names: set[str]) -> str:
    """The access as one scalar access per element, laid out like the code around it."""
    vector = access.vector
    element = vector.element
    line_start = source.line_start(access.node.start_byte)
    column = len(source.data[line_start : access.node.start_byte].decode("utf-8"))
    if access.kind == "load":
        cast = f"reinterpret_cast<const {element}*>({access.address})"
        if access.intrinsic:
            hint = access.intrinsic
            parts = [f"{hint}({cast}{f' + {k}' if k else ''})" for k in range(vector.count)]
        else:
            parts = [f"{cast}[{k}]" for k in range(vector.count)]
        one_line = f"{vector.make}({', '.join(parts)})"
        if column + len(one_line) <= 100:
            return one_line
        separator = ",\n" + " " * (column + len(vector.make) + 1)
        return f"{vector.make}({separator.join(parts)})"
    assert access.value is not None
    packed, elems = _fresh("packed", names), _fresh("elems", names)
    indent = source.indent_of(access.node.start_byte)
    stores = [
        _element_store_text(access.intrinsic, elems, k, f"{packed}.{f}")
        for k, f in enumerate(vector.fields)
    ]
    inner = [
        f"const {vector.name} {packed} = {source.text_of(access.value)};",
        f"{element}* {elems} = reinterpret_cast<{element}*>({access.address});",
        *stores,
    ]
    return "{" + "".join(f"\n{indent}  {line}" for line in inner) + f"\n{indent}}}"


def _fresh(base: str, names: set[str]) -> str:
    name, n = base, 2
    while name in names:
        name, n = f"{base}{n}", n + 1
    return name


@dataclass(frozen=True)
class _Split:
    """The split form of a vector access (what ``remove`` writes), a candidate to merge."""

    node: Node
    kind: Literal["load", "store"]
    form: AccessForm
    address: Node
    vector: VectorType
    value: Node | None
    intrinsic: str = ""
    """The intrinsic every element access goes through (``__ldg``, ``__stcs``), if any."""
    macro: str = ""
    """The access macro the merged access is written with (``macro`` form)."""


def _macro_for(source: ParsedSource, vector: VectorType | None) -> str:
    """The file's first access macro of ``vector`` (what a split of such a macro's access
    merges back into), or ""."""
    if vector is None:
        return ""
    macros = analysis(source).vectors.access_macros.values()
    return next((m.name for m in macros if VECTOR_TYPES.get(m.vector) == vector), "")


def _cast_target(source: ParsedSource, node: Node) -> tuple[str, Node] | None:
    """(element type, argument) of ``reinterpret_cast<[const] E*>(A)``."""
    node = strip_parens(node)
    if node.type != "call_expression":
        return None
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    if callee is None or callee.type != "template_function" or arguments is None:
        return None
    name = callee.child_by_field_name("name")
    targs = callee.child_by_field_name("arguments")
    args = statements(arguments)
    if name is None or source.text_of(name) != "reinterpret_cast" or len(args) != 1:
        return None
    target = normalize_type(source.text_of(targs).strip("<>")) if targs is not None else ""
    return (target[:-1], args[0]) if target.endswith("*") else None


def _element_ref(source: ParsedSource, node: Node) -> tuple[str, Node, int, str] | None:
    """(E, A, k, intrinsic) of ``reinterpret_cast<const E*>(A)[k]`` (intrinsic "") or
    ``__ldg(cast + k)`` (any load intrinsic)."""
    node = strip_parens(node)
    if node.type == "subscript_expression":
        base = node.child_by_field_name("argument")
        indices = node.child_by_field_name("indices")
        inner = statements(indices) if indices is not None else []
        cast = _cast_target(source, base) if base is not None else None
        if cast is None or len(inner) != 1 or not source.text_of(inner[0]).isdigit():
            return None
        return cast[0], cast[1], int(source.text_of(inner[0])), ""
    if node.type != "call_expression":
        return None
    callee = node.child_by_field_name("function")
    arguments = node.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    hint = source.text_of(callee) if callee is not None else ""
    if hint not in LOAD_INTRINSICS or len(args) != 1:
        return None
    sum_ = binary(strip_parens(args[0]), "+")
    if sum_ is not None and source.text_of(sum_[1]).isdigit():
        cast, k = _cast_target(source, sum_[0]), int(source.text_of(sum_[1]))
    else:
        cast, k = _cast_target(source, args[0]), 0
    return None if cast is None else (cast[0], cast[1], k, hint)


def _split_load(source: ParsedSource, function: Function, call: Node) -> _Split | None:
    callee = call.child_by_field_name("function")
    arguments = call.child_by_field_name("arguments")
    args = statements(arguments) if arguments is not None else []
    if callee is None or not args:
        return None
    refs = [_element_ref(source, a) for a in args]
    if any(r is None for r in refs):
        return None
    first = refs[0]
    assert first is not None
    address = first[1]
    vector = _vector_pointer(source, function, address)
    macro = ""
    if vector is None and not first[3]:
        # the split of an access macro's read: an element address, and a vector of the make
        # (``__halves2half2`` makes both ``__half2`` and ``half2``) the file has a macro for
        makes = [v for v in VECTOR_TYPES.values() if v.make == source.text_of(callee)]
        found = ((v, _macro_for(source, v)) for v in makes if v.element == first[0])
        vector, macro = next(((v, m) for v, m in found if m), (None, ""))
    if vector is None or vector.make != source.text_of(callee) or vector.count != len(args):
        return None
    for k, ref in enumerate(refs):
        assert ref is not None
        element, node, index, hint = ref
        if (element, source.text_of(node), index, hint) != (
            vector.element,
            source.text_of(address),
            k,
            first[3],
        ):
            return None
    if macro:
        return _Split(call, "load", "macro", address, vector, None, "", macro)
    address_text = source.text_of(address)
    form = _split_form(first[3], address_text)
    return _Split(call, "load", form, address, vector, None, first[3])


def _split_form(intrinsic: str, address: str) -> AccessForm:
    """The access form a split access merges back into."""
    if intrinsic:
        return "ldg" if intrinsic == "__ldg" else "hinted"
    return "subscript" if address.startswith("&") else "deref"


def _element_store_text(intrinsic: str, elems: str, k: int, value: str) -> str:
    """One element's store of a split vector store: ``elems[k] = value;``, or through the
    vector store's intrinsic, ``__stcs(&elems[k], value);``."""
    return f"{intrinsic}(&{elems}[{k}], {value});" if intrinsic else f"{elems}[{k}] = {value};"


def _element_store(source: ParsedSource, statement: Node, elems: str) -> str | None:
    """The intrinsic of a split store's element statement: "" for ``elems[k] = ...;``, the
    name for ``__stcs(&elems[k], ...);``, None for anything else (the caller matches the rest)."""
    text = " ".join(source.text_of(statement).split())
    if text.startswith(f"{elems}["):
        return ""
    call = statement.named_children[0] if statement.named_children else None
    callee = call.child_by_field_name("function") if call is not None else None
    hint = source.text_of(callee) if callee is not None else None
    return hint if hint in STORE_INTRINSICS else None


def _split_store(source: ParsedSource, function: Function, block: Node) -> _Split | None:
    body = statements(block)
    if len(body) < 4:
        return None
    packed = index_declaration(source, body[0])
    pointer = body[1]
    declarators = (
        pointer.children_by_field_name("declarator") if pointer.type == "declaration" else []
    )
    if packed is None or len(declarators) != 1 or declarators[0].type != "init_declarator":
        return None
    target = declarators[0].child_by_field_name("declarator")
    value = declarators[0].child_by_field_name("value")
    if target is None or value is None or target.type != "pointer_declarator":
        return None
    elems_node = target.child_by_field_name("declarator")
    cast = _cast_target(source, value)
    if elems_node is None or cast is None:
        return None
    elems = source.text_of(elems_node)
    vector = _vector_pointer(source, function, cast[1])
    macro = ""
    if vector is None:
        # the split of an access macro's write: the vector is the packed value's type
        vector = VECTOR_TYPES.get(normalize_type(packed[1]))
        macro = _macro_for(source, vector)
        vector = vector if macro else None
    if vector is None or len(body) != vector.count + 2 or cast[0] != vector.element:
        return None
    if normalize_type(packed[1]) != vector.name:
        return None
    hint = _element_store(source, body[2], elems)
    if hint is None:
        return None
    for k, (statement, name) in enumerate(zip(body[2:], vector.fields, strict=True)):
        wanted = _element_store_text(hint, elems, k, f"{packed[0]}.{name}")
        if " ".join(source.text_of(statement).split()) != wanted:
            return None
    if macro and not hint:
        return _Split(block, "store", "macro", cast[1], vector, packed[2], "", macro)
    if macro:
        return None  # a hinted store through a macro's address: not what remove writes
    address = source.text_of(cast[1])
    return _Split(block, "store", _split_form(hint, address), cast[1], vector, packed[2], hint)


def split_forms(source: ParsedSource) -> list[_Split]:
    """The split accesses that ``remove`` writes, which ``apply`` merges back."""
    makes = {v.make for v in VECTOR_TYPES.values()}
    found = []
    for node in source.iter_nodes("call_expression", "compound_statement"):
        function = source.enclosing_function(node)
        if function is None or not function.runs_on_device:
            continue
        if node.type == "call_expression":
            callee = node.child_by_field_name("function")
            if callee is None or source.text_of(callee) not in makes:
                continue
            split = _split_load(source, function, node)
        else:
            split = _split_store(source, function, node)
        if split is not None:
            found.append(split)
    return found


def merged_text(source: ParsedSource, split: _Split) -> str:
    """The vector access a split form stands for."""
    address = split.address
    text = source.text_of(address)
    if split.kind == "store" and split.intrinsic:
        assert split.value is not None
        return f"{split.intrinsic}({text}, {source.text_of(split.value)});"
    if split.intrinsic:
        access = f"{split.intrinsic}({text})"
    elif split.form == "macro":
        element = (
            address.child_by_field_name("argument")
            if address.type == "pointer_expression"
            else None
        )
        inner = source.text_of(strip_parens(element)) if element is not None else f"*({text})"
        access = f"{split.macro}({inner})"
    elif split.form == "subscript":
        target = address.child_by_field_name("argument")
        access = source.text_of(target) if target is not None else f"*({text})"
    else:
        access = f"*{text}" if precedence(address) >= PRIMARY else f"*({text})"
    if split.kind == "load":
        return access
    assert split.value is not None
    return f"{access} = {source.text_of(split.value)};"
