"""Helpers shared by the atomics, histogram and selection mechanisms.

``smem_histogram``, ``warp_ballot_compaction`` and ``candidate_filtering`` all need to know
more about a kernel than the source model answers directly:

- **which objects live in shared memory**: ``sh.hist[i]`` is shared when ``sh`` is a
  ``__shared__`` variable, or a reference parameter of a struct type that the file declares
  ``__shared__`` (the top-k expert passes ``Shared& sh`` down its helpers);
- **whether every lane of a warp reaches a statement** (:class:`Uniformity`): a full-mask
  ``__ballot_sync`` deadlocks, or reads garbage, when some lanes of the warp never call it. The
  analysis is conservative (unknown means *not* uniform) and interprocedural: a device
  function is reached uniformly when all its calls in the file are, and a lambda passed to a
  helper is reached uniformly when every call of that parameter in the helper is;
- small statement and text utilities (statements of a block, fresh names, re-indenting).

Uniformity assumes a race-free kernel: a read of memory at a warp-uniform address gives every
lane the same value (``sh.n_candidates`` after a barrier). That is what the expert kernels
rely on themselves.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

from klineage.cuda.source import (
    LOOP_KINDS,
    Function,
    Node,
    ParsedSource,
    call_name,
    strip_parens,
    within,
)
from klineage.cuda.tree import FULL_WARP_MASK as FULL_MASK
from klineage.cuda.tree import call_arguments as call_args
from klineage.cuda.tree import descendants as iter_descendants
from klineage.cuda.tree import fresh_name, is_full_mask
from klineage.cuda.tree import statements as block_statements

__all__ = [
    "FULL_MASK",
    "Uniformity",
    "base_identifier",
    "block_statements",
    "call_args",
    "call_name",
    "declared_names",
    "dedent_lines",
    "fresh_name",
    "identifiers_in",
    "indent_lines",
    "is_full_mask",
    "is_one",
    "is_pure",
    "iter_descendants",
    "kernels_reaching",
    "node_starting_at",
    "normalized",
    "shared_array_size",
    "shared_base",
    "strip_parens",
    "struct_field_size",
    "uniformity",
    "within",
]

_JUMPS = ("return_statement", "break_statement", "continue_statement", "goto_statement")
_UNIFORM_BUILTINS = frozenset({"blockIdx", "blockDim", "gridDim", "warpSize"})
_THREAD_BUILTINS = frozenset({"threadIdx"})
_WARP_VOTES = frozenset({"__ballot_sync", "__any_sync", "__all_sync", "__uni_sync"})
_PURE_CALLS = frozenset(
    {"min", "max", "abs", "fminf", "fmaxf", "fabsf", "__popc", "__popcll", "__ffs", "__ffsll",
     "__clz", "__clzll", "__brev", "__float_as_uint", "__uint_as_float", "__float_as_int",
     "__int_as_float", "__float2int_rn", "__float2uint_rn", "__int2float_rn", "__umulhi",
     "__mul24", "__umul24", "static_cast", "reinterpret_cast", "const_cast", "sizeof"}
)  # fmt: skip
_PURE_EXPRESSIONS = frozenset(
    {"parenthesized_expression", "binary_expression", "unary_expression", "cast_expression",
     "conditional_expression", "pointer_expression", "field_expression", "subscript_expression",
     "subscript_argument_list", "initializer_list", "argument_list", "comma_expression",
     "compound_literal_expression", "condition_clause"}
)  # fmt: skip
_LITERALS = frozenset(
    {"number_literal", "char_literal", "string_literal", "concatenated_string", "true", "false",
     "null", "nullptr", "this", "sizeof_expression", "alignof_expression", "type_descriptor",
     "field_identifier", "template_argument_list", "comment"}
)  # fmt: skip
_INT_LITERAL = re.compile(r"^(0[xX][0-9a-fA-F]+|\d+)[uUlL]*$")


# ---------------------------------------------------------------------------------------------
# Small syntax helpers
# ---------------------------------------------------------------------------------------------


def normalized(text: str) -> str:
    """Text with all whitespace removed, to compare expressions written differently."""
    return "".join(text.split())


def node_starting_at(source: ParsedSource, start: int, kind: str) -> Node | None:
    """The outermost node of ``kind`` that starts at byte ``start`` (for sites whose span
    covers several statements, where ``Mechanism.node_at`` finds their common block)."""
    node: Node | None = source.root.descendant_for_byte_range(start, start)
    found = None
    while node is not None and node.start_byte == start:
        if node.type == kind:
            found = node
        node = node.parent
    return found


def identifiers_in(source: ParsedSource, node: Node) -> set[str]:
    """Every identifier (and type identifier) written inside ``node``."""
    found: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current.type in ("identifier", "type_identifier", "field_identifier"):
            found.add(source.text_of(current))
        stack.extend(current.named_children)
    return found


def declared_names(source: ParsedSource, node: Node) -> set[str]:
    """Names declared by the declarations inside ``node`` (locals that would leak into the
    enclosing scope if its braces were dropped)."""
    names: set[str] = set()
    for declaration in [node, *iter_descendants(node, "declaration")]:
        if declaration.type != "declaration":
            continue
        for declarator in declaration.children_by_field_name("declarator"):
            name = _declarator_name(declarator)
            if name is not None:
                names.add(source.text_of(name))
    return names


def _declarator_name(declarator: Node) -> Node | None:
    current: Node | None = declarator
    while current is not None and current.type != "identifier":
        inner = current.child_by_field_name("declarator")
        if inner is None:
            inner = next(
                (c for c in current.named_children if c.type.endswith("declarator")), None
            ) or next((c for c in current.named_children if c.type == "identifier"), None)
        current = inner
    return current


def indent_lines(text: str, extra: str) -> str:
    """Every non-blank line of ``text`` but the first indented by ``extra``."""
    lines = text.split("\n")
    return "\n".join([lines[0]] + [extra + line if line.strip() else line for line in lines[1:]])


def dedent_lines(text: str, amount: int) -> str:
    """Every line of ``text`` but the first with up to ``amount`` leading spaces removed."""
    lines = text.split("\n")
    out = [lines[0]]
    for line in lines[1:]:
        strip = 0
        while strip < amount and strip < len(line) and line[strip] == " ":
            strip += 1
        out.append(line[strip:])
    return "\n".join(out)


def is_one(source: ParsedSource, node: Node) -> Node | None:
    """The literal ``1`` inside ``1``, ``1u``, ``(T)1``, ``static_cast<T>(1)``; else None."""
    node = strip_parens(node)
    if node.type == "number_literal":
        match = _INT_LITERAL.match(source.text_of(node))
        return node if match is not None and int(match.group(1), 0) == 1 else None
    if node.type == "cast_expression":
        value = node.child_by_field_name("value")
        return is_one(source, value) if value is not None else None
    if call_name(source, node) == "static_cast":
        args = call_args(node)
        return is_one(source, args[0]) if len(args) == 1 else None
    return None


def is_pure(source: ParsedSource, node: Node) -> bool:
    """Whether evaluating an expression twice is harmless: no assignments, increments, or
    calls other than pure intrinsics."""
    if node.type in ("assignment_expression", "update_expression", "lambda_expression"):
        return False
    if node.type == "call_expression":
        name = call_name(source, node)
        if name not in _PURE_CALLS:
            return False
        return all(is_pure(source, a) for a in call_args(node))
    return all(is_pure(source, c) for c in node.named_children)


def base_identifier(node: Node) -> Node | None:
    """The variable an access starts from: ``sh.hist[i]`` -> ``sh``; ``&h[i]`` -> ``h``."""
    current: Node | None = strip_parens(node)
    while current is not None:
        if current.type == "identifier":
            return current
        if current.type in ("subscript_expression", "field_expression", "pointer_expression"):
            current = current.child_by_field_name("argument")
        elif current.type == "parenthesized_expression" and current.named_child_count == 1:
            current = current.named_children[0]
        else:
            return None
    return None


# ---------------------------------------------------------------------------------------------
# Shared memory
# ---------------------------------------------------------------------------------------------


def _shared_types(source: ParsedSource) -> set[str]:
    """Struct types of the file that it also declares ``__shared__`` (``__shared__ Shared sh``):
    a reference to one of them refers to shared memory in practice."""
    structs = set()
    for node in source.nodes("struct_specifier"):
        name = node.child_by_field_name("name")
        if name is not None and node.child_by_field_name("body") is not None:
            structs.add(source.text_of(name))
    return {d.type for d in source.shared_declarations if d.type in structs}


def shared_base(source: ParsedSource, function: Function | None, node: Node) -> str | None:
    """The shared-memory variable an access goes through (``sh`` for ``sh.hist[i]``), or None
    when it is not known to be shared memory.

    Shared: a ``__shared__`` variable declared in the function or at file scope, or a
    reference or pointer parameter of a struct type that the file declares ``__shared__``.
    """
    base = base_identifier(node)
    if base is None:
        return None
    name = source.text_of(base)
    for declaration in source.shared_declarations:
        if name not in declaration.names:
            continue
        owner = source.enclosing_function(declaration.node)
        if owner is None or (function is not None and owner.node == function.node):
            return name
    if function is not None:
        param = function.param(name)
        if param is not None and (param.is_pointer or "&" in param.type):
            return name if param.base_type in _shared_types(source) else None
    return None


def struct_field_size(source: ParsedSource, field: str) -> Node | None:
    """The array size node of a struct field ``T field[N];`` (any struct in the file)."""
    for declaration in source.nodes("field_declaration"):
        for declarator in declaration.children_by_field_name("declarator"):
            if declarator.type != "array_declarator":
                continue
            name = declarator.child_by_field_name("declarator")
            if name is not None and source.text_of(name) == field:
                return declarator.child_by_field_name("size")
    return None


def shared_array_size(source: ParsedSource, function: Function | None, access: Node) -> Node | None:
    """The declared size of the shared array an access writes (``sh.cand_key[i]`` ->
    ``kCapacity``; ``s_buf[i]`` -> the ``__shared__`` declaration's size)."""
    target = strip_parens(access)
    if target.type != "subscript_expression":
        return None
    array = target.child_by_field_name("argument")
    if array is None or shared_base(source, function, array) is None:
        return None
    array = strip_parens(array)
    if array.type == "field_expression":
        field = array.child_by_field_name("field")
        return struct_field_size(source, source.text_of(field)) if field is not None else None
    if array.type == "identifier":
        name = source.text_of(array)
        for declaration in source.shared_declarations:
            for declared, declarator in zip(
                declaration.names, declaration.declarators, strict=True
            ):
                if declared == name and declarator.type == "array_declarator":
                    return declarator.child_by_field_name("size")
    return None


# ---------------------------------------------------------------------------------------------
# Call graph
# ---------------------------------------------------------------------------------------------


def kernels_reaching(source: ParsedSource, name: str) -> list[Function]:
    """The kernels from which the function ``name`` can be called (through the file's calls)."""
    seen = {name}
    frontier = [name]
    kernels: dict[str, Function] = {}
    while frontier:
        current = frontier.pop()
        function = source.function(current)
        if function is not None and function.is_kernel:
            kernels[function.name] = function
        for call in source.calls:
            if call.name != current:
                continue
            caller = source.enclosing_function(call.node)
            if caller is not None and caller.name not in seen:
                seen.add(caller.name)
                frontier.append(caller.name)
    return [kernels[k] for k in sorted(kernels)]


# ---------------------------------------------------------------------------------------------
# Warp uniformity
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    """Where names resolve: a function, or a lambda inside one."""

    node: Node
    """The ``function_definition`` or ``lambda_expression``."""
    body: Node
    function: Function
    assume_params: bool = False
    """Treat the function's parameters as uniform (a call with uniform arguments)."""

    @property
    def is_lambda(self) -> bool:
        return self.node.type == "lambda_expression"


def _region(declaration: Node) -> Node:
    """Where a declaration is visible: its ``for`` statement, or its enclosing block."""
    parent = declaration.parent
    return parent if parent is not None else declaration


def _key(node: Node) -> tuple[int, int, str]:
    return (node.start_byte, node.end_byte, node.type)


class Uniformity:
    """Which values are equal on every lane of a warp, and which statements every lane
    reaches. Conservative: whatever cannot be shown uniform is reported as not uniform.

    Get one per parsed source with :func:`uniformity` (it caches its answers).
    """

    def __init__(self, source: ParsedSource) -> None:
        self.source = source
        self._values: dict[tuple[tuple[int, int, str], bool], bool] = {}
        self._params: dict[tuple[str, int], bool] = {}
        self._returns: dict[str, bool] = {}
        self._functions: dict[str, str | None] = {}
        self._busy: set[object] = set()

    # -- scopes -------------------------------------------------------------------------------

    def scope_of(self, node: Node, assume_params: bool = False) -> _Scope | None:
        """The innermost lambda or function around ``node``."""
        function = self.source.enclosing_function(node)
        if function is None or function.body is None:
            return None
        current = node.parent
        while current is not None and current != function.node:
            if current.type == "lambda_expression":
                body = current.child_by_field_name("body")
                if body is not None and within(node, body):
                    return _Scope(current, body, function, assume_params)
            current = current.parent
        return _Scope(function.node, function.body, function, assume_params)

    def _outer(self, scope: _Scope) -> _Scope | None:
        """The scope around a lambda's scope."""
        return self.scope_of(scope.node, scope.assume_params) if scope.is_lambda else None

    def _in_scope(self, node: Node, scope: _Scope) -> bool:
        """Whether ``node`` belongs to ``scope`` itself (not to a lambda nested in it)."""
        if not within(node, scope.body):
            return False
        current = node.parent
        while current is not None and current != scope.node:
            if current.type == "lambda_expression":
                return False
            current = current.parent
        return True

    # -- values -------------------------------------------------------------------------------

    def value(self, node: Node, scope: _Scope | None = None) -> bool:
        """Whether an expression has the same value on every lane of a warp."""
        scope = scope or self.scope_of(node)
        if scope is None:
            return False
        key = (_key(node), scope.assume_params)
        if key in self._values:
            return self._values[key]
        if key in self._busy:
            return False
        self._busy.add(key)
        try:
            result = self._value(node, scope)
        finally:
            self._busy.discard(key)
        self._values[key] = result
        return result

    def _value(self, node: Node, scope: _Scope) -> bool:
        kind = node.type
        if kind in _LITERALS:
            return True
        if kind == "identifier":
            return self._name(self.source.text_of(node), node, scope)
        if kind in ("qualified_identifier", "template_function"):
            return True  # a constant or a function name, never a per-thread variable
        if kind == "field_expression":
            argument = node.child_by_field_name("argument")
            return argument is not None and self.value(argument, scope)
        if kind == "call_expression":
            return self._call(node, scope)
        if kind in ("assignment_expression", "update_expression"):
            # as a loop update (`i += kThreads`): uniform when its variable and operand are
            return all(self.value(c, scope) for c in node.named_children)
        if kind in _PURE_EXPRESSIONS:
            return all(self.value(c, scope) for c in node.named_children if c.type != "comment")
        return False

    def _call(self, node: Node, scope: _Scope) -> bool:
        source = self.source
        name = call_name(source, node)
        args = call_args(node)
        if name is None:
            return False
        if name in _WARP_VOTES:
            return True  # the same answer on every lane that votes
        if name == "__shfl_sync":
            return len(args) >= 3 and self.value(args[2], scope)
        if not all(self.value(a, scope) for a in args):
            return False
        if name in _PURE_CALLS or name.startswith("make_"):
            return True
        function = source.function(name)
        if function is None or not function.runs_on_device or function.is_kernel:
            return False
        return self._returns_uniform(function)

    def _returns_uniform(self, function: Function) -> bool:
        """Whether a device function returns a uniform value when called with uniform
        arguments."""
        if function.name in self._returns:
            return self._returns[function.name]
        marker = ("returns", function.name)
        if marker in self._busy or function.body is None:
            return False
        self._busy.add(marker)
        try:
            scope = _Scope(function.node, function.body, function, assume_params=True)
            returns = [
                r for r in self.source.iter_nodes("return_statement", within=function.body)
                if self._in_scope(r, scope)
            ]  # fmt: skip
            values = [r.named_children[0] for r in returns if r.named_children]
            result = bool(values) and all(self.value(v, scope) for v in values)
        finally:
            self._busy.discard(marker)
        self._returns[function.name] = result
        return result

    def _name(self, name: str, node: Node, scope: _Scope) -> bool:
        if name in _THREAD_BUILTINS:
            return False
        if name in _UNIFORM_BUILTINS:
            return True
        current: _Scope | None = scope
        while current is not None:
            found = self._resolve(name, node, current)
            if found is not None:
                return found
            current = self._outer(current)
        return True  # a file constant, an enumerator or a macro such as UINT32_MAX

    def _resolve(self, name: str, node: Node, scope: _Scope) -> bool | None:
        """Whether ``name`` is uniform, when ``scope`` declares it; None when it does not."""
        declarators = self._visible(name, node, scope)
        if declarators:
            return all(self._variable(name, d, decl, scope) for decl, d in declarators)
        if scope.is_lambda:
            parameters = scope.node.child_by_field_name("declarator")
            if parameters is not None and name in identifiers_in(self.source, parameters):
                return False  # a lambda parameter: its callers are not known here
            return None
        function = scope.function
        if name in function.template_params:
            return True
        for index, param in enumerate(function.params):
            if param.name == name:
                if function.is_kernel or scope.assume_params:
                    return True
                return self.param(function, index)
        return None

    def _declarators(self, name: str, scope: _Scope) -> list[tuple[Node, Node]]:
        found = []
        for declaration in self.source.iter_nodes("declaration", within=scope.body):
            if not self._in_scope(declaration, scope):
                continue
            for declarator in declaration.children_by_field_name("declarator"):
                ident = _declarator_name(declarator)
                if ident is not None and self.source.text_of(ident) == name:
                    found.append((declaration, declarator))
        return found

    def _visible(self, name: str, node: Node, scope: _Scope) -> list[tuple[Node, Node]]:
        """The declaration of ``name`` that ``node`` sees: the innermost one whose region
        (its block, or its ``for`` statement) holds ``node``; all of them when none does."""
        declarators = self._declarators(name, scope)
        seen = [
            (declaration, declarator)
            for declaration, declarator in declarators
            if declaration.start_byte <= node.start_byte and within(node, _region(declaration))
        ]
        if not seen:
            return declarators
        return [max(seen, key=lambda pair: pair[0].start_byte)]

    def _variable(self, name: str, declarator: Node, declaration: Node, scope: _Scope) -> bool:
        source = self.source
        qualifiers = {
            source.text_of(c) for c in declaration.children if c.type.endswith("qualifier")
        }
        if "__shared__" in qualifiers:
            return True  # one object per block: its address is uniform
        region = _region(declaration)
        writes = [w for w in self._writes(name, scope) if within(w, region)]
        loop = declaration.parent if declaration.parent is not None else None
        if writes:
            if loop is None or loop.type != "for_statement":
                return False
            update = loop.child_by_field_name("update")
            if update is None or not all(within(w, update) for w in writes):
                return False
            if not all(self._write_uniform(w, scope) for w in writes):
                return False
        if declarator.type != "init_declarator":
            return False  # no initializer: a per-thread value until written
        value = declarator.child_by_field_name("value")
        return value is not None and self.value(value, scope)

    def _writes(self, name: str, scope: _Scope) -> list[Node]:
        """Assignments, increments and address-takings of ``name`` anywhere in the function."""
        source = self.source
        body = scope.function.body
        assert body is not None
        found = []
        for node in source.iter_nodes(
            "assignment_expression", "update_expression", "pointer_expression", within=body
        ):
            if node.type == "assignment_expression":
                target = node.child_by_field_name("left")
            else:
                target = node.child_by_field_name("argument")
                if node.type == "pointer_expression" and source.text_of(node)[:1] != "&":
                    continue
            if (
                target is not None
                and target.type == "identifier"
                and source.text_of(target) == name
            ):
                found.append(node)
        return found

    def _write_uniform(self, write: Node, scope: _Scope) -> bool:
        if write.type == "update_expression":
            return True
        if write.type == "assignment_expression":
            right = write.child_by_field_name("right")
            return right is not None and self.value(right, scope)
        return False

    def param(self, function: Function, index: int) -> bool:
        """Whether every call of ``function`` in the file passes a uniform argument ``index``."""
        key = (function.name, index)
        if key in self._params:
            return self._params[key]
        if key in self._busy:
            return False
        self._busy.add(key)
        try:
            calls = [c for c in self.source.calls if c.name == function.name]
            result = bool(calls) and all(
                index < len(c.args) and self.value(c.args[index]) for c in calls
            )
        finally:
            self._busy.discard(key)
        self._params[key] = result
        return result

    # -- control flow -------------------------------------------------------------------------

    def reached(self, node: Node) -> str | None:
        """None when every lane of a warp reaches ``node`` together; else why not (or why it
        cannot be told)."""
        scope = self.scope_of(node)
        if scope is None:
            return f"line {self.source.line_of(node.start_byte)} is not inside a function"
        reason = self._local(node, scope)
        if reason is not None:
            return reason
        if scope.is_lambda:
            return self._lambda(scope)
        return self.function_reached(scope.function)

    def _condition_reason(self, node: Node, scope: _Scope) -> str | None:
        """Why the conditions around ``node`` inside its scope may differ between lanes."""
        child = node
        current = node.parent
        while current is not None and current != scope.body and within(current, scope.body):
            guard = self._guard(current, child)
            for expression in guard:
                if not self.value(expression, scope):
                    line = self.source.line_of(expression.start_byte)
                    return (
                        f"line {line}: `{self.source.snippet(expression, 60)}` may differ "
                        "between the lanes of a warp"
                    )
            child, current = current, current.parent
        return None

    def _guard(self, parent: Node, child: Node) -> list[Node]:
        """The expressions deciding whether ``child`` of ``parent`` runs."""
        kind = parent.type
        condition = parent.child_by_field_name("condition")
        if kind == "if_statement" and condition is not None and child != condition:
            return [condition]
        if kind in ("while_statement", "do_statement", "switch_statement"):
            return [condition] if condition is not None and child != condition else []
        if kind == "for_statement":
            parts = [parent.child_by_field_name(f) for f in ("initializer", "condition", "update")]
            initializer = parts[0]
            if initializer is not None and child == initializer:
                return []
            exprs = [p for p in parts[1:] if p is not None]
            if initializer is not None:
                if initializer.type == "declaration":
                    values = [
                        d.child_by_field_name("value")
                        for d in initializer.children_by_field_name("declarator")
                    ]
                    exprs += [v for v in values if v is not None]
                else:
                    exprs.append(initializer)
            return exprs
        if kind == "for_range_loop":
            right = parent.child_by_field_name("right")
            return [right] if right is not None and child != right else []
        if kind == "conditional_expression" and condition is not None and child != condition:
            return [condition]
        if kind == "binary_expression":
            operator = parent.child_by_field_name("operator")
            left = parent.child_by_field_name("left")
            if operator is not None and operator.type in ("&&", "||") and left is not None:
                return [left] if child != left else []
        return []

    def _local(self, node: Node, scope: _Scope) -> str | None:
        reason = self._condition_reason(node, scope)
        if reason is not None:
            return reason
        for jump in self.source.iter_nodes(*_JUMPS, within=scope.body):
            if not self._in_scope(jump, scope) or not self._skips(jump, node, scope):
                continue
            why = self._condition_reason(jump, scope)
            if why is not None:
                line = self.source.line_of(jump.start_byte)
                word = self.source.text_of(jump).split()[0].rstrip(";")
                return f"the `{word}` at line {line} may leave some lanes behind ({why})"
        return None

    def _skips(self, jump: Node, node: Node, scope: _Scope) -> bool:
        """Whether taking ``jump`` can keep a lane from reaching ``node`` (now or in a later
        iteration)."""
        if jump.type == "goto_statement":
            return True
        loops = []
        current = jump.parent
        while current is not None and current != scope.body:
            if current.type in LOOP_KINDS or current.type == "switch_statement":
                loops.append(current)
            current = current.parent
        if jump.type == "return_statement":
            return jump.start_byte < node.start_byte or any(
                within(node, loop) for loop in loops if loop.type in LOOP_KINDS
            )
        targets = [
            loop for loop in loops if loop.type in LOOP_KINDS or jump.type == "break_statement"
        ]
        return bool(targets) and within(node, targets[0])

    def _lambda(self, scope: _Scope) -> str | None:
        source = self.source
        lam = scope.node
        line = source.line_of(lam.start_byte)
        parent = lam.parent
        if parent is None:
            return f"the lambda at line {line} is never called"
        if parent.type == "call_expression" and parent.child_by_field_name("function") == lam:
            return self.reached(parent)
        if parent.type == "argument_list" and parent.parent is not None:
            return self._lambda_argument(lam, parent, parent.parent)
        if parent.type == "init_declarator":
            name_node = parent.child_by_field_name("declarator")
            outer = self.scope_of(parent)
            if name_node is None or outer is None:
                return f"cannot tell where the lambda at line {line} is called"
            name = source.text_of(name_node)
            calls = [c.node for c in source.calls if c.name == name and within(c.node, outer.body)]
            return self._all_reached(calls, f"the lambda {name} of line {line} is never called")
        return f"cannot tell where the lambda at line {line} is called"

    def _lambda_argument(self, lam: Node, arguments: Node, call: Node) -> str | None:
        source = self.source
        line = source.line_of(lam.start_byte)
        name = call_name(source, call)
        callee = source.function(name) if name else None
        if callee is None or callee.body is None:
            return f"the lambda at line {line} goes to {name}, which is not defined in this file"
        args = [c for c in arguments.named_children if c.type != "comment"]
        index = next(i for i, a in enumerate(args) if a == lam)
        if index >= len(callee.params) or callee.params[index].name is None:
            return f"cannot tell which parameter of {callee.name} receives the lambda"
        param = callee.params[index].name
        calls = [c.node for c in source.calls if c.name == param and within(c.node, callee.body)]
        return self._all_reached(calls, f"{callee.name} never calls {param}")

    def _all_reached(self, nodes: list[Node], if_none: str) -> str | None:
        if not nodes:
            return if_none
        for node in nodes:
            reason = self.reached(node)
            if reason is not None:
                return reason
        return None

    def function_reached(self, function: Function) -> str | None:
        """None when every call of ``function`` in the file is reached by whole warps."""
        if function.is_kernel:
            return None
        if function.name in self._functions:
            return self._functions[function.name]
        marker = ("function", function.name)
        if marker in self._busy:
            return f"{function.name} is called recursively"
        self._busy.add(marker)
        try:
            calls = [c for c in self.source.calls if c.name == function.name]
            if not calls:
                result: str | None = f"{function.name} is not called in this file"
            else:
                result = None
                for call in calls:
                    reason = self.reached(call.node)
                    if reason is not None:
                        line = self.source.line_of(call.node.start_byte)
                        result = f"the call of {function.name} at line {line}: {reason}"
                        break
        finally:
            self._busy.discard(marker)
        self._functions[function.name] = result
        return result


_CACHE: weakref.WeakKeyDictionary[ParsedSource, Uniformity] = weakref.WeakKeyDictionary()


def uniformity(source: ParsedSource) -> Uniformity:
    """The (cached) :class:`Uniformity` of a parsed source."""
    found = _CACHE.get(source)
    if found is None:
        found = _CACHE[source] = Uniformity(source)
    return found
