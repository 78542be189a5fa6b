"""The canonical shared-memory staged tile loop, recognized for ``smem_staging`` (to remove
the staging) and ``cp_async_pipeline`` (to turn its tile loads into ``cp.async``).

The canonical form is the textbook tiled GEMM loop::

    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    for (int t = 0; t < tiles; ++t) {
      As[ty][tx] = <value of A for this thread, depending on t>;
      Bs[ty][tx] = <value of B ...>;
      __syncthreads();
      <compute reading As[..][..] and Bs[..][..]>
      __syncthreads();
    }

where ``ty``/``tx`` are ``threadIdx.y``/``threadIdx.x`` (or locals holding exactly them), and
the block is as large as the tile, so every element read was stored by the thread whose
``(ty, tx)`` equals the element's indices. A read ``As[ty][k]`` is then the stored value
evaluated by thread ``(ty, k)``: the same expression with ``tx`` replaced by ``k``, provided
the expression depends on the thread only through ``tx`` itself (not through a local derived
from ``threadIdx.x``). :func:`analyze_staged_loop` checks all of that and says why when a
loop is not in this form.

Public kernels spell the same loop in two more ways, both accepted: the store indices are the
row and column of the thread's flattened place (``tid / W``, ``tid % W``, with a block ``W``
wide: :mod:`klineage.mechanisms._staging_threads`), and the stores are interleaved with the
declarations of the indices they use (``int a_col = t * TILE + col; int at = row * K +
a_col; As[row][col] = A[at];``). A read then writes every such local out, down to the thread
index it replaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from klineage.cuda.analysis import analysis
from klineage.cuda.cexpr import PRIMARY, precedence
from klineage.cuda.source import Function, Node, ParsedSource, within
from klineage.cuda.tree import declared_names
from klineage.mechanisms._staging_threads import ThreadParts
from klineage.mechanisms._staging_vector_copy import vector_view
from klineage.mechanisms._tiles_util import (
    Locals,
    is_call_statement,
    kernel_block_dims,
    name_of,
    names_in,
    rename,
    statements,
)

SYNC = "__syncthreads"
_FLOAT_CALLS = frozenset(
    {
        "__half2float",
        "__bfloat162float",
        "__low2float",
        "__high2float",
        "expf",
        "__expf",
        "sqrtf",
        "fmaxf",
        "fminf",
        "fabsf",
        "fmaf",
        "__int2float_rn",
        "__uint2float_rn",
    }
)
_FLOAT_LITERAL = re.compile(r"^(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?[fF]$")
_DOUBLE_LITERAL = re.compile(r"^(\d+\.\d*|\.\d+|\d+\.?\d*[eE][+-]?\d+)$")
_INT_LITERAL = re.compile(r"^\d+[uUlL]*$")


def _plain_type(text: str) -> str:
    """``const float`` -> ``float``; ``const float*`` -> ``float*``."""
    return " ".join(
        w
        for w in text.replace("*", " * ").split()
        if w not in ("const", "volatile", "__restrict__", "__shared__")
    ).replace(" *", "*")


def value_type(source: ParsedSource, types: dict[str, str], node: Node) -> str | None:
    """The type of an expression as far as simple rules tell (``float``, ``int``...), or
    None. Integer literals read as ``int`` and convert silently in a conditional."""
    kind = node.type
    if kind == "number_literal":
        text = source.text_of(node)
        if _FLOAT_LITERAL.match(text):
            return "float"
        if _DOUBLE_LITERAL.match(text):
            return "double"
        return "int" if _INT_LITERAL.match(text) else None
    if kind == "identifier":
        declared = types.get(source.text_of(node))
        return None if declared is None else _plain_type(declared)
    if kind == "parenthesized_expression" and node.named_children:
        return value_type(source, types, node.named_children[0])
    if kind == "subscript_expression":
        base = node.child_by_field_name("argument")
        inner = None if base is None else value_type(source, types, base)
        if inner is None:
            return None
        if inner.endswith("*"):
            return inner[:-1]
        if inner.endswith("[]"):
            return inner[:-2]
        return None
    if kind == "pointer_expression" and source.text_of(node).startswith("*"):
        argument = node.child_by_field_name("argument")
        inner = None if argument is None else value_type(source, types, argument)
        return inner[:-1] if inner is not None and inner.endswith("*") else None
    if kind == "call_expression":
        function = node.child_by_field_name("function")
        name = "" if function is None else source.text_of(function)
        return "float" if name in _FLOAT_CALLS else None
    if kind == "cast_expression":
        type_node = node.child_by_field_name("type")
        return None if type_node is None else _plain_type(source.text_of(type_node))
    if kind == "conditional_expression":
        parts = [node.child_by_field_name(f) for f in ("consequence", "alternative")]
        if None in parts:
            return None
        kinds = [value_type(source, types, p) for p in parts if p is not None]
        known = [k for k in kinds if k not in (None, "int")]
        if None in kinds or len(set(known)) > 1:
            return None
        return known[0] if known else "int"
    if kind == "binary_expression":
        left = node.child_by_field_name("left")
        right = node.child_by_field_name("right")
        op = node.child_by_field_name("operator")
        if left is None or right is None or op is None or op.type not in ("+", "-", "*", "/"):
            return None
        a, b = value_type(source, types, left), value_type(source, types, right)
        if a == b:
            return a
        return a if b == "int" else (b if a == "int" else None)
    return None


def zero_of(type_name: str) -> str:
    """A zero literal of a type: ``0.0f`` for float."""
    return {"float": "0.0f", "double": "0.0", "int": "0"}.get(type_name, f"{type_name}(0)")


@dataclass
class StagedArray:
    """One shared tile of a staged loop."""

    name: str
    element: str
    """The element type, ``float``."""
    declaration: Node
    dims: tuple[int, int]
    store: Node
    """The ``S[l0][l1] = value;`` statement."""
    indices: tuple[Node, Node]
    """``l0`` and ``l1`` (``ty`` and ``tx``)."""
    components: tuple[str, str]
    """The thread components the indices are: ``("y", "x")``."""
    value: Node
    reads: list[Node] = field(default_factory=list)
    """Every ``S[a][b]`` read, in document order."""


@dataclass
class StagedLoop:
    """A loop in the canonical staged form."""

    function: Function
    loop: Node
    var: str
    """The loop variable (the same for every thread: the loop header must not depend on the
    thread, or its barriers would be unsafe already)."""
    arrays: list[StagedArray]
    first_sync: Node
    last_sync: Node
    compute: list[Node]
    """The statements between the two barriers."""
    declarations: list[Node] = field(default_factory=list)
    """Declarations among the stores (of the indices they use): they stay where they are."""


class NotStaged(Exception):
    """The loop is not in the canonical staged form; the message says why."""


def shared_arrays(source: ParsedSource, function: Function) -> dict[str, Node]:
    """Name -> declaration of the static ``__shared__`` arrays declared in a function."""
    found: dict[str, Node] = {}
    if function.body is None:
        return found
    for decl in source.shared_declarations:
        if decl.is_extern or not (
            function.body.start_byte <= decl.node.start_byte < function.body.end_byte
        ):
            continue
        for name in decl.names:
            found[name] = decl.node
    return found


def subscript_chain(node: Node) -> tuple[Node, list[Node]] | None:
    """``S[a][b]`` -> (``S``, [a, b]); None when ``node`` is not a subscript chain."""
    indices: list[Node] = []
    current = node
    while current.type == "subscript_expression":
        arguments = current.child_by_field_name("indices")
        if arguments is None:
            arguments = next(
                (c for c in current.children if c.type == "subscript_argument_list"), None
            )
        if arguments is None or len(arguments.named_children) != 1:
            return None
        indices.insert(0, arguments.named_children[0])
        base = current.child_by_field_name("argument")
        if base is None:
            return None
        current = base
    if not indices or current.type != "identifier":
        return None
    return current, indices


def is_write_target(node: Node) -> bool:
    """Whether an access is written (the left of an assignment, ``++``/``--``) or has its
    address taken, rather than read."""
    parent = node.parent
    return parent is not None and (
        (parent.type == "assignment_expression" and parent.child_by_field_name("left") == node)
        or parent.type in ("update_expression", "pointer_expression")
    )


def outer_subscript(node: Node) -> Node:
    """The outermost subscript expression a name is the base of (``S`` -> ``S[a][b]``)."""
    current = node
    while current.parent is not None and current.parent.type == "subscript_expression":
        base = current.parent.child_by_field_name("argument")
        if base is None or base != current:
            break
        current = current.parent
    return current


def _array_dims(parts: ThreadParts, declaration: Node, name: str) -> tuple[int, ...] | None:
    """The folded extents of a shared array, the same for every launch's template arguments."""
    source = parts.source
    for declarator in declaration.children_by_field_name("declarator"):
        sizes: list[Node] = []
        current: Node | None = declarator
        while current is not None and current.type == "array_declarator":
            size = current.child_by_field_name("size")
            if size is None:
                return None
            sizes.insert(0, size)
            current = current.child_by_field_name("declarator")
        if current is None or source.text_of(current) != name:
            continue
        values = [parts.fold(size) for size in sizes]
        return None if None in values else tuple(v for v in values if v is not None)
    return None


