"""Reading a problem folder: files, JSON, validation, and errors that name the line.

pydantic reports where in the data a value failed; this module finds the line of that key in
the file and turns the first error into a :class:`ProblemError` that reads
``definition.json:14: inputs.x.shape[1]: unknown axis 'colz'; expected one of the axes: ...``.
"""

from __future__ import annotations

import bisect
import json
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import AliasChoices, BaseModel, Tag, ValidationError
from pydantic.fields import FieldInfo

from klineage.problem.compile_options import COMPILE_OPTIONS_FILE, CompileOptions
from klineage.problem.errors import JsonPath, ProblemError, format_path, listed
from klineage.problem.models import (
    DEFINITION_FILE,
    FOLDER_LAYOUT,
    KERNEL_FILE,
    PROBES_FILE,
    WORKLOADS_FILE,
    Definition,
    Problem,
    Workload,
)
from klineage.problem.nearby import nearby_problem_folders

# ---------------------------------------------------------------------------------------------
# Locating errors: JSON path -> line, pydantic loc -> JSON path
# ---------------------------------------------------------------------------------------------


def _json_lines(text: str) -> dict[JsonPath, int]:
    """Map each path in a JSON document to the 1-based line of its key (or list item).

    Only called on text that already parsed, so a small recursive scan is enough.
    """
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    decoder = json.JSONDecoder()
    found: dict[JsonPath, int] = {}

    def line(pos: int) -> int:
        return bisect.bisect_right(starts, pos)

    def skip(pos: int) -> int:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        return pos

    def value(pos: int, path: JsonPath) -> int:
        pos = skip(pos)
        if text[pos] not in "{[":
            return decoder.raw_decode(text, pos)[1]
        closing = "}" if text[pos] == "{" else "]"
        pos = skip(pos + 1)
        index = 0
        while text[pos] != closing:
            if closing == "}":
                key, after = decoder.raw_decode(text, pos)
                child = (*path, key)
                found[child] = line(pos)
                pos = value(skip(after) + 1, child)
            else:
                child = (*path, index)
                found[child] = line(pos)
                pos = value(pos, child)
                index += 1
            pos = skip(pos)
            if text[pos] == ",":
                pos = skip(pos + 1)
        return pos + 1

    try:
        found[()] = line(skip(0))
        value(0, ())
    except (ValueError, IndexError):
        pass  # best effort: missing entries fall back to a parent's line
    return found


def _line_for(lines: Mapping[JsonPath, int], path: JsonPath) -> int | None:
    """The line of `path`, or of its nearest parent present in the file."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def _strip_annotated(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional, leaving the type that validates the data."""
    while True:
        tp = _strip_annotated(tp)
        if not _is_union(tp):
            return tp
        members = [m for m in get_args(tp) if m is not type(None)]
        if len(members) != 1:
            return tp
        tp = members[0]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _union_tag(member: Any) -> str | None:
    """The name pydantic puts in an error location for a union member."""
    if get_origin(member) is Annotated:
        for meta in get_args(member)[1:]:
            if isinstance(meta, Tag):
                return meta.tag
    inner = _unwrap(member)
    if _is_model(inner) and "type" in inner.model_fields:
        literal = get_args(inner.model_fields["type"].annotation)
        if literal:
            return str(literal[0])
    return getattr(inner, "__name__", None)


def _model_field(model: type[BaseModel], key: str | int) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        aliases = info.validation_alias
        choices = aliases.choices if isinstance(aliases, AliasChoices) else [aliases]
        if key == name or key in choices:
            return info
    return None


def _resolve_loc(model: type[BaseModel], loc: Iterable[str | int]) -> tuple[JsonPath, Any, Any]:
    """Follow a pydantic error location through the model types.

    Returns the JSON path (union tags dropped), the type found at the end, and the FieldInfo
    of the innermost model field on the way (for its description).
    """
    tp: Any = model
    path: list[str | int] = []
    field: FieldInfo | None = None
    for part in loc:
        tp = _unwrap(tp)
        if _is_union(tp):
            member = next((m for m in get_args(tp) if _union_tag(m) == part), None)
            if member is not None:
                tp = member  # a union tag names the branch; it is not a key in the data
                continue
        path.append(part)
        if _is_model(tp):
            field = _model_field(tp, part)
            tp = field.annotation if field is not None else Any
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) in (list, tuple) and get_args(tp):
            args = [a for a in get_args(tp) if a is not Ellipsis]
            tp = args[min(part, len(args) - 1)] if isinstance(part, int) else Any
        else:
            tp = Any
    return tuple(path), _unwrap(tp), field


