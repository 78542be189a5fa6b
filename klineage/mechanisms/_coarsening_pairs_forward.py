"""Coarsening by loads per turn of a grid-stride loop, forward: ``K`` loads a turn, not one.

The inverse of :mod:`klineage.mechanisms._coarsening_pairs`, on a grid-stride loop that adds
one element a turn into a value declared before it, the block's share ``B`` a template
parameter, ``blockDim.x`` or a constant, the stride written out or held in a local::

    unsigned i = blockIdx.x * B + threadIdx.x;      // or the initializer of a `for`
    while (i < n) {
      acc += x[i];                                  // or: acc = fmaxf(acc, x[i]);
      i += stride;                                  // B * gridDim.x
    }

becomes, with ``K = 2``::

    unsigned i = blockIdx.x * B * 2 + threadIdx.x;
    while (i < n) {
      acc += x[i];
      if (i + B < n) acc += x[i + B];
      i += stride * 2;
    }

A thread's turn takes its element in ``K`` consecutive blocks' shares, and the blocks together
still reach every element below ``n`` once: the same values, accumulated in another order, so
the accumulation must be one the order does not change (``+=``, ``*=``, ``&=``, ``|=``,
``^=``, ``acc = max(acc, e)`` and its kin). The grid stays: the loop absorbs the change. The
step is scaled where the loop adds it, so a local holding the stride keeps its value for its
other readers. The result is checked by removing it again: the removal must give the loop back
as it was, or the application is refused with the removal's reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from klineage.cuda.analysis import FunctionIndices, IndexForm, LoopVariable, analysis
from klineage.cuda.cexpr import MULTIPLICATIVE, operand, wrap_at
from klineage.cuda.edit import Edit, apply_edits
from klineage.cuda.source import Function, Node, ParsedSource, call_name
from klineage.cuda.tree import NotInForm, assigned_names, identifier_names, operator_of, walk
from klineage.mechanisms._coarsening_pairs import (
    declaration_before,
    index_update,
    pair_loads_at,
)
from klineage.mechanisms._local_util import (
    GlobalIndex,
    global_index,
    index_declaration,
    is_side_effect_free,
    splice,
    statements,
    strip_parens,
)

__all__ = ["StrideLoop", "loads_per_turn_edits", "stride_loops"]

_NEEDED = (
    "a grid-stride loop `i < n` from `blockIdx.x * B + threadIdx.x` by `B * gridDim.x` (B a "
    "template parameter, blockDim.x or a constant) whose turn is one statement accumulating "
    "into a value declared before it (`acc += e`, `acc = max(acc, e)`), then `i += stride`"
)
_REORDERABLE = ("+=", "*=", "&=", "|=", "^=")
_EXTREMA = ("max", "min", "fmaxf", "fminf", "fmax", "fmin", "__hmax", "__hmin")


def _refuse(form: str) -> NotInForm:
    return NotInForm(form, _NEEDED)


@dataclass(frozen=True)
class StrideLoop:
    """A grid-stride loop accumulating one element a turn."""

    function: Function
    loop: Node
    name: str
    """The loop's index."""
    declaration: Node
    """Where the index gets its start: the ``for``'s initializer or a declaration before."""
    index: GlobalIndex
    update: Node
    """``i += stride``."""
    statement: Node
    """The turn's one accumulating statement."""
    bound: Node
    """``n`` of ``i < n``."""

    @property
    def span(self) -> tuple[int, int]:
        return min(self.declaration.start_byte, self.loop.start_byte), self.loop.end_byte


def stride_loops(source: ParsedSource) -> Iterator[StrideLoop | tuple[Function, Node, NotInForm]]:
    """The grid-stride loops of the kernels that load global memory by their index: each in
    the form above, or its function, loop and why not."""
    for function in source.kernels:
        indices = analysis(source).indices(function)
        for variable in indices.loops:
            loop = variable.loop
            if variable.step is None or not variable.step.coefficient("gridDim.x").terms:
                continue
            if not any(
                a.buffer.space == "global"
                and a.direction == "load"
                and loop.start_byte <= a.node.start_byte < loop.end_byte
                and a.offset.depends_on(variable.atom)
                for a in indices.accesses()
            ):
                continue
            try:
                yield _stride_loop(source, indices, variable)
            except NotInForm as why:
                yield function, loop, why


