"""Online softmax statistics: the row's maximum and its sum of ``exp(x - max)`` in one pass,
the running sum rescaled whenever the maximum grows, against two passes (the maximum, then
the sum of exponentials).

One pass reads the row once for both statistics; two passes read it twice.

Two canonical forms are recognized:

- **a (max, sum) pair** (``struct MaxSum {float m; float s;}``) updated by a ``push(acc, x)``
  function inside the loops and combined by ``merge``-based code (the softmax expert). Removal
  runs the loops twice: first keeping only the maximum (``acc.m = fmaxf(acc.m, x)``, every sum
  0), then the combine code to get the row's maximum, then, from ``{max, 0}``, the sum pass
  (``acc.s = acc.s + exp(x - max)``) and the combine again, which with one maximum everywhere
  just adds the sums. A ``__syncthreads()`` is put between the two combines when they use
  shared memory. Required: the pair starts at ``{-INFINITY, 0}`` (any maximum, a zero sum),
  the loops touch it only through ``push``, and the combine ends with a butterfly (every
  thread gets the result).
- **a scalar loop** in the form ``apply`` writes::

      for (...) {
        const float v = x;
        if (v > m) {
          s = s * expf(m - v) + 1.0f;
          m = v;
        } else if (v != -INFINITY) {
          s += expf(v - m);
        }
      }

  (``else if (v != -INFINITY)``: a ``-inf`` element adds nothing, where ``exp(-inf - -inf)``
  would poison the sum), removed into ``for (...) m = fmaxf(m, x);`` then ``for (...) s +=
  expf(x - m);`` (the declaration ``float s = 0.0f;`` right before the loop moves between
  them). Applied on that
  two-loop form (a row's maximum, then its sum of exponentials): same loop header, same
  element ``x``, ``s`` starting from zero right before the second loop.

- **the block form**: the same scalar loop over each thread's share of a row a block shares,
  then each statistic's block reduction with the sum rescaled to the block's maximum::

      float s = 0.0f;
      for (c = threadIdx.x; c < n; c += blockDim.x) { <the scalar online loop's body> }
      const float thread_max = m;
      m = R(m);
      s = s * expf(thread_max - m);
      s = Q(s);

  removed into the two passes block per row writes (``for (...) m = fmaxf(m, x); m = R(m);
  float s = 0.0f; for (...) s += expf(x - m); s = Q(s);``, where a reduction is any call
  ``v = f(v);`` whatever its name), and applied on them. A thread that saw no element has
  ``thread_max = -INFINITY`` and a zero sum, which the rescale keeps at zero.

Other loops that rescale a running sum by an exponential are reported and refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from klineage.conditions import Condition, Prose
from klineage.cuda.cexpr import operand
from klineage.cuda.edit import Edit
from klineage.cuda.source import Function, Node, ParsedSource, variable_of
from klineage.cuda.tree import declaration_names, statement_after, statement_before
from klineage.kernel import KernelSource
from klineage.mechanisms._online_pair_apply import single_pass, two_pass_pair
from klineage.mechanisms._reductions_exchange import shuffle_steps
from klineage.mechanisms._reductions_util import (
    arguments_of,
    call_name,
    fresh_name,
    indent_text,
    inside,
    is_zero_literal,
    local_splice,
    named_statements,
    plain_type,
    strip_parens,
    struct_fields,
    within,
)
from klineage.mechanisms.base import Carrier, Mechanism, Site, register
from klineage.problem import Problem

EXPS = frozenset({"expf", "__expf", "exp", "exp2f", "__exp2f"})
ADDITIVE = 12
_MINUS_INF = frozenset({"-INFINITY", "-HUGE_VALF", "-FLT_MAX", "-__int_as_float(0x7f800000)"})


class _Refused(Exception):
    """Not a canonical form; the message says why."""


# ---------------------------------------------------------------------------------------------
# The (max, sum) pair form
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairType:
    """A struct of a running maximum and a running sum, with its ``push`` function."""

    name: str
    fields: tuple[str, str]
    """The fields in declaration order."""
    max_field: str
    sum_field: str
    push: str
    exp: str
    """The exponential ``push`` uses (``__expf``)."""


def _pair_types(source: ParsedSource) -> dict[str, PairType]:
    """Struct name -> pair type, for structs of two floats that a push function updates."""
    found: dict[str, PairType] = {}
    for function in source.functions:
        if function.body is None or not function.runs_on_device or len(function.params) != 2:
            continue
        struct = plain_type(function.params[0].type)
        return_type = function.node.child_by_field_name("type")
        if return_type is None or source.text_of(return_type) != struct:
            continue
        if plain_type(function.params[1].type) not in ("float", "double"):
            continue
        fields = struct_fields(source, struct)
        if len(fields) != 2 or any(plain_type(t) != "float" for t in fields.values()):
            continue
        exps = [
            call_name(source, c)
            for c in inside(source, function.body, "call_expression")
            if call_name(source, c) in EXPS
        ]
        if not exps:
            continue
        names = tuple(fields)
        max_field = _max_field(source, function, names)
        if max_field is None:
            continue
        sum_field = names[1] if max_field == names[0] else names[0]
        found[struct] = PairType(
            struct, (names[0], names[1]), max_field, sum_field, function.name, exps[0] or "expf"
        )
    return found


def _max_field(source: ParsedSource, push: Function, names: tuple[str, ...]) -> str | None:
    """The field compared (or passed to fmaxf) in ``push``: the running maximum."""
    assert push.body is not None
    counts = dict.fromkeys(names, 0)
    for node in inside(source, push.body, "binary_expression", "call_expression"):
        relational = node.type == "binary_expression" and _op(node) in ("<", "<=", ">", ">=")
        if not relational and call_name(source, node) not in ("fmaxf", "max", "fmax"):
            continue
        for field in inside(source, node, "field_identifier"):
            text = source.text_of(field)
            if text in counts:
                counts[text] += 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    if ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def _op(node: Node) -> str | None:
    op = node.child_by_field_name("operator")
    return op.type if op is not None else None


@dataclass(frozen=True)
class PairAccumulation:
    """An online (max, sum) accumulation in a function: declaration, loops, combine."""

    function: Function
    pair: PairType
    declaration: Node
    name: str
    accumulate: tuple[Node, ...]
    """Statements updating the pair through push only (the loops)."""
    combine: tuple[Node, ...]
    """Statements merging the pairs of several threads (may be empty)."""
    refusal: str | None = None

    @property
    def end(self) -> int:
        last = (self.combine or self.accumulate or (self.declaration,))[-1]
        return last.end_byte


def _pair_declaration(
    source: ParsedSource, node: Node, pairs: dict[str, PairType]
) -> tuple[str, PairType, list[Node]] | None:
    """``S acc{a, b};`` / ``S acc = {a, b};`` / ``S acc = S{a, b};`` -> (acc, S, [a, b])."""
    if node.type != "declaration":
        return None
    type_node = node.child_by_field_name("type")
    if type_node is None or source.text_of(type_node) not in pairs:
        return None
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1:
        return None
    declarator = declarators[0]
    name = declarator.child_by_field_name("declarator")
    value = declarator.child_by_field_name("value")
    if value is None:
        value = next((c for c in declarator.children if c.type == "initializer_list"), None)
    if name is None or value is None or name.type != "identifier":
        return None
    if value.type == "compound_literal_expression":
        value = value.child_by_field_name("value") or value
    if value.type != "initializer_list":
        return None
    values = [c for c in value.named_children if c.type != "comment"]
    return source.text_of(name), pairs[source.text_of(type_node)], values


def pair_accumulations(source: ParsedSource) -> Iterator[PairAccumulation]:
    """Every online pair accumulation, analysed."""
    pairs = _pair_types(source)
    if not pairs:
        return
    for function in source.functions:
        if function.body is None or not function.runs_on_device:
            continue
        for block in inside(source, function.body, "compound_statement"):
            if source.enclosing_function(block) != function:
                continue
            statements = named_statements(block)
            for index, statement in enumerate(statements):
                declared = _pair_declaration(source, statement, pairs)
                if declared is None:
                    continue
                name, pair, values = declared
                found = _accumulation(
                    source, function, pair, statement, name, values, statements[index + 1 :]
                )
                if found is not None:
                    yield found


def _accumulation(
    source: ParsedSource,
    function: Function,
    pair: PairType,
    declaration: Node,
    name: str,
    values: list[Node],
    rest: list[Node],
) -> PairAccumulation | None:
    accumulate: list[Node] = []
    index = 0
    while index < len(rest) and _push_only(source, rest[index], name, pair):
        accumulate.append(rest[index])
        index += 1
    if not any(_mentions(source, s, name) for s in accumulate):
        return None
    combine: list[Node] = []
    pending: list[Node] = []
    while index < len(rest):
        statement = rest[index]
        if _reads_field(source, statement, name):
            break
        pending.append(statement)
        if _mentions(source, statement, name):
            combine += pending
            pending = []
        index += 1
    refusal = None
    try:
        _check_pair(source, pair, name, values, combine)
        _check_repeatable(source, function, accumulate, name, "loops", shared=False)
        _check_repeatable(source, function, combine, name, "combine", shared=True)
    except _Refused as why:
        refusal = str(why)
    return PairAccumulation(
        function, pair, declaration, name, tuple(accumulate), tuple(combine), refusal
    )


def _mentions(source: ParsedSource, node: Node, name: str) -> bool:
    return any(source.text_of(n) == name for n in inside(source, node, "identifier"))


def _reads_field(source: ParsedSource, node: Node, name: str) -> bool:
    for field in inside(source, node, "field_expression"):
        argument = field.child_by_field_name("argument")
        if argument is not None and source.text_of(argument) == name:
            return True
    return False


def _push_chain(source: ParsedSource, node: Node, name: str, pair: PairType) -> list[Node] | None:
    """For ``push(push(acc, a), b)``, the elements ``[a, b]``; None for anything else."""
    node = strip_parens(node)
    if node.type == "identifier" and source.text_of(node) == name:
        return []
    if node.type != "call_expression" or call_name(source, node) != pair.push:
        return None
    args = arguments_of(node)
    if len(args) != 2 or _mentions(source, args[1], name):
        return None
    inner = _push_chain(source, args[0], name, pair)
    return None if inner is None else [*inner, args[1]]


def _push_assignments(source: ParsedSource, node: Node, name: str, pair: PairType) -> list[Node]:
    found = []
    for assignment in inside(source, node, "assignment_expression"):
        left, right = (
            assignment.child_by_field_name("left"),
            assignment.child_by_field_name("right"),
        )
        if left is None or right is None or source.text_of(left) != name or _op(assignment) != "=":
            continue
        chain = _push_chain(source, right, name, pair)
        if chain:
            found.append(assignment)
    return found


def _push_only(source: ParsedSource, statement: Node, name: str, pair: PairType) -> bool:
    """Every mention of the pair in the statement is inside ``acc = push(...(acc, x)...)``."""
    assignments = _push_assignments(source, statement, name, pair)
    for node in inside(source, statement, "identifier"):
        if source.text_of(node) == name and not any(within(node, a) for a in assignments):
            return False
    return True


def _check_pair(
    source: ParsedSource, pair: PairType, name: str, values: list[Node], combine: list[Node]
) -> None:
    if len(values) != 2:
        raise _Refused(f"{name} is not initialized with both fields")
    start = dict(zip(pair.fields, values, strict=True))
    if not is_zero_literal(source, start[pair.sum_field]):
        raise _Refused(f"the running sum {name}.{pair.sum_field} does not start from 0")
    if combine:
        last = combine[-1]
        if not _butterfly_update(source, last, name):
            raise _Refused(
                f"the combine ends at line {source.line_of(last.start_byte)} without a butterfly "
                "that gives every thread the merged pair"
            )


def _check_repeatable(
    source: ParsedSource,
    function: Function,
    statements: list[Node],
    name: str,
    what: str,
    shared: bool,
) -> None:
    """Statements run twice by the two-pass form may write only the pair, their own locals
    and (for the combine) shared memory; a store or a counter would run twice."""
    declared: set[str] = set()
    for statement in statements:
        for node in inside(source, statement, "declaration"):
            declared.update(declaration_names(source, node))
    shared_names = {
        n
        for d in source.shared_declarations
        if function.body is not None and within(d.node, function.body)
        for n in d.names
    }
    for statement in statements:
        for node in inside(source, statement, "assignment_expression", "update_expression"):
            target = node.child_by_field_name("left") or node.child_by_field_name("argument")
            root = variable_of(source, target) if target is not None else None
            if root == name or root in declared or (shared and root in shared_names):
                continue
            raise _Refused(
                f"the {what} also write {source.text_of(target) if target else '?'} (line "
                f"{source.line_of(node.start_byte)}), which two passes would do twice"
            )


def _butterfly_update(source: ParsedSource, statement: Node, name: str) -> bool:
    """``acc = f(acc);`` where ``f`` reduces with ``__shfl_xor_sync`` (every lane gets it)."""
    if statement.type != "expression_statement" or not statement.named_children:
        return False
    assignment = statement.named_children[0]
    right = (
        assignment.child_by_field_name("right")
        if assignment.type == "assignment_expression"
        else None
    )
    if right is None or right.type != "call_expression":
        return False
    callee = call_name(source, right)
    return any(
        s.function.name == callee and s.kinds == {"xor"} and s.refusal is None
        for s in shuffle_steps(source)
    )


def _pair_rewrite(source: ParsedSource, acc: PairAccumulation) -> list[Edit]:
    pair, name = acc.pair, acc.name
    ind = source.indent_of(acc.declaration.start_byte)
    taken = {source.text_of(n) for n in inside(source, acc.function.node, "identifier")}
    row_max = fresh_name(taken, "row_max")
    start, end = acc.accumulate[0].start_byte, acc.accumulate[-1].end_byte
    maxes, sums = [], []
    for statement in acc.accumulate:
        for assignment in _push_assignments(source, statement, name, pair):
            right = assignment.child_by_field_name("right")
            assert right is not None
            chain = _push_chain(source, right, name, pair) or []
            max_text = f"{name}.{pair.max_field}"
            sum_text = f"{name}.{pair.sum_field}"
            for element in chain:
                max_text = f"fmaxf({max_text}, {source.text_of(element)})"
                sum_text += f" + {pair.exp}({operand(source, element, ADDITIVE)} - {row_max})"
            maxes.append(Edit.replace(assignment, f"{name}.{pair.max_field} = {max_text}"))
            sums.append(Edit.replace(assignment, f"{name}.{pair.sum_field} = {sum_text}"))
    first = local_splice(source, start, end, maxes)
    second = local_splice(source, start, end, sums)
    combine = (
        source.text_of((acc.combine[0].start_byte, acc.combine[-1].end_byte)) if acc.combine else ""
    )
    synced = any("__syncthreads" in source.text_of(s) for s in acc.combine)
    start_values = ", ".join(row_max if f == pair.max_field else "0.0f" for f in pair.fields)
    text = f"float {row_max};\n{ind}{{  // first pass: the maximum (the sums stay 0)\n{ind}  "
    text += indent_text(first, "  ")
    if combine:
        text += f"\n{ind}  " + indent_text(combine, "  ")
    text += f"\n{ind}  {row_max} = {name}.{pair.max_field};\n{ind}}}"
    if synced:
        text += f"\n{ind}__syncthreads();  // the combine's shared memory is used again"
    text += (
        f"\n{ind}{name} = {pair.name}{{{start_values}}};  // second pass: the sum of exponentials"
    )
    text += f"\n{ind}{second}"
    if combine:
        text += f"\n{ind}{combine}"
    return [Edit(start, acc.end, text)]


# ---------------------------------------------------------------------------------------------
# The scalar loop form
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarOnline:
    """``for (...) { const float v = x; if (v > m) {...} else {...} }`` with ``float s = 0``
    right before it."""

    loop: Node
    header: str
    element: str
    value: str
    maximum: str
    total: str
    exp: str
    declaration: Node


_SCALAR = re.compile(
    r"^\{ const float (?P<v>\w+) = (?P<x>.+?); if \((?P=v) > (?P<m>\w+)\) \{ "
    r"(?P<s>\w+) = (?P=s) \* (?P<exp>\w+)\((?P=m) - (?P=v)\) \+ 1\.0f; (?P=m) = (?P=v); \} "
    r"else if \((?P=v) != (?P<inf>-INFINITY|__int_as_float\(0xff800000\))\) \{ "
    r"(?P=s) \+= (?P=exp)\((?P=v) - (?P=m)\); \} \}$"
)


def _scalar(source: ParsedSource, loop: Node) -> ScalarOnline:
    body = loop.child_by_field_name("body")
    match = _SCALAR.match(" ".join(source.text_of(body).split())) if body is not None else None
    if body is None or match is None or match["exp"] not in EXPS:
        raise _Refused("the loop is not in the canonical online form (see online_softmax)")
    previous = statement_before(loop)
    if previous is None or not _zero_declaration(source, previous, match["s"]):
        raise _Refused(f"float {match['s']} = 0.0f; does not come right before the loop")
    header = source.text_of((loop.start_byte, body.start_byte)).rstrip()
    return ScalarOnline(
        loop, header, match["x"], match["v"], match["m"], match["s"], match["exp"], previous
    )


def _zero_declaration(source: ParsedSource, node: Node, name: str) -> bool:
    if (
        node.type != "declaration"
        or plain_type(source.text_of(node.child_by_field_name("type") or node)) != "float"
    ):
        return False
    declarators = node.children_by_field_name("declarator")
    if len(declarators) != 1 or declarators[0].type != "init_declarator":
        return False
    target = declarators[0].child_by_field_name("declarator")
    return (
        target is not None
        and source.text_of(target) == name
        and is_zero_literal(source, declarators[0].child_by_field_name("value"))
    )


def _rescaling_loops(source: ParsedSource) -> Iterator[Node]:
    """Loops in device code that rescale a running sum by an exponential: ``s = s * exp(..)``."""
    for function in source.functions:
        if function.body is None or not function.runs_on_device:
            continue
        for loop in inside(source, function.body, "for_statement", "while_statement"):
            for assignment in inside(source, loop, "assignment_expression"):
                left, right = (
                    assignment.child_by_field_name("left"),
                    assignment.child_by_field_name("right"),
                )
                if left is None or right is None or left.type != "identifier":
                    continue
                name = source.text_of(left)
                text = " ".join(source.text_of(right).split())
                if re.match(rf"^{re.escape(name)} \* (__)?exp\w*\(", text):
                    yield loop
                    break


@dataclass(frozen=True)
class TwoPass:
    """``for (H) m = fmaxf(m, x); float s = 0.0f; for (H) s += expf(x - m);``."""

    first: Node
    declaration: Node
    second: Node
    header: str
    element: str
    maximum: str
    total: str
    exp: str


_MAX_BODY = re.compile(r"^\{? ?(?P<m>\w+) = fmaxf\((?P=m), (?P<x>.+)\); ?\}?$")
_SUM_BODY = re.compile(r"^\{? ?(?P<s>\w+) \+= (?P<exp>\w+)\((?P<x>.+) - (?P<m>\w+)\); ?\}?$")


def _two_pass(source: ParsedSource, first: Node) -> TwoPass | None:
    """The two-loop form starting at ``first``; None when it is not that."""
    declaration = first.next_named_sibling
    second = declaration.next_named_sibling if declaration is not None else None
    return _passes(source, first, declaration, second)


def _passes(
    source: ParsedSource, first: Node, declaration: Node | None, second: Node | None
) -> TwoPass | None:
    """``for (H) m = fmaxf(m, x);`` ``first``, ``float s = 0.0f;`` ``declaration`` and
    ``for (H) s += expf(x - m);`` ``second`` (same header, same element); None otherwise."""
    if declaration is None or second is None:
        return None
    if first.type != "for_statement" or second.type != "for_statement":
        return None
    first_body = first.child_by_field_name("body")
    second_body = second.child_by_field_name("body")
    if first_body is None or second_body is None:
        return None
    header = source.text_of((first.start_byte, first_body.start_byte)).rstrip()
    if header != source.text_of((second.start_byte, second_body.start_byte)).rstrip():
        return None
    max_match = _MAX_BODY.match(_flat(source, first_body))
    sum_match = _SUM_BODY.match(_flat(source, second_body))
    if max_match is None or sum_match is None or sum_match["exp"] not in EXPS:
        return None
    if max_match["x"] != sum_match["x"] or max_match["m"] != sum_match["m"]:
        return None
    if not _zero_declaration(source, declaration, sum_match["s"]):
        return None
    if "=" in max_match["x"].replace("==", "").replace("<=", "").replace(">=", "").replace(
        "!=", ""
    ):
        return None
    return TwoPass(
        first,
        declaration,
        second,
        header,
        max_match["x"],
        max_match["m"],
        sum_match["s"],
        sum_match["exp"],
    )


# ---------------------------------------------------------------------------------------------
# The block form: the passes of a row a block shares, each finished by a block reduction
# ---------------------------------------------------------------------------------------------

_REDUCED = re.compile(r"^(?P<n>\w+) = (?P<f>[\w:<>, ]+)\((?P=n)\);$")
_THREAD_MAX = re.compile(r"^const float (?P<t>\w+) = (?P<m>\w+);$")
_RESCALE = re.compile(r"^(?P<s>\w+) = (?P=s) \* (?P<exp>\w+)\((?P<t>\w+) - (?P<m>\w+)\);$")


def _flat(source: ParsedSource, node: Node | None) -> str:
    return " ".join(source.text_of(node).split()) if node is not None else ""


def _reduces(source: ParsedSource, node: Node | None, name: str) -> bool:
    """``node`` is ``name = f(name);``: a reduction across threads that every thread joins."""
    if node is None or node.type != "expression_statement":
        return False
    match = _REDUCED.match(_flat(source, node))
    return match is not None and match["n"] == name


@dataclass(frozen=True)
class BlockTwoPass:
    """``for (H) m = fmaxf(m, x); m = R(m); float s = 0.0f; for (H) s += expf(x - m);
    s = Q(s);``: each thread's share of the row, then its reduction over the block."""

    passes: TwoPass
    reduce_max: Node
    reduce_sum: Node