def _expected_from_msg(msg: str) -> str:
    # pydantic messages read "Input should be a valid list"; keep what follows "should be".
    for lead in ("Input should be ", "Value should be ", "Input should "):
        if msg.startswith(lead):
            return msg[len(lead) :]
    return msg[:1].lower() + msg[1:]


def _translate(
    err: ValidationError,
    model: type[BaseModel],
    *,
    file: Path,
    line_of: Callable[[JsonPath], int | None],
) -> ProblemError:
    """Turn the first error of a pydantic ValidationError into a ProblemError."""
    first = err.errors()[0]
    kind, loc, ctx = first["type"], first["loc"], first.get("ctx") or {}
    path, tp, field = _resolve_loc(model, loc)
    described = f" ({field.description})" if field is not None and field.description else ""
    if kind == "problem":
        path = (*path, *ctx["path"])
        message, expected = ctx["message"], ctx["expected"]
    elif kind == "missing":
        key = path[-1] if path else "?"
        message = f"missing required field {key!r}"
        expected = f"key {key!r}{described}"
    elif kind == "extra_forbidden":
        owner = _resolve_loc(model, loc[:-1])[1]
        allowed = list(owner.model_fields) if _is_model(owner) else []
        message = f"unknown key {path[-1]!r}"
        expected = f"one of the keys: {listed(allowed)}"
    elif kind == "union_tag_invalid":
        message = f"unknown type {ctx.get('tag')!r}"
        expected = f"'type' one of: {ctx.get('expected_tags')}"
    elif kind == "union_tag_not_found":
        tags = [_union_tag(m) for m in get_args(tp)] if _is_union(tp) else []
        message = "missing key 'type'"
        expected = f"a 'type' key, one of: {listed(str(t) for t in tags)}"
    elif kind in ("greater_than", "greater_than_equal"):
        sign = ">" if kind == "greater_than" else ">="
        bound = ctx.get("gt", ctx.get("ge"))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)  # "must be >= 0", not ">= 0.0"
        message = f"must be {sign} {bound}, got {first['input']!r}"
        expected = (field.description if field is not None else None) or f"a value {sign} {bound}"
    else:
        message = f"invalid value {first['input']!r}"
        expected = _expected_from_msg(first["msg"]) + described
    return ProblemError(
        message, file=file, line=line_of(path), field=format_path(path) or None, expected=expected
    )


# ---------------------------------------------------------------------------------------------
# Loading and dumping
# ---------------------------------------------------------------------------------------------


def _read_text(path: Path, *, missing: str, expected: str) -> str:
    if not path.is_file():
        raise ProblemError(missing, file=path, expected=expected)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ProblemError(
            f"cannot read the file: {err}", file=path, expected="a readable UTF-8 text file"
        ) from None