def _stride_loop(
    source: ParsedSource, indices: FunctionIndices, variable: LoopVariable
) -> StrideLoop:
    loop, name, function = variable.loop, variable.name, indices.function
    block = variable.init.coefficient("blockIdx.x")
    one_per_thread = IndexForm.atom("blockIdx.x") * block + IndexForm.atom("threadIdx.x")
    if not block.terms or variable.init != one_per_thread:
        raise _refuse(
            f"a grid-stride loop over {name} from {variable.init}, not one index a thread"
        )
    if variable.step != block * IndexForm.atom("gridDim.x"):
        raise _refuse(
            f"a grid-stride loop over {name} by {variable.step}, not by {block} * gridDim.x"
        )
    if loop.type == "for_statement":
        declaration = loop.child_by_field_name("initializer")
    else:
        declaration = declaration_before(source, loop, name)
    declared = index_declaration(source, declaration) if declaration is not None else None
    index = global_index(source, declared[2]) if declared is not None else None
    if declaration is None or declared is None or index is None:
        raise _refuse(
            f"a loop over {name} that does not declare `{name} = blockIdx.x * B + threadIdx.x`"
        )
    if indices.form(index.stride) != block or indices.form(declared[2]) != variable.init:
        raise _refuse(f"a loop over {name} whose declared start is not where the loop starts")
    bound = _bound(source, variable)
    update = index_update(source, loop, name)
    body = loop.child_by_field_name("body")
    if update is None or body is None or body.type != "compound_statement":
        raise _refuse(f"a loop over {name} without a braced body and `{name} += stride` in it")
    turn = [s for s in statements(body) if not (s.start_byte <= update.start_byte < s.end_byte)]
    if len(turn) != 1 or turn[0].type != "expression_statement":
        raise _refuse(f"a grid-stride loop over {name} whose turn is {len(turn)} statements")
    _accumulation(source, turn[0], name)
    if loop.type == "while_statement" and _read_after(source, declaration, loop, name):
        raise _refuse(f"an index {name} read after its loop, where it would end elsewhere")
    return StrideLoop(function, loop, name, declaration, index, update, turn[0], bound)


def _bound(source: ParsedSource, variable: LoopVariable) -> Node:
    """``n`` of the loop's condition ``i < n``."""
    test = variable.bound.parent if variable.bound is not None else None
    left = test.child_by_field_name("left") if test is not None else None
    if (
        test is None
        or operator_of(test) != "<"
        or left is None
        or source.text_of(strip_parens(left)) != variable.name
        or variable.bound != test.child_by_field_name("right")
    ):
        condition = variable.loop.child_by_field_name("condition")
        shown = source.snippet(condition) if condition is not None else "none"
        raise _refuse(
            f"a grid-stride loop over {variable.name} with the condition {shown}, not "
            f"`{variable.name} < n`"
        )
    assert variable.bound is not None
    return variable.bound


def _accumulation(source: ParsedSource, statement: Node, index: str) -> str:
    """The value the statement accumulates into, in an order-free way."""
    expression = strip_parens(statement.named_children[0]) if statement.named_children else None
    target = expression.child_by_field_name("left") if expression is not None else None
    value = expression.child_by_field_name("right") if expression is not None else None
    if (
        expression is None
        or expression.type != "assignment_expression"
        or target is None
        or value is None
    ):
        raise _refuse(f"a turn `{source.snippet(statement, 60)}` that is not an assignment")
    accumulator = source.text_of(strip_parens(target))
    if strip_parens(target).type != "identifier" or accumulator == index:
        raise _refuse(f"a turn that writes `{source.snippet(target)}`, not a local value")
    terms = [value]
    operator = operator_of(expression)
    if operator == "=":
        terms = _reduced_terms(source, value, accumulator)
    elif operator not in _REORDERABLE:
        terms = []
    if not terms:
        raise _refuse(
            f"a turn `{source.snippet(statement, 60)}` whose order matters to {accumulator}"
        )
    if any(accumulator in identifier_names(source, t) for t in terms):
        raise _refuse(f"a turn whose element term reads {accumulator} itself")
    if not all(is_side_effect_free(source, t) for t in terms) or assigned_names(source, value):
        raise _refuse(f"a turn `{source.snippet(statement, 60)}` with side effects")
    return accumulator