def _store(
    source: ParsedSource, arrays: dict[str, Node], node: Node
) -> tuple[str, Node, list[Node], Node]:
    """(array, target, indices, value) of a ``S[i][j] = value;`` statement."""
    if node.type != "expression_statement" or not node.named_children:
        raise NotStaged(
            f"line {source.line_of(node.start_byte)} is not a tile store 'S[ty][tx] = value;' "
            "at the top of the loop body"
        )
    assignment = node.named_children[0]
    operator = assignment.child_by_field_name("operator")
    if assignment.type != "assignment_expression" or operator is None or operator.type != "=":
        raise NotStaged(f"line {source.line_of(node.start_byte)} is not a tile store 'S[i][j] = v'")
    left = assignment.child_by_field_name("left")
    value = assignment.child_by_field_name("right")
    chain = None if left is None else subscript_chain(left)
    if chain is None or value is None or source.text_of(chain[0]) not in arrays:
        raise NotStaged(f"line {source.line_of(node.start_byte)} stores to no shared array")
    return source.text_of(chain[0]), assignment, chain[1], value


def _thread_indices(
    source: ParsedSource, parts: ThreadParts, name: str, indices: list[Node]
) -> tuple[str, str]:
    if len(indices) != 2:
        raise NotStaged(f"{name} is not stored as a 2-D tile S[ty][tx]")
    components = tuple(parts.component(i) for i in indices)
    if None in components or components[0] == components[1]:
        raise NotStaged(
            f"{name} is stored at [{', '.join(source.text_of(i) for i in indices)}], not at "
            "two distinct thread indices such as [threadIdx.y][threadIdx.x] (or tid / W and "
            "tid % W, tid the thread's place in a block W wide)"
        )
    return components[0] or "", components[1] or ""