def _two_pass_block(source: ParsedSource, first: Node) -> BlockTwoPass | None:
    """The block two-pass form starting at the loop ``first``; None when it is not that."""
    reduce_max = statement_after(first)
    declaration = statement_after(reduce_max) if reduce_max is not None else None
    second = statement_after(declaration) if declaration is not None else None
    reduce_sum = statement_after(second) if second is not None else None
    passes = _passes(source, first, declaration, second)
    if passes is None or reduce_max is None or reduce_sum is None:
        return None
    if not (
        _reduces(source, reduce_max, passes.maximum) and _reduces(source, reduce_sum, passes.total)
    ):
        return None
    return BlockTwoPass(passes, reduce_max, reduce_sum)


@dataclass(frozen=True)
class BlockOnline:
    """The scalar online loop, then ``const float t = m; m = R(m); s = s * expf(t - m);
    s = Q(s);``: each thread's (max, sum) in one pass, its sum rescaled to the block's max."""

    loop: ScalarOnline
    reduce_max: Node
    reduce_sum: Node


def _block_online(source: ParsedSource, loop: Node) -> BlockOnline | None:
    """The block online form around the scalar online loop ``loop``; None when the loop is
    not followed by the block's reductions in the form `apply` writes them."""
    try:
        found = _scalar(source, loop)
    except _Refused:
        return None
    kept = statement_after(loop)
    reduce_max = statement_after(kept) if kept is not None else None
    rescale = statement_after(reduce_max) if reduce_max is not None else None
    reduce_sum = statement_after(rescale) if rescale is not None else None
    if kept is None or reduce_max is None or rescale is None or reduce_sum is None:
        return None
    own = _THREAD_MAX.match(_flat(source, kept))
    scaled = _RESCALE.match(_flat(source, rescale))
    if own is None or scaled is None or own["m"] != found.maximum:
        return None
    if (scaled["s"], scaled["exp"], scaled["t"], scaled["m"]) != (
        found.total,
        found.exp,
        own["t"],
        found.maximum,
    ):
        return None
    if not (
        _reduces(source, reduce_max, found.maximum) and _reduces(source, reduce_sum, found.total)
    ):
        return None
    return BlockOnline(found, reduce_max, reduce_sum)


