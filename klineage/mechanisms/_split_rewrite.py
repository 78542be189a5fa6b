"""split_k forward on naive code, the rewrite: the sum's loop split over ``blockIdx.y`` and
the host code that chooses the split count, zeroes (or allocates) where the partials meet and
launches. The form it rewrites is read by :mod:`klineage.mechanisms._split_loops`."""

from __future__ import annotations

from klineage.cuda.edit import Edit
from klineage.cuda.source import Launch, Node, ParsedSource
from klineage.mechanisms._split_loops import SplitLoop
from klineage.mechanisms._tiles_util import fresh_name, names_in

__all__ = ["split_edits"]


def split_edits(
    source: ParsedSource, found: SplitLoop, blocks_per_sm: int, min_rows: int
) -> list[Edit]:
    """The kernel takes a range of the loop per ``blockIdx.y`` and adds its partial with
    ``atomicAdd``: into the zeroed output when the sum is stored as it is, else into a zeroed
    float workspace that a second kernel stores through the epilogue. The launch is preceded
    by the host's split choice (and the workspace's allocation, freed after)."""
    kernel, launch = found.kernel, found.launch
    used = names_in(source, kernel.outer) | names_in(source, _host(source, launch))
    used |= {f.name for f in source.functions}
    per_split = fresh_name(used, "split_rows")
    sums = fresh_name(used, "split_sums")
    parameters = kernel.declarator.child_by_field_name("parameters")
    assert parameters is not None
    close = parameters.end_byte - 1  # before `)`
    bound = source.text_of(found.condition)
    into = source.text_of(found.target) if found.direct else f"{sums}[{found.index}]"
    added = f", long long {per_split}"
    if not found.direct:
        added = f", float* {sums}{added}"
    edits = [
        Edit.insert(close, added),
        Edit.replace(found.start, f"(long long)blockIdx.y * {per_split}"),
        Edit.replace(
            found.condition,
            f"{bound} && {_variable(source, found)} < ((long long)blockIdx.y + 1) * {per_split}",
        ),
        Edit.replace(found.store, f"atomicAdd(&{into}, {found.accumulator});"),
    ]
    statement = launch.node
    while statement.parent is not None and statement.type != "expression_statement":
        statement = statement.parent
    indent = source.indent_of(statement.start_byte)
    names = {n: fresh_name(used, n) for n in _HOST_NAMES}
    config = [source.text_of(part) for part in launch.config]
    stream = config[3] if len(config) > 3 else "0"
    shared = config[2] if len(config) > 2 else "0"
    args = [source.text_of(a) for a in launch.args]
    passed = (
        [*args, names["rows_per_split"]] if found.direct else [*args, sums, names["rows_per_split"]]
    )
    launched = (
        f"{launch.kernel}<<<dim3((unsigned){names['split_blocks']}, "
        f"(unsigned){names['splits']}), {config[1]}, {shared}, {stream}>>>({', '.join(passed)});"
    )
    fields = {
        "grid": config[0],
        "steps": found.steps,
        "outputs": found.outputs,
        "stream": stream,
        "blocks_per_sm": blocks_per_sm,
        "min_rows": min_rows,
        **names,
    }
    if found.direct:
        template = _HOST.format(output=found.output, launch=launched, **fields)
    else:
        finish = fresh_name(used, f"{kernel.name}_finish")
        launched += (
            f"\n{finish}<<<{config[0]}, {config[1]}, 0, {stream}>>>({', '.join([*args, sums])});"
        )
        template = _WORKSPACE.format(sums=sums, launch=launched, **fields)
        finisher = _finisher(source, found, finish, sums)
        edits.append(Edit.insert(kernel.outer.end_byte, f"\n\n{finisher}"))
    lines = template.strip("\n").splitlines()
    text = lines[0] + "".join(f"\n{indent}{line}" for line in lines[1:])
    return [*edits, Edit.replace(statement, text)]


def _finisher(source: ParsedSource, found: SplitLoop, name: str, sums: str) -> str:
    """A kernel of the original's parameters and the workspace: the thread's index and guard
    as written, then the store as written with the sum read from the workspace."""
    parameters = found.kernel.declarator.child_by_field_name("parameters")
    assert parameters is not None
    signature = source.text_of(parameters)[:-1] + f", const float* {sums})"
    body = [
        source.text_of(found.declaration),
        source.text_of(found.guard),
        f"const float {found.accumulator} = {sums}[{found.index}];",
        source.text_of(found.store),
    ]
    lines = "".join(f"\n  {line}" for line in body)
    return f"__global__ void {name}{signature} {{{lines}\n}}"


_HOST_NAMES = (
    "split_device",
    "split_sms",
    "split_blocks",
    "split_wanted",
    "split_fill",
    "split_most",
    "splits",
    "rows_per_split",
    "split_zeroed",
)
# the first line goes where the launch was; the others follow at its indent
_CHOICE = """
int {split_device} = 0, {split_sms} = 1;
cudaGetDevice(&{split_device});
cudaDeviceGetAttribute(&{split_sms}, cudaDevAttrMultiProcessorCount, {split_device});
const long long {split_blocks} = (long long)({grid});
const long long {split_wanted} = (long long){split_sms} * {blocks_per_sm};
const long long {split_fill} =
    ({split_wanted} + {split_blocks} - 1) / ({split_blocks} > 0 ? {split_blocks} : 1);
const long long {split_most} = ((long long)({steps}) + {min_rows} - 1) / {min_rows};
long long {splits} = 1;
if ({split_blocks} < {split_wanted} && {split_most} > 1)
  {splits} = {split_fill} < {split_most} ? {split_fill} : {split_most};
const long long {rows_per_split} = ((long long)({steps}) + {splits} - 1) / {splits};
"""
# the partials added into the output, zeroed first
_HOST = (
    _CHOICE
    + """const cudaError_t {split_zeroed} =
    cudaMemsetAsync({output}, 0, (size_t)({outputs}) * sizeof(float), {stream});
if ({split_zeroed} != cudaSuccess) return (int){split_zeroed};
{launch}
"""
)
# the partials met in a float workspace allocated on the stream
_WORKSPACE = (
    _CHOICE
    + """float* {sums} = nullptr;
cudaError_t {split_zeroed} =
    cudaMallocAsync((void**)&{sums}, (size_t)({outputs}) * sizeof(float), {stream});
if ({split_zeroed} != cudaSuccess) return (int){split_zeroed};
{split_zeroed} = cudaMemsetAsync({sums}, 0, (size_t)({outputs}) * sizeof(float), {stream});
if ({split_zeroed} != cudaSuccess) return (int){split_zeroed};
{launch}
{split_zeroed} = cudaFreeAsync({sums}, {stream});
if ({split_zeroed} != cudaSuccess) return (int){split_zeroed};
"""
)


def _host(source: ParsedSource, launch: Launch) -> Node:
    function = source.enclosing_function(launch.node)
    assert function is not None
    return function.outer


def _variable(source: ParsedSource, found: SplitLoop) -> str:
    left = found.condition.child_by_field_name("left")
    assert left is not None
    return source.text_of(left)