def _check_block(source: ParsedSource, function: Function, array: StagedArray) -> None:
    """The launch block must be exactly as large as the tile, so every element is stored."""
    dims = kernel_block_dims(source, function)
    if dims is None:
        raise NotStaged(
            f"the block dimensions of {function.name} are not compile-time constants agreed "
            "by every launch in the file, so the tile's coverage cannot be checked"
        )
    extent = {"x": dims[0], "y": dims[1], "z": dims[2]}
    want = {array.components[0]: array.dims[0], array.components[1]: array.dims[1]}
    for component, size in want.items():
        if extent[component] != size:
            raise NotStaged(
                f"{array.name} is {array.dims[0]}x{array.dims[1]} but the block is "
                f"{dims[0]}x{dims[1]}x{dims[2]}: some elements would be stored by no thread"
            )
    third = ({"x", "y", "z"} - set(array.components)).pop()
    if extent[third] != 1:
        raise NotStaged(f"the block has {extent[third]} threads along {third}; it must be 1")


def thread_names(locals_: Locals, component: str) -> set[str]:
    """``threadIdx.x`` and the locals holding exactly it."""
    names = {f"threadIdx.{component}"}
    for name in locals_.declared:
        value = locals_.initializer(name)
        if value is not None and locals_.thread_component(value) == component:
            names.add(name)
    return names