def _online_loop(
    header: str, element: str, v: str, m: str, s: str, e: str, ind: str, inf: str
) -> str:
    """The scalar online loop `apply` writes (no leading indentation)."""
    return (
        f"{header} {{\n"
        f"{ind}  const float {v} = {element};\n"
        f"{ind}  if ({v} > {m}) {{\n"
        f"{ind}    {s} = {s} * {e}({m} - {v}) + 1.0f;\n"
        f"{ind}    {m} = {v};\n"
        f"{ind}  }} else if ({v} != {inf}) {{\n"
        f"{ind}    {s} += {e}({v} - {m});\n"
        f"{ind}  }}\n"
        f"{ind}}}"
    )


def _minus_inf(source: ParsedSource) -> str:
    return "-INFINITY" if "INFINITY" in source.kernel.text else "__int_as_float(0xff800000)"


def _block_application(source: ParsedSource, shared: BlockTwoPass) -> list[Edit]:
    """One pass over each thread's share of the row for both statistics; then the block's
    maximum, each thread's sum rescaled to it (a thread that saw no element has a zero sum),
    and the block's sum: the same two reductions, one read of the row instead of two."""
    passes = shared.passes
    function = source.enclosing_function(passes.first)
    assert function is not None
    taken = {source.text_of(n) for n in inside(source, function.node, "identifier")}
    v = fresh_name(taken, "v")
    own = fresh_name(taken | {v}, "thread_max")
    ind = source.indent_of(passes.first.start_byte)
    m, total, e = passes.maximum, passes.total, passes.exp
    loop = _online_loop(passes.header, passes.element, v, m, total, e, ind, _minus_inf(source))
    text = (
        f"{source.text_of(passes.declaration)}\n{ind}{loop}\n"
        f"{ind}const float {own} = {m};\n"
        f"{ind}{source.text_of(shared.reduce_max)}\n"
        f"{ind}{total} = {total} * {e}({own} - {m});\n"
        f"{ind}{source.text_of(shared.reduce_sum)}"
    )
    return [Edit(passes.first.start_byte, shared.reduce_sum.end_byte, text)]


