"""Where a kernel's template argument is written at its launch, as a literal a rule can edit.

Hopper kernels take their shape as template parameters (stages, tile extents) that the host
binds once: ``kernel<128, STAGES><<<...>>>`` after ``constexpr int STAGES = 4;``, or
through a pointer, ``auto* k = kernel<BM, BN>; k<<<...>>>``. Changing the shape is editing
that one literal: the template argument itself, or the launching function's constant.
"""

from __future__ import annotations

from klineage.cuda.source import Function, Node, ParsedSource, strip_parens, within
from klineage.mechanisms._local_util import local_initializer


def launch_literal(
    source: ParsedSource, kernel: Function, position: int, *, template_only: bool
) -> tuple[Node | None, str | None]:
    """The number literal that writes template argument ``position`` at the one launch of
    ``kernel``, or (None, why not). With ``template_only``, a launching constant is refused
    where the host also reads it outside template arguments (a change would reach more than
    the kernel's template); without, such reads follow the change (a tile extent that also
    sizes the grid)."""
    launches = source.launches_of(kernel)
    if len(launches) != 1:
        return None, f"{kernel.name} is launched {len(launches)} times; one launch is edited"
    launch = launches[0]
    if position >= len(launch.template_args):
        return None, f"the launch of {kernel.name} does not write template argument {position}"
    argument = strip_parens(launch.template_args[position])
    if argument.type == "number_literal":
        return argument, None
    name = source.text_of(argument).strip()
    caller = source.enclosing_function(launch.node)
    if not name.isidentifier() or caller is None or caller.body is None:
        return None, f"the launch passes the expression `{name}`; a literal or a constant is edited"
    value = local_initializer(source, caller, name, launch.node)
    if value is None or value.type != "number_literal":
        return None, f"`{name}` is not a constant of {caller.name} with a literal value"
    if not template_only:
        return value, None
    for use in source.iter_nodes("identifier", "type_identifier", within=caller.body):
        if source.text_of(use) != name or within(use, value.parent or use):
            continue
        if source.ancestor(use, "template_argument_list") is None:
            line = source.line_of(use.start_byte)
            return None, (
                f"`{name}` is also used outside template arguments (line {line}); changing it "
                f"would change more than {kernel.name}'s template"
            )
    return value, None