def _reduced_terms(source: ParsedSource, value: Node, accumulator: str) -> list[Node]:
    """``e`` of ``acc + e`` (``e + acc``) or ``max(acc, e)`` and its kin; [] otherwise."""
    value = strip_parens(value)
    if value.type == "binary_expression" and operator_of(value) in ("+", "*", "&", "|", "^"):
        parts = [value.child_by_field_name("left"), value.child_by_field_name("right")]
    elif value.type == "call_expression" and (call_name(source, value) or "") in _EXTREMA:
        arguments = value.child_by_field_name("arguments")
        parts = list(arguments.named_children) if arguments is not None else []
    else:
        return []
    rest = [p for p in parts if p is not None and source.text_of(strip_parens(p)) != accumulator]
    return rest if len(parts) == 2 and len(rest) == 1 else []


def _read_after(source: ParsedSource, declaration: Node, loop: Node, name: str) -> bool:
    """Whether ``name`` is read after ``loop`` in the block that declares it."""
    scope = declaration.parent
    assert scope is not None
    return any(
        n.type == "identifier" and source.text_of(n) == name and n.start_byte >= loop.end_byte
        for n in walk(scope)
    )


def loads_per_turn_edits(source: ParsedSource, found: StrideLoop, factor: int) -> list[Edit]:
    """``factor`` loads a turn: the edits, checked by removing them again."""
    i = found.name
    block = found.index.stride
    bound = operand(source, found.bound, 10)  # above `<`
    step = found.update.child_by_field_name("right")
    assert step is not None
    indent = source.indent_of(found.statement.start_byte)
    extra = []
    for j in range(1, factor):
        offset = (
            source.text_of(block)
            if j == 1
            else f"{j} * {operand(source, block, MULTIPLICATIVE + 1)}"
        )
        moved = [
            (n, wrap_at(n, f"{i} + {offset}", 12))  # 12: additive
            for n in walk(found.statement)
            if n.type == "identifier" and source.text_of(n) == i
        ]
        text = splice(source, found.statement.start_byte, found.statement.end_byte, moved)
        extra.append(f"\n{indent}if ({i} + {offset} < {bound}) {text}")
    edits = [
        Edit.replace(
            found.index.block_term, f"{source.text_of(found.index.block_term)} * {factor}"
        ),
        Edit.replace(step, f"{operand(source, step, MULTIPLICATIVE)} * {factor}"),
        Edit.insert(found.statement.end_byte, "".join(extra)),
    ]
    _check(source, found, edits)
    return edits


def _check(source: ParsedSource, found: StrideLoop, edits: list[Edit]) -> None:
    """The result is loads per turn as the removal reads it, and removing it gives the loop
    back as it was."""
    shift = sum(
        len(e.replacement.encode()) - (e.end_byte - e.start_byte)
        for e in edits
        if e.end_byte <= found.loop.start_byte
    )
    coarsened = apply_edits(source, edits).parsed
    function = coarsened.function(found.function.name)
    start = found.loop.start_byte + shift
    loop = next((n for n in coarsened.nodes(found.loop.type) if n.start_byte == start), None)
    if function is None or loop is None:
        raise _refuse(f"a loop over {found.name} the rewrite lost")
    try:
        back = apply_edits(coarsened, pair_loads_at(coarsened, function, loop)).text
    except NotInForm as why:
        raise _refuse(f"a loop the removal would not take back ({why.form})") from why
    if " ".join(back.split()) != " ".join(source.kernel.text.split()):
        raise _refuse(f"a loop over {found.name} the removal does not give back as it was")