def _block_removal(source: ParsedSource, block: BlockOnline) -> list[Edit]:
    """The two passes again, each finished by its block reduction."""
    found = block.loop
    ind = source.indent_of(found.loop.start_byte)
    text = (
        f"{found.header} {found.maximum} = fmaxf({found.maximum}, {found.element});\n{ind}"
        f"{source.text_of(block.reduce_max)}\n{ind}"
        f"{source.text_of(found.declaration)}\n{ind}"
        f"{found.header} {found.total} += {found.exp}({found.element} - {found.maximum});\n{ind}"
        f"{source.text_of(block.reduce_sum)}"
    )
    return [Edit(found.declaration.start_byte, block.reduce_sum.end_byte, text)]


# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------


@register
class OnlineSoftmax(Mechanism):
    name = "online_softmax"
    category = "compute"
    family = "single-pass vs multi-pass reductions"
    intent = (
        "Compute a row's maximum and sum of exponentials in one pass, rescaling the running "
        "sum when the maximum grows, so the row is read once for both."
    )

    def find_sites(self, source: ParsedSource) -> Iterator[Site]:
        covered: list[tuple[int, int]] = []
        for acc in pair_accumulations(source):
            covered.append((acc.declaration.start_byte, acc.end))
            yield self.site(
                source,
                acc.declaration,
                span=(acc.declaration.start_byte, acc.end),
                kind="declaration",
                snippet=source.snippet(acc.declaration),
                detail={"form": "pair", "struct": acc.pair.name},
                refusal=acc.refusal,
            )
        for loop in _rescaling_loops(source):
            if any(a <= loop.start_byte < b for a, b in covered):
                continue
            block = _block_online(source, loop)
            if block is not None:
                start = block.loop.declaration.start_byte
                yield self.site(
                    source,
                    loop,
                    span=(start, block.reduce_sum.end_byte),
                    detail={"form": "block"},
                )
                continue
            refusal = None
            try:
                _scalar(source, loop)
            except _Refused as why:
                refusal = str(why)
            yield self.site(source, loop, detail={"form": "scalar"}, refusal=refusal)

    def find_candidates(self, source: ParsedSource) -> Iterator[Site]:
        pushes = self._pushes(source)
        for function in source.functions:
            if function.body is None or not function.runs_on_device:
                continue
            for declaration in inside(source, function.body, "declaration") if pushes else []:
                form = two_pass_pair(source, declaration, pushes)
                if form is not None:
                    yield self.site(
                        source,
                        declaration,
                        span=(declaration.start_byte, form.end),
                        kind="declaration",
                        snippet=source.snippet(declaration),
                        detail={"form": "pair"},
                    )
            for loop in inside(source, function.body, "for_statement"):
                shared = _two_pass_block(source, loop)
                found = _two_pass(source, loop) if shared is None else None
                end = shared.reduce_sum if shared is not None else found.second if found else None
                if end is not None:
                    yield self.site(
                        source,
                        loop,
                        span=(loop.start_byte, end.end_byte),
                        kind="for_statement",
                        snippet=source.snippet(loop),
                        detail={"form": "block" if shared is not None else "scalar"},
                    )

    def removal(self, source: ParsedSource, site: Site) -> list[Edit]:
        if site.detail.get("form") == "pair":
            for acc in pair_accumulations(source):
                if acc.declaration.start_byte == site.start_byte:
                    return _pair_rewrite(source, acc)
            raise self.refuse(f"no online pair at line {site.start_line}", site)
        if site.detail.get("form") == "block":
            for loop in _rescaling_loops(source):
                block = _block_online(source, loop)
                if block is not None and block.loop.declaration.start_byte == site.start_byte:
                    return _block_removal(source, block)
            raise self.refuse("the loop and the block's reductions are no longer in the form", site)
        loop = self.node_at(source, site, "for_statement", "while_statement")
        try:
            found = _scalar(source, loop)
        except _Refused as why:
            raise self.refuse(str(why), site) from None
        ind = source.indent_of(loop.start_byte)
        text = (
            f"{found.header} {found.maximum} = fmaxf({found.maximum}, {found.element});\n{ind}"
            f"{source.text_of(found.declaration)}\n{ind}"
            f"{found.header} {found.total} += {found.exp}({found.element} - {found.maximum});"
        )
        return [Edit(found.declaration.start_byte, loop.end_byte, text)]

    def conditions(
        self, kernel: KernelSource, site: Site, problem: Problem | None = None
    ) -> list[Condition]:
        return [
            Prose(
                text="the outputs are compared with a float tolerance",
                why="rescaling the running sum rounds differently from summing at the final "
                "maximum",
            )
        ]

    @staticmethod
    def _pushes(source: ParsedSource) -> dict[str, tuple[str, str, str]]:
        return {
            name: (pair.push, pair.max_field, pair.sum_field)
            for name, pair in _pair_types(source).items()
        }

    def application(self, source: ParsedSource, site: Site, carrier: Carrier) -> list[Edit]:
        if site.detail.get("form") == "pair":
            pushes = self._pushes(source)
            for declaration in source.nodes("declaration"):
                if declaration.start_byte == site.start_byte:
                    form = two_pass_pair(source, declaration, pushes)
                    if form is not None:
                        return single_pass(source, form)
            raise self.refuse("the two passes are no longer in the form", site, "apply")
        loop = next(
            (n for n in source.nodes("for_statement") if n.start_byte == site.start_byte), None
        )
        if site.detail.get("form") == "block":
            shared = _two_pass_block(source, loop) if loop is not None else None
            if shared is None:
                raise self.refuse("the two passes are no longer in the block form", site, "apply")
            return _block_application(source, shared)
        found = _two_pass(source, loop) if loop is not None else None
        if found is None:
            raise self.refuse("the two loops are no longer in the two-pass form", site, "apply")
        assert loop is not None
        function = source.enclosing_function(loop)
        assert function is not None
        taken = {source.text_of(n) for n in inside(source, function.node, "identifier")}
        v = fresh_name(taken, "v")
        ind = source.indent_of(loop.start_byte)
        online = _online_loop(
            found.header,
            found.element,
            v,
            found.maximum,
            found.total,
            found.exp,
            ind,
            _minus_inf(source),
        )
        text = f"{source.text_of(found.declaration)}\n{ind}{online}"
        return [Edit(loop.start_byte, found.second.end_byte, text)]