def _read_mapping(
    source: ParsedSource, parts: ThreadParts, array: StagedArray, read: Node, loop_var: str
) -> dict[str, str]:
    """The renaming that turns the stored value into the value at a read ``S[a][b]``. A
    local the value reads that is itself computed from a thread index (``w_row = blockIdx.x
    * T + ty``, the row a thread loads; ``at = w_row * K + w_col``, through several levels)
    is written out, renamed the same way."""
    chain = subscript_chain(read)
    if chain is None or len(chain[1]) != 2:
        raise NotStaged(
            f"line {source.line_of(read.start_byte)} uses {array.name} other than as "
            f"{array.name}[i][j]"
        )
    locals_ = parts.locals_
    mapping: dict[str, str] = {}
    changed: dict[str, str] = {}  # component -> the index name the read replaces
    for stored, wanted, component in zip(array.indices, chain[1], array.components, strict=True):
        if source.text_of(stored) == source.text_of(wanted):
            continue
        name = name_of(source, stored) or ""
        if (thread_names(locals_, component) - {name}) & names_in(source, array.value):
            raise NotStaged(_other_spelling(array, component, name))
        changed[component] = name
        text = source.text_of(wanted)
        mapping[name] = text if precedence(wanted) >= PRIMARY else f"({text})"
    if not changed:
        return mapping
    spellings = set().union(*(thread_names(locals_, c) for c in changed))
    others = spellings - set(changed.values())  # a spelling other than the index names
    # the other components' own indices hold nothing of these (tid % W is no row)
    stop = {loop_var} | {n for n, c in parts.atoms.items() if c not in changed}
    through: dict[str, Node] = {}  # locals to write out, each after those it reads

    component, name = next(iter(changed.items()))  # named when a local is refused

    def write_out(node: Node) -> None:
        for found in _name_nodes(source, node, ""):
            local = source.text_of(found)
            if local in mapping or local in through or local in stop:
                continue
            if not locals_.depends_on(found, spellings, stop):
                continue
            value = locals_.initializer(local)
            # written out only where it reads the index as the store does, by its name
            if value is None or local in locals_.assigned or others & names_in(source, value):
                raise NotStaged(_other_spelling(array, component, name))
            write_out(value)
            through[local] = value

    write_out(array.value)
    for local, value in through.items():
        mapping[local] = f"({rename(source, value, mapping)})"
    return mapping


def _other_spelling(array: StagedArray, component: str, name: str) -> str:
    return (
        f"the value stored into {array.name} depends on threadIdx.{component} through "
        f"something other than {name} or a local computed from it, so the element another "
        "thread stored is not the same expression with the index replaced"
    )


