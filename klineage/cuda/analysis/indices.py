"""Index analysis: what every index and address of a function is, as an :class:`IndexForm`.

Each integer expression of device code is read as a polynomial over *atoms*:

- the built-ins ``threadIdx.x`` ... ``gridDim.z`` (``blockDim.x`` replaced by its value when the
  kernel asserts it, ``assert(blockDim.x == 32)``);
- ``lane`` and ``warp``: the linear thread index modulo and divided by 32, however spelled
  (``tid % warpSize``, ``threadIdx.x & 31``, ``warp.thread_rank()``, ``meta_group_rank()``);
- loop variables, ``name@line``, each with its initial value, step, bound and trip count;
- buffers, ``buf:name``: a pointer parameter, a ``__shared__`` or local array; an address is
  a buffer plus an offset in elements;
- parameters, template parameters and other block-uniform names, as themselves;
- opaque atoms ``[text]`` for what is not a polynomial, with the atoms they depend on.

Local variables are replaced by their definitions (the reaching one when a variable is
written several times), so ``row = blockIdx.x * warpsPerBlock + warpId`` reads the same as
``blockIdx.x * blockDim.y + threadIdx.y`` up to the names of its uniform parts. Accesses to
memory (subscripts, dereferences, ``__ldg``/``__stcs``-style intrinsics, vector load/store
helpers and device helpers called with buffers) are listed with their buffer, offset and
direction, a helper's accesses rewritten in the caller's terms.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from klineage.cuda.analysis.forms import IndexForm
from klineage.cuda.cexpr import SIZEOF, fold_int
from klineage.cuda.source import Function, Node, ParsedSource, call_name, within
from klineage.cuda.tree import (
    WARP_SIZE,
    binary_operands,
    builtin_of,
    call_arguments,
    callee_name,
    integer_literal,
    operator_of,
    strip_parens,
)

if TYPE_CHECKING:
    from klineage.cuda.analysis import SourceAnalysis

__all__ = [
    "ATOMICS",
    "BLOCK_ATOMS",
    "THREAD_ATOMS",
    "Access",
    "Buffer",
    "FunctionIndices",
    "LoopVariable",
    "is_buffer",
    "is_loop_atom",
]

THREAD_ATOMS = frozenset({"threadIdx.x", "threadIdx.y", "threadIdx.z", "lane", "warp"})
"""Atoms that differ between the threads of a block."""
BLOCK_ATOMS = frozenset({"blockIdx.x", "blockIdx.y", "blockIdx.z"})
"""Atoms that differ between blocks."""
GRID_ATOMS = frozenset({"gridDim.x", "gridDim.y", "gridDim.z"})
MEMORY = "<memory>"
"""The dependency of an opaque atom that is a value read from memory."""
Space = Literal["global", "shared", "local", "param", "unknown"]
Direction = Literal["load", "store", "both", "address"]
"""``address``: ``&x[i]`` handed on (to ``__cvta_generic_to_shared``, an asm operand)."""

_LOAD_INTRINSICS = re.compile(r"^__ld(g|cg|ca|cs|lu|cv)$")
_STORE_INTRINSICS = re.compile(r"^__st(cg|cs|wb|wt)$")
ATOMICS = re.compile(r"^atomic[A-Z]\w*$")
"""The CUDA atomics (``atomicAdd``, ``atomicCAS``, ...), by their name without a namespace."""
_MAX_DEPTH = 40


def is_buffer(atom: str) -> bool:
    """Whether an atom names memory an address starts from (``buf:name``)."""
    return atom.startswith("buf:")


def is_loop_atom(atom: str) -> bool:
    """Whether an atom is a loop's induction variable (``name@line``)."""
    return "@" in atom and not atom.startswith("[")


@dataclass(frozen=True)
class Buffer:
    """Memory an address starts from."""

    name: str
    space: Space
    element_type: str
    node: Node | None = None
    extents: tuple[Node | None, ...] = ()
    """The extent expressions, outermost first (folded with the function's constants)."""

    @property
    def atom(self) -> str:
        """The atom addresses into this buffer start from."""
        return f"buf:{self.name}"


@dataclass(frozen=True)
class LoopVariable:
    """The induction variable of a loop: ``for (int k = 0; k < K; ++k)``."""

    atom: str
    name: str
    loop: Node
    init: IndexForm
    step: IndexForm | None
    """What each iteration adds (None when the update is not ``+= step``)."""
    bound: Node | None
    """The right side of ``name < bound`` (or ``<=``)."""
    trip: int | None
    """The number of iterations when init, step and bound are constants."""
    bound_uniform: bool
    """Whether the bound is the same for every thread (a constant, parameter, template
    argument)."""

    @property
    def counted(self) -> bool:
        """A loop a fixed number of times from a constant: ``for (k = 0; k < K; k += s)``
        with ``K`` the same for every thread."""
        return (
            self.init.value is not None
            and self.step is not None
            and self.step.value is not None
            and self.step.value > 0
            and self.bound_uniform
        )