def _parse_json(text: str, file: Path, *, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ProblemError(
            f"invalid JSON: {err.msg} (column {err.colno})",
            file=file,
            line=err.lineno if line is None else line,
            expected="valid JSON (check commas, quotes and brackets)",
        ) from None


M = TypeVar("M", bound=BaseModel)


def _load_object(path: Path, model: type[M], *, missing: str, expected: str) -> M:
    """Read a JSON file holding one object and validate it as `model`; errors name the line."""
    text = _read_text(path, missing=missing, expected=FOLDER_LAYOUT)
    data = _parse_json(text, path)
    if not isinstance(data, dict):
        raise ProblemError(
            f"the top level is a JSON {type(data).__name__}", file=path, line=1, expected=expected
        )
    try:
        return model.model_validate(data)
    except ValidationError as err:
        lines = _json_lines(text)
        raise _translate(err, model, file=path, line_of=lambda p: _line_for(lines, p)) from None


def load_definition(path: str | Path) -> Definition:
    """Load and validate a definition.json (or the one inside a problem folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFINITION_FILE
    return _load_object(
        path,
        Definition,
        missing=f"{path.name} not found",
        expected="a JSON object with the definition's fields",
    )


def load_compile_options(path: str | Path) -> CompileOptions:
    """Load and validate a compile_options.json (or the one inside a problem folder); a
    folder without one has no extra flags."""
    path = Path(path)
    if path.is_dir():
        path = path / COMPILE_OPTIONS_FILE
    if not path.exists():
        return CompileOptions()
    return _load_object(
        path,
        CompileOptions,
        missing=f"{path.name} not found",
        expected='a JSON object such as {"ld_flags": ["-lcuda"]}',
    )


def dump_compile_options(options: CompileOptions, folder: str | Path) -> Path | None:
    """Write `options` as the folder's compile_options.json (only the lists given); with no
    flags, write nothing and return None."""
    if options.empty:
        return None
    path = Path(folder) / COMPILE_OPTIONS_FILE
    data = options.model_dump(mode="json", exclude_defaults=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def _parse_workload(text: str, *, file: Path, line: int, definition: Definition | None) -> Workload:
    data = _parse_json(text, file, line=line)
    if not isinstance(data, dict):
        raise ProblemError(
            f"record is a JSON {type(data).__name__}",
            file=file,
            line=line,
            expected='a JSON object {"uuid": ..., "axes": ..., "inputs": ...}',
        )
    try:
        return Workload.model_validate(data, context={"definition": definition})
    except ValidationError as err:
        raise _translate(err, Workload, file=file, line_of=lambda _: line) from None


def _read_workloads(path: Path, definition: Definition | None) -> list[tuple[int, Workload]]:
    text = _read_text(
        path,
        missing=f"{path.name} not found",
        expected=f"{FOLDER_LAYOUT}; the kernel must pass at least one workload",
    )
    records: list[tuple[int, Workload]] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue  # blank lines are allowed
        wl = _parse_workload(raw, file=path, line=number, definition=definition)
        if wl.uuid in first_line:
            raise ProblemError(
                f"duplicate uuid {wl.uuid!r} (first used on line {first_line[wl.uuid]})",
                file=path,
                line=number,
                field="uuid",
                expected="a unique uuid per workload",
            )
        first_line[wl.uuid] = number
        records.append((number, wl))
    return records


def load_workloads(
    path: str | Path, *, required: bool, definition: Definition | None = None
) -> list[Workload]:
    """Load a .jsonl file of workloads, one JSON object per line (blank lines skipped).

    With `required`, a missing or empty file is an error (the kernel must pass at least one
    workload); otherwise a missing file gives []. With `definition`, every record is also
    checked against it (axes, inputs, constraints).
    """
    path = Path(path)
    if not required and not path.exists():
        return []
    records = _read_workloads(path, definition)
    if required and not records:
        raise ProblemError(
            "no workloads (the file has no records)",
            file=path,
            expected="at least one workload: the kernel must pass at least one",
        )
    return [wl for _, wl in records]


def _check_unique_across(
    workloads: list[Workload], probes_path: Path, definition: Definition
) -> list[Workload]:
    if not probes_path.exists():
        return []
    taken = {wl.uuid for wl in workloads}
    probes: list[Workload] = []
    for number, probe in _read_workloads(probes_path, definition):
        if probe.uuid in taken:
            raise ProblemError(
                f"uuid {probe.uuid!r} is already used in {WORKLOADS_FILE}",
                file=probes_path,
                line=number,
                field="uuid",
                expected="uuids unique across workloads and probes",
            )
        probes.append(probe)
    return probes


def load_problem(path: str | Path) -> Problem:
    """Load and validate a problem folder."""
    root = Path(path)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "not found"
        nearby = [] if root.exists() else nearby_problem_folders(root)
        if nearby:
            what += f" (did you mean {' or '.join(str(folder) for folder in nearby)}?)"
        raise ProblemError(f"problem folder {what}", file=root, expected=FOLDER_LAYOUT)
    definition = load_definition(root / DEFINITION_FILE)
    workloads = load_workloads(root / WORKLOADS_FILE, required=True, definition=definition)
    probes = _check_unique_across(workloads, root / PROBES_FILE, definition)
    kernel = root / KERNEL_FILE
    return Problem(
        root=root,
        definition=definition,
        workloads=workloads,
        probes=probes,
        kernel_path=kernel if kernel.is_file() else None,
        compile_options=load_compile_options(root / COMPILE_OPTIONS_FILE),
    )


def _definition_json(defn: Definition) -> dict[str, Any]:
    # Defaults are left out so written files stay as small as hand-written ones.
    return defn.model_dump(mode="json", exclude_defaults=True)


def dump_definition(defn: Definition, path: str | Path) -> Path:
    """Write `defn` as definition.json (`path` is the file or its folder); returns the file."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFINITION_FILE
    text = json.dumps(_definition_json(defn), indent=2, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def dump_workloads(workloads: Iterable[Workload], path: str | Path) -> Path:
    """Write workloads as JSON lines, one record a line; returns the file."""
    path = Path(path)
    lines = [
        json.dumps(wl.model_dump(mode="json"), ensure_ascii=False, separators=(", ", ": "))
        for wl in workloads
    ]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