def _name_nodes(source: ParsedSource, node: Node, skip: str) -> list[Node]:
    """The identifier nodes of an expression other than ``skip`` (for dependency checks)."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type == "identifier" and source.text_of(current) != skip:
            parent = current.parent
            if parent is None or parent.type != "field_expression":
                found.append(current)
            continue
        stack.extend(current.named_children)
    return found


def _assigned_in(source: ParsedSource, nodes: list[Node]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        for found in source.iter_nodes("assignment_expression", "update_expression", within=node):
            target = found.child_by_field_name("left") or found.child_by_field_name("argument")
            if target is not None and target.type == "identifier":
                names.add(source.text_of(target))
    return names


def _split_body(source: ParsedSource, body: Node) -> tuple[list[Node], Node, list[Node], Node]:
    """(stores, first barrier, compute statements, last barrier) of a loop body."""
    items = [s for s in statements(body) if s.type != "preproc_call"]
    syncs = [i for i, s in enumerate(items) if is_call_statement(source, s, SYNC)]
    if len(syncs) != 2 or syncs[1] != len(items) - 1:
        raise NotStaged(
            "the loop body is not 'stores; __syncthreads(); compute; __syncthreads();' (it "
            f"has {len(syncs)} barriers at its top level)"
        )
    first, last = syncs
    compute = [
        s
        for s in statements(body)
        if items[first].end_byte <= s.start_byte < items[last].start_byte
    ]
    if not items[:first] or not compute:
        raise NotStaged("the loop stores no tile before its first barrier, or computes nothing")
    return items[:first], items[first], compute, items[last]


def analyze_staged_loop(source: ParsedSource, function: Function, loop: Node) -> StagedLoop:
    """The staged form of ``loop``; :class:`NotStaged` says why it is not canonical."""
    body = loop.child_by_field_name("body")
    if loop.type != "for_statement" or body is None or body.type != "compound_statement":
        raise NotStaged("the tile loop is not a for loop with a braced body")
    if not function.is_kernel:
        callers = sorted(
            caller for caller, _ in analysis(source).call_graph.call_sites(function.name)
        )
        raise NotStaged(
            f"the tile loop is in {function.name}, a __device__ function that declares its own "
            f"shared tiles and that {', '.join(callers) or 'a kernel'} calls (directly or bound "
            "as a template argument); this rule needs the staged tile loop in the __global__ "
            "kernel itself, whose launch it reads"
        )
    locals_ = Locals(source, function)
    parts = ThreadParts(source, function, locals_)
    shared = shared_arrays(source, function)
    stores, first_sync, compute, last_sync = _split_body(source, body)
    arrays: list[StagedArray] = []
    declarations: list[Node] = []
    for store in stores:
        if store.type == "declaration":
            _check_index_declaration(source, locals_, shared, store)
            declarations.append(store)
            continue
        name, _, indices, value = _store(source, shared, store)
        if any(a.name == name for a in arrays):
            raise NotStaged(f"{name} is stored twice before the barrier")
        components = _thread_indices(source, parts, name, indices)
        declaration = shared[name]
        dims = _array_dims(parts, declaration, name)
        if dims is None or len(dims) != 2:
            raise NotStaged(f"the extents of {name} are not two compile-time constants")
        element = _plain_type(
            source.text_of(declaration.child_by_field_name("type") or declaration)
        )
        arrays.append(
            StagedArray(
                name,
                element,
                declaration,
                (dims[0], dims[1]),
                store,
                (indices[0], indices[1]),
                components,
                value,
            )
        )
    header = source.loop_at(loop)
    var = header.variable if header is not None and header.variable else ""
    spellings = set().union(*(thread_names(locals_, c) for c in "xyz"))
    for part in (loop.child_by_field_name(f) for f in ("initializer", "condition", "update")):
        if part is not None and any(
            locals_.depends_on(n, spellings, {var}) for n in _name_nodes(source, part, var)
        ):
            raise NotStaged("the tile loop's trip count depends on the thread")
    if not arrays:
        raise NotStaged("the loop declares indices before its first barrier but stores no tile")
    staged = StagedLoop(function, loop, var, arrays, first_sync, last_sync, compute, declarations)
    _check_uses(source, parts, staged)
    for array in arrays:
        _check_block(source, function, array)
    return staged


def _check_index_declaration(
    source: ParsedSource, locals_: Locals, shared: dict[str, Node], node: Node
) -> None:
    """A declaration among the stores declares indices: each initialized, never written
    again, reading no shared array."""
    for declarator in node.children_by_field_name("declarator"):
        name = name_of(source, declarator.child_by_field_name("declarator") or declarator)
        value = declarator.child_by_field_name("value")
        if value is None or name is None or name in locals_.assigned:
            raise NotStaged(
                f"line {source.line_of(node.start_byte)} declares {source.snippet(declarator)} "
                "among the tile stores, not an index computed once (initialized, never written)"
            )
        if names_in(source, value) & set(shared):
            raise NotStaged(
                f"line {source.line_of(node.start_byte)} reads a shared array among the stores"
            )


def _check_uses(source: ParsedSource, parts: ThreadParts, staged: StagedLoop) -> None:
    """Every other use of a tile is a full read inside the compute statements; the stored
    values mean the same at every read (and so do the locals a read writes out)."""
    assert staged.function.body is not None
    declared_inside = declared_names(source, staged.compute)
    assigned_inside = _assigned_in(source, staged.compute)
    for array in staged.arrays:
        decl_names = [
            n for d in source.declarations if d.node == array.declaration for n in d.names
        ]
        if any(n not in {a.name for a in staged.arrays} for n in decl_names):
            raise NotStaged(f"the declaration of {array.name} also declares other arrays")
        store_target = array.store.named_children[0].child_by_field_name("left")
        for node in source.iter_nodes("identifier", within=staged.function.body):
            if source.text_of(node) != array.name or node.parent is None:
                continue
            if node.parent.type in ("array_declarator",) or (
                store_target is not None
                and store_target.start_byte <= node.start_byte < store_target.end_byte
            ):
                continue
            read = outer_subscript(node)
            inside = any(s.start_byte <= read.start_byte < s.end_byte for s in staged.compute)
            if not inside or is_write_target(read):
                raise NotStaged(
                    f"{array.name} is used at line {source.line_of(node.start_byte)} other than "
                    "read between the barriers"
                )
            array.reads.append(read)
        if not array.reads:
            raise NotStaged(f"{array.name} is stored but never read")
        tiles = set(shared_arrays(source, staged.function))
        if names_in(source, array.value) & tiles:
            raise NotStaged(f"the value stored into {array.name} reads a shared array")
        clash = names_in(source, array.value) & (declared_inside | assigned_inside)
        if clash:
            raise NotStaged(
                f"the value stored into {array.name} reads {', '.join(sorted(clash))}, which "
                "the compute statements declare or change"
            )
        indices = {name_of(source, index) for index in array.indices}
        for read in array.reads:
            mapping = _read_mapping(source, parts, array, read, staged.var)
            written = set().union(
                *(
                    names_in(source, value)
                    for local in set(mapping) - indices
                    if (value := parts.locals_.initializer(local)) is not None
                )
            )
            clash = written & (declared_inside | assigned_inside)
            if clash:
                raise NotStaged(
                    f"a read of {array.name} writes out {', '.join(sorted(clash))}, which the "
                    "compute statements declare or change"
                )


def unread_declarations(source: ParsedSource, staged: StagedLoop, written: list[str]) -> list[Node]:
    """The declarations among the stores that nothing reads once the stores are gone and the
    reads are ``written`` (the texts that replace them): indices only the stores used."""
    assert staged.function.body is not None
    gone: list[Node] = [array.store for array in staged.arrays]
    mentioned = {word for text in written for word in re.findall(r"\b\w+\b", text)}
    names = {node.id: declared_names(source, [node]) for node in staged.declarations}
    uses = list(source.iter_nodes("identifier", within=staged.function.body))

    def read_elsewhere(node: Node) -> bool:
        return any(
            source.text_of(use) in names[node.id]
            and not any(within(use, other) for other in [*gone, node])
            for use in uses
        )

    left = list(staged.declarations)
    while True:
        unread = [n for n in left if not names[n.id] & mentioned and not read_elsewhere(n)]
        if not unread:
            return [node for node in staged.declarations if node not in left]
        gone += unread
        left = [node for node in left if node not in unread]


def read_mapping(
    source: ParsedSource, staged: StagedLoop, array: StagedArray, read: Node
) -> dict[str, str]:
    """The renaming of the stored value that gives the value at ``read`` (after a successful
    :func:`analyze_staged_loop`)."""
    parts = ThreadParts(source, staged.function, Locals(source, staged.function))
    return _read_mapping(source, parts, array, read, staged.var)


def staging_loops(source: ParsedSource) -> list[tuple[Function, Node]]:
    """Loops in kernels (and in the device functions that hold a kernel's block-level work,
    `SourceAnalysis.block_functions`) whose body has a ``__syncthreads()`` at its top level
    and stores into a static ``__shared__`` array inside: the places a staged tile may be."""
    found = []
    for function in analysis(source).block_functions:
        shared = shared_arrays(source, function)
        if function.body is None or not shared:
            continue
        types = source.local_types(function)
        pointers = {n for n, t in types.items() if t.endswith("*") and n not in shared}
        for loop in source.iter_nodes("for_statement", "while_statement", within=function.body):
            body = loop.child_by_field_name("body")
            if body is None or body.type != "compound_statement":
                continue
            if not any(is_call_statement(source, s, SYNC) for s in statements(body)):
                continue
            if _stores_shared(source, body, shared, pointers):
                found.append((function, loop))
    return found


def _stores_shared(
    source: ParsedSource, body: Node, shared: dict[str, Node], pointers: set[str]
) -> bool:
    """Whether a loop body stores a value read from global memory (through a pointer) into
    one of the ``shared`` arrays, at any depth; a shared-memory reduction does not."""
    for assignment in source.iter_nodes("assignment_expression", within=body):
        left = assignment.child_by_field_name("left")
        right = assignment.child_by_field_name("right")
        view = None if left is None else vector_view(source, left)
        chain = None if left is None else subscript_chain(view[0] if view else left)
        if chain is None or right is None or source.text_of(chain[0]) not in shared:
            continue
        if names_in(source, right) & pointers:
            return True
    return False