@dataclass(frozen=True)
class Access:
    """A load or store of memory at ``buffer[offset]``."""

    node: Node
    """The subscript, dereference or call that accesses memory (in the caller's code for an
    access made inside a helper: the helper's call)."""
    function: Function
    buffer: Buffer
    offset: IndexForm
    direction: Direction
    bytes: int | None = None
    """Bytes per access when a vector type or helper says (16 for ``float4``)."""
    helper: str | None = None
    """The helper whose code makes the access, when it is not ``function``'s own."""
    inner: Node | None = None
    """The node inside the helper, for an access made there."""


@dataclass
class _Definitions:
    """Where each local name of a function is written."""

    declared: dict[str, list[tuple[Node, Node | None]]] = field(default_factory=dict)
    """name -> (declarator, initial value or None)."""
    written: dict[str, list[Node]] = field(default_factory=dict)
    """name -> assignment or update expressions."""


class FunctionIndices:
    """The index forms and memory accesses of one function (built by the source analysis)."""

    def __init__(self, analysis: SourceAnalysis, function: Function) -> None:
        self.analysis = analysis
        self.source: ParsedSource = analysis.source
        self.function = function
        self.params = {p.name for p in function.params if p.name}
        self.template_params = set(function.template_params)
        self._forms: dict[tuple[int, int, str], IndexForm] = {}
        self._by_kind = _nodes_by_kind(function.body)
        self._defs = self._definitions()
        self.buffers = self._buffers()
        # Known from here on to buffer lookups the loop forms below make (a loop bound read
        # from memory, `c < lens[r]`), which would otherwise build this analysis again.
        analysis._indices.setdefault(function.node.start_byte, self)
        self.loops: list[LoopVariable] = []
        self._loop_by_node: dict[int, LoopVariable] = {}
        self._depth = 0
        self.facts: dict[str, int] = {}
        self.facts = self._asserted_facts()
        self._forms.clear()  # forms read before the facts were known
        self._find_loops()
        self._accesses: list[Access] | None = None

    # -- public queries ---------------------------------------------------------------------

    def form(self, node: Node) -> IndexForm:
        """The form of an integer (or address) expression."""
        key = (node.start_byte, node.end_byte, node.type)
        cached = self._forms.get(key)
        if cached is not None:
            return cached
        if self._depth > _MAX_DEPTH:
            return self._opaque(node, set())
        self._depth += 1
        try:
            result = self._form(node)
        finally:
            self._depth -= 1
        self._forms[key] = result
        return result

    def loop(self, atom: str) -> LoopVariable | None:
        """The loop induction variable an atom stands for, if any."""
        return self.analysis.loop_variable(atom)

    def loop_of(self, node: Node) -> LoopVariable | None:
        """The induction variable of a loop node."""
        return self._loop_by_node.get(node.start_byte)

    def accesses(self) -> list[Access]:
        """Every memory access of the function, its helpers' ones included, in order."""
        if self._accesses is None:
            self._accesses = list(self._collect_accesses())
        return self._accesses

    def thread_atoms(self, form: IndexForm) -> set[str]:
        """The atoms that make ``form`` differ between threads of a block (loop variables
        whose start differs count, through their start)."""
        found: set[str] = set()
        for atom in form.base_atoms():
            if atom in THREAD_ATOMS:
                found.add(atom)
            elif is_loop_atom(atom):
                variable = self.loop(atom)
                if variable is not None:
                    found |= {a for a in variable.init.base_atoms() if a in THREAD_ATOMS}
        return found

    def is_uniform(self, form: IndexForm) -> bool:
        """Whether ``form`` is the same for every thread of every block at one point of the
        program: no thread, block or loop atom and no value read from memory."""
        return not any(
            atom in THREAD_ATOMS
            or atom in BLOCK_ATOMS
            or is_loop_atom(atom)
            or atom == MEMORY
            or atom.startswith("loop@")
            for atom in form.base_atoms()
        )

    def lane_is_thread_x(self) -> bool:
        """Whether ``threadIdx.x`` is the lane: the kernel asserts ``blockDim.x == 32``."""
        return self.facts.get("blockDim.x") == WARP_SIZE

    def nodes(self, *kinds: str) -> list[Node]:
        """The named nodes of the function body of the given kinds, in document order (one
        walk of the body serves every query)."""
        if len(kinds) == 1:
            return self._by_kind.get(kinds[0], [])
        found = [n for kind in kinds for n in self._by_kind.get(kind, [])]
        return sorted(found, key=lambda n: (n.start_byte, -n.end_byte))

    # -- definitions ------------------------------------------------------------------------

    def _definitions(self) -> _Definitions:
        source = self.source
        defs = _Definitions()
        body = self.function.body
        if body is None:
            return defs
        for declaration in self.nodes("declaration"):
            for declarator in declaration.children_by_field_name("declarator"):
                name, value = _declared(source, declarator)
                if name is not None:
                    defs.declared.setdefault(name, []).append((declarator, value))
        for node in self.nodes("assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            if target is not None:
                target = strip_parens(target)
                if target.type == "identifier":
                    defs.written.setdefault(source.text_of(target), []).append(node)
        return defs

    def _asserted_facts(self) -> dict[str, int]:
        """``assert(blockDim.x == 32)`` -> {"blockDim.x": 32}."""
        facts: dict[str, int] = {}
        body = self.function.body
        if body is None:
            return facts
        for call in self.nodes("call_expression"):
            if call_name(self.source, call) != "assert":
                continue
            args = call_arguments(call)
            sides = binary_operands(args[0], "==") if args else None
            if sides is None:
                continue
            for left, right in (sides, sides[::-1]):
                builtin = builtin_of(self.source, left)
                value = self._constant(right)
                if builtin is not None and builtin.startswith("blockDim") and value is not None:
                    facts[builtin] = value
        return facts

    def _buffers(self) -> dict[str, Buffer]:
        source = self.source
        buffers: dict[str, Buffer] = {}
        kernel = self.function.is_kernel
        for param in self.function.params:
            if param.name is None:
                continue
            is_array = "[" in source.text_of(param.node)
            if param.is_pointer or is_array:
                space: Space = "global" if kernel else "param"
                buffers[param.name] = Buffer(
                    param.name, space, param.base_type, param.node, _param_extents(param.node)
                )
        body = self.function.body
        if body is None:
            return buffers
        for declaration in self.nodes("declaration"):
            shared = "__shared__" in source.text_of(declaration).split("=")[0]
            type_node = declaration.child_by_field_name("type")
            element = source.text_of(type_node) if type_node is not None else ""
            for declarator in declaration.children_by_field_name("declarator"):
                extents = _array_extents(declarator)
                name, _ = _declared(source, declarator)
                if name is None or (extents is None and not shared):
                    continue
                space = "shared" if shared else "local"
                buffers[name] = Buffer(name, space, element, declaration, extents or ())
        return buffers

    def _constant(self, node: Node) -> int | None:
        form = self.form(node)
        return form.value

    # -- loops ------------------------------------------------------------------------------

    def _find_loops(self) -> None:
        body = self.function.body
        if body is None:
            return
        for loop in self.nodes("for_statement", "while_statement", "do_statement"):
            variable = self._induction(loop)
            if variable is not None:
                self.loops.append(variable)
                self._loop_by_node[loop.start_byte] = variable
                self.analysis.register_loop(variable)

    def _induction(self, loop: Node) -> LoopVariable | None:
        source = self.source
        init = loop.child_by_field_name("initializer")
        condition = _condition_value(loop.child_by_field_name("condition"))
        update = loop.child_by_field_name("update")
        name: str | None = None
        start: IndexForm | None = None
        if init is not None and init.type == "declaration":
            declarators = init.children_by_field_name("declarator")
            if declarators:
                name, value = _declared(source, declarators[0])
                start = self.form(value) if value is not None else None
        if name is None and condition is not None:
            name = _compared_name(source, condition)
            if name is not None:
                start = self._value_before(name, loop)
        if name is None or start is None:
            return None
        step = self._step(name, update, loop)
        if step is None and not self._updated_in(name, loop):
            return None
        bound = _bound(source, condition, name) if condition is not None else None
        atom = f"{name}@{source.line_of(loop.start_byte)}"
        bound_form = self.form(bound) if bound is not None else None
        trip = None
        constants = [f.value if f is not None else None for f in (bound_form, start, step)]
        if None not in constants and constants[2] > 0:  # type: ignore[operator]
            end, begin, stride = constants
            trip = max(0, -(-(end - begin) // stride))  # type: ignore[operator]
        bound_uniform = bound_form is not None and self.is_uniform(bound_form)
        return LoopVariable(atom, name, loop, start, step, bound, trip, bound_uniform)

    def _step(self, name: str, update: Node | None, loop: Node) -> IndexForm | None:
        """What one iteration adds to ``name``: from the header's update, or from the one
        ``name += step`` at the top level of a ``while`` body."""
        candidates: list[Node] = []
        if update is not None:
            candidates.append(update)
        body = loop.child_by_field_name("body")
        if body is not None and body.type == "compound_statement":
            for statement in body.named_children:
                if statement.type == "expression_statement" and statement.named_children:
                    candidates.append(statement.named_children[0])
        for node in candidates:
            step = self._increment(name, node)
            if step is not None:
                return step
        return None

    def _increment(self, name: str, node: Node) -> IndexForm | None:
        source = self.source
        node = strip_parens(node)
        if node.type == "update_expression":
            argument = node.child_by_field_name("argument")
            if argument is not None and source.text_of(argument) == name:
                return IndexForm.constant(1 if "++" in source.text_of(node) else -1)
        if node.type == "assignment_expression":
            left = node.child_by_field_name("left")
            right = node.child_by_field_name("right")
            if left is None or right is None or source.text_of(left) != name:
                return None
            operator = operator_of(node)
            if operator == "+=":
                return self.form(right)
            if operator == "-=":
                return -self.form(right)
            if operator == "=":
                sides = binary_operands(right, "+")
                if sides is not None and source.text_of(sides[0]) == name:
                    return self.form(sides[1])
        return None

    def _updated_in(self, name: str, loop: Node) -> bool:
        return any(
            loop.start_byte <= w.start_byte < loop.end_byte
            for w in self._defs.written.get(name, [])
        )

    def _innermost_loop(self, name: str, use: Node) -> LoopVariable | None:
        best = None
        for variable in self.loops:
            if variable.name != name:
                continue
            loop = variable.loop
            inside = loop.start_byte <= use.start_byte < loop.end_byte
            if inside and (best is None or loop.start_byte > best.loop.start_byte):
                best = variable
        return best

    # -- expressions ------------------------------------------------------------------------

    def _opaque(self, node: Node, depends: set[str]) -> IndexForm:
        text = " ".join(self.source.text_of(node).split())
        return IndexForm.opaque_atom(f"[{text}]", depends)

    def _opaque_of(self, node: Node, *parts: IndexForm) -> IndexForm:
        depends: set[str] = set()
        for part in parts:
            depends |= part.base_atoms()
        return self._opaque(node, depends)

    def _form(self, node: Node) -> IndexForm:
        source = self.source
        node = strip_parens(node)
        kind = node.type
        if kind == "number_literal":
            value = integer_literal(source.text_of(node))
            return IndexForm.constant(value) if value is not None else self._opaque(node, set())
        if kind in ("true", "false"):
            return IndexForm.constant(1 if kind == "true" else 0)
        if kind in ("identifier", "type_identifier"):
            return self._name(source.text_of(node), node)
        if kind == "field_expression":
            return self._field(node)
        if kind == "qualified_identifier":
            return self._qualified(node)
        if kind == "cast_expression":
            cast_value = node.child_by_field_name("value")
            return self.form(cast_value) if cast_value is not None else self._opaque(node, set())
        if kind == "binary_expression":
            return self._binary(node)
        if kind == "unary_expression":
            argument = node.child_by_field_name("argument")
            inner = self.form(argument) if argument is not None else IndexForm()
            operator = operator_of(node)
            if operator == "-":
                return -inner
            if operator == "+":
                return inner
            return self._opaque_of(node, inner)
        if kind == "pointer_expression":
            argument = node.child_by_field_name("argument")
            inner = self.form(argument) if argument is not None else IndexForm()
            if operator_of(node) == "&" and argument is not None:
                target = strip_parens(argument)
                if target.type == "subscript_expression":  # &x[i]: the address x + i
                    address = self._address(target)
                    return address if address is not None else self._opaque(node, set())
                return inner
            return self._opaque(node, set(inner.base_atoms()) | {MEMORY})
        if kind == "subscript_expression":
            address = self._address(node)
            depends = (address.base_atoms() if address is not None else frozenset()) | {MEMORY}
            return self._opaque(node, set(depends))
        if kind == "call_expression":
            return self._call(node)
        if kind == "sizeof_expression":
            return self._sizeof(node)
        if kind == "conditional_expression":
            parts = [self.form(c) for c in node.named_children]
            return self._opaque_of(node, *parts)
        if kind == "initializer_list" and len(node.named_children) == 1:
            return self.form(node.named_children[0])
        parts = [self.form(c) for c in node.named_children if c.type != "comment"]
        return self._opaque_of(node, *parts)

    def _binary(self, node: Node) -> IndexForm:
        left_node = node.child_by_field_name("left")
        right_node = node.child_by_field_name("right")
        operator = operator_of(node)
        if left_node is None or right_node is None:
            return self._opaque(node, set())
        left, right = self.form(left_node), self.form(right_node)
        combined = _arithmetic(operator or "", left, right)
        if combined is not None:
            return combined
        divisor = right.value
        if operator in ("/", ">>") and divisor is not None:
            divisor = divisor if operator == "/" else (1 << divisor if 0 <= divisor < 63 else None)
            if divisor is not None:
                return self._divided(node, left, divisor)
        if operator in ("%", "&") and right.value is not None:
            modulus = right.value if operator == "%" else right.value + 1
            if operator == "&" and right.value & (right.value + 1):
                return self._opaque_of(node, left, right)
            return self._modulo(node, left, modulus)
        if left.value is not None and right.value is not None:
            folded = fold_int(self.source, node, {})
            if folded is not None:
                return IndexForm.constant(folded)
        return self._opaque_of(node, left, right)

    def _divided(self, node: Node, left: IndexForm, divisor: int) -> IndexForm:
        if left.value is not None:
            return (
                IndexForm.constant(left.value // divisor) if divisor else self._opaque(node, set())
            )
        if divisor == WARP_SIZE and self._is_linear_thread(left):
            return IndexForm.atom("warp")
        exact = left.exact_division(divisor)
        if exact is not None and divisor > 0 and not left.only(THREAD_ATOMS).atoms():
            return exact
        return self._opaque_of(node, left)

    def _modulo(self, node: Node, left: IndexForm, modulus: int) -> IndexForm:
        if left.value is not None and modulus:
            return IndexForm.constant(left.value % modulus)
        if modulus == WARP_SIZE and self._is_linear_thread(left):
            return IndexForm.atom("lane")
        return self._opaque_of(node, left)

    def _is_linear_thread(self, form: IndexForm) -> bool:
        """``threadIdx.x``, or ``threadIdx.x + blockDim.x * threadIdx.y (+ ...)``."""
        if form.coefficient("threadIdx.x") != IndexForm.constant(1):
            return False
        rest = form - IndexForm.atom("threadIdx.x")
        allowed = {"threadIdx.y", "threadIdx.z", "blockDim.x", "blockDim.y"}
        return not rest.terms or (rest.atoms() <= allowed and "blockDim.x" in rest.atoms())

    def _field(self, node: Node) -> IndexForm:
        source = self.source
        builtin = builtin_of(source, node)
        if builtin is not None:
            if builtin in self.facts:
                return IndexForm.constant(self.facts[builtin])
            return IndexForm.atom(builtin)
        base = node.child_by_field_name("argument")
        member = node.child_by_field_name("field")
        if base is not None and member is not None and base.type == "identifier":
            name = source.text_of(base)
            # a member of a shared struct overlay (`s.A`) is shared memory
            base_form = self._name(name, base)
            buffers = [a for a in base_form.atoms() if is_buffer(a)]
            if len(buffers) == 1:
                field_name = f"{buffers[0][4:]}.{source.text_of(member)}"
                owner = self.analysis.buffer(self.function, buffers[0])
                space = owner.space if owner is not None else "unknown"
                self.buffers.setdefault(field_name, Buffer(field_name, space, "", node))
                return IndexForm.atom(f"buf:{field_name}")
        inner = self.form(base) if base is not None else IndexForm()
        return self._opaque_of(node, inner)

    def _qualified(self, node: Node) -> IndexForm:
        text = "".join(self.source.text_of(node).split())
        value = self.analysis.vectors.constant(text)
        if value is not None:
            return IndexForm.constant(value)
        constant = self.analysis.constants.get(text)
        if constant is not None:
            return IndexForm.constant(constant)
        return IndexForm.atom(text)

    def _sizeof(self, node: Node) -> IndexForm:
        source = self.source
        operand = node.child_by_field_name("type") or node.child_by_field_name("value")
        if operand is not None:
            name = " ".join(source.text_of(operand).strip("()").split())
            size = SIZEOF.get(name) or self.analysis.vectors.element_bytes(name)
            if size is not None:
                return IndexForm.constant(size)
        return self._opaque(node, set())

    def _call(self, node: Node) -> IndexForm:
        source = self.source
        rank = self.analysis.cooperative_groups.rank_of(node)
        if rank is not None:
            if rank.kind == "lane":
                return IndexForm.atom("lane")
            if rank.kind == "warp_in_block":
                return IndexForm.atom("warp")
            if rank.kind == "thread_in_block":
                return IndexForm.atom("threadIdx.x")
            if rank.kind == "warps_per_block":
                return self._divided(node, IndexForm.atom("blockDim.x"), WARP_SIZE)
            if rank.kind == "group_size" and rank.group is not None:
                if rank.group.size is not None:
                    return IndexForm.constant(rank.group.size)
                return IndexForm.atom("blockDim.x")
        name = call_name(source, node) or ""
        args = call_arguments(node)
        if name in ("static_cast", "reinterpret_cast", "const_cast") and len(args) == 1:
            return self.form(args[0])
        shared = self.analysis.shared_factory(name)
        if shared is not None:
            return IndexForm.atom(f"buf:{shared}")
        parts = [self.form(a) for a in args]
        return self._opaque_of(node, *parts)

    # -- names ------------------------------------------------------------------------------

    def _name(self, name: str, use: Node) -> IndexForm:
        if name == "warpSize":
            return IndexForm.constant(WARP_SIZE)
        variable = self._innermost_loop(name, use)
        if variable is not None:
            return IndexForm.atom(variable.atom)
        buffer = self.buffers.get(name)
        written = name in self._defs.written
        if buffer is not None and buffer.space in ("shared", "local") and not written:
            return IndexForm.atom(f"buf:{name}")
        if name in self._defs.declared or written:
            return self._value_at(name, use)
        if name in self.params:
            return self._param_form(name)
        constant = self.analysis.constants.get(name)
        if constant is not None:
            return IndexForm.constant(constant)
        return IndexForm.atom(name)

    def _param_form(self, name: str) -> IndexForm:
        """A parameter's value on entry: its buffer for a pointer or array, else itself."""
        return IndexForm.atom(f"buf:{name}" if name in self.buffers else name)

    def _value_at(self, name: str, use: Node) -> IndexForm:
        """The value of local ``name`` where ``use`` reads it: its one definition, or the
        last one before ``use`` that every path to it passes through."""
        declared = self._defs.declared.get(name, [])
        written = self._defs.written.get(name, [])
        if len(declared) == 1 and not written:
            declarator, value = declared[0]
            return self.form(value) if value is not None else self._opaque(declarator, set())
        return self._reaching(name, use, declared, written)

    def _value_before(self, name: str, node: Node) -> IndexForm | None:
        """The value of ``name`` just before ``node`` (a loop's start value)."""
        if name not in self._defs.declared and name not in self._defs.written:
            return None
        return self._reaching(
            name, node, self._defs.declared.get(name, []), self._defs.written.get(name, [])
        )

    def _reaching(
        self,
        name: str,
        use: Node,
        declared: list[tuple[Node, Node | None]],
        written: list[Node],
    ) -> IndexForm:
        before: list[tuple[Node, Node | None, bool]] = [
            (d, v, True)
            for d, v in declared
            if d.end_byte <= use.start_byte and not _exclusive(d, use)
        ]
        for w in written:  # a write in the update clause of a for loop around the use runs
            loop = _updated_by_header(w)  # after its body: carried, not before the use
            if loop is not None and _in_body(loop, use):
                return self._carried(name, use, loop)
        before += [
            (w, None, False)
            for w in written
            if w.end_byte <= use.start_byte and not _exclusive(w, use)
        ]
        if not before:
            return self._param_form(name) if name in self.params else self._opaque(use, set())
        node, value, is_declaration = max(before, key=lambda item: item[0].start_byte)
        for w in written:  # a write after the use inside a loop around both: loop-carried
            loop = _enclosing_loop(w)
            if (
                w.start_byte > use.start_byte
                and loop is not None
                and loop.start_byte < use.start_byte
            ):
                return self._carried(name, use, loop)
        if not _dominates(node, use):
            return self._opaque(use, set())
        if is_declaration:
            return self.form(value) if value is not None else self._opaque(node, set())
        return self._written_value(name, node)

    def _carried(self, name: str, use: Node, loop: Node) -> IndexForm:
        """A variable a loop advances (``A += BK`` at the end of the K loop): its value
        before the loop plus an opaque advance, so an address keeps its buffer."""
        writes = [
            w
            for w in self._defs.written.get(name, [])
            if loop.start_byte <= w.start_byte < loop.end_byte
        ]
        advances = [self._increment(name, w) for w in writes]
        start = self._value_before(name, loop)
        initializer = loop.child_by_field_name("initializer")
        for declarator, value in self._defs.declared.get(name, []):
            if initializer is not None and within(declarator, initializer):
                start = self.form(value) if value is not None else None  # `for (a = .., b = ..`
        if start is None or any(a is None for a in advances):
            return self._opaque(use, set())
        depends: set[str] = set()
        for advance in advances:
            assert advance is not None
            depends |= advance.base_atoms()
        line = self.source.line_of(loop.start_byte)
        return start + IndexForm.opaque_atom(
            f"[{name} advanced@{line}]", depends | {"loop@" + str(line)}
        )

    def _written_value(self, name: str, node: Node) -> IndexForm:
        operator = operator_of(node)
        right = node.child_by_field_name("right")
        if node.type == "update_expression" or right is None:
            previous = self._value_before(name, node) or IndexForm.atom(name)
            return previous + (1 if "++" in self.source.text_of(node) else -1)
        value = self.form(right)
        if operator == "=":
            return value
        before = self._value_before(name, node)
        if before is None:
            return self._opaque(node, set(value.base_atoms()))
        combined = _arithmetic((operator or "").rstrip("="), before, value)
        return combined if combined is not None else self._opaque_of(node, before, value)

    # -- addresses and accesses -------------------------------------------------------------

    def _address(self, node: Node) -> IndexForm | None:
        """``a[i][j]`` -> the form ``buf:a + i * J + j`` (extents from the declaration)."""
        chain: list[Node] = []
        base = node
        while base.type == "subscript_expression":
            index = _subscript_index(base)
            if index is None:
                return None
            chain.append(index)
            inner = base.child_by_field_name("argument")
            if inner is None:
                return None
            base = strip_parens(inner)
        chain.reverse()
        base_form = self.form(base)
        buffer = self._buffer_of(base_form)
        extents = buffer.extents if buffer is not None else ()
        offset = IndexForm()
        for position, index in enumerate(chain):
            stride = IndexForm.constant(1)
            for extent in extents[position + 1 : len(chain)]:
                stride = stride * (
                    self.form(extent) if extent is not None else IndexForm.constant(1)
                )
            offset = offset + self.form(index) * stride
        return base_form + offset

    def _buffer_of(self, form: IndexForm) -> Buffer | None:
        buffers = [a for a in form.atoms() if is_buffer(a) and form.coefficient(a).value == 1]
        if len(buffers) != 1:
            return None
        return self.analysis.buffer(self.function, buffers[0])

    def _access(
        self, node: Node, address: IndexForm | None, direction: Direction, width: int | None = None
    ) -> Access | None:
        if address is None:
            return None
        buffers = [a for a in address.atoms() if is_buffer(a) and address.coefficient(a).value == 1]
        if len(buffers) != 1:
            return None
        buffer = self.analysis.buffer(self.function, buffers[0])
        if buffer is None:
            return None
        offset = address - IndexForm.atom(buffers[0])
        return Access(node, self.function, buffer, offset, direction, width)

    def _collect_accesses(self) -> Iterator[Access]:
        body = self.function.body
        if body is None:
            return
        for node in self.nodes("subscript_expression", "pointer_expression", "call_expression"):
            if _in_asm_operand(node):
                continue  # an asm operand holds a value (a register), not a memory access
            if node.type == "subscript_expression":
                if (
                    node.parent is not None
                    and node.parent.type == "subscript_expression"
                    and (node.parent.child_by_field_name("argument") == node)
                ):
                    continue  # an inner part of a[i][j]
                if self._access_macro_of(node) is not None:
                    continue  # FLOAT4(a[i]): the macro's call is the access
                direction = "address" if _address_taken(node) else _direction(node)
                found = self._access(node, self._address(node), direction)
            elif node.type == "pointer_expression":
                if operator_of(node) != "*":
                    continue
                argument = node.child_by_field_name("argument")
                address = self.form(argument) if argument is not None else None
                found = self._access(node, address, _direction(node), self._cast_width(argument))
            else:
                yield from self._call_accesses(node)
                continue
            if found is not None:
                yield found

    def _cast_width(self, node: Node | None) -> int | None:
        """16 for ``*reinterpret_cast<float4*>(p)`` and ``*(int4*)(p)``."""
        while node is not None:
            node = strip_parens(node)
            target = None
            if node.type == "cast_expression":
                type_node = node.child_by_field_name("type")
                target = self.source.text_of(type_node) if type_node is not None else None
            elif node.type == "call_expression":
                function = node.child_by_field_name("function")
                if function is not None and function.type == "template_function":
                    arguments = function.child_by_field_name("arguments")
                    target = self.source.text_of(arguments).strip("<>") if arguments else None
            if target is not None:
                packed = self.analysis.vectors.packed(target.replace("*", "").strip())
                return packed.bytes if packed is not None else None
            if node.type != "binary_expression":
                return None
            node = node.child_by_field_name("left")
        return None

    def _access_macro_of(self, element: Node) -> Node | None:
        """The call of an access macro whose argument ``element`` is (``FLOAT4(a[i])``)."""
        current = element
        while current.parent is not None and current.parent.type == "parenthesized_expression":
            current = current.parent
        arguments = current.parent
        call = arguments.parent if arguments is not None else None
        if arguments is None or arguments.type != "argument_list" or call is None:
            return None
        name = callee_name(call_name(self.source, call) or "")
        macros = self.analysis.vectors.access_macros
        return call if name in macros and len(call_arguments(call)) == 1 else None

    def _call_accesses(self, call: Node) -> Iterator[Access]:
        source = self.source
        short = callee_name(call_name(source, call) or "")
        args = call_arguments(call)
        macro = self.analysis.vectors.access_macros.get(short)
        if macro is not None and len(args) == 1:
            # the packed vector at the element's address, read or written as the call is
            element = strip_parens(args[0])
            packed = self.analysis.vectors.packed(macro.vector)
            address = self._address(element) if element.type == "subscript_expression" else None
            width = packed.bytes if packed is not None else None
            found = self._access(call, address, _direction(call), width)
            if found is not None:
                yield found
            return
        if _LOAD_INTRINSICS.match(short) and args:
            found = self._access(call, self.form(args[0]), "load", self._cast_width(args[0]))
            if found is not None:
                yield found
            return
        if (_STORE_INTRINSICS.match(short) or ATOMICS.match(short)) and args:
            direction: Direction = "store" if _STORE_INTRINSICS.match(short) else "both"
            found = self._access(call, self.form(args[0]), direction, self._cast_width(args[0]))
            if found is not None:
                yield found
            return
        helper = self.analysis.vectors.helpers.get(short)
        if helper is not None and helper.pointer_param < len(args):
            found = self._access(
                call, self.form(args[helper.pointer_param]), helper.kind, helper.bytes
            )
            if found is not None:
                yield found
            return
        callee = self.analysis.call_graph.definition(short)
        if (
            callee is None
            or callee.body is None
            or not callee.runs_on_device
            or callee == self.function
        ):
            return
        yield from self.analysis.bound_accesses(self, callee, call, args)


# ---------------------------------------------------------------------------------------------
# Small syntax helpers
# ---------------------------------------------------------------------------------------------


def _nodes_by_kind(body: Node | None) -> dict[str, list[Node]]:
    """Every named node under ``body`` by kind, each list in document order."""
    found: dict[str, list[Node]] = {}
    if body is None:
        return found
    stack = list(reversed(body.named_children))
    while stack:
        current = stack.pop()
        found.setdefault(current.type, []).append(current)
        stack.extend(reversed(current.named_children))
    return found


def _in_asm_operand(node: Node) -> bool:
    parent = node.parent
    while parent is not None and parent.type not in ("expression_statement", "compound_statement"):
        if parent.type in ("gnu_asm_output_operand", "gnu_asm_input_operand"):
            return True
        parent = parent.parent
    return False


def _arithmetic(operator: str, left: IndexForm, right: IndexForm) -> IndexForm | None:
    """``left op right`` for the operators that keep a polynomial (``+ - *``, a constant
    ``<<``); None for the others."""
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if operator == "<<" and right.value is not None and 0 <= right.value < 63:
        return left * (1 << right.value)
    return None


def _declared(source: ParsedSource, declarator: Node) -> tuple[str | None, Node | None]:
    """``(name, initial value)`` of a declarator (``x = v``, ``x{v}``, ``*p = v``, ``x[4]``)."""
    value = None
    current: Node | None = declarator
    if declarator.type == "init_declarator":
        value = declarator.child_by_field_name("value")
        current = declarator.child_by_field_name("declarator")
    while current is not None and current.type != "identifier":
        inner = current.child_by_field_name("declarator")
        if inner is None:
            inner = next(
                (
                    c
                    for c in current.named_children
                    if c.type.endswith("declarator") or c.type == "identifier"
                ),
                None,
            )
        current = inner
    if current is None:
        return None, None
    if value is not None and value.type == "initializer_list" and len(value.named_children) == 1:
        value = value.named_children[0]
    elif value is not None and value.type == "initializer_list":
        value = None
    return source.text_of(current), value


def _array_extents(declarator: Node) -> tuple[Node | None, ...] | None:
    """The extent expressions of an array declarator, outermost first; None when it is no
    array."""
    current = (
        declarator.child_by_field_name("declarator")
        if declarator.type == "init_declarator"
        else declarator
    )
    extents: list[Node | None] = []
    while current is not None and current.type == "array_declarator":
        extents.append(current.child_by_field_name("size"))
        current = current.child_by_field_name("declarator")
    if not extents:
        return None
    extents.reverse()
    return tuple(extents)


def _param_extents(param: Node) -> tuple[Node | None, ...]:
    """The extents of an array parameter ``T a[M][N]`` (the first decays to a pointer)."""
    declarator = param.child_by_field_name("declarator")
    if declarator is None:
        return ()
    return _array_extents(declarator) or ()


def _subscript_index(node: Node) -> Node | None:
    index = node.child_by_field_name("index")
    if index is not None:
        return index
    indices = node.child_by_field_name("indices")
    if indices is not None and indices.named_children:
        return indices.named_children[0]
    return None


def _direction(node: Node) -> Direction:
    current = node
    while current.parent is not None and current.parent.type in (
        "parenthesized_expression",
        "field_expression",
    ):
        current = current.parent
    parent = current.parent
    if parent is None:
        return "load"
    if parent.type == "assignment_expression" and parent.child_by_field_name("left") == current:
        return "store" if operator_of(parent) == "=" else "both"
    if parent.type == "update_expression":
        return "both"
    return "load"


def _address_taken(node: Node) -> bool:
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        parent = parent.parent
    return parent is not None and parent.type == "pointer_expression" and operator_of(parent) == "&"


def _compared_name(source: ParsedSource, condition: Node) -> str | None:
    sides = binary_operands(condition, "<", "<=", "!=", ">", ">=")
    if sides is None:
        return None
    left = strip_parens(sides[0])
    return source.text_of(left) if left.type == "identifier" else None


def _bound(source: ParsedSource, condition: Node, name: str) -> Node | None:
    sides = binary_operands(condition, "<", "<=", "!=")
    if sides is None:
        return None
    left = strip_parens(sides[0])
    return sides[1] if left.type == "identifier" and source.text_of(left) == name else None


def _condition_value(condition: Node | None) -> Node | None:
    """The expression of a ``while``/``do`` condition clause ``(i < n)``."""
    if condition is None or condition.type not in ("condition_clause", "parenthesized_expression"):
        return condition
    values = [c for c in condition.named_children if c.type != "comment"]
    return values[-1] if values else None


def _updated_by_header(node: Node) -> Node | None:
    """The for loop whose update clause holds ``node`` (``a += s, b += t`` after ``;``)."""
    child, parent = node, node.parent
    while parent is not None and parent.type != "function_definition":
        if parent.type == "for_statement":
            update = parent.child_by_field_name("update")
            return parent if update is not None and within(child, update) else None
        child, parent = parent, parent.parent
    return None


def _in_body(loop: Node, node: Node) -> bool:
    body = loop.child_by_field_name("body")
    return body is not None and within(node, body)


def _enclosing_loop(node: Node) -> Node | None:
    parent = node.parent
    while parent is not None:
        if parent.type in ("for_statement", "while_statement", "do_statement"):
            return parent
        if parent.type == "function_definition":
            return None
        parent = parent.parent
    return None


def _exclusive(definition: Node, use: Node) -> bool:
    """Whether no path runs from ``definition`` to ``use``: they sit in different branches of
    one ``if``."""

    def key(node: Node) -> tuple[int, int, str]:
        return (node.start_byte, node.end_byte, node.type)

    ancestors: dict[tuple[int, int, str], Node] = {}
    current: Node | None = definition
    while current is not None:
        ancestors[key(current)] = current
        current = current.parent
    current, child = use, use
    while current is not None and key(current) not in ancestors:
        child = current
        current = current.parent
    if current is None or current.type != "if_statement":
        return False
    branch = None  # the child of the `if` on the definition's side
    node: Node | None = definition
    while node is not None and node.parent is not None and key(node.parent) != key(current):
        node = node.parent
    branch = node
    if branch is None or key(branch) == key(child):
        return False
    return branch.type in ("compound_statement", "else_clause", "expression_statement") or (
        child.type == "else_clause"
    )


_BRANCHES = frozenset(
    {
        "if_statement",
        "else_clause",
        "while_statement",
        "do_statement",
        "switch_statement",
        "case_statement",
        "conditional_expression",
    }
)
"""Constructs whose parts may not run: a definition inside one holds only along some paths."""


def _dominates(definition: Node, use: Node) -> bool:
    """Whether the statement holding ``definition`` sits in a block enclosing ``use`` (so every
    path to the use passes it); conditionals in between make it not dominate."""
    statement = definition
    while statement.parent is not None and statement.parent.type not in (
        "compound_statement",
        "for_statement",
    ):
        if statement.parent.type in _BRANCHES:
            return False  # a branch without braces (`if (c) x = ...;`) may not run
        statement = statement.parent
    block = statement.parent
    if block is None:
        return False
    if block.type == "for_statement":
        return block.start_byte <= use.start_byte < block.end_byte
    return block.start_byte <= use.start_byte < block.end_byte
